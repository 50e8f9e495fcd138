//! drift-workloads: what a campaign asks of the system under test.
//!
//! # Layout
//! * [`rng`] — seeded randomness with named sub-seeds (replayable)
//! * [`workload`] — operation mixes and the checkers that judge them
//! * [`zkclient`] — the operations through a real ZooKeeper client
//! * [`table`] — the insert-retry workload over the table's HTTP interface
//! * [`kv`] — the delete workload over the kv service's HTTP interface

pub mod kv;
// the seeded randomness lives with the checkers (their history generator
// draws from it too)
pub use drift_checkers::rng;
pub mod table;
pub mod worker;
pub mod workload;
pub mod zkclient;
pub mod znode;

pub use rng::Rng;
pub use workload::{OpSpec, Outcome, Workload, WorkloadKind};
