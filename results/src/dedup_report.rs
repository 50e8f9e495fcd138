//! The dedup checker's part of `report.html`: its findings as a table
//! (kind, block key, replicas, the attempts involved, why) and an insert
//! timeline — one lane per logical insert that was retried, each attempt
//! a bar from its invoke to its completion coloured by outcome, the
//! retries of one insert joined, so a reader sees which retry landed
//! where and when. Inserts named by a finding come first.
//!
//! It reads only the history and the checker's stored details; it judges
//! nothing.

use crate::picture::esc;
use drift_checkers::pairing::{History, Outcome};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Lanes the timeline draws at most (the rest are counted, not drawn).
const LANES_MAX: usize = 60;
/// Findings listed per kind (the checker stores at most as many).
const FINDINGS_SHOWN_MAX: usize = 20;
const LANE_H: f64 = 14.0;
const LEFT: f64 = 110.0;
const WIDTH: f64 = 1100.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 34.0;

/// One attempt as the timeline draws it.
struct Bar {
    attempt: u64,
    replica: String,
    from: i64,
    /// None: no completion (indeterminate).
    to: Option<i64>,
    outcome: Outcome,
}

fn outcome_colour(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "#2e7d32",
        Outcome::Fail => "#9e9e9e",
        Outcome::Info | Outcome::Pending => "#ef6c00",
    }
}

/// Logical insert id → its attempts, in invoke order.
fn attempts(h: &History, at: &dyn Fn(usize) -> i64) -> BTreeMap<u64, Vec<Bar>> {
    let mut by_insert: BTreeMap<u64, Vec<Bar>> = BTreeMap::new();
    for o in &h.operations {
        let inv = h.invoke_op(o);
        if inv.f != "insert" {
            continue;
        }
        let Some(l) = inv.value.get("insert").and_then(Value::as_u64) else {
            continue;
        };
        by_insert.entry(l).or_default().push(Bar {
            attempt: inv.value.get("attempt").and_then(Value::as_u64).unwrap_or(1),
            replica: inv.node.as_deref().unwrap_or_default().to_string(),
            from: at(o.invoke),
            to: o.complete.map(at),
            outcome: o.outcome,
        });
    }
    for bars in by_insert.values_mut() {
        bars.sort_by_key(|b| (b.from, b.attempt));
    }
    by_insert
}

/// The findings table, from the checker's details.
fn findings_table(details: &Value) -> String {
    let Some(findings) = details.get("findings").and_then(Value::as_object) else {
        return String::new();
    };
    let mut rows = String::new();
    for (kind, list) in findings {
        // one row per block: the replicas that show the same finding
        // together (the explanation is the first replica's)
        let mut grouped: Vec<(&Value, Vec<&str>)> = Vec::new();
        for f in list.as_array().into_iter().flatten().take(FINDINGS_SHOWN_MAX) {
            let replicas = f["replicas"].as_array().into_iter().flatten().filter_map(Value::as_str);
            match grouped
                .iter_mut()
                .find(|(g, _)| g["key"] == f["key"] && f["key"].is_string())
            {
                Some((_, rs)) => rs.extend(replicas),
                None => grouped.push((f, replicas.collect())),
            }
        }
        for (f, replicas) in grouped {
            let attempts: Vec<String> = f["attempts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    format!(
                        "insert {} #{} on {}: {} ({:.2} s, line {})",
                        a["insert"],
                        a["attempt"],
                        a["replica"].as_str().unwrap_or("?"),
                        a["outcome"].as_str().unwrap_or("?"),
                        a["invoke_s"].as_f64().unwrap_or(0.0),
                        a["index"]
                    )
                })
                .collect();
            let key = f["key"].as_str().unwrap_or("");
            let key = if key.chars().count() > 80 {
                format!("{}…", key.chars().take(80).collect::<String>())
            } else {
                key.to_string()
            };
            let _ = write!(
                rows,
                r#"<tr><td class="{cls}">{kind}</td><td class="why">{key}</td><td>{replicas}</td><td class="why">{attempts}</td><td class="why">{why}</td></tr>"#,
                cls = if kind == "unknown-window" { "unknown" } else { "invalid" },
                kind = esc(kind),
                key = esc(&key),
                replicas = esc(&replicas.join(", ")),
                attempts = esc(&attempts.join("\n")),
                why = esc(f["explanation"].as_str().unwrap_or("")),
            );
        }
    }
    if rows.is_empty() {
        return "<p>No findings: every block as many times as its attempts allow.</p>".into();
    }
    let counts = details
        .get("counts")
        .and_then(Value::as_object)
        .map(|c| c.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    format!(
        r#"<p>Findings ({counts}; at most {FINDINGS_SHOWN_MAX} listed per kind):</p><table><tr><th>finding</th><th class="why">block</th><th>replicas</th><th class="why">attempts</th><th class="why">why</th></tr>{rows}</table>"#,
        counts = esc(&counts)
    )
}

/// Logical inserts a finding names, in the order the findings give them.
fn named_inserts(details: &Value) -> Vec<u64> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for list in details
        .get("findings")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|f| f.values())
    {
        for f in list.as_array().into_iter().flatten() {
            for a in f["attempts"].as_array().into_iter().flatten() {
                if let Some(l) = a["insert"].as_u64() {
                    if seen.insert(l) {
                        out.push(l);
                    }
                }
            }
        }
    }
    out
}

/// The timeline: lanes for retried inserts (and any a finding names).
fn timeline(h: &History, details: &Value, at: &dyn Fn(usize) -> i64, t0: i64, t1: i64, x_unit: f64) -> String {
    let all = attempts(h, at);
    let mut order = named_inserts(details);
    let named: BTreeSet<u64> = order.iter().copied().collect();
    order.extend(
        all.iter()
            .filter(|(l, b)| b.len() > 1 && !named.contains(l))
            .map(|(l, _)| *l),
    );
    let retried = all.values().filter(|b| b.len() > 1).count();
    if order.is_empty() {
        return "<p>No insert was retried.</p>".into();
    }
    let lanes: Vec<u64> = order
        .iter()
        .copied()
        .filter(|l| all.contains_key(l))
        .take(LANES_MAX)
        .collect();
    let span = t1.saturating_sub(t0).max(1) as f64;
    let x = |t: i64| LEFT + t.saturating_sub(t0) as f64 / span * (WIDTH - LEFT - 10.0);
    let height = TOP + lanes.len() as f64 * LANE_H + BOTTOM;
    let mut svg = String::new();
    for (i, l) in lanes.iter().enumerate() {
        let y = TOP + i as f64 * LANE_H + LANE_H / 2.0;
        let bars = &all[l];
        let mark = if named.contains(l) { " ⚑" } else { "" };
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end" font-family="monospace">{l}{mark}</text>"#,
            LEFT - 6.0,
            y + 3.5
        );
        // the retries of one insert, joined from each end to the next start
        for w in bars.windows(2) {
            let end = w[0].to.unwrap_or(w[1].from);
            let _ = write!(
                svg,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#bbb" stroke-dasharray="2 2"/>"##,
                x(end),
                x(w[1].from)
            );
        }
        for b in bars {
            let (x0, x1) = (x(b.from), x(b.to.unwrap_or(t1)));
            let _ = write!(
                svg,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="8" fill="{}"{}><title>insert {l} attempt {} on {}: {}</title></rect>"#,
                y - 4.0,
                (x1 - x0).max(2.0),
                outcome_colour(b.outcome),
                if b.to.is_none() { r#" fill-opacity="0.35""# } else { "" },
                b.attempt,
                esc(&b.replica),
                match b.outcome {
                    Outcome::Ok => "ok",
                    Outcome::Fail => "fail",
                    Outcome::Info => "info",
                    Outcome::Pending => "no completion",
                }
            );
        }
    }
    // the time axis
    let axis_y = TOP + lanes.len() as f64 * LANE_H + 4.0;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{axis_y:.1}" x2="{:.1}" y2="{axis_y:.1}" stroke="#888"/>"##,
        WIDTH - 10.0
    );
    for k in 0..=5 {
        let t = t0 + ((t1 - t0) as f64 * k as f64 / 5.0) as i64;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{:.1}</text>"#,
            x(t),
            axis_y + 14.0,
            t.saturating_sub(t0) as f64 / x_unit
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
        LEFT + (WIDTH - LEFT) / 2.0,
        axis_y + 27.0,
        if x_unit == 1.0 {
            "position in the history"
        } else {
            "seconds since the start"
        }
    );
    format!(
        r##"<p>{retried} logical inserts were retried; {} lanes drawn (⚑: named by a finding). A bar is one attempt from its invoke to its completion: <span style="color:#2e7d32">■ ok</span> <span style="color:#9e9e9e">■ fail</span> <span style="color:#ef6c00">■ info</span> (faded: never completed); a dashed line joins an attempt to its retry.</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}">{svg}</svg>"##,
        lanes.len()
    )
}

/// The page's section for a history the dedup checker judged; empty
/// when it did not.
pub fn section(
    h: &History,
    results: &crate::files::ResultsFile,
    at: &dyn Fn(usize) -> i64,
    t0: i64,
    t1: i64,
    x_unit: f64,
) -> String {
    let Some(c) = results.checkers.iter().find(|c| c.checker == "dedup") else {
        return String::new();
    };
    format!(
        "<h2>Inserts and their retries (dedup)</h2>\n{}\n{}",
        findings_table(&c.details),
        timeline(h, &c.details, at, t0, t1, x_unit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_checkers::checker::{CheckContext, Checker};
    use drift_checkers::history::{Op, OpType, Process};
    use serde_json::json;

    /// A history line: ms, process, type, f, value, key.
    type Line<'a> = (i64, Process, OpType, &'a str, Value, Option<&'a str>);

    /// Insert 1 twice (an `info`, then a retry acknowledged), insert 2
    /// once, and a replica holding insert 1's row twice: a duplicate.
    fn judged() -> (History, crate::files::ResultsFile) {
        let mut lines: Vec<Line> = vec![(
            0,
            Process::Nemesis,
            OpType::Info,
            "dedup-window",
            json!({"window": 100, "window_seconds": 600, "epsilon_ms": 10, "replicas": ["r1"]}),
            None,
        )];
        let attempt = |l: u64, n: u64, row: u64| json!({"insert": l, "attempt": n, "replica": "r1", "blocks": [{"partition": "0", "rows": [[row, 0, "t"]]}]});
        lines.push((1, Process::Client(1), OpType::Invoke, "insert", attempt(1, 1, 1), None));
        lines.push((
            2,
            Process::Client(1),
            OpType::Info,
            "insert",
            json!({"code": null}),
            None,
        ));
        lines.push((3, Process::Client(2), OpType::Invoke, "insert", attempt(1, 2, 1), None));
        lines.push((
            4,
            Process::Client(2),
            OpType::Ok,
            "insert",
            json!({"written_blocks": 1}),
            None,
        ));
        lines.push((5, Process::Client(3), OpType::Invoke, "insert", attempt(2, 1, 2), None));
        lines.push((
            6,
            Process::Client(3),
            OpType::Ok,
            "insert",
            json!({"written_blocks": 1}),
            None,
        ));
        lines.push((7, Process::Client(4), OpType::Invoke, "read", Value::Null, Some("r1")));
        let rows = json!([[1, 0, "t"], [1, 0, "t"], [2, 0, "t"]]);
        lines.push((8, Process::Client(4), OpType::Ok, "read", rows, Some("r1")));
        let ops: Vec<Op> = lines
            .into_iter()
            .enumerate()
            .map(|(i, (t, process, kind, f, value, key))| Op {
                index: i as u64,
                time: t * 1_000_000,
                process,
                kind,
                f: f.into(),
                value,
                key: key.map(Into::into),
                node: (f == "insert").then(|| "r1".into()),
                error: None,
            })
            .collect();
        let n = ops.len() as u64;
        let h = History::from_ops(std::path::Path::new("(test)"), ops, (1..=n).collect()).unwrap();
        let c = drift_checkers::dedup::Dedup
            .check(&h, &CheckContext::new(None, 1 << 30))
            .unwrap();
        assert_eq!(c.verdict, drift_checkers::Verdict::Invalid, "{}", c.details);
        let results = crate::files::ResultsFile {
            verdict: c.verdict,
            history: "h".into(),
            ops: n,
            operations: 4,
            keys: 1,
            checked_at: "now".into(),
            elapsed_ms: 1.0,
            checkers: vec![c],
            artifacts: vec![],
        };
        (h, results)
    }

    #[test]
    fn findings_are_listed_and_a_retried_insert_gets_a_lane_with_its_attempts_joined() {
        let (h, results) = judged();
        let at = |i: usize| h.ops[i].time;
        let page = section(&h, &results, &at, 0, 8_000_000, 1e9);
        assert!(page.contains("<h2>Inserts and their retries (dedup)</h2>"));
        // the duplicate, its block and replica, its attempts
        assert!(
            page.contains(r#"<td class="invalid">duplicate-in-window</td>"#),
            "{page}"
        );
        assert!(
            page.contains("insert 1 #1 on r1: info") && page.contains("insert 1 #2 on r1: ok"),
            "{page}"
        );
        // one lane (insert 1, named by the finding), two bars, one join
        assert!(page.contains("1 logical inserts were retried; 1 lanes drawn"), "{page}");
        assert_eq!(page.matches("<rect").count(), 2, "{page}");
        assert_eq!(page.matches("stroke-dasharray").count(), 1, "{page}");
        // without a dedup result there is no section
        let mut other = results.clone();
        other.checkers.clear();
        assert!(section(&h, &other, &at, 0, 1, 1e9).is_empty());
    }
}
