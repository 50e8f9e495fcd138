//! The events a node writes to its log that a test harness reads back:
//! drift's campaigns, on processes and in the simulator alike, turn them
//! into events on the history's timeline (a digest abort, a leader, a
//! dedup witness line …). The names are written here once, for the code
//! that logs them (the keeper, the table, the kv service, the panic hook)
//! and the one map that reads them (`harness/src/events.rs`), which
//! matches on [`NodeEvent`] exhaustively: an event added here must be
//! given a meaning there.

/// A log event a harness reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEvent {
    /// A replica's digest disagreed with the one a log entry carries: the
    /// replica stops (`log_index`, `phase`, `request`).
    DigestMismatch,
    /// A planted divergence took effect (`log_index`).
    DivergeApplied,
    /// The replica's Raft role changed (`role`, `leader`, `term`).
    Role,
    /// The replica installed a snapshot from its leader (`index`, `zxid`).
    SnapshotInstalled,
    /// A changelog's torn tail was cut off at start (`file`, `offset`,
    /// `reason`).
    ChangelogTornTail,
    /// A block-id znode was created or removed (`op`, `path`, `zxid`,
    /// `session`, `ctime_ms`, `data`): the dedup witness.
    BlockId,
    /// The table wrote a block under a block id (`query_id`, `block_id`).
    InsertBlock,
    /// A kv repair session ran (its report, and `trigger`).
    KvRepair,
    /// The kv service collected tombstones (`grace_ms`, `horizon_ts`,
    /// `purged`, `mode`, `forced`).
    KvGc,
    /// The node panicked (`what`).
    Panic,
}

impl NodeEvent {
    pub const ALL: [NodeEvent; 10] = [
        NodeEvent::DigestMismatch,
        NodeEvent::DivergeApplied,
        NodeEvent::Role,
        NodeEvent::SnapshotInstalled,
        NodeEvent::ChangelogTornTail,
        NodeEvent::BlockId,
        NodeEvent::InsertBlock,
        NodeEvent::KvRepair,
        NodeEvent::KvGc,
        NodeEvent::Panic,
    ];

    /// The `event` field of its log line.
    pub fn name(self) -> &'static str {
        match self {
            NodeEvent::DigestMismatch => "digest_mismatch",
            NodeEvent::DivergeApplied => "diverge_applied",
            NodeEvent::Role => "role",
            NodeEvent::SnapshotInstalled => "snapshot_installed",
            NodeEvent::ChangelogTornTail => "changelog_torn_tail",
            NodeEvent::BlockId => "block_id",
            NodeEvent::InsertBlock => "insert_block",
            NodeEvent::KvRepair => "kv_repair",
            NodeEvent::KvGc => "kv_gc",
            NodeEvent::Panic => "panic",
        }
    }

    /// The event a log line's `event` field names, if a harness reads it.
    pub fn parse(name: &str) -> Option<NodeEvent> {
        NodeEvent::ALL.into_iter().find(|e| e.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back_from_its_name_and_no_two_share_one() {
        for e in NodeEvent::ALL {
            assert_eq!(NodeEvent::parse(e.name()), Some(e));
        }
        let mut names: Vec<&str> = NodeEvent::ALL.iter().map(|e| e.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), NodeEvent::ALL.len());
        assert_eq!(NodeEvent::parse("started"), None);
    }
}
