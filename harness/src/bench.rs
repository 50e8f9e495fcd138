//! `drift bench checker`: times the linearizability checker on every
//! history of a folder (JSON Lines or Jepsen EDN), one thread, median of
//! `--runs`; reading and pairing each file is timed apart from the check,
//! so the two formats' parse costs can be compared.
//! Where the folder has an `EXPECTED.tsv` (file, expected verdict, …,
//! `porcupine_us`), verdicts are compared with it (a mismatch exits 1) and
//! times are put beside the peer's.

use crate::bench_linear::BenchCheckerArgs;
use crate::fail::Failure;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::Linearizable;
use drift_checkers::{checker::MEM_BYTES_DEFAULT, CheckContext, Checker, History, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    if let Some(n) = args.dedup_attempts {
        return dedup(n, args.runs, args.json);
    }
    if args.long {
        return crate::bench_linear::long(&args);
    }
    let Some(dir) = args.dir.clone() else {
        return Err(Failure::new(
            "bench checker: name a folder of histories (*.jsonl, *.edn), or use --long or --dedup-attempts",
        ));
    };
    let files = list_histories(&dir)?;
    let expected = read_expected(&dir)?;
    let checker = Linearizable {
        model,
        explain: args.explain,
        init: args.init.clone().unwrap_or(serde_json::Value::Null),
        tuning: Default::default(),
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
            let ctx = CheckContext::new(Some(Duration::from_secs_f64(args.budget_s)), MEM_BYTES_DEFAULT)
                .with_jobs(args.jobs as usize);
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

/// Writes an insert-retry history of `attempts` attempts as a correct
/// 3-replica table would leave it: 16 clients, two-row inserts over 50
/// partitions, a fifth answered `info` and retried (deduplicated), one in
/// twenty failed, a tenth with a token; every replica read at the end.
fn write_dedup_history(path: &std::path::Path, attempts: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut index = 0u64;
    let mut line = |w: &mut std::io::BufWriter<std::fs::File>, v: serde_json::Value| -> std::io::Result<()> {
        let mut v = v;
        v["index"] = serde_json::json!(index);
        index += 1;
        writeln!(w, "{v}")
    };
    line(
        &mut w,
        serde_json::json!({"time": 0, "process": "nemesis", "type": "info", "f": "dedup-window",
            "value": {"window": 1000, "window_seconds": 600, "epsilon_ms": 1000, "replicas": ["r1", "r2", "r3"]}}),
    )?;
    let mut rng = drift_workloads::Rng::new(7);
    let mut rows = Vec::new();
    let (mut made, mut logical, mut t) = (0u64, 0u64, 1_000_000i64);
    while made < attempts {
        let id = logical * 2;
        let partition = (logical % 50).to_string();
        let row = |i: u64| serde_json::json!([i, format!("l{logical}"), 1]);
        let token = (rng.below(10) == 0).then(|| format!("t{logical}"));
        let blocks = serde_json::json!([{"partition": partition, "rows": [row(id), row(id + 1)]}]);
        let mut n = 1;
        loop {
            let p = made % 16;
            let (t0, t1) = (t, t + 2_000_000 + rng.below(3_000_000) as i64);
            made += 1;
            t += 400_000;
            let inv = serde_json::json!({"time": t0, "process": p + 16 * made, "type": "invoke", "f": "insert",
                "value": {"insert": logical, "attempt": n, "replica": format!("r{}", 1 + made % 3), "token": token, "blocks": blocks}});
            line(&mut w, inv)?;
            let roll = rng.below(20);
            let (kind, value) = match roll {
                0 => ("fail", serde_json::json!({"code": 285})),
                1..=4 if made < attempts => ("info", serde_json::json!({"code": 319})),
                _ => (
                    "ok",
                    serde_json::json!({"written_blocks": u64::from(n == 1), "deduplicated_blocks": u64::from(n > 1)}),
                ),
            };
            line(
                &mut w,
                serde_json::json!({"time": t1, "process": p + 16 * made, "type": kind, "f": "insert", "value": value}),
            )?;
            if kind == "ok" || n > 1 {
                rows.push(row(id));
                rows.push(row(id + 1));
            }
            if kind != "info" {
                break;
            }
            n += 1;
        }
        logical += 1;
    }
    // histories are time-ordered: the reads come after every insert ended
    let end = t + 10_000_000;
    for (i, r) in ["r1", "r2", "r3"].iter().enumerate() {
        let p = 10_000_000 + i as u64;
        line(
            &mut w,
            serde_json::json!({"time": end, "process": p, "type": "invoke", "f": "read", "key": r, "value": null}),
        )?;
        line(
            &mut w,
            serde_json::json!({"time": end + 1, "process": p, "type": "ok", "f": "read", "key": r, "value": rows}),
        )?;
    }
    w.flush()
}

/// `drift bench checker --dedup-attempts N`.
fn dedup(attempts: u64, runs: u32, json: bool) -> Result<i32, Failure> {
    let path = std::env::temp_dir().join(format!("drift-bench-dedup-{}.jsonl", std::process::id()));
    write_dedup_history(&path, attempts).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
    let mut parse = Vec::new();
    let mut check = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let h = History::load(&path).map_err(|e| Failure::new(e.to_string()))?;
        parse.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let r = drift_checkers::dedup::Dedup
            .check(&h, &CheckContext::new(None, usize::MAX))
            .map_err(|e| Failure::new(e.to_string()))?;
        check.push(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    let _ = std::fs::remove_file(&path);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, c) = (median(&mut parse), median(&mut check));
    let r = last.expect("runs >= 1");
    if json {
        out!(
            "{}",
            serde_json::json!({"attempts": attempts, "runs": runs, "parse_s": p, "check_s": c, "verdict": r.verdict.as_str(), "details": r.details})
        );
    } else {
        out!(
            "dedup checker, {attempts} attempts ({} keys), median of {runs} runs, one thread:\n  parse {:.3} s  check {:.3} s  verdict {}",
            r.details["keys"],
            p,
            c,
            r.verdict.as_str()
        );
    }
    Ok(if r.verdict == drift_checkers::Verdict::Valid {
        0
    } else {
        1
    })
}
