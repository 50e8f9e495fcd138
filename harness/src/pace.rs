//! How a workload's worker paces itself: its process ids, its seed, when
//! it stops and how often it acts — one definition for the znode, insert
//! and delete workers.

use std::time::{Duration, Instant};

/// How a worker paces itself.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Process ids of one worker are `w`, `w + stride`, ….
    pub stride: u64,
    pub seed: u64,
    pub until: Instant,
    /// Mean time between two of its operations (logical inserts).
    pub every: Duration,
}
