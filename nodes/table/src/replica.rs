//! A replica's coordinator decisions that do not belong to one insert,
//! sans-IO: what registering a replica creates, which log entries the log
//! puller copies and the multi that copies them with the pointer, what a
//! fetched part must be before it is installed, the multi that records a
//! part this replica now holds, when a failed commit shows the replica's
//! memory behind the coordinator, how a listed part missing from the disk
//! is queued for a fetch again, which part to fetch when the one wanted
//! was merged away everywhere, and how a new, wiped or lost replica
//! clones a healthy one.
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

/// Reloads of the queue one pull may go through before it fails: a pull
/// whose version-checked multi finds `log_pointer` moved (a pull of an
/// earlier life, or one whose answer was lost, committed meanwhile) reads
/// the queue again and then copies on from the reloaded pointer — it is
/// not done until the log as listed is copied, since a merge is chosen
/// from the queue right after a pull.
pub const PULL_RELOADS_MAX: usize = 3;

/// What one pass of a log puller did: entries copied, and whether the
/// pointer had moved under it (the queue read again, the entries past the
/// reloaded pointer still to copy: the driver pulls again, up to
/// [`PULL_RELOADS_MAX`] times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pulled {
    Done(usize),
    Reloaded(usize),
}

/// A pull's passes, as both drivers run them: a pass that read the
/// queue again is followed by another, up to [`PULL_RELOADS_MAX`].
#[derive(Debug, Default)]
pub struct Pulls {
    copied: usize,
    passes: usize,
    reloaded: bool,
}

/// What a driver does after a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullNext {
    /// Pull again (the queue was read again).
    Again,
    /// The log as listed is in the queue: `copied` entries in all, of
    /// which `past_reload` after a reload (to log as `pulled_past_reload`).
    Done { copied: usize, past_reload: Option<usize> },
    /// The pointer kept moving: the pull fails, and no merge is chosen
    /// after it.
    GaveUp(String),
}

impl Pulls {
    pub fn after(&mut self, pass: Pulled) -> PullNext {
        self.passes += 1;
        match pass {
            Pulled::Done(n) => PullNext::Done {
                copied: self.copied + n,
                past_reload: (self.reloaded && n > 0).then_some(n),
            },
            Pulled::Reloaded(n) => {
                self.copied += n;
                self.reloaded = true;
                if self.passes >= PULL_RELOADS_MAX {
                    PullNext::GaveUp(format!("the log pointer moved under {PULL_RELOADS_MAX} pulls in a row"))
                } else {
                    PullNext::Again
                }
            }
        }
    }
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

/// Whether an entry's commit (`ops`, as [`entry_done`] made them) that
/// failed with "no node" at op `index` shows this replica's memory behind
/// the coordinator: the op deletes one of its own listings, or the entry
/// itself, and they are gone. That happens when an earlier commit of
/// the replica did land but its answer was lost, and the retry commits
/// something else (a larger covering part after more merges) that
/// replaces the same parts. No retry from the same memory can succeed:
/// the driver reads the queue and its listing again.
pub fn commit_shows_stale_memory(paths: &Paths, ops: &[KeeperOp], index: usize, entry_path: &str) -> bool {
    let mine = format!("{}/", paths.parts_of(&paths.replica));
    match ops.get(index) {
        Some(KeeperOp::Delete { path, .. }) => path == entry_path || path.starts_with(&mine),
        _ => false,
    }
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

/// Cloning: how a replica that is new, wiped or marked lost takes a
/// healthy replica's state instead of replaying a log that may have been
/// cleaned. Its own queue and listing are cleared first
/// ([`clear_ops`]); the source is the first other replica that is active
/// and not lost ([`clone_source`]); a GET_PART per part the source lists
/// and a copy of each entry of the source's queue go into this replica's
/// queue ([`clone_queue_ops`]); then, in one multi checked against the
/// source's pointer as read, this replica's pointer takes the source's
/// and it is no longer lost ([`clone_done_ops`]). If the source's pointer
/// moved meanwhile, the queue is cleared and the clone starts again.
///
/// The driver reads the source's pointer, then its queue, then its parts,
/// in that order: an entry the source runs between the queue's read and
/// the parts' is copied twice (the entry, and a GET_PART of its part),
/// which the queue takes as one; read the other way round, it is missed,
/// and the clone lacks that part for good (the simulator found replicas
/// diverging so after wipes). Entries the source copies from the log
/// meanwhile move its pointer, which the last multi checks.
///
/// The multis that delete each of `children` (names under `dir`), a
/// multi's worth at a time.
pub fn clear_ops(dir: &str, children: &[String]) -> Vec<Vec<KeeperOp>> {
    children
        .chunks(MULTI_OPS_MAX)
        .map(|chunk| {
            chunk
                .iter()
                .map(|k| KeeperOp::Delete {
                    path: format!("{dir}/{k}"),
                    version: -1,
                })
                .collect()
        })
        .collect()
}

/// One replica a clone may copy from: its name, its `is_lost` data (none:
/// no such node) and whether it is active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneCandidate {
    pub name: String,
    pub is_lost: Option<Vec<u8>>,
    pub active: bool,
}

/// The replica to clone from: the first, other than `me`, that is active
/// and not lost. None: nobody to clone (a new table's first replica, or
/// every other replica down): start from the log's oldest entry.
pub fn clone_source(me: &str, candidates: &[CloneCandidate]) -> Option<String> {
    candidates
        .iter()
        .find(|c| c.name != me && c.active && c.is_lost.as_deref().is_some_and(|d| d != b"1"))
        .map(|c| c.name.clone())
}

/// The multis that fill this replica's queue from `source`: a GET_PART of
/// each part `source` lists (`parts`, names; one that does not parse is
/// left out), then each of its queue entries as read (`queue`), at
/// `now_s`; a multi's worth at a time.
pub fn clone_queue_ops(
    paths: &Paths,
    source: &str,
    parts: &[String],
    queue: &[Vec<u8>],
    now_s: i64,
) -> Vec<Vec<KeeperOp>> {
    let mut entries: Vec<Vec<u8>> = parts
        .iter()
        .filter_map(|p| PartInfo::parse(p).ok())
        .map(|part| {
            LogEntry {
                create_time_s: now_s,
                source_replica: source.to_string(),
                kind: EntryKind::GetPart {
                    part,
                    block_id: None,
                    quorum: 0,
                },
            }
            .encode()
            .into_bytes()
        })
        .collect();
    entries.extend(queue.iter().cloned());
    entries
        .chunks(MULTI_OPS_MAX)
        .map(|chunk| {
            chunk
                .iter()
                .map(|d| KeeperOp::Create {
                    path: paths.queue_prefix(),
                    data: d.clone(),
                    mode: CreateMode::PersistentSequential,
                })
                .collect()
        })
        .collect()
}

/// The clone's last multi: `source`'s pointer still at `version` (as read
/// with `pointer`, its data), this replica's pointer set to it and its
/// `is_lost` to 0.
pub fn clone_done_ops(paths: &Paths, me: &str, source: &str, pointer: &[u8], version: i32) -> Vec<KeeperOp> {
    vec![
        KeeperOp::Check {
            path: paths.log_pointer_of(source),
            version,
        },
        KeeperOp::SetData {
            path: paths.log_pointer_of(me),
            data: pointer.to_vec(),
            version: -1,
        },
        KeeperOp::SetData {
            path: paths.is_lost_of(me),
            data: b"0".to_vec(),
            version: -1,
        },
    ]
}

/// The clone's multi when there is no replica to copy (a new table's
/// first replica, or every other one down): this replica's pointer set to
/// the log's oldest entry still held (`log`, the names under the log; 0
/// for an empty log) and its `is_lost` to 0. Returns the pointer too.
pub fn start_from_log_ops(paths: &Paths, me: &str, log: &[String]) -> (u64, Vec<KeeperOp>) {
    let pointer = log.iter().filter_map(|n| sequence_of(n, "log-")).min().unwrap_or(0);
    let ops = vec![
        KeeperOp::SetData {
            path: paths.log_pointer_of(me),
            data: pointer.to_string().into_bytes(),
            version: -1,
        },
        KeeperOp::SetData {
            path: paths.is_lost_of(me),
            data: b"0".to_vec(),
            version: -1,
        },
    ];
    (pointer, ops)
}

/// The search, over every replica's listing, for a part to fetch in
/// place of `part` when no active replica lists `part` itself (merged
/// away everywhere, as ClickHouse fetches a covering part): the widest
/// part an active replica other than this one lists that strictly
/// contains it. It also answers whether any replica at all, active or
/// not, lists `part` or a part containing it: if none does, the part is
/// lost forever.
///
/// The driver hands it each replica's listing ([`listed`](Self::listed));
/// only when that returns true does it ask whether the replica is active,
/// and tell [`active`](Self::active) if so.
#[derive(Debug, Clone)]
pub struct CoveringSearch {
    part: PartInfo,
    me: String,
    best: Option<(String, PartInfo)>,
    anywhere: bool,
    candidates: Vec<PartInfo>,
}

impl CoveringSearch {
    pub fn new(part: &PartInfo, me: &str) -> CoveringSearch {
        CoveringSearch {
            part: part.clone(),
            me: me.to_string(),
            best: None,
            anywhere: false,
            candidates: Vec::new(),
        }
    }

    /// Replica `r`'s listing (`names`: the children of its `parts`).
    /// True when `r` lists a part that would do, and the driver must ask
    /// whether `r` is active.
    pub fn listed(&mut self, r: &str, names: &[String]) -> bool {
        let holding: Vec<PartInfo> = names
            .iter()
            .filter_map(|n| PartInfo::parse(n).ok())
            .filter(|p| p.contains(&self.part))
            .collect();
        self.anywhere |= !holding.is_empty();
        self.candidates = if r == self.me {
            Vec::new()
        } else {
            holding.into_iter().filter(|p| *p != self.part).collect()
        };
        !self.candidates.is_empty()
    }

    /// The replica last [`listed`](Self::listed) is active: its parts
    /// are candidates.
    pub fn active(&mut self, r: &str) {
        let span = |p: &PartInfo| (p.max_block - p.min_block, p.level);
        for p in std::mem::take(&mut self.candidates) {
            if self.best.as_ref().is_none_or(|(_, b)| span(&p) > span(b)) {
                self.best = Some((r.to_string(), p));
            }
        }
    }

    /// The widest candidate with its replica, and whether any replica
    /// lists the part or one containing it.
    pub fn found(self) -> (Option<(String, PartInfo)>, bool) {
        (self.best, self.anywhere)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::Block;
    use crate::schema::{ColumnType, Value};

    fn paths() -> Paths {
        Paths::new("/t", "r1")
    }

    /// A pass that read the queue again is followed by another; the pull
    /// is done when a pass copies the log as listed, and gives up after
    /// `PULL_RELOADS_MAX` reloads in a row.
    #[test]
    fn a_pull_goes_on_past_a_reload_and_gives_up_at_the_limit() {
        let done = |copied, past_reload| PullNext::Done { copied, past_reload };
        let mut p = Pulls::default();
        assert_eq!(p.after(Pulled::Reloaded(2)), PullNext::Again);
        assert_eq!(p.after(Pulled::Done(3)), done(5, Some(3)));
        let mut p = Pulls::default();
        assert_eq!(p.after(Pulled::Done(4)), done(4, None));
        let mut p = Pulls::default();
        assert_eq!(p.after(Pulled::Reloaded(0)), PullNext::Again);
        assert_eq!(p.after(Pulled::Done(0)), done(0, None));
        let mut p = Pulls::default();
        for _ in 1..PULL_RELOADS_MAX {
            assert_eq!(p.after(Pulled::Reloaded(1)), PullNext::Again);
        }
        assert!(matches!(p.after(Pulled::Reloaded(1)), PullNext::GaveUp(why) if why.contains("pulls in a row")));
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

    #[test]
    fn a_covering_search_takes_the_widest_part_an_active_other_replica_lists() {
        let part = PartInfo::parse("1_3_3_0").unwrap();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut s = CoveringSearch::new(&part, "r1");
        // this replica's own listing counts as "somewhere", never as a source
        assert!(!s.listed("r1", &names(&["1_0_9_2"])));
        // the exact part is no candidate (the driver looked for it first)
        assert!(!s.listed("r2", &names(&["1_3_3_0", "1_4_4_0"])));
        assert!(s.listed("r3", &names(&["1_2_4_1", "1_5_6_1"])));
        s.active("r3");
        // an inactive replica's wider part: the driver does not call active
        assert!(s.listed("r4", &names(&["1_0_8_3"])));
        assert!(s.listed("r5", &names(&["1_0_5_2", "2_0_9_1"])));
        s.active("r5");
        let (best, anywhere) = s.found();
        assert_eq!(best, Some(("r5".to_string(), PartInfo::parse("1_0_5_2").unwrap())));
        assert!(anywhere);

        let mut s = CoveringSearch::new(&part, "r1");
        assert!(!s.listed("r2", &names(&["1_4_4_0", "2_3_3_0"])));
        assert_eq!(s.found(), (None, false));
    }

    #[test]
    fn a_clone_copies_an_active_replica_that_is_not_lost() {
        let c = |name: &str, lost: Option<&[u8]>, active: bool| CloneCandidate {
            name: name.into(),
            is_lost: lost.map(<[u8]>::to_vec),
            active,
        };
        let all = [
            c("r1", Some(b"0"), true),
            c("r2", Some(b"1"), true),
            c("r3", Some(b"0"), false),
            c("r4", None, true),
            c("r5", Some(b"0"), true),
        ];
        // not itself, not lost, active, and its is_lost node exists
        assert_eq!(clone_source("r1", &all), Some("r5".to_string()));
        assert_eq!(clone_source("r5", &all[..4]), Some("r1".to_string()));
        assert_eq!(clone_source("r1", &all[..4]), None);

        let paths = Paths::new("/t", "r1");
        let queue = vec![b"queued entry".to_vec()];
        let parts: Vec<String> = (0..150)
            .map(|i| format!("1_{i}_{i}_0"))
            .chain(["junk".to_string()])
            .collect();
        let multis = clone_queue_ops(&paths, "r5", &parts, &queue, 7);
        assert_eq!(multis.iter().map(Vec::len).collect::<Vec<_>>(), vec![MULTI_OPS_MAX, 51]);
        let KeeperOp::Create { data, .. } = &multis[0][0] else {
            panic!()
        };
        let e = LogEntry::decode(std::str::from_utf8(data).unwrap()).unwrap();
        assert_eq!(e.source_replica, "r5");
        assert_eq!(e.new_part(), &PartInfo::parse("1_0_0_0").unwrap());
        assert!(matches!(multis[1].last(), Some(KeeperOp::Create { data, .. }) if data == b"queued entry"));

        let done = clone_done_ops(&paths, "r1", "r5", b"42", 3);
        assert_eq!(
            done[0],
            KeeperOp::Check {
                path: paths.log_pointer_of("r5"),
                version: 3
            }
        );
        assert!(
            matches!(&done[1], KeeperOp::SetData { path, data, .. } if *path == paths.log_pointer_of("r1") && data == b"42")
        );
        assert_eq!(clear_ops("/d", &["a".to_string(), "b".to_string()])[0].len(), 2);

        // nobody to copy: the oldest log entry still held, whatever else
        // the log directory holds; an empty log starts at 0
        let log: Vec<String> = ["log-0000000012", "log-0000000009", "junk", "log-0000000030"]
            .map(String::from)
            .to_vec();
        let (pointer, ops) = start_from_log_ops(&paths, "r1", &log);
        assert_eq!(pointer, 9);
        assert!(
            matches!(&ops[0], KeeperOp::SetData { path, data, .. } if *path == paths.log_pointer_of("r1") && data == b"9")
        );
        assert!(
            matches!(&ops[1], KeeperOp::SetData { path, data, .. } if *path == paths.is_lost_of("r1") && data == b"0")
        );
        assert_eq!(start_from_log_ops(&paths, "r1", &[]).0, 0);
    }

    #[test]
    fn a_commit_that_finds_its_own_listing_gone_shows_stale_memory() {
        let paths = Paths::new("/t", "r1");
        let part = PartInfo::parse("1_0_9_2").unwrap();
        let old = PartInfo::parse("1_0_5_1").unwrap();
        let sums = Checksums::of(&BTreeMap::new());
        let (ops, last) = entry_done(
            held_ops(&paths, &part, &sums, std::slice::from_ref(&old), Vec::new()),
            "/t/replicas/r1/queue/queue-1",
        );
        assert!(commit_shows_stale_memory(
            &paths,
            &ops,
            1,
            "/t/replicas/r1/queue/queue-1"
        ));
        assert!(commit_shows_stale_memory(
            &paths,
            &ops,
            last,
            "/t/replicas/r1/queue/queue-1"
        ));
        // the part's create, or another replica's node (a quorum's), is not
        assert!(!commit_shows_stale_memory(
            &paths,
            &ops,
            0,
            "/t/replicas/r1/queue/queue-1"
        ));
        let other = [KeeperOp::Delete {
            path: "/t/quorum/status".into(),
            version: 1,
        }];
        assert!(!commit_shows_stale_memory(
            &paths,
            &other,
            0,
            "/t/replicas/r1/queue/queue-1"
        ));
    }
}
