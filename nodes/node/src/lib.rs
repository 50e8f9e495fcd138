//! drift-node: the runtime driver that turns sockets, timers and files into
//! inputs of the sans-IO node cores and executes their effects (`drift node`).
//!
//! # Layout
//! * [`config`] — the cluster file
//! * [`error`] — what stops a server, by kind
//! * [`fsdisk`] — the real [`drift_keeper::disk::Disk`]: a data directory
//!   with fsync of files and of the directory
//! * [`raftlog`] — raft-rs `Storage` on the keeper changelog and snapshots
//! * [`peer_auth`] — the peers' challenge–response handshake
//! * [`transport`] — framed peer messages over TCP, bound per node IP
//! * [`peer_check`] — what a Raft message from a peer must satisfy before it is stepped
//! * [`keeper_node`] — the node loop: Raft, the keeper core, clients
//! * [`kv`] — the kv service: LWW replicas on a ring, repair between servers
//! * [`table`] — the replicated table

pub mod config;
pub mod error;
pub mod fsdisk;
pub mod keeper_node;
pub mod kv;
pub mod peer_auth;
pub mod peer_check;
pub mod raftlog;
pub mod table;
pub mod transport;
