//! Repair scenarios, each named after what it pins.

mod common;

use common::*;
use drift_repair::gc::{self, GcPolicy};
use drift_repair::session::{Initiator, Limits, Responder, SessionError, Step};
use drift_repair::wire::Msg;
use drift_repair::{Entry, Replica, TokenRange};

#[test]
fn the_reference_scenario_costs_what_classic_merkle_repair_costs() {
    // classic Merkle repair: 463 hashes and 815 entries at depth 12, 87,505 entries at
    // depth 4, 107 at depth 16 (50,000 keys, 33 divergent); ours vary
    // with the key choice, so check the expected spread
    for (depth, hashes, entries) in [
        (4u32, 20..=31, 75_000..=100_000),
        (12, 420..=500, 740..=960),
        (16, 640..=760, 80..=140),
    ] {
        let (mut a, mut b) = reference_scenario(50_000, 33, depth, 42);
        let r = repair(&mut a, &mut b, cfg(1, false));
        assert!(
            hashes.contains(&r.hashes_compared),
            "depth {depth}: {} hashes",
            r.hashes_compared
        );
        assert!(
            entries.contains(&r.entries_streamed()),
            "depth {depth}: {} entries",
            r.entries_streamed()
        );
        assert_eq!(contents(&a), contents(&b));
        assert_eq!(r.rounds, depth + 4, "hello, depth + 1 levels, stream, done");
    }
}

#[test]
fn row_level_round_streams_exactly_the_winners_within_4_kib() {
    for depth in [4u32, 12, 16] {
        let (mut a, mut b) = reference_scenario(50_000, 33, depth, 42);
        let (a0, b0) = (a.clone(), b.clone());
        let r = repair(&mut a, &mut b, cfg(1, true));
        assert_eq!(r.entries_streamed(), 33, "depth {depth}");
        assert!(
            r.reconciliation_bytes() <= 4096,
            "depth {depth}: {} bytes",
            r.reconciliation_bytes()
        );
        assert_eq!(contents(&a), contents(&b));
        // the same result as streaming whole ranges
        let (mut a1, mut b1) = (a0, b0);
        repair(&mut a1, &mut b1, cfg(2, false));
        assert_eq!(contents(&a1), contents(&a));
        // and a second session finds nothing: one hash, nothing streamed
        let again = repair(&mut a, &mut b, cfg(3, true));
        assert_eq!((again.hashes_compared, again.entries_streamed()), (1, 0));
    }
}

#[test]
fn single_divergent_key_costs_two_hashes_per_level_plus_the_root() {
    for depth in [4u32, 10, 15] {
        for row_level in [false, true] {
            let (mut a, mut b) = reference_scenario(5_000, 0, depth, 7);
            a.merge(Entry::put(b"key17", 9, b"new"));
            let r = repair(&mut a, &mut b, cfg(5, row_level));
            assert_eq!(r.hashes_compared, 2 * depth as u64 + 1, "depth {depth}");
            assert_eq!(r.hashes_sent, depth as u64 + 1, "siblings are derived, depth {depth}");
            assert_eq!(b.get(b"key17").unwrap().ts, 9);
        }
    }
}

#[test]
fn missed_delete_repaired_within_grace_stays_deleted() {
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 8), Replica::new(TokenRange::FULL, 8));
    a.merge(Entry::put(b"k", 1, b"v"));
    b.merge(Entry::put(b"k", 1, b"v"));
    a.merge(Entry::tombstone(b"k", 5)); // b missed the delete
    repair(&mut a, &mut b, cfg(1, true));
    assert!(b.get(b"k").unwrap().is_tombstone());
    // the grace has not passed at now = 12, so nothing is purged
    let policy = GcPolicy::Time { grace: 10 };
    assert_eq!(gc::collect(&mut a, &policy, 12), 0);
    assert_eq!(gc::collect(&mut a, &policy, 100), 1);
    assert_eq!(gc::collect(&mut b, &policy, 100), 1);
    repair(&mut a, &mut b, cfg(2, true));
    assert!(a.get(b"k").is_none() && b.get(b"k").is_none());
}

/// The documented failure mode of time-based GC: the replica that missed
/// the delete is not repaired within the grace period, the tombstone is
/// purged, and repair brings the old value back.
#[test]
fn time_gc_beyond_grace_resurrects_a_deleted_key() {
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 8), Replica::new(TokenRange::FULL, 8));
    a.merge(Entry::put(b"k", 1, b"v"));
    b.merge(Entry::put(b"k", 1, b"v"));
    a.merge(Entry::tombstone(b"k", 5));
    assert_eq!(gc::collect(&mut a, &GcPolicy::Time { grace: 10 }, 100), 1);
    repair(&mut a, &mut b, cfg(1, true));
    assert_eq!(a.get(b"k"), Some(Entry::put(b"k", 1, b"v")), "resurrected");
}

#[test]
fn repair_gated_gc_never_resurrects() {
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 8), Replica::new(TokenRange::FULL, 8));
    a.merge(Entry::put(b"k", 1, b"v"));
    b.merge(Entry::put(b"k", 1, b"v"));
    a.merge(Entry::tombstone(b"k", 5));
    let policy = GcPolicy::RepairGated {
        grace: 10,
        peers: vec![2],
    };
    assert_eq!(
        gc::collect(&mut a, &policy, 100),
        0,
        "b has not been repaired since the delete"
    );
    let mut c = cfg(1, true);
    c.started_ts = 100;
    repair(&mut a, &mut b, c);
    assert!(b.get(b"k").unwrap().is_tombstone());
    assert_eq!(gc::collect(&mut a, &policy, 120), 1, "now every peer has it");
    let b_policy = GcPolicy::RepairGated {
        grace: 10,
        peers: vec![1],
    };
    assert_eq!(gc::collect(&mut b, &b_policy, 120), 1);
    repair(&mut a, &mut b, cfg(2, true));
    assert!(a.get(b"k").is_none() && b.get(b"k").is_none());
}

#[test]
fn replicas_that_purged_at_different_times_agree_on_one_gc_before() {
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 8), Replica::new(TokenRange::FULL, 8));
    for r in [&mut a, &mut b] {
        r.merge(Entry::tombstone(b"gone", 5));
        r.merge(Entry::put(b"kept", 7, b"x"));
    }
    a.purge_tombstones_before(50); // a purged, b not yet
    let r = repair(&mut a, &mut b, cfg(1, true));
    assert_eq!(r.gc_before, 50);
    assert_eq!(r.entries_streamed(), 0, "the purged tombstone is not streamed back");
    assert!(b.get(b"gone").is_none(), "b purged below the session's gc_before");
    assert_eq!(a.tree().root(), b.tree().root());
}

#[test]
fn equal_timestamp_tombstone_beats_value_on_both_sides() {
    for row_level in [false, true] {
        let (mut a, mut b) = (Replica::new(TokenRange::FULL, 6), Replica::new(TokenRange::FULL, 6));
        a.merge(Entry::tombstone(b"k", 5));
        b.merge(Entry::put(b"k", 5, b"zzz"));
        b.merge(Entry::put(b"tie", 5, b"b"));
        a.merge(Entry::put(b"tie", 5, b"a"));
        repair(&mut b, &mut a, cfg(1, row_level));
        assert!(a.get(b"k").unwrap().is_tombstone() && b.get(b"k").unwrap().is_tombstone());
        assert_eq!(
            a.get(b"tie").unwrap().value.as_deref(),
            Some(&b"b"[..]),
            "larger value wins a tie"
        );
        assert_eq!(contents(&a), contents(&b));
    }
}

#[test]
fn extreme_timestamps_repair() {
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 6), Replica::new(TokenRange::FULL, 6));
    a.merge(Entry::put(b"zero", 0, b"z"));
    b.merge(Entry::put(b"max", u64::MAX, b"m"));
    b.merge(Entry::put(b"zero", 0, b"y"));
    a.merge(Entry::tombstone(b"max", u64::MAX));
    repair(&mut a, &mut b, cfg(9, true));
    assert_eq!(b.get(b"zero").unwrap().value.as_deref(), Some(&b"z"[..]));
    assert!(a.get(b"max").unwrap().is_tombstone());
    assert_eq!(contents(&a), contents(&b));
}

#[test]
fn keys_at_the_range_edges_repair() {
    // the whole ring: tokens 0 and 2^32 - 1
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 10), Replica::new(TokenRange::FULL, 10));
    for t in [0u32, u32::MAX] {
        a.merge(Entry::put(&key_with_token(1, t), 3, b"a"));
    }
    repair(&mut a, &mut b, cfg(4, true));
    assert_eq!(b.len(), 2);
    // a sub-range: tokens lo and hi - 1 are in, lo - 1 and hi are not
    let range = TokenRange::new(1_000_000, 2_000_000).unwrap();
    let (mut a, mut b) = (Replica::new(range, 10), Replica::new(range, 10));
    for t in [1_000_000u32, 1_999_999] {
        assert_eq!(
            a.merge(Entry::put(&key_with_token(2, t), 3, b"a")),
            drift_repair::replica::Merged::Applied
        );
    }
    for t in [999_999u32, 2_000_000] {
        assert_eq!(
            a.merge(Entry::put(&key_with_token(2, t), 3, b"a")),
            drift_repair::replica::Merged::OutOfRange
        );
    }
    repair(&mut a, &mut b, cfg(4, true));
    assert_eq!(contents(&a), contents(&b));
    assert_eq!(b.len(), 2);
}

#[test]
fn fifty_keys_on_one_token_repair_row_by_row() {
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 12), Replica::new(TokenRange::FULL, 12));
    let keys: Vec<Vec<u8>> = (0..50).map(|p| key_with_token(p, 0xdead_beef)).collect();
    for k in &keys {
        a.merge(Entry::put(k, 1, b"v"));
        b.merge(Entry::put(k, 1, b"v"));
    }
    a.merge(Entry::put(&keys[3], 2, b"a-newer"));
    b.merge(Entry::put(&keys[40], 2, b"b-newer"));
    b.merge(Entry::tombstone(&keys[41], 2));
    let r = repair(&mut a, &mut b, cfg(6, true));
    assert_eq!(r.entries_streamed(), 3);
    assert!(
        r.fingerprints_sent >= 50,
        "one token cannot be split: fingerprints decide"
    );
    assert_eq!(contents(&a), contents(&b));
}

/// Runs a session by hand; `between` runs after each reply of the
/// responder reaches the initiator, before the next request.
fn stepped(
    a: &mut Replica,
    b: &mut Replica,
    row_level: bool,
    mut between: impl FnMut(&Msg, &mut Replica, &mut Replica),
) {
    let (mut init, mut msg) = Initiator::start(a, 2, cfg(11, row_level));
    let mut resp = Responder::new(1, 1_000);
    loop {
        let reply = resp.on_request(b, &msg).unwrap();
        let step = init.on_reply(a, &reply).unwrap();
        between(&Msg::decode(&reply).unwrap(), a, b);
        match step {
            Step::Send(next) => msg = next,
            Step::Done(_) => return,
        }
    }
}

#[test]
fn a_write_racing_the_stream_survives() {
    let (mut a, mut b) = reference_scenario(2_000, 0, 8, 3);
    a.merge(Entry::put(b"key5", 2, b"from-a"));
    let mut raced = false;
    stepped(&mut a, &mut b, true, |reply, _, b| {
        if let Msg::Versions { versions, .. } = reply {
            // b listed its old version; a now streams ts 2; before it
            // arrives, a client writes ts 3 on b
            assert!(versions.iter().any(|v| v.key == b"key5" && v.ts == 1));
            b.merge(Entry::put(b"key5", 3, b"racing-local-write"));
            raced = true;
        }
    });
    assert!(raced);
    assert_eq!(
        b.get(b"key5").unwrap().value.as_deref(),
        Some(&b"racing-local-write"[..])
    );
    repair(&mut a, &mut b, cfg(12, true));
    assert_eq!(a.get(b"key5").unwrap().ts, 3);
}

#[test]
fn the_responder_counts_a_repair_only_once_the_initiator_merged_its_entries() {
    for row_level in [false, true] {
        let (mut a, mut b) = reference_scenario(2_000, 10, 8, 5);
        b.merge(Entry::tombstone(b"key3", 7)); // only b has the delete
        let (mut init, mut msg) = Initiator::start(&a, 2, cfg(15, row_level));
        let mut resp = Responder::new(1, 1_000);
        // b answers the stream with its entries; that reply is lost
        loop {
            let reply = resp.on_request(&mut b, &msg).unwrap();
            if matches!(Msg::decode(&reply).unwrap(), Msg::Entries { .. }) {
                break;
            }
            match init.on_reply(&mut a, &reply).unwrap() {
                Step::Send(next) => msg = next,
                Step::Done(_) => panic!("session ended before its stream"),
            }
        }
        assert_eq!(b.repaired_with(1), 0, "a never got b's tombstone");
        let gated = GcPolicy::RepairGated {
            grace: 1,
            peers: vec![1],
        };
        assert_eq!(gc::collect(&mut b, &gated, 5_000), 0, "the tombstone must stay");
        // a Done out of its turn is refused and counts nothing: before the
        // Hello, and in a session that has not streamed yet
        let done = Msg::Done.encode().bytes;
        assert!(Responder::new(1, 1_000).on_request(&mut b, &done).is_err());
        let (_, hello) = Initiator::start(&a, 2, cfg(15, row_level));
        let mut early = Responder::new(1, 1_000);
        early.on_request(&mut b, &hello).unwrap();
        assert!(early.on_request(&mut b, &done).is_err(), "a Done before the stream");
        assert_eq!(b.repaired_with(1), 0);
        // a whole session counts on both sides
        repair(&mut a, &mut b, cfg(16, row_level));
        assert_eq!((a.repaired_with(2), b.repaired_with(1)), (1_000, 1_000));
        assert!(a.get(b"key3").unwrap().is_tombstone());
    }
}

#[test]
fn fingerprints_name_their_keys_so_writes_between_rounds_do_not_shift_them() {
    // one token holds shared keys and keys only a has: fingerprints decide
    // which travel. After a sends them, a client writes keys that sort
    // first on that token; the bitmap b returns is about the keys sent,
    // not about whatever sits in those positions now.
    const T: u32 = 0x1234_5678;
    let (mut a, mut b) = (Replica::new(TokenRange::FULL, 12), Replica::new(TokenRange::FULL, 12));
    for p in 100..150 {
        a.merge(Entry::put(&key_with_token(p, T), 1, b"v"));
        b.merge(Entry::put(&key_with_token(p, T), 1, b"v"));
    }
    let only_a: Vec<Vec<u8>> = (200..210).map(|p| key_with_token(p, T)).collect();
    for k in &only_a {
        a.merge(Entry::put(k, 1, b"a"));
    }
    let (mut init, mut msg) = Initiator::start(&a, 2, cfg(17, true));
    let mut resp = Responder::new(1, 1_000);
    let mut raced = false;
    loop {
        if matches!(Msg::decode(&msg).unwrap(), Msg::Fingerprints { .. }) {
            for p in 0..20 {
                a.merge(Entry::put(&key_with_token(p, T), 2, b"late"));
            }
            raced = true;
        }
        let reply = resp.on_request(&mut b, &msg).unwrap();
        match init.on_reply(&mut a, &reply).unwrap() {
            Step::Send(next) => msg = next,
            Step::Done(_) => break,
        }
    }
    assert!(raced, "the session went through fingerprints");
    for k in &only_a {
        assert!(b.get(k).is_some(), "an entry b lacked never reached it");
    }
}

#[test]
fn an_interrupted_repair_rerun_converges() {
    for row_level in [false, true] {
        let (mut a, mut b) = reference_scenario(3_000, 20, 8, 5);
        // cut the session right before its last exchange
        let (mut init, mut msg) = Initiator::start(&a, 2, cfg(13, row_level));
        let mut resp = Responder::new(1, 1_000);
        loop {
            let is_stream = matches!(Msg::decode(&msg).unwrap(), Msg::Stream { .. });
            if is_stream {
                break; // the stream is lost
            }
            let reply = resp.on_request(&mut b, &msg).unwrap();
            match init.on_reply(&mut a, &reply).unwrap() {
                Step::Send(next) => msg = next,
                Step::Done(_) => panic!("session ended before its stream"),
            }
        }
        assert_ne!(contents(&a), contents(&b));
        repair(&mut a, &mut b, cfg(14, row_level));
        assert_eq!(contents(&a), contents(&b));
    }
}

#[test]
fn malformed_and_out_of_order_messages_are_errors_not_panics() {
    let mut b = Replica::new(TokenRange::FULL, 4);
    let mut resp = Responder::new(1, 0);
    assert!(resp.on_request(&mut b, &[]).is_err());
    assert!(resp.on_request(&mut b, &[99, 1, 2]).is_err());
    let level_first = Msg::Level {
        level: 0,
        hash_bytes: 6,
        hashes: vec![1],
        classes: vec![2],
    }
    .encode()
    .bytes;
    assert!(resp.on_request(&mut b, &level_first).is_err());
    // a range the replica does not hold (here: past the ring's end)
    let wrong_range = Msg::Hello {
        seed: 1,
        lo: 5,
        hi: 1 << 33,
        depth: 4,
        gc_before: 0,
        row_level: true,
        hash_bytes: 6,
    };
    let e = resp.on_request(&mut b, &wrong_range.encode().bytes).unwrap_err();
    assert!(e.to_string().contains("not within this replica's"), "{e}");
}

/// The test-only defect the convergence checker must catch: a repair that
/// writes the peer's version over its own instead of merging loses the
/// newer write. Off, the same repair keeps it on both sides.
#[test]
fn the_overwrite_defect_puts_an_older_version_over_a_newer_one() {
    for defect in [false, true] {
        let (mut a, mut b) = (Replica::new(TokenRange::FULL, 8), Replica::new(TokenRange::FULL, 8));
        for i in 0..20u64 {
            let k = format!("k{i}");
            a.merge(Entry::put(k.as_bytes(), 1, b"old"));
            b.merge(Entry::put(k.as_bytes(), 1, b"old"));
        }
        a.merge(Entry::put(b"k7", 9, b"new")); // b missed it
        a.defect_repair_overwrites = defect;
        repair(&mut a, &mut b, cfg(3, true));
        let want = if defect { (1, &b"old"[..]) } else { (9, &b"new"[..]) };
        for r in [&a, &b] {
            let e = r.get(b"k7").unwrap();
            assert_eq!((e.ts, e.value.as_deref().unwrap()), want, "defect {defect}");
        }
    }
}

/// Set reconciliation (an invertible Bloom lookup table sized from a
/// sketch) on the reference scenario: the three round trips of a hello,
/// a stream and a done, and under 1 KiB of reconciliation.
#[test]
fn set_reconciliation_repairs_the_reference_scenario_in_3_round_trips_within_1_kib() {
    for depth in [4u32, 12, 16] {
        let (mut a, mut b) = reference_scenario(50_000, 33, depth, 42);
        let (a0, b0) = (a.clone(), b.clone());
        let mut c = cfg(1, true);
        c.set_reconciliation = true;
        let r = repair(&mut a, &mut b, c);
        assert!(!r.set_fallback && r.set_cells > 0, "depth {depth}: {r:?}");
        assert_eq!(r.rounds, 3, "depth {depth}");
        assert!(
            r.reconciliation_bytes() <= 1024,
            "depth {depth}: {} bytes",
            r.reconciliation_bytes()
        );
        assert_eq!(contents(&a), contents(&b));
        let (mut x, mut y) = (a0, b0);
        repair(&mut x, &mut y, cfg(2, true));
        assert_eq!(contents(&x), contents(&a), "the same state as the walk's");
        // nothing left: the responder finds no differing bucket and the
        // walk's root says so
        let again = repair(&mut a, &mut b, c);
        assert_eq!((again.set_cells, again.entries_streamed()), (0, 0));
    }
}

/// A session between `a` (initiator, `limits_a`) and `b` (responder,
/// `limits_b`), both clocks at 1,000 µs.
fn limited(a: &mut Replica, b: &mut Replica, limits_a: Limits, limits_b: Limits) -> Result<(), SessionError> {
    let (mut init, mut msg) = Initiator::start(a, 2, cfg(3, true));
    init.set_limits(limits_a);
    let mut resp = Responder::new(1, 1_000).with_limits(limits_b);
    for _ in 0..64 {
        let reply = resp.on_request(b, &msg).unwrap_or_else(|e| Responder::error_reply(&e));
        match init.on_reply(a, &reply)? {
            Step::Send(next) => msg = next,
            Step::Done(_) => return Ok(()),
        }
    }
    Err(SessionError::RoundLimit)
}

#[test]
fn a_session_refuses_versions_and_horizons_past_its_limits_and_changes_nothing() {
    let tight = Limits {
        key_bytes_max: 16,
        value_bytes_max: 8,
        skew_us: 100,
    };
    let none = Limits::default();
    let base = || {
        let (mut a, mut b) = (Replica::new(TokenRange::FULL, 6), Replica::new(TokenRange::FULL, 6));
        for r in [&mut a, &mut b] {
            r.merge(Entry::put(b"k", 10, b"v"));
            r.merge(Entry::tombstone(b"gone", 20));
        }
        (a, b)
    };
    // versions stamped past the clock plus the skew, or over a limit:
    // refused by the side that would merge them, which keeps what it had
    for bad in [
        Entry::put(b"late", 1_000 + 101, b"v"),
        Entry::put(b"big", 30, b"123456789"),
        Entry::put(b"a-key-of-17-bytes", 30, b"v"),
    ] {
        let (mut a, mut b) = base();
        a.merge(bad.clone());
        let before = contents(&b);
        let e = limited(&mut a, &mut b, none, tight).unwrap_err();
        assert!(
            matches!(e, SessionError::Refused(ref why) if why.contains("refused entries")),
            "{e}"
        );
        assert_eq!(contents(&b), before, "{bad:?} reached the responder");
        // the other way round: the initiator refuses the responder's
        let (mut a, mut b) = base();
        b.merge(bad.clone());
        let before = contents(&a);
        let e = limited(&mut a, &mut b, tight, none).unwrap_err();
        assert!(
            matches!(e, SessionError::Protocol(ref why) if why.contains("refused entries")),
            "{e}"
        );
        assert_eq!(contents(&a), before, "{bad:?} reached the initiator");
    }
    // at the limits, the same session repairs
    let (mut a, mut b) = base();
    a.merge(Entry::put(b"sixteen-bytes-ok", 1_000 + 100, b"12345678"));
    limited(&mut a, &mut b, tight, tight).unwrap();
    assert_eq!(contents(&a), contents(&b));

    // a horizon past the clock: a forged hello purges nothing
    let (_, mut b) = base();
    let hello = Msg::Hello {
        seed: 1,
        lo: TokenRange::FULL.lo,
        hi: TokenRange::FULL.hi,
        depth: 6,
        gc_before: u64::MAX,
        row_level: true,
        hash_bytes: 6,
    };
    let mut resp = Responder::new(1, 1_000).with_limits(tight);
    let e = resp.on_request(&mut b, &hello.encode().bytes).unwrap_err();
    assert!(e.to_string().contains("GC horizon"), "{e}");
    assert!(b.get(b"gone").unwrap().is_tombstone());
    assert_eq!(b.gc_horizon(), 0);
    // ... nor one a responder answers with
    let (mut a, mut b) = base();
    b.purge_tombstones_before(u64::MAX);
    let e = limited(&mut a, &mut b, tight, none).unwrap_err();
    assert!(e.to_string().contains("GC horizon"), "{e}");
    assert!(a.get(b"gone").unwrap().is_tombstone());
    assert_eq!(a.gc_horizon(), 0);
}
