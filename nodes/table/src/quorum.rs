//! The quorum znode's content: which part waits for how many replicas, and
//! which replicas hold it so far. The writer creates it in its commit
//! multi naming itself; each replica that fetches the part adds itself in
//! the same multi that records the part; the one that completes the count
//! deletes the znode, which is what the writer waits for.
//!
//! ```text
//! version: 1
//! part_name: 1_7_7_0
//! required_number_of_replicas: 2
//! actual_number_of_replicas: 1
//! replicas:
//! r1
//! ```
//!
//! Beside the format, the decisions every driver of a replica makes about
//! quorums, sans-IO: whether a quorum insert may start, what a replica
//! that now holds a part adds to the part's quorum node, when a writer's
//! wait is over, and the multi that marks a lost part's quorum failed.
//! The drivers (the node's table module, the simulator's table) read the
//! nodes and make the calls.

use crate::error::ParseError;
use crate::part::PartInfo;
use crate::schema::valid_name;
use crate::zk::{CreateMode, KeeperOp, Paths};
use std::collections::BTreeSet;

/// Most replicas a quorum entry may list.
pub const QUORUM_REPLICAS_MAX: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumEntry {
    pub part: PartInfo,
    pub required: u32,
    pub replicas: BTreeSet<String>,
}

impl QuorumEntry {
    pub fn new(part: PartInfo, required: u32, writer: &str) -> QuorumEntry {
        QuorumEntry {
            part,
            required,
            replicas: BTreeSet::from([writer.to_string()]),
        }
    }

    pub fn is_reached(&self) -> bool {
        self.replicas.len() as u32 >= self.required
    }

    pub fn encode(&self) -> String {
        let mut s = format!(
            "version: 1\npart_name: {}\nrequired_number_of_replicas: {}\nactual_number_of_replicas: {}\nreplicas:\n",
            self.part,
            self.required,
            self.replicas.len()
        );
        for r in &self.replicas {
            s.push_str(r);
            s.push('\n');
        }
        s
    }

    pub fn decode(text: &str) -> Result<QuorumEntry, ParseError> {
        let bad = |why: String| ParseError::new("quorum entry", why);
        let mut lines = text.lines();
        let mut field = |key: &str| -> Result<String, ParseError> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix(": "))
                .map(str::to_string)
                .ok_or_else(|| bad(format!("expected `{key}: …`")))
        };
        if field("version")? != "1" {
            return Err(bad("unknown version".into()));
        }
        let part = PartInfo::parse(&field("part_name")?).map_err(|e| bad(e.to_string()))?;
        let required: u32 = field("required_number_of_replicas")?
            .parse()
            .map_err(|_| bad("bad required_number_of_replicas".into()))?;
        let actual: usize = field("actual_number_of_replicas")?
            .parse()
            .map_err(|_| bad("bad actual_number_of_replicas".into()))?;
        if lines.next() != Some("replicas:") {
            return Err(bad("expected `replicas:`".into()));
        }
        let mut replicas = BTreeSet::new();
        for r in lines {
            if !valid_name(r) || replicas.len() == QUORUM_REPLICAS_MAX {
                return Err(bad(format!("bad replica {r:?}")));
            }
            replicas.insert(r.to_string());
        }
        if replicas.len() != actual || required == 0 {
            return Err(bad("counts do not match".into()));
        }
        Ok(QuorumEntry {
            part,
            required,
            replicas,
        })
    }
}

/// The quorum an insert asks for: `insert_quorum` N (1 means none, as in
/// ClickHouse) or `auto` (a majority of the replicas).
pub fn required_replicas(setting: Option<u32>, auto: bool, total_replicas: u32) -> u32 {
    if auto {
        total_replicas / 2 + 1
    } else {
        setting.unwrap_or(0)
    }
}

/// Why a quorum insert may not start (nothing written yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotNow {
    /// Fewer active replicas than the quorum asks (ClickHouse's 285).
    TooFewReplicas { active: u32, required: u32, total: u32 },
    /// A sequential quorum insert while another one still waits
    /// (ClickHouse's 286): what the status node says.
    PreviousWaiting(String),
}

impl std::fmt::Display for NotNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotNow::TooFewReplicas {
                active,
                required,
                total,
            } => write!(
                f,
                "Number of alive replicas ({active}) is less than requested quorum ({required}/{total})"
            ),
            NotNow::PreviousWaiting(what) => {
                write!(
                    f,
                    "Quorum for previous write has not been satisfied yet. Status: {what}"
                )
            }
        }
    }
}

/// Whether a quorum insert of `required` replicas may start, with
/// `active` of `total` replicas active and, for a sequential
/// (`parallel` false) insert, the status node's data if it exists.
pub fn may_start(required: u32, active: u32, total: u32, parallel: bool, status: Option<&[u8]>) -> Result<(), NotNow> {
    if active < required {
        return Err(NotNow::TooFewReplicas {
            active,
            required,
            total,
        });
    }
    match status {
        Some(data) if !parallel => Err(NotNow::PreviousWaiting(
            decode_data(data)
                .map(|q| format!("part {} has {}/{}", q.part, q.replicas.len(), q.required))
                .unwrap_or_default(),
        )),
        _ => Ok(()),
    }
}

/// A quorum node's data, decoded (`None`: not a quorum entry).
pub fn decode_data(data: &[u8]) -> Option<QuorumEntry> {
    std::str::from_utf8(data).ok().and_then(|t| QuorumEntry::decode(t).ok())
}

/// Where the quorum node of `part` may be, in the order to look: its own
/// (parallel) node, then the sequential status node.
pub fn nodes_of(paths: &Paths, part: &PartInfo) -> [String; 2] {
    [paths.quorum_parallel_part(&part.name()), paths.quorum_status()]
}

/// `quorum/last_part` as read (data, version) just before the status
/// node: the status node's guard. The status node is deleted and created
/// again by every sequential quorum insert, and a new one starts at
/// version 0 like the one before it, so its version alone cannot tell a
/// replica that read the previous insert's node that it now acts on the
/// next one's (a holder deleting the next insert's node as if completing
/// its own, whose writer then answers `ok` on one replica). Every change
/// that ends a status node (completion, failure) also sets `last_part`
/// with the version read, so a change made from a stale read fails with
/// BadVersion and is read again. Read `last_part` first: a node ended
/// between the two reads then fails the check too.
pub type Guard<'a> = Option<(&'a [u8], i32)>;

/// The ops by which replica `me`, which now holds `part`, counts in the
/// quorum node at `path` (read as `data` at `version`; the status node
/// with its [`Guard`]): itself added, or, completing the count, the node
/// deleted and `last_part` set. `None` when the node waits for another
/// part (or does not decode).
pub fn held_ops(
    paths: &Paths,
    me: &str,
    part: &PartInfo,
    path: &str,
    data: &[u8],
    version: i32,
    guard: Guard<'_>,
) -> Option<Vec<KeeperOp>> {
    let mut q = decode_data(data).filter(|q| q.part == *part)?;
    q.replicas.insert(me.to_string());
    let last_version = guard.map_or(-1, |(_, v)| v);
    Some(if q.is_reached() {
        vec![
            KeeperOp::Delete {
                path: path.to_string(),
                version,
            },
            KeeperOp::SetData {
                path: paths.quorum_last_part(),
                data: part.name().into_bytes(),
                version: last_version,
            },
        ]
    } else {
        let mut ops = vec![KeeperOp::SetData {
            path: path.to_string(),
            data: q.encode().into_bytes(),
            version,
        }];
        if guard.is_some() {
            ops.push(KeeperOp::Check {
                path: paths.quorum_last_part(),
                version: last_version,
            });
        }
        ops
    })
}

/// Whether the writer of `part`, waiting on its quorum node (the
/// parallel one when `parallel`, else the status node), may stop: the
/// node is gone (`None`), or, the status node, names a later insert's
/// part. Whether the quorum was reached or failed is then the failed
/// node's to say ([`Paths::quorum_failed_part`]).
pub fn wait_over(part: &PartInfo, parallel: bool, node: Option<&[u8]>) -> bool {
    match node {
        None => true,
        Some(_) if parallel => false,
        Some(data) => decode_data(data).is_some_and(|q| q.part != *part),
    }
}

/// The parts whose quorum is still pending (a merge leaves them alone):
/// the parallel nodes' names (`parallel`, the children of
/// [`Paths::quorum_parallel`]) and the status node's part (`status`, its
/// data if it exists).
pub fn pending(parallel: &[String], status: Option<&[u8]>) -> BTreeSet<PartInfo> {
    let mut out: BTreeSet<PartInfo> = parallel.iter().filter_map(|n| PartInfo::parse(n).ok()).collect();
    out.extend(status.and_then(decode_data).map(|q| q.part));
    out
}

/// The multi that gives up on `part`, which no replica lists: its quorum
/// node (`path`, read at `version`; the status node with its [`Guard`],
/// whose `last_part` is set again unchanged) deleted, the part named
/// under `failed_parts`, and its block id (`block`: the id, its data and
/// version as read) deleted if it still names this part, so a retry of
/// the insert writes it again.
pub fn fail_ops(
    paths: &Paths,
    part: &PartInfo,
    path: &str,
    version: i32,
    guard: Guard<'_>,
    block: Option<(&str, &[u8], i32)>,
) -> Vec<KeeperOp> {
    let name = part.name();
    let mut ops = vec![
        KeeperOp::Delete {
            path: path.to_string(),
            version,
        },
        KeeperOp::Create {
            path: paths.quorum_failed_part(&name),
            data: Vec::new(),
            mode: CreateMode::Persistent,
        },
    ];
    if let Some((last_part, last_version)) = guard {
        ops.push(KeeperOp::SetData {
            path: paths.quorum_last_part(),
            data: last_part.to_vec(),
            version: last_version,
        });
    }
    if let Some((id, holder, version)) = block {
        if holder == name.as_bytes() {
            ops.push(KeeperOp::Delete {
                path: paths.block(id),
                version,
            });
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_counts() {
        let mut q = QuorumEntry::new(PartInfo::parse("1_7_7_0").unwrap(), 2, "r1");
        assert!(!q.is_reached());
        assert_eq!(QuorumEntry::decode(&q.encode()).unwrap(), q);
        q.replicas.insert("r3".into());
        assert!(q.is_reached());
        assert_eq!(QuorumEntry::decode(&q.encode()).unwrap(), q);
        let bad = q
            .encode()
            .replace("actual_number_of_replicas: 2", "actual_number_of_replicas: 3");
        assert!(QuorumEntry::decode(&bad).unwrap_err().to_string().contains("counts"));
        assert_eq!(required_replicas(None, true, 3), 2);
        assert_eq!(required_replicas(Some(3), false, 3), 3);
    }

    fn paths() -> Paths {
        Paths::new("/t", "r2")
    }

    #[test]
    fn an_insert_starts_only_with_enough_replicas_and_no_sequential_quorum_waiting() {
        let waiting = QuorumEntry::new(PartInfo::parse("1_3_3_0").unwrap(), 2, "r1").encode();
        assert_eq!(
            may_start(2, 1, 3, true, None),
            Err(NotNow::TooFewReplicas {
                active: 1,
                required: 2,
                total: 3
            })
        );
        assert_eq!(may_start(2, 2, 3, true, Some(waiting.as_bytes())), Ok(()));
        let e = may_start(2, 3, 3, false, Some(waiting.as_bytes())).unwrap_err();
        assert_eq!(e, NotNow::PreviousWaiting("part 1_3_3_0 has 1/2".into()));
        assert!(e
            .to_string()
            .starts_with("Quorum for previous write has not been satisfied yet"));
        assert_eq!(may_start(2, 2, 3, false, None), Ok(()));
    }

    #[test]
    fn a_holder_adds_itself_and_the_last_one_deletes_the_node() {
        let p = paths();
        let part = PartInfo::parse("1_3_3_0").unwrap();
        let q = QuorumEntry::new(part.clone(), 3, "r1").encode();
        let path = p.quorum_parallel_part("1_3_3_0");
        let ops = held_ops(&p, "r2", &part, &path, q.as_bytes(), 4, None).unwrap();
        let [KeeperOp::SetData { data, version: 4, .. }] = &ops[..] else {
            panic!("{ops:?}")
        };
        let added = decode_data(data).unwrap();
        assert_eq!(added.replicas, BTreeSet::from(["r1".to_string(), "r2".to_string()]));
        let ops = held_ops(&p, "r3", &part, &path, data, 5, None).unwrap();
        assert!(
            matches!(&ops[0], KeeperOp::Delete { path: d, version: 5 } if *d == path),
            "{ops:?}"
        );
        assert!(
            matches!(&ops[1], KeeperOp::SetData { path: l, data, .. } if *l == p.quorum_last_part() && data == b"1_3_3_0")
        );
        // a node waiting for another part is not this holder's to count
        let other = PartInfo::parse("1_4_4_0").unwrap();
        assert_eq!(held_ops(&p, "r2", &other, &path, q.as_bytes(), 4, None), None);
        assert_eq!(held_ops(&p, "r2", &part, &path, b"garbage", 4, None), None);
    }

    /// The status node of the next sequential insert starts at version 0
    /// like the one before: a holder that read the previous node acts
    /// only if `last_part` did not move since (found by the simulator,
    /// seed 30 of the first sweep with quorum inserts: a holder's
    /// completion deleted the next insert's status node, whose writer
    /// answered `ok` held by one replica).
    #[test]
    fn the_status_node_is_guarded_by_last_part() {
        let p = paths();
        let part = PartInfo::parse("1_3_3_0").unwrap();
        let status = p.quorum_status();
        let q = QuorumEntry::new(part.clone(), 2, "r1").encode();
        let ops = held_ops(&p, "r2", &part, &status, q.as_bytes(), 0, Some((b"1_2_2_0", 7))).unwrap();
        assert!(
            matches!(&ops[1], KeeperOp::SetData { data, version: 7, .. } if data == b"1_3_3_0"),
            "{ops:?}"
        );
        let q = QuorumEntry::new(part.clone(), 3, "r1").encode();
        let ops = held_ops(&p, "r2", &part, &status, q.as_bytes(), 0, Some((b"1_2_2_0", 7))).unwrap();
        assert!(
            matches!(&ops[1], KeeperOp::Check { path, version: 7 } if *path == p.quorum_last_part()),
            "{ops:?}"
        );
        // failing the status node sets last_part again, unchanged
        let ops = fail_ops(&p, &part, &status, 0, Some((b"1_2_2_0", 7)), None);
        assert!(
            matches!(&ops[2], KeeperOp::SetData { data, version: 7, .. } if data == b"1_2_2_0"),
            "{ops:?}"
        );
    }

    #[test]
    fn a_wait_ends_when_the_node_goes_or_the_status_names_a_later_part() {
        let part = PartInfo::parse("1_3_3_0").unwrap();
        let mine = QuorumEntry::new(part.clone(), 2, "r1").encode();
        let later = QuorumEntry::new(PartInfo::parse("1_5_5_0").unwrap(), 2, "r2").encode();
        assert!(wait_over(&part, true, None));
        assert!(!wait_over(&part, true, Some(mine.as_bytes())));
        assert!(!wait_over(&part, false, Some(mine.as_bytes())));
        assert!(wait_over(&part, false, Some(later.as_bytes())));
    }

    #[test]
    fn giving_up_frees_the_block_id_only_if_it_names_the_part() {
        let p = paths();
        let part = PartInfo::parse("1_3_3_0").unwrap();
        let ops = fail_ops(&p, &part, "/t/quorum/status", 2, None, Some(("b1", b"1_3_3_0", 0)));
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[1].path(), p.quorum_failed_part("1_3_3_0"));
        assert_eq!(ops[2].path(), p.block("b1"));
        let ops = fail_ops(&p, &part, "/t/quorum/status", 2, None, Some(("b1", b"1_4_4_0", 0)));
        assert_eq!(ops.len(), 2);
    }

    /// A coordinator holding only `quorum/status` and `quorum/last_part`,
    /// applying a multi all or nothing with ZooKeeper's version checks.
    #[derive(Clone, Debug, Default)]
    struct Model {
        status: Option<(Vec<u8>, i32)>,
        last_part: (Vec<u8>, i32),
    }

    impl Model {
        /// Applies `ops`; `Err` (nothing applied) on a failed check.
        /// Returns the part of the status node an op changed, if any.
        fn apply(&mut self, p: &Paths, ops: &[KeeperOp]) -> Result<Option<PartInfo>, ()> {
            let mut next = self.clone();
            let mut touched = None;
            for op in ops {
                let ok = |v: i32, have: i32| v == -1 || v == have;
                match op {
                    KeeperOp::Delete { path, version } if *path == p.quorum_status() => {
                        let (d, v) = next.status.take().ok_or(())?;
                        if !ok(*version, v) {
                            return Err(());
                        }
                        touched = decode_data(&d).map(|q| q.part);
                    }
                    KeeperOp::SetData { path, data, version } if *path == p.quorum_status() => {
                        let (d, v) = next.status.as_mut().ok_or(())?;
                        if !ok(*version, *v) {
                            return Err(());
                        }
                        touched = decode_data(d).map(|q| q.part);
                        *d = data.clone();
                        *v += 1;
                    }
                    KeeperOp::SetData { path, data, version } if *path == p.quorum_last_part() => {
                        if !ok(*version, next.last_part.1) {
                            return Err(());
                        }
                        next.last_part = (data.clone(), next.last_part.1 + 1);
                    }
                    KeeperOp::Check { path, version } if *path == p.quorum_last_part() => {
                        if !ok(*version, next.last_part.1) {
                            return Err(());
                        }
                    }
                    // failed_parts and block ids: not modelled
                    KeeperOp::Create { .. } => {}
                    other => panic!("unexpected op {other:?}"),
                }
            }
            *self = next;
            Ok(touched)
        }
    }

    /// What a holder read: `last_part` then the status node.
    #[derive(Clone, Debug)]
    struct Read {
        guard: (Vec<u8>, i32),
        status: Option<(Vec<u8>, i32)>,
    }

    /// Runs `steps` (kind, holder) against the model: 0 a sequential
    /// insert of the next part if no status node exists, 1 a holder reads,
    /// 2 a holder that read counts itself in the part it read, 3 a holder
    /// that read gives that part up. Returns the first change made to a
    /// status node of another part than the one its maker read.
    fn run(steps: &[(u8, usize)], guarded: bool) -> Option<String> {
        let p = paths();
        let mut m = Model::default();
        let mut reads: [Option<Read>; 3] = [None, None, None];
        let mut next_block = 1u64;
        for &(kind, h) in steps {
            let me = format!("h{h}");
            match kind {
                0 => {
                    if m.status.is_none() {
                        let part = PartInfo::parse(&format!("1_{next_block}_{next_block}_0")).unwrap();
                        next_block += 1;
                        m.status = Some((QuorumEntry::new(part, 3, "w").encode().into_bytes(), 0));
                    }
                }
                1 => {
                    reads[h] = Some(Read {
                        guard: m.last_part.clone(),
                        status: m.status.clone(),
                    });
                }
                _ => {
                    let Some(Read {
                        guard,
                        status: Some((data, version)),
                    }) = reads[h].take()
                    else {
                        continue;
                    };
                    let part = decode_data(&data).unwrap().part;
                    let guard = guarded.then_some((&guard.0[..], guard.1));
                    let ops = if kind == 2 {
                        held_ops(&p, &me, &part, &p.quorum_status(), &data, version, guard).unwrap()
                    } else {
                        fail_ops(&p, &part, &p.quorum_status(), version, guard, None)
                    };
                    if let Ok(Some(touched)) = m.apply(&p, &ops) {
                        if touched != part {
                            return Some(format!("{me} read {part} and changed {touched}'s status node"));
                        }
                    }
                }
            }
        }
        None
    }

    proptest::proptest! {
        /// Whatever the interleaving of sequential inserts and holders
        /// acting on what they read earlier, no holder changes the status
        /// node of a part other than the one it read.
        #[test]
        fn no_holder_acts_on_a_later_inserts_status_node(
            steps in proptest::collection::vec((0u8..4, 0usize..3), 0..60),
        ) {
            proptest::prop_assert_eq!(run(&steps, true), None);
        }
    }

    /// The same model without the guard: the interleaving the simulator
    /// found (a holder reads insert 1's node; another completes it; insert
    /// 2 creates its node, again at version 0; the first holder's
    /// completion deletes insert 2's node) is caught, so the property
    /// above can fail.
    #[test]
    fn without_the_guard_a_stale_holder_deletes_the_next_node() {
        // insert 1 (needs 3: the writer and two holders); h0 and h1 read
        // it; h1 counts itself; h2 reads and completes it; insert 2; h0,
        // reading a node at version 1 when insert 2's is at 0, fails; so
        // take h0 reading after h1 counted: version 1 both times
        let steps = [
            (0, 0),
            (1, 1),
            (2, 1),
            (1, 0),
            (1, 2),
            (2, 2),
            (0, 0),
            (1, 1),
            (2, 1),
            (2, 0),
        ];
        let found = run(&steps, false).expect("the stale holder acts");
        assert!(found.contains("h0 read 1_1_1_0 and changed 1_2_2_0"), "{found}");
        assert_eq!(run(&steps, true), None);
    }
}
