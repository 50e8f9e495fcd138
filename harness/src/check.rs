//! `drift check`: run checkers on a recorded history and store the results.
//!
//! Input: a history file, or a run directory (its `history.jsonl`).
//! Output: `results.json` and one picture per linearizability violation —
//! in the run directory when given one (or when the file sits in one),
//! else in a new run `check-<name>` under the store; `--out` overrides.
//! Exit: the composed verdict's code, or 3 for bad input or arguments.

use crate::cli::CheckArgs;
use crate::compare::read_json;
use crate::fail::Failure;
use crate::judge::{self, Bench, Judgement};
use crate::plan::Plan;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::LinearReport;
use drift_checkers::registry::CheckerKind;
use drift_results::files::{RunInfo, Versions};
use drift_results::store::{self, RunDir, Store};
use drift_results::time;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub fn run(args: CheckArgs) -> Result<i32, Failure> {
    // clap held both to their bounds (cli::parse_budget_s, --mem-mb's range)
    let budget = args.budget_s.map(Duration::from_secs_f64);
    let (history_path, run_dir) = resolve_input(&args.input)?;
    // a campaign's run is judged as the campaign judged it, unless told
    // otherwise
    let plan = match &run_dir {
        Some(run) => campaign_plan(run)?,
        None => None,
    };
    let bench = Bench {
        checkers: if !args.checkers.is_empty() {
            dedup(&args.checkers)
        } else if let Some(p) = &plan {
            p.checkers()
        } else {
            vec![CheckerKind::Linearizable]
        },
        model: Some(
            args.model
                .or_else(|| plan.as_ref().and_then(Plan::model))
                .unwrap_or(ModelKind::CasRegister),
        ),
        init: args.init.clone().unwrap_or(serde_json::Value::Null),
        budget: budget.or_else(|| plan.as_ref().map(|p| Duration::from_secs(p.check_budget_s))),
        mem_bytes: (args.mem_mb as usize) << 20,
        jobs: args
            .jobs
            .map_or_else(drift_checkers::CheckContext::all_cores, |j| j as usize),
        time_order: if args.allow_unordered_time {
            drift_checkers::TimeOrder::Unordered
        } else {
            drift_checkers::TimeOrder::Strict
        },
    };

    if bench.model == Some(ModelKind::Kv) {
        drift_checkers::linear::model::Kv::with_init(&bench.init).map_err(|e| Failure::new(format!("--init: {e}")))?;
    }
    let (out, new_run) = output_dir(&args, run_dir, &history_path)?;
    if new_run.is_some() {
        write_run_json(&out, &args, &history_path)?;
    }
    let info: Option<RunInfo> = read_json(&out.run_json())?;
    // `latest` means the newest campaign run (what `drift replay
    // store/latest` replays): a check never moves it
    let judged = judge::judge(&out, &history_path, &bench, info.as_ref(), None)?;
    if args.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&judged.results).expect("results serialize")
        );
    } else {
        print_summary(&judged);
    }
    if let Err(e) = &judged.report {
        out!("problem  {e} (the verdict stands)");
    }
    if let Some(path) = &args.junit {
        let name = out
            .path
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "check".into());
        let suite = crate::junit::Suite {
            name: &name,
            results: &judged.results,
            run_dir: &out.path,
            reproduce: Some(format!("drift check {}", args.input.display())),
        };
        crate::junit::write(path, &suite).map_err(Failure::new)?;
    }
    Ok(judged.results.verdict.exit_code())
}

/// The plan of a stored campaign run (what judged it), if it is one; a
/// `run.json` that does not parse, or a campaign plan that does not, is
/// an error naming the file (never a silent fall back to other checkers).
fn campaign_plan(run: &RunDir) -> Result<Option<Plan>, Failure> {
    let path = run.run_json();
    let Some(info) = read_json::<RunInfo>(&path)? else {
        return Ok(None);
    };
    if info.kind != "test" {
        return Ok(None);
    }
    serde_json::from_value(info.config)
        .map(Some)
        .map_err(|e| Failure::new(format!("{}: config: {e}", path.display())))
}

fn dedup(kinds: &[CheckerKind]) -> Vec<CheckerKind> {
    let mut out: Vec<CheckerKind> = Vec::new();
    for k in kinds {
        if !out.contains(k) {
            out.push(*k);
        }
    }
    out
}

/// The history file to read and, when the input is a run, its directory.
/// Both by their real paths: what the results record must not go through
/// a link that moves (`store/latest` names the newest run, not this one).
fn resolve_input(input: &Path) -> Result<(PathBuf, Option<RunDir>), Failure> {
    let input = &input.canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Failure::new(format!("{}: no such file or directory", input.display())),
        _ => Failure::new(format!("{}: {e}", input.display())),
    })?;
    if input.is_dir() {
        let run = RunDir::open(input).map_err(Failure::new)?;
        return Ok((run.history(), Some(run)));
    }
    // an absolute path now: a file has a parent
    let run = input
        .parent()
        .filter(|p| input.file_name() == Some(store::HISTORY.as_ref()) && p.join(store::RUN_JSON).is_file())
        .and_then(|p| RunDir::open(p).ok());
    Ok((input.to_path_buf(), run))
}

/// Where results go; `Some(store)` when a new run was made in it.
fn output_dir(args: &CheckArgs, run_dir: Option<RunDir>, history: &Path) -> Result<(RunDir, Option<Store>), Failure> {
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).map_err(|e| Failure::new(format!("{}: cannot create: {e}", out.display())))?;
        return Ok((RunDir { path: out.clone() }, None));
    }
    if let Some(run) = run_dir {
        return Ok((run, None));
    }
    let store = Store::new(&args.store);
    let stem: String = history
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("history")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let run = store
        .create_run(&format!("check-{stem}"))
        .map_err(|e| Failure::new(format!("{}: cannot create a run: {e}", store.root().display())))?;
    Ok((run, Some(store)))
}

fn write_run_json(out: &RunDir, args: &CheckArgs, history: &Path) -> Result<(), Failure> {
    let info = RunInfo {
        test: out
            .path
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("check")
            .to_string(),
        kind: "check".into(),
        created_at: time::rfc3339(SystemTime::now()),
        seed: None,
        config: serde_json::json!({
            "checkers": args.checkers,
            "model": args.model.unwrap_or(ModelKind::CasRegister),
            "init": args.init,
            "budget_s": args.budget_s,
            "mem_mb": args.mem_mb,
        }),
        versions: Versions::current(env!("CARGO_PKG_VERSION"), option_env!("DRIFT_GIT_SHA")),
        source: Some(history.display().to_string()),
        hosts: Vec::new(),
        nemesis_schedule: Vec::new(),
        target: None,
        interrupted_after_s: None,
    };
    out.write_json(store::RUN_JSON, &info)
        .map_err(|e| Failure::new(format!("{}: cannot write run.json: {e}", out.path.display())))?;
    Ok(())
}

fn print_summary(judged: &Judgement) {
    let Judgement {
        results,
        composed,
        pictures,
        results_path,
        report,
    } = judged;
    out!(
        "history  {}  ({} lines, {} operations, {} key{})",
        results.history,
        results.ops,
        results.operations,
        results.keys,
        if results.keys == 1 { "" } else { "s" }
    );
    for r in &composed.results {
        out!(
            "checker  {:<13} {:<8} {:>9.2} ms",
            r.checker,
            r.verdict.as_str(),
            r.elapsed_ms
        );
        if let Some(reason) = &r.reason {
            out!("         {reason}");
        }
        if let Ok(report) = serde_json::from_value::<LinearReport>(r.details.clone()) {
            if let Some(v) = report.violations.first() {
                for line in v.explanation.lines() {
                    out!("         {line}");
                }
            }
            if report.keys_invalid > 1 {
                out!(
                    "         {} of {} keys are not linearizable",
                    report.keys_invalid,
                    report.keys
                );
            }
        }
    }
    let dir = results_path.parent().unwrap_or(Path::new("."));
    for (name, _) in pictures {
        out!("picture  {}", dir.join(name).display());
    }
    out!(
        "verdict  {}  ({:.2} ms)",
        results.verdict.as_str().to_uppercase(),
        results.elapsed_ms
    );
    out!("results  {}", results_path.display());
    if let Ok(report) = report {
        out!("report   {}", report.display());
    }
}
