//! `drift test` and `drift replay`: one campaign, as its phases. Each is
//! a function here, named as docs/ARCHITECTURE.md names it:
//!
//! 1. [`validate`] — the plan from the arguments ([`Plan::from_args`]) or
//!    from a stored `run.json` ([`Campaign::load`]), checked before
//!    anything starts;
//! 2. [`setup`] — claim an address block ([`crate::claim`]), write the
//!    cluster file, start the servers, wait for a leader (a server that
//!    exits fails the setup at once, quoting its log), create the
//!    workload's root znode;
//! 3. [`main_phase`] — workers issue operations at the rate while the
//!    nemesis runs the schedule ([`nemesis::run`]) and the
//!    monitor turns server log lines into history events;
//! 4. [`heal`] — every fault stopped, dead servers restarted, the
//!    replicas converge;
//! 5. [`final_reads`] — the workload's final operations through fresh
//!    clients, then every server's digest;
//! 6. [`teardown`] — servers stopped, partitions and the claim released,
//!    `run.json` rewritten with the schedule as applied;
//! 7. judge ([`crate::judge`]) and summarise ([`crate::run`], shared with
//!    the simulator).
//!
//! Every phase is bounded (the schedule ends within the time limit;
//! healing, convergence, the final operations and the checks have
//! deadlines of their own), so a hung run still ends with a verdict; a
//! failing teardown is reported beside the verdict, never instead of it.

use crate::backend::Backend;
use crate::claim::Claim;
use crate::deletes::{self, KvClient};
use crate::events::Witnessed;
use crate::fail::Failure;
use crate::inserts::{self, InsertClient, Replicas};
use crate::local::{LocalCluster, LocalSpec};
use crate::nemesis::{self, Partitioner, Step};
use crate::plan::TestArgs;
use crate::plan::{Campaign, Plan, Target};
use crate::plan::{CLOCK_FAULT_SKEW_MS, CLOCK_SKEW_MS};
use crate::recorder::{Recorder, RecorderHandle};
use crate::run;
use crate::settle;
use drift_checkers::history::{OpType, Process};
use drift_results::files::RunInfo;
use drift_results::store::{RunDir, Store};
use drift_workloads::worker::{self, Clock, Pace, WallClock, Znodes};
use drift_workloads::zkclient::{ClientSpec, ZkClient};
use drift_workloads::{OpSpec, Outcome, Rng};
use serde_json::{json, Value};
use std::io::{BufRead, Seek};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Setup and heal each get at most this long.
const PHASE_TIMEOUT: Duration = Duration::from_secs(45);
/// The final reads get at most this long.
const FINAL_PHASE_TIMEOUT: Duration = Duration::from_secs(60);
/// The kv final phase: three rounds of repair over every range, and a dump
/// of every server.
const KV_FINAL_PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// The whole run may take the time limit plus this much before the
/// watchdog ends it.
const WATCHDOG_SLACK: Duration = Duration::from_secs(240);
/// Lines of a server's log quoted when it fails the setup.
const LOG_LINES_QUOTED: usize = 3;
/// The table's final phase (a sync and a read of every replica) gets at
/// most this long: a replica that was wiped clones first.
const TABLE_FINAL_PHASE_TIMEOUT: Duration = Duration::from_secs(180);

/// `drift test`.
pub fn run(args: TestArgs) -> Result<i32, Failure> {
    let mut campaign = validate(&args)?;
    campaign.junit = args.junit.clone();
    execute(campaign, Store::new(&args.store))
}

/// `drift replay <run dir>`: the same campaign again — its plan, seed and
/// nemesis schedule as applied — into a new run of the same store.
pub fn replay(dir: &std::path::Path, junit: Option<PathBuf>) -> Result<i32, Failure> {
    let stored = RunDir::open(dir).map_err(Failure::new)?;
    let mut campaign = Campaign::load(&stored.run_json())?;
    campaign.junit = junit;
    // <store>/<test>/<run>, with `latest` and relative paths resolved
    let real = dir
        .canonicalize()
        .map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let store_root = real
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| "store".into());
    out!("replaying {} (seed {})", dir.display(), campaign.seed);
    execute(campaign, Store::new(store_root))
}

/// Phase 1: the plan of the arguments, its seed and its schedule.
pub fn validate(args: &TestArgs) -> Result<Campaign, Failure> {
    let plan = Plan::from_args(args)?;
    if plan.target == Target::Zookeeper && !crate::servers::zookeeper_installed() {
        return Err(Failure::new(
            "--target zookeeper needs Apache ZooKeeper: apt install zookeeper",
        ));
    }
    if plan.target == Target::Clickhouse {
        crate::clickhouse::find_bin(plan.clickhouse_bin.as_deref()).map_err(Failure::new)?;
        if plan.coordinator == crate::plan::Coordinator::Zookeeper && !crate::servers::zookeeper_installed() {
            return Err(Failure::new(
                "--coordinator zookeeper needs Apache ZooKeeper: apt install zookeeper",
            ));
        }
    }
    let seed = args.seed.unwrap_or_else(|| {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ ((std::process::id() as u64) << 32)).next_u64()
    });
    Ok(Campaign::new(plan, seed))
}

/// Runs a validated campaign through every other phase.
fn execute(c: Campaign, store: Store) -> Result<i32, Failure> {
    if c.plan.backend == crate::plan::BackendKind::Sim {
        return crate::sim::execute(c, store);
    }
    let run_started = Instant::now();
    let (run, mut info) = run::create_run(&c, &store)?;
    let interrupts = Interrupts::install();
    let env = match setup(&c, &run, &mut info) {
        Ok(env) => env,
        Err(e) => {
            run::discard_refused(&run);
            return Err(e);
        }
    };
    interrupts.own(&env);
    out!("  run dir {}", run.path.display());
    let main = main_phase(&c, &run, &env, &interrupts)?;
    let interrupted = interrupts.main_phase_over(&main);
    heal(&env, &main);
    final_reads(&c, &env, &main);
    info.interrupted_after_s = interrupted.map(|(_, after)| after.as_secs_f64());
    let (ops, problems) = teardown(env, main, &mut info, &run, &interrupts)?;
    let judged = run::judge_run(&c, &run, &info, &store)?;
    run::summarise(&c, &judged, ops, run_started.elapsed(), &problems, &run);
    if let Some((signal, after)) = interrupted {
        out!(
            "  interrupted: the main phase ended after {:.1}s of {}s; the verdict covers that much",
            after.as_secs_f64(),
            c.plan.time_limit_s
        );
        return Ok(crate::interrupt::exit_code(signal));
    }
    Ok(judged.results.verdict.exit_code())
}

/// A campaign's answer to SIGINT, SIGTERM and SIGHUP. The first, before
/// the heal, ends the main phase early: the nemesis stops, operations in
/// flight are cut off (their outcome unknown), and the campaign heals,
/// reads, stops its servers and judges what it recorded, then exits as
/// the signal would have. A signal after that, or a second one, stops at
/// once: the run's partitions removed, its cluster dismantled (servers,
/// and containers, networks or remote files), no verdict (the history so
/// far stays in the run directory for `drift check`). Shared by the
/// signal watcher, the nemesis and the workers' waits.
/// Before the servers are up there is nothing of its own to stop: the
/// set-up finishes, and the first signal leaves an empty main phase.
#[derive(Clone)]
struct Interrupts(Arc<InterruptState>);

struct InterruptState {
    /// Set by the first signal during the set-up or the main phase.
    main_over: AtomicBool,
    /// Set once the main phase has ended: a signal stops at once.
    past_main: AtomicBool,
    /// What a signal that stops at once stops.
    owned: Mutex<Option<Owned>>,
    /// Held by the teardown: while its drop of the cluster removes what
    /// the run made, the weak references above are already dead, and a
    /// signal waits for it instead of exiting halfway through.
    teardown: Mutex<()>,
}

/// Weak: the campaign's own teardown drops the last strong references
/// (and with them the backend's cleanup on drop: containers, remote
/// rules) as it always did.
type Owned = (std::sync::Weak<Mutex<Box<dyn Backend>>>, std::sync::Weak<Partitioner>);

/// How long a signal that stops at once waits for the cluster, which
/// another phase may hold (a step of the heal), before it exits anyway.
const INTERRUPT_STOP_WAIT: Duration = Duration::from_secs(10);

impl Interrupts {
    fn install() -> Interrupts {
        let i = Interrupts(Arc::new(InterruptState {
            main_over: AtomicBool::new(false),
            past_main: AtomicBool::new(false),
            owned: Mutex::new(None),
            teardown: Mutex::new(()),
        }));
        let state = i.0.clone();
        crate::interrupt::on_signal(move |sig, first| {
            if first && !state.past_main.load(Ordering::SeqCst) {
                state.main_over.store(true, Ordering::SeqCst);
                out!("\n  interrupted: the main phase ends now; the servers are healed and what was recorded is judged (interrupt again to stop at once)");
                return;
            }
            out!("\n  interrupted: stopping the servers and removing the partitions now, without a verdict");
            let owned = state.owned.lock().unwrap_or_else(|e| e.into_inner()).take();
            let live = owned.and_then(|(c, p)| Some((c.upgrade()?, p.upgrade()?)));
            match live {
                // exits holding the cluster: no phase starts a server after
                Some((cluster, partitioner)) => stop_within(&cluster, &partitioner, INTERRUPT_STOP_WAIT, sig),
                None => {
                    // before the set-up made a cluster: at once; in the
                    // teardown: once its drop has removed the cluster
                    let deadline = Instant::now() + INTERRUPT_STOP_WAIT;
                    while matches!(state.teardown.try_lock(), Err(std::sync::TryLockError::WouldBlock))
                        && Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    std::process::exit(crate::interrupt::exit_code(sig))
                }
            }
        });
        i
    }

    /// The cluster and partitions a signal that stops at once stops.
    fn own(&self, env: &Env) {
        *self.0.owned.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Arc::downgrade(&env.cluster), Arc::downgrade(&env.partitioner)));
    }

    /// From now on a signal stops at once. The first signal's number and
    /// when the main phase ended, if a signal ended it.
    fn main_phase_over(&self, main: &Main) -> Option<(i32, Duration)> {
        self.0.past_main.store(true, Ordering::SeqCst);
        crate::interrupt::first_signal().map(|signal| (signal, main.ended.saturating_duration_since(main.started)))
    }
}

/// Heals every partition and stops every server of `cluster` (waiting at
/// most `wait` for its lock), then exits as `signal` would have, still
/// holding the lock: no other phase cuts a link or starts a server in
/// between.
fn stop_within(cluster: &Mutex<Box<dyn Backend>>, partitioner: &Partitioner, wait: Duration, signal: i32) -> ! {
    let deadline = Instant::now() + wait;
    let mut guard = loop {
        match cluster.try_lock() {
            Ok(c) => break Some(c),
            Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                out!(
                    "  the cluster was busy for {}s: exiting without stopping it",
                    wait.as_secs()
                );
                break None;
            }
        }
    };
    if let Some(c) = guard.as_mut() {
        // every partitioner's rules (on this machine, on the hosts, in
        // nftables), then its own chain
        partitioner.heal(c.as_ref());
        // no destructor runs after this: containers, networks and
        // remote files go now, or the next run finds them
        c.dismantle();
    }
    if let Some(e) = partitioner.teardown() {
        out!("  {e}");
    }
    std::process::exit(crate::interrupt::exit_code(signal))
}

/// Ready once `flag` is set (looked at every 50 ms).
async fn until_set(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the setup made, for the phases after it.
struct Env {
    cluster: Arc<Mutex<Box<dyn Backend>>>,
    partitioner: Arc<Partitioner>,
    /// The address block, held until the teardown.
    claim: Claim,
    rt: tokio::runtime::Runtime,
    spec: ClientSpec,
    /// The insert-retry workload's client (its table's replicas).
    inserts: Option<Arc<InsertClient>>,
    /// The delete workload's client (the kv servers).
    kv: Option<Arc<KvClient>>,
    /// The dedup window (ids, seconds) the table's servers run with.
    window: Option<(u64, u64)>,
}

/// Phase 2: servers up on an address block of this run's own, a leader,
/// the workload's root.
fn setup(c: &Campaign, run: &RunDir, info: &mut RunInfo) -> Result<Env, Failure> {
    let plan = &c.plan;
    let claim = Claim::acquire(
        plan.block,
        plan.nodes,
        plan.port,
        &format!("drift test (run {})", run.path.display()),
    )?;
    // not derived from the seed: a seed is printed and stored, a token
    // must not be guessable by whoever reads them
    let token = drift_node::peer_auth::new_secret().map_err(|e| Failure::new(format!("a fault token: {e}")))?;
    let partitions = plan.nemeses.contains(&nemesis::FaultKind::Partition);
    // removes its iptables chain when dropped, on every way out of here
    let docker = plan.backend == crate::plan::BackendKind::Docker;
    let remote = plan.backend != crate::plan::BackendKind::Local;
    let clickhouse = plan.target == Target::Clickhouse;
    let partitioner = if !partitions {
        Partitioner::Unused
    } else if remote || clickhouse {
        Partitioner::Backend
    } else {
        Partitioner::choose(plan.partitioner).map_err(Failure::new)?
    };
    if plan.kv.is_some() && partitioner.needs_proxies() {
        return Err(Failure::new(
            "partitions of the delete workload need iptables (run as root): the per-link proxies carry Raft traffic only",
        ));
    }
    let table = match plan.table.as_ref().filter(|_| !clickhouse) {
        Some(t) => Some(crate::servers::local_table(
            drift_workloads::table::TABLE_DECLARATION,
            plan.nodes,
            plan.port + crate::plan::TABLE_HTTP_PORT_OFFSET,
            plan.port + crate::plan::TABLE_INTERSERVER_PORT_OFFSET,
            &t.settings(),
        )?),
        None => None,
    };
    let kv = match &plan.kv {
        Some(k) => Some(crate::servers::LocalKv::new(
            plan.port + crate::plan::KV_PORT_OFFSET,
            &k.settings(),
        )?),
        None => None,
    };
    // a replica cut from its keeper loses its session (and its locks)
    // after the campaign's session timeout
    let mut extra: Vec<String> = table
        .iter()
        .map(|_| format!("table_session_timeout_ms = {}", plan.session_timeout_ms))
        .collect();
    if plan.witness() {
        extra.push(crate::plan::WITNESS_LINE.into());
    }
    let spec = LocalSpec {
        nodes: plan.nodes,
        block: claim.block,
        port: plan.port,
        quorum_reads: plan.quorum_reads,
        digest: plan.digest,
        token: &token,
        zookeeper: plan.target == Target::Zookeeper,
        proxies: partitioner.needs_proxies(),
        table: table.as_ref(),
        kv: kv.as_ref(),
        extra,
        defect: plan
            .table
            .as_ref()
            .and_then(|t| t.defect)
            .or(plan.kv.as_ref().and_then(|k| k.defect))
            .map(|d| d.name()),
    };
    let mut facts = None;
    let mut cluster: Box<dyn Backend> = if clickhouse {
        out!("  starting the coordinators and the ClickHouse servers");
        let (c, f) = crate::clickhouse::deploy(plan, &run.path, claim.block, &token)?;
        out!(
            "  ClickHouse {} on {}: {}",
            f.version,
            match plan.coordinator {
                crate::plan::Coordinator::Keeper => "drift's keeper",
                crate::plan::Coordinator::Zookeeper => "Apache ZooKeeper",
            },
            if f.dialect.left_out().is_empty() {
                "every insert mix".to_string()
            } else {
                format!(
                    "mixes left out: {}",
                    f.dialect
                        .left_out()
                        .iter()
                        .map(|(m, why)| format!("{m} ({why})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        info.target = Some(f.json(plan.coordinator));
        facts = Some(f);
        Box::new(c)
    } else if docker {
        Box::new(
            crate::docker::DockerCluster::new(&run.path, spec, Box::new(crate::container::Cli::docker()))
                .map_err(Failure::new)?,
        )
    } else if let Some(path) = plan.hosts.as_deref() {
        let hosts = crate::hosts::Hosts::load(path).map_err(Failure::new)?;
        Box::new(crate::sshcluster::SshCluster::new(&run.path, spec, &hosts).map_err(Failure::new)?)
    } else {
        Box::new(LocalCluster::new(&run.path, spec).map_err(Failure::new)?)
    };
    info.hosts = cluster
        .ids()
        .into_iter()
        .map(|i| json!({"id": i, "client": cluster.client_addr(i).to_string(), "peer": cluster.peer_addr(i).to_string()}))
        .collect();
    run::write_run_json(run, info)?;
    if remote {
        out!("  servers on {} (backend {})", cluster.name(), plan.backend.name());
    } else {
        out!("  servers on {}, addresses {}", cluster.name(), claim.block);
    }
    if partitions {
        if clickhouse {
            out!("  partitions via nftables rules on each process's cgroup");
        } else {
            out!("  partitions via {}", partitioner.name());
        }
    }
    cluster.start_all()?;
    wait_ready(cluster.as_mut())?;
    let mut window = None;
    let inserts = match &plan.table {
        Some(t) => {
            let replicas = Replicas(
                cluster
                    .ids()
                    .into_iter()
                    .filter_map(|i| cluster.table_http(i).map(|a| (format!("r{i}"), format!("http://{a}/"))))
                    .collect(),
            );
            wait_tables(cluster.as_mut())?;
            if let Some(d) = t.defect {
                out!(
                    "  DEFECT {} armed on every node: the dedup checker must find it",
                    d.name()
                );
            }
            // the window the servers really run with: the plan's on drift,
            // what each ClickHouse server said it runs with
            let (w, w_s, dialect) = match &facts {
                Some(f) => {
                    let read = |name: &str| {
                        f.setting(name)
                            .ok_or_else(|| Failure::new(format!("the ClickHouse servers do not say their {name}")))
                    };
                    let (w, w_s) = (
                        read("replicated_deduplication_window")?,
                        read("replicated_deduplication_window_seconds")?,
                    );
                    if (w, w_s) != (t.dedup_window, t.dedup_window_seconds) {
                        out!(
                            "  the servers run with a window of {w} ids / {w_s} s (asked {} / {}): judged by theirs",
                            t.dedup_window,
                            t.dedup_window_seconds
                        );
                    }
                    (w, w_s, f.dialect)
                }
                None => (
                    t.dedup_window,
                    t.dedup_window_seconds,
                    drift_workloads::table::Dialect::DRIFT,
                ),
            };
            window = Some((w, w_s));
            Some(Arc::new(InsertClient {
                replicas,
                op_timeout: Duration::from_millis(plan.op_timeout_ms),
                attempts_max: t.insert_attempts,
                delayed_retry: Duration::from_millis(w_s * 1000 + 2 * t.cleanup_period_ms.max(1000) + 500),
                dialect,
            }))
        }
        None => None,
    };
    let kv = match &plan.kv {
        Some(k) => {
            let servers: Vec<(u64, String)> = cluster
                .ids()
                .into_iter()
                .filter_map(|i| cluster.kv_http(i).map(|a| (i, format!("http://{a}"))))
                .collect();
            wait_kv(cluster.as_mut())?;
            if let Some(d) = k.defect {
                out!(
                    "  DEFECT {} armed on every node: the convergence checker must find it",
                    d.name()
                );
            }
            Some(Arc::new(KvClient {
                servers,
                op_timeout: Duration::from_millis(plan.op_timeout_ms),
            }))
        }
        None => None,
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::new(e.to_string()))?;
    let spec = ClientSpec {
        hosts: cluster.connect_string(),
        workload: plan.workload(),
        session_timeout: Duration::from_millis(plan.session_timeout_ms),
        op_timeout: Duration::from_millis(plan.op_timeout_ms),
        // the drift keeper makes reads fresh server-side; ZooKeeper needs
        // the client to sync first
        sync_reads: plan.target == Target::Zookeeper && plan.quorum_reads,
    };
    if inserts.is_none() && kv.is_none() {
        rt.block_on(setup_root(&spec)).map_err(Failure::new)?;
    }
    Ok(Env {
        cluster: Arc::new(Mutex::new(cluster)),
        partitioner: Arc::new(partitioner),
        claim,
        rt,
        spec,
        inserts,
        kv,
        window,
    })
}

/// Waits until every kv server answers.
fn wait_kv(cluster: &mut dyn Backend) -> Result<(), Failure> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    let addrs: Vec<std::net::SocketAddr> = cluster.ids().into_iter().filter_map(|i| cluster.kv_http(i)).collect();
    while Instant::now() < deadline {
        if addrs
            .iter()
            .all(|a| crate::servers::http_get(*a, "/ping").is_some_and(|(code, _)| code == 200))
        {
            return Ok(());
        }
        if let Some(e) = cluster.exits().first() {
            return Err(Failure::new(format!(
                "node {} exited while its kv service started ({}); see its log under the run dir",
                e.node,
                e.how()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Failure::new(format!(
        "the kv servers did not all answer within {}s (logs under the run dir)",
        PHASE_TIMEOUT.as_secs()
    )))
}

/// Waits until every table replica is registered and writable.
fn wait_tables(cluster: &mut dyn Backend) -> Result<(), Failure> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    let addrs: Vec<std::net::SocketAddr> = cluster
        .ids()
        .into_iter()
        .filter_map(|i| cluster.table_http(i))
        .collect();
    while Instant::now() < deadline {
        if crate::servers::tables_writable(&addrs) {
            return Ok(());
        }
        if let Some(e) = cluster.exits().first() {
            return Err(Failure::new(format!(
                "node {} exited while its table replica started ({}); see its log under the run dir",
                e.node,
                e.how()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Failure::new(format!(
        "the table's replicas were not all writable within {}s (logs under the run dir)",
        PHASE_TIMEOUT.as_secs()
    )))
}

/// Waits for every server to answer and one to lead; a server that exits
/// meanwhile fails the setup at once with the last lines of its log.
fn wait_ready(cluster: &mut dyn Backend) -> Result<(), Failure> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(e) = cluster.exits().first() {
            let log = cluster
                .exit_log(e)
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default();
            let last: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            let quoted = last[last.len().saturating_sub(LOG_LINES_QUOTED)..].join(" | ");
            return Err(Failure::new(format!(
                "node {} exited during setup ({}): {}",
                e.node,
                e.how(),
                if quoted.is_empty() { "its log is empty" } else { &quoted }
            )));
        }
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
    let (kind, value, err) = o.completion();
    r.record(Process::Client(p), kind, f, value, key.clone(), None, err);
}

/// The znode workers' world on real servers: sessions of the
/// `zookeeper-client` crate, tokio's clock, the recorder.
struct Real {
    spec: ClientSpec,
    r: Recorder,
    since: Instant,
}

impl Real {
    /// A world whose clock counts from `since`.
    fn new(spec: ClientSpec, r: Recorder, since: Instant) -> Real {
        Real { spec, r, since }
    }
}

impl Clock for Real {
    fn now_us(&self) -> u64 {
        WallClock(self.since).now_us()
    }

    async fn sleep_until_us(&self, at_us: u64) {
        WallClock(self.since).sleep_until_us(at_us).await
    }
}

impl drift_workloads::worker::World for Real {
    type Session = ZkClient;

    async fn connect(&self, _hint: u64, detached: bool) -> Option<ZkClient> {
        ZkClient::connect(&self.spec, detached).await.ok()
    }

    fn record_invoke(&self, process: u64, op: &OpSpec) {
        record_invoke(&self.r, process, op.f, op.value.clone(), op.key.clone());
    }

    fn record_outcome(&self, process: u64, op: &OpSpec, outcome: &Outcome) {
        record_outcome(&self.r, process, op.f, &op.key, outcome);
    }

    fn record_event(&self, f: &str, value: Value) {
        self.r.event(f, value);
    }
}

/// What the main phase leaves running for the phases after it.
struct Main {
    recorder: Recorder,
    handle: RecorderHandle,
    applied: Arc<Mutex<Vec<Step>>>,
    stop: Arc<AtomicBool>,
    monitor: JoinHandle<()>,
    progress: JoinHandle<()>,
    started: Instant,
    /// When its workers were done (or cut off).
    ended: Instant,
    watchdog: Instant,
}

impl Main {
    /// How long the servers get to converge now: [`PHASE_TIMEOUT`], less
    /// if the watchdog comes sooner.
    fn converge_limit_ms(&self) -> u64 {
        PHASE_TIMEOUT
            .min(self.watchdog.saturating_duration_since(Instant::now()))
            .as_millis() as u64
    }

    /// The real servers as the nemesis's stage.
    fn stage<'a>(&'a self, env: &'a Env) -> nemesis::Servers<'a> {
        nemesis::Servers {
            cluster: &env.cluster,
            partitioner: &env.partitioner,
            recorder: &self.recorder,
            applied: &self.applied,
            started: self.started,
            stop: &self.stop,
            exited: Default::default(),
        }
    }
}

/// Phase 3: the workers and the nemesis, for the time limit; returns once
/// both are done.
fn main_phase(c: &Campaign, run: &RunDir, env: &Env, interrupts: &Interrupts) -> Result<Main, Failure> {
    let plan = &c.plan;
    let limit = Duration::from_secs(plan.time_limit_s);
    let op_timeout = env.spec.op_timeout;
    // history times, the fault schedule and the workers all count from
    // this instant
    let started = Instant::now();
    let (recorder, handle) = Recorder::start(&run.history(), started)
        .map_err(|e| Failure::new(format!("{}: {e}", run.history().display())))?;
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = spawn_monitor(env.cluster.clone(), recorder.clone(), stop.clone());
    let main_until = started + limit;
    if let (Some((w, w_s)), Some(client)) = (env.window, &env.inserts) {
        let clock = plan.nemeses.contains(&nemesis::FaultKind::Clock);
        let epsilon_ms = CLOCK_SKEW_MS + if clock { CLOCK_FAULT_SKEW_MS } else { 0 };
        recorder.event(
            drift_checkers::dedup::PARAMS_F,
            inserts::window_event(w, w_s, epsilon_ms, client.replicas.names(), plan.witness()),
        );
    }
    if let Some(k) = &plan.kv {
        recorder.event(
            deletes::CONFIG_EVENT,
            deletes::config_event(
                k,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64),
                deletes::clock_skew_ms(plan),
            ),
        );
    }
    // every worker's clock counts from `started`
    let pace = Pace {
        stride: plan.concurrency,
        seed: c.seed,
        until_us: limit.as_micros() as u64,
        every_us: (plan.concurrency as f64 / plan.rate * 1e6) as u64,
    };
    // each table or kv worker its own HTTP client (connections), as a
    // process of its own would have
    let mut https = Vec::new();
    if env.inserts.is_some() || env.kv.is_some() {
        for w in 0..plan.concurrency {
            https.push(
                reqwest::Client::builder()
                    .build()
                    .map_err(|e| Failure::new(format!("an HTTP client for worker {w}: {e}")))?,
            );
        }
    }
    let mut https = https.into_iter();
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|w| {
            let clock = WallClock(started);
            match (&env.inserts, &env.kv) {
                (Some(client), _) => {
                    let service = inserts::HttpTable::new(
                        recorder.clone(),
                        client.clone(),
                        https.next().expect("one per worker"),
                    );
                    let client = inserts::Inserter::new(w, service, client);
                    env.rt.spawn(async move { worker::run(&clock, client, w, pace).await })
                }
                (None, Some(client)) => {
                    let service =
                        deletes::HttpKv::new(recorder.clone(), client.clone(), https.next().expect("one per worker"));
                    let client = deletes::KvRequests::new(w, service, plan.workload());
                    env.rt.spawn(async move { worker::run(&clock, client, w, pace).await })
                }
                (None, None) => {
                    let world = Real::new(env.spec.clone(), recorder.clone(), started);
                    let workload = env.spec.workload;
                    env.rt.spawn(async move {
                        let client = Znodes::new(&world, workload, w);
                        worker::run(&world, client, w, pace).await
                    })
                }
            }
        })
        .collect();
    let applied = Arc::new(Mutex::new(Vec::<Step>::new()));
    let nem = {
        // an interrupt ends the schedule
        let (cluster, recorder, partitioner, applied, schedule, stop) = (
            env.cluster.clone(),
            recorder.clone(),
            env.partitioner.clone(),
            applied.clone(),
            c.schedule.clone(),
            interrupts.clone(),
        );
        std::thread::spawn(move || {
            let stage = nemesis::Servers {
                cluster: &cluster,
                partitioner: &partitioner,
                recorder: &recorder,
                applied: &applied,
                started,
                stop: &stop.0.main_over,
                exited: Default::default(),
            };
            nemesis::finish(nemesis::run(&stage, schedule))
        })
    };
    let progress = spawn_progress(recorder.clone(), applied.clone(), stop.clone(), started);
    // one deadline for all workers: an op past it is cut off (its
    // invocation stays in the history without a completion, i.e. info)
    let workers_deadline = tokio::time::Instant::from_std(main_until + op_timeout * 3 + Duration::from_secs(5));
    // as is an interrupted one's
    let main_over = &interrupts.0.main_over;
    for w in workers {
        let abort = w.abort_handle();
        let finished = env.rt.block_on(async {
            tokio::select! {
                done = tokio::time::timeout_at(workers_deadline, w) => done.is_ok(),
                () = until_set(main_over) => false,
            }
        });
        if !finished {
            abort.abort();
        }
    }
    let ended = Instant::now();
    if main_over.load(Ordering::SeqCst) {
        recorder.event(
            "interrupted",
            json!({"signal": crate::interrupt::first_signal(), "after_ms": ended.duration_since(started).as_millis() as u64}),
        );
    }
    let _ = nem.join();
    Ok(Main {
        recorder,
        handle,
        applied,
        stop,
        monitor,
        progress,
        started,
        ended,
        watchdog: started + limit + WATCHDOG_SLACK,
    })
}

/// Phase 4: every fault stopped, every server back, the replicas
/// converged (or the event says they did not).
fn heal(env: &Env, main: &Main) {
    out!("\n  healing: every fault stopped, dead servers restarted");
    main.recorder
        .set_phase("heal: every fault stopped, dead servers restarted, the servers to converge");
    nemesis::finish(settle::heal(
        &main.stage(env),
        env.inserts.is_some(),
        env.kv.is_some(),
        main.converge_limit_ms(),
    ));
}

/// Phase 5: the workload's final operations through fresh clients, then
/// every server's digest once they agree again.
fn final_reads(c: &Campaign, env: &Env, main: &Main) {
    let workload = c.plan.workload();
    let settle = workload.settle_before_final(env.spec.session_timeout);
    if !settle.is_zero() {
        out!(
            "  waiting {:.1}s for abandoned sessions to expire",
            settle.as_secs_f64()
        );
        main.recorder
            .set_phase(format!("abandoned sessions to expire ({:.1}s)", settle.as_secs_f64()));
        std::thread::sleep(settle);
    }
    let first = c.plan.concurrency;
    if let Some(client) = &env.inserts {
        let (r, client) = (main.recorder.clone(), client.clone());
        // each replica's share of the phase: a replica still recovering its
        // coordinator session is read again until its share runs out
        let per_read = TABLE_FINAL_PHASE_TIMEOUT / client.replicas.0.len().max(1) as u32;
        match reqwest::Client::builder().build() {
            Ok(http) => {
                let service = inserts::HttpTable::new(r, client, http);
                bounded_final(env, main, TABLE_FINAL_PHASE_TIMEOUT, async move {
                    inserts::final_reads(&service, first, per_read).await
                });
            }
            Err(e) => r.event(
                "final-op-failed",
                json!({"f": inserts::READ_F, "why": format!("no HTTP client: {e}")}),
            ),
        }
        // the ids a server logs where the monitor does not read (real
        // ClickHouse's own log), for the dedup witness
        let logged = env.cluster.lock().map(|c| c.logged_block_ids()).unwrap_or_default();
        for (query_id, block_id) in logged {
            main.recorder.event(
                drift_checkers::dedup::BLOCK_OF_F,
                json!({"query_id": query_id, "block_id": block_id}),
            );
        }
        let counted = env.cluster.lock().ok().and_then(|c| c.deduplicated_blocks());
        if let Some(counts) = counted {
            let total: u64 = counts.iter().map(|(_, n)| n).sum();
            out!(
                "  the servers deduplicated {total} blocks ({})",
                counts
                    .iter()
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            main.recorder.event(
                "server-deduplicated-blocks",
                json!({"total": total, "replicas": counts.iter().map(|(r, n)| json!({"replica": r, "blocks": n})).collect::<Vec<_>>()}),
            );
        }
    }
    if let Some(client) = &env.kv {
        // nothing moves the replicas but the final repairs: scheduled
        // repairs and GC passes paused on every server
        if let Ok(c) = env.cluster.lock() {
            for i in c.ids() {
                for cmd in ["kv repair-off", "kv gc-off"] {
                    if let Err(e) = c.admin(i, cmd) {
                        main.recorder
                            .event("final-op-failed", json!({"f": cmd, "node": i, "why": e.to_string()}));
                    }
                }
            }
        }
        match reqwest::Client::builder().build() {
            Ok(http) => {
                let service = deletes::HttpKv::new(main.recorder.clone(), client.clone(), http);
                bounded_final(env, main, KV_FINAL_PHASE_TIMEOUT, async move {
                    deletes::final_phase(&service).await
                });
            }
            Err(e) => main.recorder.event(
                "final-op-failed",
                json!({"f": "repair", "why": format!("no HTTP client: {e}")}),
            ),
        }
    }
    if !workload.final_ops().is_empty() {
        let final_spec = ClientSpec {
            op_timeout: env.spec.op_timeout * 5,
            ..env.spec.clone()
        };
        let r = main.recorder.clone();
        r.set_phase("the workload's final operations");
        let world = Real::new(final_spec, r, Instant::now());
        bounded_final(env, main, FINAL_PHASE_TIMEOUT, async move {
            worker::final_phase(&world, workload, first).await
        });
    }
    // the final phase wrote too: compare digests once the servers agree
    main.recorder.set_phase("the servers' digests to agree");
    nemesis::finish(settle::final_digests(&main.stage(env), main.converge_limit_ms()));
}

/// Runs a final phase's operations for at most `limit`; past it, the
/// history says so (`final-phase-timeout`) and the run goes on.
fn bounded_final(env: &Env, main: &Main, limit: Duration, ops: impl std::future::Future<Output = ()>) {
    // the timer is made inside the runtime
    if env
        .rt
        .block_on(async { tokio::time::timeout(limit, ops).await })
        .is_err()
    {
        main.recorder
            .event("final-phase-timeout", json!({"after_s": limit.as_secs()}));
    }
}

/// Phase 6: servers stopped, partitions and the claim released, the
/// history closed and `run.json` rewritten with the schedule as applied.
/// History lines, and what went wrong (never in place of the verdict).
fn teardown(
    env: Env,
    main: Main,
    info: &mut RunInfo,
    run: &RunDir,
    interrupts: &Interrupts,
) -> Result<(u64, Vec<String>), Failure> {
    // released last, after the cluster's drop
    let _tearing_down = interrupts.0.teardown.lock().unwrap_or_else(|e| e.into_inner());
    let Main {
        recorder,
        handle,
        applied,
        stop,
        monitor,
        progress,
        ..
    } = main;
    stop.store(true, Ordering::Relaxed);
    let _ = progress.join();
    let _ = monitor.join();
    let Env {
        cluster,
        partitioner,
        claim,
        rt,
        ..
    } = env;
    drop(rt);
    let mut problems = Vec::new();
    if let Ok(mut c) = cluster.lock() {
        c.stop_all();
    }
    if let Some(e) = partitioner.teardown() {
        problems.push(e);
    }
    drop(claim);
    drop(recorder);
    let ops = handle.finish().map_err(|e| Failure::new(format!("history: {e}")))?;
    let applied = applied.lock().map(|a| a.clone()).unwrap_or_default();
    info.nemesis_schedule = Campaign::schedule_json(&applied);
    run::write_run_json(run, info)?;
    Ok((ops, problems))
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
        let mut seen = Witnessed::default();
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
                    observe(*node, &line, &r, &mut seen);
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

fn observe(node: u64, line: &str, r: &Recorder, seen: &mut Witnessed) {
    let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
        return;
    };
    if let Some((f, value)) = crate::events::history_event(node, &v, seen) {
        r.event(f, value);
    }
}

/// How often the progress line is written where stderr is not a terminal
/// (a log file, a CI job): one line each time, never redrawn.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

fn spawn_progress(
    r: Recorder,
    applied: Arc<Mutex<Vec<Step>>>,
    stop: Arc<AtomicBool>,
    started: Instant,
) -> std::thread::JoinHandle<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    std::thread::spawn(move || {
        let mut last = 0u64;
        let mut last_line = Instant::now();
        let mut last_phase = None;
        loop {
            std::thread::sleep(Duration::from_secs(1));
            // the last line is written in any case: where the run ended
            let last_round = stop.load(Ordering::Relaxed);
            let phase = r.counts.phase.lock().ok().and_then(|p| p.clone());
            let changed = phase != last_phase;
            if !tty && !changed && !last_round && last_line.elapsed() < PROGRESS_LOG_EVERY {
                continue;
            }
            let c = &r.counts;
            let invoked = c.invoked.load(Ordering::Relaxed);
            let now_ms = started.elapsed().as_millis() as u64;
            let state = match &phase {
                Some(p) => format!("waiting for: {p}"),
                None => {
                    let active: Vec<String> = applied
                        .lock()
                        .map(|a| {
                            a.iter()
                                .filter(|s| s.start_ms <= now_ms && now_ms < s.stop_ms)
                                .map(|s| format!("{} {:?}", s.fault.kind().name(), s.nodes))
                                .collect()
                        })
                        .unwrap_or_default();
                    format!(
                        "faults: {}",
                        if active.is_empty() {
                            "none".to_string()
                        } else {
                            active.join(", ")
                        }
                    )
                }
            };
            let per_s = (invoked - last) as f64 / last_line.elapsed().as_secs_f64().max(0.001);
            let line = format!(
                "  [{:>6.1}s] ops {invoked} ({per_s:.0}/s)  ok {}  fail {}  info {}  {state}",
                started.elapsed().as_secs_f64(),
                c.ok.load(Ordering::Relaxed),
                c.fail.load(Ordering::Relaxed),
                c.info.load(Ordering::Relaxed),
            );
            if tty {
                // redrawn in place; a phase change keeps the line before it
                if changed && last_phase.is_some() {
                    noteln!();
                }
                note!("\r{line}\x1b[K");
            } else {
                noteln!("{line}");
            }
            last = invoked;
            last_line = Instant::now();
            last_phase = phase;
            if last_round {
                break;
            }
        }
        if tty {
            noteln!();
        }
    })
}
