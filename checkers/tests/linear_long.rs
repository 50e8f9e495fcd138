//! The linearizability checker on long generated histories whose verdict
//! is known (`linear::synth`): each kind of injected violation is found,
//! explained by a small minimal core holding the injected op, on every
//! path; keys are judged independently, in parallel or not.

use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::synth::{generate, Inject, Spec};
use drift_checkers::linear::{LinearReport, Linearizable, Tuning};
use drift_checkers::{CheckContext, Checker, History, Op, OpType, Process, Verdict};
use serde_json::{json, Value};
use std::path::Path;

fn spec(inject: Inject, seed: u64) -> Spec {
    Spec {
        ops: 20_000,
        keys: 10,
        processes: 20,
        info: 0.005,
        inject,
        at: 0.75,
        seed,
    }
}

fn history(ops: Vec<Op>) -> History {
    let n = ops.len() as u64;
    History::from_ops(Path::new("long.jsonl"), ops, (1..=n).collect()).expect("pairs")
}

fn check(h: &History, tuning: Tuning, ctx: &CheckContext) -> (Verdict, LinearReport, Option<String>) {
    let c = Linearizable {
        model: ModelKind::CasRegister,
        explain: true,
        init: Value::Null,
        tuning,
    };
    let r = c.check(h, ctx).expect("well formed");
    (
        r.verdict,
        serde_json::from_value(r.details).expect("a report"),
        r.reason,
    )
}

fn ctx() -> CheckContext {
    CheckContext::new(None, 1 << 30)
}

#[test]
fn every_injected_violation_is_found_with_a_small_minimal_core() {
    let paths = [
        ("default", Tuning::default()),
        (
            "parts only, no proofs",
            Tuning {
                parts_only: true,
                no_proofs: true,
                ..Tuning::default()
            },
        ),
    ];
    for inject in [
        Inject::StaleRead,
        Inject::NeverWritten,
        Inject::WrittenLater,
        Inject::ImpossibleCas,
    ] {
        for seed in [1, 2] {
            let g = generate(&spec(inject, seed));
            let at = g.injected.expect("a place for the violation");
            let h = history(g.ops);
            for (path, tuning) in paths {
                let what = format!("{} seed {seed}, {path}", inject.name());
                let (verdict, report, _) = check(&h, tuning, &ctx());
                assert_eq!(verdict, Verdict::Invalid, "{what}");
                assert_eq!(report.keys_invalid, 1, "{what}");
                let v = &report.violations[0];
                assert_eq!(v.key, g.injected_key, "{what}");
                assert!(
                    v.core.iter().any(|o| o.complete_index == Some(at)),
                    "{what}: the core {:?} misses the injected op at {at}",
                    v.core
                );
                assert!(v.core.len() <= 20, "{what}: core of {}", v.core.len());
                assert!(v.minimal, "{what}: not minimal");
                if tuning.no_proofs {
                    assert_eq!(v.proof, None, "{what}");
                } else if inject != Inject::StaleRead {
                    assert_eq!(v.core.len(), 1, "{what}: a proof's core is its op");
                    assert!(v.proof.is_some(), "{what}");
                }
            }
        }
    }
}

#[test]
fn a_linearizable_long_history_passes_on_every_path() {
    let h = history(generate(&spec(Inject::None, 3)).ops);
    for tuning in [
        Tuning::default(),
        Tuning {
            parts_only: true,
            ..Tuning::default()
        },
        Tuning {
            parts_only: true,
            part_ops_min: Some(1),
            ..Tuning::default()
        },
    ] {
        let (verdict, report, reason) = check(&h, tuning, &ctx());
        assert_eq!(verdict, Verdict::Valid, "{tuning:?}: {reason:?}");
        assert_eq!(report.keys, 10);
    }
}

#[test]
fn keys_in_parallel_give_the_same_report() {
    let h = history(generate(&spec(Inject::StaleRead, 4)).ops);
    let (v1, mut r1, _) = check(&h, Tuning::default(), &ctx());
    let (v2, mut r2, _) = check(&h, Tuning::default(), &ctx().with_jobs(3));
    assert_eq!(v1, v2);
    r1.explain_ms = 0.0;
    r2.explain_ms = 0.0;
    assert_eq!(r1, r2);
}

/// Appends one history line on `key`.
fn push(ops: &mut Vec<Op>, key: &str, p: u64, kind: OpType, f: &str, value: Value) {
    ops.push(Op {
        index: ops.len() as u64,
        time: ops.len() as i64,
        process: Process::Client(p),
        kind,
        f: f.into(),
        value,
        key: Some(key.into()),
        node: None,
        error: None,
    });
}

/// A key no search can finish under a small memory cap: 14 writes of
/// distinct values, all concurrent, then two reads in a row of two of
/// them — no order of the writes explains both, and finding that out
/// means trying the orders.
fn hard_key(ops: &mut Vec<Op>, key: &str, first_process: u64) {
    for w in 0..14u64 {
        push(ops, key, first_process + w, OpType::Invoke, "write", json!(w + 1));
    }
    for w in 0..14u64 {
        push(ops, key, first_process + w, OpType::Ok, "write", json!(w + 1));
    }
    for v in [1, 2] {
        push(ops, key, first_process, OpType::Invoke, "read", Value::Null);
        push(ops, key, first_process, OpType::Ok, "read", json!(v));
    }
}

fn easy_key(ops: &mut Vec<Op>, key: &str, p: u64, read: u64) {
    push(ops, key, p, OpType::Invoke, "write", json!(1));
    push(ops, key, p, OpType::Ok, "write", json!(1));
    push(ops, key, p, OpType::Invoke, "read", Value::Null);
    push(ops, key, p, OpType::Ok, "read", json!(read));
}

#[test]
fn a_key_out_of_memory_leaves_the_others_judged() {
    for jobs in [1, 2] {
        let mut ops = Vec::new();
        easy_key(&mut ops, "a", 100, 1);
        hard_key(&mut ops, "b", 0);
        easy_key(&mut ops, "c", 101, 1);
        let h = history(ops);
        let small = CheckContext::new(None, 512 << 10).with_jobs(jobs);
        let (verdict, report, reason) = check(&h, Tuning::default(), &small);
        assert_eq!(verdict, Verdict::Unknown, "jobs {jobs}");
        assert_eq!(report.keys_unknown, 1, "jobs {jobs}");
        assert_eq!(report.unknown[0].0.as_deref(), Some("b"));
        assert!(report.unknown[0].1.contains("memory"), "{:?}", report.unknown);
        assert!(reason.unwrap().contains("(b)"));

        // the same hard key beside an invalid one: invalid, and the
        // undecided key is still listed
        let mut ops = Vec::new();
        easy_key(&mut ops, "a", 100, 7);
        hard_key(&mut ops, "b", 0);
        let (verdict, report, _) = check(&history(ops), Tuning::default(), &small);
        assert_eq!(verdict, Verdict::Invalid);
        assert_eq!(report.keys_invalid, 1);
        assert_eq!(report.unknown.len(), 1);
    }
    // with room, the hard key is judged: invalid
    let mut ops = Vec::new();
    hard_key(&mut ops, "b", 0);
    let (verdict, _, _) = check(&history(ops), Tuning::default(), &ctx());
    assert_eq!(verdict, Verdict::Invalid);
}
