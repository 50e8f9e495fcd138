//! Properties of the table core: the text codecs round-trip, the queue's
//! virtual parts stay `current + queue` whatever runs, fails or is removed,
//! and a merge never spans a locked block number.

use drift_table::block::Block;
use drift_table::entry::{EntryKind, LogEntry};
use drift_table::format::{decode_part, encode_part};
use drift_table::merge::{select_merge, MergeInputs};
use drift_table::part::{ActivePartSet, PartInfo, LEVEL_MAX};
use drift_table::queue::Queue;
use drift_table::quorum::QuorumEntry;
use drift_table::schema::{ColumnType, PartitionKey, Schema, Value};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn part() -> impl Strategy<Value = PartInfo> {
    (
        prop_oneof![
            Just("all".to_string()),
            (0u64..5).prop_map(|p| p.to_string()),
            Just("-3".to_string())
        ],
        0u64..1_000_000,
        0u64..1000,
        0u32..LEVEL_MAX,
    )
        .prop_map(|(p, min, len, level)| PartInfo::new(&p, min, min + len, level))
}

fn entry() -> impl Strategy<Value = LogEntry> {
    let kind = prop_oneof![
        (
            part(),
            proptest::option::of("[0-9]{1,3}_[0-9]{1,20}_[0-9]{1,20}"),
            0u32..5
        )
            .prop_map(|(part, block_id, quorum)| EntryKind::GetPart { part, block_id, quorum }),
        (0u64..100, proptest::collection::vec((1u64..5, 0u32..4), 2..6)).prop_map(|(start, spans)| {
            let mut at = start;
            let parts: Vec<PartInfo> = spans
                .into_iter()
                .map(|(len, level)| {
                    let p = PartInfo::new("7", at, at + len - 1, level);
                    at += len + 1;
                    p
                })
                .collect();
            EntryKind::MergeParts {
                into: PartInfo::merged(&parts),
                parts,
            }
        }),
        part().prop_map(|range| EntryKind::DropRange { range }),
    ];
    (0i64..4_102_444_800, "[a-z][a-z0-9_]{0,10}", kind).prop_map(|(t, r, kind)| LogEntry {
        create_time_s: t,
        source_replica: r,
        kind,
    })
}

fn schema() -> Schema {
    let cols = [
        ("id", ColumnType::UInt64),
        ("n", ColumnType::Int64),
        ("s", ColumnType::String),
    ];
    Schema::new("t", &cols, PartitionKey::None, vec![0])
}

proptest! {
    #[test]
    fn log_entries_round_trip(e in entry()) {
        prop_assert_eq!(LogEntry::decode(&e.encode()).unwrap(), e);
    }

    #[test]
    fn part_names_round_trip(p in part()) {
        prop_assert_eq!(PartInfo::parse(&p.name()).unwrap(), p);
    }

    #[test]
    fn quorum_entries_round_trip(p in part(), required in 1u32..5, rs in proptest::collection::btree_set("[a-z][a-z0-9]{0,5}", 1..5)) {
        let q = QuorumEntry { part: p, required, replicas: rs };
        prop_assert_eq!(QuorumEntry::decode(&q.encode()).unwrap(), q);
    }

    #[test]
    fn parts_round_trip(rows in proptest::collection::vec((any::<u64>(), any::<i64>(), ".{0,20}"), 0..50)) {
        let s = schema();
        let rows = rows.into_iter().map(|(a, b, c)| vec![Value::UInt64(a), Value::Int64(b), Value::String(c)]).collect();
        let block = Block::from_rows(&s, rows).unwrap().sorted(&s);
        prop_assert_eq!(decode_part(&s, &encode_part(&s, &block)).unwrap(), block);
    }

    #[test]
    fn garbage_entries_are_errors_not_panics(text in ".{0,300}") {
        let _ = LogEntry::decode(&text);
        let _ = QuorumEntry::decode(&text);
        let _ = PartInfo::parse(&text);
    }
}

/// What a step of the queue property does.
#[derive(Clone, Debug)]
enum Step {
    /// A new insert's part in partition (0..3).
    Get(u8),
    /// The leader merges a run of the virtual parts of a partition.
    Merge(u8, usize),
    /// A drop of a partition's blocks so far.
    Drop(u8),
    Select,
    /// Finish the n-th running entry, ok or failed.
    Finish(usize, bool),
    /// Remove the n-th queued entry (a failed quorum part).
    Remove(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..3).prop_map(Step::Get),
        2 => (0u8..3, 2usize..5).prop_map(|(p, n)| Step::Merge(p, n)),
        1 => (0u8..3).prop_map(Step::Drop),
        4 => Just(Step::Select),
        4 => (0usize..8, prop::bool::weighted(0.8)).prop_map(|(i, ok)| Step::Finish(i, ok)),
        1 => (0usize..8).prop_map(Step::Remove),
    ]
}

fn entry_of(kind: EntryKind) -> LogEntry {
    LogEntry {
        create_time_s: 0,
        source_replica: "r1".into(),
        kind,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn virtual_parts_stay_current_plus_queue(steps in proptest::collection::vec(step(), 1..120)) {
        let mut q = Queue::new(ActivePartSet::new());
        let mut next_block: BTreeMap<String, u64> = BTreeMap::new();
        let mut seq = 0u64;
        let mut now = 0u64;
        let mut running: Vec<String> = Vec::new();
        for s in steps {
            now += 10;
            let mut push = |q: &mut Queue, kind| {
                seq += 1;
                q.push(format!("queue-{seq:010}"), entry_of(kind))
            };
            match s {
                Step::Get(p) => {
                    let p = p.to_string();
                    let n = next_block.entry(p.clone()).or_insert(0);
                    *n += 1;
                    push(&mut q, EntryKind::GetPart { part: PartInfo::new(&p, *n, *n, 0), block_id: None, quorum: 0 }).unwrap();
                }
                Step::Merge(p, n) => {
                    let parts: Vec<PartInfo> = q.virtual_parts().in_partition(&p.to_string()).take(n).cloned().collect();
                    if parts.len() >= 2 {
                        let into = PartInfo::merged(&parts);
                        push(&mut q, EntryKind::MergeParts { parts, into }).unwrap();
                    }
                }
                Step::Drop(p) => {
                    let p = p.to_string();
                    let max = *next_block.get(&p).unwrap_or(&0);
                    let gone = push(&mut q, EntryKind::DropRange { range: PartInfo::new(&p, 0, max, LEVEL_MAX) }).unwrap();
                    prop_assert!(gone.iter().all(|z| !running.contains(z)));
                }
                Step::Select => {
                    if let Some(sel) = q.select(now, 3, 2) {
                        prop_assert!(!running.contains(&sel.znode));
                        running.push(sel.znode);
                    }
                }
                Step::Finish(i, ok) => {
                    if !running.is_empty() {
                        let z = running.remove(i % running.len());
                        if ok { q.finish_ok(&z).unwrap(); } else { q.finish_err(&z, now, "failed"); }
                    }
                }
                Step::Remove(i) => {
                    let idle: Vec<String> = q.entries().filter(|e| !e.executing).map(|e| e.znode.clone()).collect();
                    if !idle.is_empty() {
                        prop_assert!(q.remove(&idle[i % idle.len()]).unwrap());
                    }
                }
            }
            prop_assert!(q.check_invariant().is_ok(), "{}", q.check_invariant().unwrap_err());
        }
        // drain: the queue empties and leaves exactly the virtual parts
        let want = q.virtual_parts().clone();
        for z in running.drain(..) {
            q.finish_ok(&z).unwrap();
        }
        for _ in 0..10_000 {
            now += 10_000;
            match q.select(now, 3, 2) {
                Some(sel) => { q.finish_ok(&sel.znode).unwrap(); }
                None if q.is_empty() => break,
                None => {}
            }
        }
        prop_assert!(q.is_empty());
        prop_assert_eq!(q.current(), &want);
        prop_assert_eq!(q.current(), q.virtual_parts());
    }

    #[test]
    fn a_merge_never_spans_a_locked_number(
        taken in proptest::collection::btree_set(0u64..60, 0..40),
        locked_picks in proptest::collection::vec(0usize..60, 0..6),
        max_at_once in 2usize..8,
    ) {
        // numbers not taken by a part are either locked or gaps
        let free: Vec<u64> = (0..60).filter(|n| !taken.contains(n)).collect();
        let locked: BTreeSet<u64> = if free.is_empty() { BTreeSet::new() } else { locked_picks.iter().map(|i| free[i % free.len()]).collect() };
        let mut parts = ActivePartSet::new();
        for n in &taken {
            parts.add(PartInfo::new("1", *n, *n, 0)).unwrap();
        }
        let lk = locked.clone();
        let locked_fn = move |_: &str| lk.clone();
        let inputs = MergeInputs {
            current: &parts,
            virtual_parts: &parts,
            locked: &locked_fn,
            quorum_pending: &BTreeSet::new(),
            parts_to_merge_min: 2,
            max_parts_to_merge_at_once: max_at_once,
        };
        if let Some((src, into)) = select_merge(&inputs) {
            prop_assert!(src.len() >= 2 && src.len() <= max_at_once);
            prop_assert!(locked.range(into.min_block..=into.max_block).next().is_none());
            prop_assert!(src.iter().all(|p| into.contains(p)));
        }
    }

    #[test]
    fn a_merge_never_covers_a_virtual_part_it_does_not_take(
        taken in proptest::collection::btree_set(0u64..60, 0..40),
        fetched in proptest::collection::vec(proptest::bool::weighted(0.7), 60),
        max_at_once in 2usize..8,
    ) {
        // every taken number is a committed part; the leader holds some
        let mut virt = ActivePartSet::new();
        let mut current = ActivePartSet::new();
        for n in &taken {
            virt.add(PartInfo::new("1", *n, *n, 0)).unwrap();
            if fetched[*n as usize] {
                current.add(PartInfo::new("1", *n, *n, 0)).unwrap();
            }
        }
        let none = |_: &str| BTreeSet::new();
        let inputs = MergeInputs {
            current: &current,
            virtual_parts: &virt,
            locked: &none,
            quorum_pending: &BTreeSet::new(),
            parts_to_merge_min: 2,
            max_parts_to_merge_at_once: max_at_once,
        };
        if let Some((src, into)) = select_merge(&inputs) {
            // every virtual part inside the merged range is one it merges
            for v in virt.iter().filter(|v| into.contains(v)) {
                prop_assert!(src.contains(v), "{} covered, not merged: {:?}", v.name(), src);
            }
        }
    }
}
