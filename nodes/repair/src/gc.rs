//! Tombstone garbage collection.
//!
//! * `Time` purges tombstones older than `now − grace`. If a replica that
//!   missed the delete is not repaired within the grace period, the next
//!   repair streams its old value back: the key is resurrected. That is
//!   the documented failure mode (tests show it), as in Cassandra's
//!   `gc_grace_seconds`.
//! * `RepairGated` purges only tombstones older than the last completed
//!   repair with *every* peer (and older than the grace): every replica
//!   has seen them, so none can resurrect the key.
//!
//! Replicas purge at different times, so a session agrees on one
//! `gc_before` (the larger horizon of the two) and both sides drop
//! tombstones below it before comparing; otherwise one side's purged
//! tombstone would mismatch the other's forever.

use crate::replica::{PeerId, Replica};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcPolicy {
    Time { grace: u64 },
    RepairGated { grace: u64, peers: Vec<PeerId> },
}

/// The horizon below which `replica` may purge tombstones at `now`.
pub fn horizon(replica: &Replica, policy: &GcPolicy, now: u64) -> u64 {
    match policy {
        GcPolicy::Time { grace } => now.saturating_sub(*grace),
        GcPolicy::RepairGated { grace, peers } => {
            let repaired = peers.iter().map(|p| replica.repaired_with(*p)).min().unwrap_or(0);
            now.saturating_sub(*grace).min(repaired)
        }
    }
}

/// Purges what `policy` allows at `now`; returns how many tombstones went.
pub fn collect(replica: &mut Replica, policy: &GcPolicy, now: u64) -> usize {
    let h = horizon(replica, policy, now);
    replica.purge_tombstones_before(h)
}
