//! The kv service in the simulator: one [`KvServer`] (the sans-IO core
//! the node runs, `drift_repair::server`) beside each simulated keeper,
//! driven by tasks on the simulator's executor the way the node's kv
//! module drives it with tokio — a coordinator sends a write to every
//! replica and gathers W acknowledgements, a repair session exchanges its
//! messages with a peer, timers run the scheduled repair and GC passes.
//!
//! What the simulation stands in for:
//!
//! * **The network.** Every request and answer between servers takes a
//!   delay drawn from the world's network; a link the nemesis cut
//!   delivers nothing (the sender times out, as an HTTP request over a
//!   cut link does), a server that is down refuses at once, a paused one
//!   answers after it resumes. A client's own link is never cut.
//! * **The machine.** A kv server lives and dies with its node's keeper:
//!   it crashes when the keeper does (killed, a digest abort, a torn
//!   write striking) and starts again with it. It reads its node's
//!   clock (skewed and drifting) and takes the `clock` fault's offset as
//!   the node's kv service does.
//! * **The log.** Records are appended as the server makes them and
//!   synced after a drawn delay; what a write's, a merge's or a finished
//!   session's answer waits for is its sync. A crash keeps what was
//!   synced and, with torn writes, a prefix of what was not — possibly
//!   half a record, which the restart cuts as the node's does. A server
//!   away longer than the GC grace under GC by time comes back empty,
//!   rebuilt from its peers (`drift_repair::server::rebuild_after_absence`).
//!
//! An invariant is checked inside the simulation beside the history's
//! checkers: a server never replaces a version with an older one (a
//! `Change::Applied` in its log older than the version it held) — what
//! the `repair-overwrites` defect breaks.

use super::exec::{self, W};
use super::world::{self, H};
use crate::deletes::KvService;
use crate::plan::KvPlan;
use drift_checkers::history::OpType;
use drift_repair::coord::{ReadRound, Round, WriteRound};
use drift_repair::kv::{GcMode, KvStore};
use drift_repair::replica::Change;
use drift_repair::ring::Ring;
use drift_repair::server::{
    read_answer, rebuild_after_absence, write_answer, KvServer, LogLine, Outgoing, ServerConfig, SessionReport,
    SESSION_ROUNDS_MAX,
};
use drift_repair::session::{Report, Step};
use drift_repair::wal;
use drift_repair::Entry;
use drift_workloads::{OpSpec, Outcome};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::task::{Poll, Waker};

/// How often the supervisor matches each kv server's life to its keeper's.
const SUPERVISE_US: u64 = 50_000;
/// How long a paused server's requests wait between looks.
const PAUSED_POLL_US: u64 = 10_000;
/// A log sync's duration, drawn in this range (µs).
const SYNC_US: (u64, u64) = (200, 2_000);
/// An HTTP request between servers gives up after this many request
/// timeouts (the node's client timeout).
const HTTP_TIMEOUTS: u64 = 5;

/// One kv server's log on the simulated disk.
#[derive(Default)]
struct Log {
    bytes: Vec<u8>,
    /// Bytes a sync covered: what a crash keeps.
    synced: usize,
    /// Simulated µs the server was last known up (the node's log
    /// modification time): an append, a GC tick.
    alive_us: u64,
}

/// One node's kv server.
#[derive(Default)]
struct Server {
    core: Option<KvServer>,
    /// The keeper's incarnation the running server started with.
    keeper_life: u64,
    /// Counts this server's starts: a task of an earlier life stops.
    life: u64,
    log: Log,
    /// key → (ts, tombstone) of the version the server holds: the
    /// invariant's record of what a change must not go back on.
    shadow: BTreeMap<Vec<u8>, (u64, bool)>,
}

/// The simulated kv service: every node's server, their logs, their log
/// lines and the broken invariants.
pub struct KvSim {
    plan: KvPlan,
    ring: Ring,
    seed: u64,
    /// The `repair-overwrites` defect, armed at every start.
    defect: bool,
    /// Whether a crash may keep part of what was not synced.
    torn: bool,
    servers: BTreeMap<u64, Server>,
    /// Each server's log lines: (simulated µs, event, fields).
    pub logs: BTreeMap<u64, Vec<(u64, &'static str, Value)>>,
    /// Broken invariants: (simulated µs, server, what), each once.
    pub violations: Vec<(u64, u64, String)>,
    reported: std::collections::BTreeSet<(u64, String)>,
}

impl KvSim {
    pub fn new(plan: &KvPlan, ids: &[u64], seed: u64, torn: bool) -> Result<KvSim, String> {
        let ring = Ring::new(ids.to_vec(), plan.rf as usize).map_err(|e| format!("kv: {e}"))?;
        Ok(KvSim {
            plan: plan.clone(),
            ring,
            seed,
            defect: plan.defect == Some(crate::plan::Defect::RepairOverwrites),
            torn,
            servers: ids.iter().map(|&i| (i, Server::default())).collect(),
            logs: BTreeMap::new(),
            violations: Vec::new(),
            reported: Default::default(),
        })
    }

    fn config(&self, id: u64) -> ServerConfig {
        ServerConfig {
            id,
            ring: self.ring.clone(),
            tree_depth: KvPlan::TREE_DEPTH,
            w: self.plan.w as usize,
            r: self.plan.r as usize,
            gc: if self.plan.gc == crate::plan::KvGc::Repair {
                GcMode::Repair
            } else {
                GcMode::Time
            },
            gc_grace_ms: self.plan.gc_grace_ms,
            gc_interval_ms: KvPlan::GC_INTERVAL_MS,
            repair_interval_ms: self.plan.repair_interval_ms,
            request_timeout_ms: KvPlan::REQUEST_TIMEOUT_MS,
            seed: self.seed,
        }
    }

    fn log(&mut self, id: u64, at_us: u64, l: LogLine) {
        self.logs.entry(id).or_default().push((at_us, l.event, l.fields));
    }

    /// The server's crash: what was not synced is lost, but for a prefix
    /// (`kept` bytes of it) that made it to the disk anyway.
    fn crash(&mut self, id: u64, kept: usize) {
        let Some(s) = self.servers.get_mut(&id) else { return };
        if s.core.take().is_none() {
            return;
        }
        let keep = (s.log.synced + kept).min(s.log.bytes.len());
        s.log.bytes.truncate(keep);
        s.log.synced = keep;
        s.shadow.clear();
    }

    /// Starts server `id` on its log at simulated µs `now_us`, machine
    /// time `wall_us`, with its keeper in life `keeper_life`.
    fn start(&mut self, id: u64, keeper_life: u64, now_us: u64, wall_us: u64) {
        let cfg = self.config(id);
        let (defect, grace) = (self.defect, cfg.gc_grace_ms);
        let mut lines = Vec::new();
        let Some(s) = self.servers.get_mut(&id) else { return };
        let absent_ms = now_us.saturating_sub(s.log.alive_us) / 1000;
        if !s.log.bytes.is_empty() && rebuild_after_absence(cfg.gc, grace, absent_ms) {
            s.log = Log::default();
            lines.push(LogLine {
                event: "kv_rebuild",
                fields: json!({"level": "WARN", "absent_ms": absent_ms, "gc_grace_ms": grace}),
            });
        }
        let decoded = wal::decode(&s.log.bytes);
        if let Some(at) = &decoded.torn {
            s.log.bytes.truncate(decoded.valid_bytes);
            lines.push(LogLine {
                event: "kv_log_torn",
                fields: json!({"level": "WARN", "at": at, "records": decoded.records.len()}),
            });
        }
        s.log.synced = s.log.bytes.len();
        s.log.alive_us = now_us;
        let records = decoded.records.len();
        let mut core = KvServer::new(cfg.clone(), KvStore::new(id, cfg.ring.clone(), cfg.tree_depth));
        let skipped = core.replay(decoded.records);
        if defect {
            let (_, l) = core.admin(wall_us, "defect-overwrite on");
            lines.extend(l);
        }
        s.shadow = core
            .store()
            .dump()
            .into_iter()
            .flat_map(|r| r.entries)
            .map(|e| (e.key, (e.ts, e.value.is_none())))
            .collect();
        s.core = Some(core);
        s.keeper_life = keeper_life;
        s.life += 1;
        lines.push(LogLine {
            event: "kv_started",
            fields: json!({"records_replayed": records, "records_skipped": skipped}),
        });
        for l in lines {
            self.log(id, now_us, l);
        }
    }
}

/// Matches server `id`'s life to its keeper's: crashed with it, started
/// again with it. Its timers start with each life.
fn reconcile(w: &W, id: u64) {
    let started = {
        let mut world = w.borrow_mut();
        let world = &mut *world;
        let c = &mut world.cluster;
        let (up, life, now, wall) = (c.is_up(id), c.incarnation(id), c.now_us(), c.wall_us(id));
        let Some(kv) = world.kv.as_mut() else { return };
        let Some(s) = kv.servers.get(&id) else { return };
        if s.core.is_some() && (!up || s.keeper_life != life) {
            let unsynced = (s.log.bytes.len() - s.log.synced) as u64;
            let kept = if kv.torn && unsynced > 0 {
                c.draw(unsynced + 1)
            } else {
                0
            };
            kv.crash(id, kept as usize);
        }
        let s = &kv.servers[&id];
        if s.core.is_none() && up {
            kv.start(id, life, now, wall);
            Some(kv.servers[&id].life)
        } else {
            None
        }
    };
    if let Some(life) = started {
        exec::spawn(w, repair_loop(w.clone(), id, life));
        exec::spawn(w, gc_loop(w.clone(), id, life));
    }
}

/// Starts the service: every server, and the supervisor that keeps each
/// one's life matched to its keeper's.
pub fn start(w: &W, kv: KvSim) {
    let ids: Vec<u64> = kv.servers.keys().copied().collect();
    w.borrow_mut().kv = Some(kv);
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
        }
    });
}

/// Whether server `id` is still in life `life`.
fn alive(w: &W, id: u64, life: u64) -> bool {
    reconcile(w, id);
    let world = w.borrow();
    world
        .kv
        .as_ref()
        .and_then(|kv| kv.servers.get(&id))
        .is_some_and(|s| s.core.is_some() && s.life == life)
}

/// Runs `f` on server `id` in life `life` with its machine time,
/// appends what it changed to the log (checking the invariant) and
/// returns its result with where the log ends; `None` if that life is over.
fn with_core<T>(w: &W, id: u64, life: u64, f: impl FnOnce(&mut KvServer, u64) -> T) -> Option<(T, usize)> {
    if !alive(w, id, life) {
        return None;
    }
    let mut world = w.borrow_mut();
    let world = &mut *world;
    let (now, wall) = (world.cluster.now_us(), world.cluster.wall_us(id));
    let kv = world.kv.as_mut()?;
    let s = kv.servers.get_mut(&id)?;
    let core = s.core.as_mut()?;
    let t = f(core, wall);
    let records = core.take_records();
    let mut broken = Vec::new();
    for r in &records {
        match &r.change {
            Change::Applied(e) => {
                if let Some(&(ts, _)) = s.shadow.get(&e.key).filter(|(ts, _)| *ts > e.ts) {
                    broken.push(format!(
                        "key {:?}: version {ts} replaced by the older {}",
                        String::from_utf8_lossy(&e.key),
                        e.ts
                    ));
                }
                s.shadow.insert(e.key.clone(), (e.ts, e.value.is_none()));
            }
            Change::Purged { before } => {
                let ring = &kv.ring;
                let range = r.range as usize;
                s.shadow
                    .retain(|k, (ts, tomb)| !(*tomb && *ts < *before && ring.range_of_key(k) == range));
            }
            Change::Repaired { .. } => {}
        }
        wal::encode(r, &mut s.log.bytes);
    }
    if !records.is_empty() {
        s.log.alive_us = now;
    }
    let end = s.log.bytes.len();
    for what in broken {
        // a version going back and forth between servers breaks it again
        // at each repair: once per server and what
        if kv.reported.insert((id, what.clone())) {
            kv.violations.push((now, id, what));
        }
    }
    Some((t, end))
}

fn log_line(w: &W, id: u64, l: LogLine) {
    let mut world = w.borrow_mut();
    let now = world.cluster.now_us();
    if let Some(kv) = world.kv.as_mut() {
        kv.log(id, now, l);
    }
}

fn draw_between(w: &W, (lo, hi): (u64, u64)) -> u64 {
    lo + w.borrow_mut().cluster.draw(hi.saturating_sub(lo) + 1)
}

async fn sleep_for(w: &W, us: u64) {
    let at = exec::now_us(w) + us;
    exec::sleep_until(w, at).await;
}

/// Syncs server `id`'s log up to `end` (a drawn delay): whether it
/// happened in life `life`.
async fn sync(w: &W, id: u64, life: u64, end: usize) -> Result<(), String> {
    let d = draw_between(w, SYNC_US);
    sleep_for(w, d).await;
    if !alive(w, id, life) {
        return Err(format!("server {id} crashed before its log was synced"));
    }
    let mut world = w.borrow_mut();
    if let Some(s) = world.kv.as_mut().and_then(|kv| kv.servers.get_mut(&id)) {
        s.log.synced = s.log.synced.max(end.min(s.log.bytes.len()));
    }
    Ok(())
}

/// One way of a message: `from` `None` is a client.
async fn hop(w: &W, from: Option<u64>) {
    let range = {
        let world = w.borrow();
        let net = &world.cluster.config().net;
        if from.is_some() {
            net.delay_us
        } else {
            net.client_delay_us
        }
    };
    let d = draw_between(w, range);
    sleep_for(w, d).await;
}

/// Where a request got to.
enum Delivery {
    /// To server `to` in this life.
    Arrived(u64),
    /// `to` is down: the connection was refused.
    Refused,
    /// The link is cut: nothing arrives.
    Lost,
}

/// A request from `from` (`None`: a client) to `to`, waiting while `to`
/// is paused.
async fn deliver(w: &W, from: Option<u64>, to: u64) -> Delivery {
    hop(w, from).await;
    if from.is_some_and(|f| w.borrow().cluster.is_cut(f, to)) {
        return Delivery::Lost;
    }
    loop {
        reconcile(w, to);
        let (paused, life) = {
            let world = w.borrow();
            let s = world.kv.as_ref().and_then(|kv| kv.servers.get(&to));
            (
                world.cluster.is_paused(to),
                s.and_then(|s| s.core.as_ref().map(|_| s.life)),
            )
        };
        match life {
            None => return Delivery::Refused,
            Some(_) if paused => sleep_for(w, PAUSED_POLL_US).await,
            Some(life) => return Delivery::Arrived(life),
        }
    }
}

/// The answer's way back from `to` to `from`: whether it arrived.
async fn answer_back(w: &W, to: u64, from: Option<u64>) -> bool {
    hop(w, Some(to)).await;
    !from.is_some_and(|f| w.borrow().cluster.is_cut(to, f))
}

fn http_timeout_us() -> u64 {
    KvPlan::REQUEST_TIMEOUT_MS * 1000 * HTTP_TIMEOUTS
}

/// What a request between servers that got no answer says, after the
/// sender's HTTP timeout for a lost one.
async fn unanswered(w: &W, to: u64, d: &Delivery) -> String {
    match d {
        Delivery::Refused => format!("server {to}: connection refused"),
        _ => {
            sleep_for(w, http_timeout_us()).await;
            format!("server {to}: timed out")
        }
    }
}

/// Coordinator `c` (life `life`) merging `e` on replica `r`.
async fn merge_on(w: W, c: u64, life: u64, r: u64, e: Entry) -> Result<(), String> {
    if r == c {
        let (merged, end) = with_core(&w, c, life, |s, wall| s.merge(wall, e)).ok_or("this server crashed")?;
        merged.map_err(|r| r.why)?;
        return sync(&w, c, life, end).await;
    }
    let d = deliver(&w, Some(c), r).await;
    let Delivery::Arrived(rl) = d else {
        return Err(unanswered(&w, r, &d).await);
    };
    let answer = match with_core(&w, r, rl, |s, wall| s.merge(wall, e)) {
        None => return Err(format!("server {r}: connection reset")),
        Some((Err(refusal), _)) => Err(format!("server {r}: {}: {}", refusal.status, refusal.why)),
        Some((Ok(_), end)) => sync(&w, r, rl, end)
            .await
            .map_err(|_| format!("server {r}: connection reset")),
    };
    if !answer_back(&w, r, Some(c)).await {
        return Err(unanswered(&w, r, &Delivery::Lost).await);
    }
    answer
}

/// Coordinator `c` asking replica `r` for its version of `key`.
async fn get_on(w: W, c: u64, life: u64, r: u64, key: Vec<u8>) -> Result<Option<Entry>, String> {
    if r == c {
        let (got, _) = with_core(&w, c, life, |s, _| s.get(&key)).ok_or("this server crashed")?;
        return got.map_err(|r| r.why);
    }
    let d = deliver(&w, Some(c), r).await;
    let Delivery::Arrived(rl) = d else {
        return Err(unanswered(&w, r, &d).await);
    };
    let answer = match with_core(&w, r, rl, |s, _| s.get(&key)) {
        None => return Err(format!("server {r}: connection reset")),
        Some((got, _)) => got.map_err(|refusal| format!("server {r}: {}: {}", refusal.status, refusal.why)),
    };
    if !answer_back(&w, r, Some(c)).await {
        return Err(unanswered(&w, r, &Delivery::Lost).await);
    }
    answer
}

/// Replies as they come, for a coordinator to gather.
struct Inbox<T> {
    items: RefCell<VecDeque<T>>,
    waker: RefCell<Option<Waker>>,
}

impl<T> Inbox<T> {
    fn new() -> Rc<Inbox<T>> {
        Rc::new(Inbox {
            items: RefCell::new(VecDeque::new()),
            waker: RefCell::new(None),
        })
    }

    fn push(&self, t: T) {
        self.items.borrow_mut().push_back(t);
        if let Some(wk) = self.waker.borrow_mut().take() {
            wk.wake();
        }
    }

    async fn next(&self) -> T {
        std::future::poll_fn(|cx| match self.items.borrow_mut().pop_front() {
            Some(t) => Poll::Ready(t),
            None => {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// Feeds `round` its replies until it is decided or the request timeout
/// passes (the node's `KvNode::gather`).
async fn gather<R: Round>(w: &W, round: &mut R, inbox: &Inbox<(u64, Result<R::Reply, String>)>) -> R::Result {
    let timeout_ms = KvPlan::REQUEST_TIMEOUT_MS;
    let deadline = exec::now_us(w) + timeout_ms * 1000;
    loop {
        let left = deadline.saturating_sub(exec::now_us(w));
        match exec::timeout(w, left, inbox.next()).await {
            Some((r, reply)) => {
                if let Some(res) = round.on_reply(r, reply) {
                    return res;
                }
            }
            None => return round.timed_out(timeout_ms),
        }
    }
}

/// Server `c` (life `life`) coordinating a client's `op`: the answer's
/// status and body, `None` if `c` crashed meanwhile.
async fn coordinate(w: &W, c: u64, life: u64, op: &OpSpec) -> Option<(u16, Value)> {
    let key = op.key.clone().unwrap_or_default().into_bytes();
    let refused = |r: drift_repair::server::Refusal| (r.status, json!({"error": r.why}));
    match op.f {
        "put" | "delete" => {
            let value = (op.f == "put").then(|| op.value["value"].as_str().unwrap_or("").as_bytes().to_vec());
            let (round, _) = with_core(w, c, life, |s, wall| s.begin_write(wall, key.clone(), value, None))?;
            let mut round: WriteRound = match round {
                Ok(r) => r,
                Err(r) => return Some(refused(r)),
            };
            let inbox = Inbox::new();
            for &r in round.replicas() {
                let (w2, e, inbox) = (w.clone(), round.entry().clone(), inbox.clone());
                // the other replicas' writes go on after the answer
                exec::spawn(w, async move {
                    let res = merge_on(w2, c, life, r, e).await;
                    inbox.push((r, res));
                });
            }
            let res = gather(w, &mut round, &inbox).await;
            alive(w, c, life).then(|| write_answer(&key, &res))
        }
        "get" => {
            let (round, _) = with_core(w, c, life, |s, _| s.begin_read(key.clone(), None))?;
            let mut round: ReadRound = match round {
                Ok(r) => r,
                Err(r) => return Some(refused(r)),
            };
            let inbox = Inbox::new();
            for &r in round.replicas() {
                let (w2, k, inbox) = (w.clone(), key.clone(), inbox.clone());
                exec::spawn(w, async move {
                    let res = get_on(w2, c, life, r, k).await;
                    inbox.push((r, res));
                });
            }
            let res = gather(w, &mut round, &inbox).await;
            alive(w, c, life).then(|| read_answer(&key, &res))
        }
        other => Some((400, json!({"error": format!("no operation {other}")}))),
    }
}

/// Runs one repair session of range `j` of server `id` with `peer`.
async fn repair_with(w: &W, id: u64, life: u64, j: usize, peer: u64, scheduled: bool) -> SessionReport {
    let t0 = exec::now_us(w);
    let now_ts = |w: &W| {
        let world = w.borrow();
        let wall = world.cluster.wall_us(id);
        world
            .kv
            .as_ref()
            .and_then(|kv| kv.servers.get(&id))
            .and_then(|s| s.core.as_ref())
            .map_or(wall, |c| c.now_ts(wall))
    };
    let (started_ts, result) = match with_core(w, id, life, |s, wall| s.start_session(wall, j, peer)) {
        Some((Ok(out), _)) => (out.started_ts, run_session(w, id, life, out).await),
        Some((Err(e), _)) => (now_ts(w), Err(e)),
        None => (now_ts(w), Err("this server crashed".into())),
    };
    let took = exec::now_us(w) - t0;
    let report = SessionReport::new(j, peer, started_ts, now_ts(w), took, result);
    if alive(w, id, life) {
        log_line(w, id, report.log_line(scheduled));
    }
    report
}

async fn run_session(w: &W, id: u64, life: u64, mut out: Outgoing) -> Result<Report, String> {
    let (j, peer, session) = (out.range, out.peer, out.session);
    let mut msg = std::mem::take(&mut out.first);
    for _ in 0..SESSION_ROUNDS_MAX {
        let d = deliver(w, Some(id), peer).await;
        let Delivery::Arrived(pl) = d else {
            return Err(unanswered(w, peer, &d).await);
        };
        let now = exec::now_us(w);
        let answered = with_core(w, peer, pl, |s, wall| {
            s.on_repair_message(now, wall, j, id, session, &msg)
        });
        let reply = match answered {
            None => return Err(format!("server {peer}: connection reset")),
            Some((Err(r), _)) => Err(format!("server {peer}: {}: {}", r.status, r.why)),
            Some((Ok((reply, finished, refused)), end)) => {
                if let Some(l) = refused {
                    log_line(w, peer, l);
                }
                if finished {
                    sync(w, peer, pl, end)
                        .await
                        .map_err(|_| format!("server {peer}: connection reset"))?;
                }
                Ok(reply)
            }
        };
        if !answer_back(w, peer, Some(id)).await {
            return Err(unanswered(w, peer, &Delivery::Lost).await);
        }
        let reply = reply?;
        let (step, end) =
            with_core(w, id, life, |s, _| s.on_session_reply(&mut out, &reply)).ok_or("this server crashed")?;
        match step? {
            Step::Send(next) => msg = next,
            Step::Done(report) => {
                sync(w, id, life, end).await?;
                return Ok(report);
            }
        }
    }
    Err(format!("the session took more than {SESSION_ROUNDS_MAX} rounds"))
}

/// Waits while server `id` is paused (its timers fire after it resumes).
async fn unpaused(w: &W, id: u64) {
    while w.borrow().cluster.is_paused(id) {
        sleep_for(w, PAUSED_POLL_US).await;
    }
}

/// Server `id`'s scheduled repairs in life `life`.
async fn repair_loop(w: W, id: u64, life: u64) {
    let every_us = match w.borrow().kv.as_ref() {
        Some(kv) if kv.plan.repair_interval_ms > 0 => kv.plan.repair_interval_ms * 1000,
        _ => return,
    };
    loop {
        sleep_for(&w, every_us).await;
        unpaused(&w, id).await;
        let plan = with_core(&w, id, life, |s, _| {
            s.scheduled_repair()
                .then(|| s.repair_plan(None, None, 1).unwrap_or_default())
        });
        let Some((plan, _)) = plan else { return };
        for (j, p) in plan.into_iter().flatten() {
            repair_with(&w, id, life, j, p, true).await;
        }
    }
}

/// Server `id`'s scheduled GC passes (and heartbeats) in life `life`.
async fn gc_loop(w: W, id: u64, life: u64) {
    loop {
        sleep_for(&w, KvPlan::GC_INTERVAL_MS * 1000).await;
        unpaused(&w, id).await;
        let Some((pass, _)) = with_core(&w, id, life, |s, wall| s.scheduled_gc(wall)) else {
            return;
        };
        {
            let mut world = w.borrow_mut();
            let now = world.cluster.now_us();
            if let Some(s) = world.kv.as_mut().and_then(|kv| kv.servers.get_mut(&id)) {
                s.log.alive_us = now;
            }
        }
        if let Some((_, Some(l))) = pass {
            log_line(&w, id, l);
        }
    }
}

/// A fault hook on server `id`'s kv service (`KvServer::admin`): the
/// answer, `error down` from one that is not running.
pub fn admin(w: &W, id: u64, cmd: &str) -> String {
    reconcile(w, id);
    let life = {
        let world = w.borrow();
        match world.kv.as_ref().and_then(|kv| kv.servers.get(&id)) {
            Some(s) if s.core.is_some() => s.life,
            Some(_) => return "error down".into(),
            None => return "error this node has no kv service".into(),
        }
    };
    // a hook's changes (a forced GC pass) are synced before it answers:
    // the node syncs them too, and nothing here waits on a hook
    let Some(((answer, lines), end)) = with_core(w, id, life, |s, wall| s.admin(wall, cmd)) else {
        return "error down".into();
    };
    if let Some(s) = w.borrow_mut().kv.as_mut().and_then(|kv| kv.servers.get_mut(&id)) {
        s.log.synced = s.log.synced.max(end);
    }
    for l in lines {
        log_line(w, id, l);
    }
    answer
}

/// Server `id`'s disk replaced by an empty one (it is down).
pub fn wipe(w: &W, id: u64) {
    reconcile(w, id);
    if let Some(s) = w.borrow_mut().kv.as_mut().and_then(|kv| kv.servers.get_mut(&id)) {
        if s.core.is_none() {
            s.log = Log::default();
        }
    }
}

/// The delete workload's view of the simulated service: requests from
/// clients, the final phase's repairs and reads, the simulated history.
pub struct SimKv {
    pub w: W,
    pub h: H,
    pub op_timeout_us: u64,
}

/// Why a client's request to a simulated server got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unanswered {
    /// The server was down: the request never reached it.
    Refused,
    /// The server crashed while it handled the request.
    Reset,
}

impl SimKv {
    /// A client's request reaching `server`, handled by `run` there, and
    /// its answer's way back.
    async fn at_server<T>(&self, server: u64, run: impl AsyncFnOnce(u64) -> Option<T>) -> Result<T, Unanswered> {
        let Delivery::Arrived(life) = deliver(&self.w, None, server).await else {
            return Err(Unanswered::Refused);
        };
        let t = run(life).await.ok_or(Unanswered::Reset)?;
        answer_back(&self.w, server, None).await;
        if !alive(&self.w, server, life) {
            return Err(Unanswered::Reset);
        }
        Ok(t)
    }
}

fn unanswered_why(server: u64, u: Unanswered) -> String {
    match u {
        Unanswered::Refused => format!("server {server}: connection refused"),
        Unanswered::Reset => format!("server {server}: connection reset"),
    }
}

impl KvService for SimKv {
    fn servers(&self) -> Vec<u64> {
        let world = self.w.borrow();
        world
            .kv
            .as_ref()
            .map(|kv| kv.servers.keys().copied().collect())
            .unwrap_or_default()
    }

    async fn request(&self, server: u64, op: &OpSpec) -> Outcome {
        let w = &self.w;
        let sent = exec::timeout(
            w,
            self.op_timeout_us,
            self.at_server(server, async |life| coordinate(w, server, life, op).await),
        )
        .await;
        match sent {
            Some(Ok((status, body))) => drift_workloads::kv::outcome(op, status, Ok(body)),
            Some(Err(u)) => drift_workloads::kv::unanswered(op, u != Unanswered::Refused, &unanswered_why(server, u)),
            None => drift_workloads::kv::unanswered(op, true, "timed out"),
        }
    }

    async fn repair(&self, server: u64, rounds: u32) -> Result<Value, String> {
        let w = &self.w;
        self.at_server(server, async |life| {
            let (plan, _) = with_core(w, server, life, |s, _| s.repair_plan(None, None, rounds as usize))?;
            let plan = plan.unwrap_or_default();
            let mut reports = Vec::new();
            for (j, p) in plan {
                reports.push(repair_with(w, server, life, j, p, false).await);
            }
            Some(json!({"server": server, "sessions": reports}))
        })
        .await
        .map_err(|u| unanswered_why(server, u))
    }

    async fn dump(&self, server: u64) -> Result<Value, String> {
        let w = &self.w;
        self.at_server(server, async |life| {
            with_core(w, server, life, |s, _| s.dump()).map(|(d, _)| d)
        })
        .await
        .map_err(|u| unanswered_why(server, u))
    }

    fn record(
        &self,
        process: u64,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: u64,
        error: Option<String>,
    ) {
        world::record_at(
            &self.w,
            &self.h,
            process,
            kind,
            f,
            value,
            key,
            Some(node.to_string()),
            error,
        );
    }

    fn event(&self, f: &str, value: Value) {
        world::event(&self.w, &self.h, f, value);
    }
}
