//! The znode workloads' operations, written once over a small set of
//! coordination calls ([`Coordination`]): the same steps and the same
//! classification whether the session is a real ZooKeeper client's
//! ([`crate::zkclient::ZkClient`], the `zookeeper-client` crate, against
//! the drift keeper or Apache ZooKeeper) or the simulator's client of the
//! keeper (`harness/src/sim/client.rs`).
//!
//! Classification (docs/ARCHITECTURE.md, "History": `fail` did not
//! happen, `info` may have): an error that says the operation did not
//! take effect (NoNode, NodeExists, BadVersion, …) is `fail`; a timeout,
//! a lost connection or an expired session is `info`. A read changes
//! nothing, so whatever its error it is `fail`.

use crate::workload::{OpSpec, Outcome, Workload};
use serde_json::{json, Value};
use std::fmt::Display;
use std::future::Future;

/// Most children a dequeue tries before giving up as contended.
const DEQUEUE_TRIES_MAX: usize = 16;
/// Most elements one drain takes before it stops as a partial drain; the
/// final phase drains until a drain completes `ok`, so each op stays short.
const DRAIN_CHUNK: usize = 200;
/// Times a drain asks whether a delete it lost track of took effect.
const RESOLVE_TRIES: usize = 3;
/// Between two of those asks.
const RESOLVE_PAUSE_US: u64 = 200_000;

/// How a znode is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Persistent,
    Ephemeral,
    PersistentSequential,
}

/// What an error of a coordination call says about the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NoNode,
    NodeExists,
    BadVersion,
    /// Another error that says the call did not take effect.
    OtherDefinite,
    /// The call may have taken effect (a lost connection, an expired
    /// session, a timeout).
    Indeterminate,
}

/// An error of a coordination call.
pub trait CoordinationError: Display {
    fn kind(&self) -> ErrorKind;

    /// Whether the call certainly did not take effect.
    fn definite(&self) -> bool {
        self.kind() != ErrorKind::Indeterminate
    }
}

/// The calls the znode workloads make, and the clock they are timed by.
/// `async fn`s: a session that is `Send` gives `Send` operations.
#[allow(async_fn_in_trait)]
pub trait Coordination {
    type Error: CoordinationError;

    /// Creates `path`; the sequence number a sequential create appended.
    async fn create(&self, path: &str, data: &[u8], mode: Mode) -> Result<Option<i64>, Self::Error>;
    /// A znode's data and version.
    async fn get_data(&self, path: &str) -> Result<(Vec<u8>, i32), Self::Error>;
    /// Sets a znode's data (at `version`, when given).
    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<(), Self::Error>;
    /// Deletes a znode (at `version`, when given).
    async fn delete(&self, path: &str, version: Option<i32>) -> Result<(), Self::Error>;
    async fn children(&self, path: &str) -> Result<Vec<String>, Self::Error>;
    /// How many children `path` has; `None` when it does not exist.
    async fn child_count(&self, path: &str) -> Result<Option<u64>, Self::Error>;
    async fn sync(&self, path: &str) -> Result<(), Self::Error>;
    /// Creates every one of `creates` in one transaction.
    async fn multi_create(&self, creates: &[(String, Vec<u8>, Mode)]) -> Result<(), Self::Error>;

    /// Microseconds on the session's clock (the wall clock's, or the
    /// simulator's).
    fn now_us(&self) -> u64;
    /// `f`, or `None` once `us` microseconds passed.
    fn within<F: Future>(&self, us: u64, f: F) -> impl Future<Output = Option<F::Output>>;
    fn sleep_us(&self, us: u64) -> impl Future<Output = ()>;
}

fn outcome_of<E: CoordinationError>(e: E) -> Outcome {
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

/// A znode workload's operations over one session.
pub struct Znodes<'a, C> {
    pub session: &'a C,
    pub workload: Workload,
    /// `sync` before every read (see `ClientSpec::sync_reads`).
    pub sync_reads: bool,
    /// Past it an operation is `info`.
    pub op_timeout_us: u64,
}

impl<C: Coordination> Znodes<'_, C> {
    fn root(&self) -> &'static str {
        self.workload.root()
    }

    async fn read_data(&self, path: &str) -> Result<(Vec<u8>, i32), C::Error> {
        if self.sync_reads {
            self.session.sync(path).await?;
        }
        self.session.get_data(path).await
    }

    /// Creates the workload's root (and /drift) if missing.
    pub async fn setup(&self) -> Result<(), String> {
        for p in ["/drift", self.root()] {
            match self.session.create(p, b"", Mode::Persistent).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NodeExists => {}
                Err(e) => return Err(format!("creating {p}: {e}")),
            }
        }
        Ok(())
    }

    /// Invokes one operation, bounded by the op timeout (past it: info).
    pub async fn invoke(&self, op: &OpSpec) -> Outcome {
        match self.session.within(self.op_timeout_us, self.run(op)).await {
            Some(o) => o,
            None => Outcome::Info("timeout".into()),
        }
    }

    async fn run(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match self.workload {
            Workload::Register { .. } => self.register(op).await,
            Workload::UniqueIds => match self
                .session
                .create(&format!("{root}/id-"), b"", Mode::PersistentSequential)
                .await
            {
                Ok(Some(seq)) => Outcome::Ok(json!(seq)),
                Ok(None) => Outcome::Info("no sequence in the answer".into()),
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

    async fn ephemeral(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match op.f {
            "create" => {
                let Some(name) = op.value.as_str() else {
                    return Outcome::Fail("create needs a name".into());
                };
                match self
                    .session
                    .create(&format!("{root}/{name}"), b"", Mode::Ephemeral)
                    .await
                {
                    Ok(_) => Outcome::Ok(op.value.clone()),
                    Err(e) => outcome_of(e),
                }
            }
            // sync first: the read then reflects every write acknowledged
            // before it began, whichever server answers it. A read changes
            // nothing, so any error is `fail` (an `info` would retire a
            // healthy session)
            "read" | "final-read" => {
                if let Err(e) = self.session.sync(root).await {
                    return Outcome::Fail(e.to_string());
                }
                match self.session.children(root).await {
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
        let s = self.session;
        match op.f {
            // a read changes nothing: whatever its error, it did not happen
            "read" => match self.read_data(&path).await {
                Ok((data, _)) => Outcome::Ok(parse_int(&data)),
                Err(e) if e.kind() == ErrorKind::NoNode => Outcome::Ok(Value::Null),
                Err(e) => Outcome::Fail(e.to_string()),
            },
            "write" => {
                let data = op.value.to_string();
                let data = data.as_bytes();
                match s.set_data(&path, data, None).await {
                    Ok(()) => Outcome::Ok(op.value.clone()),
                    Err(e) if e.kind() == ErrorKind::NoNode => match s.create(&path, data, Mode::Persistent).await {
                        Ok(_) => Outcome::Ok(op.value.clone()),
                        // someone created it meanwhile: set over it
                        Err(e) if e.kind() == ErrorKind::NodeExists => match s.set_data(&path, data, None).await {
                            Ok(()) => Outcome::Ok(op.value.clone()),
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
                match s.get_data(&path).await {
                    Ok((data, version)) if parse_int(&data) == *expected => {
                        match s.set_data(&path, new.to_string().as_bytes(), Some(version)).await {
                            Ok(()) => Outcome::Ok(op.value.clone()),
                            Err(e) => outcome_of(e),
                        }
                    }
                    Ok(_) => Outcome::Fail("value differs".into()),
                    Err(e) if e.kind() == ErrorKind::NoNode => Outcome::Fail("no value".into()),
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
                let creates: Vec<(String, Vec<u8>, Mode)> = (0..n)
                    .map(|_| (format!("{root}/c-"), Vec::new(), Mode::PersistentSequential))
                    .collect();
                match self.session.multi_create(&creates).await {
                    Ok(()) => Outcome::Ok(op.value.clone()),
                    Err(e) => outcome_of(e),
                }
            }
            _ => {
                let read = async {
                    if self.sync_reads {
                        self.session.sync(root).await?;
                    }
                    self.session.child_count(root).await
                };
                match read.await {
                    Ok(n) => Outcome::Ok(json!(n.unwrap_or(0))),
                    Err(e) if e.kind() == ErrorKind::NoNode => Outcome::Ok(json!(0)),
                    Err(e) => Outcome::Fail(e.to_string()),
                }
            }
        }
    }

    async fn queue(&self, op: &OpSpec) -> Outcome {
        let root = self.root();
        match op.f {
            "enqueue" => match self
                .session
                .create(
                    &format!("{root}/q-"),
                    op.value.to_string().as_bytes(),
                    Mode::PersistentSequential,
                )
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
        let s = self.session;
        let deadline = s.now_us() + self.op_timeout_us / 2;
        let left = || deadline.saturating_sub(s.now_us());
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
                s.sync(root).await?;
                s.children(root).await
            };
            let mut kids = match s.within(left(), listed).await {
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
                // gone (taken by someone else) or unreachable: move on
                let Some(Ok((data, version))) = s.within(left(), s.get_data(&path)).await else {
                    if s.now_us() >= deadline {
                        return stop(taken, "out of time");
                    }
                    continue;
                };
                match s.within(left(), s.delete(&path, Some(version))).await {
                    Some(Ok(())) => taken.push(parse_int(&data)),
                    Some(Err(e)) if e.kind() == ErrorKind::NoNode || e.kind() == ErrorKind::BadVersion => {}
                    Some(Err(_)) | None => {
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
        let s = self.session;
        for _ in 0..RESOLVE_TRIES {
            let asked = async {
                s.sync(path).await?;
                s.child_count(path).await
            };
            match asked.await {
                Ok(n) => return n.is_none(),
                Err(e) if e.kind() == ErrorKind::NoNode => return true,
                Err(_) => s.sleep_us(RESOLVE_PAUSE_US).await,
            }
        }
        false
    }

    /// Takes the smallest element: Ok(None) when empty; Err(outcome) on an
    /// error whose effect is unknown.
    async fn dequeue(&self) -> Result<Option<Value>, Outcome> {
        let s = self.session;
        let root = self.root();
        for _ in 0..DEQUEUE_TRIES_MAX {
            // nothing is written before the delete: errors there are `fail`
            let mut kids = s.children(root).await.map_err(|e| Outcome::Fail(e.to_string()))?;
            if kids.is_empty() {
                return Ok(None);
            }
            kids.sort();
            let path = format!("{root}/{}", kids[0]);
            let (data, version) = match s.get_data(&path).await {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::NoNode => continue,
                Err(e) => return Err(Outcome::Fail(e.to_string())),
            };
            match s.delete(&path, Some(version)).await {
                Ok(()) => return Ok(Some(parse_int(&data))),
                Err(e) if e.kind() == ErrorKind::NoNode || e.kind() == ErrorKind::BadVersion => continue,
                Err(e) => return Err(outcome_of(e)),
            }
        }
        Err(Outcome::Fail("contended".into()))
    }
}
