//! `drift test`: deploy a cluster, drive a workload under faults, record
//! the history, check it, store it, say the verdict.
//!
//! Phases: setup (start nodes, wait for a leader) → main (workers issue
//! ops at the given rate while the nemesis applies its schedule) → heal
//! (every fault stopped, dead nodes restarted, wait for the replicas to
//! converge) → final reads → checks (the workload's checkers and the
//! digest checker) → store and summary. Every phase is bounded (the
//! schedule ends within the time limit; healing, convergence, the final
//! ops and the checks have deadlines of their own), so a hung run still
//! ends with a verdict; a failing teardown is reported beside the verdict,
//! never instead of it.

use crate::backend::{Backend, Damage};
use crate::cli::TestArgs;
use crate::fail::Failure;
use crate::local::{LocalCluster, LocalSpec};
use crate::nemesis::{self, Partitioner, Step};
use crate::recorder::Recorder;
use drift_checkers::checker::MEM_BYTES_DEFAULT;
use drift_checkers::history::{OpType, Process};
use drift_checkers::linear::model::ModelKind;
use drift_checkers::perf::{PerfSummary, Span};
use drift_checkers::{check_all, registry, CheckContext, Checker, History, Verdict};
use drift_results::files::{ResultsFile, RunInfo, Versions};
use drift_results::store::{self, RunDir, Store};
use drift_results::{picture, report, time};
use drift_workloads::zkclient::{ClientSpec, ZkClient};
use drift_workloads::{Outcome, Rng, Workload};
use serde_json::{json, Value};
use std::io::{BufRead, Seek};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Bounds of --rate (ops/s over all clients) and of the time arguments.
const RATE_MIN: f64 = 0.01;
const RATE_MAX: f64 = 1e6;
const TIME_LIMIT_MAX_S: u64 = 7 * 24 * 3600;
/// Setup and heal each get at most this long.
const PHASE_TIMEOUT: Duration = Duration::from_secs(45);
/// The final reads get at most this long.
const FINAL_PHASE_TIMEOUT: Duration = Duration::from_secs(60);
/// Failed attempts a final operation gets.
const FINAL_TRIES: u32 = 5;
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
        if !crate::local::zookeeper_installed() {
            return Err(Failure::new(
                "--target zookeeper needs Apache ZooKeeper: apt install zookeeper",
            ));
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
        || !(RATE_MIN..=RATE_MAX).contains(&args.rate)
        || !(1..=TIME_LIMIT_MAX_S).contains(&args.time_limit)
        || !(1..=TIME_LIMIT_MAX_S).contains(&args.nemesis_interval)
    {
        return Err(Failure::new(format!(
            "--concurrency must be in 1..=1000, --rate in {RATE_MIN}..={RATE_MAX}, --time-limit and --nemesis-interval in 1..={TIME_LIMIT_MAX_S} seconds"
        )));
    }
    if !(1..=crate::local::NODES_MAX).contains(&args.nodes) {
        return Err(Failure::new(format!(
            "--nodes must be in 1..={}",
            crate::local::NODES_MAX
        )));
    }
    crate::cluster::check_port(args.port, crate::local::PORTS_USED)?;
    if !(1..=600_000).contains(&args.op_timeout_ms) || !(1..=600_000).contains(&args.session_timeout_ms) {
        return Err(Failure::new(
            "--op-timeout-ms and --session-timeout-ms must be in 1..=600000",
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
    let checkers_used = checker_names(&workload, zookeeper);
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
        "check_budget_s": args.check_budget_s,
        "checkers": checkers_used.iter().map(|(name, _)| name).collect::<Vec<_>>(),
    });
    out!("drift test  seed {seed}");
    out!("  {}", serde_json::to_string(&config).expect("json"));
    out!("  run dir {}", run.path.display());
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

    let run_started = Instant::now();
    // not derived from the seed: a seed is printed and stored, a token
    // must not be guessable by whoever reads them
    let token = drift_node::peer_auth::new_secret().map_err(|e| Failure::new(format!("a fault token: {e}")))?;
    let partitions = kinds.iter().any(|k| k == "partition");
    // removes its iptables chain when dropped, on every way out of here
    let partitioner = if partitions {
        Partitioner::choose(&format!("{:x}", seed & 0xffff_ffff), &args.partitioner).map_err(Failure::new)?
    } else {
        Partitioner::Unused
    };
    let spec = LocalSpec {
        nodes: args.nodes,
        port: args.port,
        quorum_reads: args.quorum_reads,
        digest: &args.digest,
        token: &token,
        zookeeper,
        proxies: partitioner.needs_proxies(),
    };
    let mut cluster: Box<dyn Backend> = Box::new(LocalCluster::new(&run.path, spec).map_err(Failure::new)?);
    info.hosts = cluster
        .ids()
        .into_iter()
        .map(|i| json!({"id": i, "client": cluster.client_addr(i).to_string()}))
        .collect();
    out!("  nodes on {}", cluster.name());
    if partitions {
        out!("  partitions via {}", partitioner.name());
    }
    cluster.start_all().map_err(Failure::new)?;
    wait_ready(cluster.as_ref())?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::new(e.to_string()))?;
    let op_timeout = Duration::from_millis(args.op_timeout_ms);
    let session_timeout = Duration::from_millis(args.session_timeout_ms);
    let spec = ClientSpec {
        hosts: cluster.connect_string(),
        workload,
        session_timeout,
        op_timeout,
        // the drift keeper makes reads fresh server-side; ZooKeeper needs
        // the client to sync first
        sync_reads: zookeeper && args.quorum_reads,
    };
    rt.block_on(setup_root(&spec)).map_err(Failure::new)?;

    // main phase: history times, the fault schedule and the workers all
    // count from this instant
    let started = Instant::now();
    let (recorder, handle) = Recorder::start(&run.history(), started)
        .map_err(|e| Failure::new(format!("{}: {e}", run.history().display())))?;
    let cluster = Arc::new(Mutex::new(cluster));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = spawn_monitor(cluster.clone(), recorder.clone(), stop.clone());
    let main_until = started + limit;
    let workers: Vec<_> = (0..args.concurrency)
        .map(|w| {
            let per_worker = Duration::from_secs_f64(args.concurrency as f64 / args.rate);
            let pace = Pace {
                stride: args.concurrency as u64,
                seed,
                until: main_until,
                every: per_worker,
            };
            rt.spawn(worker(w as u64, pace, recorder.clone(), spec.clone()))
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
    let watchdog_deadline = started + limit + WATCHDOG_SLACK;
    // one deadline for all workers: an op past it is cut off (its
    // invocation stays in the history without a completion, i.e. info)
    let workers_deadline = tokio::time::Instant::from_std(main_until + op_timeout * 3 + Duration::from_secs(5));
    for w in workers {
        let abort = w.abort_handle();
        if rt
            .block_on(async { tokio::time::timeout_at(workers_deadline, w).await })
            .is_err()
        {
            abort.abort();
        }
    }
    let (nem_thread, partitioner) = nem;
    let _ = nem_thread.join();

    // heal and converge
    out!("\n  healing: every fault stopped, dead nodes restarted");
    let heal_note = heal_all(&cluster, &recorder, &partitioner);
    let converged = wait_converged(&cluster, watchdog_deadline);
    recorder.event("healed", json!({"converged": converged.is_ok(), "note": heal_note}));
    // final reads through a fresh client
    let finals = workload.final_ops();
    let settle = workload.settle_before_final(session_timeout);
    if !settle.is_zero() {
        out!(
            "  waiting {:.1}s for abandoned sessions to expire",
            settle.as_secs_f64()
        );
        std::thread::sleep(settle);
    }
    if !finals.is_empty() {
        let r = recorder.clone();
        let final_spec = ClientSpec {
            op_timeout: op_timeout * 5,
            ..spec.clone()
        };
        let finished = rt.block_on(async move {
            tokio::time::timeout(FINAL_PHASE_TIMEOUT, final_phase(final_spec, r, args.concurrency as u64)).await
        });
        if finished.is_err() {
            recorder.event("final-phase-timeout", json!({"after_s": FINAL_PHASE_TIMEOUT.as_secs()}));
        }
    }
    // the final phase wrote too: compare digests once the nodes agree again
    let converged = wait_converged(&cluster, watchdog_deadline);
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
    for (name, model) in checkers_used {
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
    // the report is a view of what is stored: failing to write it is
    // said, and the verdict stands
    match report::write(&run, &history, Some(&info), &results) {
        Ok(_) => {}
        Err(e) => teardown.push(format!("{}: cannot write: {e}", run.report_html().display())),
    }
    let _ = store.set_latest(&run);
    summary(&results, ops, run_started.elapsed(), &teardown, &run, seed);
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

async fn setup_root(spec: &ClientSpec) -> Result<(), String> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        match ZkClient::connect(spec, false).await {
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

/// How a worker paces itself.
#[derive(Clone, Copy)]
struct Pace {
    /// Process ids of one worker are `w`, `w + stride`, ….
    stride: u64,
    seed: u64,
    until: Instant,
    /// Mean time between two of its ops.
    every: Duration,
}

async fn worker(w: u64, pace: Pace, r: Recorder, spec: ClientSpec) {
    let workload = spec.workload;
    let mut rng = Rng::new(Rng::derive(pace.seed, &format!("worker-{w}")));
    let mut process = w;
    let mut unique = 0u64;
    let mut client: Option<ZkClient> = None;
    // spread the workers' first ops over one period
    let mut next = Instant::now() + pace.every.mul_f64(rng.unit());
    while Instant::now() < pace.until {
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        }
        next = next.max(Instant::now()) + pace.every.mul_f64(0.5 + rng.unit());
        if client.is_none() {
            // each session's fate (closed, or left to expire) is drawn
            // when it starts; only `ephemeral` sessions ever end on purpose
            let detached = workload == Workload::Ephemeral && rng.below(2) == 1;
            client = ZkClient::connect(&spec, detached).await.ok();
            if client.is_none() {
                continue;
            }
        }
        let mut op = workload.next(&mut rng, w, &mut unique);
        let c = client.as_ref().expect("connected");
        let ends = workload.ends_session(op.f);
        if ends {
            op.f = c.end_op();
        }
        record_invoke(&r, process, op.f, op.value.clone(), op.key.clone());
        let outcome = if ends {
            client.take().expect("connected").end_session().await
        } else {
            c.invoke(&op).await
        };
        record_outcome(&r, process, op.f, &op.key, &outcome);
        if ends || matches!(outcome, Outcome::Info(_)) {
            // a new session, or the process may still be executing that
            // op: retire the process either way
            process += pace.stride;
            client = None;
        }
    }
    // the last session ends the way the others do
    if let Some(c) = client.filter(|_| workload == Workload::Ephemeral) {
        let f = c.end_op();
        record_invoke(&r, process, f, Value::Null, None);
        let outcome = c.end_session().await;
        record_outcome(&r, process, f, &None, &outcome);
    }
}

/// The workload's final operations through fresh clients, each tried a few
/// times; a drain is repeated until it comes back empty.
async fn final_phase(spec: ClientSpec, r: Recorder, first_process: u64) {
    let workload = spec.workload;
    let mut process = 1_000_000 + first_process;
    for op in workload.final_ops() {
        let mut failures = 0;
        while failures < FINAL_TRIES {
            let Ok(c) = ZkClient::connect(&spec, false).await else {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            record_invoke(&r, process, op.f, op.value.clone(), op.key.clone());
            let o = c.invoke(&op).await;
            record_outcome(&r, process, op.f, &op.key, &o);
            process += 1;
            match &o {
                Outcome::Ok(v) if workload.drains(op.f) && v.as_array().is_some_and(|a| !a.is_empty()) => {}
                Outcome::Ok(_) => break,
                _ => failures += 1,
            }
        }
        if failures == FINAL_TRIES {
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
                "truncate" => c.corrupt(n, Damage::Truncate, pick),
                _ => c.corrupt(n, Damage::Flip, pick),
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

/// The checkers a run is judged by: the workload's, and the digest
/// checker where the nodes keep a tree digest (not on ZooKeeper).
fn checker_names(workload: &drift_workloads::Workload, zookeeper: bool) -> Vec<(&'static str, Option<&'static str>)> {
    let mut names = workload.checkers();
    if !zookeeper {
        names.push(("digest", None));
    }
    names
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
    out!(
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
            "perf" => perf_line(results),
            "linearizable" => format!("{} keys, {} invalid", c.details["keys"], c.details["keys_invalid"]),
            _ => String::new(),
        };
        out!("  checker {:<13} {:<8} {extra}", c.checker, c.verdict.as_str());
        if let Some(reason) = &c.reason {
            out!("          {reason}");
        }
    }
    for t in teardown {
        out!("  teardown problem (verdict unaffected): {t}");
    }
    for a in &results.artifacts {
        out!("  picture {}", run.path.join(a).display());
    }
    out!("verdict  {}", results.verdict.as_str().to_uppercase());
    out!("results  {}", run.results_json().display());
    if run.report_html().is_file() {
        out!("report   {}", run.report_html().display());
    }
    if results.verdict != Verdict::Valid {
        out!("reproduce: drift replay {}   (seed {seed})", run.path.display());
    }
}

/// The perf checker's headline: succeeded ops per second and the
/// latency quantiles of all operations, then the same per fault window.
fn perf_line(results: &ResultsFile) -> String {
    let Some(perf) = PerfSummary::from_results(&results.checkers) else {
        return String::new();
    };
    let span = |s: &Span| {
        let q = s.all.latency_ms;
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        format!(
            "{:.0} ok/s p50 {} p99 {} ms",
            s.all.ok_per_s,
            ms(q.map(|q| q.p50)),
            ms(q.map(|q| q.p99))
        )
    };
    let mut line = span(&perf.run);
    for w in &perf.windows {
        line.push_str(&format!("; {}: {}", w.window, span(&w.span)));
    }
    line
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
    // a number that must fit its field: a tampered run.json is refused,
    // not wrapped
    fn fit<T: TryFrom<u64>>(k: &str, v: u64) -> Result<T, Failure> {
        T::try_from(v).map_err(|_| Failure::new(format!("config `{k}` = {v} is out of range")))
    }
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
    // <store>/<test>/<run>, with `latest` and relative paths resolved
    let real = dir
        .canonicalize()
        .map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let store_root = real
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| "store".into());
    let args = TestArgs {
        workload: text("workload")?,
        target: text("target")?,
        nodes: num("nodes")?,
        keys: fit("keys", num("keys")?)?,
        concurrency: fit("concurrency", num("concurrency")?)?,
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
        port: fit("port", num("port")?)?,
        op_timeout_ms: num("op_timeout_ms")?,
        session_timeout_ms: c.get("session_timeout_ms").and_then(Value::as_u64).unwrap_or(4000),
        partitioner: c
            .get("partitioner")
            .and_then(Value::as_str)
            .unwrap_or("auto")
            .to_string(),
        check_budget_s: c.get("check_budget_s").and_then(Value::as_u64).unwrap_or(120),
        store: store_root,
        schedule: Some(schedule),
    };
    out!("replaying {} (seed {:?})", dir.display(), info.seed);
    run(args)
}
