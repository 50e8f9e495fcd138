//! The znode workloads' worker loop and final phase, written once over a
//! [`World`]: sessions, time, and the history. A campaign on real servers
//! (the `zookeeper-client` crate, tokio, the wall clock) and the simulator
//! (its client of the keeper, its executor, virtual time) run the same
//! loop: the same pacing, the same draw of each session's fate, the same
//! retirement of a process after an indeterminate outcome, the same final
//! operations tried the same number of times.

use crate::workload::{OpSpec, Outcome, Workload};
use crate::Rng;
use serde_json::Value;

/// Tries of each final operation before it is recorded as failed.
pub const FINAL_TRIES: u32 = 5;
/// Between two tries to open a session for a final operation.
const FINAL_CONNECT_PAUSE_US: u64 = 500_000;
/// Process ids of the final phase start here (plus the concurrency).
pub const FINAL_PROCESS_BASE: u64 = 1_000_000;

/// One session of a znode workload's client.
#[allow(async_fn_in_trait)]
pub trait Session {
    /// Invokes one operation, bounded by the op timeout (past it: info).
    async fn invoke(&self, op: &OpSpec) -> Outcome;
    /// Whether the session is left to expire rather than closed (its fate,
    /// drawn when it opened).
    fn detached(&self) -> bool;
    /// The op that ends this session: `close`, or `expire` for one left
    /// to time out.
    fn end_op(&self) -> &'static str {
        if self.detached() {
            "expire"
        } else {
            "close"
        }
    }
    /// Ends the session: `close` waits for the cluster to acknowledge it
    /// (past the op timeout: info); `expire` walks away.
    async fn end_session(self) -> Outcome;
    /// Gives the session up after a final operation (closing it, or
    /// leaving it to the client to close).
    async fn release(self);
    /// How often an idle session must be pinged by its worker; `None`
    /// when the client keeps it alive by itself.
    fn ping_every_us(&self) -> Option<u64>;
    fn ping(&self);
}

/// Where a znode worker runs: how it opens sessions, tells and waits for
/// time, and records its operations.
#[allow(async_fn_in_trait)]
pub trait World {
    type Session: Session;
    /// Opens a session; `hint` spreads the sessions over the servers
    /// where the world chooses the server.
    async fn connect(&self, hint: u64, detached: bool) -> Option<Self::Session>;
    fn now_us(&self) -> u64;
    async fn sleep_until_us(&self, at_us: u64);
    fn record_invoke(&self, process: u64, op: &OpSpec);
    fn record_outcome(&self, process: u64, op: &OpSpec, outcome: &Outcome);
    /// Records a history event (a final operation that never succeeded).
    fn record_event(&self, f: &str, value: Value);
}

/// How a worker paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Process ids of one worker are `w`, `w + stride`, ….
    pub stride: u64,
    pub seed: u64,
    /// When it stops, on the world's clock.
    pub until_us: u64,
    /// Mean time between two of its operations.
    pub every_us: u64,
}

/// Worker `wid`: operations of `workload` at the pace, each recorded with
/// its outcome; a process is retired (and its session dropped) after an
/// indeterminate outcome or a session's end.
pub async fn worker<W: World>(world: &W, workload: Workload, wid: u64, pace: Pace) {
    let mut rng = Rng::new(Rng::derive(pace.seed, &format!("worker-{wid}")));
    let mut process = wid;
    let mut unique = 0u64;
    let mut session: Option<W::Session> = None;
    // spread the workers' first ops over one period
    let mut next = world.now_us() + (pace.every_us as f64 * rng.unit()) as u64;
    while world.now_us() < pace.until_us {
        // wait for the next op, keeping the session alive meanwhile
        loop {
            let now = world.now_us();
            if now >= next {
                break;
            }
            let ping_every = session.as_ref().and_then(Session::ping_every_us).unwrap_or(u64::MAX);
            world.sleep_until_us(next.min(now.saturating_add(ping_every))).await;
            if let Some(s) = session.as_ref().filter(|s| s.ping_every_us().is_some()) {
                s.ping();
            }
        }
        next = next.max(world.now_us()) + (pace.every_us as f64 * (0.5 + rng.unit())) as u64;
        if session.is_none() {
            // each session's fate (closed, or left to expire) is drawn
            // when it starts; only `ephemeral` sessions ever end on purpose
            let detached = workload == Workload::Ephemeral && rng.below(2) == 1;
            session = world.connect(wid + process, detached).await;
            if session.is_none() {
                continue;
            }
        }
        let mut op = workload.next(&mut rng, wid, &mut unique);
        let ends = workload.ends_session(op.f);
        if ends {
            op.f = session.as_ref().expect("connected").end_op();
        }
        world.record_invoke(process, &op);
        let outcome = if ends {
            session.take().expect("connected").end_session().await
        } else {
            session.as_ref().expect("connected").invoke(&op).await
        };
        world.record_outcome(process, &op, &outcome);
        if ends || matches!(outcome, Outcome::Info(_) | Outcome::Partial(..)) {
            // a new session, or the process may still be executing that
            // op: retire the process either way
            process += pace.stride;
            session = None;
        }
    }
    // the last session ends the way the others do
    if let Some(s) = session.filter(|_| workload == Workload::Ephemeral) {
        let op = OpSpec {
            f: s.end_op(),
            value: Value::Null,
            key: None,
        };
        world.record_invoke(process, &op);
        let outcome = s.end_session().await;
        world.record_outcome(process, &op, &outcome);
    }
}

/// The workload's final operations through fresh sessions, each tried up
/// to [`FINAL_TRIES`] times; a drain is repeated until one completes `ok`
/// (the queue empty). Processes from [`FINAL_PROCESS_BASE`] +
/// `first_process`.
pub async fn final_phase<W: World>(world: &W, workload: Workload, first_process: u64) {
    let mut process = FINAL_PROCESS_BASE + first_process;
    for op in workload.final_ops() {
        let mut failures = 0;
        while failures < FINAL_TRIES {
            let Some(s) = world.connect(process, false).await else {
                failures += 1;
                let at = world.now_us() + FINAL_CONNECT_PAUSE_US;
                world.sleep_until_us(at).await;
                continue;
            };
            world.record_invoke(process, &op);
            let o = s.invoke(&op).await;
            world.record_outcome(process, &op, &o);
            s.release().await;
            process += 1;
            match &o {
                Outcome::Ok(_) => break,
                // took some and stopped: the next drain goes on
                Outcome::Partial(..) => {}
                _ => failures += 1,
            }
        }
        if failures == FINAL_TRIES {
            world.record_event("final-op-failed", serde_json::json!({"f": op.f, "key": op.key}));
        }
    }
}
