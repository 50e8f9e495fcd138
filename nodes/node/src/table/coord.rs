//! The replica's session with its coordinator (the keeper cluster, or
//! Apache ZooKeeper), through the zookeeper-client crate.
//!
//! Every call counts one round trip and is bounded by [`OP_TIMEOUT`]. Errors
//! are sorted by what they mean for the caller:
//!
//! * [`ZkErr::Lost`] — the request may or may not have been applied
//!   (connection lost, timed out). The session may still be alive.
//! * [`ZkErr::NoSession`] — no session, or it expired: the replica is
//!   read-only until [`Coordinator::connect`] makes a new one (ephemeral
//!   nodes of the old session — locks, `is_active`, the leader candidacy —
//!   are gone).
//! * the ZooKeeper outcomes a caller branches on (`NoNode`, `NodeExists`,
//!   `BadVersion`, `NotEmpty`).

use drift_table::zk::{CreateMode, KeeperOp};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use zookeeper_client as zk;

/// How long one request may take before its outcome counts as unknown.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ZkErr {
    #[error("no node")]
    NoNode,
    #[error("node exists")]
    NodeExists,
    #[error("bad version")]
    BadVersion,
    #[error("node not empty")]
    NotEmpty,
    /// The outcome is unknown.
    #[error("outcome unknown: {0}")]
    Lost(String),
    /// No live session.
    #[error("no coordinator session")]
    NoSession,
    #[error("{0}")]
    Other(String),
}

impl From<zk::Error> for ZkErr {
    fn from(e: zk::Error) -> Self {
        match e {
            zk::Error::NoNode => ZkErr::NoNode,
            zk::Error::NodeExists => ZkErr::NodeExists,
            zk::Error::BadVersion => ZkErr::BadVersion,
            zk::Error::NotEmpty => ZkErr::NotEmpty,
            zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved => ZkErr::NoSession,
            // the server answered and refused: nothing was applied
            zk::Error::NoAuth
            | zk::Error::InvalidAcl
            | zk::Error::BadArguments(_)
            | zk::Error::MarshallingError
            | zk::Error::Unimplemented
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::QuotaExceeded
            | zk::Error::Throttled
            | zk::Error::NotReadOnly
            | zk::Error::NoWatcher
            | zk::Error::AuthFailed
            | zk::Error::ReconfigDisabled
            | zk::Error::UnexpectedErrorCode(_) => ZkErr::Other(e.to_string()),
            // everything else is the client's own failure (a connection
            // dropped for silence, a reply it could not read, one it never
            // got): the request may have been applied
            other => ZkErr::Lost(other.to_string()),
        }
    }
}

/// A one-shot watch and the session it was set on. The client crate's
/// watcher panics when its session's task is dropped without a last event
/// (all clients gone: [`Coordinator::drop_session`], a cut); holding a
/// client here keeps the session served until the watch resolves or is
/// dropped, so a wait on it ends, never panics.
pub struct Watch {
    watcher: zk::OneshotWatcher,
    _session: zk::Client,
}

impl Watch {
    /// The event: the watched change, or the session's end.
    pub async fn changed(self) -> zk::WatchedEvent {
        self.watcher.changed().await
    }
}

/// A failed multi: the failing op's index when the server named one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiErr {
    pub index: Option<usize>,
    pub err: ZkErr,
}

/// What one op of a successful multi returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// The created path (with a sequential suffix where asked).
    Created(String),
    Done,
}

/// The ACL of every node a replica creates: every permission for the
/// identities its session authenticated as (the cluster's credentials,
/// see [`credentials`]), reading for everyone. A client without the
/// credentials can read the table's tree, as ZooKeeper lets it, and write
/// nothing under it.
static TABLE_ACLS: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

/// The `digest` credentials (`user:password`) replicas authenticate their
/// coordinator sessions with: derived from the cluster's secret, so every
/// replica of the cluster has them and nobody else.
pub fn credentials(secret: &[u8]) -> Vec<u8> {
    let password = crate::http_auth::hmac_sha256(secret, &[b"drift-coordinator-acl-v1"]);
    format!("drift:{}", crate::peer_auth::hex(&password[..16])).into_bytes()
}

pub struct Coordinator {
    connect: String,
    /// The `digest` credentials every session authenticates with.
    credentials: Option<Vec<u8>>,
    /// The `keeper-cut` hook: no session until healed.
    cut: std::sync::atomic::AtomicBool,
    session_timeout: Duration,
    client: Mutex<Option<zk::Client>>,
    round_trips: AtomicU64,
    sessions: AtomicU64,
}

fn mode(m: CreateMode) -> zk::CreateMode {
    match m {
        CreateMode::Persistent => zk::CreateMode::Persistent,
        CreateMode::PersistentSequential => zk::CreateMode::PersistentSequential,
        CreateMode::Ephemeral => zk::CreateMode::Ephemeral,
        CreateMode::EphemeralSequential => zk::CreateMode::EphemeralSequential,
    }
}

async fn bounded<T>(f: impl std::future::Future<Output = Result<T, zk::Error>>) -> Result<T, ZkErr> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(ZkErr::from),
        Err(_) => Err(ZkErr::Lost(format!("no answer within {} s", OP_TIMEOUT.as_secs()))),
    }
}

impl Coordinator {
    pub fn new(connect: &str, session_timeout: Duration) -> Coordinator {
        Coordinator {
            connect: connect.to_string(),
            credentials: None,
            cut: std::sync::atomic::AtomicBool::new(false),
            session_timeout,
            client: Mutex::new(None),
            round_trips: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
        }
    }

    /// Has every session authenticate with `credentials` (`digest`).
    pub fn with_credentials(mut self, credentials: Vec<u8>) -> Coordinator {
        self.credentials = Some(credentials);
        self
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.credentials.is_some() {
            zk::Acls::new(&TABLE_ACLS)
        } else {
            zk::Acls::anyone_all()
        }
    }

    pub fn connect_string(&self) -> &str {
        &self.connect
    }

    /// Round trips made so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Sessions established so far (a new one means the ephemeral nodes of
    /// the last are gone).
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Cuts the replica off its coordinator (or heals the cut): the
    /// session is dropped without closing it, as a network cut would leave
    /// it, and no new one is made while cut.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            self.drop_session();
        }
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// A new session (replacing any old one). Sessions are detached: a
    /// replica that goes away (killed, cut) leaves its session to expire,
    /// as ClickHouse's does, rather than closing it.
    pub async fn connect(&self) -> Result<zk::SessionId, ZkErr> {
        if self.is_cut() {
            return Err(ZkErr::NoSession);
        }
        let mut connector = zk::Client::connector()
            .with_detached()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(Duration::from_secs(2));
        if let Some(c) = &self.credentials {
            connector = connector.with_auth("digest", c);
        }
        let c = tokio::time::timeout(self.session_timeout + OP_TIMEOUT, connector.connect(&self.connect))
            .await
            .map_err(|_| ZkErr::Lost("connecting timed out".into()))??;
        let id = c.session_id();
        *self.client.lock().expect("not poisoned") = Some(c);
        self.sessions.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// Forgets the session (after it expired).
    pub fn drop_session(&self) {
        *self.client.lock().expect("not poisoned") = None;
    }

    /// The current client, if its session is not over.
    pub fn client(&self) -> Result<zk::Client, ZkErr> {
        if self.is_cut() {
            return Err(ZkErr::NoSession);
        }
        let guard = self.client.lock().expect("not poisoned");
        match &*guard {
            Some(c) if !c.state().is_terminated() => Ok(c.clone()),
            _ => Err(ZkErr::NoSession),
        }
    }

    /// Whether a session is live (connected or reconnecting within it).
    pub fn has_session(&self) -> bool {
        self.client().is_ok()
    }

    /// The current session's id.
    pub fn session_id(&self) -> Option<i64> {
        self.client().ok().map(|c| c.session_id().0)
    }

    fn count(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    fn on_err<T>(&self, r: Result<T, ZkErr>) -> Result<T, ZkErr> {
        if r.as_ref().err() == Some(&ZkErr::NoSession) {
            self.drop_session();
        }
        r
    }

    pub async fn multi(&self, ops: &[KeeperOp]) -> Result<Vec<OpResult>, MultiErr> {
        let c = self.client().map_err(|err| MultiErr { index: None, err })?;
        self.count();
        let acl = self.acls();
        let mut w = c.new_multi_writer();
        for op in ops {
            let added = match op {
                KeeperOp::Create { path, data, mode: m } => w.add_create(path, data, &mode(*m).with_acls(acl)),
                KeeperOp::Delete { path, version } => w.add_delete(path, (*version >= 0).then_some(*version)),
                KeeperOp::SetData { path, data, version } => {
                    w.add_set_data(path, data, (*version >= 0).then_some(*version))
                }
                KeeperOp::Check { path, version } => w.add_check_version(path, *version),
            };
            added.map_err(|e| MultiErr {
                index: None,
                err: ZkErr::Other(format!("bad op {}: {e}", op.path())),
            })?;
        }
        let r = tokio::time::timeout(OP_TIMEOUT, w.commit()).await;
        let results = match r {
            Err(_) => {
                return Err(MultiErr {
                    index: None,
                    err: ZkErr::Lost(format!("no answer within {} s", OP_TIMEOUT.as_secs())),
                })
            }
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
                return Err(MultiErr {
                    index: Some(index),
                    err: source.into(),
                })
            }
            Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                let err = self.on_err(Err::<(), _>(ZkErr::from(source))).unwrap_err();
                return Err(MultiErr { index: None, err });
            }
            Ok(Ok(results)) => results,
        };
        Ok(results
            .into_iter()
            .map(|r| match r {
                zk::MultiWriteResult::Create { path, .. } => OpResult::Created(path),
                _ => OpResult::Done,
            })
            .collect())
    }

    pub async fn get(&self, path: &str) -> Result<Option<(Vec<u8>, zk::Stat)>, ZkErr> {
        let c = self.client()?;
        self.count();
        match self.on_err(bounded(c.get_data(path)).await) {
            Ok(v) => Ok(Some(v)),
            Err(ZkErr::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn exists(&self, path: &str) -> Result<Option<zk::Stat>, ZkErr> {
        let c = self.client()?;
        self.count();
        self.on_err(bounded(c.check_stat(path)).await)
    }

    /// Children of `path`, sorted.
    pub async fn children(&self, path: &str) -> Result<Vec<String>, ZkErr> {
        let c = self.client()?;
        self.count();
        let mut v = self.on_err(bounded(c.list_children(path)).await)?;
        v.sort();
        Ok(v)
    }

    /// Children of `path`, sorted, and a watch that fires when they change.
    pub async fn watch_children(&self, path: &str) -> Result<(Vec<String>, Watch), ZkErr> {
        let c = self.client()?;
        self.count();
        let (mut v, _, w) = self.on_err(bounded(c.get_and_watch_children(path)).await)?;
        v.sort();
        Ok((
            v,
            Watch {
                watcher: w,
                _session: c,
            },
        ))
    }

    /// The node's stat (if it exists) and a watch on it.
    pub async fn watch_exists(&self, path: &str) -> Result<(Option<zk::Stat>, Watch), ZkErr> {
        let c = self.client()?;
        self.count();
        let (stat, w) = self.on_err(bounded(c.check_and_watch_stat(path)).await)?;
        Ok((
            stat,
            Watch {
                watcher: w,
                _session: c,
            },
        ))
    }

    /// Creates `path`; returns the created path.
    pub async fn create(&self, path: &str, data: &[u8], m: CreateMode) -> Result<String, ZkErr> {
        let c = self.client()?;
        self.count();
        let acl = self.acls();
        let opts = mode(m).with_acls(acl);
        let (_, seq) = self.on_err(bounded(c.create(path, data, &opts)).await)?;
        Ok(match m {
            CreateMode::PersistentSequential | CreateMode::EphemeralSequential => {
                drift_table::zk::sequence_name(path, seq.into_i64() as u64)
            }
            _ => path.to_string(),
        })
    }

    /// Creates `path` unless it exists.
    pub async fn ensure(&self, path: &str) -> Result<(), ZkErr> {
        match self.create(path, b"", CreateMode::Persistent).await {
            Ok(_) | Err(ZkErr::NodeExists) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub async fn delete(&self, path: &str, version: Option<i32>) -> Result<(), ZkErr> {
        let c = self.client()?;
        self.count();
        self.on_err(bounded(c.delete(path, version)).await)
    }

    pub async fn set(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<zk::Stat, ZkErr> {
        let c = self.client()?;
        self.count();
        self.on_err(bounded(c.set_data(path, data, version)).await)
    }

    /// Waits until this session's server has everything the leader
    /// committed before the call.
    pub async fn sync(&self, path: &str) -> Result<(), ZkErr> {
        let c = self.client()?;
        self.count();
        self.on_err(bounded(c.sync(path)).await)
    }

    /// Data and stat of many nodes, [`drift_table::zk::MULTI_OPS_MAX`] per
    /// round trip; `None` for a node that does not exist.
    pub async fn get_many(&self, paths: &[String]) -> Result<Vec<Option<(Vec<u8>, zk::Stat)>>, ZkErr> {
        let mut out = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(drift_table::zk::MULTI_OPS_MAX) {
            let c = self.client()?;
            self.count();
            let mut r = c.new_multi_reader();
            for p in chunk {
                r.add_get_data(p)
                    .map_err(|e| ZkErr::Other(format!("bad path {p}: {e}")))?;
            }
            let results = self.on_err(bounded(r.commit()).await)?;
            for res in results {
                out.push(match res {
                    zk::MultiReadResult::Data { data, stat } => Some((data, stat)),
                    zk::MultiReadResult::Error { err: zk::Error::NoNode } => None,
                    zk::MultiReadResult::Error { err } => return Err(err.into()),
                    _ => return Err(ZkErr::Other("an unexpected answer in a data read".into())),
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_the_server_did_not_answer_is_an_unknown_outcome() {
        // a commit failing so may have been applied: never discard its part
        for e in [
            zk::Error::ConnectionLoss,
            zk::Error::Timeout,
            zk::Error::UnexpectedError("no response from connection in 2000ms".into()),
            zk::Error::RuntimeInconsistent,
        ] {
            assert!(matches!(ZkErr::from(e.clone()), ZkErr::Lost(_)), "{e:?}");
        }
        for e in [zk::Error::NoAuth, zk::Error::Throttled, zk::Error::MarshallingError] {
            assert!(
                matches!(ZkErr::from(e.clone()), ZkErr::Other(_)),
                "{e:?}: the server refused it"
            );
        }
        assert_eq!(ZkErr::from(zk::Error::SessionExpired), ZkErr::NoSession);
        assert_eq!(ZkErr::from(zk::Error::NodeExists), ZkErr::NodeExists);
    }
}
