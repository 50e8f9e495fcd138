//! drift-node: the runtime driver that turns sockets, timers and files into
//! inputs of the sans-IO node cores and executes their effects (`drift node`).
//!
//! # Layout
//! * [`fsdisk`] — the real [`drift_keeper::disk::Disk`]: a data directory
//!   with fsync of files and of the directory
//!
//! The network driver and `drift node` land with the keeper cluster.

pub mod fsdisk;
