//! A campaign's run in the store, the same for every backend (processes,
//! containers, hosts, the simulator): the run directory created with its
//! `run.json` and the plan printed, the history judged, and the summary
//! printed at the end.

use crate::fail::Failure;
use crate::judge::{self, Bench, Judgement};
use crate::plan::Campaign;
use drift_checkers::checker::MEM_BYTES_DEFAULT;
use drift_checkers::perf::{PerfSummary, Span};
use drift_checkers::Verdict;
use drift_results::files::{ResultsFile, RunInfo, Versions};
use drift_results::store::{self, RunDir, Store};
use drift_results::time;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What a campaign's history is judged by.
pub(crate) fn bench_of(c: &Campaign) -> Bench {
    Bench {
        checkers: c.plan.checkers(),
        model: c.plan.model(),
        init: Value::Null,
        budget: Some(Duration::from_secs(c.plan.check_budget_s)),
        mem_bytes: MEM_BYTES_DEFAULT,
        jobs: drift_checkers::CheckContext::all_cores(),
        time_order: drift_checkers::TimeOrder::Strict,
    }
}

/// Judges a campaign's stored history into its run directory.
pub(crate) fn judge_run(c: &Campaign, run: &RunDir, info: &RunInfo, store: &Store) -> Result<Judgement, Failure> {
    judge::judge(run, &run.history(), &bench_of(c), Some(info), Some(store))
}

/// A new run in the store, its `run.json` written and the plan printed.
pub(crate) fn create_run(c: &Campaign, store: &Store) -> Result<(RunDir, RunInfo), Failure> {
    let test = c.plan.test_name();
    let run = store
        .create_run(&test)
        .map_err(|e| Failure::new(format!("{}: {e}", store.root().display())))?;
    out!("drift test  seed {}", c.seed);
    out!("  {}", serde_json::to_string(&c.config()).expect("json"));
    if !c.plan.quorum_reads {
        out!(
            "  local reads: a server answers from its own tree, so stale reads under partitions are expected findings"
        );
    }
    let info = RunInfo {
        test,
        kind: "test".into(),
        created_at: time::rfc3339(SystemTime::now()),
        seed: Some(c.seed),
        config: c.config(),
        versions: Versions::current(env!("CARGO_PKG_VERSION"), option_env!("DRIFT_GIT_SHA")),
        source: None,
        hosts: Vec::new(),
        nemesis_schedule: Campaign::schedule_json(&c.schedule),
        target: None,
        interrupted_after_s: None,
    };
    write_run_json(&run, &info)?;
    Ok((run, info))
}

/// A set-up that failed: its run directory goes when it holds nothing
/// but `run.json` (nothing started: a refusal), and is kept, and named,
/// when servers left their logs there.
pub(crate) fn discard_refused(run: &RunDir) {
    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
        out
    }
    let left = files(&run.path);
    if left.iter().all(|p| p == &run.run_json()) {
        let _ = std::fs::remove_dir_all(&run.path);
        // the test's folder too, when this was its only run
        if let Some(test_dir) = run.path.parent() {
            let _ = std::fs::remove_dir(test_dir);
        }
    } else {
        out!("  the failed set-up left its logs in {}", run.path.display());
    }
}

pub(crate) fn write_run_json(run: &RunDir, info: &RunInfo) -> Result<(), Failure> {
    run.write_json(store::RUN_JSON, info)
        .map(|_| ())
        .map_err(|e| Failure::new(format!("{}: {e}", run.run_json().display())))
}

pub(crate) fn summarise(c: &Campaign, judged: &Judgement, ops: u64, took: Duration, problems: &[String], run: &RunDir) {
    let results = &judged.results;
    out!(
        "\n  {} history lines, {} operations, {:.1}s",
        ops,
        results.operations,
        took.as_secs_f64()
    );
    for ch in &results.checkers {
        let extra = match ch.checker.as_str() {
            "stats" => format!(
                "ok {} fail {} info {}",
                ch.details["ok"], ch.details["fail"], ch.details["info"]
            ),
            "digest" => format!("aborts {} problems {}", ch.details["aborts"], ch.details["problems"]),
            "perf" => perf_line(results),
            "linearizable" => format!("{} keys, {} invalid", ch.details["keys"], ch.details["keys_invalid"]),
            "dedup" => dedup_line(&ch.details),
            "convergence" => convergence_line(&ch.details),
            _ => String::new(),
        };
        out!("  checker {:<13} {:<8} {extra}", ch.checker, ch.verdict.as_str());
        if let Some(reason) = &ch.reason {
            out!("          {reason}");
        }
    }
    if !c.plan.quorum_reads && results.verdict == Verdict::Invalid {
        out!("  (local reads: stale reads are expected findings, not a fault of the keeper)");
    }
    for t in problems {
        out!("  teardown problem (verdict unaffected): {t}");
    }
    if let Err(e) = &judged.report {
        out!("  report problem (verdict unaffected): {e}");
    }
    for (a, _) in &judged.pictures {
        out!("  picture {}", run.path.join(a).display());
    }
    out!("verdict  {}", results.verdict.as_str().to_uppercase());
    out!("results  {}", run.results_json().display());
    if let Ok(report) = &judged.report {
        out!("report   {}", report.display());
    }
    if results.verdict != Verdict::Valid {
        out!("reproduce: drift replay {}   (seed {})", run.path.display(), c.seed);
    }
    if let Some(path) = &c.junit {
        let suite = crate::junit::Suite {
            name: &c.plan.test_name(),
            results,
            run_dir: &run.path,
            reproduce: Some(format!("drift replay {}", run.path.display())),
        };
        match crate::junit::write(path, &suite) {
            Ok(()) => out!("junit    {}", path.display()),
            Err(e) => out!("  junit problem (verdict unaffected): {e}"),
        }
    }
}

/// The convergence checker's headline: what it judged and found.
fn convergence_line(d: &Value) -> String {
    let counts = d["counts"]
        .as_object()
        .map(|c| c.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    format!(
        "{} keys, {} writes, {} reads{}, {} ranges read, {} repair sessions, {} GC passes{}",
        d["keys"],
        d["writes"],
        d["reads"],
        if d["reads_judged"] == true { " (judged)" } else { "" },
        d["ranges_read"],
        d["repair_sessions"],
        d["gc_passes"],
        if counts.is_empty() {
            String::new()
        } else {
            format!("; {counts}")
        }
    )
}

/// The dedup checker's headline: what the clients did and what the
/// table kept.
fn dedup_line(d: &Value) -> String {
    let counts = d["counts"]
        .as_object()
        .map(|c| c.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let b = &d["bound"];
    let bound = match b["kind"].as_str() {
        Some("witness") => format!(
            "; retried keys judged by the keeper's witness {}, from the client {}; ids removed inside the window {}",
            b["keys_judged_by_witness"], b["keys_judged_from_the_client"], b["removals_inside_the_window"]
        ),
        Some(_) => format!(
            "; retried keys judged from the client {} (no witness)",
            b["keys_judged_from_the_client"]
        ),
        None => String::new(),
    };
    format!(
        "{} logical inserts, {} attempts (ok {} fail {} info {}), {} blocks deduplicated by the table, {} block copies exactly once{bound}{}",
        d["logical_inserts"],
        d["attempts"],
        d["ok"],
        d["fail"],
        d["info"],
        d["deduplicated_blocks"],
        d["exactly_once_per_replica"],
        if counts.is_empty() { String::new() } else { format!("; {counts}") }
    )
}

/// The perf checker's headline: succeeded ops per second and the
/// latency quantiles of all operations, then the same per fault window.
fn perf_line(results: &ResultsFile) -> String {
    let Some(perf) = PerfSummary::from_results(&results.checkers) else {
        return String::new();
    };
    let span = |s: &Span| {
        let q = s.all.latency_ms;
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        format!(
            "{:.0} ok/s p50 {} p99 {} ms",
            s.all.ok_per_s,
            ms(q.map(|q| q.p50)),
            ms(q.map(|q| q.p99))
        )
    };
    let mut line = span(&perf.run);
    for w in &perf.windows {
        line.push_str(&format!("; {}: {}", w.window, span(&w.span)));
    }
    line
}
