//! The convergence checker, rule by rule: for each, a history that keeps
//! the rule and one that breaks it, written by hand.

use drift_checkers::convergence::Convergence;
use drift_checkers::history::{Op, OpType, Process};
use drift_checkers::{CheckContext, Checker, History, Verdict};
use serde_json::{json, Value};
use std::path::Path;

/// A history written by hand: times in milliseconds; one process per
/// client operation.
#[derive(Default)]
struct H {
    ops: Vec<(i64, Op)>,
    next_process: u64,
}

/// A replica's final version of a key: (key, ts, value or None).
type Held<'a> = (&'a str, u64, Option<&'a str>);

impl H {
    fn new(gc: &str) -> H {
        let mut h = H::default();
        h.event(
            -1,
            "kv-config",
            json!({"rf": 3, "w": 2, "r": 1, "gc": gc, "gc_grace_ms": 1000}),
        );
        h
    }

    fn push(&mut self, t_ms: i64, p: Process, kind: OpType, f: &str, value: Value, key: Option<&str>) {
        self.ops.push((
            t_ms,
            Op {
                index: 0,
                time: t_ms * 1_000_000,
                process: p,
                kind,
                f: f.into(),
                value,
                key: key.map(Into::into),
                node: None,
                error: None,
            },
        ));
    }

    fn event(&mut self, t_ms: i64, f: &str, value: Value) -> &mut Self {
        self.push(t_ms, Process::Nemesis, OpType::Info, f, value, None);
        self
    }

    #[allow(clippy::too_many_arguments)]
    /// A client op on `key`: invoke at t0, completion (`ok`, `info`,
    /// `fail`, or `pending`) at t1.
    fn op(&mut self, key: &str, f: &str, invoke: Value, t0: i64, t1: i64, outcome: &str, done: Value) -> &mut Self {
        let p = Process::Client(self.next_process);
        self.next_process += 1;
        self.push(t0, p, OpType::Invoke, f, invoke, Some(key));
        let kind = match outcome {
            "ok" => OpType::Ok,
            "info" => OpType::Info,
            "fail" => OpType::Fail,
            "pending" => return self,
            o => panic!("{o}"),
        };
        self.push(t1, p, kind, f, done, Some(key));
        self
    }

    fn put(&mut self, key: &str, v: &str, ts: u64, t0: i64, t1: i64, outcome: &str) -> &mut Self {
        self.op(
            key,
            "put",
            json!({"value": v}),
            t0,
            t1,
            outcome,
            json!({"value": v, "ts": ts}),
        )
    }

    fn delete(&mut self, key: &str, ts: u64, t0: i64, t1: i64, outcome: &str) -> &mut Self {
        self.op(key, "delete", Value::Null, t0, t1, outcome, json!({"ts": ts}))
    }

    fn get(&mut self, key: &str, got: Option<(u64, Option<&str>)>, t0: i64, t1: i64) -> &mut Self {
        let done = match got {
            None => json!({"value": null, "ts": null, "tombstone": false}),
            Some((ts, v)) => json!({"value": v, "ts": ts, "tombstone": v.is_none()}),
        };
        self.op(key, "get", Value::Null, t0, t1, "ok", done)
    }

    #[allow(clippy::too_many_arguments)]
    fn repair(
        &mut self,
        t_ms: i64,
        node: u64,
        peer: u64,
        started: u64,
        finished: u64,
        streamed: u64,
        pass: Option<u64>,
    ) -> &mut Self {
        self.event(
            t_ms,
            "kv-repair",
            json!({"node": node, "peer": peer, "range": 0, "started_ts": started, "finished_ts": finished,
                "entries_to_peer": streamed, "entries_from_peer": 0, "error": null, "pass": pass}),
        )
    }

    /// The final phase: both replicas of range 0 read holding `a` and
    /// `b`, and the second repair streaming `second` entries.
    fn finals(&mut self, a: &[Held], b: &[Held], second: u64) -> &mut Self {
        let dump = |server: u64, held: &[Held]| {
            let entries: Vec<Value> = held.iter().map(|(k, ts, v)| json!([k, ts, v])).collect();
            // the root stands for the content: equal content, equal root
            json!({"server": server, "ranges": [{"range": 0, "replicas": [1, 2], "root": format!("{entries:?}"),
                "count": held.len(), "entries": entries}]})
        };
        self.repair(900_000, 1, 2, 900, 901, 0, Some(1));
        self.event(900_100, "kv-replica", dump(1, a));
        self.event(900_100, "kv-replica", dump(2, b));
        self.repair(900_200, 1, 2, 902, 903, second, Some(2))
    }

    fn check(&mut self) -> (Verdict, Value) {
        let mut ops = std::mem::take(&mut self.ops);
        ops.sort_by_key(|(t, _)| *t);
        let ops: Vec<Op> = ops
            .into_iter()
            .enumerate()
            .map(|(i, (_, mut op))| {
                op.index = i as u64;
                op
            })
            .collect();
        let n = ops.len() as u64;
        let h = History::from_ops(Path::new("(test)"), ops, (1..=n).collect()).unwrap();
        let r = Convergence.check(&h, &CheckContext::new(None, 1 << 30)).unwrap();
        (r.verdict, r.details)
    }
}

fn count(d: &Value, kind: &str) -> u64 {
    d["counts"][kind].as_u64().unwrap_or(0)
}

#[test]
fn rule_1_replicas_of_a_range_that_differ_after_the_final_repair_diverge() {
    let held: &[Held] = &[("k", 5, Some("v"))];
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .finals(held, held, 0)
        .check();
    assert_eq!((v, count(&d, "diverged")), (Verdict::Valid, 0), "{d}");
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .finals(held, &[], 0)
        .check();
    assert_eq!((v, count(&d, "diverged")), (Verdict::Invalid, 1), "{d}");
    assert!(
        d["findings"][0]["explanation"]
            .as_str()
            .unwrap()
            .contains("server 2 holds nothing"),
        "{d}"
    );
}

#[test]
fn rule_2_the_final_version_is_the_lww_winner_of_what_may_have_happened() {
    let ok: &[Held] = &[("k", 9, Some("b"))];
    // two acknowledged puts: the larger timestamp wins
    let (v, d) = H::new("time")
        .put("k", "a", 5, 0, 10, "ok")
        .put("k", "b", 9, 20, 30, "ok")
        .finals(ok, ok, 0)
        .check();
    assert_eq!(v, Verdict::Valid, "{d}");
    // the older one at the end: lost-update
    let old: &[Held] = &[("k", 5, Some("a"))];
    let (v, d) = H::new("time")
        .put("k", "a", 5, 0, 10, "ok")
        .put("k", "b", 9, 20, 30, "ok")
        .finals(old, old, 0)
        .check();
    assert_eq!((v, count(&d, "lost-update")), (Verdict::Invalid, 1), "{d}");
    // an indeterminate put may win with a timestamp nobody saw
    let info: &[Held] = &[("k", 12, Some("c"))];
    let (v, d) = H::new("time")
        .put("k", "b", 9, 20, 30, "ok")
        .put("k", "c", 0, 40, 50, "info")
        .finals(info, info, 0)
        .check();
    assert_eq!(v, Verdict::Valid, "{d}");
    // a value no put carried, or an acknowledged value with another ts
    for held in [&[("k", 12, Some("z"))][..], &[("k", 12, Some("b"))][..]] {
        let (v, d) = H::new("time")
            .put("k", "b", 9, 20, 30, "ok")
            .finals(held, held, 0)
            .check();
        assert_eq!((v, count(&d, "phantom")), (Verdict::Invalid, 1), "{held:?}: {d}");
    }
    // a failed put did not happen: its value at the end is a phantom
    let failed: &[Held] = &[("k", 3, Some("f"))];
    let (v, _) = H::new("time")
        .put("k", "f", 3, 0, 10, "fail")
        .put("k", "g", 1, 0, 10, "ok")
        .finals(failed, failed, 0)
        .check();
    assert_eq!(v, Verdict::Invalid);
    // an acknowledged put that nobody holds at the end is lost
    let (v, d) = H::new("time")
        .put("k", "b", 9, 20, 30, "ok")
        .finals(&[], &[], 0)
        .check();
    assert_eq!((v, count(&d, "lost-update")), (Verdict::Invalid, 1), "{d}");
}

#[test]
fn rule_2_a_write_that_finished_first_but_carries_the_larger_timestamp_is_skew_not_loss() {
    // the first write's coordinator ran ahead: it wins over the later one
    let first: &[Held] = &[("k", 50, Some("early"))];
    let (v, d) = H::new("time")
        .put("k", "early", 50, 0, 10, "ok")
        .put("k", "late", 20, 30, 40, "ok")
        .finals(first, first, 0)
        .check();
    assert_eq!((v, count(&d, "skew-lost-update")), (Verdict::Valid, 1), "{d}");
}

#[test]
fn rule_3_a_deleted_key_holding_its_old_value_is_resurrected_unless_gc_outran_repair() {
    let back: &[Held] = &[("k", 5, Some("v"))];
    let gone: &[Held] = &[("k", 8, None)];
    // the tombstone everywhere: fine; purged everywhere: fine too
    for held in [gone, &[][..]] {
        let (v, d) = H::new("time")
            .put("k", "v", 5, 0, 10, "ok")
            .delete("k", 8, 20, 30, "ok")
            .finals(held, held, 0)
            .check();
        assert_eq!(v, Verdict::Valid, "{d}");
    }
    // the old value back, no GC pass at all: a bug
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .delete("k", 8, 20, 30, "ok")
        .finals(back, back, 0)
        .check();
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
    // a time-based pass whose horizon passed the delete before any repair
    // after it: the documented cost of time-based GC
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .delete("k", 8, 20, 30, "ok")
        .event(
            40,
            "kv-gc",
            json!({"node": 1, "grace_ms": 0, "horizon_ts": 10, "purged": 1, "mode": "time"}),
        )
        .finals(back, back, 0)
        .check();
    assert_eq!((v, count(&d, "resurrected-expected")), (Verdict::Valid, 1), "{d}");
    // the same pass after two rounds of repair covered the delete: a bug
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .delete("k", 8, 20, 30, "ok")
        .repair(31, 1, 2, 9, 9, 1, None)
        .repair(32, 1, 2, 9, 9, 0, None)
        .event(
            40,
            "kv-gc",
            json!({"node": 1, "grace_ms": 0, "horizon_ts": 10, "purged": 1, "mode": "time"}),
        )
        .finals(back, back, 0)
        .check();
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
    // a repair-gated pass never excuses it
    let (v, d) = H::new("repair")
        .put("k", "v", 5, 0, 10, "ok")
        .delete("k", 8, 20, 30, "ok")
        .event(
            40,
            "kv-gc",
            json!({"node": 1, "grace_ms": 0, "horizon_ts": 10, "purged": 1, "mode": "repair"}),
        )
        .finals(back, back, 0)
        .check();
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
}

/// Rule 3 as revised: where the delete names the servers that
/// acknowledged it, one completed session after it between the replica
/// that missed it and one that acknowledged it covers the delete; a
/// session between two that both acknowledged it covers nothing.
#[test]
fn rule_3_one_session_from_a_holder_to_the_replica_that_missed_the_delete_covers_it() {
    let back: &[Held] = &[("k", 5, Some("v"))];
    let gc = json!({"node": 1, "grace_ms": 0, "horizon_ts": 10, "purged": 1, "mode": "time"});
    // range 0's replicas are servers 1 and 2 (see `finals`); 1 acknowledged
    let run = |sessions: &[(u64, u64)]| {
        let mut h = H::new("time");
        h.put("k", "v", 5, 0, 10, "ok").op(
            "k",
            "delete",
            Value::Null,
            20,
            30,
            "ok",
            json!({"ts": 8, "replicas": [1]}),
        );
        for (i, (a, b)) in sessions.iter().enumerate() {
            h.repair(31 + i as i64, *a, *b, 9, 9, 1, None);
        }
        h.event(40, "kv-gc", gc.clone()).finals(back, back, 0).check()
    };
    // one session between 2 (missed it) and 1 (holds it): covered, so the
    // value coming back is a bug
    let (v, d) = run(&[(2, 1)]);
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
    // no session: expected under time-based GC
    let (v, d) = run(&[]);
    assert_eq!((v, count(&d, "resurrected-expected")), (Verdict::Valid, 1), "{d}");
    // every replica acknowledged it: nothing to cover, the value back is a bug
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .op(
            "k",
            "delete",
            Value::Null,
            20,
            30,
            "ok",
            json!({"ts": 8, "replicas": [2, 1]}),
        )
        .event(40, "kv-gc", gc.clone())
        .finals(back, back, 0)
        .check();
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
    // a session that started before the delete covers nothing
    let (v, d) = {
        let mut h = H::new("time");
        h.put("k", "v", 5, 0, 10, "ok")
            .op(
                "k",
                "delete",
                Value::Null,
                20,
                30,
                "ok",
                json!({"ts": 8, "replicas": [1]}),
            )
            .repair(31, 2, 1, 7, 9, 1, None);
        h.event(40, "kv-gc", gc.clone()).finals(back, back, 0).check()
    };
    assert_eq!((v, count(&d, "resurrected-expected")), (Verdict::Valid, 1), "{d}");
}

#[test]
fn rule_4_a_second_repair_that_streams_anything_is_not_idempotent() {
    let held: &[Held] = &[("k", 5, Some("v"))];
    let (v, d) = H::new("time")
        .put("k", "v", 5, 0, 10, "ok")
        .finals(held, held, 3)
        .check();
    assert_eq!((v, count(&d, "repair-not-idempotent")), (Verdict::Invalid, 1), "{d}");
}

/// Rule 4 as revised: a session of the second pass that reports a
/// differing range is not idempotent even when it streamed nothing and the
/// replicas are also found diverged (rule 1).
#[test]
fn rule_4_a_second_pass_reporting_a_differing_range_is_not_idempotent_also_when_diverged() {
    let a: &[Held] = &[("k", 5, Some("v"))];
    let b: &[Held] = &[("k", 4, Some("u"))];
    let mut h = H::new("time");
    h.put("k", "v", 5, 0, 10, "ok").put("k", "u", 4, 0, 10, "info");
    h.repair(900_000, 1, 2, 900, 901, 0, Some(1));
    let dump = |server: u64, held: &[Held]| {
        let entries: Vec<Value> = held.iter().map(|(k, ts, v)| json!([k, ts, v])).collect();
        json!({"server": server, "ranges": [{"range": 0, "replicas": [1, 2], "root": format!("{entries:?}"),
            "count": held.len(), "entries": entries}]})
    };
    h.event(900_100, "kv-replica", dump(1, a));
    h.event(900_100, "kv-replica", dump(2, b));
    h.event(
        900_200,
        "kv-repair",
        json!({"node": 1, "peer": 2, "range": 0, "started_ts": 902, "finished_ts": 903,
            "entries_to_peer": 0, "entries_from_peer": 0, "ranges_differing": 1, "error": null, "pass": 2}),
    );
    let (v, d) = h.check();
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert_eq!(count(&d, "diverged"), 1, "{d}");
    assert_eq!(count(&d, "repair-not-idempotent"), 1, "{d}");
    let f = d["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "repair-not-idempotent")
        .unwrap();
    assert!(
        f["explanation"]
            .as_str()
            .unwrap()
            .contains("found 1 ranges differing and streamed 0 entries"),
        "{f}"
    );
}

#[test]
fn rule_5_a_quorum_read_after_an_acknowledged_write_sees_it_or_newer() {
    let held: &[Held] = &[("k", 9, Some("b"))];
    let config = json!({"rf": 3, "w": 2, "r": 2, "gc": "time"});
    let build = |got: Option<(u64, Option<&'static str>)>| {
        let mut h = H::default();
        h.event(-1, "kv-config", config.clone())
            .put("k", "a", 5, 0, 10, "ok")
            .put("k", "b", 9, 20, 30, "ok")
            .get("k", got, 40, 50)
            .finals(held, held, 0)
            .check()
    };
    assert_eq!(build(Some((9, Some("b")))).0, Verdict::Valid);
    let (v, d) = build(Some((5, Some("a"))));
    assert_eq!((v, count(&d, "stale-read")), (Verdict::Invalid, 1), "{d}");
    let (v, _) = build(None);
    assert_eq!(v, Verdict::Invalid, "nothing, after an acknowledged put");
    // R + W <= RF: reads are not judged
    let (v, d) = H::new("time")
        .put("k", "b", 9, 20, 30, "ok")
        .get("k", None, 40, 50)
        .finals(held, held, 0)
        .check();
    assert_eq!((v, d["reads_judged"].clone()), (Verdict::Valid, json!(false)), "{d}");
}

#[test]
fn rule_5_an_old_value_read_after_a_delete_is_expected_only_once_gc_could_purge_the_tombstone() {
    let gone: &[Held] = &[("k", 8, None)];
    let config = json!({"rf": 3, "w": 2, "r": 2, "gc": "time"});
    let build = |gc_before_read: bool| {
        let mut h = H::default();
        h.event(-1, "kv-config", config.clone())
            .put("k", "v", 5, 0, 10, "ok")
            .delete("k", 8, 20, 30, "ok");
        if gc_before_read {
            h.event(
                35,
                "kv-gc",
                json!({"node": 1, "grace_ms": 0, "horizon_ts": 9, "purged": 1, "mode": "time"}),
            );
        }
        h.get("k", Some((5, Some("v"))), 40, 50).finals(gone, gone, 0).check()
    };
    let (v, d) = build(true);
    assert_eq!((v, count(&d, "resurrected-expected")), (Verdict::Valid, 1), "{d}");
    let (v, d) = build(false);
    assert_eq!((v, count(&d, "stale-read")), (Verdict::Invalid, 1), "{d}");
}

#[test]
fn rule_6_without_final_reads_or_the_second_repair_the_verdict_is_unknown() {
    let (v, d) = H::new("time").put("k", "v", 5, 0, 10, "ok").check();
    assert_eq!(v, Verdict::Unknown, "{d}");
    let (v, _) = H::new("time").check();
    assert_eq!(v, Verdict::Unknown, "nothing written");
}

/// Rule 3 across clocks: a session's times are its initiator's, a GC
/// pass's its own server's. With the skew the history states, a session
/// that ended before the pass by less than the skew may have ended after
/// it: it does not cover the delete, and the value back is expected.
#[test]
fn rule_3_a_session_within_the_clock_skew_of_the_purge_does_not_cover_the_delete() {
    let back: &[Held] = &[("k", 5, Some("v"))];
    // the pass's clock: horizon 10 + grace 3 ms = 3_010 µs
    let gc = json!({"node": 1, "grace_ms": 3, "horizon_ts": 10, "purged": 1, "mode": "time"});
    let run = |skew_ms: u64| {
        let mut h = H::default();
        h.event(
            -1,
            "kv-config",
            json!({"rf": 3, "w": 2, "r": 1, "gc": "time", "gc_grace_ms": 3, "clock_skew_ms": skew_ms}),
        );
        h.put("k", "v", 5, 0, 10, "ok").op(
            "k",
            "delete",
            Value::Null,
            20,
            30,
            "ok",
            json!({"ts": 8, "replicas": [1]}),
        );
        // started at 2_000 µs, after the delete (8) by more than a
        // millisecond; ended at 2_100 on its own clock: 910 µs before
        // the pass
        h.repair(31, 2, 1, 2_000, 2_100, 1, None);
        h.event(40, "kv-gc", gc.clone()).finals(back, back, 0).check()
    };
    let (v, d) = run(0);
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
    let (v, d) = run(1);
    assert_eq!((v, count(&d, "resurrected-expected")), (Verdict::Valid, 1), "{d}");
}

/// Rule 3 when no pass logged the purge: a GC pass that purged nothing on
/// its server logs nothing, yet its horizon travels with repair sessions,
/// which purge by it. A replica's final GC horizon past the tombstone
/// counts as a purge as early as the grace after the delete (found by
/// `drift sim --workload delete --swarm`, seed 5275).
#[test]
fn rule_3_a_final_gc_horizon_past_the_tombstone_is_a_purge_a_grace_after_the_delete() {
    // grace 1 ms: a purge could come from 1_008 µs on
    let run = |covering_at: Option<u64>, horizon: u64| {
        let mut h = H::default();
        h.event(
            -1,
            "kv-config",
            json!({"rf": 3, "w": 2, "r": 1, "gc": "time", "gc_grace_ms": 1}),
        );
        h.put("k", "v", 5, 0, 10, "ok").op(
            "k",
            "delete",
            Value::Null,
            20,
            30,
            "ok",
            json!({"ts": 8, "replicas": [1]}),
        );
        if let Some(t) = covering_at {
            h.repair(40, 2, 1, t, t + 10, 1, None);
        }
        let entries = json!([["k", 5, "v"]]);
        for server in [1, 2] {
            h.event(
                900_100,
                "kv-replica",
                json!({"server": server, "ranges": [{"range": 0, "replicas": [1, 2], "root": "r", "count": 1,
                    "entries": entries, "gc_horizon": horizon}]}),
            );
        }
        h.repair(900_000, 1, 2, 5_000, 5_001, 0, Some(1));
        h.repair(900_200, 1, 2, 5_002, 5_003, 0, Some(2));
        h.check()
    };
    // no session before the grace ran out, a horizon past the tombstone:
    // the cost of GC by time
    let (v, d) = run(None, 10);
    assert_eq!((v, count(&d, "resurrected-expected")), (Verdict::Valid, 1), "{d}");
    // a covering session well inside the grace: the value back is a bug
    let (v, d) = run(Some(100), 10);
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
    // a horizon short of the tombstone purged nothing of it: a bug
    let (v, d) = run(None, 7);
    assert_eq!((v, count(&d, "resurrected")), (Verdict::Invalid, 1), "{d}");
}
