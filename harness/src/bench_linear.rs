//! `drift bench checker --long`: the linearizability checker on long
//! generated cas-register histories whose verdict is known (see
//! `drift_checkers::linear::synth`). Per history: generating, pairing,
//! the check alone (no explanation) and the check with its explanation,
//! timed apart; the verdict against the known one (a mismatch exits 1);
//! the core's size and whether it is minimal; the process's peak memory.

use crate::arg_values::{parse_budget_s, parse_fraction, parse_json};
use crate::fail::Failure;
use clap::Args;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::synth::{self, Inject, Spec};
use drift_checkers::linear::{LinearReport, Linearizable};
use drift_checkers::{checker::MEM_BYTES_DEFAULT, CheckContext, Checker, History, HistoryWriter, Verdict};
use serde::Serialize;
use std::path::Path;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The standard suite: (ops, info fraction, violation).
pub const SUITE: [(u64, f64, Inject); 8] = [
    (100_000, 0.0, Inject::None),
    (1_000_000, 0.002, Inject::None),
    (100_000, 0.0, Inject::StaleRead),
    (100_000, 0.002, Inject::NeverWritten),
    (100_000, 0.002, Inject::WrittenLater),
    (100_000, 0.002, Inject::ImpossibleCas),
    (1_000_000, 0.002, Inject::StaleRead),
    (1_000_000, 0.002, Inject::NeverWritten),
];

#[derive(Serialize)]
struct Row {
    ops: u64,
    info: f64,
    inject: &'static str,
    seed: u64,
    expected: Verdict,
    verdict: Verdict,
    generate_s: f64,
    pair_s: f64,
    /// The check without an explanation.
    check_s: f64,
    /// The explanation alone (the checker times it).
    explain_s: f64,
    core: Option<usize>,
    minimal: Option<bool>,
    proof: Option<String>,
    /// The explained core holds the injected op.
    core_has_injected: Option<bool>,
    parts: usize,
    peak_rss_mib: Option<f64>,
}

pub fn long(args: &BenchCheckerArgs) -> Result<i32, Failure> {
    if args.model != ModelKind::CasRegister {
        return Err(Failure::new(
            "--long generates cas-register histories: drop --model or use cas-register",
        ));
    }
    let single = args.ops.is_some() || args.inject.is_some() || args.info.is_some();
    let cases: Vec<(u64, f64, Inject)> = if single {
        vec![(
            args.ops.unwrap_or(100_000),
            args.info.unwrap_or(0.0),
            args.inject.unwrap_or(Inject::None),
        )]
    } else {
        SUITE.to_vec()
    };
    if let Some(dir) = &args.write {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::new(format!("{}: cannot create the folder: {e}", dir.display())))?;
    }
    if !args.json {
        out!(
            "{:>9} {:>6} {:<15} {:<8} {:<8} {:>8} {:>8} {:>9} {:>10} {:>5} {:<8} {:<18} {:>7} {:>8}",
            "ops",
            "info",
            "violation",
            "verdict",
            "expected",
            "gen s",
            "pair s",
            "check s",
            "explain s",
            "core",
            "minimal",
            "proof",
            "parts",
            "peak MiB"
        );
    }
    let mut rows = Vec::new();
    let mut mismatch = false;
    for (ops, info, inject) in cases {
        let row = one(args, ops, info, inject)?;
        mismatch |= row.verdict != row.expected || row.core_has_injected == Some(false);
        if !args.json {
            out!(
                "{:>9} {:>6.4} {:<15} {:<8} {:<8} {:>8.3} {:>8.3} {:>9.3} {:>10.3} {:>5} {:<8} {:<18} {:>7} {:>8}",
                row.ops,
                row.info,
                row.inject,
                row.verdict.as_str(),
                row.expected.as_str(),
                row.generate_s,
                row.pair_s,
                row.check_s,
                row.explain_s,
                row.core.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                row.minimal.map(|m| m.to_string()).unwrap_or_else(|| "-".into()),
                row.proof.clone().unwrap_or_else(|| "-".into()),
                row.parts,
                row.peak_rss_mib
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(|| "-".into()),
            );
        }
        rows.push(row);
    }
    if args.json {
        out!("{}", serde_json::to_string_pretty(&rows).expect("rows serialize"));
    } else {
        out!(
            "\n10 keys, 20 processes, seed {}, {} thread(s); check s: the verdict alone; explain s: the explanation, timed by the checker; peak MiB: the process's so far",
            args.seed,
            args.jobs
        );
        if mismatch {
            out!("MISMATCH: a verdict differs from the known one, or a core misses the injected op");
        }
    }
    Ok(if mismatch { 1 } else { 0 })
}

fn one(args: &BenchCheckerArgs, ops: u64, info: f64, inject: Inject) -> Result<Row, Failure> {
    let spec = Spec {
        ops: ops as usize,
        keys: 10,
        processes: 20,
        info,
        inject,
        at: 0.75,
        seed: args.seed,
    };
    let started = Instant::now();
    let g = synth::generate(&spec);
    let generate_s = started.elapsed().as_secs_f64();
    if inject != Inject::None && g.injected.is_none() {
        return Err(Failure::new(format!(
            "the generator found no place for a {} in {ops} ops (seed {}): try another seed",
            inject.name(),
            args.seed
        )));
    }
    let name = format!("long-{ops}-{}-info{info}-seed{}.jsonl", inject.name(), args.seed);
    let path = args.write.as_ref().map(|d| d.join(&name));
    if let Some(path) = &path {
        write(path, &g.ops)?;
    }
    let started = Instant::now();
    let n = g.ops.len() as u64;
    let history = History::from_ops(Path::new(&name), g.ops, (1..=n).collect())
        .map_err(|e| Failure::new(format!("generated history does not pair: {e}")))?;
    let pair_s = started.elapsed().as_secs_f64();

    let budget = Some(Duration::from_secs_f64(args.budget_s));
    let ctx = || CheckContext::new(budget, MEM_BYTES_DEFAULT).with_jobs(args.jobs as usize);
    let plain = Linearizable::new(ModelKind::CasRegister, false, serde_json::Value::Null);
    let started = Instant::now();
    let r = plain.check(&history, &ctx()).map_err(|e| Failure::new(e.to_string()))?;
    let check_s = started.elapsed().as_secs_f64();
    let verdict = r.verdict;
    let parts = serde_json::from_value::<LinearReport>(r.details)
        .map(|d| d.parts)
        .unwrap_or(0);

    let (mut explain_s, mut core, mut minimal, mut proof, mut core_has_injected) = (0.0, None, None, None, None);
    if verdict == Verdict::Invalid {
        let explaining = Linearizable::new(ModelKind::CasRegister, true, serde_json::Value::Null);
        let r = explaining
            .check(&history, &ctx())
            .map_err(|e| Failure::new(e.to_string()))?;
        if let Ok(report) = serde_json::from_value::<LinearReport>(r.details) {
            explain_s = report.explain_ms / 1e3;
            if let Some(v) = report.violations.first() {
                core = Some(v.core.len());
                minimal = Some(v.minimal);
                proof = v.proof.clone();
                core_has_injected = g.injected.map(|at| v.core.iter().any(|o| o.complete_index == Some(at)));
            }
        }
    }
    Ok(Row {
        ops,
        info,
        inject: inject.name(),
        seed: args.seed,
        expected: if inject == Inject::None {
            Verdict::Valid
        } else {
            Verdict::Invalid
        },
        verdict,
        generate_s,
        pair_s,
        check_s,
        explain_s,
        core,
        minimal,
        proof,
        core_has_injected,
        parts,
        peak_rss_mib: peak_rss_mib(),
    })
}

fn write(path: &Path, ops: &[drift_checkers::Op]) -> Result<(), Failure> {
    let fail = |e: std::io::Error| Failure::new(format!("{}: cannot write the history: {e}", path.display()));
    let mut w = HistoryWriter::create(path).map_err(fail)?;
    for op in ops {
        w.append_buffered(op).map_err(fail)?;
    }
    w.flush().map_err(fail)
}

/// The process's peak resident memory so far (Linux), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Most timed runs per file.
pub const RUNS_MAX: u32 = 1000;

/// `drift bench checker`.
#[derive(Args, Debug)]
pub struct BenchCheckerArgs {
    /// Folder of histories, *.jsonl and *.edn (needed unless --long or
    /// --dedup-attempts); an `EXPECTED.tsv` in it gives each file's
    /// expected verdict and a peer checker's time.
    pub dir: Option<PathBuf>,
    /// Model to check against.
    #[arg(long, value_enum, default_value_t = ModelKind::CasRegister)]
    pub model: ModelKind,
    /// What every key holds first, as JSON (default null; see `drift check -h`).
    #[arg(long, value_parser = parse_json)]
    pub init: Option<serde_json::Value>,
    /// Timed runs per file; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=RUNS_MAX as i64))]
    pub runs: u32,
    /// Per-file time budget in seconds.
    #[arg(long = "budget-s", default_value_t = 60.0, value_parser = parse_budget_s)]
    pub budget_s: f64,
    /// Also time the explanation of violations.
    #[arg(long)]
    pub explain: bool,
    /// Time the dedup checker instead, on a generated insert-retry history
    /// of this many attempts (a correct table's: the check does all its work).
    #[arg(long = "dedup-attempts", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub dedup_attempts: Option<u64>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Time generated long histories instead of a folder's: 10 keys, 20
    /// processes, real linearization points, so each verdict is known.
    /// Without --ops/--inject/--info, the standard suite (BENCHMARKS.md).
    #[arg(long, conflicts_with_all = ["dir", "dedup_attempts"])]
    pub long: bool,
    /// With --long: operations in one generated history.
    #[arg(long, requires = "long", value_parser = clap::value_parser!(u64).range(1..=20_000_000))]
    pub ops: Option<u64>,
    /// With --long: the violation to inject.
    #[arg(long, requires = "long", value_enum)]
    pub inject: Option<drift_checkers::linear::synth::Inject>,
    /// With --long: fraction of ops that end `info` (e.g. 0.002).
    #[arg(long, requires = "long", value_parser = parse_fraction)]
    pub info: Option<f64>,
    /// With --long: the generator's seed.
    #[arg(long, requires = "long", default_value_t = 1)]
    pub seed: u64,
    /// With --long: also write each generated history here as JSON Lines
    /// (to run another checker on the same files).
    #[arg(long, requires = "long")]
    pub write: Option<PathBuf>,
    /// Threads the checker may use (keys in parallel).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub jobs: u64,
}
