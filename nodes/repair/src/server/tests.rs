//! The kv server's decisions, without a network: servers exchange what
//! their drivers would carry, by hand.

use super::*;
use crate::coord::Round;
use crate::session::Step;

fn config(id: u64, servers: &[u64], gc: GcMode) -> ServerConfig {
    ServerConfig {
        id,
        ring: Ring::new(servers.to_vec(), 3).unwrap(),
        tree_depth: 6,
        w: 2,
        r: 2,
        gc,
        gc_grace_ms: 1_000,
        gc_interval_ms: 100,
        repair_interval_ms: 500,
        request_timeout_ms: 1_000,
        seed: 7,
    }
}

fn servers(gc: GcMode) -> Vec<KvServer> {
    let ids = [1, 2, 3];
    ids.iter()
        .map(|&id| {
            let cfg = config(id, &ids, gc);
            let store = KvStore::new(id, cfg.ring.clone(), cfg.tree_depth);
            KvServer::new(cfg, store)
        })
        .collect()
}

/// Runs a whole session of range `j` from `a` to `b` by hand.
fn repair(a: &mut KvServer, b: &mut KvServer, j: usize, wall_us: u64) -> Report {
    let mut out = a.start_session(wall_us, j, b.id()).unwrap();
    let mut msg = std::mem::take(&mut out.first);
    for _ in 0..SESSION_ROUNDS_MAX {
        let (reply, _, refused) = b
            .on_repair_message(wall_us, wall_us, j, a.id(), out.session, &msg)
            .unwrap();
        assert!(refused.is_none());
        match a.on_session_reply(&mut out, &reply).unwrap() {
            Step::Send(next) => msg = next,
            Step::Done(r) => return r,
        }
    }
    panic!("the session did not end");
}

#[test]
fn a_write_is_stamped_on_the_skewed_clock_and_never_goes_back() {
    let mut s = servers(GcMode::Time).remove(0);
    let r1 = s
        .begin_write(5_000_000, b"k".to_vec(), Some(b"v".to_vec()), None)
        .unwrap();
    assert_eq!(r1.entry().ts, 5_000_000);
    assert_eq!(r1.replicas().len(), 3, "every replica of the key is asked");
    assert_eq!(s.admin(0, "clock -2000").0, "ok");
    // two seconds back: the stamp still moves forward
    let r2 = s.begin_write(5_000_010, b"k".to_vec(), None, None).unwrap();
    assert_eq!(r2.entry().ts, 5_000_001);
    assert_eq!(s.now_ts(5_000_010), 3_000_010);
    assert_eq!(s.admin(0, "clock 0").0, "ok");
    assert_eq!(s.now_ts(5_000_010), 5_000_010);
}

#[test]
fn requests_outside_the_limits_are_refused_with_their_status() {
    let mut s = servers(GcMode::Time).remove(0);
    let refused = |r: Result<WriteRound, Refusal>| r.err().map(|r| r.status);
    assert_eq!(refused(s.begin_write(1, Vec::new(), None, None)), Some(400));
    assert_eq!(
        refused(s.begin_write(1, vec![b'k'; KEY_BYTES_MAX + 1], None, None)),
        Some(400)
    );
    assert_eq!(refused(s.begin_write(1, vec![0xff], None, None)), Some(400));
    assert_eq!(
        refused(s.begin_write(1, b"k".to_vec(), Some(vec![b'v'; VALUE_BYTES_MAX + 1]), None)),
        Some(413)
    );
    assert_eq!(
        refused(s.begin_write(1, b"k".to_vec(), Some(vec![0xc3]), None)),
        Some(400)
    );
    assert_eq!(refused(s.begin_write(1, b"k".to_vec(), None, Some(0))), Some(400));
    assert_eq!(refused(s.begin_write(1, b"k".to_vec(), None, Some(4))), Some(400));
    assert!(s.begin_read(b"k".to_vec(), Some(4)).is_err());
    assert_eq!(s.begin_read(b"k".to_vec(), Some(3)).unwrap().replicas().len(), 3);
    // a refused write takes no stamp
    assert_eq!(s.begin_write(9, b"k".to_vec(), None, None).unwrap().entry().ts, 9);
}

#[test]
fn a_peer_version_far_ahead_of_the_clock_is_refused_and_a_near_one_merged() {
    let mut s = servers(GcMode::Time).remove(0);
    let now = 100 * 1_000_000_000;
    let far = Entry::put(b"k", now + TS_SKEW_MAX_US + 1, b"v");
    let r = s.merge(now, far).unwrap_err();
    assert_eq!(r.status, 400);
    assert!(r.why.contains("ahead of this server's clock"), "{}", r.why);
    assert!(s.take_records().is_empty(), "nothing refused reaches the log");
    let near = Entry::put(b"k", now + TS_SKEW_MAX_US, b"v");
    assert_eq!(s.merge(now, near.clone()).unwrap(), Merged::Applied);
    assert_eq!(s.get(b"k").unwrap(), Some(near));
    assert_eq!(s.take_records().len(), 1, "the merge is one log record");
    // an older version loses and changes nothing
    assert_eq!(s.merge(now, Entry::put(b"k", 5, b"old")).unwrap(), Merged::Kept);
}

#[test]
fn a_written_key_reaches_a_replica_that_missed_it_through_repair_and_a_second_repair_streams_nothing() {
    let mut s = servers(GcMode::Time);
    let now = 50_000_000;
    let mut round = s[0]
        .begin_write(now, b"key".to_vec(), Some(b"v1".to_vec()), None)
        .unwrap();
    let e = round.entry().clone();
    // servers 1 and 2 apply it; server 3 misses it
    let mut res = None;
    for server in &mut s[..2] {
        let id = server.id();
        server.merge(now, e.clone()).unwrap();
        res = res.or(round.on_reply(id, Ok(())));
    }
    let res = res.expect("W = 2 acks decide the write");
    assert_eq!((res.acks, res.acked.clone()), (2, vec![1, 2]));
    assert_eq!(write_answer(b"key", &res).0, 200);
    assert_eq!(s[2].get(b"key").unwrap(), None);
    // any replica may start the session: rf is every server here
    let j = s[0].ring().range_of_key(b"key");
    let (a, b) = pair(&mut s, 0, 2);
    let report = repair(a, b, j, now);
    assert!(report.reconciliation_bytes() > 0);
    assert_eq!(s[2].get(b"key").unwrap(), Some(e.clone()));
    let (a, b) = pair(&mut s, 0, 2);
    let again = repair(a, b, j, now + 1);
    assert_eq!(
        (again.entries_a_to_b, again.entries_b_to_a, again.ranges.len()),
        (0, 0, 0),
        "converged replicas stream nothing"
    );
}

fn pair(s: &mut [KvServer], a: usize, b: usize) -> (&mut KvServer, &mut KvServer) {
    assert_ne!(a, b);
    if a < b {
        let (x, y) = s.split_at_mut(b);
        (&mut x[a], &mut y[0])
    } else {
        let (x, y) = s.split_at_mut(a);
        (&mut y[0], &mut x[b])
    }
}

#[test]
fn the_repair_plan_is_every_range_this_server_leads_with_every_other_replica() {
    let s = servers(GcMode::Time);
    let plan = s[0].repair_plan(None, None, 2).unwrap();
    let primary = s[0].ring().primary_of(1);
    assert_eq!(plan.len(), 2 * primary.len() * 2, "two rounds, two peers per range");
    assert!(plan.iter().all(|(j, p)| primary.contains(j) && *p != 1));
    let only = s[0].repair_plan(None, Some(&[3]), 1).unwrap();
    assert!(only.iter().all(|(_, p)| *p == 3));
    assert_eq!(s[0].repair_plan(None, None, 0).unwrap_err().status, 400);
    assert_eq!(
        s[0].repair_plan(None, None, REPAIR_ROUNDS_MAX + 1).unwrap_err().status,
        400
    );
    assert_eq!(s[0].repair_plan(Some(10_000), None, 1).unwrap_err().status, 400);
}

#[test]
fn a_repair_message_for_a_range_the_sender_does_not_replicate_is_refused() {
    let ids = [1, 2, 3, 4, 5];
    let cfg = config(1, &ids, GcMode::Time);
    let ring = cfg.ring.clone();
    let mut s = KvServer::new(cfg, KvStore::new(1, ring.clone(), 6));
    let j = ring
        .ranges_of(1)
        .into_iter()
        .find(|&j| !ring.replicas(j).contains(&5))
        .unwrap();
    let r = s.on_repair_message(0, 0, j, 5, 0, b"hello").unwrap_err();
    assert_eq!(r.status, 503);
    assert!(r.why.contains("holds no replica"), "{}", r.why);
}

#[test]
fn the_skip_repair_and_gc_faults_pause_the_scheduled_passes_and_a_forced_grace_purges() {
    let mut s = servers(GcMode::Time).remove(0);
    assert!(s.scheduled_repair());
    let (_, logs) = s.admin(0, "repair-off");
    assert_eq!(logs[0].event, "kv_repair_paused");
    assert!(!s.scheduled_repair());
    s.admin(0, "repair-on");
    assert!(s.scheduled_repair());

    let now = 100_000_000;
    s.merge(now, Entry::tombstone(b"gone", now - 500_000)).unwrap();
    // the policy's grace (1 s) keeps a tombstone half a second old
    assert_eq!(s.scheduled_gc(now).unwrap().0.purged, 0);
    assert_eq!(s.admin(now, "gc-off").0, "ok");
    assert!(s.scheduled_gc(now).is_none(), "paused");
    s.admin(now, "gc-on");
    // the gc-tombstones fault: every pass by a grace of 100 ms
    let (answer, logs) = s.admin(now, "gc-grace 100");
    assert_eq!(answer, format!("ok purged 1 horizon {}", now - 100_000));
    assert_eq!(logs[0].event, "kv_gc");
    assert_eq!(s.get(b"gone").unwrap(), None);
    assert_eq!(s.admin(now, "gc-grace off").0, "ok");
    assert!(s.admin(now, "gc-grace x").0.starts_with("error"));
    assert!(
        s.admin(now, "clock 1 2").0.starts_with("error"),
        "a hook takes its words and no more"
    );
}

#[test]
fn a_server_away_longer_than_the_grace_is_rebuilt_only_under_gc_by_time() {
    assert!(rebuild_after_absence(GcMode::Time, 1_000, 1_001));
    assert!(!rebuild_after_absence(GcMode::Time, 1_000, 1_000));
    assert!(!rebuild_after_absence(GcMode::Repair, 1_000, 1_000_000));
}

#[test]
fn a_read_answers_the_newest_of_r_replies_and_503_with_fewer() {
    let s = servers(GcMode::Time).remove(0);
    let mut round = s.begin_read(b"k".to_vec(), None).unwrap();
    let reps = round.replicas().to_vec();
    assert!(round.on_reply(reps[0], Ok(Some(Entry::put(b"k", 3, b"old")))).is_none());
    let res = round.on_reply(reps[1], Ok(Some(Entry::tombstone(b"k", 4)))).unwrap();
    let (status, v) = read_answer(b"k", &res);
    assert_eq!(status, 200);
    assert_eq!((v["tombstone"].as_bool(), v["ts"].as_u64()), (Some(true), Some(4)));
    let mut round = s.begin_read(b"k".to_vec(), None).unwrap();
    let res = round.timed_out(1_000);
    assert_eq!(read_answer(b"k", &res).0, 503);
}

/// Found by the simulator (`drift sim --workload delete`, seed 35 of the
/// first sweep): a server killed in the middle of a session starts its
/// session count again, and its first session after the restart reused
/// the id of the one its peer still held — the peer refused the new
/// hello as out of phase, and the replicas stayed apart. A hello begins
/// a session, whatever was held under its id.
#[test]
fn a_peer_restarted_mid_session_starts_a_new_session_under_an_old_id() {
    let mut s = servers(GcMode::Time);
    let now = 10_000_000;
    s[0].merge(now, Entry::put(b"key", 5, b"v")).unwrap();
    let j = s[0].ring().range_of_key(b"key");
    // server 1 sends its hello, gets the answer, and is killed
    let out = s[0].start_session(now, j, 3).unwrap();
    assert_eq!(out.session, 0);
    let (_, finished, _) = s[2].on_repair_message(now, now, j, 1, 0, &out.first).unwrap();
    assert!(!finished);
    let cfg = s[0].config().clone();
    let store = KvStore::new(1, cfg.ring.clone(), cfg.tree_depth);
    let mut restarted = KvServer::new(cfg, store);
    restarted.merge(now, Entry::put(b"key", 5, b"v")).unwrap();
    // its first session after the restart is session 0 again
    let report = repair(&mut restarted, &mut s[2], j, now + 1_000);
    assert!(report.entries_a_to_b >= 1, "{report:?}");
    assert_eq!(s[2].get(b"key").unwrap(), Some(Entry::put(b"key", 5, b"v")));
}

mod prop {
    use super::*;
    use crate::replica::Change;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// One step of a random history of three servers.
    #[derive(Debug, Clone)]
    enum Act {
        /// Server `by` coordinates a write of key `k` (a value, or a
        /// tombstone), which reaches the replicas in `reach` (a bit mask).
        Write { by: usize, k: u8, tomb: bool, reach: u8 },
        /// Server `s` crashes and starts again on the records it logged.
        Restart { s: usize },
        /// A repair session of `k`'s range between two servers.
        Repair { a: usize, b: usize, k: u8 },
    }

    fn act() -> impl Strategy<Value = Act> {
        prop_oneof![
            4 => (0..3usize, 0..6u8, any::<bool>(), 0..8u8).prop_map(|(by, k, tomb, reach)| Act::Write { by, k, tomb, reach }),
            1 => (0..3usize).prop_map(|s| Act::Restart { s }),
            2 => (0..3usize, 1..3usize, 0..6u8).prop_map(|(a, d, k)| Act::Repair { a, b: (a + d) % 3, k }),
        ]
    }

    proptest! {
        /// Against a reference (every version any server applied, LWW):
        /// no server ever applies a version older than the one it holds,
        /// a restart on the logged records loses nothing, and two full
        /// rounds of repair leave every server holding the reference's
        /// winner of every key.
        #[test]
        fn servers_never_go_back_and_two_rounds_of_repair_reach_the_lww_winner(
            acts in proptest::collection::vec(act(), 1..40),
        ) {
            let mut s = servers(GcMode::Repair);
            let mut logs: Vec<Vec<Record>> = vec![Vec::new(); 3];
            let mut newest: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
            let mut clock = 1_000_000u64;
            let drain = |s: &mut KvServer, log: &mut Vec<Record>| {
                for r in s.take_records() {
                    if let Change::Applied(e) = &r.change {
                        let held = log.iter().rev().find_map(|x| match &x.change {
                            Change::Applied(h) if h.key == e.key => Some(h.ts),
                            _ => None,
                        });
                        prop_assert!(held.is_none_or(|ts| ts <= e.ts), "went back on {:?}", e.key);
                    }
                    log.push(r);
                }
                Ok(())
            };
            for a in acts {
                clock += 1_000;
                match a {
                    Act::Write { by, k, tomb, reach } => {
                        let value = (!tomb).then(|| format!("v{clock}").into_bytes());
                        let round = s[by].begin_write(clock, format!("k{k}").into_bytes(), value, None).unwrap();
                        let e = round.entry().clone();
                        for i in (0..3).filter(|i| reach & (1 << i) != 0) {
                            s[i].merge(clock, e.clone()).unwrap();
                            drain(&mut s[i], &mut logs[i])?;
                            let cur = newest.entry(e.key.clone()).or_insert_with(|| e.clone());
                            if e.lww_cmp(cur) == std::cmp::Ordering::Greater {
                                *cur = e.clone();
                            }
                        }
                    }
                    Act::Restart { s: i } => {
                        let cfg = s[i].config().clone();
                        let mut fresh = KvServer::new(cfg.clone(), KvStore::new(cfg.id, cfg.ring.clone(), cfg.tree_depth));
                        fresh.replay(logs[i].clone());
                        prop_assert_eq!(fresh.store().dump(), s[i].store().dump());
                        s[i] = fresh;
                    }
                    Act::Repair { a, b, k } => {
                        let j = s[a].ring().range_of_key(format!("k{k}").as_bytes());
                        let (x, y) = pair(&mut s, a, b);
                        repair(x, y, j, clock);
                        drain(&mut s[a], &mut logs[a])?;
                        drain(&mut s[b], &mut logs[b])?;
                    }
                }
            }
            let ranges = s[0].ring().ranges();
            for _ in 0..2 {
                for j in 0..ranges {
                    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
                        clock += 1_000;
                        let (x, y) = pair(&mut s, a, b);
                        repair(x, y, j, clock);
                        drain(&mut s[a], &mut logs[a])?;
                        drain(&mut s[b], &mut logs[b])?;
                    }
                }
            }
            for server in &s {
                for (key, e) in &newest {
                    prop_assert_eq!(server.get(key).unwrap(), Some(e.clone()));
                }
            }
        }
    }
}
