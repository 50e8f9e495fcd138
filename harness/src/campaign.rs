//! `drift test`: deploy a cluster, drive a workload under faults, record
//! the history, check it, store it, say the verdict.
//!
//! Phases: setup (start nodes, wait for a leader) → main (workers issue
//! ops at the given rate while the nemesis applies its schedule) → heal
//! (every fault stopped, dead nodes restarted, wait for the replicas to
//! converge) → final reads → checks (the workload's checkers and the
//! digest checker) → store and summary. Every wait is bounded and a
//! watchdog bounds the whole run, so a hung run still ends with a verdict;
//! a failing teardown is reported beside the verdict, never instead of it.

use crate::backend::Backend;
use crate::cli::TestArgs;
use crate::fail::Failure;
use crate::local::{LocalCluster, LocalSpec};
use crate::nemesis::{self, Partitioner, Step};
use crate::recorder::Recorder;
use drift_checkers::checker::MEM_BYTES_DEFAULT;
use drift_checkers::history::{OpType, Process};
use drift_checkers::linear::model::ModelKind;
use drift_checkers::{check_all, registry, CheckContext, Checker, History, Verdict};
use drift_results::files::{ResultsFile, RunInfo, Versions};
use drift_results::store::{self, RunDir, Store};
use drift_results::{picture, time};
use drift_workloads::zkclient::ZkClient;
use drift_workloads::{Outcome, Rng, Workload};
use serde_json::{json, Value};
use std::io::{BufRead, Seek};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Setup and heal each get at most this long.
const PHASE_TIMEOUT: Duration = Duration::from_secs(45);
/// The whole run may take the time limit plus this much before the
/// watchdog ends it.
const WATCHDOG_SLACK: Duration = Duration::from_secs(240);

pub fn run(args: TestArgs) -> Result<i32, Failure> {
    let workload = Workload::parse(&args.workload, args.keys).ok_or_else(|| {
        Failure::new(format!(
            "unknown --workload `{}` (known: {})",
            args.workload,
            drift_workloads::workload::NAMES.join(", ")
        ))
    })?;
    let zookeeper = match args.target.as_str() {
        "drift" => false,
        "zookeeper" => true,
        other => return Err(Failure::new(format!("unknown --target `{other}` (drift or zookeeper)"))),
    };
    let kinds: Vec<String> = args
        .nemesis
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s != "none")
        .collect();
    if let Some(bad) = kinds.iter().find(|k| !nemesis::KINDS.contains(&k.as_str())) {
        return Err(Failure::new(format!(
            "unknown --nemesis `{bad}` (known: {})",
            nemesis::KINDS.join(", ")
        )));
    }
    if zookeeper {
        if !crate::local::zookeeper_installed() {
            return Err(Failure::new(
                "--target zookeeper needs Apache ZooKeeper: apt install zookeeper",
            ));
        }
        // ZooKeeper has no fault hooks, and on loopback its peers connect
        // from 127.0.0.1, so a per-link cut cannot name them
        if let Some(k) = kinds
            .iter()
            .find(|k| matches!(k.as_str(), "partition" | "diverge" | "clock"))
        {
            return Err(Failure::new(format!(
                "--nemesis {k} is not available on the zookeeper target (kill, pause and corrupt are)"
            )));
        }
    }
    if !["auto", "iptables", "proxies"].contains(&args.partitioner.as_str()) {
        return Err(Failure::new(format!(
            "--partitioner {}: expected auto, iptables or proxies",
            args.partitioner
        )));
    }
    if drift_keeper::DigestMode::parse(&args.digest).is_none() {
        return Err(Failure::new(format!(
            "--digest {}: expected off, incremental or full",
            args.digest
        )));
    }
    if args.concurrency == 0
        || args.concurrency > 1000
        || !args.rate.is_finite()
        || args.rate <= 0.0
        || args.time_limit == 0
    {
        return Err(Failure::new(
            "--concurrency (1..=1000), --rate and --time-limit must be positive",
        ));
    }
    let seed = args.seed.unwrap_or_else(|| {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ ((std::process::id() as u64) << 32)).next_u64()
    });
    let limit = Duration::from_secs(args.time_limit);
    let schedule: Vec<Step> = match &args.schedule {
        Some(s) => s.clone(),
        None => nemesis::schedule(
            &kinds,
            args.nodes,
            args.nemesis_interval * 1000,
            args.time_limit * 1000,
            seed,
        ),
    };
    let test_name = format!("{}-{}", workload.name(), args.target);
    let store = Store::new(&args.store);
    let run = store
        .create_run(&test_name)
        .map_err(|e| Failure::new(format!("{}: {e}", store.root().display())))?;
    let config = json!({
        "workload": workload.name(), "target": args.target, "nodes": args.nodes, "keys": args.keys,
        "concurrency": args.concurrency, "rate": args.rate, "time_limit_s": args.time_limit,
        "nemesis": kinds, "nemesis_interval_s": args.nemesis_interval, "quorum_reads": args.quorum_reads,
        "digest": args.digest, "port": args.port, "op_timeout_ms": args.op_timeout_ms,
        "session_timeout_ms": args.session_timeout_ms, "partitioner": args.partitioner,
    });
    println!("drift test  seed {seed}");
    println!("  {}", serde_json::to_string(&config).expect("json"));
    println!("  run dir {}", run.path.display());
    let mut info = RunInfo {
        test: test_name.clone(),
        kind: "test".into(),
        created_at: time::rfc3339(SystemTime::now()),
        seed: Some(seed),
        config: config.clone(),
        versions: Versions::current(env!("CARGO_PKG_VERSION"), option_env!("DRIFT_GIT_SHA")),
        source: None,
        hosts: Vec::new(),
        nemesis_schedule: schedule
            .iter()
            .map(|s| serde_json::to_value(s).expect("json"))
            .collect(),
    };
    write_run_json(&run, &info)?;

    let started = Instant::now();
    let token = format!("{:016x}", Rng::new(seed ^ 0x746f6b656e).next_u64());
    let partitioner =
        Partitioner::choose(&format!("{:x}", seed & 0xffff_ffff), &args.partitioner).map_err(Failure::new)?;
    let spec = LocalSpec {
        nodes: args.nodes,
        port: args.port,
        quorum_reads: args.quorum_reads,
        digest: &args.digest,
        token: &token,
        zookeeper,
        proxies: partitioner.needs_proxies() && kinds.iter().any(|k| k == "partition"),
    };
    let mut cluster: Box<dyn Backend> = Box::new(LocalCluster::new(&run.path, spec).map_err(Failure::new)?);
    info.hosts = cluster
        .ids()
        .into_iter()
        .map(|i| json!({"id": i, "client": cluster.client_addr(i).to_string()}))
        .collect();
    println!("  nodes on {}", cluster.name());
    if kinds.iter().any(|k| k == "partition") {
        println!("  partitions via {}", partitioner.name());
    }
    cluster.start_all().map_err(Failure::new)?;
    wait_ready(cluster.as_ref())?;

    let (recorder, handle) = Recorder::start(&run.history(), Instant::now())
        .map_err(|e| Failure::new(format!("{}: {e}", run.history().display())))?;
    let cluster = Arc::new(Mutex::new(cluster));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = spawn_monitor(cluster.clone(), recorder.clone(), stop.clone());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::new(e.to_string()))?;
    let hosts = cluster.lock().expect("cluster").connect_string();
    let op_timeout = Duration::from_millis(args.op_timeout_ms);
    let session_timeout = Duration::from_millis(args.session_timeout_ms);
    rt.block_on(setup_root(&hosts, workload, session_timeout, op_timeout))
        .map_err(Failure::new)?;

    // main phase
    let main_until = Instant::now() + limit;
    let workers: Vec<_> = (0..args.concurrency)
        .map(|w| {
            let (r, h) = (recorder.clone(), hosts.clone());
            let per_worker = Duration::from_secs_f64(args.concurrency as f64 / args.rate);
            rt.spawn(worker(
                w as u64,
                args.concurrency as u64,
                seed,
                workload,
                r,
                h,
                main_until,
                per_worker,
                session_timeout,
                op_timeout,
            ))
        })
        .collect();
    let applied = Arc::new(Mutex::new(Vec::<Step>::new()));
    let nem = {
        let (c, r, p, a, sched) = (
            cluster.clone(),
            recorder.clone(),
            Arc::new(partitioner),
            applied.clone(),
            schedule.clone(),
        );
        let s = stop.clone();
        let p2 = p.clone();
        (
            std::thread::spawn(move || run_schedule(&c, &r, &p, &a, sched, started, &s)),
            p2,
        )
    };
    let progress = spawn_progress(recorder.clone(), applied.clone(), stop.clone(), started);
    let watchdog_deadline = Instant::now() + limit + WATCHDOG_SLACK;
    for w in workers {
        let _ = rt.block_on(async { tokio::time::timeout(limit + op_timeout * 3 + Duration::from_secs(5), w).await });
    }
    let (nem_thread, partitioner) = nem;
    let _ = nem_thread.join();

    // heal and converge
    println!("\n  healing: every fault stopped, dead nodes restarted");
    let heal_note = heal_all(&cluster, &recorder, &partitioner);
    let converged = wait_converged(&cluster, watchdog_deadline);
    recorder.event("healed", json!({"converged": converged.is_ok(), "note": heal_note}));
    // final reads through a fresh client
    let finals = workload.final_ops();
    let settle = workload.settle_before_final(session_timeout);
    if !settle.is_zero() {
        println!(
            "  waiting {:.1}s for abandoned sessions to expire",
            settle.as_secs_f64()
        );
        std::thread::sleep(settle);
    }
    if !finals.is_empty() {
        let r = recorder.clone();
        let h = hosts.clone();
        let _ = rt.block_on(async move {
            tokio::time::timeout(
                Duration::from_secs(60),
                final_phase(workload, r, h, session_timeout, op_timeout * 5, args.concurrency as u64),
            )
            .await
        });
    }
    let dgst = final_digests(&cluster);
    recorder.event(
        "final-digests",
        json!({
            "converged": converged.is_ok(),
            "note": converged.as_ref().err(),
            "nodes": dgst.iter().map(|(n, a, d)| json!({"node": n, "applied_index": a, "digest": d})).collect::<Vec<_>>(),
        }),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = progress.join();
    let _ = monitor.join();
    drop(rt);

    // teardown: reported, never in place of the verdict
    let mut teardown = Vec::new();
    if let Ok(mut c) = cluster.lock() {
        c.stop_all();
    }
    if let Some(e) = partitioner.teardown() {
        teardown.push(e);
    }
    drop(recorder);
    let ops = handle.finish().map_err(|e| Failure::new(format!("history: {e}")))?;
    info.nemesis_schedule = applied
        .lock()
        .map(|a| a.iter().map(|s| serde_json::to_value(s).expect("json")).collect())
        .unwrap_or_default();
    write_run_json(&run, &info)?;

    // checks
    let history = History::load(&run.history()).map_err(|e| Failure::new(e.to_string()))?;
    let mut checkers: Vec<Box<dyn Checker>> = Vec::new();
    for (name, model) in checker_names(&workload, &args.target) {
        checkers.push(registry::build(name, model.and_then(ModelKind::parse)).map_err(Failure::new)?);
    }
    let ctx = CheckContext::new(Some(Duration::from_secs(args.check_budget_s)), MEM_BYTES_DEFAULT);
    let check_started = Instant::now();
    let composed = check_all(&checkers, &history, &ctx).map_err(|e| Failure::new(e.to_string()))?;
    let artifacts = write_pictures(&run, &composed)?;
    let results = ResultsFile {
        verdict: composed.verdict,
        history: run.history().display().to_string(),
        ops: history.ops.len() as u64,
        operations: history.operations.len() as u64,
        keys: history.key_count(),
        checked_at: time::rfc3339(SystemTime::now()),
        elapsed_ms: check_started.elapsed().as_secs_f64() * 1e3,
        checkers: composed.results.clone(),
        artifacts,
    };
    run.write_json(store::RESULTS_JSON, &results)
        .map_err(|e| Failure::new(e.to_string()))?;
    let _ = store.set_latest(&run);
    summary(&results, ops, started.elapsed(), &teardown, &run, seed);
    Ok(composed.verdict.exit_code())
}

fn write_run_json(run: &RunDir, info: &RunInfo) -> Result<(), Failure> {
    run.write_json(store::RUN_JSON, info)
        .map(|_| ())
        .map_err(|e| Failure::new(format!("{}: {e}", run.run_json().display())))
}

fn wait_ready(cluster: &dyn Backend) -> Result<(), Failure> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while Instant::now() < deadline {
        let up = cluster
            .ids()
            .iter()
            .all(|&i| cluster.four(i, "ruok").as_deref() == Some("imok"));
        if up && cluster.leader().is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Failure::new(format!(
        "the cluster did not elect a leader within {}s (logs under the run dir)",
        PHASE_TIMEOUT.as_secs()
    )))
}

async fn setup_root(hosts: &str, workload: Workload, session: Duration, op: Duration) -> Result<(), String> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        match ZkClient::connect(hosts, workload, session, op).await {
            Ok(c) => match c.setup().await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {}
            },
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn record_invoke(r: &Recorder, p: u64, f: &str, value: Value, key: Option<String>) {
    r.record(Process::Client(p), OpType::Invoke, f, value, key, None, None);
}

fn record_outcome(r: &Recorder, p: u64, f: &str, key: &Option<String>, o: &Outcome) {
    let (kind, value, err) = match o {
        Outcome::Ok(v) => (OpType::Ok, v.clone(), None),
        Outcome::Fail(e) => (OpType::Fail, Value::Null, Some(e.clone())),
        Outcome::Info(e) => (OpType::Info, Value::Null, Some(e.clone())),
    };
    r.record(Process::Client(p), kind, f, value, key.clone(), None, err);
}

#[allow(clippy::too_many_arguments)]
async fn worker(
    w: u64,
    stride: u64,
    seed: u64,
    workload: Workload,
    r: Recorder,
    hosts: String,
    until: Instant,
    every: Duration,
    session: Duration,
    op_timeout: Duration,
) {
    let mut rng = Rng::new(Rng::derive(seed, &format!("worker-{w}")));
    let mut process = w;
    let mut unique = 0u64;
    let mut client: Option<ZkClient> = None;
    // spread the workers' first ops over one period
    let mut next = Instant::now() + every.mul_f64(rng.unit());
    while Instant::now() < until {
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        }
        next = next.max(Instant::now()) + every.mul_f64(0.5 + rng.unit());
        if client.is_none() {
            // each session's fate (closed, or left to expire) is drawn
            // when it starts; only `ephemeral` sessions ever end on purpose
            let detached = workload == Workload::Ephemeral && rng.below(2) == 1;
            client = ZkClient::connect_session(&hosts, workload, session, op_timeout, detached)
                .await
                .ok();
            if client.is_none() {
                continue;
            }
        }
        let mut op = workload.next(&mut rng, w, &mut unique);
        let c = client.as_ref().expect("connected");
        if op.f == "close" && c.detached() {
            op.f = "expire";
        }
        record_invoke(&r, process, op.f, op.value.clone(), op.key.clone());
        let ends = workload.ends_session(op.f);
        let outcome = if ends {
            client.take().expect("connected").end_session().await
        } else {
            c.invoke(&op).await
        };
        record_outcome(&r, process, op.f, &op.key, &outcome);
        if ends || matches!(outcome, Outcome::Info(_)) {
            // a new session, or the process may still be executing that
            // op: retire the process either way
            process += stride;
            client = None;
        }
    }
    // the last session ends the way the others do
    if let Some(c) = client.filter(|_| workload == Workload::Ephemeral) {
        let f = if c.detached() { "expire" } else { "close" };
        record_invoke(&r, process, f, Value::Null, None);
        let outcome = c.end_session().await;
        record_outcome(&r, process, f, &None, &outcome);
    }
}

async fn final_phase(
    workload: Workload,
    r: Recorder,
    hosts: String,
    session: Duration,
    op_timeout: Duration,
    first_process: u64,
) {
    let mut process = 1_000_000 + first_process;
    for op in workload.final_ops() {
        let mut done = false;
        for _ in 0..5 {
            let Ok(c) = ZkClient::connect(&hosts, workload, session, op_timeout).await else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            record_invoke(&r, process, op.f, op.value.clone(), op.key.clone());
            let o = c.invoke(&op).await;
            record_outcome(&r, process, op.f, &op.key, &o);
            process += 1;
            if matches!(o, Outcome::Ok(_)) {
                done = true;
                break;
            }
        }
        if !done {
            r.event("final-op-failed", json!({"f": op.f, "key": op.key}));
        }
    }
}

fn run_schedule(
    cluster: &Mutex<Box<dyn Backend>>,
    r: &Recorder,
    p: &Partitioner,
    applied: &Mutex<Vec<Step>>,
    schedule: Vec<Step>,
    started: Instant,
    stop: &AtomicBool,
) {
    for mut step in schedule {
        if !sleep_until(started + Duration::from_millis(step.start_ms), stop, cluster, r) {
            return;
        }
        step.applied = apply(cluster, p, &step);
        r.event(
            &format!("start-{}", step.fault),
            json!({"nodes": step.nodes, "variant": step.variant, "applied": step.applied}),
        );
        if let Ok(mut a) = applied.lock() {
            a.push(step.clone());
        }
        if !sleep_until(started + Duration::from_millis(step.stop_ms), stop, cluster, r) {
            return;
        }
        let healed = stop_fault(cluster, p, &step);
        r.event(
            &format!("stop-{}", step.fault),
            json!({"nodes": step.nodes, "healed": healed}),
        );
    }
}

/// Sleeps until `t`, watching for nodes that exit on their own; false if
/// the run is stopping.
fn sleep_until(t: Instant, stop: &AtomicBool, cluster: &Mutex<Box<dyn Backend>>, r: &Recorder) -> bool {
    while Instant::now() < t {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        if let Ok(mut c) = cluster.lock() {
            for e in c.exits() {
                r.event("node-exited", json!({"node": e.node, "code": e.code}));
            }
        }
        std::thread::sleep(Duration::from_millis(50).min(t.saturating_duration_since(Instant::now())));
    }
    true
}

fn apply(cluster: &Mutex<Box<dyn Backend>>, p: &Partitioner, step: &Step) -> String {
    let Ok(mut c) = cluster.lock() else {
        return "cluster lock poisoned".into();
    };
    match step.fault.as_str() {
        "partition" => p.cut(c.as_ref(), &step.links),
        "kill" => {
            for &n in &step.nodes {
                c.kill(n);
            }
            format!("killed {:?}", step.nodes)
        }
        "pause" => {
            for &n in &step.nodes {
                c.pause(n);
            }
            format!("paused {:?}", step.nodes)
        }
        "corrupt" => {
            let n = step.nodes[0];
            c.kill(n);
            let (mode, pick) = step.variant.split_once(':').unwrap_or(("flip", "0"));
            let pick: u64 = pick.parse().unwrap_or(0);
            let what = match mode {
                "wipe" => c.wipe(n).map(|_| format!("wiped node {n}")),
                "truncate" => c.corrupt(n, pick & !1),
                _ => c.corrupt(n, pick | 1),
            };
            what.unwrap_or_else(|e| e)
        }
        "diverge" => {
            let leader = c.leader();
            let n = step.nodes[0];
            let target = if Some(n) == leader {
                c.ids()
                    .into_iter()
                    .find(|&i| Some(i) != leader && c.is_up(i))
                    .unwrap_or(n)
            } else {
                n
            };
            match c.admin(target, "diverge") {
                Ok(a) => format!("diverge armed on node {target}: {a}"),
                Err(e) => format!("diverge on node {target} failed: {e}"),
            }
        }
        "clock" => {
            let n = step.nodes[0];
            c.admin(n, &format!("clock {}", step.variant)).unwrap_or_else(|e| e)
        }
        other => format!("unknown fault {other}"),
    }
}

fn stop_fault(cluster: &Mutex<Box<dyn Backend>>, p: &Partitioner, step: &Step) -> String {
    let Ok(mut c) = cluster.lock() else {
        return "cluster lock poisoned".into();
    };
    match step.fault.as_str() {
        "partition" => {
            p.heal(c.as_ref());
            "healed".into()
        }
        "kill" | "corrupt" | "diverge" => {
            let mut out = Vec::new();
            for i in c.ids() {
                if !c.is_up(i) {
                    out.push(match c.start(i) {
                        Ok(()) => format!("restarted {i}"),
                        Err(e) => e,
                    });
                }
            }
            out.join("; ")
        }
        "pause" => {
            for &n in &step.nodes {
                c.resume(n);
            }
            "resumed".into()
        }
        "clock" => c.admin(step.nodes[0], "clock 0").unwrap_or_else(|e| e),
        _ => String::new(),
    }
}

/// Stops every fault and brings every node back; a node that will not
/// start (a corruption it refuses) is wiped and rejoins from its peers.
fn heal_all(cluster: &Mutex<Box<dyn Backend>>, r: &Recorder, p: &Partitioner) -> String {
    let Ok(mut c) = cluster.lock() else {
        return "cluster lock poisoned".into();
    };
    p.heal(c.as_ref());
    let mut notes = Vec::new();
    for i in c.ids() {
        c.resume(i);
        if c.is_up(i) {
            let _ = c.admin(i, "clock 0");
        } else if let Err(e) = c.start(i) {
            notes.push(e);
        }
    }
    drop(c);
    // a node that exits right away refused its data: wipe and rejoin
    std::thread::sleep(Duration::from_secs(2));
    if let Ok(mut c) = cluster.lock() {
        for e in c.exits() {
            r.event("node-exited", json!({"node": e.node, "code": e.code}));
            if e.code != Some(keeper_exit_code()) {
                let _ = c.wipe(e.node);
                notes.push(format!(
                    "node {} refused to start (exit {:?}): wiped, rejoining from peers",
                    e.node, e.code
                ));
            }
            let _ = c.start(e.node);
        }
    }
    notes.join("; ")
}

fn keeper_exit_code() -> i32 {
    drift_node::keeper_node::DIGEST_ABORT_EXIT
}

/// Waits until every node is up and reports the same applied index.
fn wait_converged(cluster: &Mutex<Box<dyn Backend>>, watchdog: Instant) -> Result<(), String> {
    let deadline = (Instant::now() + PHASE_TIMEOUT).min(watchdog);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(c) = cluster.lock() {
            let applied: Vec<Option<String>> = c.ids().iter().map(|&i| c.applied_index(i)).collect();
            last = format!("{applied:?}");
            if c.leader().is_some() && applied.iter().all(|a| a.is_some() && *a == applied[0]) {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("replicas did not converge: applied indices {last}"))
}

/// The checkers a run of `workload` on `target` is judged by: ZooKeeper
/// keeps no tree digest, so the digest checker has nothing to read there.
pub fn checker_names(workload: &drift_workloads::Workload, target: &str) -> Vec<(&'static str, Option<&'static str>)> {
    workload
        .checkers()
        .into_iter()
        .filter(|(name, _)| target != "zookeeper" || *name != "digest")
        .collect()
}

/// (node, applied index, digest) of every node that answers.
fn final_digests(cluster: &Mutex<Box<dyn Backend>>) -> Vec<(u64, String, String)> {
    let Ok(c) = cluster.lock() else { return vec![] };
    c.ids()
        .into_iter()
        .filter_map(|i| c.digest(i).map(|(a, d)| (i, a, d)))
        .collect()
}

/// Tails node logs: leader changes, digest aborts and divergences become
/// nemesis events on the history's timeline.
fn spawn_monitor(
    cluster: Arc<Mutex<Box<dyn Backend>>>,
    r: Recorder,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let logs: Vec<(u64, std::path::PathBuf)> = cluster.lock().map(|c| c.log_files()).unwrap_or_default();
        let mut offsets = vec![0u64; logs.len()];
        loop {
            let last_pass = stop.load(Ordering::Relaxed);
            for (k, (node, path)) in logs.iter().enumerate() {
                let Ok(mut f) = std::fs::File::open(path) else { continue };
                if f.seek(std::io::SeekFrom::Start(offsets[k])).is_err() {
                    continue;
                }
                let mut reader = std::io::BufReader::new(f);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    if !line.ends_with('\n') {
                        break;
                    }
                    offsets[k] += line.len() as u64;
                    observe(*node, &line, &r);
                    line.clear();
                }
            }
            if last_pass {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

fn observe(node: u64, line: &str, r: &Recorder) {
    let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
        return;
    };
    let index = v["log_index"].as_u64().unwrap_or(0);
    match v["event"].as_str() {
        Some("digest_mismatch") => {
            r.event(
                "digest-abort",
                json!({"node": node, "log_index": index, "phase": v["phase"], "request": v["request"]}),
            );
        }
        Some("diverge_applied") => {
            r.event("diverge-applied", json!({"node": node, "log_index": index}));
        }
        Some("role") if v["role"] == "Leader" => r.event("leader", json!({"node": node, "term": v["term"]})),
        Some("snapshot_installed") => r.event("snapshot-installed", json!({"node": node, "index": v["index"]})),
        Some("changelog_torn_tail") => r.event("torn-tail-repaired", json!({"node": node, "file": v["file"]})),
        _ => {}
    }
}

fn spawn_progress(
    r: Recorder,
    applied: Arc<Mutex<Vec<Step>>>,
    stop: Arc<AtomicBool>,
    started: Instant,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut last = 0u64;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_secs(1));
            let c = &r.counts;
            let invoked = c.invoked.load(Ordering::Relaxed);
            let now_ms = started.elapsed().as_millis() as u64;
            let active: Vec<String> = applied
                .lock()
                .map(|a| {
                    a.iter()
                        .filter(|s| s.start_ms <= now_ms && now_ms < s.stop_ms)
                        .map(|s| format!("{} {:?}", s.fault, s.nodes))
                        .collect()
                })
                .unwrap_or_default();
            eprint!(
                "\r  [{:>6.1}s] ops {invoked} ({}/s)  ok {}  fail {}  info {}  faults: {}        ",
                started.elapsed().as_secs_f64(),
                invoked - last,
                c.ok.load(Ordering::Relaxed),
                c.fail.load(Ordering::Relaxed),
                c.info.load(Ordering::Relaxed),
                if active.is_empty() {
                    "none".to_string()
                } else {
                    active.join(", ")
                }
            );
            last = invoked;
        }
        eprintln!();
    })
}

fn write_pictures(run: &RunDir, composed: &drift_checkers::Composed) -> Result<Vec<String>, Failure> {
    let mut out = Vec::new();
    for r in composed.results.iter().filter(|r| r.checker == "linearizable") {
        let Ok(report) = serde_json::from_value::<drift_checkers::linear::LinearReport>(r.details.clone()) else {
            continue;
        };
        for (n, v) in report.violations.iter().enumerate() {
            let name = format!("linearizable-{}.html", n + 1);
            run.write_file(
                &name,
                picture::render(v, &run.history().display().to_string()).as_bytes(),
            )
            .map_err(|e| Failure::new(e.to_string()))?;
            out.push(name);
        }
    }
    Ok(out)
}

fn summary(results: &ResultsFile, ops: u64, took: Duration, teardown: &[String], run: &RunDir, seed: u64) {
    println!(
        "\n  {} history lines, {} operations, {:.1}s",
        ops,
        results.operations,
        took.as_secs_f64()
    );
    for c in &results.checkers {
        let extra = match c.checker.as_str() {
            "stats" => format!(
                "ok {} fail {} info {}",
                c.details["ok"], c.details["fail"], c.details["info"]
            ),
            "digest" => format!("aborts {} problems {}", c.details["aborts"], c.details["problems"]),
            "linearizable" => format!("{} keys, {} invalid", c.details["keys"], c.details["keys_invalid"]),
            _ => String::new(),
        };
        println!("  checker {:<13} {:<8} {extra}", c.checker, c.verdict.as_str());
        if let Some(reason) = &c.reason {
            println!("          {reason}");
        }
    }
    for t in teardown {
        println!("  teardown problem (verdict unaffected): {t}");
    }
    for a in &results.artifacts {
        println!("  picture {}", run.path.join(a).display());
    }
    println!("verdict  {}", results.verdict.as_str().to_uppercase());
    println!("results  {}", run.results_json().display());
    if results.verdict != Verdict::Valid {
        println!("reproduce: drift replay {}   (seed {seed})", run.path.display());
    }
}

/// `drift replay <run dir>`: the same campaign again — its seed, options
/// and nemesis schedule as applied — into a new run beside it.
pub fn replay(dir: &std::path::Path) -> Result<i32, Failure> {
    let stored = RunDir::open(dir).map_err(Failure::new)?;
    let bytes =
        std::fs::read(stored.run_json()).map_err(|e| Failure::new(format!("{}: {e}", stored.run_json().display())))?;
    let info: RunInfo =
        serde_json::from_slice(&bytes).map_err(|e| Failure::new(format!("{}: {e}", stored.run_json().display())))?;
    if info.kind != "test" {
        return Err(Failure::new(format!(
            "{}: not a campaign run (kind {:?}); re-check it with drift check",
            dir.display(),
            info.kind
        )));
    }
    let c = &info.config;
    let get = |k: &str| {
        c.get(k)
            .ok_or_else(|| Failure::new(format!("{}: config has no `{k}`", stored.run_json().display())))
    };
    let num = |k: &str| {
        get(k).and_then(|v| {
            v.as_u64()
                .ok_or_else(|| Failure::new(format!("config `{k}` is not a number")))
        })
    };
    let text = |k: &str| {
        get(k).and_then(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| Failure::new(format!("config `{k}` is not text")))
        })
    };
    let mut schedule = Vec::new();
    for s in &info.nemesis_schedule {
        let mut step: Step =
            serde_json::from_value(s.clone()).map_err(|e| Failure::new(format!("nemesis schedule: {e}")))?;
        step.applied.clear();
        schedule.push(step);
    }
    let store_root = dir
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| "store".into());
    let args = TestArgs {
        workload: text("workload")?,
        target: text("target")?,
        nodes: num("nodes")?,
        keys: num("keys")? as u32,
        concurrency: num("concurrency")? as usize,
        rate: get("rate")?.as_f64().unwrap_or(100.0),
        time_limit: num("time_limit_s")?,
        nemesis: get("nemesis")?
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
        nemesis_interval: num("nemesis_interval_s")?,
        seed: info.seed,
        quorum_reads: get("quorum_reads")?.as_bool().unwrap_or(false),
        digest: text("digest")?,
        port: num("port")? as u16,
        op_timeout_ms: num("op_timeout_ms")?,
        session_timeout_ms: c.get("session_timeout_ms").and_then(Value::as_u64).unwrap_or(4000),
        partitioner: c
            .get("partitioner")
            .and_then(Value::as_str)
            .unwrap_or("auto")
            .to_string(),
        check_budget_s: 120,
        store: store_root,
        schedule: Some(schedule),
    };
    println!("replaying {} (seed {:?})", dir.display(), info.seed);
    run(args)
}
