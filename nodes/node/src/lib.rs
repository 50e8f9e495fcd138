//! drift-node: the runtime driver that turns sockets, timers and files into
//! inputs of the sans-IO node cores and executes their effects (`drift node`).
//!
//! # Layout
//! * [`config`] — the cluster file
//! * [`error`] — what stops a server, by kind
//! * [`fsdisk`] — the real [`drift_keeper::disk::Disk`]: a data directory
//!   with fsync of files and of the directory
//! * [`peer_auth`] — the peers' challenge–response handshake
//! * [`transport`] — framed peer messages over TCP, bound per node IP
//! * [`keeper_node`] — the keeper server's driver: sockets, ticks, snapshot
//!   writer, log lines around `drift_keeper::server::KeeperServer`
//! * [`kv`] — the kv service: LWW replicas on a ring, repair between servers
//! * [`table`] — the replicated table

pub mod body;
pub mod config;
pub mod error;
pub mod fsdisk;
pub mod http_auth;
pub mod keeper_node;
pub mod kv;
pub mod peer_auth;
pub mod table;
pub mod transport;
