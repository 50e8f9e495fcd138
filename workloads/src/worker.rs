//! The worker loop of every workload ([`run`]), and the znode workloads'
//! client and final phase over a [`World`].
//!
//! One loop paces every worker ([`Ticks`]), gives its [`Client`] one
//! logical operation per tick, attempts it until the client's retry
//! policy says done ([`Client::then`]: insert-retry attempts again after
//! an indeterminate outcome; the others never do), and retires the
//! process after an attempt that may still be running. The clients:
//! [`Znodes`] (the znode workloads, over a world's sessions), the
//! harness's inserts over the table's HTTP interface and its kv requests.
//! A campaign on real servers (the `zookeeper-client` crate, tokio, the
//! wall clock) and the simulator (its client of the keeper, its
//! executor, virtual time) run the same loop with the same client: the
//! same draw of each session's fate, the same final operations tried the
//! same number of times.

use crate::workload::{OpSpec, Outcome, Workload};
use crate::Rng;
use drift_checkers::history::OpType;
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

/// A worker's clock: the wall clock from the main phase's start, or the
/// simulator's virtual time.
#[allow(async_fn_in_trait)]
pub trait Clock {
    fn now_us(&self) -> u64;
    async fn sleep_until_us(&self, at_us: u64);
}

/// The wall clock from an instant on (the main phase's start), with
/// tokio's timers.
#[derive(Debug, Clone, Copy)]
pub struct WallClock(pub std::time::Instant);

impl Clock for WallClock {
    fn now_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }

    async fn sleep_until_us(&self, at_us: u64) {
        tokio::time::sleep_until((self.0 + std::time::Duration::from_micros(at_us)).into()).await
    }
}

/// Where a znode worker runs: how it opens sessions, tells and waits for
/// time, and records its operations.
#[allow(async_fn_in_trait)]
pub trait World: Clock {
    type Session: Session;
    /// Opens a session; `hint` spreads the sessions over the servers
    /// where the world chooses the server.
    async fn connect(&self, hint: u64, detached: bool) -> Option<Self::Session>;
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

/// When a worker's next operation is due, on its world's clock: the
/// first within one period of its start, each next 0.5–1.5 periods after
/// the last (drawn from the worker's own generator), never before now.
#[derive(Debug, Clone, Copy)]
pub struct Ticks {
    next_us: u64,
    every_us: u64,
}

impl Ticks {
    pub fn start(now_us: u64, every_us: u64, rng: &mut Rng) -> Ticks {
        Ticks {
            next_us: now_us + (every_us as f64 * rng.unit()) as u64,
            every_us,
        }
    }

    pub fn due_us(&self) -> u64 {
        self.next_us
    }

    /// Once the due time came (at `now_us`): the next one.
    pub fn advance(&mut self, now_us: u64, rng: &mut Rng) {
        self.next_us = self.next_us.max(now_us) + (self.every_us as f64 * (0.5 + rng.unit())) as u64;
    }
}

/// How one attempt ended, for the worker loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Its completion's type in the history.
    pub kind: OpType,
    /// Whether the process is retired: it may still be executing the
    /// attempt (an indeterminate outcome), or its session ended.
    pub retire: bool,
}

impl Ended {
    /// Ended as `kind`; retired when indeterminate.
    pub fn of(kind: OpType) -> Ended {
        Ended {
            kind,
            retire: kind == OpType::Info,
        }
    }
}

/// What the worker does after an attempt: the workload's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// The logical operation is over.
    Done,
    /// Attempt it again this long from now (if that is before the end).
    Again { after_us: u64 },
}

/// A workload's client as the one worker loop drives it: at each tick of
/// the pace one logical operation, made of attempts, each recorded as an
/// operation of the history, until the client's retry policy says done.
#[allow(async_fn_in_trait)]
pub trait Client {
    /// One logical operation.
    type Op;
    /// Gets ready to operate from `process` (opens a session, where the
    /// client has them); false skips this tick.
    async fn ready(&mut self, process: u64, rng: &mut Rng) -> bool {
        let _ = (process, rng);
        true
    }
    /// How often an idle client must be pinged while its worker waits;
    /// None when nothing needs it.
    fn ping_every_us(&self) -> Option<u64> {
        None
    }
    fn ping(&self) {}
    /// The next logical operation.
    fn draw(&mut self, rng: &mut Rng) -> Self::Op;
    /// Attempt `n` (from 1) of `op` as `process`: its invocation and its
    /// completion recorded.
    async fn attempt(&mut self, op: &Self::Op, n: u32, process: u64) -> Ended;
    /// The retry policy, after attempt `n` of `op` ended as `ended`: done
    /// unless the workload retries.
    fn then(&mut self, op: &Self::Op, n: u32, ended: Ended, rng: &mut Rng) -> Then {
        let _ = (op, n, ended, rng);
        Then::Done
    }
    /// Once the worker's time is up, as `process`.
    async fn finish(self, process: u64)
    where
        Self: Sized,
    {
        let _ = process;
    }
}

/// The worker loop of every workload: worker `wid` of `client`, at the
/// pace, on `clock`, until `pace.until_us`. A process is retired after an
/// attempt that retires it (a new process id, `wid + k·stride`).
pub async fn run<C: Clock, L: Client>(clock: &C, mut client: L, wid: u64, pace: Pace) {
    let mut rng = Rng::new(Rng::derive(pace.seed, &format!("worker-{wid}")));
    let mut process = wid;
    let mut ticks = Ticks::start(clock.now_us(), pace.every_us, &mut rng);
    while clock.now_us() < pace.until_us {
        // wait for the next op, keeping the client alive meanwhile
        loop {
            let (now, next) = (clock.now_us(), ticks.due_us());
            if now >= next {
                break;
            }
            let ping_every = client.ping_every_us().unwrap_or(u64::MAX);
            clock.sleep_until_us(next.min(now.saturating_add(ping_every))).await;
            if client.ping_every_us().is_some() {
                client.ping();
            }
        }
        ticks.advance(clock.now_us(), &mut rng);
        if clock.now_us() >= pace.until_us {
            break;
        }
        if !client.ready(process, &mut rng).await {
            continue;
        }
        let op = client.draw(&mut rng);
        for n in 1.. {
            let ended = client.attempt(&op, n, process).await;
            if ended.retire {
                process += pace.stride;
            }
            match client.then(&op, n, ended, &mut rng) {
                Then::Done => break,
                Then::Again { after_us } => {
                    let at = clock.now_us() + after_us;
                    if at >= pace.until_us {
                        break;
                    }
                    clock.sleep_until_us(at).await;
                }
            }
        }
    }
    client.finish(process).await;
}

/// The znode workloads' client over a [`World`]: one session at a time
/// (its fate, closed or left to expire, drawn when it opens), one attempt
/// per operation; a session is dropped with its retired process.
pub struct Znodes<'a, W: World> {
    world: &'a W,
    workload: Workload,
    wid: u64,
    unique: u64,
    session: Option<W::Session>,
}

impl<'a, W: World> Znodes<'a, W> {
    pub fn new(world: &'a W, workload: Workload, wid: u64) -> Znodes<'a, W> {
        Znodes {
            world,
            workload,
            wid,
            unique: 0,
            session: None,
        }
    }
}

impl<W: World> Client for Znodes<'_, W> {
    type Op = OpSpec;

    async fn ready(&mut self, process: u64, rng: &mut Rng) -> bool {
        if self.session.is_none() {
            // only `ephemeral` sessions ever end on purpose
            let detached = self.workload == Workload::Ephemeral && rng.below(2) == 1;
            self.session = self.world.connect(self.wid + process, detached).await;
        }
        self.session.is_some()
    }

    fn ping_every_us(&self) -> Option<u64> {
        self.session.as_ref().and_then(Session::ping_every_us)
    }

    fn ping(&self) {
        if let Some(s) = &self.session {
            s.ping();
        }
    }

    fn draw(&mut self, rng: &mut Rng) -> OpSpec {
        let mut op = self.workload.next(rng, self.wid, &mut self.unique);
        if self.workload.ends_session(op.f) {
            if let Some(s) = &self.session {
                op.f = s.end_op();
            }
        }
        op
    }

    /// Called only after `ready` opened a session.
    async fn attempt(&mut self, op: &OpSpec, _n: u32, process: u64) -> Ended {
        let Some(s) = self.session.take() else {
            // nothing sent, nothing recorded: a fresh process next time
            return Ended {
                kind: OpType::Fail,
                retire: true,
            };
        };
        let ends = self.workload.ends_session(op.f);
        self.world.record_invoke(process, op);
        let outcome = if ends {
            s.end_session().await
        } else {
            let o = s.invoke(op).await;
            self.session = Some(s);
            o
        };
        self.world.record_outcome(process, op, &outcome);
        let (kind, _, _) = outcome.completion();
        let retire = ends || kind == OpType::Info;
        if retire {
            self.session = None;
        }
        Ended { kind, retire }
    }

    /// The last session ends the way the others do.
    async fn finish(self, process: u64) {
        if let Some(s) = self.session.filter(|_| self.workload == Workload::Ephemeral) {
            let op = OpSpec {
                f: s.end_op(),
                value: Value::Null,
                key: None,
            };
            self.world.record_invoke(process, &op);
            let outcome = s.end_session().await;
            self.world.record_outcome(process, &op, &outcome);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    /// A clock whose sleeps end at once, at the time slept until.
    struct Manual(Cell<u64>);

    impl Clock for Manual {
        fn now_us(&self) -> u64 {
            self.0.get()
        }

        async fn sleep_until_us(&self, at_us: u64) {
            self.0.set(self.0.get().max(at_us));
        }
    }

    /// Every future here is ready when first polled.
    fn ready<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("a manual clock's future waited"),
        }
    }

    /// A client whose attempts end as scripted (`info` until the third,
    /// then `ok`), each taking 10 ms, and whose policy retries an
    /// indeterminate attempt 1 ms later: what it was asked, in order.
    struct Scripted<'a> {
        clock: &'a Manual,
        /// (op, attempt, process, time)
        seen: RefCell<Vec<(u64, u32, u64, u64)>>,
        finished: Cell<Option<u64>>,
    }

    impl Client for &Scripted<'_> {
        type Op = u64;

        fn draw(&mut self, _rng: &mut Rng) -> u64 {
            self.seen.borrow().iter().map(|s| s.0 + 1).max().unwrap_or(0)
        }

        async fn attempt(&mut self, op: &u64, n: u32, process: u64) -> Ended {
            self.seen.borrow_mut().push((*op, n, process, self.clock.now_us()));
            self.clock.0.set(self.clock.now_us() + 10_000);
            Ended::of(if n < 3 { OpType::Info } else { OpType::Ok })
        }

        fn then(&mut self, _op: &u64, _n: u32, ended: Ended, _rng: &mut Rng) -> Then {
            match ended.kind {
                OpType::Info => Then::Again { after_us: 1_000 },
                _ => Then::Done,
            }
        }

        async fn finish(self, process: u64) {
            self.finished.set(Some(process));
        }
    }

    /// The one loop: each logical op attempted until the policy says done,
    /// the process retired (by the stride) after each indeterminate
    /// attempt, a retry never made past the end, the client finished with
    /// the last process.
    #[test]
    fn the_loop_retries_by_the_policy_and_retires_processes() {
        let clock = Manual(Cell::new(0));
        let script = Scripted {
            clock: &clock,
            seen: RefCell::new(Vec::new()),
            finished: Cell::new(None),
        };
        let pace = Pace {
            stride: 4,
            seed: 1,
            until_us: 200_000,
            every_us: 50_000,
        };
        ready(run(&clock, &script, 2, pace));
        let seen = script.seen.borrow();
        assert!(seen.len() >= 6, "{seen:?}");
        // attempts 1, 2, 3 of each op, one process per indeterminate one
        let mut process = 2;
        for (i, &(op, n, p, _)) in seen.iter().enumerate() {
            assert_eq!(n as usize, i % 3 + 1, "{seen:?}");
            assert_eq!(op as usize, i / 3, "{seen:?}");
            assert_eq!(p, process, "{seen:?}");
            if n < 3 {
                process += 4;
            }
        }
        // a retry 1 ms after a 10 ms attempt
        assert_eq!(seen[1].3 - seen[0].3, 11_000);
        // nothing starts past the end; an op cut short there stays cut
        assert!(seen.iter().all(|s| s.3 < 200_000), "{seen:?}");
        assert_eq!(script.finished.get(), Some(process));
    }

    /// Ticks: the first within one period, each next 0.5–1.5 periods on,
    /// never before now.
    #[test]
    fn ticks_keep_the_pace_and_never_fall_behind_now() {
        let mut rng = Rng::new(7);
        let mut t = Ticks::start(1_000, 100, &mut rng);
        assert!((1_000..1_100).contains(&t.due_us()));
        for _ in 0..100 {
            let before = t.due_us();
            t.advance(before, &mut rng);
            let gap = t.due_us() - before;
            assert!((50..=150).contains(&gap), "{gap}");
        }
        let due = t.due_us();
        t.advance(due + 10_000, &mut rng);
        assert!(t.due_us() >= due + 10_000 + 50);
    }
}
