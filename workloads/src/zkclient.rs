//! Workload operations through a real ZooKeeper client (the
//! `zookeeper-client` crate), so the same workloads run against the drift
//! keeper and Apache ZooKeeper.
//!
//! Classification (DESIGN.md): an error that says the operation did not
//! take effect (NoNode, NodeExists, BadVersion, …) is `fail`; a timeout,
//! a lost connection or an expired session is `info` — the operation may
//! have happened.

use crate::workload::{OpSpec, Outcome, Workload};
use serde_json::{json, Value};
use std::time::Duration;
use zookeeper_client as zk;

/// Most children a dequeue tries before giving up as contended.
const DEQUEUE_TRIES_MAX: usize = 16;
/// Most elements one drain takes (the run bounds the queue anyway).
const DRAIN_MAX: usize = 1_000_000;

pub struct ZkClient {
    client: zk::Client,
    workload: Workload,
    op_timeout: Duration,
    /// Dropping the client leaves the session to expire instead of
    /// closing it (the `ephemeral` workload's `expire` fate).
    detached: bool,
}

fn definite(e: &zk::Error) -> bool {
    use zk::Error::*;
    matches!(
        e,
        NoNode
            | NodeExists
            | BadVersion
            | NotEmpty
            | NoChildrenForEphemerals
            | InvalidAcl
            | NoAuth
            | BadArguments(_)
            | Unimplemented
    )
}

fn outcome_of(e: zk::Error) -> Outcome {
    if definite(&e) {
        Outcome::Fail(e.to_string())
    } else {
        Outcome::Info(e.to_string())
    }
}

fn open() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn ephemeral() -> zk::CreateOptions<'static> {
    zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())
}

fn sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all())
}

fn parse_int(data: &[u8]) -> Value {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .map_or(Value::Null, |v| json!(v))
}

impl ZkClient {
    /// Connects with the given session timeout (bounded by `connect_timeout`).
    pub async fn connect(
        hosts: &str,
        workload: Workload,
        session_timeout: Duration,
        op_timeout: Duration,
    ) -> Result<ZkClient, String> {
        Self::connect_session(hosts, workload, session_timeout, op_timeout, false).await
    }

    /// Connects; a `detached` session is left to expire when the client
    /// goes away, rather than closed.
    pub async fn connect_session(
        hosts: &str,
        workload: Workload,
        session_timeout: Duration,
        op_timeout: Duration,
        detached: bool,
    ) -> Result<ZkClient, String> {
        let mut connector = zk::Client::connector().with_session_timeout(session_timeout);
        if detached {
            connector = connector.with_detached();
        }
        let connect = connector.connect(hosts);
        let client = tokio::time::timeout(op_timeout.max(Duration::from_secs(1)) * 3, connect)
            .await
            .map_err(|_| format!("connecting to {hosts} timed out"))?
            .map_err(|e| format!("connecting to {hosts}: {e}"))?;
        Ok(ZkClient {
            client,
            workload,
            op_timeout,
            detached,
        })
    }

    /// Creates the workload's root (and /drift) if missing.
    pub async fn setup(&self) -> Result<(), String> {
        for p in ["/drift", self.workload.root()] {
            match self.client.create(p, b"", &open()).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(format!("creating {p}: {e}")),
            }
        }
        Ok(())
    }

    /// Invokes one operation, bounded by the op timeout (past it: info).
    pub async fn invoke(&self, op: &OpSpec) -> Outcome {
        match tokio::time::timeout(self.op_timeout, self.run(op)).await {
            Ok(o) => o,
            Err(_) => Outcome::Info("timeout".into()),
        }
    }

    async fn run(&self, op: &OpSpec) -> Outcome {
        match self.workload {
            Workload::Register { .. } => self.register(op).await,
            Workload::UniqueIds => match self
                .client
                .create(&format!("{}/id-", self.workload.root()), b"", &sequential())
                .await
            {
                Ok((_, seq)) => Outcome::Ok(json!(seq.into_i64())),
                Err(e) => outcome_of(e),
            },
            Workload::Counter => self.counter(op).await,
            Workload::TotalQueue => self.queue(op).await,
            Workload::Ephemeral => self.ephemeral(op).await,
        }
    }

    /// The session's id, as the servers name it in their logs.
    pub fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Whether dropping this client leaves its session to expire.
    pub fn detached(&self) -> bool {
        self.detached
    }

    /// Ends the session: `close` waits for the cluster to acknowledge the
    /// close (past the op timeout: info); `expire` walks away from it.
    pub async fn end_session(self) -> Outcome {
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
        match tokio::time::timeout(self.op_timeout, closed).await {
            Ok(Ok(())) => Outcome::Ok(Value::Null),
            Ok(Err(s)) => Outcome::Info(format!("session {s} before it closed")),
            Err(_) if state.peek_state() == zk::SessionState::Closed => Outcome::Ok(Value::Null),
            Err(_) => Outcome::Info("close timed out".into()),
        }
    }

    async fn ephemeral(&self, op: &OpSpec) -> Outcome {
        let root = self.workload.root();
        match op.f {
            "create" => {
                let Some(name) = op.value.as_str() else {
                    return Outcome::Fail("create needs a name".into());
                };
                match self.client.create(&format!("{root}/{name}"), b"", &ephemeral()).await {
                    Ok(_) => Outcome::Ok(op.value.clone()),
                    Err(e) => outcome_of(e),
                }
            }
            // sync first: the read then reflects every write acknowledged
            // before it began, whichever server answers it
            "read" | "final-read" => {
                if let Err(e) = self.client.sync(root).await {
                    return outcome_of(e);
                }
                match self.client.list_children(root).await {
                    Ok(mut kids) => {
                        kids.sort();
                        Outcome::Ok(json!(kids))
                    }
                    Err(e) => outcome_of(e),
                }
            }
            f => Outcome::Fail(format!("ephemeral has no op {f} on a live client")),
        }
    }

    async fn register(&self, op: &OpSpec) -> Outcome {
        let path = format!("{}/{}", self.workload.root(), op.key.as_deref().unwrap_or("0"));
        match op.f {
            "read" => match self.client.get_data(&path).await {
                Ok((data, _)) => Outcome::Ok(parse_int(&data)),
                Err(zk::Error::NoNode) => Outcome::Ok(Value::Null),
                Err(e) => outcome_of(e),
            },
            "write" => {
                let data = op.value.to_string();
                match self.client.set_data(&path, data.as_bytes(), None).await {
                    Ok(_) => Outcome::Ok(op.value.clone()),
                    Err(zk::Error::NoNode) => match self.client.create(&path, data.as_bytes(), &open()).await {
                        Ok(_) => Outcome::Ok(op.value.clone()),
                        // someone created it meanwhile: set over it
                        Err(zk::Error::NodeExists) => match self.client.set_data(&path, data.as_bytes(), None).await {
                            Ok(_) => Outcome::Ok(op.value.clone()),
                            Err(e) => outcome_of(e),
                        },
                        Err(e) => outcome_of(e),
                    },
                    Err(e) => outcome_of(e),
                }
            }
            "cas" => {
                let (Some(expected), Some(new)) = (op.value.get(0), op.value.get(1)) else {
                    return Outcome::Fail("cas needs [expected, new]".into());
                };
                match self.client.get_data(&path).await {
                    Ok((data, stat)) if parse_int(&data) == *expected => {
                        match self
                            .client
                            .set_data(&path, new.to_string().as_bytes(), Some(stat.version))
                            .await
                        {
                            Ok(_) => Outcome::Ok(op.value.clone()),
                            Err(e) => outcome_of(e),
                        }
                    }
                    Ok(_) => Outcome::Fail("value differs".into()),
                    Err(zk::Error::NoNode) => Outcome::Fail("no value".into()),
                    Err(e) => outcome_of(e),
                }
            }
            f => Outcome::Fail(format!("register has no op {f}")),
        }
    }

    async fn counter(&self, op: &OpSpec) -> Outcome {
        let root = self.workload.root();
        match op.f {
            "add" => {
                let n = op.value.as_u64().unwrap_or(1);
                let mut m = self.client.new_multi_writer();
                for _ in 0..n {
                    if let Err(e) = m.add_create(&format!("{root}/c-"), b"", &sequential()) {
                        return Outcome::Fail(e.to_string());
                    }
                }
                match m.commit().await {
                    Ok(_) => Outcome::Ok(op.value.clone()),
                    Err(zk::MultiWriteError::RequestFailed { source }) => outcome_of(source),
                    Err(zk::MultiWriteError::OperationFailed { source, .. }) => outcome_of(source),
                }
            }
            _ => match self.client.check_stat(root).await {
                Ok(Some(stat)) => Outcome::Ok(json!(stat.num_children)),
                Ok(None) => Outcome::Ok(json!(0)),
                Err(e) => outcome_of(e),
            },
        }
    }

    async fn queue(&self, op: &OpSpec) -> Outcome {
        let root = self.workload.root();
        match op.f {
            "enqueue" => match self
                .client
                .create(&format!("{root}/q-"), op.value.to_string().as_bytes(), &sequential())
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
            _ => {
                let mut all = Vec::new();
                while all.len() < DRAIN_MAX {
                    match self.dequeue().await {
                        Ok(Some(v)) => all.push(v),
                        Ok(None) => break,
                        // a drain that fails part-way may have taken some
                        Err(_) if all.is_empty() => return Outcome::Info("drain interrupted".into()),
                        Err(_) => return Outcome::Info(format!("drain interrupted after {}", all.len())),
                    }
                }
                Outcome::Ok(Value::Array(all))
            }
        }
    }

    /// Takes the smallest element: Ok(None) when empty; Err(outcome) on an
    /// error whose effect is unknown.
    async fn dequeue(&self) -> Result<Option<Value>, Outcome> {
        let root = self.workload.root();
        for _ in 0..DEQUEUE_TRIES_MAX {
            let mut kids = self.client.list_children(root).await.map_err(outcome_of)?;
            if kids.is_empty() {
                return Ok(None);
            }
            kids.sort();
            let path = format!("{root}/{}", kids[0]);
            let (data, stat) = match self.client.get_data(&path).await {
                Ok(x) => x,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(outcome_of(e)),
            };
            match self.client.delete(&path, Some(stat.version)).await {
                Ok(()) => return Ok(Some(parse_int(&data))),
                Err(zk::Error::NoNode) | Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(outcome_of(e)),
            }
        }
        Err(Outcome::Fail("contended".into()))
    }
}
