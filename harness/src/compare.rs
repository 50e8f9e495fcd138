//! `drift compare`: stored runs side by side — which versions made them,
//! what their configs differ in, how each checker's verdict moved, and
//! throughput and latency per op and per fault window — with an exit code
//! CI can gate on.
//!
//! The perf figures are recomputed from each run's `history.jsonl` (the
//! record of truth), so runs stored by drifts that had no perf checker
//! compare too. Verdicts come from `results.json`; a run without one
//! counts as not checked, which is a change but not a regression.

use crate::cli::CompareArgs;
use crate::fail::Failure;
use drift_checkers::perf::{self, FStats, PerfSummary, Span};
use drift_checkers::{History, Verdict};
use drift_results::files::{ResultsFile, RunInfo};
use drift_results::store::{self, RunDir};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One line into the text being built.
macro_rules! ln {
    ($o:expr, $($arg:tt)*) => {{
        let _ = writeln!($o, $($arg)*);
    }};
}

/// One run as the comparison sees it.
#[derive(Serialize)]
struct Side {
    path: PathBuf,
    /// `run.json`, when the run has one.
    info: Option<RunInfo>,
    /// The composed verdict and each checker's (absent: never checked).
    verdict: Option<Verdict>,
    checkers: Vec<(String, Verdict)>,
    perf: PerfSummary,
}

/// A config option that differs.
#[derive(Serialize)]
struct ConfigChange {
    option: String,
    baseline: Value,
    run: Value,
}

/// One checker in both runs.
#[derive(Serialize)]
struct CheckerRow {
    checker: String,
    baseline: Option<Verdict>,
    run: Option<Verdict>,
    worse: bool,
}

/// One op (or `all`) over one span (the run, or a fault window).
#[derive(Serialize)]
struct PerfRow {
    /// `run` or the window's faults.
    span: String,
    f: String,
    baseline: Option<FStats>,
    run: Option<FStats>,
    /// run / baseline, where both exist and the baseline is not zero.
    ok_per_s_ratio: Option<f64>,
    p50_ratio: Option<f64>,
    p99_ratio: Option<f64>,
}

#[derive(Serialize)]
struct Comparison {
    run: PathBuf,
    config_changes: Vec<ConfigChange>,
    checkers: Vec<CheckerRow>,
    perf: Vec<PerfRow>,
    /// Why the run is worse than the baseline (empty: it is not).
    regressions: Vec<String>,
    /// How much worse: `invalid` (a checker turned invalid, a limit was
    /// crossed), `unknown` (a checker turned unknown) or `valid` (not
    /// worse); the exit code follows it.
    worst: Verdict,
}

pub fn run(args: CompareArgs) -> Result<i32, Failure> {
    // the --max-* limits are held to percentages by clap (cli::parse_percent)
    let paths = resolve(&args.runs)?;
    let limits = Limits {
        max_throughput_drop: args.max_throughput_drop,
        max_p99_rise: args.max_p99_rise,
        min_ops: args.min_ops,
    };
    let (text, code) = render(&paths, &limits, args.json)?;
    out!("{}", text.trim_end());
    Ok(code)
}

/// What makes a run worse than its baseline besides its verdicts.
pub struct Limits {
    pub max_throughput_drop: Option<f64>,
    pub max_p99_rise: Option<f64>,
    pub min_ops: u64,
}

/// The comparison of `paths` (baseline first) as text or JSON, and its
/// exit code.
pub fn render(paths: &[PathBuf], limits: &Limits, json: bool) -> Result<(String, i32), Failure> {
    let (sides, comparisons, code) = compute(paths, limits)?;
    let (baseline, runs) = sides.split_first().expect("compute checked");
    let mut o = String::new();
    if json {
        let out = serde_json::json!({
            "baseline": baseline,
            "runs": runs,
            "comparisons": comparisons,
            "exit_code": code,
        });
        o = serde_json::to_string_pretty(&out).expect("comparison serializes");
    } else {
        print_side(&mut o, "baseline", baseline);
        for (run, c) in runs.iter().zip(&comparisons) {
            ln!(o, "");
            print_side(&mut o, "run", run);
            print_comparison(&mut o, c);
        }
    }
    Ok((o, code))
}

/// The runs of `paths` (baseline first), each compared with the
/// baseline, and the exit code of it all.
fn compute(paths: &[PathBuf], limits: &Limits) -> Result<(Vec<Side>, Vec<Comparison>, i32), Failure> {
    let sides = paths.iter().map(|p| load(p)).collect::<Result<Vec<_>, _>>()?;
    let Some((baseline, runs)) = sides.split_first().filter(|(_, r)| !r.is_empty()) else {
        return Err(Failure::new("comparing needs a baseline and at least one run"));
    };
    let comparisons: Vec<Comparison> = runs.iter().map(|r| compare(baseline, r, limits)).collect();
    let code = comparisons
        .iter()
        .fold(Verdict::Valid, |v, c| v.and(c.worst))
        .exit_code();
    Ok((sides, comparisons, code))
}

/// The comparison of `paths` as an HTML body, as `drift serve` shows it:
/// tables like the report's, each run named by its path in the store
/// (`root`) and linked to its report through `link`.
pub fn render_html(
    paths: &[PathBuf],
    limits: &Limits,
    root: &Path,
    link: &dyn Fn(&Path) -> String,
) -> Result<String, Failure> {
    use drift_results::picture::esc;
    let (sides, comparisons, _) = compute(paths, limits)?;
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let verdict = |v: Option<Verdict>| match v {
        Some(v) => format!(r#"<span class="{}">{}</span>"#, v.as_str(), v.as_str()),
        None => "–".to_string(),
    };
    let mut o = String::from(
        "<table><tr><th></th><th>run</th><th>test</th><th>created</th><th>seed</th><th>drift</th><th>verdict</th></tr>",
    );
    for (n, s) in sides.iter().enumerate() {
        let (test, created, seed, version) = match &s.info {
            Some(i) => (
                i.test.clone(),
                i.created_at.clone(),
                i.seed.map_or_else(|| "–".into(), |v| v.to_string()),
                i.versions.short(),
            ),
            None => ("–".into(), "–".into(), "–".into(), "–".into()),
        };
        let _ = write!(
            o,
            r#"<tr><td>{}</td><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            if n == 0 { "baseline" } else { "run" },
            esc(&link(&s.path)),
            esc(&rel(&s.path)),
            esc(&test),
            esc(&created),
            esc(&seed),
            esc(&version),
            verdict(s.verdict)
        );
    }
    o.push_str("</table>");
    for c in &comparisons {
        let _ = write!(o, "<h2>{} against the baseline</h2>", esc(&rel(&c.run)));
        if c.config_changes.is_empty() {
            o.push_str("<p>Same options.</p>");
        } else {
            o.push_str(r#"<p class="note">The options differ: the figures compare different campaigns.</p><table><tr><th>option</th><th>baseline</th><th>run</th></tr>"#);
            for ch in &c.config_changes {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&ch.option),
                    esc(&ch.baseline.to_string()),
                    esc(&ch.run.to_string())
                );
            }
            o.push_str("</table>");
        }
        o.push_str("<table><tr><th>checker</th><th>baseline</th><th>run</th><th></th></tr>");
        for row in &c.checkers {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&row.checker),
                verdict(row.baseline),
                verdict(row.run),
                if row.worse {
                    r#"<span class="invalid">worse</span>"#
                } else {
                    ""
                }
            );
        }
        o.push_str("</table>");
        o.push_str(r#"<table><tr><th>span</th><th>op</th><th>ok/s baseline</th><th>ok/s run</th><th>ratio</th><th>p50 ms baseline</th><th>p50 ms run</th><th>ratio</th><th>p99 ms baseline</th><th>p99 ms run</th><th>ratio</th></tr>"#);
        let cell = |v: Option<f64>| {
            v.map_or_else(
                || "–".to_string(),
                |v| {
                    if v >= 100.0 {
                        format!("{v:.0}")
                    } else {
                        format!("{v:.1}")
                    }
                },
            )
        };
        let ratio = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |r| format!("{r:.2}"));
        for row in &c.perf {
            let ok = |s: &Option<FStats>| s.as_ref().map(|s| s.ok_per_s);
            let q = |s: &Option<FStats>, p: fn(&perf::Quantiles) -> f64| {
                s.as_ref().and_then(|s| s.latency_ms.as_ref().map(p))
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(if row.span == "run" { "whole run" } else { &row.span }),
                esc(&row.f),
                cell(ok(&row.baseline)),
                cell(ok(&row.run)),
                ratio(row.ok_per_s_ratio),
                cell(q(&row.baseline, |q| q.p50)),
                cell(q(&row.run, |q| q.p50)),
                ratio(row.p50_ratio),
                cell(q(&row.baseline, |q| q.p99)),
                cell(q(&row.run, |q| q.p99)),
                ratio(row.p99_ratio),
            );
        }
        o.push_str("</table>");
        if c.regressions.is_empty() {
            o.push_str(r#"<p class="valid">Not worse than the baseline.</p>"#);
        } else {
            o.push_str(r#"<p class="invalid">Worse than the baseline:</p><ul>"#);
            for r in &c.regressions {
                let _ = write!(o, "<li>{}</li>", esc(r));
            }
            o.push_str("</ul>");
        }
    }
    Ok(o)
}

/// The run directories the arguments name, baseline first.
fn resolve(args: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    if let [only] = args {
        if store::is_run(only) {
            return Err(Failure::new(format!(
                "{}: one run alone has nothing to compare with: give a baseline and a run, or a test directory holding two runs or more",
                only.display()
            )));
        }
        let runs = runs_in(only)?;
        if runs.len() < 2 {
            return Err(Failure::new(format!(
                "{}: holds {} run{}; comparing needs two",
                only.display(),
                runs.len(),
                if runs.len() == 1 { "" } else { "s" }
            )));
        }
        return Ok(runs[runs.len() - 2..].to_vec());
    }
    args.iter()
        .map(|p| {
            if store::is_run(p) {
                Ok(p.clone())
            } else {
                runs_in(p)?
                    .pop()
                    .ok_or_else(|| Failure::new(format!("{}: holds no run", p.display())))
            }
        })
        .collect()
}

/// The runs of a test directory, oldest first.
fn runs_in(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let not_runs = |why: String| {
        Failure::new(format!(
            "{}: not a run (no {}) nor a test directory of runs{why}",
            dir.display(),
            store::HISTORY
        ))
    };
    let runs = store::runs_of(dir).map_err(|e| not_runs(format!(": {e}")))?;
    if runs.is_empty() {
        return Err(not_runs(String::new()));
    }
    Ok(runs)
}

/// Reads a JSON file of a run if it exists; a file that exists but does
/// not parse is an error naming it and the place.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, Failure> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Failure::new(format!("{}: {e}", path.display()))),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Failure::new(format!("{}: {e}", path.display())))
}

fn load(path: &Path) -> Result<Side, Failure> {
    let run = RunDir::open(path).map_err(Failure::new)?;
    let info: Option<RunInfo> = read_json(&run.run_json())?;
    let results: Option<ResultsFile> = read_json(&run.results_json())?;
    let history = History::load(&run.history()).map_err(|e| Failure::new(e.to_string()))?;
    Ok(Side {
        path: path.to_path_buf(),
        info,
        verdict: results.as_ref().map(|r| r.verdict),
        checkers: results
            .map(|r| r.checkers.into_iter().map(|c| (c.checker, c.verdict)).collect())
            .unwrap_or_default(),
        perf: perf::summarize(&history),
    })
}

fn compare<'a>(base: &'a Side, run: &'a Side, args: &Limits) -> Comparison {
    let mut regressions = Vec::new();
    // how much worse, on the verdict scale: a checker turned invalid or a
    // limit crossed is `Invalid`, a checker turned unknown `Unknown`
    let mut worst = Verdict::Valid;

    let config_changes = match (&base.info, &run.info) {
        (Some(b), Some(r)) => config_changes(&b.config, &r.config),
        _ => Vec::new(),
    };

    let names = union(
        base.checkers.iter().map(|(n, _)| n.as_str()),
        run.checkers.iter().map(|(n, _)| n.as_str()),
    );
    let verdict_of = |side: &Side, name: &str| side.checkers.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let checkers: Vec<CheckerRow> = names
        .into_iter()
        .map(|name| {
            let (b, r) = (verdict_of(base, &name), verdict_of(run, &name));
            let worse = matches!((b, r), (Some(b), Some(r)) if r > b);
            if let (true, Some(b), Some(r)) = (worse, b, r) {
                regressions.push(format!("checker {name}: {} → {}", b.as_str(), r.as_str()));
                worst = worst.and(r);
            }
            CheckerRow {
                checker: name,
                baseline: b,
                run: r,
                worse,
            }
        })
        .collect();

    let mut perf = perf_rows("run", Some(&base.perf.run), Some(&run.perf.run));
    let windows = union(
        base.perf.windows.iter().map(|w| w.window.as_str()),
        run.perf.windows.iter().map(|w| w.window.as_str()),
    );
    let window = |p: &'a PerfSummary, name: &str| -> Option<&'a Span> {
        p.windows.iter().find(|w| w.window == name).map(|w| &w.span)
    };
    for name in &windows {
        perf.extend(perf_rows(name, window(&base.perf, name), window(&run.perf, name)));
    }
    // the limits judge the whole run's figures: a window's few ops are
    // noise. Throughput needs enough successes in the baseline only (an op
    // that stopped succeeding, or vanished, fell by 100%); p99 needs
    // enough on both sides
    for row in perf.iter().filter(|r| r.span == "run") {
        let Some(b) = &row.baseline else {
            continue;
        };
        if b.ok < args.min_ops {
            continue;
        }
        let run_ok_per_s = row.run.as_ref().map_or(0.0, |r| r.ok_per_s);
        if let Some(limit) = args.max_throughput_drop.filter(|_| b.ok_per_s > 0.0) {
            let drop = (1.0 - run_ok_per_s / b.ok_per_s) * 100.0;
            if drop > limit {
                regressions.push(format!(
                    "{}: throughput {:.1} → {:.1} ok/s, down {drop:.1}% (limit {limit}%)",
                    row.f, b.ok_per_s, run_ok_per_s
                ));
                worst = Verdict::Invalid;
            }
        }
        let Some(r) = row.run.as_ref().filter(|r| r.ok >= args.min_ops) else {
            continue;
        };
        if let (Some(limit), Some(ratio), Some(bq), Some(rq)) =
            (args.max_p99_rise, row.p99_ratio, b.latency_ms, r.latency_ms)
        {
            let rise = (ratio - 1.0) * 100.0;
            if rise > limit {
                regressions.push(format!(
                    "{}: p99 {:.1} → {:.1} ms, up {rise:.1}% (limit {limit}%)",
                    row.f, bq.p99, rq.p99
                ));
                worst = Verdict::Invalid;
            }
        }
    }
    // the composed verdict counts even when the checkers differ by name
    // (one turned unknown, a new one is invalid)
    if let (Some(b), Some(r)) = (base.verdict, run.verdict) {
        if r > b {
            if worst < r {
                regressions.push(format!("verdict {} → {}", b.as_str(), r.as_str()));
            }
            worst = worst.and(r);
        }
    }
    Comparison {
        run: run.path.clone(),
        config_changes,
        checkers,
        perf,
        regressions,
        worst,
    }
}

/// The top-level options whose values differ.
fn config_changes(base: &Value, run: &Value) -> Vec<ConfigChange> {
    let (Some(b), Some(r)) = (base.as_object(), run.as_object()) else {
        return if base == run {
            Vec::new()
        } else {
            vec![ConfigChange {
                option: "config".into(),
                baseline: base.clone(),
                run: run.clone(),
            }]
        };
    };
    let keys: BTreeSet<&String> = b.keys().chain(r.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (bv, rv) = (
                b.get(k).cloned().unwrap_or(Value::Null),
                r.get(k).cloned().unwrap_or(Value::Null),
            );
            (bv != rv).then(|| ConfigChange {
                option: k.clone(),
                baseline: bv,
                run: rv,
            })
        })
        .collect()
}

/// The names of `a`, then those of `b` that `a` lacks, each once.
fn union<'s>(a: impl IntoIterator<Item = &'s str>, b: impl IntoIterator<Item = &'s str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in a.into_iter().chain(b) {
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    out
}

fn ratio(b: f64, r: f64) -> Option<f64> {
    (b > 0.0).then(|| r / b)
}

/// Rows for `all` and every op of one span.
fn perf_rows<'a>(span: &str, base: Option<&'a Span>, run: Option<&'a Span>) -> Vec<PerfRow> {
    let keys = |s: Option<&'a Span>| s.into_iter().flat_map(|s| s.by_f.keys().map(String::as_str));
    let fs = union(std::iter::once("all").chain(keys(base)), keys(run));
    fs.into_iter()
        .map(|f| {
            let get = |s: Option<&Span>| {
                s.and_then(|s| {
                    if f == "all" {
                        Some(s.all.clone())
                    } else {
                        s.by_f.get(&f).cloned()
                    }
                })
            };
            let (b, r) = (get(base), get(run));
            let q = |s: &Option<FStats>| s.as_ref().and_then(|s| s.latency_ms);
            let (bq, rq) = (q(&b), q(&r));
            PerfRow {
                span: span.to_string(),
                ok_per_s_ratio: b
                    .as_ref()
                    .zip(r.as_ref())
                    .and_then(|(b, r)| ratio(b.ok_per_s, r.ok_per_s)),
                p50_ratio: bq.zip(rq).and_then(|(b, r)| ratio(b.p50, r.p50)),
                p99_ratio: bq.zip(rq).and_then(|(b, r)| ratio(b.p99, r.p99)),
                f,
                baseline: b,
                run: r,
            }
        })
        .collect()
}

fn print_side(o: &mut String, label: &str, s: &Side) {
    ln!(o, "{label:<9}{}", s.path.display());
    let mut line = String::new();
    match &s.info {
        Some(i) => {
            line.push_str(&format!("{} ({})  {}", i.test, i.kind, i.created_at));
            if let Some(seed) = i.seed {
                line.push_str(&format!("  seed {seed}"));
            }
            line.push_str(&format!("  drift {}", i.versions.short()));
        }
        None => line.push_str(&format!("no {}", store::RUN_JSON)),
    }
    let verdict = s
        .verdict
        .map_or_else(|| "NOT CHECKED".to_string(), |v| v.as_str().to_uppercase());
    ln!(o, "         {line}  {verdict}");
}

fn num(v: Option<f64>, width: usize) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:>width$.0}"),
        Some(v) => format!("{v:>width$.1}"),
        None => format!("{:>width$}", "-"),
    }
}

fn times(v: Option<f64>) -> String {
    v.map_or_else(|| format!("{:>6}", "-"), |r| format!("{r:>6.2}"))
}

/// Lines under a heading: the first beside it, the rest aligned below.
fn labelled(o: &mut String, heading: &str, lines: &[String]) {
    let indent = " ".repeat(heading.chars().count());
    for (n, line) in lines.iter().enumerate() {
        ln!(o, "{}{line}", if n == 0 { heading } else { &indent });
    }
}

/// An option's value as the text comparison prints it: one a run did not
/// store (made by a drift before the option existed) says so, not `null`.
fn shown(v: &Value) -> String {
    match v {
        Value::Null => "(not stored)".into(),
        v => v.to_string(),
    }
}

fn print_comparison(o: &mut String, c: &Comparison) {
    if c.config_changes.is_empty() {
        ln!(o, "config   same options");
    }
    let changes: Vec<String> = c
        .config_changes
        .iter()
        .map(|ch| format!("{}: {} → {}", ch.option, shown(&ch.baseline), shown(&ch.run)))
        .collect();
    labelled(o, "config   ", &changes);
    if !c.checkers.is_empty() {
        ln!(o, "{:<22} {:<9} run", "checker", "baseline");
        let v = |v: Option<Verdict>| v.map_or("-", Verdict::as_str);
        for row in &c.checkers {
            let line = format!(
                "  {:<20} {:<9} {:<9} {}",
                row.checker,
                v(row.baseline),
                v(row.run),
                if row.worse { "worse" } else { "" }
            );
            ln!(o, "{}", line.trim_end());
        }
    }
    let groups = format!(
        "{:<22} {:^26}  {:^24}  {:^24}",
        "succeeded ops", "ok/s", "p50 ms", "p99 ms"
    );
    ln!(o, "{}", groups.trim_end());
    ln!(
        o,
        "{:<22} {:>9} {:>9} {:>6}  {:>8} {:>8} {:>6}  {:>8} {:>8} {:>6}",
        "",
        "baseline",
        "run",
        "ratio",
        "baseline",
        "run",
        "ratio",
        "baseline",
        "run",
        "ratio"
    );
    let mut span = "";
    for row in &c.perf {
        if row.span != span {
            span = &row.span;
            ln!(
                o,
                "  {}",
                if span == "run" {
                    "whole run".to_string()
                } else {
                    format!("window {span}")
                }
            );
        }
        let ok = |s: &Option<FStats>| s.as_ref().map(|s| s.ok_per_s);
        let q =
            |s: &Option<FStats>, p: fn(&perf::Quantiles) -> f64| s.as_ref().and_then(|s| s.latency_ms.as_ref().map(p));
        ln!(
            o,
            "    {:<18} {} {} {}  {} {} {}  {} {} {}",
            row.f,
            num(ok(&row.baseline), 9),
            num(ok(&row.run), 9),
            times(row.ok_per_s_ratio),
            num(q(&row.baseline, |q| q.p50), 8),
            num(q(&row.run, |q| q.p50), 8),
            times(row.p50_ratio),
            num(q(&row.baseline, |q| q.p99), 8),
            num(q(&row.run, |q| q.p99), 8),
            times(row.p99_ratio),
        );
    }
    if !c.config_changes.is_empty() {
        ln!(
            o,
            "note     the configs differ: the figures compare different campaigns"
        );
    }
    if c.regressions.is_empty() {
        ln!(o, "result   not worse than the baseline");
    }
    labelled(o, "result   WORSE: ", &c.regressions);
}
