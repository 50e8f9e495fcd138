//! drift-repair: leaderless last-write-wins key/value replicas and Merkle
//! anti-entropy with row-level repair (Cassandra-style Merkle trees,
//! then past them: only the rows that differ are streamed, as in
//! ScyllaDB's row-level repair).
//!
//! Sans-IO and deterministic: sessions exchange bytes through the caller,
//! randomness (the session seed) and time come in as arguments.
//!
//! # Layout
//! * [`token`] — murmur3_x86_32 tokens
//! * [`entry`] — entries, canonical SHA-256 digests, the LWW order
//! * [`range`] — token ranges and their equal-width subdivision
//! * [`tree`] — the XOR Merkle tree with counts, O(depth) updates
//! * [`replica`] — a replica: entries by (token, key) plus its tree
//! * [`wire`] — session messages as bytes
//! * [`session`] — the diff and repair exchange, with its cost report
//! * [`gc`] — tombstone GC, by time or gated on repair
//! * [`iblt`] — invertible Bloom lookup tables, the set-reconciliation path
//! * [`ring`] — which servers hold which token ranges
//! * [`kv`] — one kv server's replicas, journaled and replayable
//! * [`coord`] — a server coordinating a write or a read: its decisions
//! * [`held`] — the repair sessions a server holds for its peers, bounded
//! * [`server`] — one kv server's decisions: requests, peers' versions,
//!   repair messages, GC, fault hooks
//! * [`wal`] — the kv server's log records as bytes

pub mod coord;
pub mod entry;
pub mod gc;
pub mod held;
pub mod iblt;
pub mod kv;
pub mod range;
pub mod replica;
pub mod ring;
pub mod server;
pub mod session;
pub mod token;
pub mod tree;
pub mod wal;
pub mod wire;

pub use entry::Entry;
pub use range::TokenRange;
pub use replica::Replica;
pub use session::{run, Report, SessionConfig};
