//! `drift bench table`: inserts into the replicated table of a local
//! 3-replica cluster, driven over HTTP by 1, 16 and 64 concurrent clients
//! (spread over the replicas), in one sitting for each setup:
//!
//! * `keeper` — the keeper coordinates, two round trips per insert;
//! * `naive` — the same, with the naive path (an existence check, the
//!   lock, the commit: three round trips);
//! * `zookeeper` — Apache ZooKeeper coordinates, two round trips;
//! * `clickhouse-keeper` — real ClickHouse servers (one per node, their
//!   ReplicatedMergeTree `bench`), drift's keeper nodes coordinating;
//! * `clickhouse-zookeeper` — the same ClickHouse on Apache ZooKeeper.
//!
//! `--target clickhouse` runs the last two and `keeper` (drift's own table
//! on its keeper) in one sitting. For each cell the coordinator's
//! processes are measured too: CPU seconds (utime + stime from
//! `/proc/<pid>/stat`) per 1,000 inserts and their resident memory at the
//! cell's end. drift's nodes hold the keeper and the table in one process,
//! so for `keeper` and `naive` that is both.
//!
//! All setups' clusters run through the sitting and the cells interleave
//! (per client count, each round visits every setup), with merges off;
//! each cell reports the round with the median inserts/s.
//!
//! Every insert carries `--rows` fresh rows (one block: the bench table has
//! one partition), so none is a duplicate. Round trips per insert are read
//! from the replicas' own counters (`InsertKeeperRoundTrips` over
//! `InsertedBlocks`; on ClickHouse, every coordinator request its servers
//! made — `ZooKeeperTransactions`, background work included — over
//! `InsertQuery`), not assumed. ClickHouse keeps merging (with its limits
//! on parts lifted, it never throttles the inserts).

use crate::cli::{BenchTableArgs, TableSetup};
use crate::cluster::{start_cluster, stop_cluster, UpSpec};
use crate::fail::Failure;
use crate::servers::LocalTable;
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
    /// The coordinator processes' CPU seconds per 1,000 inserts.
    coordinator_cpu_s_per_1000: f64,
    /// Their resident memory at the cell's end (MB, summed).
    coordinator_rss_mb: f64,
}

fn name(s: TableSetup) -> &'static str {
    match s {
        TableSetup::Keeper => "keeper",
        TableSetup::Naive => "naive",
        TableSetup::Zookeeper => "zookeeper",
        TableSetup::ClickhouseKeeper => "clickhouse-keeper",
        TableSetup::ClickhouseZookeeper => "clickhouse-zookeeper",
    }
}

fn is_clickhouse(s: TableSetup) -> bool {
    matches!(s, TableSetup::ClickhouseKeeper | TableSetup::ClickhouseZookeeper)
}

/// ClickHouse's table of the sitting: one partition, as drift's.
const CH_TABLE_DDL: &str = "CREATE TABLE IF NOT EXISTS bench (id UInt64, key String, value Int64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/bench', '{replica}') PARTITION BY tuple() ORDER BY id";

/// The PIDs of a cluster's coordinator: its ZooKeeper JVMs, else its
/// drift nodes.
pub(crate) fn coordinator_pids(dir: &std::path::Path) -> Vec<u32> {
    let zk = dir.join("zk-pids");
    let file = if zk.exists() { zk } else { dir.join("pids") };
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
pub(crate) fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// (CPU seconds so far, resident MB) summed over `pids`.
pub(crate) fn cpu_and_rss(pids: &[u32], ticks: f64) -> (f64, f64) {
    let mut cpu = 0.0;
    let mut rss = 0.0;
    for p in pids {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            // the fields after the command's closing parenthesis
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let t = |k: usize| f.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            cpu += (t(11) + t(12)) / ticks;
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{p}/status")) {
            rss += status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .unwrap_or(0.0)
                / 1024.0;
        }
    }
    (cpu, rss)
}

/// Ends the cluster in `dir` and removes the directory when dropped,
/// error or not, and when the benchmark is interrupted (also `drift bench
/// keeper --against`'s clusters): a benchmark's clusters are started like
/// `drift cluster up`'s, to outlive the command that started them, so
/// without this a Ctrl-C would leave them running on the benchmark's ports.
pub(crate) struct Running {
    dir: PathBuf,
}

/// The clusters benchmarks have running, for the interrupt handler.
static RUNNING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

impl Running {
    /// Takes charge of the cluster in `dir`, started or about to be.
    pub(crate) fn new(dir: PathBuf) -> Running {
        end_clusters_on_interrupt();
        lock_running().push(dir.clone());
        Running { dir }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // held while stopping: an interrupt meanwhile waits, then finds
        // this cluster gone from the list
        let mut running = lock_running();
        running.retain(|d| *d != self.dir);
        let _ = stop_cluster(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn lock_running() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// On SIGINT, SIGTERM or SIGHUP: ends every cluster in [`RUNNING`],
/// removes their directories, and exits as a shell reports a process the
/// signal ended. Set up by each [`Running`].
fn end_clusters_on_interrupt() {
    crate::interrupt::on_signal(|signal, _| {
        // the lock stays taken: no cluster is added or stopped elsewhere
        // while these go
        let running = lock_running();
        for dir in running.iter() {
            let _ = stop_cluster(dir);
            let _ = std::fs::remove_dir_all(dir);
        }
        noteln!(
            "interrupted: stopped the benchmark's {} running cluster(s)",
            running.len()
        );
        std::process::exit(crate::interrupt::exit_code(signal));
    });
}

pub fn table(mut args: BenchTableArgs) -> Result<i32, Failure> {
    if args.target.is_some() {
        args.setups = vec![
            TableSetup::ClickhouseKeeper,
            TableSetup::ClickhouseZookeeper,
            TableSetup::Keeper,
        ];
    }
    let ch_bin = if args.setups.iter().any(|s| is_clickhouse(*s)) {
        Some(crate::clickhouse::find_bin(args.clickhouse_bin.as_deref()).map_err(Failure::new)?)
    } else {
        None
    };
    let ticks = clock_ticks();
    if args
        .setups
        .iter()
        .any(|s| matches!(s, TableSetup::Zookeeper | TableSetup::ClickhouseZookeeper))
        && !crate::servers::zookeeper_installed()
    {
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
            "{:<20} {:>7} {:>10} {:>11} {:>8} {:>8} {:>9} {:>10} {:>12} {:>9} {:>7}",
            "setup",
            "clients",
            "inserts/s",
            "rows/s",
            "p50 ms",
            "p99 ms",
            "RT/insert",
            "keeper ms",
            "coord CPU s/k",
            "coord MB",
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
        let clickhouse = ch_bin
            .as_ref()
            .filter(|_| is_clickhouse(*setup))
            .map(|bin| crate::cluster::ClickHouseUp {
                bin: bin.clone(),
                http_port: 8123,
                interserver_port: 9009,
                tcp_port: crate::cluster::CLICKHOUSE_TCP_PORT,
                // no insert waits or fails for the parts it makes
                merge_tree: vec![
                    ("parts_to_delay_insert".into(), "1000000".into()),
                    ("parts_to_throw_insert".into(), "1000000".into()),
                ],
            });
        let running = Running::new(dir.clone());
        let config = start_cluster(&UpSpec {
            nodes: 3,
            dir: &dir,
            port: args.port,
            block: None,
            quorum_reads: false,
            fault_hooks: false,
            set: &[],
            table: clickhouse.is_none().then_some(&table),
            kv: None,
            zookeeper: matches!(setup, TableSetup::Zookeeper | TableSetup::ClickhouseZookeeper),
            clickhouse: clickhouse.as_ref(),
            zookeeper_heap_mb: None,
        });
        let config = config?;
        let urls: Vec<String> = match &clickhouse {
            Some(ch) => {
                let addrs: Vec<std::net::SocketAddr> = config
                    .peers
                    .iter()
                    .map(|p| std::net::SocketAddr::new(p.client.ip(), ch.http_port))
                    .collect();
                let deadline = Instant::now() + Duration::from_secs(30);
                for a in &addrs {
                    crate::clickhouse::create_table_on(*a, CH_TABLE_DDL, deadline).map_err(Failure::new)?;
                }
                addrs.iter().map(|a| format!("http://{a}/")).collect()
            }
            None => config.table_urls(),
        };
        let next_id = Arc::new(AtomicU64::new(0));
        rt.block_on(drive(&http, &urls, 4, WARMUP, args.rows as usize, &next_id));
        let pids = coordinator_pids(&dir);
        clusters.push((*setup, urls, next_id, running, pids));
    }
    let mut samples: Vec<Cell> = Vec::new();
    for &clients in &args.clients {
        for _ in 0..args.rounds {
            for (setup, urls, next_id, _, pids) in &clusters {
                let ch = is_clickhouse(*setup);
                let before = rt.block_on(counters(&http, urls, ch))?;
                let (cpu_before, _) = cpu_and_rss(pids, ticks);
                let (n, errors, hist, secs) = rt.block_on(drive(
                    &http,
                    urls,
                    clients as usize,
                    Duration::from_secs_f64(args.seconds),
                    args.rows as usize,
                    next_id,
                ));
                let after = rt.block_on(counters(&http, urls, ch))?;
                let (cpu_after, rss) = cpu_and_rss(pids, ticks);
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
                    coordinator_cpu_s_per_1000: (cpu_after - cpu_before) * 1000.0 / n.max(1) as f64,
                    coordinator_rss_mb: rss,
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
                    "{:<20} {:>7} {:>10.0} {:>11.0} {:>8.2} {:>8.2} {:>9.3} {:>10.2} {:>12.3} {:>9.0} {:>7}   ({:.0}–{:.0})",
                    cell.setup,
                    cell.clients,
                    cell.inserts_per_s,
                    cell.rows_per_s,
                    cell.p50_ms,
                    cell.p99_ms,
                    cell.round_trips_per_insert,
                    cell.keeper_ms_per_insert,
                    cell.coordinator_cpu_s_per_1000,
                    cell.coordinator_rss_mb,
                    cell.errors,
                    spread.0.unwrap_or(0.0),
                    spread.1.unwrap_or(0.0)
                );
            }
            cells.push(cell);
        }
    }
    let of = |a: &str, b: &str, c: u64, v: fn(&Cell) -> f64| {
        let f = |s: &str| cells.iter().find(|x| x.setup == s && x.clients == c).map(v);
        Some(f(a)? / f(b)?.max(1e-9))
    };
    let ratio = |a: &str, b: &str, c: u64| of(a, b, c, |x| x.inserts_per_s);
    let mut ratios = Vec::new();
    for &c in &args.clients {
        ratios.push(serde_json::json!({
            "clients": c,
            "keeper_over_naive": ratio("keeper", "naive", c),
            "keeper_over_zookeeper": ratio("keeper", "zookeeper", c),
            "clickhouse_keeper_over_zookeeper": ratio("clickhouse-keeper", "clickhouse-zookeeper", c),
            "clickhouse_keeper_over_zookeeper_cpu": of("clickhouse-keeper", "clickhouse-zookeeper", c, |x| x.coordinator_cpu_s_per_1000),
            "clickhouse_keeper_over_zookeeper_rss": of("clickhouse-keeper", "clickhouse-zookeeper", c, |x| x.coordinator_rss_mb),
            "drift_table_over_clickhouse_keeper": ratio("keeper", "clickhouse-keeper", c),
        }));
        if !args.json {
            let show = |r: Option<f64>| r.map(|v| format!("{v:.2}×")).unwrap_or_else(|| "-".into());
            if args.setups.iter().any(|s| is_clickhouse(*s)) {
                out!(
                    "{c:>3} clients: ClickHouse on keeper/on ZooKeeper: inserts/s {}, coordinator CPU per insert {}, its memory {}   drift's table/ClickHouse, both on the keeper: inserts/s {}",
                    show(ratio("clickhouse-keeper", "clickhouse-zookeeper", c)),
                    show(of("clickhouse-keeper", "clickhouse-zookeeper", c, |x| x.coordinator_cpu_s_per_1000)),
                    show(of("clickhouse-keeper", "clickhouse-zookeeper", c, |x| x.coordinator_rss_mb)),
                    show(ratio("keeper", "clickhouse-keeper", c))
                );
            } else {
                out!(
                    "{c:>3} clients: keeper/naive {}   keeper/zookeeper {}",
                    show(ratio("keeper", "naive", c)),
                    show(ratio("keeper", "zookeeper", c))
                );
            }
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
/// `InsertKeeperMicros` over the replicas (on ClickHouse: every
/// coordinator request, the inserts, and the time spent waiting on the
/// coordinator).
async fn counters(http: &reqwest::Client, urls: &[String], clickhouse: bool) -> Result<(u64, u64, u64), Failure> {
    let mut rt = 0;
    let mut blocks = 0;
    let mut micros = 0;
    let (rt_name, blocks_name, micros_name) = if clickhouse {
        ("ZooKeeperTransactions", "InsertQuery", "ZooKeeperWaitMicroseconds")
    } else {
        ("InsertKeeperRoundTrips", "InsertedBlocks", "InsertKeeperMicros")
    };
    for u in urls {
        let body = http
            .post(u)
            .body(format!(
                "SELECT event, value FROM system.events WHERE event IN ('{rt_name}', '{blocks_name}', '{micros_name}') FORMAT TabSeparated"
            ))
            .send()
            .await
            .map_err(|e| Failure::new(format!("{u}: {e}")))?
            .text()
            .await
            .map_err(|e| Failure::new(format!("{u}: {e}")))?;
        for line in body.lines() {
            let mut w = line.split('\t');
            match (w.next(), w.next().and_then(|v| v.parse::<u64>().ok())) {
                (Some(e), Some(v)) if e == rt_name => rt += v,
                (Some(e), Some(v)) if e == blocks_name => blocks += v,
                (Some(e), Some(v)) if e == micros_name => micros += v,
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
