//! The judge: from a recorded history to a verdict on disk — the one step
//! `drift test`, `drift replay` and `drift check` share.
//!
//! It loads the history, runs the checkers, writes one picture per
//! explained linearizability violation, `results.json` and `report.html`
//! into the run directory, and moves the store's `latest` when asked.
//! The report's plots, which need the history only, are drawn on a second
//! thread while the checkers run.
//! One error policy: what the verdict rests on (the history, the
//! checkers, `results.json`, the pictures it names) failing is the run's
//! failure (exit 3); the report, a view of what is stored, failing is a
//! problem said beside the verdict, which stands.

use crate::fail::Failure;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::LinearReport;
use drift_checkers::registry::{self, CheckerKind};
use drift_checkers::{check_all, CheckContext, Checker, Composed, History};
use drift_results::files::{ResultsFile, RunInfo};
use drift_results::store::{self, RunDir, Store};
use drift_results::{picture, report, time};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// What to judge a history by.
#[derive(Debug, Clone, PartialEq)]
pub struct Bench {
    pub checkers: Vec<CheckerKind>,
    /// The linearizability checker's model.
    pub model: Option<ModelKind>,
    /// What every key holds before the first operation.
    pub init: serde_json::Value,
    /// Time budget of all checkers together (none: unbounded).
    pub budget: Option<Duration>,
    /// Memory cap of one search.
    pub mem_bytes: usize,
    /// Threads a checker may use.
    pub jobs: usize,
    /// Whether a client process's time may go backwards in the history
    /// (`--allow-unordered-time`, for imported histories).
    pub time_order: drift_checkers::TimeOrder,
}

/// A judged history.
pub struct Judgement {
    pub results: ResultsFile,
    pub composed: Composed,
    /// Pictures written: (file name in the run directory, key).
    pub pictures: Vec<(String, Option<String>)>,
    pub results_path: PathBuf,
    /// `report.html`, or why it could not be written.
    pub report: Result<PathBuf, String>,
}

/// Judges the history at `history` into `out`. `info` describes the run
/// for the report; `latest`, when given, is pointed at `out` afterwards.
pub fn judge(
    out: &RunDir,
    history: &Path,
    bench: &Bench,
    info: Option<&RunInfo>,
    latest: Option<&Store>,
) -> Result<Judgement, Failure> {
    let checkers: Vec<Box<dyn Checker>> = bench
        .checkers
        .iter()
        .map(|&k| registry::build(k, bench.model, &bench.init).map_err(Failure::new))
        .collect::<Result<_, _>>()?;
    let h = History::load_with(history, bench.time_order).map_err(|e| Failure::new(e.to_string()))?;
    let ctx = CheckContext::new(bench.budget, bench.mem_bytes).with_jobs(bench.jobs);
    // the report's plots need the history only: drawn on a second
    // thread while the checkers run (a long history's take a while)
    let summarize = !bench.checkers.contains(&CheckerKind::Perf);
    let (checked, elapsed_ms, plots) = std::thread::scope(|scope| {
        let drawing = scope.spawn(|| report::plots(&h, summarize));
        let started = Instant::now();
        let checked = check_all(&checkers, &h, &ctx);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        let plots = drawing.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (checked, elapsed_ms, plots)
    });
    let composed = checked.map_err(|e| Failure::new(e.to_string()))?;
    let labels = match plots.clock() {
        report::Clock::Nanos => picture::AxisLabels::Time,
        report::Clock::Order(_) => picture::AxisLabels::Position,
    };
    let pictures = write_pictures(out, &composed, history, labels)?;
    let results = ResultsFile {
        verdict: composed.verdict,
        history: history.display().to_string(),
        ops: h.ops.len() as u64,
        operations: h.operations.len() as u64,
        keys: h.key_count(),
        checked_at: time::rfc3339(SystemTime::now()),
        elapsed_ms,
        checkers: composed.results.clone(),
        artifacts: pictures.iter().map(|(name, _)| name.clone()).collect(),
    };
    let results_path = out
        .write_json(store::RESULTS_JSON, &results)
        .map_err(|e| Failure::new(format!("{}: cannot write results: {e}", out.path.display())))?;
    let report = report::write(out, &h, info, &results, &plots)
        .map_err(|e| format!("{}: cannot write: {e}", out.report_html().display()));
    if let Some(store) = latest {
        store
            .set_latest(out)
            .map_err(|e| Failure::new(format!("{}: cannot update latest: {e}", store.root().display())))?;
    }
    // a long history's million small allocations take a while to give
    // back: not on the way out
    std::thread::spawn(move || drop(h));
    Ok(Judgement {
        results,
        composed,
        pictures,
        results_path,
        report,
    })
}

/// Writes one picture per explained violation.
fn write_pictures(
    out: &RunDir,
    composed: &Composed,
    history: &Path,
    labels: picture::AxisLabels,
) -> Result<Vec<(String, Option<String>)>, Failure> {
    let mut written = Vec::new();
    for r in composed
        .results
        .iter()
        .filter(|r| r.checker == CheckerKind::Linearizable.name())
    {
        let Ok(report) = serde_json::from_value::<LinearReport>(r.details.clone()) else {
            continue;
        };
        for (n, v) in report.violations.iter().enumerate() {
            let name = format!("linearizable-{}.html", n + 1);
            let html = picture::render(v, &history.display().to_string(), labels);
            out.write_file(&name, html.as_bytes())
                .map_err(|e| Failure::new(format!("{}: cannot write {name}: {e}", out.path.display())))?;
            written.push((name, v.key.clone()));
        }
    }
    Ok(written)
}
