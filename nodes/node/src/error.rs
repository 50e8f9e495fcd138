//! What stops a server from starting, or its storage from going on, by
//! kind: each names what it was about (file, address, snapshot) so the
//! one line a failed server prints says where to look.

use drift_keeper::snapshot::SnapshotError;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A server that cannot start or go on.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cluster file: {0}")]
    Config(#[from] ConfigError),
    #[error("node id {0} is not in the cluster file")]
    UnknownId(u64),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bind {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// Storage that opened but does not hold together (see
    /// `drift_keeper::server::OpenError`).
    #[error("storage: {0}")]
    Damaged(String),
    /// A thread, runtime or signal handler the server needs.
    #[error("{what}: {source}")]
    Runtime {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A cluster file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML of the cluster file's shape (unknown key, wrong type).
    #[error("{0}")]
    Parse(String),
    /// Well-formed, but a value is out of bounds or contradicts another.
    #[error("{0}")]
    Invalid(String),
    /// Either of the above, in the file at `path`.
    #[error("{path}: {source}")]
    In {
        path: PathBuf,
        #[source]
        source: Box<ConfigError>,
    },
}

/// The Raft log's storage failed (defined with the log, in the keeper).
pub use drift_keeper::raftlog::StoreError;
