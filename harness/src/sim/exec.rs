//! The simulated campaign's clients as async tasks on an executor of its
//! own: one thread, tasks polled in id order, woken only by events the
//! simulated cluster hands out (a reply, a closed connection, a timer).
//! No tokio, no wall clock: a task's `await` is a point in simulated time.

use drift_keeper::client::{self, ClientOp, Connected, Reply};
use drift_keeper::sim::{ClientEvent, Cluster};
use drift_keeper::ZkError;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// A value a task waits for, filled by the event loop.
pub struct Slot<T> {
    value: RefCell<Option<T>>,
    waker: RefCell<Option<Waker>>,
}

/// A value one task hands another: fill it once, wait for it once.
pub fn oneshot<T>() -> (Rc<Slot<T>>, Wait<T>) {
    let slot = Slot::new();
    (slot.clone(), Wait(slot))
}

impl<T> Slot<T> {
    fn new() -> Rc<Slot<T>> {
        Rc::new(Slot {
            value: RefCell::new(None),
            waker: RefCell::new(None),
        })
    }

    pub fn fill(&self, v: T) {
        *self.value.borrow_mut() = Some(v);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// Waits for a [`Slot`].
pub struct Wait<T>(Rc<Slot<T>>);

impl<T> Future for Wait<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.0.value.borrow_mut().take() {
            Some(v) => Poll::Ready(v),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The server answered with this error.
    Zk(ZkError),
    /// The connection ended before the answer: the request may have
    /// happened.
    ConnectionLoss,
    /// The session is gone.
    SessionExpired,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Zk(e) => write!(f, "{e:?}"),
            CallError::ConnectionLoss => write!(f, "connection loss"),
            CallError::SessionExpired => write!(f, "session expired"),
        }
    }
}

impl CallError {
    /// Whether the request certainly did not take effect.
    pub fn definite(self) -> bool {
        matches!(
            self,
            CallError::Zk(
                ZkError::NoNode
                    | ZkError::NodeExists
                    | ZkError::BadVersion
                    | ZkError::NotEmpty
                    | ZkError::NoChildrenForEphemerals
                    | ZkError::InvalidAcl
                    | ZkError::NoAuth
                    | ZkError::BadArguments
                    | ZkError::Unimplemented
            )
        )
    }
}

type Answer = Result<Reply, CallError>;

#[derive(Default)]
struct ConnWaits {
    connect: Option<Rc<Slot<Result<Connected, CallError>>>>,
    /// xid → (opcode, where the answer goes).
    pending: BTreeMap<i32, (i32, Rc<Slot<Answer>>)>,
    closed: bool,
}

/// The simulated cluster and what the clients wait for from it.
pub struct World {
    pub cluster: Cluster,
    /// The kv service beside the keepers, when the workload needs it.
    pub kv: Option<super::kv::KvSim>,
    /// The replicated table beside the keepers, when the workload needs it.
    pub table: Option<super::table::TableSim>,
    conns: BTreeMap<u64, ConnWaits>,
    timers: BTreeMap<u64, Rc<Slot<()>>>,
    next_token: u64,
    /// Tasks started from inside a task ([`spawn`]) or left running when
    /// a [`run`] ended, for the next `run` to poll.
    spawned: Vec<Task>,
}

pub type W = Rc<RefCell<World>>;
type Task = Pin<Box<dyn Future<Output = ()>>>;

impl World {
    pub fn new(cluster: Cluster) -> W {
        Rc::new(RefCell::new(World {
            cluster,
            kv: None,
            table: None,
            conns: BTreeMap::new(),
            timers: BTreeMap::new(),
            next_token: 1,
            spawned: Vec::new(),
        }))
    }

    fn dispatch(&mut self, ev: ClientEvent) {
        match ev {
            ClientEvent::Timer { token } => {
                if let Some(s) = self.timers.remove(&token) {
                    s.fill(());
                }
            }
            ClientEvent::Closed { conn } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.closed = true;
                    if let Some(s) = c.connect.take() {
                        s.fill(Err(CallError::ConnectionLoss));
                    }
                    for (_, (_, s)) in std::mem::take(&mut c.pending) {
                        s.fill(Err(CallError::ConnectionLoss));
                    }
                }
            }
            ClientEvent::Frame { conn, payload } => {
                let Some(c) = self.conns.get_mut(&conn) else { return };
                if let Some(s) = c.connect.take() {
                    s.fill(client::decode_connected(&payload).map_err(|_| CallError::ConnectionLoss));
                    return;
                }
                let Ok(xid) = client::reply_xid(&payload) else { return };
                // notifications and ping answers wait for no one
                if let Some((opcode, s)) = c.pending.remove(&xid) {
                    s.fill(match client::decode_reply(&payload, opcode) {
                        Ok(r) if r.err == ZkError::Ok => Ok(r),
                        Ok(r) if r.err == ZkError::SessionExpired => Err(CallError::SessionExpired),
                        Ok(r) => Err(CallError::Zk(r.err)),
                        Err(_) => Err(CallError::ConnectionLoss),
                    });
                }
            }
        }
    }
}

/// Ends the world's tasks and what clients wait for: a task holds the
/// world, and the world its tasks, so without this a finished run would
/// never be freed (a sweep runs thousands).
pub fn shut_down(w: &W) {
    let (tasks, conns, timers, table) = {
        let mut world = w.borrow_mut();
        (
            std::mem::take(&mut world.spawned),
            std::mem::take(&mut world.conns),
            std::mem::take(&mut world.timers),
            world.table.take(),
        )
    };
    drop(tasks);
    drop(conns);
    drop(timers);
    drop(table);
}

/// Starts `task` beside the running ones: it runs through this and later
/// [`run`]s until it ends (a server's timer loop, a message in flight).
pub fn spawn(w: &W, task: impl Future<Output = ()> + 'static) {
    w.borrow_mut().spawned.push(Box::pin(task));
}

/// Sleeps until simulated time `at_us`.
pub fn sleep_until(w: &W, at_us: u64) -> Wait<()> {
    let mut world = w.borrow_mut();
    let slot = Slot::new();
    let token = world.next_token;
    world.next_token += 1;
    world.timers.insert(token, slot.clone());
    world.cluster.timer(at_us, token);
    Wait(slot)
}

pub fn now_us(w: &W) -> u64 {
    w.borrow().cluster.now_us()
}

/// Runs `fut` at most `us` of simulated time: `None` past it.
pub async fn timeout<T>(w: &W, us: u64, fut: impl Future<Output = T>) -> Option<T> {
    let at = now_us(w) + us;
    let timer = sleep_until(w, at);
    Race {
        fut: Box::pin(fut),
        timer,
    }
    .await
}

struct Race<F: Future> {
    fut: Pin<Box<F>>,
    timer: Wait<()>,
}

impl<F: Future> Future for Race<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        match Pin::new(&mut self.timer).poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Opens a connection to server `node` and sends the connect frame; the
/// answer (or its loss) arrives in the returned wait.
pub fn open_conn(
    w: &W,
    node: u64,
    timeout_ms: i32,
    session: i64,
    passwd: &[u8],
    last_zxid: i64,
) -> (u64, Wait<Result<Connected, CallError>>) {
    let mut world = w.borrow_mut();
    let conn = world.cluster.connect(node);
    let slot = Slot::new();
    world.conns.insert(
        conn,
        ConnWaits {
            connect: Some(slot.clone()),
            ..ConnWaits::default()
        },
    );
    world
        .cluster
        .send(conn, client::encode_connect(timeout_ms, session, passwd, last_zxid));
    (conn, Wait(slot))
}

/// Sends `op` on `conn` under `xid`; its answer arrives in the wait.
pub fn request(w: &W, conn: u64, xid: i32, op: &ClientOp) -> Wait<Answer> {
    let mut world = w.borrow_mut();
    let slot = Slot::new();
    match world.conns.get_mut(&conn) {
        Some(c) if !c.closed => {
            c.pending.insert(xid, (op.opcode(), slot.clone()));
        }
        _ => {
            slot.fill(Err(CallError::ConnectionLoss));
            return Wait(slot);
        }
    }
    world.cluster.send(conn, client::encode_request(xid, op));
    Wait(slot)
}

/// Sends a frame nobody waits for the answer to (a ping).
pub fn send_only(w: &W, conn: u64, op: &ClientOp) {
    let mut world = w.borrow_mut();
    if world.conns.get(&conn).is_some_and(|c| !c.closed) {
        world.cluster.send(conn, client::encode_request(0, op));
    }
}

pub fn is_closed(w: &W, conn: u64) -> bool {
    w.borrow().conns.get(&conn).is_none_or(|c| c.closed)
}

/// The client hangs up `conn`.
pub fn hang_up(w: &W, conn: u64) {
    let mut world = w.borrow_mut();
    if let Some(c) = world.conns.get_mut(&conn) {
        c.closed = true;
    }
    world.cluster.hang_up(conn);
}

struct TaskWaker {
    id: usize,
    ready: Arc<Mutex<BTreeSet<usize>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        if let Ok(mut r) = self.ready.lock() {
            r.insert(self.id);
        }
    }
}

/// Runs `tasks`, and every task spawned, until `tasks` all end or
/// simulated time reaches `until_us`. A spawned task still running then
/// waits for the next `run`; one of `tasks` still running is dropped (an
/// operation it had in flight stays without a completion).
pub fn run(w: &W, tasks: Vec<Task>, until_us: u64) {
    let ready = Arc::new(Mutex::new(BTreeSet::new()));
    let mut all: Vec<Option<Task>> = Vec::new();
    let mut wakers: Vec<Waker> = Vec::new();
    let add = |t: Task, all: &mut Vec<Option<Task>>, wakers: &mut Vec<Waker>| {
        let id = all.len();
        all.push(Some(t));
        wakers.push(Waker::from(Arc::new(TaskWaker {
            id,
            ready: ready.clone(),
        })));
        if let Ok(mut r) = ready.lock() {
            r.insert(id);
        }
    };
    let foreground = tasks.len();
    for t in tasks {
        add(t, &mut all, &mut wakers);
    }
    loop {
        loop {
            let spawned = std::mem::take(&mut w.borrow_mut().spawned);
            for t in spawned {
                add(t, &mut all, &mut wakers);
            }
            let batch: Vec<usize> = match ready.lock() {
                Ok(mut r) => std::mem::take(&mut *r).into_iter().collect(),
                Err(_) => return,
            };
            if batch.is_empty() {
                break;
            }
            for id in batch {
                let Some(task) = all[id].as_mut() else { continue };
                let mut cx = Context::from_waker(&wakers[id]);
                if task.as_mut().poll(&mut cx).is_ready() {
                    all[id] = None;
                }
            }
        }
        if all[..foreground].iter().all(Option::is_none) {
            break;
        }
        let ev = w.borrow_mut().cluster.next_client_event(until_us);
        match ev {
            Some(ev) => w.borrow_mut().dispatch(ev),
            None => break,
        }
    }
    // what was spawned goes on in the next run
    let mut world = w.borrow_mut();
    let later = std::mem::take(&mut world.spawned);
    world.spawned = all.into_iter().skip(foreground).flatten().chain(later).collect();
}
