//! The dedup checker, rule by rule: for each, a history that keeps the rule
//! and one that breaks it, written by hand.

use drift_checkers::dedup::{self, Dedup};
use drift_checkers::history::{Op, OpType, Process};
use drift_checkers::{CheckContext, Checker, History, Verdict};
use serde_json::{json, Value};
use std::path::Path;

/// A history written by hand: times in milliseconds, one process per
/// attempt (so any overlap is allowed).
#[derive(Default)]
struct H {
    ops: Vec<(i64, Op)>,
    next_process: u64,
}

type Row = (u64, &'static str, i64);

fn rows_json(rows: &[Row]) -> Value {
    json!(rows.iter().map(|(id, k, v)| json!([id, k, v])).collect::<Vec<_>>())
}

impl H {
    fn new(window: u64, window_s: f64, replicas: &[&str]) -> H {
        H::recorded(window, window_s, replicas, false)
    }

    /// Rule 6a: a history whose coordinator witnessed its block ids.
    fn with_witness(window: u64, window_s: f64, replicas: &[&str]) -> H {
        H::recorded(window, window_s, replicas, true)
    }

    fn recorded(window: u64, window_s: f64, replicas: &[&str], witness: bool) -> H {
        let mut h = H::default();
        h.push(
            -1,
            Process::Nemesis,
            OpType::Info,
            "dedup-window",
            json!({"window": window, "window_seconds": window_s, "epsilon_ms": 100, "replicas": replicas, "witness": witness}),
            None,
            None,
        );
        h
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        t_ms: i64,
        p: Process,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        error: Option<String>,
    ) {
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
                error,
            },
        ));
    }

    /// One attempt of logical insert `l`: blocks as (partition, rows).
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &mut self,
        l: u64,
        n: u64,
        token: Option<&str>,
        blocks: &[(&str, &[Row])],
        invoke_ms: i64,
        end_ms: i64,
        outcome: &str,
        code: Option<u64>,
    ) -> &mut Self {
        let p = self.next_process;
        self.next_process += 1;
        let blocks: Vec<Value> = blocks
            .iter()
            .map(|(part, rows)| json!({"partition": part, "rows": rows_json(rows)}))
            .collect();
        self.push(
            invoke_ms,
            Process::Client(p),
            OpType::Invoke,
            "insert",
            json!({"insert": l, "attempt": n, "query_id": format!("q{l}-{n}"), "replica": "r1", "token": token, "blocks": blocks}),
            None,
            None,
        );
        let kind = match outcome {
            "ok" => OpType::Ok,
            "fail" => OpType::Fail,
            "info" => OpType::Info,
            "pending" => return self,
            other => panic!("{other}"),
        };
        let value = match kind {
            OpType::Ok => json!({"written_blocks": 1, "deduplicated_blocks": 0}),
            _ => json!({"code": code}),
        };
        let error = code.map(|c| format!("Code: {c}. DB::Exception: …"));
        self.push(end_ms, Process::Client(p), kind, "insert", value, None, error);
        self
    }

    /// A simple single-block attempt in partition "0".
    fn simple(&mut self, l: u64, n: u64, rows: &[Row], invoke_ms: i64, end_ms: i64, outcome: &str) -> &mut Self {
        self.attempt(l, n, None, &[("0", rows)], invoke_ms, end_ms, outcome, None)
    }

    /// The server logged block id `id` for attempt `n` of `l`.
    fn logged(&mut self, l: u64, n: u64, id: &str, t_ms: i64) -> &mut Self {
        self.push(
            t_ms,
            Process::Nemesis,
            OpType::Info,
            dedup::BLOCK_OF_F,
            json!({"query_id": format!("q{l}-{n}"), "block_id": id}),
            None,
            None,
        );
        self
    }

    /// The coordinator created (`ctime_ms` Some) or removed block id `id`.
    fn witnessed(&mut self, id: &str, zxid: i64, ctime_ms: Option<i64>, t_ms: i64) -> &mut Self {
        let op = if ctime_ms.is_some() { "create" } else { "remove" };
        self.push(
            t_ms,
            Process::Nemesis,
            OpType::Info,
            dedup::WITNESS_F,
            json!({"op": op, "path": format!("/t/blocks/{id}"), "zxid": zxid, "ctime_ms": ctime_ms}),
            None,
            None,
        );
        self
    }

    fn read(&mut self, replica: &str, rows: &[Row], t_ms: i64) -> &mut Self {
        let p = self.next_process;
        self.next_process += 1;
        self.push(
            t_ms,
            Process::Client(p),
            OpType::Invoke,
            "read",
            Value::Null,
            Some(replica.into()),
            None,
        );
        self.push(
            t_ms + 1,
            Process::Client(p),
            OpType::Ok,
            "read",
            rows_json(rows),
            Some(replica.into()),
            None,
        );
        self
    }

    fn read_all(&mut self, replicas: &[&str], rows: &[Row]) -> &mut Self {
        for r in replicas {
            self.read(r, rows, 1_000_000);
        }
        self
    }

    fn check(&mut self) -> (Verdict, Value) {
        let mut ops: Vec<(i64, Op)> = std::mem::take(&mut self.ops);
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
        let r = Dedup.check(&h, &CheckContext::new(None, 1 << 30)).unwrap();
        (r.verdict, r.details)
    }
}

fn count(details: &Value, kind: &str) -> u64 {
    details["counts"][kind].as_u64().unwrap_or(0)
}

const R: [&str; 2] = ["r1", "r2"];
const A: &[Row] = &[(1, "a", 1), (2, "a", 2)];
const B: &[Row] = &[(3, "b", 1)];

#[test]
fn rule_1_definite_failures_are_absent_and_late_286s_are_indeterminate() {
    // 285 before anything: absent is right
    let (v, _) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A)], 0, 10, "fail", Some(285))
        .read_all(&R, &[])
        .check();
    assert_eq!(v, Verdict::Valid);
    // a multi-block 286 may have committed its first block: present is fine
    let (v, _) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A), ("1", B)], 0, 10, "fail", Some(286))
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid);
    // a single-block 286 cannot have committed: present is a phantom
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A)], 0, 10, "fail", Some(286))
        .read_all(&R, A)
        .check();
    assert_eq!((v, count(&d, "phantom") > 0), (Verdict::Invalid, true), "{d}");
}

#[test]
fn rule_2_a_row_nobody_inserted_is_a_phantom() {
    let (v, _) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid);
    let mut rows = A.to_vec();
    rows.push((99, "x", 0));
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read_all(&R, &rows)
        .check();
    assert_eq!(v, Verdict::Invalid);
    assert!(count(&d, "phantom") >= 1, "{d}");
}

#[test]
fn rule_3_a_block_half_there_is_torn() {
    // an indeterminate block whole, or wholly absent, is not torn
    for rows in [A, &[][..]] {
        let (v, d) = H::new(1000, 600.0, &R)
            .simple(1, 1, A, 0, 10, "info")
            .read_all(&R, rows)
            .check();
        assert_eq!((v, count(&d, "torn-block")), (Verdict::Valid, 0), "{d}");
    }
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .read_all(&R, &A[..1])
        .check();
    assert_eq!(v, Verdict::Invalid);
    assert!(count(&d, "torn-block") >= 1, "{d}");
}

#[test]
fn rule_4_replicas_that_disagree_after_sync_diverge() {
    // replicas agreeing on an indeterminate block, held or not
    for rows in [A, &[][..]] {
        let (v, d) = H::new(1000, 600.0, &R)
            .simple(1, 1, A, 0, 10, "info")
            .read("r1", rows, 1000)
            .read("r2", rows, 1000)
            .check();
        assert_eq!((v, count(&d, "diverged")), (Verdict::Valid, 0), "{d}");
    }
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .read("r1", A, 1000)
        .read("r2", &[], 1000)
        .check();
    assert_eq!(v, Verdict::Invalid);
    assert_eq!(count(&d, "diverged"), 1, "{d}");
    assert_eq!(count(&d, "lost"), 0, "an info insert may be absent");
}

#[test]
fn rule_5_an_acknowledged_key_missing_is_lost_and_after_a_swallowed_retry_lost_after_dedup() {
    // present once everywhere: neither lost nor lost-after-dedup
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read_all(&R, A)
        .check();
    assert_eq!((v, count(&d, "lost")), (Verdict::Valid, 0), "{d}");
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(1, 2, A, 20, 30, "ok")
        .read_all(&R, A)
        .check();
    assert_eq!((v, count(&d, "lost-after-dedup")), (Verdict::Valid, 0), "{d}");
    // missing on one replica only is still lost there
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read("r1", A, 1000)
        .read("r2", &[], 1000)
        .check();
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert!(count(&d, "lost") >= 1, "{d}");
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read_all(&R, &[])
        .check();
    assert_eq!((v, count(&d, "lost")), (Verdict::Invalid, 2), "{d}");
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(1, 2, A, 20, 30, "ok")
        .read_all(&R, &[])
        .check();
    assert_eq!((v, count(&d, "lost-after-dedup")), (Verdict::Invalid, 2), "{d}");
}

#[test]
fn rule_6_7_a_retry_inside_the_window_appears_once() {
    let mut twice = A.to_vec();
    twice.extend_from_slice(A);
    let (v, _) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(1, 2, A, 20, 30, "ok")
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid);
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(1, 2, A, 20, 30, "ok")
        .read_all(&R, &twice)
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
    let f = &d["findings"]["duplicate-in-window"][0];
    assert!(
        f["explanation"]
            .as_str()
            .unwrap()
            .contains("allow at most 0 removals of its id"),
        "{f}"
    );
    assert_eq!(f["attempts"].as_array().unwrap().len(), 2);
}

/// Rule 6 (ii) needs a non-empty interval and an attempt invoked inside
/// it: an unrelated insert whose reply was lost long before does not
/// excuse two equal inserts 30 ms apart, both stored.
#[test]
fn rule_6_an_earlier_info_of_another_key_does_not_excuse_a_duplicate_30_ms_apart() {
    let mut rows = A.to_vec();
    rows.extend_from_slice(A);
    rows.extend_from_slice(B);
    let (v, d) = H::new(1000, 5.0, &R)
        .simple(2, 1, B, 0, 10, "info")
        .simple(1, 1, A, 100, 110, "ok")
        .simple(3, 1, A, 130, 140, "ok")
        .read_all(&R, &rows)
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
    // the same, B's attempt invoked after the pair: it counts for neither
    let (v, d) = H::new(1000, 5.0, &R)
        .simple(1, 1, A, 100, 110, "ok")
        .simple(3, 1, A, 130, 140, "ok")
        .simple(2, 1, B, 200, 210, "info")
        .read_all(&R, &rows)
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
    // B invoked 6 s after the first A, before the second: the age clause
    // allows a removal (the window is 5 s)
    let (v, d) = H::new(1000, 5.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .simple(2, 1, B, 6_000, 6_010, "info")
        .simple(3, 1, A, 7_000, 7_010, "ok")
        .read_all(&R, &rows)
        .check();
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 2), "{d}");
}

/// Rule 6 in either commit order: the later-invoked attempt may commit
/// first when the earlier one is indeterminate, and the age clause then
/// counts from its invoke.
#[test]
fn rule_6_either_commit_order() {
    let mut rows = A.to_vec();
    rows.extend_from_slice(A);
    rows.extend_from_slice(B);
    // a: info at 0; b: ok at 7 s; another key at 8 s. Order a-then-b: B
    // came after 0 + 5 s and before b's commit? B is invoked at 8 s, after
    // b's commit: no. Order b-then-a: a may commit until the end; B after
    // 7 + 5 s? B's block may be created any time after 8 s (it is
    // indeterminate): yes. Two copies are possible.
    let (v, d) = H::new(1000, 5.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(1, 2, A, 7_000, 7_010, "ok")
        .simple(2, 1, B, 8_000, 8_010, "info")
        .read_all(&R, &rows)
        .check();
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 2), "{d}");
    // b ok, then a sent after b was acknowledged, within 5 s: only the
    // order b-then-a exists, and it allows no removal
    let (v, d) = H::new(1000, 5.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .simple(1, 2, A, 1_000, 1_010, "ok")
        .simple(2, 1, B, 8_000, 8_010, "info")
        .read_all(&R, &rows)
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
}

#[test]
fn rule_6_8_beyond_the_window_a_second_copy_is_unknown_window_and_a_third_a_duplicate() {
    // window of 2 ids: three other keys land between the attempts
    let build = |copies: usize| {
        let mut h = H::new(2, 600.0, &R);
        h.simple(1, 1, A, 0, 10, "info");
        for (i, id) in [10u64, 11, 12].iter().enumerate() {
            h.attempt(
                10 + i as u64,
                1,
                None,
                &[("0", &[(*id, "o", 0)][..])],
                20 + i as i64 * 10,
                25 + i as i64 * 10,
                "ok",
                None,
            );
        }
        h.simple(1, 2, A, 100, 110, "ok");
        let mut rows: Vec<Row> = vec![(10, "o", 0), (11, "o", 0), (12, "o", 0)];
        for _ in 0..copies {
            rows.extend_from_slice(A);
        }
        h.read_all(&R, &rows);
        h.check()
    };
    let (v, d) = build(2);
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 2), "{d}");
    let (v, d) = build(3);
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert!(count(&d, "duplicate") >= 1, "{d}");
}

#[test]
fn rule_6_a_deduplicated_attempt_does_not_renew_the_id() {
    // window of 4 ids. Attempt 1 creates A's id; attempt 2, deduplicated,
    // renews nothing; attempt 3 comes after 5 other keys since attempt 1
    // (but fewer than 4 since attempt 2 and fewer than 4 between 1 and
    // 2), so A's id may have been removed: a second copy is allowed (the
    // smoke campaign of seed 5289131680137391124 hit exactly this with
    // equal-content inserts).
    let build = |copies: usize| {
        let mut h = H::new(4, 600.0, &R);
        h.simple(1, 1, A, 0, 5, "ok");
        let mut rows: Vec<Row> = Vec::new();
        let mut t = 10;
        for id in 10u64..15 {
            if id == 13 {
                h.simple(1, 2, A, t, t + 5, "ok");
                t += 10;
            }
            h.attempt(id, 1, None, &[("0", &[(id, "o", 0)][..])], t, t + 5, "ok", None);
            rows.push((id, "o", 0));
            t += 10;
        }
        h.simple(1, 3, A, t, t + 5, "ok");
        for _ in 0..copies {
            rows.extend_from_slice(A);
        }
        h.read_all(&R, &rows);
        h.check()
    };
    let (v, d) = build(2);
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 2), "{d}");
    // three copies need two removals: one is all the chain allows
    let (v, d) = build(3);
    assert_eq!((v, count(&d, "duplicate")), (Verdict::Invalid, 2), "{d}");
}

#[test]
fn rule_9_time_alone_never_expires_an_id() {
    let mut twice = A.to_vec();
    twice.extend_from_slice(A);
    // a 1 s window, the retry 10 s later, nothing else inserted: one copy only
    let (v, d) = H::new(1000, 1.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(1, 2, A, 10_000, 10_010, "ok")
        .read_all(&R, &twice)
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
    // another block 5 s in: the first id may have expired
    let mut rows = twice.clone();
    rows.extend_from_slice(B);
    let (v, d) = H::new(1000, 1.0, &R)
        .simple(1, 1, A, 0, 10, "info")
        .simple(2, 1, B, 5_000, 5_010, "ok")
        .simple(1, 2, A, 10_000, 10_010, "ok")
        .read_all(&R, &rows)
        .check();
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 2), "{d}");
}

#[test]
fn rule_10_equal_content_without_tokens_shares_one_copy() {
    let mut twice = A.to_vec();
    twice.extend_from_slice(A);
    let (v, _) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .simple(2, 1, A, 20, 30, "ok")
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid);
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .simple(2, 1, A, 20, 30, "ok")
        .read_all(&R, &twice)
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
}

#[test]
fn rule_11_distinct_tokens_over_equal_content_are_two_copies() {
    let mut twice = A.to_vec();
    twice.extend_from_slice(A);
    let (v, _) = H::new(1000, 600.0, &R)
        .attempt(1, 1, Some("t1"), &[("0", A)], 0, 10, "ok", None)
        .attempt(2, 1, Some("t2"), &[("0", A)], 20, 30, "ok", None)
        .read_all(&R, &twice)
        .check();
    assert_eq!(v, Verdict::Valid);
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, Some("t1"), &[("0", A)], 0, 10, "ok", None)
        .attempt(2, 1, Some("t2"), &[("0", A)], 20, 30, "ok", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert!(count(&d, "lost") >= 1, "{d}");
}

#[test]
fn rule_12_a_reused_token_shows_only_the_first_data() {
    let (v, _) = H::new(1000, 600.0, &R)
        .attempt(1, 1, Some("t"), &[("0", A)], 0, 10, "ok", None)
        .attempt(2, 1, Some("t"), &[("0", B)], 20, 30, "ok", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid);
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, Some("t"), &[("0", A)], 0, 10, "ok", None)
        .attempt(2, 1, Some("t"), &[("0", B)], 20, 30, "ok", None)
        .read_all(&R, B)
        .check();
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert!(count(&d, "phantom") >= 1, "{d}");
    // reused after the window could have freed its id (2 ids, 3 other
    // keys between): the second data may stay beside the first, but a
    // third attempt's data inside that stretch still may not
    let build = |third: bool, visible: &[Row]| {
        let mut h = H::new(2, 600.0, &R);
        h.attempt(1, 1, Some("t"), &[("0", A)], 0, 10, "ok", None);
        for (i, id) in [10u64, 11, 12].iter().enumerate() {
            h.simple(
                10 + i as u64,
                1,
                &[(*id, "o", 0)],
                20 + i as i64 * 10,
                25 + i as i64 * 10,
                "ok",
            );
        }
        h.attempt(2, 1, Some("t"), &[("0", B)], 100, 110, "ok", None);
        if third {
            h.attempt(3, 1, Some("t"), &[("0", &[(9, "c", 9)][..])], 120, 130, "ok", None);
        }
        let mut rows: Vec<Row> = vec![(10, "o", 0), (11, "o", 0), (12, "o", 0)];
        rows.extend_from_slice(visible);
        h.read_all(&R, &rows);
        h.check()
    };
    let both: Vec<Row> = A.iter().chain(B).copied().collect();
    let (v, d) = build(false, &both);
    assert_eq!(v, Verdict::Valid, "{d}");
    assert_eq!(count(&d, "unknown-window"), 2, "{d}");
    let mut three = both.clone();
    three.push((9, "c", 9));
    let (v, d) = build(true, &three);
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert!(count(&d, "phantom") >= 1, "{d}");
}

/// Found by the simulator (`drift sim --workload insert-retry`, seed
/// 778): a reused token's second attempt was deduplicated against the
/// first data, the id was then freed by the window, and a third attempt
/// stored its data. Where the removal fell is known only as a range: it
/// may come after the second attempt, so the third's data may stand
/// beside the first's. The second's data may not (it never committed
/// first after a removal possible before it), nor may the first's be
/// missing with the others there.
#[test]
fn rule_12_a_removal_may_fall_after_a_deduplicated_attempt() {
    let build = |visible: &[Row]| {
        let mut h = H::new(2, 600.0, &R);
        h.attempt(1, 1, Some("t"), &[("0", A)], 0, 10, "ok", None);
        for (i, id) in [10u64, 11, 12].iter().enumerate() {
            h.simple(
                10 + i as u64,
                1,
                &[(*id, "o", 0)],
                20 + i as i64 * 10,
                25 + i as i64 * 10,
                "ok",
            );
        }
        h.attempt(2, 1, Some("t"), &[("0", B)], 100, 110, "ok", None);
        h.attempt(3, 1, Some("t"), &[("0", &[(9, "c", 9)][..])], 120, 130, "ok", None);
        let mut rows: Vec<Row> = vec![(10, "o", 0), (11, "o", 0), (12, "o", 0)];
        rows.extend_from_slice(visible);
        h.read_all(&R, &rows);
        h.check()
    };
    let c: &[Row] = &[(9, "c", 9)];
    let first_and_third: Vec<Row> = A.iter().chain(c).copied().collect();
    let (v, d) = build(&first_and_third);
    assert_eq!(v, Verdict::Valid, "{d}");
    let second_and_third: Vec<Row> = B.iter().chain(c).copied().collect();
    let (v, d) = build(&second_and_third);
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert!(count(&d, "phantom") >= 1, "{d}");
}

#[test]
fn rule_13_a_retry_with_another_split_is_nonidempotent() {
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, Some("t"), &[("0", &A[..1]), ("0", &A[1..])], 0, 10, "info", None)
        .attempt(1, 2, Some("t"), &[("0", A)], 20, 30, "ok", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Invalid);
    assert_eq!(count(&d, "nonidempotent-retry"), 1, "{d}");
    let (v, _) = H::new(1000, 600.0, &R)
        .attempt(1, 1, Some("t"), &[("0", &A[..1]), ("0", &A[1..])], 0, 10, "info", None)
        .attempt(1, 2, Some("t"), &[("0", &A[..1]), ("0", &A[1..])], 20, 30, "ok", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid, "the same split is a retry");
}

#[test]
fn rule_14_15_keys_are_judged_one_by_one() {
    // a 2-partition insert whose first partition was a duplicate
    let (v, _) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .attempt(2, 1, None, &[("0", A), ("1", B)], 20, 30, "ok", None)
        .read_all(&R, &[A, B].concat())
        .check();
    assert_eq!(v, Verdict::Valid);
    // an info multi-block attempt that committed its first block only
    let (v, _) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A), ("1", B)], 0, 10, "info", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid);
    // ... or its second only: any subset
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A), ("1", B)], 0, 10, "info", None)
        .read_all(&R, B)
        .check();
    assert_eq!(v, Verdict::Valid, "{d}");
    // an acknowledged 2-partition insert owes both partitions: one missing
    // is lost, judged on its own key
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A), ("1", B)], 0, 10, "ok", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Invalid, "{d}");
    assert_eq!(count(&d, "lost"), 2, "partition 1's block on each replica: {d}");
    // the same insert's first partition deduplicated against an earlier
    // one, and its second then missing
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .attempt(2, 1, None, &[("0", A), ("1", B)], 20, 30, "ok", None)
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Invalid, "{d}");
}

#[test]
fn rule_16_a_319_is_zero_or_one_copy_never_two() {
    for rows in [&[][..], A] {
        let (v, _) = H::new(1000, 600.0, &R)
            .attempt(1, 1, None, &[("0", A)], 0, 10, "info", Some(319))
            .read_all(&R, rows)
            .check();
        assert_eq!(v, Verdict::Valid);
    }
    let (v, d) = H::new(1000, 600.0, &R)
        .attempt(1, 1, None, &[("0", A)], 0, 10, "info", Some(319))
        .simple(1, 2, A, 20, 30, "ok")
        .read_all(&R, &[A, A].concat())
        .check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
}

#[test]
fn rule_17_a_partition_drop_resets_its_keys() {
    let mut h = H::new(1000, 600.0, &R);
    h.simple(1, 1, A, 0, 10, "ok");
    h.push(
        20,
        drift_checkers::Process::Client(500),
        OpType::Invoke,
        "drop-partition",
        json!({"partition": "0"}),
        None,
        None,
    );
    h.push(
        30,
        drift_checkers::Process::Client(500),
        OpType::Ok,
        "drop-partition",
        Value::Null,
        None,
        None,
    );
    // the same rows again after the drop: a new copy, the first one gone
    h.simple(1, 2, A, 40, 50, "ok");
    let (v, d) = h.read_all(&R, A).check();
    assert_eq!(v, Verdict::Valid, "{d}");
    // without the drop, absent would be lost
    let (v, _) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read_all(&R, &[])
        .check();
    assert_eq!(v, Verdict::Invalid);
}

#[test]
fn rule_18_nothing_to_judge_or_an_unread_replica_is_unknown() {
    // every replica read and every key once: valid
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read_all(&R, A)
        .check();
    assert_eq!(v, Verdict::Valid, "{d}");
    let (v, _) = H::new(1000, 600.0, &R).read_all(&R, &[]).check();
    assert_eq!(v, Verdict::Unknown);
    let (v, d) = H::new(1000, 600.0, &R)
        .simple(1, 1, A, 0, 10, "ok")
        .read("r1", A, 100)
        .check();
    assert_eq!(v, Verdict::Unknown, "{d}");
}

/// Rule 6a: a retry after a dropped reply, both stored. From the client's
/// side the indeterminate first attempt could have committed at any time
/// up to the end, after enough other ids to free its own: unknown-window.
/// The witness shows its id created once and never removed: the second
/// copy passed the check with the id present, a duplicate inside the
/// window.
#[test]
fn rule_6a_the_witness_makes_a_retry_after_a_dropped_reply_a_duplicate_in_window() {
    let mut twice = A.to_vec();
    twice.extend_from_slice(A);
    let others: Vec<(u64, Row)> = (0..4).map(|i| (10 + i, (100 + i, "o", 1))).collect();
    let build = |h: &mut H| {
        h.simple(1, 1, A, 0, 10, "info").logged(1, 1, "0_1_1", 5);
        for (l, row) in &others {
            let t = 20 + *l as i64 * 10;
            h.simple(*l, 1, std::slice::from_ref(row), t, t + 5, "ok");
        }
        h.simple(1, 2, A, 500, 510, "ok").logged(1, 2, "0_1_1", 505);
    };
    let mut rows = twice.clone();
    rows.extend(others.iter().map(|(_, r)| *r));
    // window of 2 ids: the client cannot rule a removal out
    let mut client = H::new(2, 600.0, &R);
    build(&mut client);
    let (v, d) = client.read_all(&R, &rows).check();
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 2), "{d}");
    assert_eq!(d["bound"]["kind"], "client", "{d}");
    // the coordinator made the id once and kept it
    let mut exact = H::with_witness(2, 600.0, &R);
    build(&mut exact);
    exact.witnessed("0_1_1", 1, Some(5), 6);
    let (v, d) = exact.read_all(&R, &rows).check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
    assert_eq!(count(&d, "unknown-window"), 0, "{d}");
    let why = d["findings"]["duplicate-in-window"][0]["explanation"].as_str().unwrap();
    assert!(why.contains("created 1× in the coordinator"), "{why}");
    assert_eq!(d["bound"]["kind"], "witness", "{d}");
}

/// Rule 6a: a second copy after a removal the window allowed is valid,
/// and not merely "unknown-window"; after a removal inside the window (an
/// id freed early, whoever freed it) it is a duplicate.
#[test]
fn rule_6a_a_removal_is_judged_against_the_window_when_it_was_applied() {
    let mut twice = A.to_vec();
    twice.extend_from_slice(A);
    let mut rows = twice.clone();
    rows.extend_from_slice(B);
    let build = |h: &mut H, b_ctime: i64| {
        h.simple(1, 1, A, 0, 10, "ok")
            .logged(1, 1, "0_1_1", 5)
            .witnessed("0_1_1", 1, Some(5), 6)
            .simple(2, 1, B, 20, 30, "ok")
            .logged(2, 1, "0_2_2", 25)
            .witnessed("0_2_2", 2, Some(b_ctime), 26)
            .witnessed("0_1_1", 3, None, 40)
            .simple(3, 1, A, 50, 60, "ok")
            .logged(3, 1, "0_1_1", 55)
            .witnessed("0_1_1", 4, Some(55), 56);
    };
    // window 1 id: B is as new as A, so A's removal was the window's
    let mut h = H::with_witness(1, 600.0, &R);
    build(&mut h, 25);
    let (v, d) = h.read_all(&R, &rows).check();
    assert_eq!((v, count(&d, "unknown-window")), (Verdict::Valid, 0), "{d}");
    // window 5 ids and 10 s: A removed with one newer id, 20 ms older
    let mut h = H::with_witness(5, 10.0, &R);
    build(&mut h, 25);
    let (v, d) = h.read_all(&R, &rows).check();
    assert_eq!((v, count(&d, "duplicate-in-window")), (Verdict::Invalid, 2), "{d}");
    assert_eq!(d["bound"]["removals_inside_the_window"], 1, "{d}");
    let why = d["findings"]["duplicate-in-window"][0]["explanation"].as_str().unwrap();
    assert!(why.contains("removed at zxid 0x3"), "{why}");
    // the same window, B created 11 s after A: the age clause allowed it
    let mut h = H::with_witness(5, 10.0, &R);
    build(&mut h, 11_005);
    let (v, d) = h.read_all(&R, &rows).check();
    assert_eq!(v, Verdict::Valid, "{d}");
}
