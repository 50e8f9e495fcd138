//! A restarted replica's reconciliation of its disk with the coordinator,
//! sans-IO: which local parts stay current, which go, and which parts the
//! coordinator lists for it must be fetched again.
//!
//! * A part on disk the coordinator does not list for this replica is not
//!   current: an old part a committed merge replaced (a listed part covers
//!   it) is removed; any other — a fetch cut off before its commit, an
//!   insert whose commit never happened — is detached as unexpected.
//! * A listed part on disk is current only if its files pass their
//!   checksums; a broken one is detached.
//! * A listed part not held (missing, or detached as broken) is forgotten
//!   here and queued for a fetch, in one multi each.
//!
//! Two steps, because only the driver reads files: [`sort`] says which
//! local parts to check, [`settle`] takes the checks' results.

use crate::part::{ActivePartSet, PartInfo};
use std::collections::{BTreeMap, BTreeSet};

/// What [`sort`] decided for the parts on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sorted {
    /// Replaced by a listed part that covers them: removed.
    pub remove: Vec<String>,
    /// Listed for no one here, covered by nothing listed: detached.
    pub unexpected: Vec<String>,
    /// Listed: their files are checked before they are current.
    pub check: Vec<String>,
}

/// The parts on disk against those the coordinator lists for this replica.
pub fn sort(listed: &BTreeSet<String>, on_disk: &[String]) -> Sorted {
    let listed_parts: Vec<PartInfo> = listed.iter().filter_map(|l| PartInfo::parse(l).ok()).collect();
    let mut out = Sorted::default();
    for p in on_disk {
        if listed.contains(p) {
            out.check.push(p.clone());
            continue;
        }
        let covered = PartInfo::parse(p)
            .ok()
            .is_some_and(|pi| listed_parts.iter().any(|l| *l != pi && l.contains(&pi)));
        if covered {
            out.remove.push(p.clone());
        } else {
            out.unexpected.push(p.clone());
        }
    }
    out
}

/// The reconciliation's end.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    /// Listed parts whose files failed their checks (why): detached.
    pub broken: Vec<(String, String)>,
    /// The parts current here.
    pub current: ActivePartSet,
    /// Listed parts not held: forgotten here and fetched again.
    pub refetch: Vec<PartInfo>,
    /// Listed names that do not parse as parts: left as they are.
    pub unparsable: Vec<String>,
}

/// With the checks of the listed parts on disk (`Ok`, or why they
/// failed): what is current, broken, and to be fetched.
pub fn settle(listed: &BTreeSet<String>, checked: &BTreeMap<String, Result<(), String>>) -> Result<Settled, String> {
    let mut out = Settled::default();
    let mut held = BTreeSet::new();
    for (p, check) in checked.iter().filter(|(p, _)| listed.contains(*p)) {
        match check {
            Ok(()) => {
                held.insert(p.clone());
            }
            Err(why) => out.broken.push((p.clone(), why.clone())),
        }
    }
    for p in &held {
        if let Ok(pi) = PartInfo::parse(p) {
            out.current.add(pi).map_err(|e| format!("reconcile: {e}"))?;
        }
    }
    for p in listed.difference(&held) {
        match PartInfo::parse(p) {
            Ok(pi) => out.refetch.push(pi),
            Err(_) => out.unparsable.push(p.clone()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_restarted_replica_keeps_what_is_listed_and_sound_and_fetches_the_rest() {
        // the coordinator lists a merge of 1..3 and part 4 and part 5
        let listed = set(&["all_1_3_1", "all_4_4_0", "all_5_5_0"]);
        // on disk: the merge's sources (replaced), the merge, part 4
        // (broken), and part 6 (a commit that never happened)
        let on_disk = names(&["all_1_1_0", "all_2_2_0", "all_1_3_1", "all_4_4_0", "all_6_6_0"]);
        let s = sort(&listed, &on_disk);
        assert_eq!(s.remove, names(&["all_1_1_0", "all_2_2_0"]));
        assert_eq!(s.unexpected, names(&["all_6_6_0"]));
        assert_eq!(s.check, names(&["all_1_3_1", "all_4_4_0"]));
        let checked: BTreeMap<String, Result<(), String>> = [
            ("all_1_3_1".to_string(), Ok(())),
            ("all_4_4_0".to_string(), Err("checksum of a.bin".to_string())),
        ]
        .into_iter()
        .collect();
        let done = settle(&listed, &checked).unwrap();
        assert_eq!(
            done.broken,
            vec![("all_4_4_0".to_string(), "checksum of a.bin".to_string())]
        );
        let current: Vec<String> = done.current.iter().map(PartInfo::name).collect();
        assert_eq!(current, names(&["all_1_3_1"]));
        let refetch: Vec<String> = done.refetch.iter().map(PartInfo::name).collect();
        assert_eq!(refetch, names(&["all_4_4_0", "all_5_5_0"]));
    }

    proptest! {
        /// Whatever is on disk and listed: no part the coordinator does not
        /// list is current; every listed part is held sound (current, or
        /// inside a current part) or fetched again, never both; every part
        /// on disk is decided once.
        #[test]
        fn every_listed_part_is_held_or_fetched_and_nothing_unlisted_is_current(
            listed in proptest::collection::btree_set((0u64..8, 0u64..3), 0..6),
            disk in proptest::collection::btree_set((0u64..8, 0u64..3), 0..8),
            broken in proptest::collection::btree_set(0u64..8, 0..3),
        ) {
            let name = |(lo, len): (u64, u64)| PartInfo::new("all", lo, lo + len, u32::from(len > 0)).name();
            let listed: BTreeSet<String> = listed.into_iter().map(name).collect();
            let disk: Vec<String> = disk.into_iter().map(name).collect();
            let s = sort(&listed, &disk);
            prop_assert_eq!(s.remove.len() + s.unexpected.len() + s.check.len(), disk.len());
            let checked: BTreeMap<String, Result<(), String>> = s
                .check
                .iter()
                .map(|p| {
                    let lo = PartInfo::parse(p).unwrap().min_block;
                    (p.clone(), if broken.contains(&lo) { Err("bad".to_string()) } else { Ok(()) })
                })
                .collect();
            // overlapping listed parts are not a state a coordinator holds
            let Ok(done) = settle(&listed, &checked) else { return Ok(()) };
            let current: BTreeSet<String> = done.current.iter().map(PartInfo::name).collect();
            prop_assert!(current.is_subset(&listed));
            let refetch: BTreeSet<String> = done.refetch.iter().map(PartInfo::name).collect();
            prop_assert!(current.is_disjoint(&refetch));
            for p in &listed {
                let sound = checked.get(p).is_some_and(Result::is_ok);
                prop_assert!(sound != refetch.contains(p), "{} sound {} refetched {}", p, sound, refetch.contains(p));
                // a sound part is current, or inside one that is
                let pi = PartInfo::parse(p).unwrap();
                prop_assert!(!sound || done.current.containing(&pi).is_some(), "{} is not current", p);
            }
            for (p, _) in &done.broken {
                prop_assert!(refetch.contains(p), "a broken part is fetched again");
            }
        }
    }
}
