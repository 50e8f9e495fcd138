//! `drift bench keeper --against zookeeper --znodes N`: the memory each
//! system's servers hold for a large tree, and through a snapshot of it.
//!
//! Each round starts a fresh 3-node keeper cluster and a fresh 3-node
//! ZooKeeper ensemble (the order alternating between rounds; ZooKeeper's
//! heap sized for the tree, 4 KiB per znode and at least 1 GiB) and, on
//! each, in turn:
//!
//! 1. reads each server's resident memory (`VmRSS`) idle;
//! 2. loads `N` persistent znodes of 100 bytes under one parent, named as
//!    ClickHouse names block ids (`<partition>_<hash>_<hash>`, ~45 bytes),
//!    in multis of [`BATCH`] creates from [`SESSIONS`] closed-loop sessions;
//! 3. checks every server holds all `N` (sync, then the parent's child
//!    count, on each server);
//! 4. reads each server's resident memory after a settling pause, and its
//!    peak so far (`VmHWM`); bytes per znode are (loaded − idle) / `N`;
//! 5. resets the peak (`/proc/<pid>/clear_refs`, 5) and writes small sets
//!    until every server has written a new snapshot file (both systems
//!    snapshot after a count of log entries: the keeper every
//!    `snapshot_distance`, 100,000 by default; ZooKeeper after a random
//!    count between half its `snapCount` and all of it, 100,000 by
//!    default), then reads the peak through the snapshot and the memory
//!    after.
//!
//! The report gives each system's median round per server (the largest of
//! its three servers) with the spread over rounds, and drift/ZooKeeper.

use crate::bench_keeper_zk::{connect, runtime, System};
use crate::bench_table::{coordinator_pids, Running};
use crate::cli::BenchKeeperArgs;
use crate::cluster::{start_cluster, UpSpec};
use crate::fail::Failure;
use serde::Serialize;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

const DATA: [u8; 100] = [b'x'; 100];
const PARENT: &str = "/clickhouse/tables/bench/blocks";
/// Creates per multi while loading.
pub const BATCH: u64 = 100;
/// Sessions loading at once.
pub const SESSIONS: u64 = 16;
/// Most sets written to make every server snapshot (beyond both systems'
/// default distance of 100,000 entries).
const SETS_MAX: u64 = 300_000;
/// A pause before memory is read, so what a burst left in flight settles.
const SETTLE: Duration = Duration::from_secs(2);

/// One server's memory in one round, in MB.
#[derive(Serialize, Clone, Debug, Default)]
struct Server {
    idle_mb: f64,
    loaded_mb: f64,
    load_peak_mb: f64,
    snapshot_peak_mb: f64,
    after_snapshot_mb: f64,
}

#[derive(Serialize, Clone, Debug)]
struct Round {
    system: &'static str,
    round: usize,
    znodes: u64,
    load_s: f64,
    /// Sets written until every server had written a new snapshot.
    sets_to_snapshot: u64,
    servers: Vec<Server>,
    /// The largest server's (loaded − idle) / znodes.
    bytes_per_znode: f64,
}

/// ZooKeeper's heap for `znodes`: 4 KiB each, at least 1 GiB.
pub fn zookeeper_heap_mb(znodes: u64) -> u32 {
    (znodes * 4 / 1024).max(1024).min(u32::MAX as u64) as u32
}

/// The `i`th block id: a partition and two 64-bit hashes, as ClickHouse
/// names them.
pub fn block_id(i: u64) -> String {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let a = mix(i.wrapping_mul(2).wrapping_add(0x9e37_79b9_7f4a_7c15));
    let b = mix(i.wrapping_mul(2).wrapping_add(1).wrapping_add(0x9e37_79b9_7f4a_7c15));
    format!("{}_{a}_{b}", 202_400 + i % 12)
}

/// (VmRSS, VmHWM) of `pid` in MB.
fn memory(pid: u32) -> Result<(f64, f64), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .ok_or_else(|| format!("/proc/{pid}/status has no {name}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Resets `pid`'s peak resident memory to its current one.
fn reset_peak(pid: u32) -> Result<(), String> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").map_err(|e| format!("/proc/{pid}/clear_refs: {e}"))
}

/// Snapshot files under `dir`, by the directory holding them.
fn snapshot_files(dir: &Path) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                // the keeper's snapshot_<index>.bin (written under a
                // temporary name first), ZooKeeper's snapshot.<zxid>
                if name.starts_with("snapshot_") || name.starts_with("snapshot.") {
                    out.insert((d.display().to_string(), name.to_string()));
                }
            }
        }
    }
    out
}

pub fn against(args: &BenchKeeperArgs) -> Result<i32, Failure> {
    let znodes = args.znodes.expect("main dispatches here only with --znodes");
    let rt = runtime()?;
    let say = |s: String| {
        if !args.json {
            out!("{s}");
        }
    };
    let heap = zookeeper_heap_mb(znodes);
    say(format!(
        "3-node keeper cluster beside a 3-node ZooKeeper ensemble ({heap} MB heap), fresh each round, {} rounds alternated; {znodes} znodes of 100 bytes under {PARENT}, multis of {BATCH} from {SESSIONS} sessions",
        args.rounds
    ));
    let mut rounds: Vec<Round> = Vec::new();
    for round in 1..=args.rounds {
        for system in System::order(round) {
            let r = one_round(&rt, args, system, round, znodes, heap)
                .map_err(|e| Failure::new(format!("{} round {round}: {e}", system.name())))?;
            say(format!(
                "round {round}, {}: loaded in {:.1} s; RSS per server MB idle {} → loaded {} (peak {}); {} sets to a snapshot, peak through it {}, after {}; {:.0} bytes per znode",
                system.name(),
                r.load_s,
                list(&r.servers, |s| s.idle_mb),
                list(&r.servers, |s| s.loaded_mb),
                list(&r.servers, |s| s.load_peak_mb),
                r.sets_to_snapshot,
                list(&r.servers, |s| s.snapshot_peak_mb),
                list(&r.servers, |s| s.after_snapshot_mb),
                r.bytes_per_znode
            ));
            rounds.push(r);
        }
    }
    report(args, znodes, heap, &rounds);
    Ok(0)
}

fn list(servers: &[Server], f: impl Fn(&Server) -> f64) -> String {
    servers
        .iter()
        .map(|s| format!("{:.0}", f(s)))
        .collect::<Vec<_>>()
        .join("/")
}

fn one_round(
    rt: &tokio::runtime::Runtime,
    args: &BenchKeeperArgs,
    system: System,
    round: usize,
    znodes: u64,
    heap: u32,
) -> Result<Round, String> {
    let dir = std::env::temp_dir().join(format!(
        "drift-bench-keeper-mem-{}-{}-{round}",
        std::process::id(),
        system.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _running = Running::new(dir.clone());
    let started = start_cluster(&UpSpec {
        nodes: 3,
        dir: &dir,
        port: args.port,
        block: None,
        quorum_reads: false,
        fault_hooks: false,
        set: &[],
        table: None,
        kv: None,
        zookeeper: system == System::Zookeeper,
        clickhouse: None,
        zookeeper_heap_mb: Some(heap),
    });
    let config = started.map_err(|e| e.message)?;
    let addrs: Vec<SocketAddr> = config.peers.iter().map(|p| p.client).collect();
    let pids = coordinator_pids(&dir);
    if pids.len() != 3 {
        return Err(format!(
            "expected 3 server processes in {}, found {}",
            dir.display(),
            pids.len()
        ));
    }
    rt.block_on(async {
        let c = connect(addrs[0]).await?;
        let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let mut path = String::new();
        for part in PARENT.split('/').filter(|p| !p.is_empty()) {
            path.push('/');
            path.push_str(part);
            match c.create(&path, &[], &opts).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(format!("creating {path}: {e}")),
            }
        }
        match c.create("/bench-set", &DATA, &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(format!("creating /bench-set: {e}")),
        }
    })?;
    std::thread::sleep(SETTLE);
    let mut servers: Vec<Server> = Vec::new();
    for &p in &pids {
        let (rss, _) = memory(p)?;
        reset_peak(p)?;
        servers.push(Server {
            idle_mb: rss,
            ..Server::default()
        });
    }
    let began = Instant::now();
    rt.block_on(load(&addrs, znodes))?;
    let load_s = began.elapsed().as_secs_f64();
    rt.block_on(check_count(&addrs, znodes))?;
    std::thread::sleep(SETTLE);
    for (s, &p) in servers.iter_mut().zip(&pids) {
        let (rss, peak) = memory(p)?;
        s.loaded_mb = rss;
        s.load_peak_mb = peak;
        reset_peak(p)?;
    }
    let before = snapshot_files(&dir);
    let sets = rt.block_on(sets_until_snapshot(&addrs, &dir, &before))?;
    std::thread::sleep(SETTLE);
    for (s, &p) in servers.iter_mut().zip(&pids) {
        let (rss, peak) = memory(p)?;
        s.snapshot_peak_mb = peak;
        s.after_snapshot_mb = rss;
    }
    let grown = servers.iter().map(|s| s.loaded_mb - s.idle_mb).fold(0.0, f64::max);
    Ok(Round {
        system: system.name(),
        round,
        znodes,
        load_s,
        sets_to_snapshot: sets,
        servers,
        bytes_per_znode: grown * 1024.0 * 1024.0 / znodes as f64,
    })
}

/// Creates znodes 0..`znodes` in multis of [`BATCH`], session `s` taking
/// batches s, s + SESSIONS, …; session s on server s mod 3.
async fn load(addrs: &[SocketAddr], znodes: u64) -> Result<(), String> {
    let batches = znodes.div_ceil(BATCH);
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let c = connect(addrs[s as usize % addrs.len()]).await?;
        tasks.push(tokio::spawn(async move {
            let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            let mut b = s;
            while b < batches {
                let mut m = c.new_multi_writer();
                for i in b * BATCH..((b + 1) * BATCH).min(znodes) {
                    m.add_create(&format!("{PARENT}/{}", block_id(i)), &DATA, &opts)
                        .map_err(|e| format!("a create: {e}"))?;
                }
                match m.commit().await {
                    Ok(_) => {}
                    Err(zk::MultiWriteError::RequestFailed { source }) => return Err(format!("multi {b}: {source}")),
                    Err(zk::MultiWriteError::OperationFailed { source, index }) => {
                        return Err(format!("multi {b}, create {index}: {source}"))
                    }
                }
                b += SESSIONS;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("a loading session: {e}"))??;
    }
    Ok(())
}

/// Every server holds all `znodes` children (after a sync, its view is
/// at least as new as every create's acknowledgement).
async fn check_count(addrs: &[SocketAddr], znodes: u64) -> Result<(), String> {
    for &a in addrs {
        let c = connect(a).await?;
        c.sync(PARENT).await.map_err(|e| format!("sync on {a}: {e}"))?;
        let stat = c
            .check_stat(PARENT)
            .await
            .map_err(|e| format!("stat of {PARENT} on {a}: {e}"))?
            .ok_or_else(|| format!("{PARENT} is missing on {a}"))?;
        if stat.num_children as u64 != znodes {
            return Err(format!(
                "{a} holds {} children of {PARENT}, expected {znodes}",
                stat.num_children
            ));
        }
    }
    Ok(())
}

/// Writes sets of one node from [`SESSIONS`] sessions until every one of
/// the 3 servers' directories has a snapshot file it did not have before;
/// returns the sets written.
async fn sets_until_snapshot(
    addrs: &[SocketAddr],
    dir: &Path,
    before: &BTreeSet<(String, String)>,
) -> Result<u64, String> {
    let mut clients = Vec::new();
    for s in 0..SESSIONS {
        clients.push(std::sync::Arc::new(connect(addrs[s as usize % addrs.len()]).await?));
    }
    let per_session = 1_000 / SESSIONS;
    let mut written = 0u64;
    loop {
        let fresh: BTreeSet<String> = snapshot_files(dir).difference(before).map(|(d, _)| d.clone()).collect();
        if fresh.len() >= addrs.len() {
            return Ok(written);
        }
        if written >= SETS_MAX {
            return Err(format!(
                "{written} sets written and only {} of {} servers wrote a new snapshot",
                fresh.len(),
                addrs.len()
            ));
        }
        // about 1,000 sets over every session, then look again
        let tasks: Vec<_> = clients
            .iter()
            .map(|c| {
                let c = c.clone();
                tokio::spawn(async move {
                    for _ in 0..per_session {
                        c.set_data("/bench-set", &DATA, None)
                            .await
                            .map_err(|e| format!("a set: {e}"))?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        for t in tasks {
            t.await.map_err(|e| format!("a set session: {e}"))??;
        }
        written += per_session * SESSIONS;
    }
}

fn median_of(rounds: &[&Round], f: impl Fn(&Round) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = rounds.iter().map(|r| f(r)).collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn report(args: &BenchKeeperArgs, znodes: u64, heap: u32, rounds: &[Round]) {
    let of = |s: System| rounds.iter().filter(|r| r.system == s.name()).collect::<Vec<_>>();
    let (d, z) = (of(System::Keeper), of(System::Zookeeper));
    let biggest = |f: fn(&Server) -> f64| move |r: &Round| r.servers.iter().map(f).fold(0.0, f64::max);
    type Row = (&'static str, fn(&Server) -> f64);
    let rows: [Row; 5] = [
        ("idle RSS per server, MB", |s| s.idle_mb),
        ("loaded RSS per server, MB", |s| s.loaded_mb),
        ("peak while loading, MB", |s| s.load_peak_mb),
        ("peak through a snapshot, MB", |s| s.snapshot_peak_mb),
        ("after the snapshot, MB", |s| s.after_snapshot_mb),
    ];
    let mut json_rows = Vec::new();
    if !args.json {
        out!("| {znodes} znodes (largest server, median round) | drift | ZooKeeper ({heap} MB heap) | drift / ZK |");
        out!("|---|---|---|---|");
    }
    for (name, f) in rows {
        let (dm, dlo, dhi) = median_of(&d, biggest(f));
        let (zm, zlo, zhi) = median_of(&z, biggest(f));
        if !args.json {
            out!(
                "| {name} | {dm:.0} ({dlo:.0}–{dhi:.0}) | {zm:.0} ({zlo:.0}–{zhi:.0}) | {:.3} |",
                dm / zm.max(1e-9)
            );
        }
        json_rows.push(serde_json::json!({"measure": name, "drift": [dm, dlo, dhi], "zookeeper": [zm, zlo, zhi]}));
    }
    let (db, _, _) = median_of(&d, |r| r.bytes_per_znode);
    let (zb, _, _) = median_of(&z, |r| r.bytes_per_znode);
    let (dl, _, _) = median_of(&d, |r| r.load_s);
    let (zl, _, _) = median_of(&z, |r| r.load_s);
    if !args.json {
        out!(
            "| bytes per znode (loaded − idle) | {db:.0} | {zb:.0} | {:.3} |",
            db / zb.max(1e-9)
        );
        out!("| load time, s | {dl:.1} | {zl:.1} | {:.2} |", dl / zl.max(1e-9));
    } else {
        out!(
            "{}",
            serde_json::json!({
                "znodes": znodes, "zookeeper_heap_mb": heap, "rounds": rounds,
                "rows": json_rows, "bytes_per_znode": {"drift": db, "zookeeper": zb},
            })
        );
    }
}
