//! The dedup checker against a reference simulation of the table.
//!
//! The simulation runs random insert attempts against a model of a correct
//! replicated table: each committing attempt, at a moment inside its
//! interval (an indeterminate one possibly after it), finds its block id or
//! creates it with its rows; a cleanup at random moments removes any ids
//! the window allows (only ids beyond the newest `window`, or older than
//! the newest id by more than `window_seconds`). Properties:
//!
//! * a correct table's history is always judged valid (no false alarm);
//! * a lost acknowledged block, a phantom row, or a retry duplicated while
//!   no other id could have pushed its id out is always judged invalid,
//!   with the finding the defect calls for.

use drift_checkers::dedup::Dedup;
use drift_checkers::history::{Op, OpType, Process};
use drift_checkers::{CheckContext, Checker, History, Verdict};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug)]
struct Logical {
    /// Rows: ids are unique unless `same_as` copies another's content.
    rows: Vec<u64>,
    token: Option<String>,
}

#[derive(Clone, Debug)]
struct Attempt {
    logical: usize,
    n: u64,
    t0: i64,
    t1: i64,
    /// `ok`, `info` or `fail`.
    outcome: &'static str,
    /// When it took effect, if it did.
    commit: Option<i64>,
}

/// What a simulated run produced.
#[derive(Debug)]
struct Run {
    logicals: Vec<Logical>,
    attempts: Vec<Attempt>,
    /// The table's rows at the end.
    rows: Vec<u64>,
    window: u64,
    window_s: f64,
}

fn key_of(l: &Logical) -> String {
    match &l.token {
        Some(t) => format!("0:{t}_0"),
        None => format!("0:{:?}", l.rows),
    }
}

/// Plays the attempts in commit order against a correct table.
fn play(
    logicals: &[Logical],
    attempts: &mut [Attempt],
    cleanups: &[(i64, u64)],
    window: u64,
    window_ns: i64,
) -> Vec<u64> {
    let mut ids: BTreeMap<String, i64> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut events: Vec<(i64, usize, bool)> = attempts
        .iter()
        .enumerate()
        .filter_map(|(i, a)| a.commit.map(|t| (t, i, false)))
        .collect();
    events.extend(cleanups.iter().enumerate().map(|(i, (t, _))| (*t, i, true)));
    events.sort();
    for (t, i, cleanup) in events {
        if cleanup {
            // any ids beyond what the window must keep may go
            let mut by_age: Vec<(i64, String)> = ids.iter().map(|(k, c)| (*c, k.clone())).collect();
            by_age.sort_by(|a, b| b.cmp(a));
            let newest = by_age.first().map(|x| x.0).unwrap_or(0);
            let keep = by_age
                .iter()
                .take(window as usize)
                .take_while(|(c, _)| *c >= newest - window_ns)
                .count();
            let seed = cleanups[i].1;
            for (j, (_, k)) in by_age.iter().enumerate().skip(keep) {
                if (seed >> (j % 64)) & 1 == 1 {
                    ids.remove(k);
                }
            }
            continue;
        }
        let l = &logicals[attempts[i].logical];
        let key = key_of(l);
        if let std::collections::btree_map::Entry::Vacant(e) = ids.entry(key) {
            e.insert(t);
            rows.extend(l.rows.iter().copied());
        }
    }
    rows
}

fn history(run: &Run, rows_by_replica: &[Vec<u64>]) -> History {
    let mut ops: Vec<(i64, Op)> = Vec::new();
    let op = |t: i64, p: Process, kind: OpType, f: &str, value: Value, key: Option<String>| {
        (
            t,
            Op {
                index: 0,
                time: t,
                process: p,
                kind,
                f: f.into(),
                value,
                key: key.map(Into::into),
                node: None,
                error: None,
            },
        )
    };
    let replicas: Vec<String> = (1..=rows_by_replica.len()).map(|i| format!("r{i}")).collect();
    ops.push(op(
        -1,
        Process::Nemesis,
        OpType::Info,
        "dedup-window",
        json!({"window": run.window, "window_seconds": run.window_s, "epsilon_ms": 0, "replicas": replicas}),
        None,
    ));
    let row = |id: u64| json!([id, "t", 1]);
    for (p, a) in run.attempts.iter().enumerate() {
        let l = &run.logicals[a.logical];
        let value = json!({
            "insert": a.logical, "attempt": a.n, "token": l.token,
            "blocks": [{"partition": "0", "rows": l.rows.iter().map(|&id| row(id)).collect::<Vec<_>>()}],
        });
        ops.push(op(
            a.t0,
            Process::Client(p as u64),
            OpType::Invoke,
            "insert",
            value,
            None,
        ));
        let kind = match a.outcome {
            "ok" => OpType::Ok,
            "fail" => OpType::Fail,
            _ => OpType::Info,
        };
        ops.push(op(a.t1, Process::Client(p as u64), kind, "insert", Value::Null, None));
    }
    let end = run
        .attempts
        .iter()
        .map(|a| a.t1.max(a.commit.unwrap_or(0)))
        .max()
        .unwrap_or(0)
        + 10;
    for (i, rows) in rows_by_replica.iter().enumerate() {
        let p = 1_000_000 + i as u64;
        let mut sorted = rows.clone();
        sorted.sort();
        ops.push(op(
            end,
            Process::Client(p),
            OpType::Invoke,
            "read",
            Value::Null,
            Some(replicas[i].clone()),
        ));
        ops.push(op(
            end + 1,
            Process::Client(p),
            OpType::Ok,
            "read",
            json!(sorted.iter().map(|&id| row(id)).collect::<Vec<_>>()),
            Some(replicas[i].clone()),
        ));
    }
    ops.sort_by_key(|(t, _)| *t);
    let ops: Vec<Op> = ops
        .into_iter()
        .enumerate()
        .map(|(i, (_, mut o))| {
            o.index = i as u64;
            o
        })
        .collect();
    let n = ops.len() as u64;
    History::from_ops(Path::new("(sim)"), ops, (1..=n).collect()).unwrap()
}

/// One attempt's shape: (gap before it, duration, outcome, commits?, commit position).
type Shape = (i64, i64, u8, bool, u8);

fn runs() -> impl Strategy<Value = Run> {
    (
        1u64..6,
        prop_oneof![Just(0.0005f64), Just(0.002), Just(1000.0)],
        proptest::collection::vec(
            (
                0u8..10,
                proptest::collection::vec((0i64..400_000, 1i64..600_000, 0u8..10, any::<bool>(), 0u8..=255), 1..4),
            ),
            1..40,
        ),
        proptest::collection::vec((0i64..20_000_000, any::<u64>()), 0..12),
    )
        .prop_map(|(window, window_s, inserts, cleanups)| {
            let mut logicals: Vec<Logical> = Vec::new();
            let mut attempts = Vec::new();
            let mut t = 0i64;
            for (li, (kind, shapes)) in inserts.into_iter().enumerate() {
                // a tenth reuse another insert's content, a fifth carry a token
                let rows = if kind == 0 && li > 0 {
                    logicals[li / 2].rows.clone()
                } else {
                    vec![li as u64 * 10, li as u64 * 10 + 1]
                };
                let token = (kind >= 8).then(|| format!("tok{li}"));
                logicals.push(Logical { rows, token });
                let shapes: Vec<Shape> = shapes;
                for (n, (gap, dur, oc, commits, pos)) in shapes.iter().enumerate() {
                    t += gap;
                    let (t0, t1) = (t, t + dur);
                    let outcome = match oc {
                        0 => "fail",
                        1..=4 => "info",
                        _ => "ok",
                    };
                    let commit = match outcome {
                        "fail" => None,
                        "ok" => Some(t0 + 1 + (dur - 1) * *pos as i64 / 256),
                        // an indeterminate attempt may take effect even after it ended
                        _ => commits.then_some(t0 + 1 + dur * *pos as i64 / 128),
                    };
                    attempts.push(Attempt {
                        logical: li,
                        n: n as u64 + 1,
                        t0,
                        t1,
                        outcome,
                        commit,
                    });
                    t += dur / 3;
                    if outcome != "info" {
                        break;
                    }
                }
            }
            let window_ns = (window_s * 1e9) as i64;
            let rows = play(&logicals, &mut attempts, &cleanups, window, window_ns);
            Run {
                logicals,
                attempts,
                rows,
                window,
                window_s,
            }
        })
}

fn judge(run: &Run, replicas: &[Vec<u64>]) -> (Verdict, Value) {
    let h = history(run, replicas);
    let r = Dedup.check(&h, &CheckContext::new(None, 1 << 30)).unwrap();
    (r.verdict, r.details)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_correct_table_is_always_valid(run in runs()) {
        let (v, d) = judge(&run, &[run.rows.clone(), run.rows.clone()]);
        prop_assert_eq!(v, Verdict::Valid, "{}", d);
    }

    #[test]
    fn a_lost_acknowledged_block_is_always_found(run in runs(), pick in any::<prop::sample::Index>()) {
        // an ok attempt whose key no other attempt committed under tokens aside
        let acked: Vec<&Attempt> = run.attempts.iter().filter(|a| a.outcome == "ok").collect();
        prop_assume!(!acked.is_empty());
        let a = pick.get(&acked);
        let lost = &run.logicals[a.logical].rows;
        let mut damaged = run.rows.clone();
        // every copy of the block's rows vanishes from one replica
        damaged.retain(|r| !lost.contains(r));
        let (v, d) = judge(&run, &[run.rows.clone(), damaged]);
        prop_assert_eq!(v, Verdict::Invalid, "{}", d);
        let c = &d["counts"];
        prop_assert!(c["lost"].as_u64().unwrap_or(0) + c["lost-after-dedup"].as_u64().unwrap_or(0) + c["diverged"].as_u64().unwrap_or(0) >= 1, "{}", d);
    }

    #[test]
    fn a_phantom_row_is_always_found(run in runs()) {
        let mut extra = run.rows.clone();
        extra.push(999_999_999);
        let (v, d) = judge(&run, &[extra.clone(), extra]);
        prop_assert_eq!(v, Verdict::Invalid);
        prop_assert!(d["counts"]["phantom"].as_u64().unwrap_or(0) >= 1, "{}", d);
    }

    #[test]
    fn a_retry_duplicated_inside_the_window_is_always_found(run in runs()) {
        // after everything, insert 10^6 is attempted (info), then retried
        // (ok) with nothing else in flight: the table duplicates it
        // every earlier outcome made definite (an indeterminate attempt
        // could otherwise have created a block at any later moment, which
        // rightly lets the window have moved)
        let mut run = run;
        for a in &mut run.attempts {
            if a.outcome == "info" {
                match a.commit {
                    Some(c) => {
                        a.outcome = "ok";
                        a.t1 = a.t1.max(c + 1);
                    }
                    None => a.outcome = "fail",
                }
            }
        }
        let end = run.attempts.iter().map(|a| a.t1.max(a.commit.unwrap_or(0))).max().unwrap_or(0) + 1_000;
        let li = run.logicals.len();
        run.logicals.push(Logical { rows: vec![5_000_000, 5_000_001], token: None });
        run.attempts.push(Attempt { logical: li, n: 1, t0: end, t1: end + 10, outcome: "info", commit: Some(end + 5) });
        run.attempts.push(Attempt { logical: li, n: 2, t0: end + 20, t1: end + 30, outcome: "ok", commit: Some(end + 25) });
        let mut rows = run.rows.clone();
        rows.extend([5_000_000, 5_000_001, 5_000_000, 5_000_001]);
        let (v, d) = judge(&run, &[rows.clone(), rows]);
        prop_assert_eq!(v, Verdict::Invalid, "{}", d);
        prop_assert!(d["counts"]["duplicate-in-window"].as_u64().unwrap_or(0) >= 1, "{}", d);
    }
}
