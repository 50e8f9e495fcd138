//! drift-repair: leaderless LWW key/value replicas and Merkle anti-entropy.
//!
//! This crate will hold the sans-IO repair core: the Merkle tree, the diff
//! exchange, LWW resolution and repair sessions (see DESIGN.md). It has no
//! code yet.
