//! drift-keeper: the ZooKeeper-compatible coordination service under
//! test, as a deterministic, sans-IO state machine (after ClickHouse
//! Keeper). No clock, randomness, threads or files in here: time comes
//! with each input ([`server::Env`]) and zxid from log entries, files go
//! through the [`disk::Disk`] trait whose real implementation lives in
//! `nodes/node`. raft-rs runs inside, with its randomized election timeout
//! pinned to one value, so it draws nothing either.
//!
//! # Layout
//! * [`path`], [`acl`], [`node`], [`error`] — ZooKeeper's data model
//! * [`digest`] — per-node SipHash, the tree digest as a wrapping sum
//! * [`request`] — writes (logged) and reads, with the log encoding
//! * [`state`] — the committed tree, sessions and digest
//! * `plan` — a write → its deltas and response, against a view
//! * [`storage`] — preprocess / commit / rollback over an overlay
//! * [`watch`], [`session`] — per-server watches; leader session expiry
//! * [`entry`] — the log entry with zxid, time and digest
//! * [`limit`] — what a write may hold to enter the log
//! * [`jute`], [`proto`] — ZooKeeper's wire format and client protocol
//! * [`disk`] — the file seam, and an in-memory disk with faults
//! * [`changelog`] — segmented, checksummed, compressed log files
//! * [`snapshot`] — deterministic, versioned, compressed snapshots
//! * [`raftlog`] — raft-rs `Storage` on the changelog and snapshots
//! * [`peer`], [`peer_check`] — what servers send each other, and what a
//!   peer's Raft message must satisfy before it is stepped
//! * [`server`] — one server: Raft, the tree, clients, as inputs and effects
//! * [`client`] — the client's side of the wire protocol
//! * [`sim`] — a whole cluster simulated in one thread, from a seed

pub mod acl;
pub mod changelog;
pub mod client;
pub mod codec;
pub mod digest;
pub mod disk;
pub mod entry;
pub mod error;
pub mod events;
pub mod jute;
pub mod limit;
pub mod node;
pub mod path;
pub mod peer;
pub mod peer_check;
mod plan;
pub mod proto;
pub mod raftlog;
pub mod request;
pub mod server;
pub mod session;
pub mod sim;
pub mod snapshot;
pub mod state;
pub mod storage;
pub mod watch;

pub use codec::DecodeError;
pub use digest::Digest;
pub use entry::{DigestMismatch, Entry, Phase};
pub use error::ZkError;
pub use events::NodeEvent;
pub use request::{Create, CreateMode, Op, OpResult, Read, Response, Write};
pub use storage::{Committed, DigestMode, Storage};
