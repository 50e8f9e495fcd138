//! Counters of what a replica did, shown as `system.events` rows with
//! ClickHouse's event names where ClickHouse has one.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ev {
    InsertQuery,
    InsertedRows,
    InsertedBlocks,
    DuplicatedInsertedBlocks,
    InsertKeeperRoundTrips,
    InsertKeeperMicros,
    ReplicatedPartFetches,
    ReplicatedPartFailedFetches,
    ReplicatedPartMerges,
    ReplicatedPartChecksFailed,
    ReplicatedDataLoss,
    UnknownStatusInserts,
    LogEntriesPulled,
    CleanedBlockIds,
    CleanedLogEntries,
    ReplicaClones,
    CleanupRuns,
}

const EVENTS: [(Ev, &str, &str); 17] = [
    (Ev::InsertQuery, "InsertQuery", "INSERT queries"),
    (
        Ev::InsertedRows,
        "InsertedRows",
        "rows committed by inserts on this replica",
    ),
    (
        Ev::InsertedBlocks,
        "InsertedBlocks",
        "blocks committed by inserts on this replica",
    ),
    (
        Ev::DuplicatedInsertedBlocks,
        "DuplicatedInsertedBlocks",
        "blocks dropped because their id was already in the coordinator",
    ),
    (
        Ev::InsertKeeperRoundTrips,
        "InsertKeeperRoundTrips",
        "coordinator round trips spent committing or deduplicating inserted blocks",
    ),
    (
        Ev::InsertKeeperMicros,
        "InsertKeeperMicros",
        "microseconds inserts spent waiting on those round trips",
    ),
    (
        Ev::ReplicatedPartFetches,
        "ReplicatedPartFetches",
        "parts fetched from other replicas",
    ),
    (
        Ev::ReplicatedPartFailedFetches,
        "ReplicatedPartFailedFetches",
        "fetches that failed (no source, refused transfer, checksum mismatch)",
    ),
    (
        Ev::ReplicatedPartMerges,
        "ReplicatedPartMerges",
        "merges done on this replica",
    ),
    (
        Ev::ReplicatedPartChecksFailed,
        "ReplicatedPartChecksFailed",
        "parts that failed their checksums (fetched or on disk)",
    ),
    (
        Ev::ReplicatedDataLoss,
        "ReplicatedDataLoss",
        "parts no replica had, given up (quorum failed)",
    ),
    (
        Ev::UnknownStatusInserts,
        "UnknownStatusInserts",
        "inserts answered 319 (commit or quorum unknown)",
    ),
    (
        Ev::LogEntriesPulled,
        "LogEntriesPulled",
        "shared log entries copied into the queue",
    ),
    (
        Ev::CleanedBlockIds,
        "CleanedBlockIds",
        "block ids removed by the dedup window (as leader)",
    ),
    (
        Ev::CleanedLogEntries,
        "CleanedLogEntries",
        "shared log entries removed (as leader)",
    ),
    (
        Ev::ReplicaClones,
        "ReplicaClones",
        "times this replica cloned another (new, wiped or lost)",
    ),
    (
        Ev::CleanupRuns,
        "CleanupRuns",
        "cleanup passes done as leader (block ids and log)",
    ),
];

#[derive(Default)]
pub struct Events {
    counts: [AtomicU64; EVENTS.len()],
}

impl Events {
    pub fn add(&self, e: Ev, n: u64) {
        self.counts[e as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, e: Ev) -> u64 {
        self.counts[e as usize].load(Ordering::Relaxed)
    }

    /// (name, value, description) of every counter.
    pub fn rows(&self) -> Vec<(&'static str, u64, &'static str)> {
        EVENTS
            .iter()
            .map(|(e, name, desc)| (*name, self.get(*e), *desc))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_event_has_its_row() {
        for (i, (e, _, _)) in super::EVENTS.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
    }
}
