//! `drift bench harness`: how fast the campaign machinery itself goes —
//! the generator choosing ops and the recorder writing the history —
//! against a client that answers instantly. Reported per wall second and
//! per CPU second (all threads), the "one core" figure.

use crate::cli::BenchHarnessArgs;
use crate::fail::Failure;
use crate::recorder::Recorder;
use drift_checkers::history::{OpType, Process};
use drift_workloads::{Rng, Workload};
use serde_json::json;
use std::time::Instant;

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // fields after the command name (which may contain spaces)
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based), 12 and 13 after ')'
    (ticks(11) + ticks(12)) / 100.0
}

pub fn harness(args: BenchHarnessArgs) -> Result<i32, Failure> {
    let workload = Workload::new(args.workload, 5);
    let dir = std::env::temp_dir().join(format!("drift-bench-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Failure::new(e.to_string()))?;
    let path = dir.join("history.jsonl");
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let (rec, handle) = Recorder::start(&path, started).map_err(|e| Failure::new(e.to_string()))?;
    let mut rng = Rng::new(args.seed);
    let mut unique = 0;
    for _ in 0..args.ops {
        let op = workload.next(&mut rng, 0, &mut unique);
        rec.record(
            Process::Client(0),
            OpType::Invoke,
            op.f,
            op.value.clone(),
            op.key.clone(),
            None,
            None,
        );
        // the no-op client: every op succeeds at once with its own value
        rec.record(Process::Client(0), OpType::Ok, op.f, op.value, op.key, None, None);
    }
    drop(rec);
    let lines = handle.finish().map_err(|e| Failure::new(e.to_string()))?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    let out = json!({
        "ops": args.ops, "history_lines": lines, "history_bytes": bytes,
        "wall_s": wall, "cpu_s": cpu,
        "ops_per_s": args.ops as f64 / wall,
        "ops_per_cpu_s": args.ops as f64 / cpu.max(1e-9),
    });
    if args.json {
        out!("{}", serde_json::to_string_pretty(&out).expect("json"));
    } else {
        out!(
            "generator + history recording, workload {}, no-op client, {} ops",
            workload.name(),
            args.ops
        );
        out!(
            "  {:.0} ops/s wall ({:.2} s), {:.0} ops per CPU second ({:.2} CPU s, all threads)",
            args.ops as f64 / wall,
            wall,
            args.ops as f64 / cpu.max(1e-9),
            cpu
        );
        out!("  history: {lines} lines, {:.1} MB", bytes as f64 / 1e6);
    }
    Ok(0)
}
