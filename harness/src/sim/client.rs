//! The workloads' operations through a simulated ZooKeeper client: the
//! same operations, in the same steps and with the same classification
//! as `drift_workloads::zkclient` (a definite error is `fail`, a lost
//! connection or a timeout `info`), over real frames to the simulated
//! servers. Like a real client it moves to another server when its
//! connection ends, resuming its session.

use super::exec::{self, CallError, W};
use drift_keeper::client::{ClientOp, Reply, ReplyBody};
use drift_keeper::CreateMode;
use drift_workloads::{OpSpec, Outcome, Workload};
use serde_json::{json, Value};
use std::cell::Cell;

/// Most children a dequeue tries before giving up as contended.
const DEQUEUE_TRIES_MAX: usize = 16;
/// Most elements one drain takes before it stops as a partial drain.
const DRAIN_CHUNK: usize = 200;
/// Times a drain asks whether a delete it lost track of took effect.
const RESOLVE_TRIES: usize = 3;

/// How the simulated clients connect.
#[derive(Debug, Clone)]
pub struct Spec {
    pub workload: Workload,
    pub servers: Vec<u64>,
    pub session_timeout_ms: i32,
    pub op_timeout_us: u64,
    /// `sync` before reads (see `ClientSpec::sync_reads`).
    pub sync_reads: bool,
}

pub struct SimZk {
    w: W,
    spec: Spec,
    conn: Cell<u64>,
    /// The server index to try next.
    next_server: Cell<usize>,
    session: i64,
    passwd: Vec<u8>,
    xid: Cell<i32>,
    last_zxid: Cell<i64>,
    expired: Cell<bool>,
    /// Left to expire rather than closed.
    detached: bool,
}

fn outcome_of(e: CallError) -> Outcome {
    if e.definite() {
        Outcome::Fail(e.to_string())
    } else {
        Outcome::Info(e.to_string())
    }
}

fn parse_int(data: &[u8]) -> Value {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .map_or(Value::Null, |v| json!(v))
}

fn create(path: String, data: Vec<u8>, mode: CreateMode) -> ClientOp {
    ClientOp::Create { path, data, mode }
}

impl SimZk {
    /// Opens a session through the servers in turn from `first` (bounded
    /// by three op timeouts).
    pub async fn connect(w: &W, spec: &Spec, first: usize, detached: bool) -> Result<SimZk, String> {
        let deadline = exec::now_us(w) + spec.op_timeout_us * 3;
        let mut k = first;
        while exec::now_us(w) < deadline {
            let node = spec.servers[k % spec.servers.len()];
            k += 1;
            let (conn, answer) = exec::open_conn(w, node, spec.session_timeout_ms, 0, &[0; 16], 0);
            match exec::timeout(w, spec.op_timeout_us, answer).await {
                Some(Ok(c)) if c.session_id != 0 => {
                    return Ok(SimZk {
                        w: w.clone(),
                        spec: spec.clone(),
                        conn: Cell::new(conn),
                        next_server: Cell::new(k),
                        session: c.session_id,
                        passwd: c.passwd,
                        xid: Cell::new(0),
                        last_zxid: Cell::new(0),
                        expired: Cell::new(false),
                        detached,
                    })
                }
                _ => exec::hang_up(w, conn),
            }
        }
        Err("connecting timed out".into())
    }

    /// A new connection for the session, to the next server; false if
    /// the session is gone or no server answered in time.
    async fn reconnect(&self) -> Result<(), CallError> {
        let deadline = exec::now_us(&self.w) + self.spec.op_timeout_us;
        while exec::now_us(&self.w) < deadline {
            let k = self.next_server.get();
            self.next_server.set(k + 1);
            let node = self.spec.servers[k % self.spec.servers.len()];
            let (conn, answer) = exec::open_conn(
                &self.w,
                node,
                self.spec.session_timeout_ms,
                self.session,
                &self.passwd,
                self.last_zxid.get(),
            );
            match exec::timeout(&self.w, self.spec.op_timeout_us / 2, answer).await {
                Some(Ok(c)) if c.session_id == 0 => {
                    self.expired.set(true);
                    return Err(CallError::SessionExpired);
                }
                Some(Ok(_)) => {
                    self.conn.set(conn);
                    return Ok(());
                }
                _ => exec::hang_up(&self.w, conn),
            }
        }
        Err(CallError::ConnectionLoss)
    }

    /// One request and its answer.
    pub async fn call(&self, op: ClientOp) -> Result<Reply, CallError> {
        if self.expired.get() {
            return Err(CallError::SessionExpired);
        }
        if exec::is_closed(&self.w, self.conn.get()) {
            self.reconnect().await?;
        }
        let xid = self.xid.get() + 1;
        self.xid.set(xid);
        let answer = exec::request(&self.w, self.conn.get(), xid, &op).await;
        match &answer {
            Ok(r) => self.last_zxid.set(self.last_zxid.get().max(r.zxid)),
            Err(CallError::SessionExpired) => self.expired.set(true),
            Err(_) => {}
        }
        answer
    }

    /// Keeps the session alive while its worker waits (a real client's
    /// pings).
    pub fn ping(&self) {
        if !self.expired.get() && !self.detached {
            exec::send_only(&self.w, self.conn.get(), &ClientOp::Ping);
        }
    }

    pub fn session_timeout_us(&self) -> u64 {
        self.spec.session_timeout_ms as u64 * 1000
    }

    fn root(&self) -> &'static str {
        self.spec.workload.root()
    }

    async fn read_data(&self, path: &str) -> Result<(Vec<u8>, drift_keeper::node::Stat), CallError> {
        if self.spec.sync_reads {
            self.call(ClientOp::Sync { path: path.into() }).await?;
        }
        match self.call(ClientOp::GetData { path: path.into() }).await?.body {
            ReplyBody::Data(d, s) => Ok((d, s)),
            _ => Err(CallError::ConnectionLoss),
        }
    }

    /// Creates the workload's root (and /drift) if missing.
    pub async fn setup(&self) -> Result<(), String> {
        for p in ["/drift", self.root()] {
            match self.call(create(p.into(), vec![], CreateMode::Persistent)).await {
                Ok(_) | Err(CallError::Zk(drift_keeper::ZkError::NodeExists)) => {}
                Err(e) => return Err(format!("creating {p}: {e}")),
            }
        }
        Ok(())
    }

    /// Invokes one operation, bounded by the op timeout (past it: info).
    pub async fn invoke(&self, op: &OpSpec) -> Outcome {
        match exec::timeout(&self.w, self.spec.op_timeout_us, self.run(op)).await {
            Some(o) => o,
            None => Outcome::Info("timeout".into()),
        }
    }

    async fn run(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match self.spec.workload {
            Workload::Register { .. } => self.register(op).await,
            Workload::UniqueIds => {
                match self
                    .call(create(format!("{root}/id-"), vec![], CreateMode::PersistentSequential))
                    .await
                {
                    Ok(Reply {
                        body: ReplyBody::Path(p),
                        ..
                    }) => {
                        // the sequence number is the name's last ten digits
                        let seq = p.rsplit('-').next().and_then(|s| s.parse::<i64>().ok());
                        seq.map_or(Outcome::Info("no sequence in the path".into()), |s| {
                            Outcome::Ok(json!(s))
                        })
                    }
                    Ok(_) => Outcome::Info("no path in the answer".into()),
                    Err(e) => outcome_of(e),
                }
            }
            Workload::Counter => self.counter(op).await,
            Workload::TotalQueue => self.queue(op).await,
            Workload::Ephemeral => self.ephemeral(op).await,
            Workload::InsertRetry | Workload::Delete { .. } => {
                Outcome::Fail(format!("{} is not a znode operation", op.f))
            }
        }
    }

    /// The op that ends this session.
    pub fn end_op(&self) -> &'static str {
        if self.detached {
            "expire"
        } else {
            "close"
        }
    }

    /// Ends the session: `close` waits for the cluster to acknowledge it
    /// (past the op timeout: info); `expire` walks away.
    pub async fn end_session(self) -> Outcome {
        if self.detached {
            exec::hang_up(&self.w, self.conn.get());
            return Outcome::Ok(Value::Null);
        }
        let closed = async {
            match self.call(ClientOp::Close).await {
                Ok(_) => Outcome::Ok(Value::Null),
                Err(e) => Outcome::Info(format!("session {e} before it closed")),
            }
        };
        let o = exec::timeout(&self.w, self.spec.op_timeout_us, closed)
            .await
            .unwrap_or_else(|| Outcome::Info("close timed out".into()));
        exec::hang_up(&self.w, self.conn.get());
        o
    }

    async fn ephemeral(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match op.f {
            "create" => {
                let Some(name) = op.value.as_str() else {
                    return Outcome::Fail("create needs a name".into());
                };
                match self
                    .call(create(format!("{root}/{name}"), vec![], CreateMode::Ephemeral))
                    .await
                {
                    Ok(_) => Outcome::Ok(op.value.clone()),
                    Err(e) => outcome_of(e),
                }
            }
            "read" | "final-read" => {
                if let Err(e) = self.call(ClientOp::Sync { path: root.into() }).await {
                    return Outcome::Fail(e.to_string());
                }
                match self.call(ClientOp::GetChildren { path: root.into() }).await {
                    Ok(Reply {
                        body: ReplyBody::Children(mut kids),
                        ..
                    }) => {
                        kids.sort();
                        Outcome::Ok(json!(kids))
                    }
                    Ok(_) => Outcome::Fail("no children in the answer".into()),
                    Err(e) => Outcome::Fail(e.to_string()),
                }
            }
            f => Outcome::Fail(format!("ephemeral has no op {f} on a live client")),
        }
    }

    async fn register(&self, op: &OpSpec) -> Outcome {
        let path = format!("{}/{}", self.root(), op.key.as_deref().unwrap_or("0"));
        let no_node = CallError::Zk(drift_keeper::ZkError::NoNode);
        let exists = CallError::Zk(drift_keeper::ZkError::NodeExists);
        match op.f {
            "read" => match self.read_data(&path).await {
                Ok((data, _)) => Outcome::Ok(parse_int(&data)),
                Err(e) if e == no_node => Outcome::Ok(Value::Null),
                Err(e) => Outcome::Fail(e.to_string()),
            },
            "write" => {
                let data = op.value.to_string().into_bytes();
                let set = || ClientOp::SetData {
                    path: path.clone(),
                    data: data.clone(),
                    version: -1,
                };
                match self.call(set()).await {
                    Ok(_) => Outcome::Ok(op.value.clone()),
                    Err(e) if e == no_node => {
                        match self
                            .call(create(path.clone(), data.clone(), CreateMode::Persistent))
                            .await
                        {
                            Ok(_) => Outcome::Ok(op.value.clone()),
                            Err(e) if e == exists => match self.call(set()).await {
                                Ok(_) => Outcome::Ok(op.value.clone()),
                                Err(e) => outcome_of(e),
                            },
                            Err(e) => outcome_of(e),
                        }
                    }
                    Err(e) => outcome_of(e),
                }
            }
            "cas" => {
                let (Some(expected), Some(new)) = (op.value.get(0), op.value.get(1)) else {
                    return Outcome::Fail("cas needs [expected, new]".into());
                };
                match self.call(ClientOp::GetData { path: path.clone() }).await {
                    Ok(Reply {
                        body: ReplyBody::Data(data, stat),
                        ..
                    }) if parse_int(&data) == *expected => {
                        match self
                            .call(ClientOp::SetData {
                                path,
                                data: new.to_string().into_bytes(),
                                version: stat.version,
                            })
                            .await
                        {
                            Ok(_) => Outcome::Ok(op.value.clone()),
                            Err(e) => outcome_of(e),
                        }
                    }
                    Ok(_) => Outcome::Fail("value differs".into()),
                    Err(e) if e == no_node => Outcome::Fail("no value".into()),
                    Err(e) => Outcome::Fail(e.to_string()),
                }
            }
            f => Outcome::Fail(format!("register has no op {f}")),
        }
    }

    async fn counter(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match op.f {
            "add" => {
                let n = op.value.as_u64().unwrap_or(1);
                let creates = (0..n)
                    .map(|_| (format!("{root}/c-"), vec![], CreateMode::PersistentSequential))
                    .collect();
                match self.call(ClientOp::MultiCreate(creates)).await {
                    Ok(Reply {
                        body: ReplyBody::Multi(results),
                        ..
                    }) => match results.into_iter().find_map(Result::err) {
                        None => Outcome::Ok(op.value.clone()),
                        Some(e) => outcome_of(CallError::Zk(e)),
                    },
                    Ok(_) => Outcome::Info("no results in the answer".into()),
                    Err(e) => outcome_of(e),
                }
            }
            _ => {
                let read = async {
                    if self.spec.sync_reads {
                        self.call(ClientOp::Sync { path: root.into() }).await?;
                    }
                    self.call(ClientOp::Exists { path: root.into() }).await
                };
                match read.await {
                    Ok(Reply {
                        body: ReplyBody::Stat(stat),
                        ..
                    }) => Outcome::Ok(json!(stat.num_children)),
                    Ok(_) => Outcome::Ok(json!(0)),
                    Err(CallError::Zk(drift_keeper::ZkError::NoNode)) => Outcome::Ok(json!(0)),
                    Err(e) => Outcome::Fail(e.to_string()),
                }
            }
        }
    }

    async fn queue(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match op.f {
            "enqueue" => match self
                .call(create(
                    format!("{root}/q-"),
                    op.value.to_string().into_bytes(),
                    CreateMode::PersistentSequential,
                ))
                .await
            {
                Ok(_) => Outcome::Ok(op.value.clone()),
                Err(e) => outcome_of(e),
            },
            "dequeue" => match self.dequeue().await {
                Ok(Some(v)) => Outcome::Ok(v),
                Ok(None) => Outcome::Fail("empty".into()),
                Err(o) => o,
            },
            _ => self.drain().await,
        }
    }

    async fn children(&self, path: &str) -> Result<Vec<String>, CallError> {
        match self.call(ClientOp::GetChildren { path: path.into() }).await?.body {
            ReplyBody::Children(k) => Ok(k),
            _ => Err(CallError::ConnectionLoss),
        }
    }

    async fn get(&self, path: &str) -> Result<(Vec<u8>, drift_keeper::node::Stat), CallError> {
        match self.call(ClientOp::GetData { path: path.into() }).await?.body {
            ReplyBody::Data(d, s) => Ok((d, s)),
            _ => Err(CallError::ConnectionLoss),
        }
    }

    /// As `ZkClient::drain`: takes elements in order until a listing after
    /// a sync comes back empty (`ok`), or stops as a partial drain.
    async fn drain(&self) -> Outcome {
        let deadline = exec::now_us(&self.w) + self.spec.op_timeout_us / 2;
        let root = self.root();
        let mut taken = Vec::new();
        let stop = |taken: Vec<Value>, why: &str| {
            if taken.is_empty() {
                Outcome::Fail(format!("{why}, nothing taken"))
            } else {
                Outcome::Partial(Value::Array(taken), format!("partial drain: {why}"))
            }
        };
        loop {
            let left = deadline.saturating_sub(exec::now_us(&self.w));
            let listed = async {
                self.call(ClientOp::Sync { path: root.into() }).await?;
                self.children(root).await
            };
            let mut kids = match exec::timeout(&self.w, left, listed).await {
                Some(Ok(k)) => k,
                Some(Err(e)) => return stop(taken, &e.to_string()),
                None => return stop(taken, "out of time"),
            };
            if kids.is_empty() {
                return Outcome::Ok(Value::Array(taken));
            }
            kids.sort();
            for kid in &kids {
                if taken.len() >= DRAIN_CHUNK {
                    return stop(taken, "chunk full");
                }
                let path = format!("{root}/{kid}");
                let left = deadline.saturating_sub(exec::now_us(&self.w));
                let Some(Ok((data, stat))) = exec::timeout(&self.w, left, self.get(&path)).await else {
                    if exec::now_us(&self.w) >= deadline {
                        return stop(taken, "out of time");
                    }
                    continue;
                };
                let left = deadline.saturating_sub(exec::now_us(&self.w));
                let delete = ClientOp::Delete {
                    path: path.clone(),
                    version: stat.version,
                };
                match exec::timeout(&self.w, left, self.call(delete)).await {
                    Some(Ok(_)) => taken.push(parse_int(&data)),
                    Some(Err(CallError::Zk(drift_keeper::ZkError::NoNode | drift_keeper::ZkError::BadVersion))) => {}
                    _ => {
                        if !self.deleted(&path).await {
                            return if taken.is_empty() {
                                Outcome::Info("a delete could not be settled".into())
                            } else {
                                Outcome::Partial(
                                    Value::Array(taken),
                                    "partial drain: a delete could not be settled".into(),
                                )
                            };
                        }
                        taken.push(parse_int(&data));
                    }
                }
            }
        }
    }

    /// Whether `path` is gone, asked after a sync (a few tries).
    async fn deleted(&self, path: &str) -> bool {
        for _ in 0..RESOLVE_TRIES {
            let asked = async {
                self.call(ClientOp::Sync { path: path.into() }).await?;
                self.call(ClientOp::Exists { path: path.into() }).await
            };
            match asked.await {
                Ok(_) => return false,
                Err(CallError::Zk(drift_keeper::ZkError::NoNode)) => return true,
                Err(_) => {
                    let at = exec::now_us(&self.w) + 200_000;
                    exec::sleep_until(&self.w, at).await;
                }
            }
        }
        false
    }

    async fn dequeue(&self) -> Result<Option<Value>, Outcome> {
        let root = self.root();
        for _ in 0..DEQUEUE_TRIES_MAX {
            let mut kids = self.children(root).await.map_err(|e| Outcome::Fail(e.to_string()))?;
            if kids.is_empty() {
                return Ok(None);
            }
            kids.sort();
            let path = format!("{root}/{}", kids[0]);
            let (data, stat) = match self.get(&path).await {
                Ok(x) => x,
                Err(CallError::Zk(drift_keeper::ZkError::NoNode)) => continue,
                Err(e) => return Err(Outcome::Fail(e.to_string())),
            };
            match self
                .call(ClientOp::Delete {
                    path,
                    version: stat.version,
                })
                .await
            {
                Ok(_) => return Ok(Some(parse_int(&data))),
                Err(CallError::Zk(drift_keeper::ZkError::NoNode | drift_keeper::ZkError::BadVersion)) => continue,
                Err(e) => return Err(outcome_of(e)),
            }
        }
        Err(Outcome::Fail("contended".into()))
    }
}
