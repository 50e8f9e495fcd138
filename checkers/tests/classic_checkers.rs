//! The classic Jepsen checkers and their composition, on small histories
//! written out by hand.

use drift_checkers::counter::Counter;
use drift_checkers::queue::TotalQueue;
use drift_checkers::set::SetChecker;
use drift_checkers::stats::Stats;
use drift_checkers::unique_ids::UniqueIds;
use drift_checkers::{check_all, CheckContext, CheckResult, Checker, History, HistoryError, Verdict};
use serde_json::{json, Value};

/// (process, type, f, value) per line.
fn history(lines: &[(u64, &str, &str, Value)]) -> History {
    History::from_script(lines).unwrap()
}

fn check(c: &dyn Checker, h: &History) -> CheckResult {
    c.check(h, &CheckContext::new(None, 1 << 30)).unwrap()
}

const N: Value = Value::Null;

#[test]
fn unique_ids_flags_an_id_handed_out_twice() {
    let mut lines = vec![];
    for (p, id) in [(0, 1), (1, 2), (2, 1)] {
        lines.push((p, "invoke", "generate", N));
        lines.push((p, "ok", "generate", json!(id)));
    }
    let r = check(&UniqueIds, &history(&lines));
    assert_eq!(r.verdict, Verdict::Invalid);
    assert_eq!(r.details["duplicated"], json!([{"id": 1, "count": 2}]));
    lines.truncate(4);
    assert_eq!(check(&UniqueIds, &history(&lines)).verdict, Verdict::Valid);
}

#[test]
fn set_reports_lost_unexpected_and_recovered_elements() {
    let h = history(&[
        (0, "invoke", "add", json!(1)),
        (0, "ok", "add", json!(1)),
        (1, "invoke", "add", json!(2)),
        (1, "info", "add", json!(2)),
        (2, "invoke", "add", json!(3)),
        (2, "ok", "add", json!(3)),
        (3, "invoke", "read", N),
        (3, "ok", "read", json!([1, 2, 9])),
    ]);
    let r = check(&SetChecker, &h);
    assert_eq!(r.verdict, Verdict::Invalid);
    assert_eq!(r.details["lost"], json!([3]));
    assert_eq!(r.details["unexpected"], json!([9]));
    assert_eq!(r.details["recovered"], json!([2]));
}

#[test]
fn set_without_a_read_is_unknown() {
    let h = history(&[(0, "invoke", "add", json!(1)), (0, "ok", "add", json!(1))]);
    assert_eq!(check(&SetChecker, &h).verdict, Verdict::Unknown);
}

#[test]
fn counter_read_must_lie_within_certain_and_possible_adds() {
    let base = [
        (0, "invoke", "add", json!(5)),
        (0, "ok", "add", json!(5)),
        (1, "invoke", "add", json!(3)),
        (2, "invoke", "add", json!(-2)),
        (3, "invoke", "read", N),
    ];
    // 5 is certain; +3 and -2 are in flight: reads in [3, 8] are fine.
    for (seen, want) in [
        (3, Verdict::Valid),
        (8, Verdict::Valid),
        (2, Verdict::Invalid),
        (9, Verdict::Invalid),
    ] {
        let mut lines = base.to_vec();
        lines.push((3, "ok", "read", json!(seen)));
        let r = check(&Counter, &history(&lines));
        assert_eq!(r.verdict, want, "read {seen}: {}", r.details);
    }
}

#[test]
fn counter_ignores_failed_adds() {
    let h = history(&[
        (0, "invoke", "add", json!(5)),
        (0, "fail", "add", json!(5)),
        (3, "invoke", "read", N),
        (3, "ok", "read", json!(5)),
    ]);
    assert_eq!(check(&Counter, &h).verdict, Verdict::Invalid);
}

#[test]
fn total_queue_reports_lost_duplicated_unexpected_and_recovered() {
    let h = history(&[
        (0, "invoke", "enqueue", json!(1)),
        (0, "ok", "enqueue", json!(1)),
        (0, "invoke", "enqueue", json!(2)),
        (0, "ok", "enqueue", json!(2)),
        (1, "invoke", "enqueue", json!(3)),
        (1, "info", "enqueue", json!(3)),
        (0, "invoke", "enqueue", json!(4)),
        (0, "ok", "enqueue", json!(4)),
        (2, "invoke", "dequeue", N),
        (2, "ok", "dequeue", json!(1)),
        (2, "invoke", "drain", N),
        (2, "ok", "drain", json!([1, 3, 7, 4])),
    ]);
    let r = check(&TotalQueue, &h);
    assert_eq!(r.verdict, Verdict::Invalid);
    assert_eq!(r.details["lost"], json!([2]));
    assert_eq!(r.details["duplicated"], json!([1]));
    assert_eq!(r.details["unexpected"], json!([7]));
    assert_eq!(r.details["recovered"], json!([3]));
}

#[test]
fn stats_counts_per_f_lists_an_f_that_never_succeeded_and_fails_a_run_with_no_success() {
    let h = history(&[
        (0, "invoke", "read", N),
        (0, "ok", "read", json!(1)),
        (1, "invoke", "write", json!(2)),
        (1, "fail", "write", json!(2)),
        (2, "invoke", "write", json!(3)),
    ]);
    let r = check(&Stats, &h);
    assert_eq!(r.verdict, Verdict::Valid);
    assert_eq!(r.details["by_f"]["write"], json!({"ok": 0, "fail": 1, "info": 1}));
    assert_eq!(r.details["never_ok"], json!(["write"]));
    let nothing = history(&[(1, "invoke", "write", json!(2)), (1, "fail", "write", json!(2))]);
    assert_eq!(check(&Stats, &nothing).verdict, Verdict::Invalid);
    // in a campaign, final reads after the heal do not count
    let only_after_heal = history(&[
        (1, "invoke", "write", json!(2)),
        (1, "fail", "write", json!(2)),
        (0, "nemesis", "healed", json!({})),
        (2, "invoke", "read", N),
        (2, "ok", "read", json!(1)),
    ]);
    let r = check(&Stats, &only_after_heal);
    assert_eq!(r.verdict, Verdict::Invalid, "{}", r.details);
    assert_eq!(r.details["ok_before_heal"], 0);
}

struct Panics;

impl Checker for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn check(&self, _: &History, _: &CheckContext) -> Result<CheckResult, HistoryError> {
        panic!("checker bug")
    }
}

#[test]
fn a_panicking_checker_becomes_unknown_and_others_keep_their_verdicts() {
    let h = history(&[(0, "invoke", "generate", N), (0, "ok", "generate", json!(1))]);
    let checkers: Vec<Box<dyn Checker>> = vec![Box::new(UniqueIds), Box::new(Panics), Box::new(Stats)];
    let composed = check_all(&checkers, &h, &CheckContext::new(None, 1 << 30)).unwrap();
    assert_eq!(composed.verdict, Verdict::Unknown);
    assert_eq!(composed.results.len(), 3);
    assert_eq!(composed.results[0].verdict, Verdict::Valid);
    assert_eq!(composed.results[1].verdict, Verdict::Unknown);
    assert!(composed.results[1].reason.as_deref().unwrap().contains("checker bug"));
    assert_eq!(composed.results[2].verdict, Verdict::Valid);
}

#[test]
fn an_invalid_checker_outranks_a_panicking_one() {
    let h = history(&[
        (0, "invoke", "generate", N),
        (0, "ok", "generate", json!(1)),
        (1, "invoke", "generate", N),
        (1, "ok", "generate", json!(1)),
    ]);
    let checkers: Vec<Box<dyn Checker>> = vec![Box::new(Panics), Box::new(UniqueIds)];
    let composed = check_all(&checkers, &h, &CheckContext::new(None, 1 << 30)).unwrap();
    assert_eq!(composed.verdict, Verdict::Invalid);
}

#[test]
fn an_ok_drain_empties_the_queue_as_jepsen_says_and_a_partial_one_only_takes() {
    let enqueued = [
        (0, "invoke", "enqueue", json!(1)),
        (0, "ok", "enqueue", json!(1)),
        (0, "invoke", "enqueue", json!(2)),
        (0, "ok", "enqueue", json!(2)),
    ];
    let with = |tail: &[(u64, &str, &str, Value)]| {
        let mut lines = enqueued.to_vec();
        lines.extend_from_slice(tail);
        check(&TotalQueue, &history(&lines))
    };
    // one ok drain that returned everything: nothing lost, valid
    let r = with(&[(1, "invoke", "drain", N), (1, "ok", "drain", json!([1, 2]))]);
    assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.reason);
    // an ok drain emptied the queue: 2, acknowledged and not returned, is lost
    let r = with(&[(1, "invoke", "drain", N), (1, "ok", "drain", json!([1]))]);
    assert_eq!(r.verdict, Verdict::Invalid);
    assert_eq!(r.details["lost"], json!([2]));
    // a partial drain (info, with what it took) takes but proves nothing:
    // 2 may still be queued
    let r = with(&[(1, "invoke", "drain", N), (1, "info", "drain", json!([1]))]);
    assert_eq!(r.verdict, Verdict::Unknown, "{:?}", r.reason);
    // what a partial drain took counts as dequeued once an ok drain ends
    let r = with(&[
        (1, "invoke", "drain", N),
        (1, "info", "drain", json!([1])),
        (2, "invoke", "drain", N),
        (2, "ok", "drain", json!([2])),
    ]);
    assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.details);
    assert_eq!(r.details["dequeued"], json!(2));
}

#[test]
fn a_lost_element_is_excused_by_a_dequeue_of_unknown_outcome_but_only_one_each() {
    let lines = |unknown: usize| {
        let mut l = vec![
            (0, "invoke", "enqueue", json!(1)),
            (0, "ok", "enqueue", json!(1)),
            (0, "invoke", "enqueue", json!(2)),
            (0, "ok", "enqueue", json!(2)),
        ];
        for p in 0..unknown as u64 {
            // a dequeue whose delete may have happened, its reply lost
            l.push((10 + p, "invoke", "dequeue", N));
            l.push((10 + p, "info", "dequeue", N));
        }
        l.push((1, "invoke", "drain", N));
        l.push((1, "ok", "drain", json!([])));
        l
    };
    // both gone, two dequeues could have taken them: nothing proves a loss
    let r = check(&TotalQueue, &history(&lines(2)));
    assert_eq!(r.verdict, Verdict::Valid, "{:?}", r.reason);
    assert_eq!(r.details["lost_count"], json!(2));
    assert_eq!(r.details["unknown_dequeues"], json!(2));
    // one such dequeue takes one element at most: one is lost
    let r = check(&TotalQueue, &history(&lines(1)));
    assert_eq!(r.verdict, Verdict::Invalid);
    assert!(
        r.reason.as_deref().unwrap().contains("more than the 1 dequeues"),
        "{:?}",
        r.reason
    );
    assert_eq!(check(&TotalQueue, &history(&lines(0))).verdict, Verdict::Invalid);
}

#[test]
fn a_history_with_nothing_to_judge_is_never_valid() {
    use drift_checkers::ephemeral::Ephemeral;
    use drift_checkers::linear::model::ModelKind;
    use drift_checkers::linear::Linearizable;
    let lin = Linearizable {
        model: ModelKind::CasRegister,
        explain: false,
        init: serde_json::Value::Null,
        tuning: Default::default(),
    };
    // a run whose clients never got an op in (an empty file is refused
    // when read)
    let empty = history(&[(0, "nemesis", "kill", N), (0, "nemesis", "healed", N)]);
    let r = check(&Stats, &empty);
    assert_eq!(
        (r.verdict, r.reason.as_deref()),
        (Verdict::Unknown, Some("no operation was attempted: nothing to judge"))
    );
    for c in [
        &drift_checkers::dedup::Dedup as &dyn Checker,
        &drift_checkers::convergence::Convergence,
        &drift_checkers::perf::Perf,
        &UniqueIds,
        &Counter,
        &TotalQueue,
        &SetChecker,
        &Ephemeral,
        &lin,
    ] {
        assert_eq!(
            check(c, &empty).verdict,
            Verdict::Unknown,
            "{} on an empty history",
            c.name()
        );
    }
    // everything attempted, nothing acknowledged or read
    let failed = history(&[
        (0, "invoke", "generate", N),
        (0, "fail", "generate", N),
        (1, "invoke", "add", json!(1)),
        (1, "ok", "add", json!(1)),
        (2, "invoke", "create", json!("e1")),
        (2, "fail", "create", json!("e1")),
    ]);
    assert_eq!(check(&UniqueIds, &failed).verdict, Verdict::Unknown);
    assert_eq!(check(&Counter, &failed).verdict, Verdict::Unknown, "adds with no read");
}

#[test]
fn linearizability_is_checked_per_key() {
    use drift_checkers::linear::model::ModelKind;
    use drift_checkers::linear::{LinearReport, Linearizable};
    // Key "a" alone is fine and so is key "b"; mixed into one register the
    // read of 1 after the write of 2 would be stale.
    let mut h = history(&[
        (0, "invoke", "write", json!(1)),
        (0, "ok", "write", json!(1)),
        (1, "invoke", "write", json!(2)),
        (1, "ok", "write", json!(2)),
        (2, "invoke", "read", N),
        (2, "ok", "read", json!(1)),
    ]);
    let lin = Linearizable {
        model: ModelKind::CasRegister,
        explain: true,
        init: serde_json::Value::Null,
        tuning: Default::default(),
    };
    assert_eq!(check(&lin, &h).verdict, Verdict::Invalid);
    for (i, key) in ["a", "a", "b", "b", "a", "a"].iter().enumerate() {
        h.ops[i].key = Some((*key).into());
    }
    let r = check(&lin, &h);
    assert_eq!(r.verdict, Verdict::Valid);
    let report: LinearReport = serde_json::from_value(r.details).unwrap();
    assert_eq!(report.keys, 2);
    // and a stale read on one key makes the whole history invalid
    h.ops[5].value = json!(2);
    let r = check(&lin, &h);
    assert_eq!(r.verdict, Verdict::Invalid);
    let report: LinearReport = serde_json::from_value(r.details).unwrap();
    assert_eq!(report.keys_invalid, 1);
    assert_eq!(report.violations[0].key.as_deref(), Some("a"));
}
