//! The znode workloads through a real ZooKeeper client (the
//! `zookeeper-client` crate), so the same workloads run against the drift
//! keeper and Apache ZooKeeper: the session ([`ZkClient`]: connect, close
//! or walk away) and the coordination calls [`crate::znode`] makes the
//! operations of, with their errors classified as it asks.

use crate::workload::{OpSpec, Outcome, Workload};
use crate::znode::{Coordination, CoordinationError, ErrorKind, Mode, Znodes};
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

/// Where and how a workload's clients connect.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub hosts: String,
    pub workload: Workload,
    pub session_timeout: Duration,
    /// Past it an operation is `info`.
    pub op_timeout: Duration,
    /// `sync` before every read, so a read reflects every write
    /// acknowledged before it began (ZooKeeper's way to a fresh read; the
    /// drift keeper can do it server-side with `quorum_reads`).
    pub sync_reads: bool,
}

pub struct ZkClient {
    client: zk::Client,
    spec: ClientSpec,
    /// Dropping the client leaves the session to expire instead of
    /// closing it (the `ephemeral` workload's `expire` fate).
    detached: bool,
    /// Where [`Coordination::now_us`] counts from.
    since: Instant,
}

impl CoordinationError for zk::Error {
    fn kind(&self) -> ErrorKind {
        use zk::Error::*;
        match self {
            NoNode => ErrorKind::NoNode,
            NodeExists => ErrorKind::NodeExists,
            BadVersion => ErrorKind::BadVersion,
            NotEmpty | NoChildrenForEphemerals | InvalidAcl | NoAuth | BadArguments(_) | Unimplemented => {
                ErrorKind::OtherDefinite
            }
            _ => ErrorKind::Indeterminate,
        }
    }
}

fn options(mode: Mode) -> zk::CreateOptions<'static> {
    let mode = match mode {
        Mode::Persistent => zk::CreateMode::Persistent,
        Mode::Ephemeral => zk::CreateMode::Ephemeral,
        Mode::PersistentSequential => zk::CreateMode::PersistentSequential,
    };
    mode.with_acls(zk::Acls::anyone_all())
}

impl Coordination for ZkClient {
    type Error = zk::Error;

    async fn create(&self, path: &str, data: &[u8], mode: Mode) -> Result<Option<i64>, zk::Error> {
        let (_, seq) = self.client.create(path, data, &options(mode)).await?;
        Ok((mode == Mode::PersistentSequential).then(|| seq.into_i64()))
    }

    async fn get_data(&self, path: &str) -> Result<(Vec<u8>, i32), zk::Error> {
        let (data, stat) = self.client.get_data(path).await?;
        Ok((data, stat.version))
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<(), zk::Error> {
        self.client.set_data(path, data, version).await.map(|_| ())
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<(), zk::Error> {
        self.client.delete(path, version).await
    }

    async fn children(&self, path: &str) -> Result<Vec<String>, zk::Error> {
        self.client.list_children(path).await
    }

    async fn child_count(&self, path: &str) -> Result<Option<u64>, zk::Error> {
        Ok(self.client.check_stat(path).await?.map(|s| s.num_children as u64))
    }

    async fn sync(&self, path: &str) -> Result<(), zk::Error> {
        self.client.sync(path).await
    }

    async fn multi_create(&self, creates: &[(String, Vec<u8>, Mode)]) -> Result<(), zk::Error> {
        let mut m = self.client.new_multi_writer();
        for (path, data, mode) in creates {
            m.add_create(path, data, &options(*mode))?;
        }
        match m.commit().await {
            Ok(_) => Ok(()),
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
            Err(zk::MultiWriteError::OperationFailed { source, .. }) => Err(source),
        }
    }

    fn now_us(&self) -> u64 {
        self.since.elapsed().as_micros() as u64
    }

    async fn within<F: Future>(&self, us: u64, f: F) -> Option<F::Output> {
        tokio::time::timeout(Duration::from_micros(us), f).await.ok()
    }

    async fn sleep_us(&self, us: u64) {
        tokio::time::sleep(Duration::from_micros(us)).await
    }
}

impl ZkClient {
    /// Opens a session (bounded by three op timeouts, at least 3 s); a
    /// `detached` session is left to expire when the client goes away,
    /// rather than closed.
    pub async fn connect(spec: &ClientSpec, detached: bool) -> Result<ZkClient, String> {
        let mut connector = zk::Client::connector().with_session_timeout(spec.session_timeout);
        if detached {
            connector = connector.with_detached();
        }
        let hosts = &spec.hosts;
        let connect = connector.connect(hosts);
        let client = tokio::time::timeout(spec.op_timeout.max(Duration::from_secs(1)) * 3, connect)
            .await
            .map_err(|_| format!("connecting to {hosts} timed out"))?
            .map_err(|e| format!("connecting to {hosts}: {e}"))?;
        Ok(ZkClient {
            client,
            spec: spec.clone(),
            detached,
            since: Instant::now(),
        })
    }

    fn znodes(&self) -> Znodes<'_, ZkClient> {
        Znodes {
            session: self,
            workload: self.spec.workload,
            sync_reads: self.spec.sync_reads,
            op_timeout_us: self.spec.op_timeout.as_micros() as u64,
        }
    }

    /// Creates the workload's root (and /drift) if missing.
    pub async fn setup(&self) -> Result<(), String> {
        self.znodes().setup().await
    }
}

impl crate::worker::Session for ZkClient {
    async fn invoke(&self, op: &OpSpec) -> Outcome {
        self.znodes().invoke(op).await
    }

    fn detached(&self) -> bool {
        self.detached
    }

    async fn end_session(self) -> Outcome {
        if self.detached {
            drop(self.client);
            return Outcome::Ok(Value::Null);
        }
        let mut state = self.client.state_watcher();
        drop(self.client);
        let closed = async {
            loop {
                match state.changed().await {
                    zk::SessionState::Closed => return Ok(()),
                    s if s.is_terminated() => return Err(s),
                    _ => {}
                }
            }
        };
        match tokio::time::timeout(self.spec.op_timeout, closed).await {
            Ok(Ok(())) => Outcome::Ok(Value::Null),
            Ok(Err(s)) => Outcome::Info(format!("session {s} before it closed")),
            Err(_) if state.peek_state() == zk::SessionState::Closed => Outcome::Ok(Value::Null),
            Err(_) => Outcome::Info("close timed out".into()),
        }
    }

    /// Dropped: the client closes the session in the background.
    async fn release(self) {}

    /// The client pings by itself.
    fn ping_every_us(&self) -> Option<u64> {
        None
    }

    fn ping(&self) {}
}
