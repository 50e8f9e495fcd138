//! Which parts the leader merges next.
//!
//! Candidates are the leader's current parts that are still maximal in its
//! virtual parts (no queued merge already takes them) and whose quorum is
//! not pending. Two neighbours may join only if nothing can lie between
//! them: no virtual part (a part queued to be fetched, which the merge
//! would cover without its rows) and no block number still locked (an
//! insert holding it may yet commit a part there). A number whose lock
//! is gone without a part (the writer died) is a gap a merge may span:
//! nothing can ever be committed with it.
//!
//! The caller's obligation, for the locks to mean that: every candidate
//! was in the virtual parts *before* the locks were read (ClickHouse's
//! `prev_virtual_parts`), and the log was pulled after. A number between
//! two such candidates was taken before the later one, so before the
//! read: it is locked, or committed and pulled (a virtual part), or dead.
//!
//! Policy: in each partition with at least `parts_to_merge_min` candidates,
//! the longest run of mergeable neighbours, cut at
//! `max_parts_to_merge_at_once`, starting from the oldest blocks.

use crate::part::{ActivePartSet, PartInfo};
use std::collections::BTreeSet;

/// What merge selection looks at.
pub struct MergeInputs<'a> {
    pub current: &'a ActivePartSet,
    pub virtual_parts: &'a ActivePartSet,
    /// Block numbers held by an insert's lock, per partition.
    pub locked: &'a dyn Fn(&str) -> BTreeSet<u64>,
    /// Parts whose quorum is not reached yet.
    pub quorum_pending: &'a BTreeSet<PartInfo>,
    pub parts_to_merge_min: usize,
    pub max_parts_to_merge_at_once: usize,
}

/// Parts of `partition` in a mergeable run, or `None`.
fn select_in(inputs: &MergeInputs<'_>, partition: &str) -> Option<Vec<PartInfo>> {
    let locked = (inputs.locked)(partition);
    let candidates: Vec<&PartInfo> = inputs.current.in_partition(partition).collect();
    if candidates.len() < inputs.parts_to_merge_min {
        return None;
    }
    let usable = |p: &PartInfo| inputs.virtual_parts.contains_exactly(p) && !inputs.quorum_pending.contains(p);
    // the partition's virtual parts, in block order and disjoint: the
    // first one past `a` is the only one that could lie before `b`
    let virt: Vec<&PartInfo> = inputs.virtual_parts.in_partition(partition).collect();
    let queued_between = |a: &PartInfo, b: &PartInfo| {
        let next = virt.partition_point(|v| v.min_block <= a.max_block);
        virt.get(next).is_some_and(|v| v.max_block < b.min_block)
    };
    let joinable = |a: &PartInfo, b: &PartInfo| {
        locked.range(a.max_block + 1..b.min_block).next().is_none() && !queued_between(a, b)
    };
    let mut best: Vec<PartInfo> = Vec::new();
    let mut run: Vec<PartInfo> = Vec::new();
    for p in candidates {
        let extends = usable(p)
            && run.last().is_some_and(|last| joinable(last, p))
            && run.len() < inputs.max_parts_to_merge_at_once;
        if !extends {
            if run.len() > best.len() {
                best = std::mem::take(&mut run);
            }
            run.clear();
            if !usable(p) {
                continue;
            }
        }
        run.push(p.clone());
    }
    if run.len() > best.len() {
        best = run;
    }
    (best.len() >= 2).then_some(best)
}

/// The next merge: its source parts (adjacent, in block order) and the
/// part it makes. Partitions are tried in id order.
pub fn select_merge(inputs: &MergeInputs<'_>) -> Option<(Vec<PartInfo>, PartInfo)> {
    assert!(inputs.max_parts_to_merge_at_once >= 2);
    let partitions: Vec<String> = inputs.current.partitions().cloned().collect();
    for partition in partitions {
        if let Some(parts) = select_in(inputs, &partition) {
            let into = PartInfo::merged(&parts);
            debug_assert!(parts.iter().all(|p| into.contains(p)));
            return Some((parts, into));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> ActivePartSet {
        let mut s = ActivePartSet::new();
        for n in names {
            s.add(PartInfo::parse(n).unwrap()).unwrap();
        }
        s
    }

    fn names(parts: &[PartInfo]) -> Vec<String> {
        parts.iter().map(|p| p.name()).collect()
    }

    #[test]
    fn a_merge_never_spans_a_locked_number() {
        let parts = set(&["1_0_0_0", "1_1_1_0", "1_3_3_0", "1_4_4_0", "1_5_5_0"]);
        let locked = |_: &str| BTreeSet::from([2u64]);
        let pending = BTreeSet::new();
        let inputs = MergeInputs {
            current: &parts,
            virtual_parts: &parts,
            locked: &locked,
            quorum_pending: &pending,
            parts_to_merge_min: 2,
            max_parts_to_merge_at_once: 10,
        };
        let (src, into) = select_merge(&inputs).unwrap();
        assert_eq!(names(&src), ["1_3_3_0", "1_4_4_0", "1_5_5_0"]);
        assert_eq!(into.name(), "1_3_5_1");
        // the lock gone (its writer died), the gap is spanned
        let none = |_: &str| BTreeSet::new();
        let inputs = MergeInputs {
            locked: &none,
            ..inputs
        };
        assert_eq!(select_merge(&inputs).unwrap().1.name(), "1_0_5_1");
    }

    #[test]
    fn a_merge_never_covers_a_part_still_queued_for_a_fetch() {
        // the leader holds 0, 1 and 3; 2 is committed (no lock) and queued
        let current = set(&["1_0_0_0", "1_1_1_0", "1_3_3_0", "1_4_4_0"]);
        let virt = set(&["1_0_0_0", "1_1_1_0", "1_2_2_0", "1_3_3_0", "1_4_4_0"]);
        let none = |_: &str| BTreeSet::new();
        let pending = BTreeSet::new();
        let inputs = MergeInputs {
            current: &current,
            virtual_parts: &virt,
            locked: &none,
            quorum_pending: &pending,
            parts_to_merge_min: 2,
            max_parts_to_merge_at_once: 10,
        };
        let (src, into) = select_merge(&inputs).unwrap();
        assert_eq!(names(&src), ["1_0_0_0", "1_1_1_0"], "not across 1_2_2_0");
        assert_eq!(into.name(), "1_0_1_1");
    }

    #[test]
    fn parts_a_queued_merge_takes_or_a_pending_quorum_holds_are_left_alone() {
        let parts = set(&["1_0_0_0", "1_1_1_0", "1_2_2_0", "1_3_3_0"]);
        let virt = set(&["1_0_1_1", "1_2_2_0", "1_3_3_0"]);
        let none = |_: &str| BTreeSet::new();
        let pending = BTreeSet::from([PartInfo::parse("1_3_3_0").unwrap()]);
        let inputs = MergeInputs {
            current: &parts,
            virtual_parts: &virt,
            locked: &none,
            quorum_pending: &pending,
            parts_to_merge_min: 2,
            max_parts_to_merge_at_once: 10,
        };
        assert_eq!(select_merge(&inputs), None);
        let fewer = set(&["1_0_0_0"]);
        let inputs = MergeInputs {
            current: &fewer,
            virtual_parts: &fewer,
            quorum_pending: &BTreeSet::new(),
            ..inputs
        };
        assert_eq!(select_merge(&inputs), None);
    }
}
