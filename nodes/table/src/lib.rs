//! drift-table: the core of a ReplicatedMergeTree-style replicated table.
//!
//! Replicas of a table share a log of text entries kept in the coordinator
//! (the keeper, or Apache ZooKeeper). An insert cuts its rows into blocks,
//! takes a block number and checks the block's id for duplicates in one
//! multi, writes the part, and commits the log entry, the part, the id and
//! the lock's release in a second multi. Every replica copies the log into
//! its own queue and runs the queue out of order: fetching parts from the
//! replicas that have them, merging, dropping ranges.
//!
//! This crate is sans-IO and deterministic (docs/ARCHITECTURE.md, "The
//! sans-IO boundary"): names, codecs, the queue, merge and cleanup choices
//! are pure functions and state machines; the driver in `nodes/node` talks
//! to the coordinator, the disk and the network.
//!
//! # Layout
//!
//! * [`schema`] — columns, types, partition and order keys, settings.
//! * [`block`] — rows in columns; an insert's split into blocks.
//! * [`format`] — a part's files and their checksums.
//! * [`part`] — part names, containment, the set of active parts.
//! * [`dedup`] — block ids and the deduplication window.
//! * [`entry`] — the log entry text codec.
//! * [`error`] — why a record of the coordinator does not parse.
//! * [`quorum`] — the quorum znode's text codec.
//! * [`queue`] — a replica's queue: selection, postponement, virtual parts.
//! * [`merge`] — the leader's merge selection.
//! * [`cleanup`] — which log entries go, which replicas are lost.
//! * [`replica`] — registration, the log puller's copies, a fetched
//!   part's checks and the multi that records a held part.
//! * [`reconcile`] — a restarted replica's disk against the coordinator:
//!   what stays current, what goes, what is fetched again.
//! * [`zk`] — the table's znodes and the insert's two multis.
//! * [`insert`] — one block's insert as a state machine: the two round
//!   trips, what each answer means, a lost commit settled through its lock.

pub mod block;
pub mod cleanup;
pub mod dedup;
pub mod entry;
pub mod error;
pub mod format;
pub mod hash;
pub mod insert;
pub mod merge;
pub mod part;
pub mod queue;
pub mod quorum;
pub mod reconcile;
pub mod replica;
pub mod schema;
pub mod zk;

pub use block::{Block, ColumnData};
pub use entry::{EntryKind, LogEntry};
pub use error::ParseError;
pub use part::{ActivePartSet, PartInfo};
pub use schema::{Column, ColumnType, PartitionKey, Schema, TableSettings, Value};
