//! `drift bench table`: inserts into the replicated table of a local
//! 3-replica cluster, driven over HTTP by 1, 16 and 64 concurrent clients
//! (spread over the replicas), in one sitting for each setup:
//!
//! * `keeper` — the keeper coordinates, two round trips per insert;
//! * `naive` — the same, with the naive path (an existence check, the
//!   lock, the commit: three round trips);
//! * `zookeeper` — Apache ZooKeeper coordinates, two round trips.
//!
//! All setups' clusters run through the sitting and the cells interleave
//! (per client count, each round visits every setup), with merges off;
//! each cell reports the round with the median inserts/s.
//!
//! Every insert carries `--rows` fresh rows (one block: the bench table has
//! one partition), so none is a duplicate. Round trips per insert are read
//! from the replicas' own counters (`InsertKeeperRoundTrips` over
//! `InsertedBlocks`), not assumed.

use crate::cli::{BenchTableArgs, TableSetup};
use crate::cluster::{start_cluster, stop_cluster, LocalTable, UpSpec};
use crate::fail::Failure;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TABLE: &str = "name = \"bench\"\ncolumns = \"id UInt64, key String, value Int64\"\npartition_by = \"tuple()\"\norder_by = \"id\"\n";
/// Untimed inserts before each setup's first cell (sessions, first parts).
const WARMUP: Duration = Duration::from_secs(1);

#[derive(Serialize, Clone)]
struct Cell {
    setup: &'static str,
    clients: u64,
    inserts: u64,
    errors: u64,
    seconds: f64,
    inserts_per_s: f64,
    rows_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    round_trips_per_insert: f64,
    /// Coordinator time per insert (its round trips), as the replicas
    /// measured it.
    keeper_ms_per_insert: f64,
}

fn name(s: TableSetup) -> &'static str {
    match s {
        TableSetup::Keeper => "keeper",
        TableSetup::Naive => "naive",
        TableSetup::Zookeeper => "zookeeper",
    }
}

/// Ends the cluster when dropped, error or not.
struct Running {
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = stop_cluster(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn table(args: BenchTableArgs) -> Result<i32, Failure> {
    if args.setups.contains(&TableSetup::Zookeeper) && !crate::local::zookeeper_installed() {
        return Err(Failure::new(
            "the zookeeper setup needs Apache ZooKeeper (apt install zookeeper), or --setups keeper,naive",
        ));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("a runtime: {e}")))?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| Failure::new(format!("an HTTP client: {e}")))?;
    if !args.json {
        out!(
            "3 replicas on 3 coordinator nodes, {} rows per insert, {} s per cell, clients spread over the replicas",
            args.rows,
            args.seconds
        );
        out!(
            "median of {} interleaved rounds per cell (the spread of inserts/s in brackets)",
            args.rounds
        );
        out!(
            "{:<10} {:>7} {:>10} {:>11} {:>8} {:>8} {:>9} {:>10} {:>7}",
            "setup",
            "clients",
            "inserts/s",
            "rows/s",
            "p50 ms",
            "p99 ms",
            "RT/insert",
            "keeper ms",
            "errors"
        );
    }
    // every setup's cluster runs for the whole sitting; cells interleave
    // (each client count: every setup in turn, each round), so drift in the
    // machine's state spreads evenly over the setups
    let mut clusters = Vec::new();
    for setup in &args.setups {
        let dir = std::env::temp_dir().join(format!("drift-bench-table-{}-{}", std::process::id(), name(*setup)));
        let _ = std::fs::remove_dir_all(&dir);
        // merges off: the cells measure inserts and their replication, not
        // a merge backlog that grows with the table
        let mut declaration = format!("{TABLE}[table.settings]\nparts_to_merge_min = 1000000000\n");
        if *setup == TableSetup::Naive {
            declaration.push_str("naive_insert_path = true\n");
        }
        let table = LocalTable {
            replicas: 3,
            http_port: 8123,
            interserver_port: 9009,
            declaration,
        };
        let config = start_cluster(&UpSpec {
            nodes: 3,
            dir: &dir,
            port: args.port,
            block: None,
            quorum_reads: false,
            fault_hooks: false,
            set: &[],
            table: Some(&table),
            kv: None,
            zookeeper: *setup == TableSetup::Zookeeper,
            clickhouse: None,
        });
        let running = Running { dir: dir.clone() };
        let config = config?;
        let urls = config.table_urls();
        let next_id = Arc::new(AtomicU64::new(0));
        rt.block_on(drive(&http, &urls, 4, WARMUP, args.rows as usize, &next_id));
        clusters.push((*setup, urls, next_id, running));
    }
    let mut samples: Vec<Cell> = Vec::new();
    for &clients in &args.clients {
        for _ in 0..args.rounds {
            for (setup, urls, next_id, _) in &clusters {
                let before = rt.block_on(counters(&http, urls))?;
                let (n, errors, hist, secs) = rt.block_on(drive(
                    &http,
                    urls,
                    clients as usize,
                    Duration::from_secs_f64(args.seconds),
                    args.rows as usize,
                    next_id,
                ));
                let after = rt.block_on(counters(&http, urls))?;
                let blocks = after.1.saturating_sub(before.1);
                samples.push(Cell {
                    setup: name(*setup),
                    clients,
                    inserts: n,
                    errors,
                    seconds: secs,
                    inserts_per_s: n as f64 / secs,
                    rows_per_s: (n * args.rows) as f64 / secs,
                    p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
                    p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
                    round_trips_per_insert: after.0.saturating_sub(before.0) as f64 / blocks.max(1) as f64,
                    keeper_ms_per_insert: after.2.saturating_sub(before.2) as f64 / 1000.0 / blocks.max(1) as f64,
                });
            }
        }
    }
    drop(clusters);
    // per (setup, clients): the round with the median inserts/s
    let mut cells = Vec::new();
    for setup in &args.setups {
        for &clients in &args.clients {
            let mut runs: Vec<&Cell> = samples
                .iter()
                .filter(|c| c.setup == name(*setup) && c.clients == clients)
                .collect();
            runs.sort_by(|a, b| a.inserts_per_s.total_cmp(&b.inserts_per_s));
            let spread = (
                runs.first().map(|c| c.inserts_per_s),
                runs.last().map(|c| c.inserts_per_s),
            );
            let cell = runs[runs.len() / 2].clone();
            if !args.json {
                out!(
                    "{:<10} {:>7} {:>10.0} {:>11.0} {:>8.2} {:>8.2} {:>9.3} {:>10.2} {:>7}   ({:.0}–{:.0})",
                    cell.setup,
                    cell.clients,
                    cell.inserts_per_s,
                    cell.rows_per_s,
                    cell.p50_ms,
                    cell.p99_ms,
                    cell.round_trips_per_insert,
                    cell.keeper_ms_per_insert,
                    cell.errors,
                    spread.0.unwrap_or(0.0),
                    spread.1.unwrap_or(0.0)
                );
            }
            cells.push(cell);
        }
    }
    let ratio = |a: &str, b: &str, c: u64| {
        let f = |s: &str| {
            cells
                .iter()
                .find(|x| x.setup == s && x.clients == c)
                .map(|x| x.inserts_per_s)
        };
        Some(f(a)? / f(b)?.max(1e-9))
    };
    let mut ratios = Vec::new();
    for &c in &args.clients {
        ratios.push(serde_json::json!({
            "clients": c,
            "keeper_over_naive": ratio("keeper", "naive", c),
            "keeper_over_zookeeper": ratio("keeper", "zookeeper", c),
        }));
        if !args.json {
            let show = |r: Option<f64>| r.map(|v| format!("{v:.2}×")).unwrap_or_else(|| "-".into());
            out!(
                "{c:>3} clients: keeper/naive {}   keeper/zookeeper {}",
                show(ratio("keeper", "naive", c)),
                show(ratio("keeper", "zookeeper", c))
            );
        }
    }
    if args.json {
        out!(
            "{}",
            serde_json::json!({"rows_per_insert": args.rows, "seconds": args.seconds, "cells": cells, "ratios": ratios})
        );
    }
    let failed = samples.iter().any(|c| c.inserts == 0);
    Ok(if failed { 3 } else { 0 })
}

/// Sums of `InsertKeeperRoundTrips`, `InsertedBlocks` and
/// `InsertKeeperMicros` over the replicas.
async fn counters(http: &reqwest::Client, urls: &[String]) -> Result<(u64, u64, u64), Failure> {
    let mut rt = 0;
    let mut blocks = 0;
    let mut micros = 0;
    for u in urls {
        let body = http
            .post(u)
            .body("SELECT event, value FROM system.events WHERE event IN ('InsertKeeperRoundTrips', 'InsertedBlocks', 'InsertKeeperMicros')")
            .send()
            .await
            .map_err(|e| Failure::new(format!("{u}: {e}")))?
            .text()
            .await
            .map_err(|e| Failure::new(format!("{u}: {e}")))?;
        for line in body.lines() {
            let mut w = line.split('\t');
            match (w.next(), w.next().and_then(|v| v.parse::<u64>().ok())) {
                (Some("InsertKeeperRoundTrips"), Some(v)) => rt += v,
                (Some("InsertedBlocks"), Some(v)) => blocks += v,
                (Some("InsertKeeperMicros"), Some(v)) => micros += v,
                _ => {}
            }
        }
    }
    Ok((rt, blocks, micros))
}

/// `clients` tasks insert for `d`: (inserts, errors, latency µs, seconds).
async fn drive(
    http: &reqwest::Client,
    urls: &[String],
    clients: usize,
    d: Duration,
    rows: usize,
    next_id: &Arc<AtomicU64>,
) -> (u64, u64, hdrhistogram::Histogram<u64>, f64) {
    let hist = Arc::new(Mutex::new(
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("valid bounds"),
    ));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + d;
    let mut tasks = Vec::new();
    for k in 0..clients {
        let (http, hist, done, errors, next_id) = (
            http.clone(),
            hist.clone(),
            done.clone(),
            errors.clone(),
            next_id.clone(),
        );
        let url = format!(
            "{}?query=INSERT%20INTO%20bench%20FORMAT%20JSONEachRow",
            urls[k % urls.len()]
        );
        tasks.push(tokio::spawn(async move {
            let mut local = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("valid bounds");
            while Instant::now() < deadline {
                let first = next_id.fetch_add(rows as u64, Ordering::Relaxed);
                let mut body = String::with_capacity(rows * 48);
                for id in first..first + rows as u64 {
                    body.push_str(&format!(
                        "{{\"id\":{id},\"key\":\"k{}\",\"value\":{}}}\n",
                        id % 97,
                        id as i64 - 7
                    ));
                }
                let t = Instant::now();
                let ok = match http.post(&url).body(body).send().await {
                    Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if ok {
                    let _ = local.record((t.elapsed().as_micros() as u64).max(1));
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = hist.lock().map(|mut h| h.add(&local));
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let h = hist
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|_| hdrhistogram::Histogram::new(3).expect("valid"));
    (done.load(Ordering::Relaxed), errors.load(Ordering::Relaxed), h, secs)
}
