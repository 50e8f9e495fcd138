//! `drift bench repair`: what a repair session costs, for the reference
//! scenario (50,000 keys, 33 divergent; depths 4, 12, 16) and a large one
//! (10,000,000 keys, 1,000 divergent; depths 12, 20), with whole-range
//! streaming, with the row-level round and by set reconciliation (an
//! invertible Bloom lookup table sized from a sketch), beside a naive per-key
//! comparison (one 32-byte digest per key).

use crate::cli::BenchRepairArgs;
use crate::fail::Failure;
use drift_repair::session::{Report, SessionConfig, HASH_BYTES_DEFAULT};
use drift_repair::{run, Entry, Replica, TokenRange};
use serde_json::json;
use std::io::Write as _;
use std::time::Instant;

struct Scenario {
    keys: u64,
    divergent: u64,
    depths: &'static [u32],
}

const SCENARIOS: [Scenario; 2] = [
    Scenario {
        keys: 50_000,
        divergent: 33,
        depths: &[4, 12, 16],
    },
    Scenario {
        keys: 10_000_000,
        divergent: 1_000,
        depths: &[12, 20],
    },
];

pub fn repair(args: BenchRepairArgs) -> Result<i32, Failure> {
    let mut rows = Vec::new();
    if !args.json {
        out!(
            "{:<24} {:>5} {:<9} {:>9} {:>7} {:>6} {:>11} {:>11} {:>9} {:>10} {:>9} {:>8}",
            "scenario",
            "depth",
            "mode",
            "compared",
            "sent",
            "rounds",
            "bytes a→b",
            "bytes b→a",
            "recon B",
            "streamed",
            "tree MiB",
            "ms"
        );
    }
    for sc in SCENARIOS.iter().filter(|s| !args.small || s.keys <= 50_000) {
        let started = Instant::now();
        let base = build(sc.keys);
        let build_s = started.elapsed().as_secs_f64();
        for &depth in sc.depths {
            let a = base.with_depth(depth);
            let mut b = a.clone();
            let mut a = a;
            diverge(&mut a, &mut b, sc.keys, sc.divergent);
            for mode in ["set", "row-level", "ranges"] {
                let row_level = mode != "ranges";
                let (mut x, mut y) = if mode != "ranges" {
                    (a.clone(), b.clone())
                } else {
                    (
                        std::mem::replace(&mut a, Replica::new(TokenRange::FULL, 0)),
                        std::mem::replace(&mut b, Replica::new(TokenRange::FULL, 0)),
                    )
                };
                let cfg = SessionConfig {
                    seed: 0x5eed ^ depth as u64,
                    row_level,
                    started_ts: 10,
                    hash_bytes: HASH_BYTES_DEFAULT,
                    set_reconciliation: mode == "set",
                };
                let t = Instant::now();
                let r = run(&mut x, 1, &mut y, 2, cfg).map_err(|e| Failure::new(e.to_string()))?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if x.tree().root() != y.tree().root() {
                    return Err(Failure::new(format!(
                        "{} keys depth {depth}: replicas differ after repair",
                        sc.keys
                    )));
                }
                let label = format!("{} keys, {} divergent", human(sc.keys), sc.divergent);
                let tree_mib = x.tree().memory_bytes() as f64 / (1 << 20) as f64;
                if !args.json {
                    print_row(&label, depth, mode, &r, tree_mib, ms);
                }
                rows.push(row_json(sc, depth, mode, &r, tree_mib, ms));
            }
        }
        if !args.json {
            out!(
                "{:<24} naive per-key compare: {} hashes, {} bytes one way (built in {build_s:.1} s)",
                format!("{} keys", human(sc.keys)),
                sc.keys,
                sc.keys * 32
            );
            let _ = std::io::stdout().flush();
        }
    }
    if args.json {
        out!(
            "{}",
            serde_json::to_string_pretty(&json!({ "rows": rows })).expect("json")
        );
    }
    Ok(0)
}

/// `n` keys at ts 1 on one replica (the other is a clone).
fn build(n: u64) -> Replica {
    let mut r = Replica::new(TokenRange::FULL, 0);
    for i in 0..n {
        r.merge(Entry::put(
            format!("key{i}").as_bytes(),
            1,
            format!("value{i}").as_bytes(),
        ));
    }
    r
}

/// `count` distinct keys get a newer write on one side or the other.
fn diverge(a: &mut Replica, b: &mut Replica, n: u64, count: u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut chosen = std::collections::BTreeSet::new();
    while (chosen.len() as u64) < count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chosen.insert(x % n);
    }
    for (j, i) in chosen.into_iter().enumerate() {
        let e = Entry::put(format!("key{i}").as_bytes(), 2, b"newer");
        if j % 2 == 0 {
            a.merge(e);
        } else {
            b.merge(e);
        }
    }
}

fn human(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{}M", n / 1_000_000)
    } else {
        format!("{}k", n / 1_000)
    }
}

fn print_row(label: &str, depth: u32, mode: &str, r: &Report, tree_mib: f64, ms: f64) {
    out!(
        "{:<24} {:>5} {:<9} {:>9} {:>7} {:>6} {:>11} {:>11} {:>9} {:>10} {:>9.1} {:>8.0}",
        label,
        depth,
        mode_name(mode, r),
        r.hashes_compared,
        r.hashes_sent,
        r.rounds,
        r.bytes_a_to_b,
        r.bytes_b_to_a,
        r.reconciliation_bytes(),
        r.entries_streamed(),
        tree_mib,
        ms
    );
}

/// The mode a session ran in: set reconciliation says when it fell back
/// to the walk.
fn mode_name(mode: &str, r: &Report) -> String {
    match mode {
        "set" if r.set_fallback => "set→walk".to_string(),
        "set" if r.set_cells == 0 => "set:walk".to_string(),
        m => m.to_string(),
    }
}

fn row_json(sc: &Scenario, depth: u32, mode: &str, r: &Report, tree_mib: f64, ms: f64) -> serde_json::Value {
    json!({
        "keys": sc.keys, "divergent": sc.divergent, "depth": depth,
        "mode": mode_name(mode, r), "set_cells": r.set_cells,
        "hashes_compared": r.hashes_compared, "hashes_sent": r.hashes_sent,
        "virtual_compared": r.virtual_compared, "fingerprints_sent": r.fingerprints_sent,
        "versions_sent": r.versions_sent, "rounds": r.rounds,
        "bytes_a_to_b": r.bytes_a_to_b, "bytes_b_to_a": r.bytes_b_to_a,
        "reconciliation_bytes": r.reconciliation_bytes(), "stream_bytes": r.stream_bytes,
        "entries_streamed": r.entries_streamed(), "ranges": r.ranges.len(),
        "tree_mib": tree_mib, "session_ms": ms,
        "naive_hashes": sc.keys, "naive_bytes": sc.keys * 32,
    })
}
