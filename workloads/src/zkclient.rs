//! Workload operations through a real ZooKeeper client (the
//! `zookeeper-client` crate), so the same workloads run against the drift
//! keeper and Apache ZooKeeper.
//!
//! Classification (docs/ARCHITECTURE.md, "History": `fail` did not happen, `info` may have): an error that says the operation did not
//! take effect (NoNode, NodeExists, BadVersion, …) is `fail`; a timeout,
//! a lost connection or an expired session is `info` — the operation may
//! have happened.

use crate::workload::{OpSpec, Outcome, Workload};
use serde_json::{json, Value};
use std::time::Duration;
use zookeeper_client as zk;

/// Most children a dequeue tries before giving up as contended.
const DEQUEUE_TRIES_MAX: usize = 16;
/// Most elements one drain takes before it stops as a partial drain; the
/// final phase drains until a drain completes `ok`, so each op stays short.
const DRAIN_CHUNK: usize = 200;
/// Times a drain asks whether a delete it lost track of took effect.
const RESOLVE_TRIES: usize = 3;

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
        })
    }

    fn root(&self) -> &'static str {
        self.spec.workload.root()
    }

    /// Syncs `path` first when reads must be fresh.
    async fn before_read(&self, path: &str) -> Result<(), zk::Error> {
        if self.spec.sync_reads {
            self.client.sync(path).await?;
        }
        Ok(())
    }

    async fn read_data(&self, path: &str) -> Result<(Vec<u8>, zk::Stat), zk::Error> {
        self.before_read(path).await?;
        self.client.get_data(path).await
    }

    /// Creates the workload's root (and /drift) if missing.
    pub async fn setup(&self) -> Result<(), String> {
        for p in ["/drift", self.root()] {
            match self.client.create(p, b"", &open()).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(format!("creating {p}: {e}")),
            }
        }
        Ok(())
    }

    /// Invokes one operation, bounded by the op timeout (past it: info).
    pub async fn invoke(&self, op: &OpSpec) -> Outcome {
        match tokio::time::timeout(self.spec.op_timeout, self.run(op)).await {
            Ok(o) => o,
            Err(_) => Outcome::Info("timeout".into()),
        }
    }

    async fn run(&self, op: &OpSpec) -> Outcome {
        match self.spec.workload {
            Workload::Register { .. } => self.register(op).await,
            Workload::UniqueIds => match self
                .client
                .create(&format!("{}/id-", self.root()), b"", &sequential())
                .await
            {
                Ok((_, seq)) => Outcome::Ok(json!(seq.into_i64())),
                Err(e) => outcome_of(e),
            },
            Workload::Counter => self.counter(op).await,
            Workload::TotalQueue => self.queue(op).await,
            Workload::Ephemeral => self.ephemeral(op).await,
            // not znode workloads: their clients are crate::table and crate::kv
            Workload::InsertRetry | Workload::Delete { .. } => {
                Outcome::Fail(format!("{} is not a znode operation", op.f))
            }
        }
    }

    /// The op that ends this session: `close`, or `expire` for a session
    /// left to time out.
    pub fn end_op(&self) -> &'static str {
        if self.detached {
            "expire"
        } else {
            "close"
        }
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
        match tokio::time::timeout(self.spec.op_timeout, closed).await {
            Ok(Ok(())) => Outcome::Ok(Value::Null),
            Ok(Err(s)) => Outcome::Info(format!("session {s} before it closed")),
            Err(_) if state.peek_state() == zk::SessionState::Closed => Outcome::Ok(Value::Null),
            Err(_) => Outcome::Info("close timed out".into()),
        }
    }

    async fn ephemeral(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
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
            // before it began, whichever server answers it. A read changes
            // nothing, so any error is `fail` (an `info` would retire a
            // healthy session)
            "read" | "final-read" => {
                if let Err(e) = self.client.sync(root).await {
                    return Outcome::Fail(e.to_string());
                }
                match self.client.list_children(root).await {
                    Ok(mut kids) => {
                        kids.sort();
                        Outcome::Ok(json!(kids))
                    }
                    Err(e) => Outcome::Fail(e.to_string()),
                }
            }
            f => Outcome::Fail(format!("ephemeral has no op {f} on a live client")),
        }
    }

    async fn register(&self, op: &OpSpec) -> Outcome {
        let path = format!("{}/{}", self.root(), op.key.as_deref().unwrap_or("0"));
        match op.f {
            // a read changes nothing: whatever its error, it did not happen
            "read" => match self.read_data(&path).await {
                Ok((data, _)) => Outcome::Ok(parse_int(&data)),
                Err(zk::Error::NoNode) => Outcome::Ok(Value::Null),
                Err(e) => Outcome::Fail(e.to_string()),
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
                    // the versioned set was never sent
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
            _ => {
                let read = async {
                    self.before_read(root).await?;
                    self.client.check_stat(root).await
                };
                match read.await {
                    Ok(Some(stat)) => Outcome::Ok(json!(stat.num_children)),
                    Ok(None) => Outcome::Ok(json!(0)),
                    Err(e) => Outcome::Fail(e.to_string()),
                }
            }
        }
    }

    async fn queue(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
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
            _ => self.drain().await,
        }
    }

    /// Takes every element in order until a listing, after a sync, comes
    /// back empty: `ok` with what it took — the queue was empty at its
    /// end, which is what an `ok` drain means (Jepsen's convention). One
    /// that stops first — [`DRAIN_CHUNK`] taken, half the op timeout
    /// spent (so the timeout never cuts it off with deletes done and
    /// unrecorded), a delete it cannot settle — is a partial drain: `info`
    /// carrying what it took. Nothing taken and nothing in doubt is
    /// `fail`. A delete whose reply is lost is settled by looking for the
    /// element again.
    async fn drain(&self) -> Outcome {
        let deadline = tokio::time::Instant::now() + self.spec.op_timeout / 2;
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
            let listed = async {
                self.client.sync(root).await?;
                self.client.list_children(root).await
            };
            let mut kids = match tokio::time::timeout_at(deadline, listed).await {
                Ok(Ok(k)) => k,
                Ok(Err(e)) => return stop(taken, &e.to_string()),
                Err(_) => return stop(taken, "out of time"),
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
                // gone (taken by someone else) or unreachable: move on
                let Ok(Ok((data, stat))) = tokio::time::timeout_at(deadline, self.client.get_data(&path)).await else {
                    if tokio::time::Instant::now() >= deadline {
                        return stop(taken, "out of time");
                    }
                    continue;
                };
                match tokio::time::timeout_at(deadline, self.client.delete(&path, Some(stat.version))).await {
                    Ok(Ok(())) => taken.push(parse_int(&data)),
                    Ok(Err(zk::Error::NoNode)) | Ok(Err(zk::Error::BadVersion)) => {}
                    Ok(Err(_)) | Err(_) => {
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

    /// Whether `path` is gone, asked after a sync (a few tries, as the
    /// connection may be coming back); false when it cannot be told.
    async fn deleted(&self, path: &str) -> bool {
        for _ in 0..RESOLVE_TRIES {
            let asked = async {
                self.client.sync(path).await?;
                self.client.check_stat(path).await
            };
            match asked.await {
                Ok(stat) => return stat.is_none(),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        false
    }

    /// Takes the smallest element: Ok(None) when empty; Err(outcome) on an
    /// error whose effect is unknown.
    async fn dequeue(&self) -> Result<Option<Value>, Outcome> {
        let root = self.root();
        for _ in 0..DEQUEUE_TRIES_MAX {
            // nothing is written before the delete: errors there are `fail`
            let mut kids = self
                .client
                .list_children(root)
                .await
                .map_err(|e| Outcome::Fail(e.to_string()))?;
            if kids.is_empty() {
                return Ok(None);
            }
            kids.sort();
            let path = format!("{root}/{}", kids[0]);
            let (data, stat) = match self.client.get_data(&path).await {
                Ok(x) => x,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(Outcome::Fail(e.to_string())),
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
