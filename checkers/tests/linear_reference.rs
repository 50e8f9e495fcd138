//! The linearizability checker against a brute-force reference.
//!
//! The checker prunes hard (just-in-time placement, interchangeable
//! indeterminate ops, dominance, useless indeterminate ops dropped), cuts
//! a key into parts carrying the possible states across, and proves some
//! violations in one pass; the reference is plain WGL over (placed set,
//! state) with none of that. On small random register histories (up to
//! 16 ops, three values, so identical indeterminate ops are common) every
//! path must agree with it, and every explained core must be one: the
//! history with every other op of its window made indeterminate still
//! fails, and (for a minimal core judged from the states the history
//! carried there) making one more core op indeterminate lets it pass.
//! A fault planted in each path makes these checks fail.

use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::proofs::ProofPlant;
use drift_checkers::linear::segment::CarryPlant;
use drift_checkers::linear::{LinearReport, Linearizable, Plant, Tuning};
use drift_checkers::{CheckContext, Checker, History, Op, OpType, Process, Verdict};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::Path;

#[derive(Debug, Clone, Copy)]
enum RegOp {
    Read(Option<u8>),
    Write(u8),
    Cas(Option<u8>, u8),
}

fn apply(state: Option<u8>, op: RegOp) -> Option<Option<u8>> {
    match op {
        RegOp::Read(v) => (state == v).then_some(state),
        RegOp::Write(v) => Some(Some(v)),
        RegOp::Cas(a, b) => (state == a).then_some(Some(b)),
    }
}

fn json_of(v: Option<u8>) -> Value {
    v.map(|v| json!(v)).unwrap_or(Value::Null)
}

/// One step of a random script: which process acts and how.
type Step = (u8, u8, u8, u8);

struct Built {
    history: History,
    /// (op, invoke position, return position if ok)
    ops: Vec<(RegOp, usize, Option<usize>)>,
}

/// Interprets a script as a well-formed history of up to three concurrent
/// processes; a process whose op ends `info` retires and a fresh id
/// replaces it.
fn build(script: &[Step]) -> Built {
    let mut lines: Vec<Op> = Vec::new();
    let mut procs: [u64; 3] = [0, 1, 2];
    let mut next_proc = 3u64;
    let mut busy: [Option<(RegOp, usize)>; 3] = [None; 3];
    let mut ops = Vec::new();
    let push = |lines: &mut Vec<Op>, p: u64, kind: OpType, f: &str, value: Value| {
        let index = lines.len() as u64;
        lines.push(Op {
            index,
            time: index as i64,
            process: Process::Client(p),
            kind,
            f: f.into(),
            value,
            key: None,
            node: None,
            error: None,
        });
    };
    for &(who, what, value, result) in script {
        let slot = (who % 3) as usize;
        let p = procs[slot];
        let v = value % 3;
        match busy[slot].take() {
            None => {
                let (op, f, arg) = match what % 3 {
                    0 => (RegOp::Read(None), "read", Value::Null),
                    1 => (RegOp::Write(v), "write", json!(v)),
                    _ => {
                        let expected = if result % 4 == 0 { None } else { Some(result % 3) };
                        (RegOp::Cas(expected, v), "cas", json!([json_of(expected), v]))
                    }
                };
                push(&mut lines, p, OpType::Invoke, f, arg);
                busy[slot] = Some((op, lines.len() - 1));
            }
            Some((op, invoke)) => {
                let f = match op {
                    RegOp::Read(_) => "read",
                    RegOp::Write(_) => "write",
                    RegOp::Cas(..) => "cas",
                };
                let inv_value = lines[invoke].value.clone();
                match what % 4 {
                    0 | 1 => {
                        let (op, value) = match op {
                            RegOp::Read(_) => {
                                let seen = if result % 4 == 0 { None } else { Some(result % 3) };
                                (RegOp::Read(seen), json_of(seen))
                            }
                            other => (other, inv_value),
                        };
                        push(&mut lines, p, OpType::Ok, f, value);
                        ops.push((op, invoke, Some(lines.len() - 1)));
                    }
                    2 => push(&mut lines, p, OpType::Fail, f, inv_value),
                    _ => {
                        push(&mut lines, p, OpType::Info, f, inv_value);
                        if !matches!(op, RegOp::Read(_)) {
                            ops.push((op, invoke, None));
                        }
                        procs[slot] = next_proc;
                        next_proc += 1;
                    }
                }
            }
        }
    }
    for b in busy.iter().flatten() {
        if !matches!(b.0, RegOp::Read(_)) {
            ops.push((b.0, b.1, None));
        }
    }
    let n = lines.len() as u64;
    let history =
        History::from_ops(Path::new("prop.jsonl"), lines, (1..=n).collect()).expect("scripts build valid histories");
    Built { history, ops }
}

/// Plain WGL without pruning: depth-first over (placed ops, state), any
/// op placeable once every ok op that returned before its invoke is
/// placed; done when every ok op is placed (indeterminate ones optional).
fn reference_linearizable(ops: &[(RegOp, usize, Option<usize>)]) -> bool {
    assert!(ops.len() <= 63);
    let must: u64 = (0..ops.len()).filter(|&i| ops[i].2.is_some()).map(|i| 1u64 << i).sum();
    let mut seen = std::collections::HashSet::new();
    place(ops, must, 0, None, &mut seen)
}

fn place(
    ops: &[(RegOp, usize, Option<usize>)],
    must: u64,
    placed: u64,
    state: Option<u8>,
    seen: &mut std::collections::HashSet<(u64, Option<u8>)>,
) -> bool {
    if placed & must == must {
        return true;
    }
    if !seen.insert((placed, state)) {
        return false;
    }
    for k in 0..ops.len() {
        if placed & (1 << k) != 0 {
            continue;
        }
        let (op, invoke, _) = ops[k];
        let blocked = (0..ops.len()).any(|j| placed & (1 << j) == 0 && j != k && ops[j].2.is_some_and(|r| r < invoke));
        if blocked {
            continue;
        }
        if let Some(next) = apply(state, op) {
            if place(ops, must, placed | (1 << k), next, seen) {
                return true;
            }
        }
    }
    false
}

/// The paths the checker takes, each forced by its tuning.
fn paths(plant: Plant) -> Vec<(&'static str, Tuning)> {
    vec![
        (
            "default",
            Tuning {
                plant,
                ..Tuning::default()
            },
        ),
        (
            "parts of one op",
            Tuning {
                part_ops_min: Some(1),
                parts_only: true,
                plant,
                ..Tuning::default()
            },
        ),
        (
            "parts of two ops, no proofs",
            Tuning {
                part_ops_min: Some(2),
                parts_only: true,
                no_proofs: true,
                plant,
            },
        ),
    ]
}

fn checked(h: &History, tuning: Tuning) -> (Verdict, Option<LinearReport>) {
    let c = Linearizable {
        model: ModelKind::CasRegister,
        explain: true,
        init: serde_json::Value::Null,
        tuning,
    };
    let r = c.check(h, &CheckContext::new(None, 1 << 30)).unwrap();
    (r.verdict, serde_json::from_value(r.details).ok())
}

/// The ops as the reference sees them with the ok ops `weak` picks made
/// indeterminate (read-only ones dropped) and, when `cut` is given, only
/// what came before that return: ops open at it indeterminate, later ones
/// gone.
fn weakened(
    ops: &[(RegOp, usize, Option<usize>)],
    weak: impl Fn(usize) -> bool,
    cut: Option<usize>,
) -> Vec<(RegOp, usize, Option<usize>)> {
    ops.iter()
        .filter(|(_, invoke, _)| cut.is_none_or(|c| *invoke < c))
        .filter_map(|&(op, invoke, ret)| {
            let open_at_cut = ret.is_some_and(|r| cut.is_some_and(|c| r > c));
            if (ret.is_some() && weak(invoke)) || open_at_cut {
                (!matches!(op, RegOp::Read(_))).then_some((op, invoke, None))
            } else {
                Some((op, invoke, ret))
            }
        })
        .collect()
}

/// What is wrong with the checker on this history along one path, if
/// anything: a verdict unlike the reference's, or a core that is not one.
fn judge_path(built: &Built, tuning: Tuning) -> Option<String> {
    let want = if reference_linearizable(&built.ops) {
        Verdict::Valid
    } else {
        Verdict::Invalid
    };
    let (got, report) = checked(&built.history, tuning);
    if got != want {
        return Some(format!("verdict {got:?}, reference {want:?}"));
    }
    let v = report.as_ref()?.violations.first()?;
    let core: Vec<usize> = v.core.iter().map(|o| o.invoke_index as usize).collect();
    let after = v.after_index.map(|a| a as usize);
    let in_window = |invoke: usize| after.is_none_or(|a| invoke > a);
    let others = weakened(&built.ops, |i| in_window(i) && !core.contains(&i), None);
    if reference_linearizable(&others) {
        return Some(format!(
            "core {core:?} (after {after:?}) is not one: the rest of its window lets it pass"
        ));
    }
    if v.minimal && !v.any_state {
        let cut = v.failing.complete_index.map(|c| c as usize);
        let failing = v.failing.invoke_index as usize;
        for &c in core.iter().filter(|&&c| c != failing) {
            let fewer = weakened(&built.ops, |i| in_window(i) && (i == c || !core.contains(&i)), cut);
            if !reference_linearizable(&fewer) {
                return Some(format!(
                    "core {core:?} is called minimal, but it fails without the op invoked at {c}"
                ));
            }
        }
    }
    None
}

fn search_verdict(h: &History) -> Verdict {
    checked(h, Tuning::default()).0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn search_agrees_with_brute_force(script in prop::collection::vec((0u8..3, any::<u8>(), any::<u8>(), any::<u8>()), 1..40)) {
        let built = build(&script);
        prop_assume!(built.ops.len() <= 16);
        let want = if reference_linearizable(&built.ops) { Verdict::Valid } else { Verdict::Invalid };
        prop_assert_eq!(search_verdict(&built.history), want);
        for (path, tuning) in paths(Plant::None) {
            let wrong = judge_path(&built, tuning);
            prop_assert!(wrong.is_none(), "{}: {}", path, wrong.unwrap_or_default());
        }
    }
}

/// Deterministic scripts (the generator check below uses the same).
fn scripts(n: usize, len: usize) -> Vec<Vec<Step>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let b = x.to_le_bytes();
                    (b[0] % 3, b[1], b[2], b[3])
                })
                .collect()
        })
        .collect()
}

/// A planted fault is caught: on some of 2000 scripts, some path's
/// verdict or core is wrong.
fn caught(plant: Plant) -> usize {
    let mut wrong = 0;
    for script in scripts(2000, 30) {
        let built = build(&script);
        if built.ops.len() > 16 {
            continue;
        }
        wrong += paths(plant)
            .into_iter()
            .filter(|(_, t)| judge_path(&built, *t).is_some())
            .count();
    }
    eprintln!("{plant:?}: {wrong}");
    wrong
}

#[test]
fn without_a_planted_fault_nothing_is_wrong() {
    assert_eq!(caught(Plant::None), 0);
}

#[test]
fn a_proof_that_counts_concurrent_writers_as_late_is_caught() {
    assert!(caught(Plant::Proof(ProofPlant::LaterThanInvoke)) > 0);
}

#[test]
fn a_proof_that_forgets_the_initial_state_is_caught() {
    assert!(caught(Plant::Proof(ProofPlant::IgnoreInit)) > 0);
}

#[test]
fn carrying_one_way_out_of_a_part_is_caught() {
    assert!(caught(Plant::Carry(CarryPlant::FirstEndOnly)) > 0);
}

#[test]
fn forgetting_indeterminate_ops_too_early_is_caught() {
    assert!(caught(Plant::Carry(CarryPlant::ForgetEarly)) > 0);
}

#[test]
fn a_window_judged_from_the_initial_state_only_is_caught() {
    assert!(caught(Plant::WindowFromInitOnly) > 0);
}

#[test]
fn generated_histories_cover_both_verdicts_and_indeterminate_ops() {
    // A sanity check on the generator, so the property above cannot pass
    // by only ever producing one kind of history.
    let mut seen = [0usize; 2];
    let mut with_info = 0;
    for script in scripts(2000, 30) {
        let built = build(&script);
        if built.ops.len() > 16 {
            continue;
        }
        with_info += built.history.operations.iter().any(|o| o.outcome.is_indeterminate()) as usize;
        seen[reference_linearizable(&built.ops) as usize] += 1;
    }
    assert!(seen[0] > 50 && seen[1] > 50, "verdicts {seen:?}");
    assert!(with_info > 100, "{with_info} histories with indeterminate ops");
}

/// Scripts the proptest above once failed on, kept as plain tests (the
/// regressions file keeps seeds, which a change of generator loses).
#[test]
fn recorded_failures_stay_fixed() {
    let recorded: &[&[Step]] = &[
        // "default: core [1, 10] (after None) is not one: the rest of its
        // window lets it pass"
        &[
            (2, 8, 29, 192),
            (0, 28, 178, 0),
            (2, 3, 0, 0),
            (1, 26, 92, 2),
            (2, 0, 0, 0),
            (2, 0, 0, 47),
            (2, 29, 189, 11),
            (0, 208, 0, 0),
            (2, 8, 0, 0),
            (1, 0, 0, 0),
            (1, 3, 0, 0),
            (0, 31, 233, 0),
            (1, 28, 0, 27),
        ],
    ];
    for script in recorded {
        let built = build(script);
        let want = if reference_linearizable(&built.ops) {
            Verdict::Valid
        } else {
            Verdict::Invalid
        };
        assert_eq!(search_verdict(&built.history), want, "{script:?}");
        for (path, tuning) in paths(Plant::None) {
            if let Some(wrong) = judge_path(&built, tuning) {
                panic!("{path}: {wrong} on {script:?}");
            }
        }
    }
}
