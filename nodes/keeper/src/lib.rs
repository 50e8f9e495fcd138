//! drift-keeper: the ZooKeeper-compatible coordination service under test.
//!
//! This crate will hold the sans-IO keeper core: the znode tree with its
//! replicated digest, the changelog, snapshots, the Raft glue and the
//! ZooKeeper wire codec (see DESIGN.md). It has no code yet; `drift node`
//! and `drift cluster` say "not implemented yet" and exit 3 until it does.
