//! drift-table: the ReplicatedMergeTree-style replicated table under test.
//!
//! This crate will hold the sans-IO table core: parts, the shared log, the
//! per-replica queue, inserts with block numbers and content-hash dedup,
//! fetches, merges and quorum inserts (docs/ARCHITECTURE.md, "Crates"). It has no code yet.
