//! `drift bench keeper`: what the keeper core costs, measured on this
//! machine.
//!
//! * apply — preprocess + commit throughput of create, set and delete with
//!   the digest off, incremental and full (full recomputes the whole tree
//!   after every commit, so it runs on a small tree and is reported apart);
//! * snapshot — write (encode + zstd + fsync) and load (read + decode +
//!   digest check) of a tree of `--nodes` nodes;
//! * changelog — append throughput with one fsync per batch, for several
//!   batch sizes, beside a raw 4 KiB append + fdatasync probe.
//!
//! `drift bench keeper --against zookeeper` measures instead a keeper
//! cluster beside an Apache ZooKeeper ensemble under client load.

use crate::cli::BenchKeeperArgs;
use crate::fail::Failure;
use drift_keeper::acl::Acl;
use drift_keeper::changelog::{self, Changelog, LogRecord};
use drift_keeper::digest::node_digest;
use drift_keeper::entry::Entry;
use drift_keeper::node::Stat;
use drift_keeper::snapshot::{self, SnapshotMeta, Snapshots};
use drift_keeper::{Create, CreateMode, Digest, DigestMode, Op, Storage, Write};
use drift_node::fsdisk::FsDisk;
use serde::Serialize;
use serde_json::json;
use std::hint::black_box;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Tree size for the full-recompute mode: it is O(tree) per commit.
const FULL_MODE_OPS: usize = 2_000;
/// How long each changelog batch size is driven, in seconds.
const APPEND_SECONDS: f64 = 1.5;
const DATA_BYTES: usize = 100;
/// Entries applied to one replica before the other takes its turn.
const PAIR_CHUNK: usize = 500;
/// Entry times as a leader stamps them (wall-clock milliseconds, here in
/// 2027): their size matters to what the digest hashes.
const ENTRY_TIME_BASE_MS: i64 = 1_800_000_000_000;

#[derive(Serialize)]
struct ApplyRow {
    mode: &'static str,
    ops: usize,
    create_per_s: f64,
    set_per_s: f64,
    delete_per_s: f64,
}

pub fn keeper(args: BenchKeeperArgs) -> Result<i32, Failure> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("drift-bench-keeper-{}", std::process::id())));
    let say = |s: &str| {
        if !args.json {
            out!("{s}");
            let _ = std::io::stdout().flush();
        }
    };

    say(&format!(
        "apply (per log entry, as a replica: decode, preprocess, digest check, commit, digest check):\n  {} creates, sets, deletes per mode; the two modes' replicas alternate every {} entries; median of {} runs",
        args.ops, PAIR_CHUNK, args.runs
    ));
    let row = |name: &'static str, ops: usize, samples: &[[f64; 3]]| {
        let r = median_row(name, ops, samples);
        say(&format!(
            "  {:<18} {:>8} ops  create {:>10.0}/s  set {:>10.0}/s  delete {:>10.0}/s",
            r.mode, r.ops, r.create_per_s, r.set_per_s, r.delete_per_s
        ));
        r
    };
    let [off, inc] = paired_runs([DigestMode::Off, DigestMode::Incremental], args.ops, args.runs);
    let lost = throughput_lost(&off, &inc);
    let mut apply = vec![row("off", args.ops, &off), row("incremental", args.ops, &inc)];
    let small = FULL_MODE_OPS.min(args.ops);
    let [small_off, full] = paired_runs([DigestMode::Off, DigestMode::Full], small, args.runs);
    apply.push(row("off (small tree)", small, &small_off));
    apply.push(row("full (small tree)", small, &full));
    say(&format!(
        "  throughput lost to the incremental digest (median of paired runs): create {:.1}%  set {:.1}%  delete {:.1}%  equal mix {:.1}%",
        100.0 * lost[0],
        100.0 * lost[1],
        100.0 * lost[2],
        100.0 * lost[3]
    ));
    // however the rest is arranged, a set hashes its node: that alone
    // costs hash / (off + hash) of the set's throughput
    let off_set_ns = 1e9 / apply[0].set_per_s;
    let hash_ns = set_digest_ns(args.ops);
    let floor = hash_ns / (off_set_ns + hash_ns);
    say(&format!(
        "  one set's node digest alone: {hash_ns:.0} ns beside an off-mode set's {off_set_ns:.0} ns: at least {:.1}% of set throughput",
        100.0 * floor
    ));
    let digest_cost = json!({
        "throughput_lost": {"create": lost[0], "set": lost[1], "delete": lost[2], "mixed": lost[3]},
        "set_node_digest_ns": hash_ns, "set_throughput_lost_floor": floor,
    });

    std::fs::create_dir_all(&dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    say(&format!("snapshot: {} nodes, files in {}", args.nodes, dir.display()));
    let snap = snapshot_bench(&dir.join("snapshots"), args.nodes, &say)?;
    say("changelog: appends of ~150-byte entries, one fsync per batch");
    let log = changelog_bench(&dir.join("changelog"), &say)?;
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if args.json {
        let out = json!({"apply": apply, "digest_cost": digest_cost, "snapshot": snap, "changelog": log});
        out!("{}", serde_json::to_string_pretty(&out).expect("json"));
    }
    Ok(0)
}

/// The time of one node digest as the set phase computes it: the node
/// in the middle of the `ops` the bench creates, with the Stat the set
/// phase leaves it (created at zxid k + 2, after /b; set at ops + k + 2),
/// best of five tight loops. The hashing every set must do, whatever
/// surrounds it.
fn set_digest_ns(ops: usize) -> f64 {
    let k = (ops / 2) as i64;
    let path = format!("/b/n{k:09}");
    let data = vec![b'y'; DATA_BYTES];
    let (czxid, mzxid) = (k + 2, ops as i64 + k + 2);
    let stat = Stat {
        czxid,
        mzxid,
        ctime: ENTRY_TIME_BASE_MS + czxid,
        mtime: ENTRY_TIME_BASE_MS + mzxid,
        version: 1,
        data_length: DATA_BYTES as i32,
        pzxid: czxid,
        ..Stat::default()
    };
    const N: u32 = 1_000_000;
    (0..5)
        .map(|_| {
            let started = Instant::now();
            let mut acc = 0u64;
            for _ in 0..N {
                acc = acc.wrapping_add(node_digest(black_box(&path), black_box(&data), &stat, 0));
            }
            black_box(acc);
            started.elapsed().as_secs_f64() * 1e9 / N as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// `runs` paired runs of the two modes over `ops` entries per phase:
/// entries/s per phase, per mode, per run.
fn paired_runs(modes: [DigestMode; 2], ops: usize, runs: usize) -> [Vec<[f64; 3]>; 2] {
    let logs = modes.map(|m| leader_log(m, ops));
    let mut samples: [Vec<[f64; 3]>; 2] = Default::default();
    for _ in 0..runs {
        let [a, b] = paired_apply(modes, &logs);
        samples[0].push(a);
        samples[1].push(b);
    }
    samples
}

/// Per run, the share of throughput the incremental replica lost,
/// 1 − incremental/off, for each phase and for an equal mix of the three
/// (by time); the median of each over the runs.
fn throughput_lost(off: &[[f64; 3]], inc: &[[f64; 3]]) -> [f64; 4] {
    let mut per: [Vec<f64>; 4] = Default::default();
    for (o, i) in off.iter().zip(inc) {
        for k in 0..3 {
            per[k].push(1.0 - i[k] / o[k]);
        }
        let time = |r: &[f64; 3]| r.iter().map(|x| 1.0 / x).sum::<f64>();
        per[3].push(1.0 - time(o) / time(i));
    }
    per.map(median)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median_row(mode: &'static str, ops: usize, samples: &[[f64; 3]]) -> ApplyRow {
    let at = |k: usize| median(samples.iter().map(|s| s[k]).collect());
    ApplyRow {
        mode,
        ops,
        create_per_s: at(0),
        set_per_s: at(1),
        delete_per_s: at(2),
    }
}

fn create_req(path: String) -> Write {
    Write::Op(Op::Create(Create {
        path,
        data: vec![b'x'; DATA_BYTES],
        acl: Acl::open(),
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    }))
}

/// Runs `reqs` through preprocess + commit as a leader would, returning
/// each encoded log entry with the digest it carries.
fn lead(s: &mut Storage, zxid: &mut i64, reqs: &[Write]) -> Vec<Vec<u8>> {
    reqs.iter()
        .map(|r| {
            *zxid += 1;
            let digest = s.preprocess(0, *zxid, ENTRY_TIME_BASE_MS + *zxid, r);
            let c = s.commit(*zxid);
            assert_eq!(c.response.error(), drift_keeper::ZkError::Ok);
            Entry {
                zxid: *zxid,
                time_ms: ENTRY_TIME_BASE_MS + *zxid,
                session: 0,
                digest,
                request: r.clone(),
            }
            .encode()
        })
        .collect()
}

/// The log of the three phases: creates, sets, deletes of `ops` nodes
/// under /b (whose create is the first create entry).
fn leader_log(mode: DigestMode, ops: usize) -> [Vec<Vec<u8>>; 3] {
    let mut s = Storage::new(mode);
    let mut zxid = 0;
    let paths: Vec<String> = (0..ops).map(|i| format!("/b/n{i:09}")).collect();
    let mut creates = vec![create_req("/b".into())];
    creates.extend(paths.iter().map(|p| create_req(p.clone())));
    let sets: Vec<Write> = paths
        .iter()
        .map(|p| {
            Write::Op(Op::SetData {
                path: p.clone(),
                data: vec![b'y'; DATA_BYTES],
                version: -1,
            })
        })
        .collect();
    let deletes: Vec<Write> = paths
        .iter()
        .map(|p| {
            Write::Op(Op::Delete {
                path: p.clone(),
                version: -1,
            })
        })
        .collect();
    [
        lead(&mut s, &mut zxid, &creates),
        lead(&mut s, &mut zxid, &sets),
        lead(&mut s, &mut zxid, &deletes),
    ]
}

/// Applies each mode's log as a follower would (decode, preprocess, check,
/// commit, check), one replica per mode, in chunks of [`PAIR_CHUNK`]
/// entries that alternate between the replicas (and which goes first), so
/// both see the same machine moment by moment: a neighbour's burst or a
/// frequency change lands on both sides instead of on whichever mode ran
/// then. Returns entries/s per phase for each mode.
fn paired_apply(modes: [DigestMode; 2], logs: &[[Vec<Vec<u8>>; 3]; 2]) -> [[f64; 3]; 2] {
    let mut replicas = modes.map(Storage::new);
    let mut secs = [[0.0f64; 3]; 2];
    for phase in 0..3 {
        let n = logs[0][phase].len();
        assert_eq!(n, logs[1][phase].len(), "paired logs have equal phases");
        for (c, start) in (0..n).step_by(PAIR_CHUNK).enumerate() {
            let end = (start + PAIR_CHUNK).min(n);
            for k in [c % 2, 1 - c % 2] {
                let s = &mut replicas[k];
                let started = Instant::now();
                for bytes in &logs[k][phase][start..end] {
                    let e = Entry::decode(bytes).expect("bench entries decode");
                    let d = s.preprocess(e.session, e.zxid, e.time_ms, &e.request);
                    assert!(!e.digest.mismatches(d), "digest mismatch in the bench");
                    let c = s.commit(e.zxid);
                    assert!(!e.digest.mismatches(c.digest), "digest mismatch in the bench");
                }
                secs[k][phase] += started.elapsed().as_secs_f64();
            }
        }
    }
    [0, 1].map(|k| [0, 1, 2].map(|p| logs[k][p].len() as f64 / secs[k][p]))
}

/// Runs `reqs` through preprocess + commit (building trees for the
/// snapshot bench).
fn drive(s: &mut Storage, zxid: &mut i64, reqs: &[Write]) {
    for r in reqs {
        *zxid += 1;
        s.preprocess(0, *zxid, ENTRY_TIME_BASE_MS + *zxid, r);
        s.commit(*zxid);
    }
}

fn snapshot_bench(dir: &std::path::Path, nodes: usize, say: &dyn Fn(&str)) -> Result<serde_json::Value, Failure> {
    let mut s = Storage::new(DigestMode::Incremental);
    let mut zxid = 0;
    let started = Instant::now();
    let fanout = 1000;
    let parents = nodes.div_ceil(fanout);
    let mut reqs: Vec<Write> = (0..parents).map(|d| create_req(format!("/d{d:06}"))).collect();
    reqs.extend((0..nodes.saturating_sub(parents)).map(|i| create_req(format!("/d{:06}/n{i:09}", i % parents))));
    drive(&mut s, &mut zxid, &reqs);
    drop(reqs);
    let build_s = started.elapsed().as_secs_f64();
    let meta = SnapshotMeta {
        last_index: zxid as u64,
        last_term: 1,
        zxid,
        digest: s.digest(),
    };
    let _ = std::fs::remove_dir_all(dir);
    let mut disk = FsDisk::open(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let snaps = Snapshots::new(snapshot::Config::default());

    // the copy the server itself makes (on its own thread) before the
    // snapshot is written off it
    let started = Instant::now();
    let frozen = s.state().freeze();
    let freeze_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut raw_bytes = 0usize;
    snapshot::encode_to(&frozen, &meta, false, 0, &mut |b: &[u8]| {
        raw_bytes += b.len();
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap_or_else(|never| match never {});
    let encode_raw_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let (name, file_bytes) = snaps
        .write(&mut disk, &frozen, &meta)
        .map_err(|e| Failure::new(e.to_string()))?;
    let write_s = started.elapsed().as_secs_f64();
    let file_bytes = file_bytes as usize;
    drop(frozen);
    drop(s);
    let started = Instant::now();
    let (state, loaded) = snaps
        .load(&disk, &name, true)
        .map_err(|e| Failure::new(e.to_string()))?;
    let load_s = started.elapsed().as_secs_f64();
    assert_eq!(loaded.digest, meta.digest);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    say(&format!(
        "  tree of {} nodes built in {build_s:.1} s; snapshot {:.0} MiB raw, {:.0} MiB zstd",
        state.node_count(),
        mib(raw_bytes),
        mib(file_bytes)
    ));
    say(&format!(
        "  copy on the server's thread {:.0} ms; write (encode+zstd+fsync) {write_s:.2} s = {:.0} MiB/s raw;  raw encode alone {encode_raw_s:.2} s",
        freeze_s * 1e3,
        mib(raw_bytes) / write_s
    ));
    say(&format!(
        "  load (read+unzstd+decode+digest check) {load_s:.2} s = {:.0} MiB/s raw",
        mib(raw_bytes) / load_s
    ));
    Ok(json!({
        "nodes": state.node_count(), "raw_bytes": raw_bytes, "file_bytes": file_bytes,
        "freeze_s": freeze_s, "write_s": write_s, "load_s": load_s, "encode_raw_s": encode_raw_s, "build_s": build_s,
        "write_mib_per_s": mib(raw_bytes) / write_s, "load_mib_per_s": mib(raw_bytes) / load_s,
    }))
}

fn changelog_bench(dir: &std::path::Path, say: &dyn Fn(&str)) -> Result<serde_json::Value, Failure> {
    let _ = std::fs::remove_dir_all(dir);
    let entry = Entry {
        zxid: 1,
        time_ms: 1,
        session: 1,
        digest: Digest { version: 1, value: 42 },
        request: create_req("/bench/n000000001".into()),
    }
    .encode();
    let mut rows = Vec::new();
    for batch in [1usize, 16, 128] {
        let _ = std::fs::remove_dir_all(dir);
        let mut disk = FsDisk::open(dir).map_err(|e| Failure::new(e.to_string()))?;
        let cfg = changelog::Config::default();
        let (mut log, _) = Changelog::open(&mut disk, cfg).map_err(|e| Failure::new(e.to_string()))?;
        let mut index = 1u64;
        let mut batches = 0u64;
        let started = Instant::now();
        while started.elapsed().as_secs_f64() < APPEND_SECONDS {
            let recs: Vec<LogRecord> = (0..batch)
                .map(|k| LogRecord {
                    index: index + k as u64,
                    term: 1,
                    kind: 0,
                    data: entry.clone(),
                })
                .collect();
            log.append(&mut disk, &recs).map_err(|e| Failure::new(e.to_string()))?;
            index += batch as u64;
            batches += 1;
        }
        let secs = started.elapsed().as_secs_f64();
        let entries = (index - 1) as f64;
        say(&format!(
            "  batch {batch:>4}: {:>9.0} entries/s  {:>7.0} fsyncs/s  {:>7.0} µs per batch",
            entries / secs,
            batches as f64 / secs,
            secs * 1e6 / batches as f64
        ));
        rows.push(json!({"batch": batch, "entries_per_s": entries / secs, "fsyncs_per_s": batches as f64 / secs}));
    }
    let probe = fsync_probe(dir)?;
    say(&format!(
        "  fsync probe (4 KiB append + fdatasync): p50 {:.0} µs, p99 {:.0} µs",
        probe.0, probe.1
    ));
    Ok(json!({"rows": rows, "fsync_probe_p50_us": probe.0, "fsync_probe_p99_us": probe.1}))
}

/// p50 and p99 µs of a 4 KiB append + fdatasync, the durable-write floor.
pub(crate) fn fsync_probe(dir: &std::path::Path) -> Result<(f64, f64), Failure> {
    let path: PathBuf = dir.join("fsync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
    let block = [0u8; 4096];
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        f.write_all(&block)
            .and_then(|_| f.sync_data())
            .map_err(|e| Failure::new(e.to_string()))?;
        times.push(t.elapsed());
    }
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Ok((us(times[times.len() / 2]), us(times[times.len() * 99 / 100])))
}
