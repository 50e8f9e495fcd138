//! `drift bench checker`: times the linearizability checker on every
//! history of a folder (JSON Lines or Jepsen EDN), one thread, median of
//! `--runs`; reading and pairing each file is timed apart from the check,
//! so the two formats' parse costs can be compared.
//! Where the folder has an `EXPECTED.tsv` (file, expected verdict, …,
//! `porcupine_us`), verdicts are compared with it (a mismatch exits 1) and
//! times are put beside the peer's.

use crate::cli::BenchCheckerArgs;
use crate::fail::Failure;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::Linearizable;
use drift_checkers::{checker::MEM_BYTES_DEFAULT, CheckContext, Checker, History, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most timed runs per file.
const RUNS_MAX: u32 = 1000;
const DEFAULT_DIR: &str = "../shared/data/histories/etcd";

#[derive(Serialize)]
struct FileRow {
    file: String,
    ops: usize,
    verdict: Verdict,
    expected: Option<Verdict>,
    median_us: f64,
    min_us: f64,
    max_us: f64,
    peer_us: Option<f64>,
    /// `jsonl` or `edn`.
    format: &'static str,
    /// Median time to read and pair the file.
    parse_us: f64,
}

#[derive(Serialize)]
struct Summary {
    dir: String,
    model: String,
    runs: u32,
    files: usize,
    total_ms: f64,
    slowest_file: String,
    slowest_us: f64,
    mismatches: Vec<String>,
    peer_total_ms: Option<f64>,
    ratio_to_peer: Option<f64>,
    /// Sum of per-file median parse times, by format.
    parse_ms: BTreeMap<&'static str, f64>,
    rows: Vec<FileRow>,
}

pub fn checker(args: BenchCheckerArgs) -> Result<i32, Failure> {
    let model = args.model;
    if args.runs == 0 || args.runs > RUNS_MAX {
        return Err(Failure::new(format!("--runs must be in 1..={RUNS_MAX}")));
    }
    if !(args.budget_s.is_finite() && args.budget_s > 0.0) {
        return Err(Failure::new("--budget-s must be a positive number of seconds"));
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    let files = list_histories(&dir)?;
    let expected = read_expected(&dir)?;
    let checker = Linearizable {
        model,
        explain: args.explain,
        init: args.init.clone().unwrap_or(serde_json::Value::Null),
    };

    let mut rows = Vec::with_capacity(files.len());
    for path in &files {
        let mut parse = Vec::with_capacity(args.runs as usize);
        let mut loaded = None;
        for _ in 0..args.runs {
            let started = Instant::now();
            let h = History::load(path).map_err(|e| Failure::new(e.to_string()))?;
            parse.push(started.elapsed().as_secs_f64() * 1e6);
            loaded = Some(h);
        }
        let history = loaded.expect("at least one run");
        parse.sort_by(f64::total_cmp);
        let mut times = Vec::with_capacity(args.runs as usize);
        let mut verdict = Verdict::Valid;
        for _ in 0..args.runs {
            let ctx = CheckContext::new(Some(Duration::from_secs_f64(args.budget_s)), MEM_BYTES_DEFAULT);
            let started = Instant::now();
            let r = checker.check(&history, &ctx).map_err(|e| Failure::new(e.to_string()))?;
            times.push(started.elapsed().as_secs_f64() * 1e6);
            verdict = r.verdict;
        }
        times.sort_by(f64::total_cmp);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
        let is_edn = path.extension().is_some_and(|x| x == "edn");
        // an EDN rendering is expected to judge as its JSON Lines original
        let stem = path.file_stem().and_then(|n| n.to_str()).unwrap_or("?");
        let exp = expected.get(&name).or_else(|| expected.get(&format!("{stem}.jsonl")));
        rows.push(FileRow {
            ops: history.ops.len(),
            verdict,
            expected: exp.map(|e| e.0),
            median_us: times[times.len() / 2],
            min_us: times[0],
            max_us: times[times.len() - 1],
            peer_us: exp.and_then(|e| e.1),
            format: if is_edn { "edn" } else { "jsonl" },
            parse_us: parse[parse.len() / 2],
            file: name,
        });
    }
    let summary = summarize(&dir, model, args.runs, rows);
    if args.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&summary).expect("summary serializes")
        );
    } else {
        print_table(&summary);
    }
    Ok(if summary.mismatches.is_empty() { 0 } else { 1 })
}

fn list_histories(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Failure::new(format!("{}: cannot read the folder of histories: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl" || x == "edn"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Failure::new(format!(
            "{}: no *.jsonl or *.edn histories",
            dir.display()
        )));
    }
    Ok(files)
}

/// `EXPECTED.tsv`: file → (verdict, peer µs). Absent file: empty map.
fn read_expected(dir: &Path) -> Result<BTreeMap<String, (Verdict, Option<f64>)>, Failure> {
    let path = dir.join("EXPECTED.tsv");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(BTreeMap::new());
    };
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = match lines.next() {
        Some((_, h)) => h.split('\t').collect(),
        None => return Ok(BTreeMap::new()),
    };
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(file_col), Some(exp_col)) = (col("file"), col("expected")) else {
        return Err(Failure::new(format!(
            "{}:1: needs columns `file` and `expected`",
            path.display()
        )));
    };
    let peer_col = col("porcupine_us");
    let mut out = BTreeMap::new();
    for (n, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split('\t').collect();
        let at = || format!("{}:{}", path.display(), n + 1);
        let verdict = match cells.get(exp_col).copied() {
            Some("linearizable") => Verdict::Valid,
            Some("not-linearizable") => Verdict::Invalid,
            other => return Err(Failure::new(format!("{}: unknown expected verdict {other:?}", at()))),
        };
        let file = cells
            .get(file_col)
            .ok_or_else(|| Failure::new(format!("{}: no file column", at())))?;
        let peer = peer_col.and_then(|c| cells.get(c)).and_then(|v| v.parse::<f64>().ok());
        out.insert(file.to_string(), (verdict, peer));
    }
    Ok(out)
}

fn summarize(dir: &Path, model: ModelKind, runs: u32, rows: Vec<FileRow>) -> Summary {
    let total_us: f64 = rows.iter().map(|r| r.median_us).sum();
    let slowest = rows.iter().max_by(|a, b| a.median_us.total_cmp(&b.median_us));
    let mismatches = rows
        .iter()
        .filter(|r| r.expected.is_some_and(|e| e != r.verdict))
        .map(|r| r.file.clone())
        .collect();
    let peer_total_us: Option<f64> = rows.iter().map(|r| r.peer_us).sum();
    let mut parse_ms = BTreeMap::new();
    for r in &rows {
        *parse_ms.entry(r.format).or_insert(0.0) += r.parse_us / 1e3;
    }
    Summary {
        dir: dir.display().to_string(),
        model: model.name().into(),
        runs,
        files: rows.len(),
        total_ms: total_us / 1e3,
        slowest_file: slowest.map(|r| r.file.clone()).unwrap_or_default(),
        slowest_us: slowest.map(|r| r.median_us).unwrap_or(0.0),
        mismatches,
        peer_total_ms: peer_total_us.map(|p| p / 1e3),
        ratio_to_peer: peer_total_us.map(|p| p / total_us.max(1e-9)),
        parse_ms,
        rows,
    }
}

fn print_table(s: &Summary) {
    out!(
        "{:<18} {:>5}  {:<8} {:<8} {:>11} {:>11} {:>12} {:>9} {:>10}",
        "file",
        "ops",
        "verdict",
        "expected",
        "median µs",
        "max µs",
        "porcupine µs",
        "× faster",
        "parse µs"
    );
    for r in &s.rows {
        let ratio = r
            .peer_us
            .map(|p| format!("{:.1}", p / r.median_us.max(1e-9)))
            .unwrap_or_default();
        out!(
            "{:<18} {:>5}  {:<8} {:<8} {:>11.1} {:>11.1} {:>12} {:>9} {:>10.1}",
            r.file,
            r.ops,
            r.verdict.as_str(),
            r.expected.map(|e| e.as_str()).unwrap_or("-"),
            r.median_us,
            r.max_us,
            r.peer_us.map(|p| format!("{p:.1}")).unwrap_or_default(),
            ratio,
            r.parse_us
        );
    }
    out!(
        "\n{} files, model {}, median of {} runs, one thread, parsing timed apart",
        s.files,
        s.model,
        s.runs
    );
    out!("total    {:.3} ms (sum of per-file medians)", s.total_ms);
    out!("slowest  {} {:.1} µs", s.slowest_file, s.slowest_us);
    for (format, ms) in &s.parse_ms {
        out!("parse    {format}: {ms:.3} ms (sum of per-file medians: read and pair)");
    }
    if let (Some(p), Some(r)) = (s.peer_total_ms, s.ratio_to_peer) {
        out!("peer     porcupine {p:.1} ms total → drift is {r:.1}× faster");
    }
    let compared = s.rows.iter().filter(|r| r.expected.is_some()).count();
    if compared == 0 {
        out!("verdicts not compared: no EXPECTED.tsv entry for these files");
    } else if s.mismatches.is_empty() {
        out!(
            "verdicts all as expected ({compared} of {} files have an expectation)",
            s.files
        );
    } else {
        out!("MISMATCHED verdicts: {}", s.mismatches.join(", "));
    }
}
