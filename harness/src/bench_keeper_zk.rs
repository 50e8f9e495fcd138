//! `drift bench keeper --against zookeeper`: drift's keeper beside Apache
//! ZooKeeper under the same closed-loop load, in one command.
//!
//! Each round starts a fresh 3-node keeper cluster and a fresh 3-node
//! ZooKeeper ensemble (one after the other, the order alternating between
//! rounds), probes the data directory's fsync (a 4 KiB append and
//! `fdatasync`, 200 times), warms each cluster with 2 s each of untimed
//! set, create and get load (a fresh JVM runs interpreted until its JIT
//! has seen the load) and runs every cell: for each operation and
//! concurrency, that many ZooKeeper sessions (session i on server i mod 3),
//! each issuing its next request when the last one is answered, for
//! `--warmup` seconds untimed and then `--seconds` timed. A cell reports
//! the operations answered per second, their p50 and p99 latency, and the
//! servers' CPU time (utime + stime of their processes, from
//! `/proc/<pid>/stat`) per operation, the client's (this process's) the
//! same way, and how the machine's cores were spent over the window
//! (servers, client, anything else, idle: from `/proc/stat`), so a cell
//! says what bounds it; the memory column is the servers' resident
//! memory at the cell's end. The table gives, per cell, the
//! median round of each system with the spread of its rounds, and the
//! keeper/ZooKeeper ratios.
//!
//! Operations (100-byte data): `create`, a persistent sequential node under
//! one parent; `set` and `get`, on a node of the session's own; `multi`,
//! ClickHouse's insert shape: a block node and a sequential log node
//! created in one transaction.

use crate::bench_keeper::fsync_probe;
use crate::bench_table::{clock_ticks, coordinator_pids, cpu_and_rss, Running};
use crate::cli::{BenchKeeperArgs, KeeperLoad};
use crate::cluster::{start_cluster, UpSpec};
use crate::fail::Failure;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

const DATA: [u8; 100] = [b'x'; 100];
const ROOT: &str = "/drift-bench";
/// ZooKeeper's heap: a fixed 1 GiB with the JVM's default collector, as
/// ZooKeeper is run for speed (not the small serial-collector heap of the
/// tests).
const ZOOKEEPER_HEAP_MB: u32 = 1024;
/// Untimed load per operation on each fresh cluster before its cells.
const WARM: Duration = Duration::from_secs(2);

/// The two systems of a sitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum System {
    Keeper,
    Zookeeper,
}

impl System {
    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Keeper => "drift",
            System::Zookeeper => "zookeeper",
        }
    }

    /// Which system goes first in `round`: they alternate.
    pub(crate) fn order(round: usize) -> [System; 2] {
        if round % 2 == 1 {
            [System::Keeper, System::Zookeeper]
        } else {
            [System::Zookeeper, System::Keeper]
        }
    }
}

/// The runtime both benches' clients run on, once ZooKeeper is known to
/// be installed.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    if !crate::servers::zookeeper_installed() {
        return Err(Failure::new(
            "--against zookeeper needs Apache ZooKeeper installed (apt install zookeeper)",
        ));
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("a runtime: {e}")))
}

#[derive(Serialize, Clone, Debug)]
struct Cell {
    system: &'static str,
    round: usize,
    op: &'static str,
    concurrency: usize,
    ops: u64,
    errors: u64,
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    server_cpu_us_per_op: f64,
    /// This process's CPU per operation: the load's client.
    client_cpu_us_per_op: f64,
    /// The machine's cores over the timed window: busy in the servers,
    /// in the client, in anything else (the kernel's I/O work, other
    /// processes), and idle. What bounds a cell: no idle core left says
    /// CPU, and the split says whose.
    cores_servers: f64,
    cores_client: f64,
    cores_other: f64,
    cores_idle: f64,
    servers_rss_mb: f64,
}

#[derive(Serialize)]
struct Probe {
    system: &'static str,
    round: usize,
    fsync_p50_us: f64,
    fsync_p99_us: f64,
}

fn load_name(op: KeeperLoad) -> &'static str {
    match op {
        KeeperLoad::Create => "create",
        KeeperLoad::Set => "set",
        KeeperLoad::Multi => "multi",
        KeeperLoad::Get => "get",
    }
}

pub fn against(args: &BenchKeeperArgs) -> Result<i32, Failure> {
    let rt = runtime()?;
    let ticks = clock_ticks();
    let say = |s: String| {
        if !args.json {
            out!("{s}");
        }
    };
    say(format!(
        "3-node keeper cluster beside a 3-node ZooKeeper ensemble, fresh each round, {} rounds alternated; {} s cells after {} s of warm-up; 100-byte data, one session per client, session i on server i mod 3",
        args.rounds, args.seconds, args.warmup
    ));
    if !args.set.is_empty() {
        say(format!("the keeper cluster's file adds: {}", args.set.join("; ")));
    }
    let mut cells: Vec<Cell> = Vec::new();
    let mut probes: Vec<Probe> = Vec::new();
    for round in 1..=args.rounds {
        for system in System::order(round) {
            let dir = std::env::temp_dir().join(format!(
                "drift-bench-keeper-{}-{}-{round}",
                std::process::id(),
                system.name()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
            let running = Running::new(dir.clone());
            let started = start_cluster(&UpSpec {
                nodes: 3,
                dir: &dir,
                port: args.port,
                block: None,
                quorum_reads: false,
                fault_hooks: false,
                set: if system == System::Zookeeper { &[] } else { &args.set },
                table: None,
                kv: None,
                zookeeper: system == System::Zookeeper,
                clickhouse: None,
                zookeeper_heap_mb: Some(ZOOKEEPER_HEAP_MB),
            });
            let config = started?;
            let (p50, p99) = fsync_probe(&dir)?;
            say(format!(
                "round {round}, {}: fsync probe (4 KiB append + fdatasync) p50 {p50:.0} µs, p99 {p99:.0} µs",
                system.name()
            ));
            probes.push(Probe {
                system: system.name(),
                round,
                fsync_p50_us: p50,
                fsync_p99_us: p99,
            });
            let addrs: Vec<SocketAddr> = config.peers.iter().map(|p| p.client).collect();
            let pids = coordinator_pids(&dir);
            if pids.len() != 3 {
                return Err(Failure::new(format!(
                    "{}: expected 3 server processes in {}, found {}",
                    system.name(),
                    dir.display(),
                    pids.len()
                )));
            }
            rt.block_on(prepare(&addrs, args.concurrency.iter().copied().max().unwrap_or(1)))
                .map_err(|e| Failure::new(format!("{}: {e}", system.name())))?;
            // a fresh JVM runs interpreted until its JIT has seen the
            // load: both systems get the same untimed mixed load first
            let most = args.concurrency.iter().copied().max().unwrap_or(1);
            for op in [KeeperLoad::Set, KeeperLoad::Create, KeeperLoad::Get] {
                cell(usize::MAX - op as usize, &addrs, op, most, WARM, 0.0, &pids, ticks)
                    .map_err(|e| Failure::new(format!("{} warming up: {e}", system.name())))?;
            }
            for &op in &args.load {
                for &concurrency in &args.concurrency {
                    let warmup = Duration::from_secs_f64(args.warmup);
                    let out = cell(cells.len(), &addrs, op, concurrency, warmup, args.seconds, &pids, ticks).map_err(
                        |e| Failure::new(format!("{} {} at {concurrency}: {e}", system.name(), load_name(op))),
                    )?;
                    cells.push(Cell {
                        system: system.name(),
                        round,
                        op: load_name(op),
                        concurrency,
                        ..out
                    });
                }
            }
            drop(running);
        }
    }
    report(args, &cells, &probes);
    let failed = cells.iter().any(|c| c.ops == 0);
    Ok(if failed { 3 } else { 0 })
}

/// The root and each client's own node for `set` and `get`, and the
/// parents of `multi`'s nodes.
async fn prepare(addrs: &[SocketAddr], clients: usize) -> Result<(), String> {
    let c = connect(addrs[0]).await?;
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for path in [
        ROOT.to_string(),
        format!("{ROOT}/blocks"),
        format!("{ROOT}/log"),
        format!("{ROOT}/seq"),
    ] {
        match c.create(&path, &[], &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(format!("creating {path}: {e}")),
        }
    }
    for i in 0..clients {
        let path = format!("{ROOT}/k{i}");
        match c.create(&path, &DATA, &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(format!("creating {path}: {e}")),
        }
    }
    Ok(())
}

pub(crate) async fn connect(addr: SocketAddr) -> Result<zk::Client, String> {
    let host = addr.to_string();
    let connect = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&host);
    tokio::time::timeout(Duration::from_secs(15), connect)
        .await
        .map_err(|_| format!("connecting to {addr} timed out"))?
        .map_err(|e| format!("connecting to {addr}: {e}"))
}

/// One request of `op` by client `i` of cell `tag`, its `n`th.
async fn request(c: &zk::Client, op: KeeperLoad, tag: usize, i: usize, n: u64) -> Result<(), zk::Error> {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let sequential = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    match op {
        KeeperLoad::Create => c
            .create(&format!("{ROOT}/seq/c-"), &DATA, &sequential)
            .await
            .map(|_| ()),
        KeeperLoad::Set => c.set_data(&format!("{ROOT}/k{i}"), &DATA, None).await.map(|_| ()),
        KeeperLoad::Get => c.get_data(&format!("{ROOT}/k{i}")).await.map(|_| ()),
        KeeperLoad::Multi => {
            let mut m = c.new_multi_writer();
            m.add_create(&format!("{ROOT}/blocks/{tag}-{i}-{n}"), &DATA, &persistent)?;
            m.add_create(&format!("{ROOT}/log/log-"), &DATA, &sequential)?;
            match m.commit().await {
                Ok(_) => Ok(()),
                Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
                Err(zk::MultiWriteError::OperationFailed { source, .. }) => Err(source),
            }
        }
    }
}

/// What one client saw in the timed window.
struct Tally {
    ops: u64,
    errors: u64,
    hist: Histogram<u64>,
}

/// Threads the load's sessions run on. Each is a single-threaded runtime
/// of its own holding every task of its sessions (the client library's
/// connection task and the loop issuing requests), so a reply's read
/// wakes its request on the same thread. On a work-stealing runtime a
/// request and its connection task land on different threads about half
/// the time, and each such wake-up costs a futex and a switch on both.
/// Measured (BENCHMARKS.md, "The bench's client on a thread per
/// runtime"): get at 64 sessions went from 85,000–89,000 to 106,000
/// gets/s on the keeper, ZooKeeper's unchanged. One wake-up still
/// crosses threads: the client library's sockets belong to the
/// `async-io` crate's reactor, which runs on a thread of its own and
/// wakes a connection task when its socket turns readable (BENCHMARKS.md,
/// "A slow machine: every cell at 2×, and what the client costs").
const CLIENT_THREADS: usize = 2;

/// One cell: `concurrency` closed-loop clients for the warm-up and the
/// timed window, on [`CLIENT_THREADS`] threads (client i on thread
/// i mod threads); the servers' CPU read at the window's edges. The
/// window starts once every session is connected.
#[allow(clippy::too_many_arguments)]
fn cell(
    tag: usize,
    addrs: &[SocketAddr],
    op: KeeperLoad,
    concurrency: usize,
    warmup: Duration,
    seconds: f64,
    pids: &[u32],
    ticks: f64,
) -> Result<Cell, String> {
    let threads = CLIENT_THREADS.min(concurrency);
    let (ready_tx, ready) = std::sync::mpsc::channel::<Result<(), String>>();
    let mut starts = Vec::with_capacity(threads);
    let mut loads = Vec::with_capacity(threads);
    for t in 0..threads {
        let (start_tx, start) = std::sync::mpsc::channel::<(Instant, Instant)>();
        starts.push(start_tx);
        let ready = ready_tx.clone();
        let addrs = addrs.to_vec();
        let spawned = std::thread::Builder::new()
            .name(format!("bench-client-{t}"))
            .spawn(move || client_thread(tag, &addrs, op, (t..concurrency).step_by(threads), ready, start));
        loads.push(spawned.map_err(|e| format!("a client thread: {e}"))?);
    }
    drop(ready_tx);
    // every thread answers once, connected or not; a thread that is not
    // sent the window (its sender dropped on an error here) ends at once
    let mut failed = None;
    for _ in 0..threads {
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(_) => failed = failed.or(Some("a client thread ended before connecting".to_string())),
        }
    }
    if let Some(e) = failed {
        drop(starts);
        for l in loads {
            let _ = l.join();
        }
        return Err(e);
    }
    let now = Instant::now();
    let timed_from = now + warmup;
    let until = timed_from + Duration::from_secs_f64(seconds);
    for s in &starts {
        // a thread that ended is reported by its join below
        let _ = s.send((timed_from, until));
    }
    let me = [std::process::id()];
    std::thread::sleep(timed_from.saturating_duration_since(Instant::now()));
    let (cpu_before, _) = cpu_and_rss(pids, ticks);
    let (client_before, _) = cpu_and_rss(&me, ticks);
    let machine_before = machine_cpu(ticks)?;
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    let (cpu_after, rss) = cpu_and_rss(pids, ticks);
    let (client_after, _) = cpu_and_rss(&me, ticks);
    let machine_after = machine_cpu(ticks)?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let (mut ops, mut errors) = (0, 0);
    for l in loads {
        let tallies = l.join().map_err(|_| "a client thread panicked".to_string())??;
        for t in tallies {
            ops += t.ops;
            errors += t.errors;
            hist.add(&t.hist).map_err(|e| format!("merging latencies: {e}"))?;
        }
    }
    let (servers, client) = (cpu_after - cpu_before, client_after - client_before);
    let busy = machine_after.0 - machine_before.0;
    let idle = machine_after.1 - machine_before.1;
    Ok(Cell {
        system: "",
        round: 0,
        op: "",
        concurrency,
        ops,
        errors,
        ops_per_s: ops as f64 / seconds,
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        server_cpu_us_per_op: servers * 1e6 / ops.max(1) as f64,
        client_cpu_us_per_op: client * 1e6 / ops.max(1) as f64,
        cores_servers: servers / seconds,
        cores_client: client / seconds,
        cores_other: (busy - servers - client).max(0.0) / seconds,
        cores_idle: idle / seconds,
        servers_rss_mb: rss,
    })
}

/// One client thread of a cell: connects its sessions (`clients`, the
/// indices of the cell's clients it runs), says so on `ready`, waits
/// for the window `(timed_from, until)` on `start` and runs the closed
/// loops until it ends. What each client saw in the timed window.
fn client_thread(
    tag: usize,
    addrs: &[SocketAddr],
    op: KeeperLoad,
    clients: impl Iterator<Item = usize>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
    start: std::sync::mpsc::Receiver<(Instant, Instant)>,
) -> Result<Vec<Tally>, String> {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let e = format!("a client runtime: {e}");
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let connected = rt.block_on(async {
        let mut sessions = Vec::new();
        for i in clients {
            sessions.push((i, Arc::new(connect(addrs[i % addrs.len()]).await?)));
        }
        Ok::<_, String>(sessions)
    });
    let sessions = match connected {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let _ = ready.send(Ok(()));
    // the cell counts one answer per thread: a thread that ends before
    // its answer (a panic) drops the last sender, and the cell hears so
    drop(ready);
    let Ok((timed_from, until)) = start.recv() else {
        // the cell gave up (another thread failed): close the sessions
        rt.block_on(async move { drop(sessions) });
        return Ok(Vec::new());
    };
    rt.block_on(async move {
        let mut tasks = Vec::with_capacity(sessions.len());
        for (i, c) in &sessions {
            let (i, c) = (*i, c.clone());
            tasks.push(tokio::spawn(async move {
                let mut t = Tally {
                    ops: 0,
                    errors: 0,
                    hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds"),
                };
                let mut n = 0u64;
                loop {
                    let start = Instant::now();
                    if start >= until {
                        break;
                    }
                    n += 1;
                    let result = request(&c, op, tag, i, n).await;
                    let end = Instant::now();
                    if start < timed_from || end > until {
                        continue;
                    }
                    match result {
                        Ok(()) => {
                            t.ops += 1;
                            let _ = t.hist.record((end - start).as_micros().max(1) as u64);
                        }
                        Err(_) => t.errors += 1,
                    }
                }
                t
            }));
        }
        let mut tallies = Vec::with_capacity(tasks.len());
        for t in tasks {
            tallies.push(t.await.map_err(|e| format!("a client task: {e}"))?);
        }
        drop(sessions);
        Ok(tallies)
    })
}

/// The machine's CPU seconds so far, (busy, idle), from the first line
/// of `/proc/stat` (idle counts I/O wait too; steal is neither).
fn machine_cpu(ticks: f64) -> Result<(f64, f64), String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    parse_machine_cpu(&stat, ticks).ok_or_else(|| "/proc/stat: no cpu line of at least 8 counters".to_string())
}

fn parse_machine_cpu(stat: &str, ticks: f64) -> Option<(f64, f64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice,
    // already counted in user and nice]
    if f.len() < 8 {
        return None;
    }
    let busy = f[0] + f[1] + f[2] + f[5] + f[6];
    let idle = f[3] + f[4];
    Some((busy / ticks, idle / ticks))
}

/// The median round of `system`'s cell and the spread of its ops/s.
fn median<'a>(cells: &'a [Cell], system: &str, op: &str, concurrency: usize) -> Option<(&'a Cell, f64, f64)> {
    let mut runs: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.system == system && c.op == op && c.concurrency == concurrency)
        .collect();
    runs.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    let (lo, hi) = (runs.first()?.ops_per_s, runs.last()?.ops_per_s);
    Some((runs[runs.len() / 2], lo, hi))
}

/// A cell's cores: `servers+client+other, idle`.
fn cores(c: &Cell) -> String {
    format!(
        "{:.2}+{:.2}+{:.2}, {:.2}",
        c.cores_servers, c.cores_client, c.cores_other, c.cores_idle
    )
}

fn report(args: &BenchKeeperArgs, cells: &[Cell], probes: &[Probe]) {
    let mut rows = Vec::new();
    if !args.json {
        out!(
            "| op | conc | drift ops/s | ZooKeeper ops/s | ratio | p99 ms drift / ZK | servers' CPU µs/op drift / ZK | CPU ratio | client's CPU µs/op drift / ZK | cores servers+client+other, idle: drift / ZK | servers' RSS MB drift / ZK | errors drift / ZK |"
        );
        out!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    for &op in &args.load {
        let op = load_name(op);
        for &c in &args.concurrency {
            let (Some((d, dlo, dhi)), Some((z, zlo, zhi))) = (
                median(cells, System::Keeper.name(), op, c),
                median(cells, System::Zookeeper.name(), op, c),
            ) else {
                continue;
            };
            let ratio = d.ops_per_s / z.ops_per_s.max(1e-9);
            let cpu_ratio = d.server_cpu_us_per_op / z.server_cpu_us_per_op.max(1e-9);
            if !args.json {
                out!(
                    "| {op} | {c} | {:.0} ({dlo:.0}–{dhi:.0}) | {:.0} ({zlo:.0}–{zhi:.0}) | {ratio:.2} | {:.2} / {:.2} | {:.0} / {:.0} | {cpu_ratio:.2} | {:.0} / {:.0} | {} / {} | {:.0} / {:.0} | {} / {} |",
                    d.ops_per_s,
                    z.ops_per_s,
                    d.p99_ms,
                    z.p99_ms,
                    d.server_cpu_us_per_op,
                    z.server_cpu_us_per_op,
                    d.client_cpu_us_per_op,
                    z.client_cpu_us_per_op,
                    cores(d),
                    cores(z),
                    d.servers_rss_mb,
                    z.servers_rss_mb,
                    d.errors,
                    z.errors
                );
            }
            rows.push(serde_json::json!({
                "op": op, "concurrency": c,
                "drift": d, "zookeeper": z,
                "drift_ops_per_s_spread": [dlo, dhi], "zookeeper_ops_per_s_spread": [zlo, zhi],
                "ops_ratio": ratio, "cpu_per_op_ratio": cpu_ratio,
            }));
        }
    }
    if args.json {
        out!(
            "{}",
            serde_json::json!({
                "rounds": args.rounds, "seconds": args.seconds, "warmup_s": args.warmup,
                "cells": rows, "runs": cells, "fsync_probes": probes,
            })
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{cell, parse_machine_cpu, KeeperLoad};
    use std::time::Duration;

    /// A cell whose sessions cannot connect ends with an error that names
    /// the address, on every client thread, instead of waiting for a
    /// window no thread will run.
    #[test]
    fn a_cell_that_cannot_connect_says_where_and_ends() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = cell(0, &[port], KeeperLoad::Get, 3, Duration::ZERO, 0.1, &[], 100.0).unwrap_err();
        assert!(e.contains(&format!("connecting to {port}")), "{e}");
    }

    #[test]
    fn the_machines_cpu_is_read_from_the_first_line_of_proc_stat() {
        let stat = "cpu  100 5 50 800 20 3 2 7 40 0\ncpu0 50 2 25 400 10 1 1 3 20 0\nintr 1 2 3\n";
        // busy: user + nice + system + irq + softirq (guest is in user,
        // steal is neither); idle: idle + iowait
        assert_eq!(parse_machine_cpu(stat, 100.0), Some((1.6, 8.2)));
        assert_eq!(parse_machine_cpu("cpu  1 2 3\n", 100.0), None);
        assert_eq!(parse_machine_cpu("cpu  1 2 x 4 5 6 7 8\n", 100.0), None);
        assert_eq!(parse_machine_cpu("intr 1\n", 100.0), None);
    }
}
