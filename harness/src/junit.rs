//! JUnit XML for CI systems (`drift test --junit FILE`, `drift check
//! --junit FILE`): one `<testsuite>` per judged run, one `<testcase>` per
//! checker. An invalid checker is a `<failure>`, an unknown one an
//! `<error>` (it could not decide), each carrying the checker's why and
//! the command that reproduces the run. The shape is the one CI systems
//! read (Jenkins, GitLab, GitHub Actions' test reporters): `testsuites` >
//! `testsuite` > `testcase`, with `tests`, `failures`, `errors` and `time`
//! counted on both enclosing elements.

use drift_checkers::Verdict;
use drift_results::files::ResultsFile;
use std::fmt::Write as _;
use std::path::Path;

/// What one run contributes to the file.
pub struct Suite<'a> {
    /// The suite's name: the test's name in the store (`register-drift`).
    pub name: &'a str,
    pub results: &'a ResultsFile,
    /// Where the run is stored.
    pub run_dir: &'a Path,
    /// The command that reproduces the run, for the failures' text.
    pub reproduce: Option<String>,
}

/// The XML document for `suite`.
pub fn render(suite: &Suite<'_>) -> String {
    let r = suite.results;
    let count = |v: Verdict| r.checkers.iter().filter(|c| c.verdict == v).count();
    let (tests, failures, errors) = (r.checkers.len(), count(Verdict::Invalid), count(Verdict::Unknown));
    let secs = r.elapsed_ms / 1e3;
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"drift\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{secs:.3}\">"
    );
    let _ = writeln!(
        x,
        "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"0\" time=\"{secs:.3}\" timestamp=\"{}\">",
        attr(suite.name),
        attr(r.checked_at.trim_end_matches('Z')),
    );
    let _ = writeln!(x, "    <properties>");
    for (k, v) in [
        ("verdict", r.verdict.as_str().to_string()),
        ("run", suite.run_dir.display().to_string()),
        ("history", r.history.clone()),
        ("operations", r.operations.to_string()),
    ] {
        let _ = writeln!(x, "      <property name=\"{k}\" value=\"{}\"/>", attr(&v));
    }
    let _ = writeln!(x, "    </properties>");
    for c in &r.checkers {
        let head = format!(
            "    <testcase classname=\"drift.{}\" name=\"{}\" time=\"{:.3}\"",
            attr(suite.name),
            attr(&c.checker),
            c.elapsed_ms / 1e3
        );
        let why = c
            .reason
            .clone()
            .unwrap_or_else(|| format!("{} says {}", c.checker, c.verdict.as_str()));
        let body = match &suite.reproduce {
            Some(cmd) => format!("{why}\nrun: {}\nreproduce: {cmd}", suite.run_dir.display()),
            None => format!("{why}\nrun: {}", suite.run_dir.display()),
        };
        let element = match c.verdict {
            Verdict::Valid => None,
            Verdict::Invalid => Some("failure"),
            Verdict::Unknown => Some("error"),
        };
        match element {
            None => {
                let _ = writeln!(x, "{head}/>");
            }
            Some(el) => {
                let _ = writeln!(
                    x,
                    "{head}>\n      <{el} message=\"{}\" type=\"{}\">{}</{el}>\n    </testcase>",
                    attr(&why),
                    c.verdict.as_str(),
                    text(&body)
                );
            }
        }
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

/// Writes `suite`'s document to `path`.
pub fn write(path: &Path, suite: &Suite<'_>) -> Result<(), String> {
    std::fs::write(path, render(suite)).map_err(|e| format!("--junit {}: {e}", path.display()))
}

/// `s` as element text: characters XML 1.0 cannot hold (controls other
/// than tab and newline) dropped, markup escaped as the report escapes it.
fn text(s: &str) -> String {
    let kept: String = s
        .chars()
        .filter(|&c| matches!(c, '\t' | '\n') || !((c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}'))
        .collect();
    drift_results::picture::esc(&kept)
}

/// `s` as an attribute value (double-quoted): [`text`], line breaks as
/// character references.
fn attr(s: &str) -> String {
    text(s).replace('\n', "&#10;").replace('\t', "&#9;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_checkers::CheckResult;

    fn result(checker: &str, verdict: Verdict, reason: Option<&str>) -> CheckResult {
        CheckResult {
            checker: checker.into(),
            verdict,
            reason: reason.map(str::to_string),
            elapsed_ms: 12.0,
            details: serde_json::Value::Null,
        }
    }

    #[test]
    fn a_checker_is_a_testcase_invalid_a_failure_unknown_an_error_with_the_why() {
        let results = ResultsFile {
            verdict: Verdict::Invalid,
            history: "h.jsonl".into(),
            ops: 10,
            operations: 5,
            keys: 1,
            checked_at: "2026-12-02T10:00:00Z".into(),
            elapsed_ms: 1500.0,
            checkers: vec![
                result("stats", Verdict::Valid, None),
                result(
                    "linearizable",
                    Verdict::Invalid,
                    Some("1 of 1 keys not linearizable; \"x\" < y & z"),
                ),
                result("perf", Verdict::Unknown, Some("budget\u{1}spent")),
            ],
            artifacts: vec![],
        };
        let x = render(&Suite {
            name: "register-drift",
            results: &results,
            run_dir: Path::new("store/register-drift/T"),
            reproduce: Some("drift replay store/register-drift/T".into()),
        });
        assert!(
            x.contains(r#"<testsuites name="drift" tests="3" failures="1" errors="1" time="1.500">"#),
            "{x}"
        );
        assert!(
            x.contains(r#"<testcase classname="drift.register-drift" name="stats" time="0.012"/>"#),
            "{x}"
        );
        assert!(
            x.contains(
                r#"<failure message="1 of 1 keys not linearizable; &quot;x&quot; &lt; y &amp; z" type="invalid">"#
            ),
            "{x}"
        );
        assert!(
            x.contains("reproduce: drift replay store/register-drift/T</failure>"),
            "{x}"
        );
        assert!(
            x.contains(r#"<error message="budgetspent" type="unknown">"#),
            "a control character dropped: {x}"
        );
        assert!(x.contains(r#"timestamp="2026-12-02T10:00:00""#), "{x}");
    }
}
