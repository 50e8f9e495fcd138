//! The replicated table in the simulator: one replica beside each
//! simulated keeper, coordinated by the simulated keeper cluster itself
//! through a simulated ZooKeeper session, so a keeper fault (a lost
//! leader, a partition, a kill) reaches the table the way it does on
//! processes. The replica's decisions are the sans-IO cores the node
//! runs: one block's insert (`drift_table::insert::BlockInsert`: the two
//! round trips, a lost commit settled through its lock), registration,
//! the log puller's copies, a fetched part's checks and the multi that
//! records it (`drift_table::replica`), the queue's choices
//! (`drift_table::queue`), a restart's reconciliation
//! (`drift_table::reconcile`), the leader's merge selection
//! (`drift_table::merge`) and its block-id cleanup
//! (`drift_table::dedup`). What is here is the driving: calls, timers,
//! the disk, the network between replicas.
//!
//! What the simulation stands in for:
//!
//! * **The disk.** A part's files are written whole (the node writes
//!   them to a temporary directory, syncs and renames): after a crash a
//!   part is there or not, never torn. A wipe empties the disk. A part
//!   a merged or fetched part replaces leaves the disk when that part's
//!   commit is known (the node outdates it and removes it later; nothing
//!   here reads an outdated part, and a fetch of one is tried again).
//! * **The process.** A replica lives and dies with its node's keeper
//!   (killed, stopped by a digest abort, paused); it starts again with
//!   it, reconciling its disk with what the coordinator lists for it.
//! * **The interserver network.** A fetch takes the world's delays; over
//!   a cut link or from a replica that is down it fails, and is retried
//!   after the queue's backoff.
//! * **The HTTP client.** A request and its answer each take a client
//!   hop; the client gives up after its timeout while the insert goes on
//!   at the replica (as an HTTP handler does).
//!
//! Not simulated (yet), and refused with a reason where a campaign asks:
//! quorum inserts, lost-replica cloning.
//!
//! Invariants checked inside the simulation, beside the checkers: a part
//! is never current on a replica before the coordinator lists it there;
//! an acknowledged insert's blocks are in the coordinator (the part
//! listed, the id recorded); a replica never installs a part whose files
//! fail the checksums its writer listed.

use super::client::{SimZk, Spec};
use super::exec::{self, CallError, W};
use super::world::{self, H};
use crate::inserts::TableService;
use drift_checkers::history::OpType;
use drift_keeper::client::{ClientOp, MultiOp, ReplyBody};
use drift_keeper::ZkError;
use drift_table::block::split_insert;
use drift_table::dedup::{block_id, block_ids_to_remove, token_block_id};
use drift_table::entry::EntryKind;
use drift_table::format::{self, Checksums};
use drift_table::insert::{
    BlockInsert, BlockSpec, Defects, Done, Fail, Input, MultiFail, Note, Now, Refused, Resolution, Settle, Step,
    RESOLVE_TIMEOUT_MS,
};
use drift_table::merge::{select_merge, MergeInputs};
use drift_table::part::{ActivePartSet, PartInfo};
use drift_table::queue::{Queue, Selected};
use drift_table::quorum;
use drift_table::replica as core;
use drift_table::replica::Pulled;
use drift_table::schema::Value as Cell;
use drift_table::zk::{sequence_of, CreateMode, KeeperOp, Paths};
use drift_table::{Block, Schema};
use drift_workloads::table::{AttemptOutcome, LogicalInsert};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

/// How often a replica's loop runs: it pulls the log, starts what its
/// queue lets run, pings its session and, as the leader, cleans up.
const LOOP_US: u64 = 100_000;
/// One coordinator call's bound (the node's `OP_TIMEOUT`): past it, its
/// outcome is unknown.
const OP_TIMEOUT_US: u64 = 10_000_000;
/// Between two tries to get a session.
const RECONNECT_US: u64 = 200_000;
/// How often the supervisor matches each replica's life to its keeper's.
const SUPERVISE_US: u64 = 50_000;
/// Reads of the queue one reload makes at most while commits land.
const RELOAD_TRIES_MAX: usize = 10;
/// How often a pull waiting for another one looks again.
const PULL_WAIT_US: u64 = 1_000;
/// Tries of one merge assignment against concurrent changes of the log.
const ASSIGN_ATTEMPTS_MAX: usize = 5;
/// How often a quorum insert's writer looks whether its quorum was
/// reached.
const QUORUM_POLL_US: u64 = 50_000;
/// Where the table lives in the coordinator.
const TABLE_PATH: &str = "/clickhouse/tables/inserts";
/// ClickHouse's codes the simulated replica answers with (the node's
/// `table::error`).
const TABLE_IS_READ_ONLY: u64 = 242;
const TOO_FEW_LIVE_REPLICAS: u64 = 285;
const UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE: u64 = 286;
const UNKNOWN_STATUS_OF_INSERT: u64 = 319;
const KEEPER_EXCEPTION: u64 = 999;

/// A part's files.
type Files = BTreeMap<String, Vec<u8>>;

/// The fault hooks of one replica (the node's `table` hooks the
/// nemesis turns on and off).
#[derive(Default, Clone, Copy)]
struct Hooks {
    /// Every insert that succeeds gets no answer (`drop-reply`).
    drop_replies: bool,
    /// Fetches fail (`stop-fetches`).
    fetches_stopped: bool,
    /// The session is abandoned and no new one made (`keeper-cut`).
    keeper_cut: bool,
}

/// What a running replica holds in memory.
struct Run {
    session: Option<Rc<SimZk>>,
    /// Why it refuses writes (no session, not registered yet).
    readonly: Option<String>,
    registered: bool,
    queue: Queue,
    log_pointer: u64,
    pointer_version: i32,
    /// This session's leader candidacy.
    candidacy: Option<String>,
    /// A pull of the log is running (the node's pull lock).
    pulling: bool,
    /// Counts parts made current by commits: a queue reload that saw it
    /// change under it reads again (the node's reload gate, which
    /// commits hold shared and a reload alone, orders them the same way).
    commits: u64,
}

/// One node's replica: its disk, its life, its hooks.
struct Replica {
    name: String,
    /// Parts on disk.
    disk: BTreeMap<String, Files>,
    /// The disk names the replica it belongs to (the node's identity
    /// file): written once registered, gone with a wipe.
    identity: bool,
    /// The keeper's incarnation the running replica started with.
    keeper_life: u64,
    /// Counts this replica's starts: a task of an earlier life stops.
    life: u64,
    run: Option<Run>,
    hooks: Hooks,
}

/// The simulated table: every node's replica, their log lines and the
/// broken invariants.
pub struct TableSim {
    schema: Schema,
    paths: Paths,
    defects: Defects,
    spec: Spec,
    replicas: BTreeMap<u64, Replica>,
    /// Each node's log lines: (simulated µs, event, fields).
    pub logs: BTreeMap<u64, Vec<(u64, &'static str, Value)>>,
    /// Broken invariants: (simulated µs, node, what), each once.
    pub violations: Vec<(u64, u64, String)>,
    /// (replica, kind) of the invariants reported broken.
    reported: BTreeSet<(u64, String)>,
    /// Paths an invariant expects in the coordinator that no running
    /// keeper had applied yet when it looked (the server that answered may
    /// have crashed before any other applied the commit): (replica, kind)
    /// → (path, what it breaks if it never shows).
    pending: BTreeMap<(u64, String), (String, String)>,
    /// Block ids a keeper's log shows created, and how many lines of each
    /// keeper's log were read for them ([`coordinator_has`]).
    blocks_created: BTreeSet<String>,
    log_read: BTreeMap<u64, usize>,
    /// Inserts still running at a replica (their client may have given up).
    in_flight: u64,
    /// Disks wiped so far.
    wipes: u64,
}

impl TableSim {
    /// The table of `plan` on nodes `ids`, its replicas' sessions made
    /// as `spec` says.
    pub fn new(plan: &crate::plan::TablePlan, ids: &[u64], spec: Spec) -> TableSim {
        let mut schema = drift_workloads::table::schema();
        schema.settings.replicated_deduplication_window = plan.dedup_window;
        schema.settings.replicated_deduplication_window_seconds = plan.dedup_window_seconds;
        schema.settings.cleanup_delay_period_ms = plan.cleanup_period_ms;
        if let Some(n) = plan.logs_to_keep {
            schema.settings.max_replicated_logs_to_keep = n;
        }
        schema.settings.zookeeper_path = TABLE_PATH.into();
        let d = plan.defect;
        use crate::plan::Defect;
        TableSim {
            paths: Paths::new(TABLE_PATH, ""),
            schema,
            defects: Defects {
                skip_dedup: d == Some(Defect::SkipDedup),
                no_block_id: d == Some(Defect::NoBlockId),
                lose_part: d == Some(Defect::LosePart),
            },
            spec,
            replicas: ids
                .iter()
                .map(|&i| {
                    (
                        i,
                        Replica {
                            name: format!("r{i}"),
                            disk: BTreeMap::new(),
                            identity: false,
                            keeper_life: 0,
                            life: 0,
                            run: None,
                            hooks: Hooks::default(),
                        },
                    )
                })
                .collect(),
            logs: BTreeMap::new(),
            violations: Vec::new(),
            reported: BTreeSet::new(),
            pending: BTreeMap::new(),
            blocks_created: BTreeSet::new(),
            log_read: BTreeMap::new(),
            in_flight: 0,
            wipes: 0,
        }
    }

    fn paths_of(&self, id: u64) -> Paths {
        Paths::new(TABLE_PATH, &self.replicas[&id].name)
    }
}

// ---- the world's bookkeeping ------------------------------------------------

fn log(w: &W, id: u64, event: &'static str, fields: Value) {
    let mut world = w.borrow_mut();
    let now = world.cluster.now_us();
    if let Some(t) = world.table.as_mut() {
        t.logs.entry(id).or_default().push((now, event, fields));
    }
}

/// A broken invariant, reported once per replica and `kind` (a defect
/// breaks it at every insert: the first says what).
fn violated(w: &W, id: u64, kind: &str, what: String) {
    let mut world = w.borrow_mut();
    let now = world.cluster.now_us();
    if let Some(t) = world.table.as_mut() {
        if t.reported.insert((id, kind.to_string())) {
            t.violations.push((now, id, what));
        }
    }
}

/// Matches replica `id`'s life to its keeper's: gone with it, started
/// again with it (a new life, its loop spawned).
fn reconcile(w: &W, id: u64) {
    let mut gone = None;
    let started = {
        let mut world = w.borrow_mut();
        let world = &mut *world;
        let (up, life) = (world.cluster.is_up(id), world.cluster.incarnation(id));
        let Some(t) = world.table.as_mut() else { return };
        let Some(r) = t.replicas.get_mut(&id) else { return };
        if r.run.is_some() && (!up || r.keeper_life != life) {
            // the process is gone: its session walks away with it
            gone = r.run.take().and_then(|run| run.session);
        }
        if r.run.is_none() && up {
            r.run = Some(Run {
                session: None,
                readonly: Some("starting".into()),
                registered: false,
                queue: Queue::new(ActivePartSet::new()),
                log_pointer: 0,
                pointer_version: -1,
                candidacy: None,
                pulling: false,
                commits: 0,
            });
            r.keeper_life = life;
            r.life += 1;
            Some(r.life)
        } else {
            None
        }
    };
    if let Some(s) = gone {
        s.abandon();
    }
    if let Some(life) = started {
        exec::spawn(w, replica_loop(w.clone(), id, life));
        exec::spawn(w, leader_loop(w.clone(), id, life));
    }
}

/// Starts the table: every replica, and the supervisor that keeps each
/// one's life matched to its keeper's.
pub fn start(w: &W, t: TableSim) {
    let ids: Vec<u64> = t.replicas.keys().copied().collect();
    w.borrow_mut().table = Some(t);
    for &id in &ids {
        reconcile(w, id);
    }
    let w2 = w.clone();
    exec::spawn(w, async move {
        loop {
            let at = exec::now_us(&w2) + SUPERVISE_US;
            exec::sleep_until(&w2, at).await;
            for &id in &ids {
                reconcile(&w2, id);
            }
            recheck(&w2);
        }
    });
}

/// Runs the world until every replica is writable (registered, with a
/// session), for at most `limit_us`: whether they all are.
pub fn wait_writable(w: &W, limit_us: u64) -> bool {
    let done = Rc::new(std::cell::Cell::new(false));
    let (w2, done2) = (w.clone(), done.clone());
    let wait = async move {
        loop {
            let all = w2.borrow().table.as_ref().is_some_and(|t| {
                t.replicas
                    .values()
                    .all(|r| r.run.as_ref().is_some_and(|run| run.readonly.is_none()))
            });
            if all {
                done2.set(true);
                return;
            }
            sleep_for(&w2, LOOP_US).await;
        }
    };
    let until = exec::now_us(w) + limit_us;
    exec::run(w, vec![Box::pin(wait)], until);
    done.get()
}

/// Whether replica `id` is still in life `life`.
fn alive(w: &W, id: u64, life: u64) -> bool {
    reconcile(w, id);
    let world = w.borrow();
    world
        .table
        .as_ref()
        .and_then(|t| t.replicas.get(&id))
        .is_some_and(|r| r.run.is_some() && r.life == life)
}

/// Runs `f` on replica `id`'s running state in life `life`.
fn with_run<T>(w: &W, id: u64, life: u64, f: impl FnOnce(&mut Run) -> T) -> Option<T> {
    let mut world = w.borrow_mut();
    let r = world.table.as_mut()?.replicas.get_mut(&id)?;
    if r.life != life {
        return None;
    }
    r.run.as_mut().map(f)
}

fn hooks(w: &W, id: u64) -> Hooks {
    w.borrow()
        .table
        .as_ref()
        .and_then(|t| t.replicas.get(&id))
        .map(|r| r.hooks)
        .unwrap_or_default()
}

fn session(w: &W, id: u64, life: u64) -> Option<Rc<SimZk>> {
    with_run(w, id, life, |run| run.session.clone()).flatten()
}

async fn sleep_for(w: &W, us: u64) {
    let at = exec::now_us(w) + us;
    exec::sleep_until(w, at).await;
}

/// Waits while node `id` is paused (its process stopped).
async fn while_paused(w: &W, id: u64) {
    while w.borrow().cluster.is_paused(id) {
        sleep_for(w, 10_000).await;
    }
}

fn hop_us(w: &W, client: bool) -> u64 {
    let mut world = w.borrow_mut();
    let net = &world.cluster.config().net;
    let (lo, hi) = if client { net.client_delay_us } else { net.delay_us };
    lo + world.cluster.draw(hi.saturating_sub(lo) + 1)
}

// ---- coordinator calls ----------------------------------------------------

fn fail_of(e: CallError) -> Fail {
    match e {
        CallError::Zk(ZkError::NoNode) => Fail::NoNode,
        CallError::Zk(ZkError::NodeExists) => Fail::NodeExists,
        CallError::Zk(ZkError::BadVersion) => Fail::BadVersion,
        CallError::Zk(e) => Fail::Other(format!("{e:?}")),
        CallError::ConnectionLoss => Fail::Lost("connection loss".into()),
        CallError::SessionExpired => Fail::NoSession,
    }
}

/// One call through `s`, bounded by [`OP_TIMEOUT_US`].
async fn call(w: &W, s: &SimZk, op: ClientOp) -> Result<ReplyBody, Fail> {
    match exec::timeout(w, OP_TIMEOUT_US, s.call(op)).await {
        Some(Ok(r)) => Ok(r.body),
        Some(Err(e)) => Err(fail_of(e)),
        None => Err(Fail::Lost("timed out".into())),
    }
}

async fn exists(w: &W, s: &SimZk, path: &str) -> Result<Option<drift_keeper::node::Stat>, Fail> {
    match call(w, s, ClientOp::Exists { path: path.into() }).await {
        Ok(ReplyBody::Stat(st)) => Ok(Some(st)),
        Ok(_) => Ok(None),
        Err(Fail::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn get(w: &W, s: &SimZk, path: &str) -> Result<Option<(Vec<u8>, i32)>, Fail> {
    match call(w, s, ClientOp::GetData { path: path.into() }).await {
        Ok(ReplyBody::Data(d, st)) => Ok(Some((d, st.version))),
        Ok(_) => Err(Fail::Other("getData answered without data".into())),
        Err(Fail::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn children(w: &W, s: &SimZk, path: &str) -> Result<Vec<String>, Fail> {
    match call(w, s, ClientOp::GetChildren { path: path.into() }).await? {
        ReplyBody::Children(k) => Ok(k),
        _ => Err(Fail::Other("getChildren answered without children".into())),
    }
}

async fn create(w: &W, s: &SimZk, path: &str, data: &[u8], mode: CreateMode) -> Result<String, Fail> {
    let op = ClientOp::Create {
        path: path.into(),
        data: data.to_vec(),
        mode: keeper_mode(mode),
    };
    match call(w, s, op).await? {
        ReplyBody::Path(p) => Ok(p),
        _ => Ok(path.to_string()),
    }
}

async fn delete(w: &W, s: &SimZk, path: &str) -> Result<(), Fail> {
    let op = ClientOp::Delete {
        path: path.into(),
        version: -1,
    };
    call(w, s, op).await.map(|_| ())
}

fn keeper_mode(m: CreateMode) -> drift_keeper::CreateMode {
    match m {
        CreateMode::Persistent => drift_keeper::CreateMode::Persistent,
        CreateMode::PersistentSequential => drift_keeper::CreateMode::PersistentSequential,
        CreateMode::Ephemeral => drift_keeper::CreateMode::Ephemeral,
        CreateMode::EphemeralSequential => drift_keeper::CreateMode::EphemeralSequential,
    }
}

fn multi_op(op: &KeeperOp) -> MultiOp {
    match op.clone() {
        KeeperOp::Create { path, data, mode } => MultiOp::Create {
            path,
            data,
            mode: keeper_mode(mode),
        },
        KeeperOp::Delete { path, version } => MultiOp::Delete { path, version },
        KeeperOp::SetData { path, data, version } => MultiOp::SetData { path, data, version },
        KeeperOp::Check { path, version } => MultiOp::Check { path, version },
    }
}

/// A multi: each op's created path (empty for the others), or the op
/// that failed and why.
async fn multi(w: &W, s: &SimZk, ops: &[KeeperOp]) -> Result<Vec<String>, MultiFail> {
    let body = call(w, s, ClientOp::Multi(ops.iter().map(multi_op).collect()))
        .await
        .map_err(|fail| MultiFail { index: None, fail })?;
    let ReplyBody::Multi(results) = body else {
        return Err(MultiFail {
            index: None,
            fail: Fail::Other("a multi answered without results".into()),
        });
    };
    // the op that failed; the others say ok or "runtime inconsistency"
    let failed = results.iter().enumerate().find_map(|(i, r)| match r {
        Err(e) if !matches!(e, ZkError::Ok | ZkError::RuntimeInconsistency) => Some((i, *e)),
        _ => None,
    });
    match failed {
        None => {
            witnessed(w, ops);
            Ok(results.into_iter().map(|r| r.unwrap_or_default()).collect())
        }
        Some((i, e)) => Err(MultiFail {
            index: Some(i),
            fail: fail_of(CallError::Zk(e)),
        }),
    }
}

/// Whether any running keeper's applied tree has `path`, or a keeper
/// witnessed its creation as a block id (the invariants' look at the
/// coordinator, outside the simulation's messages).
fn coordinator_has(w: &W, path: &str) -> bool {
    let mut world = w.borrow_mut();
    let world = &mut *world;
    let c = &world.cluster;
    let applied = c
        .ids()
        .into_iter()
        .filter_map(|i| c.server(i))
        .any(|s| s.state().get(path).is_some());
    if applied {
        return true;
    }
    let Some(t) = world.table.as_mut() else {
        return false;
    };
    // the keepers' logs are read once, as they grow: a check of every
    // line per look made a run whose expectations stay unmet (a planted
    // `lose-part`) quadratic in its length
    for i in c.ids() {
        let log = c.log(i);
        let seen = t.log_read.entry(i).or_insert(0);
        for (_, ev, f) in log.get(*seen..).unwrap_or_default() {
            if *ev == drift_keeper::NodeEvent::BlockId.name() && f["op"] == "create" && !f["ctime_ms"].is_null() {
                if let Some(p) = f["path"].as_str() {
                    t.blocks_created.insert(p.to_string());
                }
            }
        }
        *seen = log.len();
    }
    t.blocks_created.contains(path)
}

/// An invariant that `path` is in the coordinator: checked now, and if no
/// running keeper has it yet, again as the run goes on; broken (`what`)
/// only if it never shows ([`finish`]). One pending look per replica and
/// kind, none once that kind was reported.
fn expect_in_coordinator(w: &W, id: u64, kind: &str, path: &str, what: String) {
    if coordinator_has(w, path) {
        return;
    }
    let mut world = w.borrow_mut();
    if let Some(t) = world.table.as_mut() {
        let key = (id, kind.to_string());
        if !t.reported.contains(&key) {
            t.pending.entry(key).or_insert_with(|| (path.to_string(), what));
        }
    }
}

/// A multi that committed: each path it deleted was in the coordinator,
/// so an expectation pending on it is met (a clone clearing a listing,
/// a reconcile forgetting a part, a merge replacing one may delete it
/// before a running keeper was seen to hold it).
fn witnessed(w: &W, ops: &[KeeperOp]) {
    if let Some(t) = w.borrow_mut().table.as_mut() {
        if t.pending.is_empty() {
            return;
        }
        for op in ops {
            if let KeeperOp::Delete { path, .. } = op {
                t.pending.retain(|_, (p, _)| p != path);
            }
        }
    }
}

/// Looks again at the pending expectations: those the coordinator now
/// shows are met.
fn recheck(w: &W) {
    let pending: Vec<((u64, String), String)> = match w.borrow().table.as_ref() {
        Some(t) => t.pending.iter().map(|(k, (p, _))| (k.clone(), p.clone())).collect(),
        None => return,
    };
    for (key, path) in pending {
        if coordinator_has(w, &path) {
            if let Some(t) = w.borrow_mut().table.as_mut() {
                t.pending.remove(&key);
            }
        }
    }
}

/// The run's end: an expectation still unmet after the heal and the
/// final phase (every keeper back and converged) is a broken invariant.
pub fn finish(w: &W) {
    recheck(w);
    let pending = match w.borrow_mut().table.as_mut() {
        Some(t) => std::mem::take(&mut t.pending),
        None => return,
    };
    for ((id, kind), (_, what)) in pending {
        violated(w, id, &kind, what);
    }
}

// ---- the replica's life ---------------------------------------------------

/// A replica's loop in life `life`: a session (registering the replica
/// on its first), then, every [`LOOP_US`], the log pulled, the queue
/// run, the session pinged and the leader's cleanup.
async fn replica_loop(w: W, id: u64, life: u64) {
    while alive(&w, id, life) {
        while_paused(&w, id).await;
        if !alive(&w, id, life) {
            return;
        }
        let s = match session(&w, id, life) {
            Some(s) if !s.is_expired() && !hooks(&w, id).keeper_cut => s,
            gone => {
                if let Some(s) = gone {
                    // expired, or cut: walk away, read-only until a new one
                    s.abandon();
                    log(&w, id, "session_ended", json!({"session": s.session_id()}));
                    with_run(&w, id, life, |run| {
                        run.session = None;
                        run.readonly = Some("no coordinator session".into());
                    });
                }
                if hooks(&w, id).keeper_cut {
                    sleep_for(&w, RECONNECT_US).await;
                    continue;
                }
                match activate(&w, id, life).await {
                    Ok(()) => continue,
                    Err(e) => {
                        log(&w, id, "activate_failed", json!({"error": e}));
                        if let Some(s) = with_run(&w, id, life, |run| run.session.take()).flatten() {
                            s.abandon();
                        }
                        sleep_for(&w, RECONNECT_US).await;
                        continue;
                    }
                }
            }
        };
        s.ping();
        if let Err(e) = pull_log(&w, id, life, &s).await {
            if e != Fail::NoSession {
                log(&w, id, "pull_failed", json!({"error": e.to_string()}));
            }
        }
        run_queue(&w, id, life, &s);
        sleep_for(&w, LOOP_US).await;
    }
}

/// The leader's chores in life `life`, on a task of their own (as the
/// node's leader loop), when this replica is the leader: every merge
/// selecting period the next merge assigned, every cleanup period the
/// block ids past the window removed.
async fn leader_loop(w: W, id: u64, life: u64) {
    let (period_us, cleanup_us) = w
        .borrow()
        .table
        .as_ref()
        .map(|t| {
            let s = &t.schema.settings;
            (
                s.merge_selecting_period_ms.max(1) * 1000,
                s.cleanup_delay_period_ms.max(1) * 1000,
            )
        })
        .unwrap_or((1_000_000, 1_000_000));
    let mut last_cleanup = exec::now_us(&w);
    while alive(&w, id, life) {
        sleep_for(&w, period_us).await;
        while_paused(&w, id).await;
        let s = session(&w, id, life).filter(|s| !s.is_expired());
        let writable = with_run(&w, id, life, |run| run.readonly.is_none()).unwrap_or(false);
        let (Some(s), true) = (s, writable) else { continue };
        if let Err(e) = assign_merge(&w, id, life, &s).await {
            log(&w, id, "merge_assign_failed", json!({"error": e}));
        }
        if exec::now_us(&w) - last_cleanup >= cleanup_us {
            last_cleanup = exec::now_us(&w);
            cleanup(&w, id, life, s).await;
        }
    }
}

/// A new session: the table's nodes, the replica's registration (first
/// time in this life), `is_active`, the leader candidacy.
async fn activate(w: &W, id: u64, life: u64) -> Result<(), String> {
    let spec = w.borrow().table.as_ref().map(|t| t.spec.clone()).ok_or("no table")?;
    let first = spec.servers.iter().position(|&s| s == id).unwrap_or(0);
    let s = Rc::new(SimZk::connect(w, &spec, first, false).await?);
    if !alive(w, id, life) {
        s.abandon();
        return Err("the replica stopped".into());
    }
    with_run(w, id, life, |run| run.session = Some(s.clone()));
    let (paths, name) = {
        let world = w.borrow();
        let t = world.table.as_ref().ok_or("no table")?;
        (t.paths_of(id), t.replicas[&id].name.clone())
    };
    let e = |what: &str| {
        let what = what.to_string();
        move |f: Fail| format!("{what}: {f}")
    };
    let mut skeleton = paths.table_skeleton();
    skeleton.push(paths.quorum_last_part());
    for p in skeleton {
        match create(w, &s, &p, b"", CreateMode::Persistent).await {
            Ok(_) | Err(Fail::NodeExists) => {}
            Err(f) => return Err(e(&p)(f)),
        }
    }
    let registered = with_run(w, id, life, |run| run.registered).unwrap_or(false);
    let lost = get(w, &s, &paths.is_lost_of(&name))
        .await
        .map_err(e("is_lost"))?
        .is_some_and(|(d, _)| d == b"1");
    if !registered || lost {
        register(w, id, life, &s, &paths, &name, lost).await?;
    }
    // is_active: one left by an earlier session of this replica goes
    let active = paths.is_active_of(&name);
    let me = s.session_id().to_string();
    let mut marked = false;
    for _ in 0..3 {
        match create(w, &s, &active, me.as_bytes(), CreateMode::Ephemeral).await {
            Ok(_) => {
                marked = true;
                break;
            }
            Err(Fail::NodeExists) => {
                if let Some(st) = exists(w, &s, &active).await.map_err(e("is_active"))? {
                    if st.ephemeral_owner == s.session_id() {
                        marked = true;
                        break;
                    }
                    let _ = delete(w, &s, &active).await;
                }
            }
            Err(f) => return Err(e("is_active")(f)),
        }
    }
    if !marked {
        return Err("is_active: another session keeps recreating it".into());
    }
    let candidacy = create(
        w,
        &s,
        &format!("{}/leader-", paths.leader_election()),
        name.as_bytes(),
        CreateMode::EphemeralSequential,
    )
    .await
    .map_err(e("leader candidacy"))?;
    with_run(w, id, life, |run| {
        run.candidacy = Some(candidacy);
        run.readonly = None;
    });
    log(w, id, "replica_active", json!({"session": s.session_id()}));
    Ok(())
}

/// The replica's registration in this life: created if the coordinator
/// does not know it; a new, wiped or lost replica clones a healthy one,
/// any other has its disk reconciled with what the coordinator lists for
/// it; then its queue and log pointer loaded (as the node registers).
#[allow(clippy::too_many_arguments)] // the replica's run and whether it was marked lost
async fn register(
    w: &W,
    id: u64,
    life: u64,
    s: &Rc<SimZk>,
    paths: &Paths,
    name: &str,
    lost: bool,
) -> Result<(), String> {
    let host = format!("sim:{id}");
    let known = exists(w, s, &paths.me())
        .await
        .map_err(|f| format!("replica node: {f}"))?
        .is_some();
    let identity = w.borrow().table.as_ref().is_some_and(|t| t.replicas[&id].identity);
    let wiped = known && !identity;
    if !known {
        match multi(w, s, &core::register_ops(paths, name, &host)).await {
            Ok(_) => log(w, id, "replica_created", json!({})),
            Err(MultiFail {
                index: Some(0),
                fail: Fail::NodeExists,
            }) => {}
            Err(f) => return Err(format!("creating replica {name}: {}", f.fail)),
        }
    }
    if !known || wiped || lost {
        // a wiped or lost replica's leftovers in the coordinator go first,
        // and what its disk holds (the node detaches it)
        clear_replica_nodes(w, s, paths, name).await?;
        for p in disk_parts(w, id) {
            remove_part(w, id, &p);
        }
        log(
            w,
            id,
            "clone_started",
            json!({"new": !known, "wiped": wiped, "lost": lost}),
        );
        clone_replica(w, id, s, paths, name, !known).await?;
    } else {
        reconcile_disk(w, id, s, paths, name).await?;
    }
    load_queue(w, id, life, s, paths, name).await?;
    with_run(w, id, life, |run| run.registered = true);
    if let Some(t) = w.borrow_mut().table.as_mut() {
        if let Some(r) = t.replicas.get_mut(&id) {
            r.identity = true;
        }
    }
    Ok(())
}

/// Deletes the replica's queue and part znodes, a multi's worth at a time.
async fn clear_replica_nodes(w: &W, s: &SimZk, paths: &Paths, name: &str) -> Result<(), String> {
    for dir in [paths.queue_of(name), paths.parts_of(name)] {
        let kids = children(w, s, &dir).await.map_err(|f| format!("{dir}: {f}"))?;
        for ops in core::clear_ops(&dir, &kids) {
            multi(w, s, &ops)
                .await
                .map_err(|f| format!("clearing {dir}: {}", f.fail))?;
        }
    }
    Ok(())
}

/// Copies a healthy replica's state (`drift_table::replica`'s cloning):
/// its log pointer, a GET_PART for each of its parts, and its queue.
/// With no replica to copy, starts at the log's oldest entry.
async fn clone_replica(w: &W, id: u64, s: &SimZk, paths: &Paths, name: &str, new: bool) -> Result<(), String> {
    let e = |what: &'static str| move |f: Fail| format!("cloning ({what}): {f}");
    let mut candidates = Vec::new();
    for r in children(w, s, &paths.replicas()).await.map_err(e("replicas"))? {
        if r == name {
            continue;
        }
        let is_lost = get(w, s, &paths.is_lost_of(&r))
            .await
            .map_err(e("is_lost"))?
            .map(|(d, _)| d);
        let active = is_active(w, s, paths, &r).await.map_err(e("is_active"))?;
        candidates.push(core::CloneCandidate {
            name: r,
            is_lost,
            active,
        });
    }
    let Some(src) = core::clone_source(name, &candidates) else {
        let log_names = children(w, s, &paths.log()).await.map_err(e("log"))?;
        let (pointer, ops) = core::start_from_log_ops(paths, name, &log_names);
        multi(w, s, &ops)
            .await
            .map_err(|f| format!("cloning (pointer): {}", f.fail))?;
        if !new {
            log(w, id, "clone_without_source", json!({"log_pointer": pointer}));
        }
        return Ok(());
    };
    loop {
        let Some((pointer, version)) = get(w, s, &paths.log_pointer_of(&src))
            .await
            .map_err(e("source pointer"))?
        else {
            return Err(format!("cloning: replica {src} has no log_pointer"));
        };
        // the queue before the parts (see `drift_table::replica`'s cloning)
        let queue_dir = paths.queue_of(&src);
        let queue = children(w, s, &queue_dir).await.map_err(e("source queue"))?;
        let mut queued = Vec::new();
        for q in &queue {
            if let Some((d, _)) = get(w, s, &format!("{queue_dir}/{q}"))
                .await
                .map_err(e("source queue entries"))?
            {
                queued.push(d);
            }
        }
        let parts = children(w, s, &paths.parts_of(&src)).await.map_err(e("source parts"))?;
        let now_s = (wall_ms(w, id) / 1000) as i64;
        for ops in core::clone_queue_ops(paths, &src, &parts, &queued, now_s) {
            multi(w, s, &ops)
                .await
                .map_err(|f| format!("cloning (queue): {}", f.fail))?;
        }
        // the pointer moves only if the source's did not meanwhile
        match multi(w, s, &core::clone_done_ops(paths, name, &src, &pointer, version)).await {
            Ok(_) => {
                log(
                    w,
                    id,
                    "cloned",
                    json!({"source": src, "parts": parts.len(), "queue": queue.len(), "new": new}),
                );
                return Ok(());
            }
            Err(MultiFail {
                fail: Fail::BadVersion, ..
            }) => clear_replica_nodes(w, s, paths, name).await?,
            Err(f) => return Err(format!("cloning (pointer): {}", f.fail)),
        }
    }
}

/// A known replica's disk against what the coordinator lists for it
/// (`drift_table::reconcile`): old parts a merge replaced go, unexpected
/// and broken ones too, listed parts not held are fetched again.
async fn reconcile_disk(w: &W, id: u64, s: &SimZk, paths: &Paths, name: &str) -> Result<(), String> {
    let listed: BTreeSet<String> = children(w, s, &paths.parts_of(name))
        .await
        .map_err(|f| format!("reconcile: {f}"))?
        .into_iter()
        .collect();
    let on_disk: Vec<String> = disk_parts(w, id);
    let sorted = drift_table::reconcile::sort(&listed, &on_disk);
    for p in sorted.remove.iter().chain(&sorted.unexpected) {
        if sorted.unexpected.contains(p) {
            log(w, id, "part_unexpected", json!({"part": p}));
        }
        remove_part(w, id, p);
    }
    let schema = w.borrow().table.as_ref().map(|t| t.schema.clone()).ok_or("no table")?;
    let checked: BTreeMap<String, Result<(), String>> = sorted
        .check
        .iter()
        .map(|p| {
            let files = read_part(w, id, p).unwrap_or_default();
            (
                p.clone(),
                format::verify(&schema, &files).map(|_| ()).map_err(|e| e.to_string()),
            )
        })
        .collect();
    let settled = drift_table::reconcile::settle(&listed, &checked)?;
    for (p, why) in &settled.broken {
        log(w, id, "part_broken", json!({"part": p, "why": why}));
        remove_part(w, id, p);
    }
    let now_s = wall_ms(w, id) / 1000;
    for part in &settled.refetch {
        multi(w, s, &core::refetch_ops(paths, name, part, now_s as i64))
            .await
            .map_err(|f| format!("re-queueing missing part {part}: {}", f.fail))?;
        log(w, id, "part_missing_refetch", json!({"part": part.name()}));
    }
    Ok(())
}

/// Reads the replica's queue and log pointer from the coordinator into
/// memory, its current parts those on disk the coordinator lists for it
/// (after registration, and after a pull whose pointer moved under it:
/// an earlier pull that committed and lost its answer).
async fn load_queue(w: &W, id: u64, life: u64, s: &Rc<SimZk>, paths: &Paths, name: &str) -> Result<(), String> {
    for tries in 1..=RELOAD_TRIES_MAX {
        if read_queue(w, id, life, s, paths, name).await? {
            log(w, id, "queue_loaded", json!({"reads": tries}));
            return Ok(());
        }
    }
    Err(format!(
        "commits kept landing during {RELOAD_TRIES_MAX} reloads of the queue"
    ))
}

/// One [`load_queue`]: false if a commit made a part current while it
/// read (the listing it read may miss that part), nothing swapped.
async fn read_queue(w: &W, id: u64, life: u64, s: &Rc<SimZk>, paths: &Paths, name: &str) -> Result<bool, String> {
    let Some(epoch) = with_run(w, id, life, |run| run.commits) else {
        return Ok(true);
    };
    let listed: BTreeSet<String> = children(w, s, &paths.parts_of(name))
        .await
        .map_err(|f| format!("parts: {f}"))?
        .into_iter()
        .collect();
    let dir = paths.queue_of(name);
    let kids = children(w, s, &dir).await.map_err(|f| format!("queue: {f}"))?;
    // every entry read in one round trip, as the node's multi-read does:
    // the requests pipelined on the session
    let mut waits = Vec::new();
    for k in &kids {
        let (slot, wait) = exec::oneshot();
        let (w2, s2, path) = (w.clone(), s.clone(), format!("{dir}/{k}"));
        exec::spawn(w, async move { slot.fill(get(&w2, &s2, &path).await) });
        waits.push(wait);
    }
    let mut entries = Vec::new();
    for (k, wait) in kids.iter().zip(waits) {
        if let Some((d, _)) = wait.await.map_err(|f| format!("queue entry: {f}"))? {
            entries.push((k.clone(), d));
        }
    }
    let (ptr, version) = get(w, s, &paths.log_pointer_of(name))
        .await
        .map_err(|f| format!("log_pointer: {f}"))?
        .ok_or("no log_pointer")?;
    let mut current = ActivePartSet::new();
    for p in disk_parts(w, id).into_iter().filter(|p| listed.contains(p)) {
        if let Ok(pi) = PartInfo::parse(&p) {
            let _ = current.add(pi);
        }
    }
    let mut queue = Queue::new(current);
    let mut obsolete = Vec::new();
    for (k, d) in entries {
        match drift_table::LogEntry::decode(&String::from_utf8_lossy(&d)) {
            Ok(entry) => obsolete.extend(queue.push(k, entry)?),
            Err(why) => log(
                w,
                id,
                "queue_entry_unreadable",
                json!({"entry": k, "why": why.to_string()}),
            ),
        }
    }
    for z in obsolete {
        let _ = delete(w, s, &format!("{dir}/{z}")).await;
    }
    let current: Vec<PartInfo> = queue.current().iter().cloned().collect();
    let swapped = with_run(w, id, life, |run| {
        if run.commits != epoch {
            return false;
        }
        // entries running now finish against the new queue
        queue.adopt_running(&run.queue);
        run.queue = queue;
        run.log_pointer = core::parse_pointer(&ptr);
        run.pointer_version = version;
        true
    });
    if swapped != Some(true) {
        return Ok(swapped.is_none());
    }
    for p in current {
        check_current(w, id, &paths.my_part(&p.name()), &p);
    }
    Ok(true)
}

/// The invariant: a part becomes current only where the coordinator
/// lists it for this replica.
fn check_current(w: &W, id: u64, listing: &str, part: &PartInfo) {
    let what = format!("part {part} became current on r{id} while the coordinator does not list it there");
    expect_in_coordinator(w, id, "current before listed", listing, what);
}

// ---- the disk ---------------------------------------------------------------

fn disk_parts(w: &W, id: u64) -> Vec<String> {
    let world = w.borrow();
    world
        .table
        .as_ref()
        .and_then(|t| t.replicas.get(&id))
        .map(|r| r.disk.keys().cloned().collect())
        .unwrap_or_default()
}

fn read_part(w: &W, id: u64, name: &str) -> Option<Files> {
    let world = w.borrow();
    world.table.as_ref()?.replicas.get(&id)?.disk.get(name).cloned()
}

fn write_part(w: &W, id: u64, name: &str, files: Files) {
    if let Some(r) = w.borrow_mut().table.as_mut().and_then(|t| t.replicas.get_mut(&id)) {
        r.disk.insert(name.to_string(), files);
    }
}

fn remove_part(w: &W, id: u64, name: &str) {
    if let Some(r) = w.borrow_mut().table.as_mut().and_then(|t| t.replicas.get_mut(&id)) {
        r.disk.remove(name);
    }
}

fn wall_ms(w: &W, id: u64) -> u64 {
    w.borrow().cluster.wall_us(id) / 1000
}

// ---- the log puller ---------------------------------------------------------

/// Copies the log's new entries into the replica's queue, one pull at a
/// time per replica (the node's pull lock): the replica's loop and the
/// leader's merge assignment both pull, and two pulls racing on the
/// pointer would each copy from the same place.
async fn pull_log(w: &W, id: u64, life: u64, s: &Rc<SimZk>) -> Result<(), Fail> {
    if !lock_pulls(w, id, life).await {
        return Ok(());
    }
    let pulled = pull_log_locked(w, id, life, s).await;
    with_run(w, id, life, |run| run.pulling = false);
    pulled
}

/// Takes the replica's pull lock (the node's), waiting for a pull that
/// holds it; false if the replica stopped. Released by clearing
/// `Run::pulling`.
async fn lock_pulls(w: &W, id: u64, life: u64) -> bool {
    let mut waited = false;
    loop {
        match with_run(w, id, life, |run| !std::mem::replace(&mut run.pulling, true)) {
            Some(true) => break,
            Some(false) => {
                waited = true;
                sleep_for(w, PULL_WAIT_US).await;
            }
            None => return false,
        }
    }
    if waited {
        log(w, id, "pull_waited", json!({}));
    }
    true
}

/// An entry's commit found the coordinator ahead of the replica's memory
/// (`drift_table::replica::commit_shows_stale_memory`): the queue and the
/// current parts are read again, under the pull lock, as the node does.
async fn reload_stale(w: &W, id: u64, life: u64, entry: &str) {
    let Some(s) = session(w, id, life) else { return };
    let (paths, name) = match w.borrow().table.as_ref() {
        Some(t) => (t.paths_of(id), t.replicas[&id].name.clone()),
        None => return,
    };
    if !lock_pulls(w, id, life).await {
        return;
    }
    let loaded = load_queue(w, id, life, &s, &paths, &name).await;
    with_run(w, id, life, |run| run.pulling = false);
    let error = loaded.err();
    log(w, id, "stale_commit_reloaded", json!({"entry": entry, "error": error}));
}

async fn pull_log_locked(w: &W, id: u64, life: u64, s: &Rc<SimZk>) -> Result<(), Fail> {
    let mut pulls = core::Pulls::default();
    loop {
        match pulls.after(pull_once(w, id, life, s).await?) {
            core::PullNext::Again => {}
            core::PullNext::Done { past_reload, .. } => {
                if let Some(n) = past_reload {
                    log(w, id, "pulled_past_reload", json!({"entries": n}));
                }
                return Ok(());
            }
            core::PullNext::GaveUp(why) => return Err(Fail::Other(why)),
        }
    }
}

/// One pass of the puller over the log as listed now. After a reload
/// the caller pulls again: a merge chosen after a pull that stopped at
/// the reload would span parts the queue never heard of (swarm seed 202
/// of insert-retry).
async fn pull_once(w: &W, id: u64, life: u64, s: &Rc<SimZk>) -> Result<Pulled, Fail> {
    let (paths, name) = {
        let world = w.borrow();
        let t = world.table.as_ref().ok_or(Fail::NoSession)?;
        (t.paths_of(id), t.replicas[&id].name.clone())
    };
    let names = children(w, s, &paths.log()).await?;
    let Some(pointer) = with_run(w, id, life, |run| run.log_pointer) else {
        return Ok(Pulled::Done(0));
    };
    let to_copy = core::to_copy(&names, pointer);
    if let Some(oldest) = to_copy.gap {
        log(
            w,
            id,
            "log_gap",
            json!({"log_pointer": pointer, "oldest_entry": oldest}),
        );
    }
    let mut batch = 1;
    let mut at = 0;
    let new = to_copy.entries;
    while at < new.len() {
        let chunk = &new[at..(at + batch).min(new.len())];
        // the batch's entries read in one round trip, as the node's
        // multi-read does: the requests pipelined on the session
        let mut waits = Vec::new();
        for (_, n) in chunk {
            let (slot, wait) = exec::oneshot();
            let (w2, s2, path) = (w.clone(), s.clone(), format!("{}/{n}", paths.log()));
            exec::spawn(w, async move { slot.fill(get(&w2, &s2, &path).await) });
            waits.push(wait);
        }
        let mut datas = Vec::new();
        for ((i, _), wait) in chunk.iter().zip(waits) {
            let d = wait.await?;
            datas.push((*i, d.map(|(d, _)| d)));
        }
        let next = chunk.last().map(|(i, _)| i + 1).unwrap_or(pointer);
        let Some(version) = with_run(w, id, life, |run| run.pointer_version) else {
            return Ok(Pulled::Done(at));
        };
        let b = core::copy_batch(&paths, &name, &datas, next, version);
        for (index, why) in &b.unreadable {
            log(w, id, "log_entry_unreadable", json!({"index": index, "why": why}));
        }
        let created = match multi(w, s, &b.ops).await {
            Ok(r) => r,
            Err(MultiFail {
                fail: Fail::BadVersion, ..
            }) => {
                // the pointer moved under this pull (an earlier one that
                // committed and lost its answer): the queue read again
                log(w, id, "pointer_moved", json!({"log_pointer": pointer}));
                // not read again, the queue in memory lacks what that pull
                // copied: the pull failed (a merge chosen from that queue
                // would span a part it never heard of and drop its rows,
                // seed 625 of the first 1,000-seed sweep with merges)
                return match load_queue(w, id, life, s, &paths, &name).await {
                    Ok(()) => Ok(Pulled::Reloaded(at)),
                    Err(e) => {
                        log(w, id, "queue_reload_failed", json!({"error": e}));
                        Err(Fail::Other(format!("the queue is not read again: {e}")))
                    }
                };
            }
            Err(MultiFail { fail, .. }) => return Err(fail),
        };
        let obsolete = with_run(w, id, life, |run| {
            let mut obsolete = Vec::new();
            for (path, e) in created.iter().zip(b.entries) {
                let znode = path.rsplit('/').next().unwrap_or(path).to_string();
                match run.queue.push(znode, e) {
                    Ok(o) => obsolete.extend(o),
                    Err(why) => obsolete.push(format!("!{why}")),
                }
            }
            run.log_pointer = next;
            run.pointer_version = version + 1;
            obsolete
        })
        .unwrap_or_default();
        for z in obsolete {
            match z.strip_prefix('!') {
                Some(why) => log(w, id, "queue_push_refused", json!({"why": why})),
                None => {
                    let _ = delete(w, s, &format!("{}/{z}", paths.queue_of(&name))).await;
                }
            }
        }
        at += chunk.len();
        batch = core::next_batch(batch);
        // what was copied runs while the pull goes on (the node's queue
        // runner does not wait for its puller)
        run_queue(w, id, life, s);
    }
    Ok(Pulled::Done(at))
}

// ---- the queue ----------------------------------------------------------------

/// The next entry the queue lets run on replica `id` now (none while it
/// is read-only; the fetch and merge pools bound how many run at once).
fn select(w: &W, id: u64, life: u64) -> Option<Selected> {
    let (fetches, merges) = {
        let world = w.borrow();
        let s = &world.table.as_ref()?.schema.settings;
        (s.fetch_pool_size, s.merge_pool_size)
    };
    let now_ms = exec::now_us(w) / 1000;
    with_run(w, id, life, |run| {
        if run.readonly.is_some() {
            None
        } else {
            run.queue.select(now_ms, fetches, merges)
        }
    })
    .flatten()
}

/// Starts every entry the queue lets run now, each on a task of its own
/// (the fetch and merge pools bound them), as the node's runner does.
fn run_queue(w: &W, id: u64, life: u64, s: &Rc<SimZk>) {
    while let Some(sel) = select(w, id, life) {
        let (w2, s2) = (w.clone(), s.clone());
        exec::spawn(w, async move { run_entries(&w2, id, life, &s2, sel).await });
    }
}

/// Runs `first`, then whatever the queue lets run next, until it lets
/// nothing run (a finished entry wakes the runner, as on the node).
async fn run_entries(w: &W, id: u64, life: u64, s: &SimZk, first: Selected) {
    let mut next = Some(first);
    while let Some(sel) = next {
        run_entry(w, id, life, s, sel).await;
        if s.is_expired() || !alive(w, id, life) {
            return;
        }
        next = select(w, id, life);
    }
}

/// Runs one selected entry (a part to fetch, or a merge) and finishes it
/// in the queue.
async fn run_entry(w: &W, id: u64, life: u64, s: &SimZk, sel: Selected) {
    let outcome = match EntryRun::new(w, id, life, s, &sel) {
        Err(e) => Err(e),
        Ok(r) => match &sel.entry.kind {
            EntryKind::GetPart { part, quorum, block_id } => {
                let q = (*quorum > 0).then_some(block_id.as_deref());
                get_part(&r, part, false, q).await
            }
            EntryKind::MergeParts { parts, into } => merge_parts(&r, parts, into).await,
            EntryKind::DropRange { .. } => Err(format!("entry {} (DROP_RANGE) is not simulated", sel.znode)),
        },
    };
    if let Err(why) = outcome {
        let now_ms = exec::now_us(w) / 1000;
        with_run(w, id, life, |run| run.queue.finish_err(&sel.znode, now_ms, &why));
    }
}

/// One run of a queue entry: the replica running it (in its life `life`,
/// through session `s`), the entry, and what every step of the run reads:
/// the table's paths, this replica's name, the schema and the entry's
/// queue node.
struct EntryRun<'a> {
    w: &'a W,
    id: u64,
    life: u64,
    s: &'a SimZk,
    sel: &'a Selected,
    paths: Paths,
    name: String,
    schema: Schema,
    entry_path: String,
}

impl<'a> EntryRun<'a> {
    fn new(w: &'a W, id: u64, life: u64, s: &'a SimZk, sel: &'a Selected) -> Result<EntryRun<'a>, String> {
        let world = w.borrow();
        let t = world.table.as_ref().ok_or("no table")?;
        let (paths, name) = (t.paths_of(id), t.replicas[&id].name.clone());
        let entry_path = format!("{}/{}", paths.queue_of(&name), sel.znode);
        Ok(EntryRun {
            w,
            id,
            life,
            s,
            sel,
            schema: t.schema.clone(),
            paths,
            name,
            entry_path,
        })
    }

    fn with_run<T>(&self, f: impl FnOnce(&mut Run) -> T) -> Option<T> {
        with_run(self.w, self.id, self.life, f)
    }

    fn log(&self, event: &'static str, fields: Value) {
        log(self.w, self.id, event, fields)
    }
}

/// A MERGE_PARTS entry: done if the merged part (or one containing it)
/// is here; merged here from the source parts when all of them are
/// current, and recorded with what it replaces in one multi; else
/// fetched from a replica that merged it already (as the node does, and
/// ClickHouse: a replica missing a source takes the result instead).
async fn merge_parts(r: &EntryRun<'_>, parts: &[PartInfo], into: &PartInfo) -> Result<(), String> {
    let (w, id, life) = (r.w, r.id, r.life);
    let schema = &r.schema;
    let all_here = r
        .with_run(|run| parts.iter().all(|p| run.queue.current().contains_exactly(p)))
        .ok_or("the replica stopped")?;
    let have = r
        .with_run(|run| run.queue.current().containing(into).is_some())
        .unwrap_or(false);
    if have || !all_here {
        return get_part(r, into, true, None).await;
    }
    let mut blocks = Vec::with_capacity(parts.len());
    for p in parts {
        let files = read_part(w, id, &p.name()).ok_or_else(|| format!("source part {p} is not on disk"))?;
        blocks.push(format::decode_part(schema, &files).map_err(|e| format!("source part {p}: {e}"))?);
    }
    let files = format::encode_part(schema, &Block::merge(schema, &blocks));
    // a part made here: its own checksums are the ones to list
    let sums = Checksums::of(&files);
    if !alive(w, id, life) {
        return Err("the replica stopped".into());
    }
    write_part(w, id, &into.name(), files);
    let replaced = replaced_by(w, id, life, into);
    let held = core::held_ops(&r.paths, into, &sums, &replaced, Vec::new());
    commit_entry(r, held, None).await.map_err(|f| f.to_string())?;
    r.log("part_merged", json!({"part": into.name(), "parts": parts.len()}));
    Ok(())
}

/// Current parts on replica `id` that `part` would replace.
fn replaced_by(w: &W, id: u64, life: u64, part: &PartInfo) -> Vec<PartInfo> {
    with_run(w, id, life, |run| {
        run.queue
            .current()
            .contained_by(part)
            .into_iter()
            .filter(|p| p != part)
            .collect()
    })
    .unwrap_or_default()
}

/// A GET_PART entry (or a merge's result, `merged`): done if the part or
/// one containing it is here, else fetched from a replica that lists it,
/// or, merged away everywhere, a part that contains it (as ClickHouse
/// fetches a covering part), checked, written and recorded with the
/// entry's removal in one multi. `quorum`: the entry's part was inserted
/// with a quorum (and its block id, if any): the replica that now holds
/// it counts in the quorum node, in the same multi; a part no replica
/// lists has its quorum failed.
async fn get_part(r: &EntryRun<'_>, part: &PartInfo, merged: bool, quorum: Option<Option<&str>>) -> Result<(), String> {
    let (w, id, s, sel) = (r.w, r.id, r.s, r.sel);
    let (paths, name) = (&r.paths, &r.name);
    let here = r.with_run(|run| {
        let q = run.queue.current();
        (q.containing(part).is_some(), q.contains_exactly(part))
    });
    if let Some((true, exactly)) = here {
        // our own insert, or fetched by an earlier run: a quorum counts
        // the replica that holds the very part
        let count = quorum.is_some() && exactly && sel.entry.source_replica != *name;
        return commit_with_quorum(r, part, count, Vec::new(), None).await;
    }
    if hooks(w, id).fetches_stopped {
        return Err("fetches are stopped".into());
    }
    // the writer on the first try (one round trip: it has the part
    // unless it lost it or merged it away), after a failure an active
    // replica that lists it; the listing read is the one the fetch checks
    let mut source = None;
    let writer = &sel.entry.source_replica;
    if sel.tries <= 1 && writer != name {
        if let Some((listing, _)) = get(w, s, &paths.part_of(writer, &part.name()))
            .await
            .map_err(|f| f.to_string())?
        {
            source = Some((writer.clone(), listing));
        }
    }
    if source.is_none() {
        let replicas = children(w, s, &paths.replicas()).await.map_err(|f| f.to_string())?;
        for other in replicas.iter().filter(|o| *o != name) {
            let Some((listing, _)) = get(w, s, &paths.part_of(other, &part.name()))
                .await
                .map_err(|f| f.to_string())?
            else {
                continue;
            };
            if !is_active(w, s, paths, other).await.map_err(|f| f.to_string())? {
                continue;
            }
            source = Some((other.clone(), listing));
            break;
        }
    }
    if let Some((source, listing)) = source {
        return fetch_and_commit(r, part, &source, Some(listing), quorum.is_some()).await;
    }
    let (covering, anywhere) = covering_part(w, s, paths, name, part).await?;
    if let Some((source, covering)) = covering {
        log(
            w,
            id,
            "fetch_covering",
            json!({"part": part.name(), "covering": covering.name(), "from": source}),
        );
        return fetch_and_commit(r, &covering, &source, None, false).await;
    }
    if merged {
        return Err(format!("no replica has merged {part} yet"));
    }
    let lost = match quorum {
        // a quorum insert's part on no replica: its quorum fails (and
        // its block id goes, so a retry writes it again)
        Some(block_id) => fail_quorum_if_lost(w, id, s, paths, part, block_id).await?,
        // no replica at all, active or not, lists it or a part containing
        // it: its writer lost it before anyone fetched it (a wiped disk).
        // Lost forever, as the node says: the entry goes, the rows are
        // gone and the checker must see that rather than a queue stuck on
        // them
        None if !anywhere => {
            log(w, id, "part_lost_forever", json!({"part": part.name()}));
            true
        }
        None => false,
    };
    if !lost {
        return Err(format!("No active replica has part {part} or covering part"));
    }
    match delete(w, s, &r.entry_path).await {
        Ok(()) | Err(Fail::NoNode) => {}
        Err(f) => return Err(format!("part {part} is lost, its entry stays: {f}")),
    }
    if let Some(Err(e)) = r.with_run(|run| run.queue.drop_running(&sel.znode)) {
        log(w, id, "queue_remove_failed", json!({"entry": sel.znode, "error": e}));
    }
    Ok(())
}

/// If no replica, active or not, lists `part` and a quorum node still
/// waits for it, the insert's part is lost: its quorum failed and its
/// block id removed in one multi (`drift_table::quorum::fail_ops`).
/// Whether the part is lost (this replica or another gave up on it).
async fn fail_quorum_if_lost(
    w: &W,
    id: u64,
    s: &SimZk,
    paths: &Paths,
    part: &PartInfo,
    block_id: Option<&str>,
) -> Result<bool, String> {
    let e = |f: Fail| f.to_string();
    let name = part.name();
    if exists(w, s, &paths.quorum_failed_part(&name))
        .await
        .map_err(e)?
        .is_some()
    {
        return Ok(true);
    }
    for r in children(w, s, &paths.replicas()).await.map_err(e)? {
        if exists(w, s, &paths.part_of(&r, &name)).await.map_err(e)?.is_some() {
            return Ok(false);
        }
    }
    let mut node = None;
    for path in quorum::nodes_of(paths, part) {
        let guard = status_guard(w, s, paths, &path).await.map_err(e)?;
        if let Some((data, stat)) = get(w, s, &path).await.map_err(e)? {
            if quorum::decode_data(&data).is_some_and(|q| q.part == *part) {
                node = Some((path, stat, guard));
                break;
            }
        }
    }
    let Some((path, version, guard)) = node else {
        return Ok(false);
    };
    let holder = match block_id {
        Some(b) => get(w, s, &paths.block(b)).await.map_err(e)?.map(|(d, v)| (b, d, v)),
        None => None,
    };
    let ops = quorum::fail_ops(
        paths,
        part,
        &path,
        version,
        guard.as_ref().map(|(d, v)| (&d[..], *v)),
        holder.as_ref().map(|(b, d, v)| (*b, &d[..], *v)),
    );
    match multi(w, s, &ops).await {
        Ok(_) => {
            log(w, id, "quorum_failed", json!({"part": name, "block_id": block_id}));
            Ok(true)
        }
        // another replica did it, or the node changed: look again later
        Err(MultiFail {
            fail: Fail::NoNode | Fail::BadVersion | Fail::NodeExists,
            ..
        }) => Ok(false),
        Err(f) => Err(f.fail.to_string()),
    }
}

/// The ops by which this replica, now holding `part`, counts in the
/// quorum node waiting for it (none if no node waits for it).
async fn quorum_ops(w: &W, s: &SimZk, paths: &Paths, name: &str, part: &PartInfo) -> Result<Vec<KeeperOp>, Fail> {
    for path in quorum::nodes_of(paths, part) {
        let guard = status_guard(w, s, paths, &path).await?;
        let Some((data, version)) = get(w, s, &path).await? else {
            continue;
        };
        let guard = guard.as_ref().map(|(d, v)| (&d[..], *v));
        if let Some(ops) = quorum::held_ops(paths, name, part, &path, &data, version, guard) {
            return Ok(ops);
        }
    }
    Ok(Vec::new())
}

/// `quorum/last_part` as read before the status node at `path` (none for
/// a parallel node): see `drift_table::quorum::Guard`.
async fn status_guard(w: &W, s: &SimZk, paths: &Paths, path: &str) -> Result<Option<(Vec<u8>, i32)>, Fail> {
    if path != paths.quorum_status() {
        return Ok(None);
    }
    get(w, s, &paths.quorum_last_part()).await
}

/// Commits an entry whose part is here with the `held` ops, and, when
/// `count`, this replica counted in the part's quorum: a quorum node that
/// changed under the commit (another holder counted first) is read again,
/// as the node does.
async fn commit_with_quorum(
    r: &EntryRun<'_>,
    part: &PartInfo,
    count: bool,
    held: Vec<KeeperOp>,
    covering: Option<&PartInfo>,
) -> Result<(), String> {
    let sel = r.sel;
    for _ in 0..ASSIGN_ATTEMPTS_MAX {
        let mut ops = held.clone();
        let counted = if count {
            quorum_ops(r.w, r.s, &r.paths, &r.name, part)
                .await
                .map_err(|f| f.to_string())?
        } else {
            Vec::new()
        };
        // counting completes the quorum when it deletes the node
        let reached = counted.iter().any(|op| matches!(op, KeeperOp::Delete { .. }));
        let counts = !counted.is_empty();
        ops.extend(counted);
        match commit_entry(r, ops, covering).await {
            Err(Fail::BadVersion) if count => continue,
            Ok(()) if counts => {
                r.log("quorum_counted", json!({"part": part.name(), "reached": reached}));
                return Ok(());
            }
            other => return other.map_err(|f| format!("committing entry {}: {f}", sel.znode)),
        }
    }
    Err(format!("committing entry {}: the quorum node kept changing", sel.znode))
}

/// One pass over every replica's listing: the largest part an active
/// replica (not this one) lists that strictly contains `part`, with that
/// replica; and whether any replica at all, active or not, lists `part`
/// or a part containing it.
async fn covering_part(
    w: &W,
    s: &SimZk,
    paths: &Paths,
    name: &str,
    part: &PartInfo,
) -> Result<(Option<(String, PartInfo)>, bool), String> {
    let mut search = core::CoveringSearch::new(part, name);
    let replicas = children(w, s, &paths.replicas()).await.map_err(|f| f.to_string())?;
    for r in &replicas {
        let listed = match children(w, s, &paths.parts_of(r)).await {
            Ok(l) => l,
            Err(Fail::NoNode) => continue,
            Err(f) => return Err(f.to_string()),
        };
        if search.listed(r, &listed) && is_active(w, s, paths, r).await.map_err(|f| f.to_string())? {
            search.active(r);
        }
    }
    Ok(search.found())
}

/// Whether replica `r` is active (its ephemeral `is_active` exists).
async fn is_active(w: &W, s: &SimZk, paths: &Paths, r: &str) -> Result<bool, Fail> {
    Ok(exists(w, s, &paths.is_active_of(r)).await?.is_some())
}

/// Fetches `part` (the entry's own, or one containing it) from `source`,
/// checks it against the checksums `source` lists for it in the
/// coordinator, writes it and records it, with what it replaces and the
/// entry's removal, in one multi.
/// Fetches `part` from `source` and commits it; `listing` is the source's
/// listing of it in the coordinator when the caller already read it.
async fn fetch_and_commit(
    r: &EntryRun<'_>,
    part: &PartInfo,
    source: &str,
    listing: Option<Vec<u8>>,
    quorum: bool,
) -> Result<(), String> {
    let (w, id, life, s) = (r.w, r.id, r.life, r.s);
    let listing = match listing {
        Some(l) => Some(l),
        None => get(w, s, &r.paths.part_of(source, &part.name()))
            .await
            .map_err(|f| f.to_string())?
            .map(|(d, _)| d),
    };
    let listed = match listing {
        Some(d) => Checksums::decode(&d).map_err(|e| format!("part {part}: {source} lists bad checksums: {e}"))?,
        None => return Err(format!("part {part}: {source} does not list it")),
    };
    let from: u64 = source
        .trim_start_matches('r')
        .parse()
        .map_err(|_| format!("replica {source}"))?;
    let files = fetch(w, id, from, &part.name()).await?;
    let sums = match core::check_fetched(&r.schema, &files, &listed) {
        Ok(sums) => sums,
        Err(why) => {
            log(
                w,
                id,
                "fetch_refused",
                json!({"part": part.name(), "from": source, "error": why.to_string()}),
            );
            return Err(format!("part {part} refused: {why}"));
        }
    };
    if Checksums::of(&files) != listed {
        let what = format!("part {part} installed on r{id} with files its writer's checksums do not match");
        violated(w, id, "installed unchecked", what);
    }
    if !alive(w, id, life) {
        return Err("the replica stopped".into());
    }
    write_part(w, id, &part.name(), files);
    let replaced = replaced_by(w, id, life, part);
    let held = core::held_ops(&r.paths, part, &sums, &replaced, Vec::new());
    let covering = (part != r.sel.entry.new_part()).then_some(part);
    commit_with_quorum(r, part, quorum, held, covering).await?;
    log(w, id, "part_fetched", json!({"part": part.name(), "from": source}));
    Ok(())
}

/// Commits an entry's result `ops` with the entry's removal; on success
/// the part (`covering`, when the entry was done by installing a part
/// that contains its own) is current and the entry gone here too, and
/// the parts it replaced and unlisted leave the disk (the node outdates
/// them; nothing reads an outdated part here, and a fetch of one finds
/// it gone and tries again).
async fn commit_entry(r: &EntryRun<'_>, ops: Vec<KeeperOp>, covering: Option<&PartInfo>) -> Result<(), Fail> {
    let (w, id, life, s, sel) = (r.w, r.id, r.life, r.s, r.sel);
    let entry_path = r.entry_path.as_str();
    let (ops, last) = core::entry_done(ops, entry_path);
    let listing = match ops.first() {
        Some(KeeperOp::Create { path, .. }) if last > 0 => Some(path.clone()),
        _ => None,
    };
    // the listings this commit deletes: only those parts may leave the
    // disk (a part another entry made current while this one ran is
    // replaced in memory too, but its listing stays and others fetch it)
    let unlisted: BTreeSet<String> = ops
        .iter()
        .filter_map(|op| match op {
            KeeperOp::Delete { path, .. } if path != entry_path => Some(path.clone()),
            _ => None,
        })
        .collect();
    match multi(w, s, &ops).await {
        Ok(_) => {}
        // nothing but the entry's removal, and the entry is gone: an
        // earlier run of it committed and lost the answer
        Err(MultiFail {
            index: Some(i),
            fail: Fail::NoNode,
        }) if i == last && last == 0 => {}
        // listed already: an earlier run committed all of it
        Err(MultiFail {
            index: Some(0),
            fail: Fail::NodeExists,
        }) if listing.is_some() => {}
        // a listing this commit replaces, or the entry, is gone: an
        // earlier commit landed with other ops and lost its answer
        Err(MultiFail {
            index: Some(i),
            fail: Fail::NoNode,
        }) if core::commit_shows_stale_memory(&r.paths, &ops, i, entry_path) => {
            reload_stale(w, id, life, &sel.znode).await;
            return Err(Fail::NoNode);
        }
        Err(f) => return Err(f.fail),
    }
    let part = covering.unwrap_or(sel.entry.new_part()).clone();
    let finished = with_run(w, id, life, |run| {
        let mut gone = Vec::new();
        if listing.is_some() {
            run.commits += 1;
            gone = run.queue.add_current(part.clone())?;
        }
        gone.extend(run.queue.finish_ok(&sel.znode)?);
        Ok::<_, String>(gone)
    });
    match finished {
        Some(Ok(gone)) => {
            if let Some(l) = &listing {
                check_current(w, id, l, &part);
            }
            let listing_of = |p: &PartInfo| match &listing {
                Some(l) => format!("{}/{}", l.rsplit_once('/').map_or("", |(dir, _)| dir), p.name()),
                None => String::new(),
            };
            for p in gone.iter().filter(|p| unlisted.contains(&listing_of(p))) {
                remove_part(w, id, &p.name());
            }
            Ok(())
        }
        Some(Err(e)) => {
            log(w, id, "queue_finish_refused", json!({"entry": sel.znode, "error": e}));
            Ok(())
        }
        None => Err(Fail::Other("the replica stopped".into())),
    }
}

/// A part's files from replica `from`'s disk, over the interserver
/// network: fails over a cut link or from a replica that is down.
async fn fetch(w: &W, to: u64, from: u64, part: &str) -> Result<Files, String> {
    let d = hop_us(w, false);
    sleep_for(w, d).await;
    if w.borrow().cluster.is_cut(to, from) {
        sleep_for(w, OP_TIMEOUT_US).await;
        return Err(format!("fetch of {part} from r{from}: timed out (the link is cut)"));
    }
    while_paused(w, from).await;
    reconcile(w, from);
    let up = w
        .borrow()
        .table
        .as_ref()
        .and_then(|t| t.replicas.get(&from))
        .is_some_and(|r| r.run.is_some());
    if !up {
        return Err(format!("fetch of {part} from r{from}: connection refused"));
    }
    let files = read_part(w, from, part);
    let d = hop_us(w, false);
    sleep_for(w, d).await;
    if w.borrow().cluster.is_cut(from, to) {
        return Err(format!(
            "fetch of {part} from r{from}: the answer broke off (the link is cut)"
        ));
    }
    files.ok_or_else(|| format!("fetch of {part} from r{from}: no such part"))
}

// ---- the leader's chores ----------------------------------------------------------

/// Whether replica `id`'s candidacy in life `life` is the lowest one.
async fn is_leader(w: &W, id: u64, life: u64, s: &SimZk, paths: &Paths) -> bool {
    let Some(Some(candidacy)) = with_run(w, id, life, |run| run.candidacy.clone()) else {
        return false;
    };
    let Ok(candidates) = children(w, s, &paths.leader_election()).await else {
        return false;
    };
    let dir = paths.leader_election();
    let prefix = format!("{dir}/leader-");
    let lowest = candidates
        .iter()
        .map(|c| format!("{dir}/{c}"))
        .filter_map(|c| sequence_of(&c, &prefix).map(|n| (n, c)))
        .min();
    lowest.map(|(_, c)| c) == Some(candidacy)
}

/// As the leader: the next merge (`drift_table::merge`) put in the log,
/// read in ClickHouse's order as the node's leader reads it: the virtual
/// parts, then the insert locks, then the log pulled; only parts virtual
/// before the locks were read may merge. A concurrent change of the log
/// is a new try. Returns the part assigned.
async fn assign_merge(w: &W, id: u64, life: u64, s: &Rc<SimZk>) -> Result<Option<PartInfo>, String> {
    let (paths, name, settings) = {
        let world = w.borrow();
        let t = world.table.as_ref().ok_or("no table")?;
        (t.paths_of(id), t.replicas[&id].name.clone(), t.schema.settings.clone())
    };
    if !is_leader(w, id, life, s, &paths).await {
        return Ok(None);
    }
    for _ in 0..ASSIGN_ATTEMPTS_MAX {
        let (_, log_stat) = get(w, s, &paths.log())
            .await
            .map_err(|f| format!("log node: {f}"))?
            .ok_or("no log node")?;
        let Some(before) = with_run(w, id, life, |run| run.queue.virtual_parts().clone()) else {
            return Ok(None);
        };
        let partitions = match children(w, s, &paths.block_numbers()).await {
            Ok(kids) => kids,
            Err(Fail::NoNode) => Vec::new(),
            Err(f) => return Err(format!("block numbers: {f}")),
        };
        let mut locked: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        for p in partitions {
            let held = match children(w, s, &paths.partition_numbers(&p)).await {
                Ok(kids) => kids.iter().filter_map(|k| sequence_of(k, "block-")).collect(),
                Err(Fail::NoNode) => BTreeSet::new(),
                Err(f) => return Err(format!("block numbers of {p}: {f}")),
            };
            locked.insert(p, held);
        }
        pull_log(w, id, life, s)
            .await
            .map_err(|f| format!("pulling the log: {f}"))?;
        let Some((current, virtual_parts)) = with_run(w, id, life, |run| {
            let mut current = ActivePartSet::new();
            for p in run.queue.current().iter().filter(|p| before.containing(p).is_some()) {
                current.add(p.clone()).map_err(|e| format!("the current parts: {e}"))?;
            }
            Ok::<_, String>((current, run.queue.virtual_parts().clone()))
        })
        .transpose()?
        else {
            return Ok(None);
        };
        // parts whose quorum is pending are not merged
        let parallel = children(w, s, &paths.quorum_parallel())
            .await
            .map_err(|f| format!("quorum: {f}"))?;
        let status = get(w, s, &paths.quorum_status())
            .await
            .map_err(|f| format!("quorum: {f}"))?
            .map(|(d, _)| d);
        let pending = quorum::pending(&parallel, status.as_deref());
        let locked_fn = |p: &str| locked.get(p).cloned().unwrap_or_default();
        let inputs = MergeInputs {
            current: &current,
            virtual_parts: &virtual_parts,
            locked: &locked_fn,
            quorum_pending: &pending,
            parts_to_merge_min: settings.parts_to_merge_min,
            max_parts_to_merge_at_once: settings.max_parts_to_merge_at_once,
        };
        let Some((parts, into)) = select_merge(&inputs) else {
            return Ok(None);
        };
        let entry = drift_table::LogEntry {
            create_time_s: (wall_ms(w, id) / 1000) as i64,
            source_replica: name.clone(),
            kind: EntryKind::MergeParts {
                parts: parts.clone(),
                into: into.clone(),
            },
        };
        let ops = [
            KeeperOp::SetData {
                path: paths.log(),
                data: Vec::new(),
                version: log_stat,
            },
            KeeperOp::Create {
                path: paths.log_prefix(),
                data: entry.encode().into_bytes(),
                mode: CreateMode::PersistentSequential,
            },
        ];
        match multi(w, s, &ops).await {
            Ok(_) => {
                let names: Vec<String> = parts.iter().map(|p| p.name()).collect();
                log(w, id, "merge_assigned", json!({"into": into.name(), "parts": names}));
                let _ = pull_log(w, id, life, s).await;
                return Ok(Some(into));
            }
            Err(MultiFail {
                fail: Fail::BadVersion, ..
            }) => continue,
            Err(f) => return Err(format!("assigning a merge: {}", f.fail)),
        }
    }
    Err("other replicas kept assigning merges first".into())
}

/// As the leader (the lowest candidacy): the block ids past the window
/// removed, a multi per chunk (the ids' creation times asked all at
/// once, as the node's one multi-read does).
async fn cleanup(w: &W, id: u64, life: u64, s: Rc<SimZk>) {
    let (paths, window, window_s) = {
        let world = w.borrow();
        let Some(t) = world.table.as_ref() else { return };
        let st = &t.schema.settings;
        (
            t.paths_of(id),
            st.replicated_deduplication_window,
            st.replicated_deduplication_window_seconds,
        )
    };
    if !is_leader(w, id, life, &s, &paths).await {
        return;
    }
    let Ok(ids) = children(w, &s, &paths.blocks()).await else {
        return;
    };
    let mut waits = Vec::new();
    for b in &ids {
        let (slot, wait) = exec::oneshot();
        let (w2, s2, path) = (w.clone(), s.clone(), format!("{}/{b}", paths.blocks()));
        exec::spawn(w, async move { slot.fill(exists(&w2, &s2, &path).await) });
        waits.push(wait);
    }
    let mut dated = Vec::new();
    for (b, wait) in ids.into_iter().zip(waits) {
        if let Ok(Some(st)) = wait.await {
            dated.push((b, st.ctime));
        }
    }
    let remove = block_ids_to_remove(&dated, window, window_s);
    let mut removed = 0;
    for chunk in remove.chunks(drift_table::zk::MULTI_OPS_MAX) {
        let ops: Vec<KeeperOp> = chunk
            .iter()
            .map(|b| KeeperOp::Delete {
                path: format!("{}/{b}", paths.blocks()),
                version: -1,
            })
            .collect();
        match multi(w, &s, &ops).await {
            Ok(_) => removed += chunk.len(),
            // one gone already: the rest one by one
            Err(MultiFail { index: Some(_), .. }) => {
                for op in &ops {
                    if delete(w, &s, op.path()).await.is_ok() {
                        removed += 1;
                    }
                }
            }
            Err(_) => break,
        }
    }
    if removed > 0 {
        log(
            w,
            id,
            "block_ids_cleaned",
            json!({"removed": removed, "kept": dated.len() - removed}),
        );
    }
    clean_log(w, id, &s, &paths).await;
}

/// The leader's log cleanup: entries every replica copied go, the
/// newest `min_replicated_logs_to_keep` stay (`drift_table::cleanup`).
/// No replica is marked lost: the simulated table does not clone one.
async fn clean_log(w: &W, id: u64, s: &SimZk, paths: &Paths) {
    let (min_keep, max_keep) = match w.borrow().table.as_ref() {
        Some(t) => (
            t.schema.settings.min_replicated_logs_to_keep,
            t.schema.settings.max_replicated_logs_to_keep,
        ),
        None => return,
    };
    let Ok(names) = children(w, s, &paths.log()).await else {
        return;
    };
    let prefix = paths.log_prefix();
    let entries: Vec<(u64, String)> = names
        .iter()
        .filter_map(|n| sequence_of(&format!("{}/{n}", paths.log()), &prefix).map(|i| (i, n.clone())))
        .collect();
    let newest = entries.iter().map(|(i, _)| *i).max();
    let Ok(replicas) = children(w, s, &paths.replicas()).await else {
        return;
    };
    let mut pointers = Vec::new();
    let mut versions = BTreeMap::new();
    for r in replicas {
        let Ok(Some((p, version))) = get(w, s, &paths.log_pointer_of(&r)).await else {
            return;
        };
        let Ok(active) = is_active(w, s, paths, &r).await else {
            return;
        };
        let Ok(lost) = get(w, s, &paths.is_lost_of(&r)).await else {
            return;
        };
        versions.insert(r.clone(), version);
        pointers.push(drift_table::cleanup::ReplicaPointer {
            log_pointer: core::parse_pointer(&p),
            is_active: active,
            is_lost: lost.is_some_and(|(d, _)| d == b"1"),
            name: r,
        });
    }
    let plan = drift_table::cleanup::log_cleanup(newest, &pointers, min_keep, max_keep);
    for r in &plan.mark_lost {
        // only if its pointer did not move since it was read
        let ops = [
            KeeperOp::Check {
                path: paths.log_pointer_of(r),
                version: versions[r],
            },
            KeeperOp::SetData {
                path: paths.is_lost_of(r),
                data: b"1".to_vec(),
                version: -1,
            },
        ];
        if multi(w, s, &ops).await.is_err() {
            return;
        }
        log(w, id, "replica_marked_lost", json!({"replica": r}));
    }
    let old: Vec<KeeperOp> = entries
        .iter()
        .filter(|(i, _)| *i < plan.remove_below)
        .map(|(_, n)| KeeperOp::Delete {
            path: format!("{}/{n}", paths.log()),
            version: -1,
        })
        .collect();
    let mut removed = 0;
    for chunk in old.chunks(drift_table::zk::MULTI_OPS_MAX) {
        if multi(w, s, chunk).await.is_err() {
            break;
        }
        removed += chunk.len();
    }
    if removed > 0 {
        log(
            w,
            id,
            "log_cleaned",
            json!({"removed": removed, "below": plan.remove_below}),
        );
    }
}

// ---- inserts ----------------------------------------------------------------------

/// A failed insert's answer, as the client reads its code: definite only
/// where the code says nothing was written (`blocks`: the insert's).
fn refusal(code: u64, why: String, blocks: usize) -> AttemptOutcome {
    if drift_checkers::dedup::definite_failure(code, blocks) {
        AttemptOutcome::Fail(Some(code), why)
    } else {
        AttemptOutcome::Info(Some(code), why)
    }
}

/// The quorum an insert asks for (0: none), once it may start: enough
/// active replicas, and for a sequential quorum none still waiting
/// (`drift_table::quorum::may_start`). Nothing is written before this.
async fn quorum_precondition(w: &W, s: &SimZk, paths: &Paths, l: &LogicalInsert) -> Result<u32, AttemptOutcome> {
    if l.quorum <= 1 {
        return Ok(0);
    }
    let blocks = l.blocks().len();
    let keeper = |what: &str, f: Fail| {
        refusal(
            KEEPER_EXCEPTION,
            format!("Code: 999. DB::Exception: {what}: {f}"),
            blocks,
        )
    };
    let replicas = children(w, s, &paths.replicas())
        .await
        .map_err(|f| keeper("listing replicas", f))?;
    let mut active = 0u32;
    for r in &replicas {
        if is_active(w, s, paths, r).await.map_err(|f| keeper("is_active", f))? {
            active += 1;
        }
    }
    let status = if l.quorum_parallel {
        None
    } else {
        get(w, s, &paths.quorum_status())
            .await
            .map_err(|f| keeper("quorum status", f))?
            .map(|(d, _)| d)
    };
    quorum::may_start(
        l.quorum,
        active,
        replicas.len() as u32,
        l.quorum_parallel,
        status.as_deref(),
    )
    .map_err(|e| {
        let code = match e {
            quorum::NotNow::TooFewReplicas { .. } => TOO_FEW_LIVE_REPLICAS,
            quorum::NotNow::PreviousWaiting(_) => UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
        };
        refusal(code, format!("Code: {code}. DB::Exception: {e}"), blocks)
    })?;
    Ok(l.quorum)
}

/// How a quorum wait ended short of the quorum.
enum QuorumShort {
    /// The client's answer: 319, the data inserted here but the quorum
    /// not verified.
    Unknown(String),
    /// The replica stopped under the insert: no answer.
    Stopped,
}

/// The writer's wait for `part`'s quorum, at most `timeout_us`: until its
/// node (the parallel one, or the status node) is gone or names a later
/// part (`drift_table::quorum::wait_over`), then whether it failed.
/// Polled every `QUORUM_POLL_US` (the node waits on a watch).
#[allow(clippy::too_many_arguments)] // the replica's run, the part and how it waits
async fn wait_quorum(
    w: &W,
    id: u64,
    life: u64,
    s: &SimZk,
    paths: &Paths,
    part: &PartInfo,
    parallel: bool,
    timeout_us: u64,
) -> Result<(), QuorumShort> {
    let name = part.name();
    let path = if parallel {
        paths.quorum_parallel_part(&name)
    } else {
        paths.quorum_status()
    };
    let deadline = exec::now_us(w) + timeout_us;
    let short = |why: String| {
        QuorumShort::Unknown(format!(
            "Code: 319. DB::Exception: Unknown quorum status. The data was inserted in the local replica but we could not verify quorum. Reason: {why}"
        ))
    };
    loop {
        if !alive(w, id, life) {
            return Err(QuorumShort::Stopped);
        }
        let now = exec::now_us(w);
        if now >= deadline {
            return Err(short(format!(
                "Timeout while waiting for quorum ({} ms)",
                timeout_us / 1000
            )));
        }
        match get(w, s, &path).await {
            Ok(node) if quorum::wait_over(part, parallel, node.as_ref().map(|(d, _)| &d[..])) => break,
            Ok(_) => {}
            Err(Fail::NoSession) => return Err(short("the session expired while waiting".into())),
            Err(_) => {}
        }
        sleep_for(w, QUORUM_POLL_US.min(deadline.saturating_sub(exec::now_us(w)).max(1))).await;
    }
    match exists(w, s, &paths.quorum_failed_part(&name)).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(short(format!("the quorum of part {name} failed"))),
        Err(f) => Err(short(format!("could not read the quorum's outcome: {f}"))),
    }
}

/// The invariant of a quorum insert's block answered: at least
/// `required` replicas list its part (or a part containing it) in some
/// running keeper's tree. Not checked once a disk was wiped (a wiped
/// replica's listing goes when it restarts, which may be before the
/// answer).
fn held_by_quorum(w: &W, id: u64, paths: &Paths, part: &PartInfo, required: u32) {
    if w.borrow().table.as_ref().is_none_or(|t| t.wipes > 0) {
        return;
    }
    // replicas a server's tree lists as holding the part (itself, most
    // often; else a part that contains it), counted up to `limit`
    let holders_on = |st: &drift_keeper::state::State, limit: usize| {
        st.children(&paths.replicas())
            .iter()
            .filter(|r| {
                st.get(&paths.part_of(r, &part.name())).is_some()
                    || st
                        .children(&paths.parts_of(r))
                        .iter()
                        .filter_map(|n| PartInfo::parse(n).ok())
                        .any(|p| p.contains(part))
            })
            .take(limit)
            .count() as u32
    };
    let holders = {
        let world = w.borrow();
        let c = &world.cluster;
        let servers: Vec<_> = c.ids().into_iter().filter_map(|i| c.server(i)).collect();
        // one server whose tree shows the quorum settles it; only a
        // shortfall is counted in full, for its report
        if servers
            .iter()
            .any(|srv| holders_on(srv.state(), required as usize) >= required)
        {
            return;
        }
        servers
            .iter()
            .map(|srv| holders_on(srv.state(), usize::MAX))
            .max()
            .unwrap_or(0)
    };
    if holders < required {
        let what = format!(
            "quorum insert of part {part} answered on r{id}, listed by {holders} of the {required} replicas it needs"
        );
        violated(w, id, "quorum short", what);
    }
}

/// Attempt `n` of `l` at replica `id`, as the node's HTTP handler runs
/// it: the rows cut into blocks, each block's insert by the core; a
/// quorum insert waits at most `quorum_timeout_us` for its quorum.
async fn insert_at(w: &W, id: u64, l: &LogicalInsert, n: u32, quorum_timeout_us: u64) -> AttemptOutcome {
    while_paused(w, id).await;
    reconcile(w, id);
    let (life, readonly, schema, paths, name, defects) = {
        let world = w.borrow();
        let Some(t) = world.table.as_ref() else {
            return AttemptOutcome::Fail(None, "no table".into());
        };
        let r = &t.replicas[&id];
        let readonly = match &r.run {
            None => return AttemptOutcome::Fail(None, format!("connection refused: r{id} is down")),
            Some(run) => run.readonly.clone(),
        };
        (
            r.life,
            readonly,
            t.schema.clone(),
            t.paths_of(id),
            r.name.clone(),
            t.defects,
        )
    };
    if let Some(why) = readonly {
        return AttemptOutcome::Fail(
            Some(TABLE_IS_READ_ONLY),
            format!("Code: 242. DB::Exception: Table is in readonly mode: {why}"),
        );
    }
    let Some(s) = session(w, id, life) else {
        return AttemptOutcome::Fail(Some(TABLE_IS_READ_ONLY), "Code: 242. no coordinator session".into());
    };
    let required = match quorum_precondition(w, &s, &paths, l).await {
        Ok(q) => q,
        Err(refused) => return refused,
    };
    let rows: Vec<Vec<Cell>> = l
        .rows
        .iter()
        .map(|r| vec![Cell::UInt64(r.id), Cell::UInt64(r.p), Cell::String(r.tag.clone())])
        .collect();
    let block = match Block::from_rows(&schema, rows) {
        Ok(b) => b,
        Err(e) => return AttemptOutcome::Fail(Some(27), e),
    };
    let max_rows = l
        .max_block_rows
        .unwrap_or(drift_table::block::MAX_INSERT_BLOCK_SIZE_DEFAULT);
    let window = schema.settings.replicated_deduplication_window;
    let (mut written, mut deduplicated, mut parts) = (0u64, 0u64, Vec::new());
    let mut rows_written = 0u64;
    let split = split_insert(&schema, &block, max_rows.max(1));
    let blocks = split.len();
    let parts_dir = paths.parts_of(&name);
    for (ordinal, (partition, block)) in split.into_iter().enumerate() {
        let files = format::encode_part(&schema, &block);
        let sums = Checksums::of(&files);
        let bid = (window > 0).then(|| match &l.token {
            Some(t) => token_block_id(&partition, t, ordinal),
            None => block_id(&partition, &sums),
        });
        if let Some(b) = &bid {
            log(
                w,
                id,
                drift_keeper::NodeEvent::InsertBlock.name(),
                json!({"query_id": l.query_id(n), "block_id": b, "ordinal": ordinal, "partition": partition}),
            );
        }
        let spec = BlockSpec {
            paths: paths.clone(),
            replica: name.clone(),
            partition,
            id: bid.clone(),
            sums: sums.encode(),
            quorum: required,
            quorum_parallel: l.quorum_parallel,
            naive: false,
            defects,
        };
        let done = insert_block(w, id, life, &s, spec, files, &parts_dir).await;
        if let Ok(Done::Committed(part) | Done::DefectLost(part)) = &done {
            // the invariant: what is acknowledged is in the coordinator
            // (what the `lose-part`, `no-block-id` and `skip-dedup` defects
            // break), looked at as the commit is known, before a quorum's
            // wait, during which a merge may replace the part
            let what = format!("insert of part {part} acknowledged on r{id}, the part not listed there");
            expect_in_coordinator(
                w,
                id,
                "acknowledged part not listed",
                &paths.my_part(&part.name()),
                what,
            );
            if let Some(b) = &bid {
                let what = format!("insert of part {part} acknowledged on r{id}, its block id {b} not recorded");
                expect_in_coordinator(w, id, "acknowledged block id not recorded", &paths.block(b), what);
            }
        }
        // a quorum insert's block, committed or a duplicate, is answered
        // once its part has the quorum
        let waited = match (&done, required) {
            (_, 0) => Ok(()),
            (Ok(Done::Committed(part)), _) => {
                let waited = wait_quorum(w, id, life, &s, &paths, part, l.quorum_parallel, quorum_timeout_us).await;
                if waited.is_ok() {
                    held_by_quorum(w, id, &paths, part, required);
                    // a merge replaced the part during the wait: the case
                    // where looking for the acknowledged part only now
                    // (as the invariant once did) finds it gone
                    if with_run(w, id, life, |run| !run.queue.current().contains_exactly(part)).unwrap_or(false) {
                        log(w, id, "quorum_part_merged_in_wait", json!({"part": part.name()}));
                    }
                }
                waited
            }
            (Ok(Done::Duplicate), _) => {
                wait_duplicate_quorum(w, id, life, &s, &paths, bid.as_deref(), quorum_timeout_us).await
            }
            _ => Ok(()),
        };
        match waited {
            Ok(()) => {}
            Err(QuorumShort::Unknown(why)) => return refusal(UNKNOWN_STATUS_OF_INSERT, why, blocks),
            Err(QuorumShort::Stopped) => return AttemptOutcome::Info(None, "no answer: the replica stopped".into()),
        }
        match done {
            Ok(Done::Committed(part) | Done::DefectLost(part)) => {
                written += 1;
                rows_written += block.rows() as u64;
                parts.push(part.name());
            }
            Ok(Done::Duplicate) => deduplicated += 1,
            Ok(Done::Refused(r)) => {
                let code = match r {
                    Refused::QuorumBusy => UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
                    _ => KEEPER_EXCEPTION,
                };
                return refusal(code, format!("Code: {code}. DB::Exception: {r:?}"), blocks);
            }
            Ok(Done::Unknown { part, lock, why }) => {
                // the node's background resolver settles it once it can
                exec::spawn(
                    w,
                    resolve_later(w.clone(), id, life, part.clone(), lock, parts_dir.clone()),
                );
                return refusal(
                    UNKNOWN_STATUS_OF_INSERT,
                    format!("Code: 319. DB::Exception: Unknown status of insert: the commit of part {part} got no answer ({why})"),
                    blocks,
                );
            }
            Err(why) => return AttemptOutcome::Info(None, format!("no answer: {why}")),
        }
    }
    if hooks(w, id).drop_replies {
        log(
            w,
            id,
            "fault_hook",
            json!({"hook": "drop-replies", "query_id": l.query_id(n)}),
        );
        return AttemptOutcome::Info(None, "no answer: the connection closed (drop-reply)".into());
    }
    AttemptOutcome::Ok(json!({"written_rows": rows_written, "written_blocks": written,
        "deduplicated_blocks": deduplicated, "parts": parts}))
}

/// A quorum insert whose block is a duplicate is answered only once the
/// block's existing part has its quorum (else 319), so an `ok` promises
/// the quorum whichever attempt wrote the part; a part with no quorum
/// pending needs no wait (as the node, and ClickHouse).
async fn wait_duplicate_quorum(
    w: &W,
    id: u64,
    life: u64,
    s: &SimZk,
    paths: &Paths,
    block_id: Option<&str>,
    timeout_us: u64,
) -> Result<(), QuorumShort> {
    let Some(b) = block_id else { return Ok(()) };
    let short = |what: &str, f: Fail| {
        QuorumShort::Unknown(format!("Code: 319. DB::Exception: Unknown quorum status: {what}: {f}"))
    };
    let existing = get(w, s, &paths.block(b))
        .await
        .map_err(|f| short("the duplicate block's part", f))?
        .and_then(|(d, _)| PartInfo::parse(&String::from_utf8_lossy(&d)).ok());
    let Some(part) = existing else { return Ok(()) };
    let parallel = exists(w, s, &paths.quorum_parallel_part(&part.name()))
        .await
        .map_err(|f| short("quorum", f))?
        .is_some();
    wait_quorum(w, id, life, s, paths, &part, parallel, timeout_us).await
}

/// One block's insert by the core: its steps made against the
/// coordinator and the disk. `Err`: the replica stopped under it.
async fn insert_block(
    w: &W,
    id: u64,
    life: u64,
    s: &SimZk,
    spec: BlockSpec,
    files: Files,
    parts_dir: &str,
) -> Result<Done, String> {
    let mut b = BlockInsert::new(spec);
    let mut input = Input::Start;
    let t0 = exec::now_us(w);
    loop {
        if !alive(w, id, life) {
            return Err("the replica stopped".into());
        }
        let now = Now {
            wall_ms: wall_ms(w, id),
            mono_ms: (exec::now_us(w) - t0) / 1000,
        };
        let step = b.on(now, input);
        for note in b.take_notes() {
            match note {
                Note::CommitResolved { part, committed } => {
                    log(w, id, "commit_resolved", json!({"part": part, "committed": committed}))
                }
                Note::DefectLostPart { part, block_id } => {
                    log(w, id, "defect_lost_part", json!({"part": part, "block_id": block_id}))
                }
            }
        }
        input = match step {
            Step::Allocate(ops) => Input::Allocated(match multi(w, s, &ops).await {
                Ok(created) => created.last().cloned().filter(|p| !p.is_empty()).ok_or(MultiFail {
                    index: None,
                    fail: Fail::Other("the lock's create returned no path".into()),
                }),
                Err(e) => Err(e),
            }),
            Step::CheckId(path) => Input::IdExists(exists(w, s, &path).await.map(|st| st.is_some())),
            Step::MakeDir(path) => Input::DirMade(match create(w, s, &path, b"", CreateMode::Persistent).await {
                Ok(_) | Err(Fail::NodeExists) => Ok(()),
                Err(f) => Err(f),
            }),
            Step::WritePart(name) => {
                write_part(w, id, &name, files.clone());
                Input::PartWritten(Ok(()))
            }
            Step::Commit(ops) | Step::DefectCommit(ops) => Input::Committed(multi(w, s, &ops).await.map(|_| ())),
            Step::Discard { part, lock } => {
                remove_part(w, id, &part);
                let _ = delete(w, s, &lock).await;
                Input::Discarded
            }
            Step::DeleteLock(lock) => {
                if s.is_expired() {
                    Input::LockDeleted(Err(Fail::NoSession))
                } else {
                    Input::LockDeleted(delete(w, s, &lock).await)
                }
            }
            Step::PartNodeExists(path) => Input::PartNode(exists(w, s, &path).await.map(|st| st.is_some())),
            Step::SleepUntil(at_ms) => {
                let at = t0 + at_ms * 1000;
                exec::sleep_until(w, at.max(exec::now_us(w))).await;
                Input::Woke
            }
            Step::Done(done) => {
                if let Done::Committed(part) = &done {
                    // the commit is known: the part is current
                    make_current(w, id, life, part, parts_dir);
                }
                return Ok(done);
            }
        };
    }
}

/// A part whose commit is known, current on replica `id` (the
/// invariant checked: the coordinator lists it there).
fn make_current(w: &W, id: u64, life: u64, part: &PartInfo, parts_dir: &str) {
    check_current(w, id, &format!("{parts_dir}/{}", part.name()), part);
    let refused = with_run(w, id, life, |run| {
        run.commits += 1;
        run.queue.add_current(part.clone()).err()
    })
    .flatten();
    if let Some(e) = refused {
        log(w, id, "insert_part_refused", json!({"part": part.name(), "error": e}));
    }
}

/// A commit whose answer was lost and could not be settled in time,
/// settled in the background through its lock (the insert core's
/// [`Resolution`]): committed, the part is current; not, it goes.
async fn resolve_later(w: W, id: u64, life: u64, part: String, lock: String, parts_dir: String) {
    let paths = match w.borrow().table.as_ref() {
        Some(t) => t.paths_of(id),
        None => return,
    };
    loop {
        if !alive(&w, id, life) {
            return;
        }
        let Some(s) = session(&w, id, life).filter(|s| !s.is_expired()) else {
            sleep_for(&w, RECONNECT_US).await;
            continue;
        };
        let t0 = exec::now_us(&w);
        let (mut r, mut step) = Resolution::start(&paths, &part, &lock, RESOLVE_TIMEOUT_MS);
        let settled = loop {
            let mono_ms = (exec::now_us(&w) - t0) / 1000;
            let input = match step {
                Step::DeleteLock(l) => Input::LockDeleted(delete(&w, &s, &l).await),
                Step::PartNodeExists(p) => Input::PartNode(exists(&w, &s, &p).await.map(|st| st.is_some())),
                Step::SleepUntil(at_ms) => {
                    exec::sleep_until(&w, (t0 + at_ms * 1000).max(exec::now_us(&w))).await;
                    Input::Woke
                }
                _ => Input::Woke,
            };
            match r.on(mono_ms, input) {
                Settle::Step(next) => step = next,
                Settle::Settled(done) => break done,
            }
        };
        match settled {
            Some(committed) => {
                log(&w, id, "commit_resolved", json!({"part": part, "committed": committed}));
                match PartInfo::parse(&part) {
                    Ok(p) if committed => make_current(&w, id, life, &p, &parts_dir),
                    _ => remove_part(&w, id, &part),
                }
                return;
            }
            None => sleep_for(&w, RECONNECT_US).await,
        }
    }
}

// ---- the final phase's reads ---------------------------------------------------------

fn in_flight(w: &W, by: i64) {
    if let Some(t) = w.borrow_mut().table.as_mut() {
        t.in_flight = t.in_flight.saturating_add_signed(by);
    }
}

/// `SYSTEM SYNC REPLICA`: the log pulled up to its newest entry and the
/// queue empty, within `timeout_us`; then every row of the current parts.
/// It starts once no insert runs at any replica: a client that gave up
/// leaves its insert going on at the replica, and a block it commits
/// after one replica was read and before another would part them (the
/// checker reads every replica as of one moment).
async fn sync_and_read(w: &W, id: u64, timeout_us: u64) -> Result<Vec<Value>, String> {
    let deadline = exec::now_us(w) + timeout_us;
    while w.borrow().table.as_ref().is_some_and(|t| t.in_flight > 0) {
        if exec::now_us(w) >= deadline {
            return Err("SYNC REPLICA: inserts still running at the replicas".into());
        }
        sleep_for(w, LOOP_US).await;
    }
    loop {
        reconcile(w, id);
        let state = {
            let world = w.borrow();
            let t = world.table.as_ref().ok_or("no table")?;
            let r = &t.replicas[&id];
            r.run.as_ref().map(|run| {
                // the first entry that failed, with why (as the node's
                // system.replication_queue shows it)
                let stuck = run
                    .queue
                    .entries()
                    .find(|e| !e.last_exception.is_empty())
                    .map(|e| format!("{}: {}", e.entry.new_part(), e.last_exception));
                (r.life, run.readonly.clone(), run.queue.len(), run.log_pointer, stuck)
            })
        };
        let Some((life, readonly, queued, pointer, stuck)) = state else {
            return Err(format!("connection refused: r{id} is down"));
        };
        if readonly.is_none() {
            if let Some(s) = session(w, id, life) {
                let log_path = w.borrow().table.as_ref().map(|t| t.paths.log()).unwrap_or_default();
                if let Ok(names) = children(w, &s, &log_path).await {
                    let behind = !core::to_copy(&names, pointer).entries.is_empty();
                    if !behind && queued == 0 {
                        return Ok(read_rows(w, id));
                    }
                }
            }
        }
        if exec::now_us(w) >= deadline {
            return Err(format!(
                "SYNC REPLICA: timed out (readonly: {readonly:?}, queue: {queued}, log_pointer: {pointer}, first failing entry: {})",
                stuck.as_deref().unwrap_or("none")
            ));
        }
        sleep_for(w, LOOP_US).await;
    }
}

/// Every row of replica `id`'s current parts, as `[id, p, tag]`, by id.
fn read_rows(w: &W, id: u64) -> Vec<Value> {
    let world = w.borrow();
    let Some(t) = world.table.as_ref() else {
        return Vec::new();
    };
    let r = &t.replicas[&id];
    let Some(run) = &r.run else { return Vec::new() };
    let mut rows = Vec::new();
    for p in run.queue.current().iter() {
        let Some(files) = r.disk.get(&p.name()) else { continue };
        let Ok(block) = format::decode_part(&t.schema, files) else {
            continue;
        };
        for i in 0..block.rows() {
            if let [Cell::UInt64(rid), Cell::UInt64(pv), Cell::String(tag)] = block.row(i).as_slice() {
                rows.push((*rid, json!([rid, pv, tag])));
            }
        }
    }
    rows.sort_by_key(|(rid, _)| *rid);
    rows.into_iter().map(|(_, v)| v).collect()
}

fn replica_state(w: &W, id: u64) -> String {
    let world = w.borrow();
    let Some(r) = world.table.as_ref().and_then(|t| t.replicas.get(&id)) else {
        return "no such replica".into();
    };
    match &r.run {
        None => "down".into(),
        Some(run) => format!(
            "readonly: {:?}, queue: {}, log_pointer: {}",
            run.readonly,
            run.queue.len(),
            run.log_pointer
        ),
    }
}

/// The table hooks the nemesis arms (`table …` admin commands): what the
/// replica answers.
pub fn admin(w: &W, id: u64, cmd: &str) -> String {
    let mut world = w.borrow_mut();
    let up = world.cluster.is_up(id);
    let Some(r) = world.table.as_mut().and_then(|t| t.replicas.get_mut(&id)) else {
        return format!("error no table replica on node {id}");
    };
    if !up {
        return "error down".into();
    }
    match cmd.trim() {
        "drop-replies-on" => r.hooks.drop_replies = true,
        "drop-replies-off" => r.hooks.drop_replies = false,
        "stop-fetches" => r.hooks.fetches_stopped = true,
        "resume-fetches" => r.hooks.fetches_stopped = false,
        "keeper-cut" => r.hooks.keeper_cut = true,
        "keeper-heal" => r.hooks.keeper_cut = false,
        other => return format!("error unknown table hook {other:?} in the simulator"),
    }
    "ok".into()
}

/// A wiped node's disk: every part gone (its keeper's data goes too).
pub fn wipe(w: &W, id: u64) {
    if let Some(t) = w.borrow_mut().table.as_mut() {
        if let Some(r) = t.replicas.get_mut(&id) {
            r.disk.clear();
            r.identity = false;
            t.wipes += 1;
        }
    }
}

/// The simulated table as the workload's client reaches it
/// ([`TableService`]): each request a client hop to the replica and one
/// back; the client gives up after `op_timeout_us` while the insert
/// goes on at the replica.
#[derive(Clone)]
pub struct SimTable {
    pub w: W,
    pub h: H,
    pub ids: Vec<u64>,
    pub op_timeout_us: u64,
}

impl TableService for SimTable {
    fn replicas(&self) -> Vec<String> {
        self.ids.iter().map(|i| format!("r{i}")).collect()
    }

    async fn attempt(&self, at: usize, l: &LogicalInsert, n: u32) -> AttemptOutcome {
        let (id, w) = (self.ids[at], self.w.clone());
        let (slot, answer) = exec::oneshot();
        let (l, w2) = (l.clone(), w.clone());
        let quorum_timeout_us = self.op_timeout_us / 4 * 3;
        exec::spawn(&w, async move {
            let d = hop_us(&w2, true);
            sleep_for(&w2, d).await;
            in_flight(&w2, 1);
            // a quorum waits three quarters of the client's patience, so a
            // quorum not reached is the server's 319 (as the process
            // campaigns' clients ask)
            let o = insert_at(&w2, id, &l, n, quorum_timeout_us).await;
            in_flight(&w2, -1);
            let d = hop_us(&w2, true);
            sleep_for(&w2, d).await;
            slot.fill(o);
        });
        exec::timeout(&w, self.op_timeout_us, answer)
            .await
            .unwrap_or_else(|| AttemptOutcome::Info(None, "no answer: timed out".into()))
    }

    async fn sync_and_read(&self, at: usize, timeout: Duration) -> Result<Vec<Value>, String> {
        sync_and_read(&self.w, self.ids[at], timeout.as_micros() as u64).await
    }

    async fn replica_state(&self, at: usize) -> String {
        replica_state(&self.w, self.ids[at])
    }

    fn record(
        &self,
        process: u64,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: Option<String>,
        error: Option<String>,
    ) {
        world::record_at(&self.w, &self.h, process, kind, f, value, key, node, error);
    }

    fn event(&self, f: &str, value: Value) {
        world::event(&self.w, &self.h, f, value);
    }

    fn now_us(&self) -> u64 {
        exec::now_us(&self.w)
    }

    async fn sleep_us(&self, us: u64) {
        sleep_for(&self.w, us).await
    }
}
