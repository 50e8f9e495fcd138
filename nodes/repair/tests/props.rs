//! Properties of trees and repair over random data.

mod common;

use common::*;
use drift_repair::entry::Entry;
use drift_repair::tree::MerkleTree;
use drift_repair::wire::Msg;
use drift_repair::{Replica, TokenRange};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Random versions over a small key space, so replicas overlap.
fn versions() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec(
        (0..40u8, 0..6u64, prop::option::of(prop::collection::vec(0..3u8, 0..3))),
        0..60,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(k, ts, value)| Entry {
                key: vec![b'k', k],
                ts,
                value,
            })
            .collect()
    })
}

fn replica_of(entries: &[Entry], depth: u32) -> Replica {
    let mut r = Replica::new(TokenRange::FULL, depth);
    for e in entries {
        r.merge(e.clone());
    }
    r
}

/// The LWW merge of everything, per key.
fn reference(sets: &[&[Entry]]) -> Vec<Entry> {
    let mut best: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
    for e in sets.iter().flat_map(|s| s.iter()) {
        match best.get(&e.key) {
            Some(b) if b.lww_cmp(e) != std::cmp::Ordering::Less => {}
            _ => {
                best.insert(e.key.clone(), e.clone());
            }
        }
    }
    let mut out: Vec<Entry> = best.into_values().collect();
    out.sort_by_key(|e| (drift_repair::token::token(&e.key), e.key.clone()));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn token_function_is_murmur3_x86_32_seed_0(data in prop::collection::vec(any::<u8>(), 0..64), seed in any::<u32>()) {
        let theirs = murmur3::murmur3_32(&mut std::io::Cursor::new(&data), seed).unwrap();
        prop_assert_eq!(drift_repair::token::murmur3_32(&data, seed), theirs);
    }

    #[test]
    fn range_hash_is_independent_of_depth(entries in versions(), d1 in 0..12u32, d2 in 0..12u32) {
        let (a, b) = (replica_of(&entries, d1), replica_of(&entries, d2));
        for level in 0..=d1.min(d2) {
            for i in 0..(1u64 << level) {
                prop_assert_eq!(a.tree().node(level, i), b.tree().node(level, i));
            }
        }
    }

    #[test]
    fn diff_between_depths_8_and_12_on_equal_data_finds_nothing(entries in versions(), row_level in any::<bool>()) {
        let (mut a, mut b) = (replica_of(&entries, 8), replica_of(&entries, 12));
        let r = repair(&mut a, &mut b, cfg(3, row_level));
        prop_assert_eq!((r.hashes_compared, r.entries_streamed(), r.ranges.len()), (1, 0, 0));
    }

    #[test]
    fn incremental_tree_equals_rebuilt_tree(entries in versions(), purge in 0..7u64, depth in 0..10u32) {
        let mut r = Replica::new(TokenRange::FULL, depth);
        for e in &entries {
            r.merge(e.clone());
            // re-putting the same version changes nothing
            r.merge(e.clone());
        }
        r.purge_tombstones_before(purge);
        prop_assert_eq!(r.tree(), &r.rebuilt_tree());
        let direct = MerkleTree::build(TokenRange::FULL, depth, std::iter::empty());
        prop_assert_eq!(r.is_empty(), r.tree() == &direct);
    }

    #[test]
    fn repair_makes_both_the_lww_merge_and_a_second_repair_is_idle(
        xs in versions(), ys in versions(), row_level in any::<bool>(), seed in any::<u64>(), depth in 0..9u32,
        set in any::<bool>()
    ) {
        let (mut a, mut b) = (replica_of(&xs, depth), replica_of(&ys, depth));
        let mut c = cfg(seed, row_level);
        c.set_reconciliation = set;
        repair(&mut a, &mut b, c);
        let want = reference(&[&xs, &ys]);
        prop_assert_eq!(contents(&a), want.clone());
        prop_assert_eq!(contents(&b), want);
        c.seed ^= 1;
        let again = repair(&mut a, &mut b, c);
        prop_assert_eq!((again.hashes_compared, again.entries_streamed(), again.set_cells), (1, 0, 0));
    }

    #[test]
    fn the_outcome_does_not_depend_on_who_initiates(xs in versions(), ys in versions(), row_level in any::<bool>()) {
        let (mut a1, mut b1) = (replica_of(&xs, 6), replica_of(&ys, 6));
        let (mut a2, mut b2) = (replica_of(&xs, 6), replica_of(&ys, 6));
        repair(&mut a1, &mut b1, cfg(5, row_level));
        repair(&mut b2, &mut a2, cfg(5, row_level));
        prop_assert_eq!(contents(&a1), contents(&a2));
        prop_assert_eq!(contents(&b1), contents(&b2));
    }

    #[test]
    fn three_replicas_repaired_pairwise_in_every_order_end_identical(
        xs in versions(), ys in versions(), zs in versions(), row_level in any::<bool>()
    ) {
        let want = reference(&[&xs, &ys, &zs]);
        let pairs = [(0usize, 1usize), (1, 2), (0, 2)];
        let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
        for order in orders {
            let mut rs = [replica_of(&xs, 5), replica_of(&ys, 5), replica_of(&zs, 5)];
            for (n, &p) in order.iter().enumerate() {
                let (i, j) = pairs[p];
                let (left, right) = rs.split_at_mut(j);
                repair(&mut left[i], &mut right[0], cfg(n as u64, row_level));
            }
            for r in &rs {
                prop_assert_eq!(contents(r), want.clone(), "order {:?}", order);
            }
        }
    }

    #[test]
    fn message_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        let _ = Msg::decode(&bytes);
        let mut b = Replica::new(TokenRange::FULL, 3);
        let _ = drift_repair::session::Responder::new(1, 0).on_request(&mut b, &bytes);
    }
}
