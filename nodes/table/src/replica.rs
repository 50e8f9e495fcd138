//! A replica's coordinator decisions that do not belong to one insert,
//! sans-IO: what registering a replica creates, which log entries the log
//! puller copies and the multi that copies them with the pointer, what a
//! fetched part must be before it is installed, the multi that records a
//! part this replica now holds, and how a listed part missing from the
//! disk is queued for a fetch again.
//!
//! Two drivers make these decisions' calls: the node's table module (the
//! coordinator through the ZooKeeper client, parts in files) and the
//! simulator's table (`harness/src/sim/table.rs`: the simulated keeper
//! cluster, parts on the simulated disk). Neither decides them itself.

use crate::entry::{EntryKind, LogEntry};
use crate::format::{self, Checksums};
use crate::part::PartInfo;
use crate::schema::Schema;
use crate::zk::{sequence_of, CreateMode, KeeperOp, Paths, MULTI_OPS_MAX};
use std::collections::BTreeMap;

/// The multi that creates replica `name` (its host `host`): the replica's
/// node and its children, all or nothing.
pub fn register_ops(paths: &Paths, name: &str, host: &str) -> Vec<KeeperOp> {
    let mut ops = vec![KeeperOp::Create {
        path: paths.replica_of(name),
        data: Vec::new(),
        mode: CreateMode::Persistent,
    }];
    for (p, d) in [
        (paths.host_of(name), host),
        (paths.log_pointer_of(name), ""),
        (paths.queue_of(name), ""),
        (paths.parts_of(name), ""),
        (paths.is_lost_of(name), "0"),
    ] {
        ops.push(KeeperOp::Create {
            path: p,
            data: d.as_bytes().to_vec(),
            mode: CreateMode::Persistent,
        });
    }
    ops
}

/// A `log_pointer` znode's value (empty, for a replica that copied
/// nothing yet: 0).
pub fn parse_pointer(data: &[u8]) -> u64 {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The log entries a replica at `pointer` has to copy, from the log's
/// children `names`: (index, name), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToCopy {
    pub entries: Vec<(u64, String)>,
    /// The oldest entry kept, when entries between the pointer and it were
    /// cleaned before this replica copied them (or no entry took those
    /// numbers).
    pub gap: Option<u64>,
}

pub fn to_copy(names: &[String], pointer: u64) -> ToCopy {
    let mut entries: Vec<(u64, String)> = names
        .iter()
        .filter_map(|n| sequence_of(n, "log-").map(|i| (i, n.clone())))
        .filter(|(i, _)| *i >= pointer)
        .collect();
    entries.sort();
    let gap = entries
        .first()
        .map(|(i, _)| *i)
        .filter(|first| *first > pointer && pointer > 0);
    ToCopy { entries, gap }
}

/// The next batch's size after one of `batch`: batches double up to a
/// multi's limit, so that a replica far behind catches up in few round
/// trips.
pub fn next_batch(batch: usize) -> usize {
    (batch * 2).clamp(1, MULTI_OPS_MAX - 1)
}

/// One batch of the log puller: the multi that creates a queue entry per
/// readable log entry and moves `log_pointer` to `next` (checked against
/// `version`, so two pullers never copy the same entries), the decoded
/// entries in the multi's order, and the log entries that do not decode
/// (index, why): skipped.
#[derive(Debug, Clone)]
pub struct CopyBatch {
    pub ops: Vec<KeeperOp>,
    pub entries: Vec<LogEntry>,
    pub unreadable: Vec<(u64, String)>,
}

/// `datas`: each log entry of the batch as read (index, data; `None`: gone).
pub fn copy_batch(
    paths: &Paths,
    replica: &str,
    datas: &[(u64, Option<Vec<u8>>)],
    next: u64,
    version: i32,
) -> CopyBatch {
    let mut b = CopyBatch {
        ops: Vec::new(),
        entries: Vec::new(),
        unreadable: Vec::new(),
    };
    for (i, d) in datas {
        let Some(d) = d else { continue };
        match std::str::from_utf8(d)
            .map_err(|e| e.to_string())
            .and_then(|t| LogEntry::decode(t).map_err(|e| e.to_string()))
        {
            Ok(e) => {
                b.ops.push(KeeperOp::Create {
                    path: paths.queue_prefix(),
                    data: d.clone(),
                    mode: CreateMode::PersistentSequential,
                });
                b.entries.push(e);
            }
            Err(why) => b.unreadable.push((*i, why)),
        }
    }
    b.ops.push(KeeperOp::SetData {
        path: paths.log_pointer_of(replica),
        data: next.to_string().into_bytes(),
        version,
    });
    b
}

/// Why a fetched part is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its files do not match their own `checksums.txt`.
    Broken(String),
    /// They do, but not the checksums the coordinator lists for it.
    NotListed,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Broken(why) => write!(f, "{why}"),
            Refusal::NotListed => write!(
                f,
                "its files match their own checksums.txt, not the checksums the coordinator lists for it"
            ),
        }
    }
}

/// A fetched part's files, checked before they are installed: they must
/// match their checksums, and those must be the ones `listed` in the
/// coordinator for the part (as its writer committed them), not merely
/// the ones the transfer itself carried.
pub fn check_fetched(
    schema: &Schema,
    files: &BTreeMap<String, Vec<u8>>,
    listed: &Checksums,
) -> Result<Checksums, Refusal> {
    match format::verify(schema, files) {
        Ok(s) if s == *listed => Ok(s),
        Ok(_) => Err(Refusal::NotListed),
        Err(e) => Err(Refusal::Broken(e.to_string())),
    }
}

/// The ops that record `part` (checksums `sums`) as held by this replica
/// and remove its listing of the parts it replaces; `extra` (a quorum's
/// update) follows. They commit with the queue entry's removal
/// ([`entry_done`]).
pub fn held_ops(
    paths: &Paths,
    part: &PartInfo,
    sums: &Checksums,
    replaced: &[PartInfo],
    extra: Vec<KeeperOp>,
) -> Vec<KeeperOp> {
    let mut ops = vec![KeeperOp::Create {
        path: paths.my_part(&part.name()),
        data: sums.encode(),
        mode: CreateMode::Persistent,
    }];
    ops.extend(replaced.iter().map(|p| KeeperOp::Delete {
        path: paths.my_part(&p.name()),
        version: -1,
    }));
    ops.extend(extra);
    ops
}

/// An entry's result `ops` with the removal of the queue entry at
/// `entry_path` last — one multi, all or nothing — and the index of that
/// removal: when it alone fails with "no node" and it is the only op, an
/// earlier run of the entry committed and lost its answer.
pub fn entry_done(mut ops: Vec<KeeperOp>, entry_path: &str) -> (Vec<KeeperOp>, usize) {
    ops.push(KeeperOp::Delete {
        path: entry_path.to_string(),
        version: -1,
    });
    let last = ops.len() - 1;
    (ops, last)
}

/// The multi that forgets a listed part this replica does not hold (gone
/// from its disk, or broken) and queues its fetch, at `now_s`.
pub fn refetch_ops(paths: &Paths, replica: &str, part: &PartInfo, now_s: i64) -> Vec<KeeperOp> {
    let entry = LogEntry {
        create_time_s: now_s,
        source_replica: replica.to_string(),
        kind: EntryKind::GetPart {
            part: part.clone(),
            block_id: None,
            quorum: 0,
        },
    };
    vec![
        KeeperOp::Delete {
            path: paths.my_part(&part.name()),
            version: -1,
        },
        KeeperOp::Create {
            path: paths.queue_prefix(),
            data: entry.encode().into_bytes(),
            mode: CreateMode::PersistentSequential,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::Block;
    use crate::schema::{ColumnType, Value};

    fn paths() -> Paths {
        Paths::new("/t", "r1")
    }

    proptest::proptest! {
        /// Against a reference: the puller copies every entry at or past
        /// its pointer, each once, in index order, and names a gap exactly
        /// when the oldest left is past a pointer that moved.
        #[test]
        fn the_puller_copies_what_a_reference_says(
            indexes in proptest::collection::btree_set(0u64..200, 0..40),
            junk in proptest::collection::vec("[a-z]{1,8}", 0..4),
            pointer in 0u64..220,
        ) {
            let mut names: Vec<String> = indexes.iter().map(|i| crate::zk::sequence_name("log-", *i)).collect();
            names.extend(junk);
            names.reverse();
            let c = to_copy(&names, pointer);
            let want: Vec<u64> = indexes.iter().copied().filter(|i| *i >= pointer).collect();
            proptest::prop_assert_eq!(c.entries.iter().map(|(i, _)| *i).collect::<Vec<_>>(), want.clone());
            for (i, n) in &c.entries {
                proptest::prop_assert_eq!(sequence_of(n, "log-"), Some(*i));
            }
            let gap = want.first().copied().filter(|f| *f > pointer && pointer > 0);
            proptest::prop_assert_eq!(c.gap, gap);
        }
    }

    #[test]
    fn the_puller_copies_from_its_pointer_in_order_and_names_a_gap() {
        let names: Vec<String> = ["log-0000000004", "log-0000000002", "log-0000000003", "junk"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let c = to_copy(&names, 3);
        assert_eq!(
            c.entries,
            vec![(3, "log-0000000003".to_string()), (4, "log-0000000004".to_string())]
        );
        assert_eq!(c.gap, None);
        // entries 1 and 2 were cleaned before a replica at 1 copied them
        let c = to_copy(&names[..1], 1);
        assert_eq!(c.gap, Some(4));
        // a replica that never copied anything has no gap to speak of
        assert_eq!(to_copy(&names[..1], 0).gap, None);
        assert_eq!(next_batch(1), 2);
        assert_eq!(next_batch(80), MULTI_OPS_MAX - 1);
    }

    #[test]
    fn a_batch_skips_what_does_not_decode_and_always_moves_the_pointer() {
        let p = paths();
        let good = LogEntry {
            create_time_s: 1,
            source_replica: "r2".into(),
            kind: EntryKind::GetPart {
                part: PartInfo::parse("all_1_1_0").unwrap(),
                block_id: None,
                quorum: 0,
            },
        }
        .encode()
        .into_bytes();
        let b = copy_batch(
            &p,
            "r1",
            &[(5, Some(good)), (6, Some(b"nonsense".to_vec())), (7, None)],
            8,
            3,
        );
        assert_eq!(b.entries.len(), 1);
        assert_eq!(b.unreadable.len(), 1);
        assert_eq!(b.unreadable[0].0, 6);
        assert_eq!(b.ops.len(), 2, "one queue entry and the pointer");
        assert_eq!(
            b.ops[1],
            KeeperOp::SetData {
                path: p.log_pointer_of("r1"),
                data: b"8".to_vec(),
                version: 3
            }
        );
    }

    #[test]
    fn a_fetched_part_must_match_the_checksums_its_writer_listed() {
        let schema = Schema::new(
            "t",
            &[("id", ColumnType::UInt64)],
            crate::schema::PartitionKey::None,
            vec![0],
        );
        let block = |v: u64| Block::from_rows(&schema, vec![vec![Value::UInt64(v)]]).unwrap();
        let files = format::encode_part(&schema, &block(1));
        let listed = Checksums::of(&files);
        assert_eq!(check_fetched(&schema, &files, &listed), Ok(listed.clone()));
        // a whole other part, consistent in itself
        let other = format::encode_part(&schema, &block(2));
        assert_eq!(check_fetched(&schema, &other, &listed), Err(Refusal::NotListed));
        // a file changed in flight
        let mut bad = files.clone();
        let name = bad.keys().find(|k| k.ends_with(".bin")).cloned().unwrap();
        bad.get_mut(&name).unwrap()[0] ^= 1;
        assert!(matches!(check_fetched(&schema, &bad, &listed), Err(Refusal::Broken(_))));
    }

    #[test]
    fn a_held_part_replaces_what_it_covers_and_the_entry_goes_last() {
        let p = paths();
        let part = PartInfo::parse("all_1_2_1").unwrap();
        let old = [
            PartInfo::parse("all_1_1_0").unwrap(),
            PartInfo::parse("all_2_2_0").unwrap(),
        ];
        let held = held_ops(&p, &part, &Checksums::default(), &old, Vec::new());
        let (ops, last) = entry_done(held, "/t/replicas/r1/queue/queue-1");
        assert_eq!((ops.len(), last), (4, 3));
        assert_eq!(ops[0].path(), p.my_part("all_1_2_1"));
        assert_eq!(ops[1].path(), p.my_part("all_1_1_0"));
        assert_eq!(ops[3].path(), "/t/replicas/r1/queue/queue-1");
        let again = refetch_ops(&p, "r1", &old[0], 7);
        assert!(matches!(&again[0], KeeperOp::Delete { path, .. } if *path == p.my_part("all_1_1_0")));
        assert!(matches!(
            &again[1],
            KeeperOp::Create {
                mode: CreateMode::PersistentSequential,
                ..
            }
        ));
        assert_eq!(register_ops(&p, "r1", "h:1").len(), 6);
        assert_eq!(parse_pointer(b""), 0);
        assert_eq!(parse_pointer(b"12"), 12);
    }
}
