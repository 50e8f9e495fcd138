//! The znode workloads through a simulated ZooKeeper client: the session
//! (connect, reconnect to another server when its connection ends,
//! resuming the session, pings, close or walk away) over real frames to
//! the simulated servers, and the coordination calls whose operations
//! `drift_workloads::znode` writes once for this client and the real one.

use super::exec::{self, CallError, W};
use drift_keeper::client::{ClientOp, MultiOp, Reply, ReplyBody};
use drift_keeper::{CreateMode, ZkError};
use drift_workloads::znode::{Coordination, CoordinationError, ErrorKind, Mode, Znodes};
use drift_workloads::{OpSpec, Outcome, Workload};
use serde_json::Value;
use std::cell::Cell;
use std::future::Future;

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

impl CoordinationError for CallError {
    fn kind(&self) -> ErrorKind {
        match self {
            CallError::Zk(ZkError::NoNode) => ErrorKind::NoNode,
            CallError::Zk(ZkError::NodeExists) => ErrorKind::NodeExists,
            CallError::Zk(ZkError::BadVersion) => ErrorKind::BadVersion,
            e if CallError::definite(*e) => ErrorKind::OtherDefinite,
            _ => ErrorKind::Indeterminate,
        }
    }
}

fn create_mode(mode: Mode) -> CreateMode {
    match mode {
        Mode::Persistent => CreateMode::Persistent,
        Mode::Ephemeral => CreateMode::Ephemeral,
        Mode::PersistentSequential => CreateMode::PersistentSequential,
    }
}

impl Coordination for SimZk {
    type Error = CallError;

    async fn create(&self, path: &str, data: &[u8], mode: Mode) -> Result<Option<i64>, CallError> {
        let op = ClientOp::Create {
            path: path.into(),
            data: data.to_vec(),
            mode: create_mode(mode),
        };
        match self.call(op).await?.body {
            // the sequence number is the name's last ten digits
            ReplyBody::Path(p) if mode == Mode::PersistentSequential => {
                Ok(p.rsplit('-').next().and_then(|s| s.parse::<i64>().ok()))
            }
            _ => Ok(None),
        }
    }

    async fn get_data(&self, path: &str) -> Result<(Vec<u8>, i32), CallError> {
        match self.call(ClientOp::GetData { path: path.into() }).await?.body {
            ReplyBody::Data(d, s) => Ok((d, s.version)),
            _ => Err(CallError::ConnectionLoss),
        }
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<(), CallError> {
        let op = ClientOp::SetData {
            path: path.into(),
            data: data.to_vec(),
            version: version.unwrap_or(-1),
        };
        self.call(op).await.map(|_| ())
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<(), CallError> {
        let op = ClientOp::Delete {
            path: path.into(),
            version: version.unwrap_or(-1),
        };
        self.call(op).await.map(|_| ())
    }

    async fn children(&self, path: &str) -> Result<Vec<String>, CallError> {
        match self.call(ClientOp::GetChildren { path: path.into() }).await?.body {
            ReplyBody::Children(k) => Ok(k),
            _ => Err(CallError::ConnectionLoss),
        }
    }

    async fn child_count(&self, path: &str) -> Result<Option<u64>, CallError> {
        match self.call(ClientOp::Exists { path: path.into() }).await {
            Ok(Reply {
                body: ReplyBody::Stat(stat),
                ..
            }) => Ok(Some(stat.num_children as u64)),
            Ok(_) => Ok(Some(0)),
            Err(CallError::Zk(ZkError::NoNode)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn sync(&self, path: &str) -> Result<(), CallError> {
        self.call(ClientOp::Sync { path: path.into() }).await.map(|_| ())
    }

    async fn multi_create(&self, creates: &[(String, Vec<u8>, Mode)]) -> Result<(), CallError> {
        let creates = creates
            .iter()
            .map(|(p, d, m)| MultiOp::Create {
                path: p.clone(),
                data: d.clone(),
                mode: create_mode(*m),
            })
            .collect();
        match self.call(ClientOp::Multi(creates)).await?.body {
            ReplyBody::Multi(results) => match results.into_iter().find_map(Result::err) {
                None => Ok(()),
                Some(e) => Err(CallError::Zk(e)),
            },
            _ => Err(CallError::ConnectionLoss),
        }
    }

    fn now_us(&self) -> u64 {
        exec::now_us(&self.w)
    }

    async fn within<F: Future>(&self, us: u64, f: F) -> Option<F::Output> {
        exec::timeout(&self.w, us, f).await
    }

    async fn sleep_us(&self, us: u64) {
        let at = exec::now_us(&self.w) + us;
        exec::sleep_until(&self.w, at).await
    }
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

    /// Walks away from the session without a goodbye: its connection is
    /// hung up and every later call fails as expired, so the servers
    /// expire it (and its ephemerals) after its timeout.
    pub fn abandon(&self) {
        self.expired.set(true);
        exec::hang_up(&self.w, self.conn.get());
    }

    pub fn session_id(&self) -> i64 {
        self.session
    }

    /// Whether the session is known to be gone.
    pub fn is_expired(&self) -> bool {
        self.expired.get()
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

    fn znodes(&self) -> Znodes<'_, SimZk> {
        Znodes {
            session: self,
            workload: self.spec.workload,
            sync_reads: self.spec.sync_reads,
            op_timeout_us: self.spec.op_timeout_us,
        }
    }

    /// Creates the workload's root (and /drift) if missing.
    pub async fn setup(&self) -> Result<(), String> {
        self.znodes().setup().await
    }
}

impl drift_workloads::worker::Session for SimZk {
    async fn invoke(&self, op: &OpSpec) -> Outcome {
        self.znodes().invoke(op).await
    }

    fn detached(&self) -> bool {
        self.detached
    }

    async fn end_session(self) -> Outcome {
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

    async fn release(self) {
        self.end_session().await;
    }

    /// A third of the session timeout: a real client's pings.
    fn ping_every_us(&self) -> Option<u64> {
        Some(self.session_timeout_us() / 3)
    }

    fn ping(&self) {
        SimZk::ping(self)
    }
}
