//! The `linearizable` checker: is there a total order of the operations,
//! consistent with real time, that a single copy of the model explains?
//!
//! Keys are independent (P-compositionality: a history is linearizable iff
//! each key's sub-history is), so each key is searched on its own and the
//! verdicts compose. Per key the semantics are those of docs/ARCHITECTURE.md, "History": `fail` did not
//! happen; `info` or no completion may take effect any time after its
//! invoke, or never; the register starts at `null`.
//!
//! # Layout
//! * `model` — sequential specifications (cas-register, kv)
//! * `problem` — a key's ops laid out for the search
//! * `search` — the memoised depth-first just-in-time search
//! * `explain` — shrinking a failure to the ops that cannot all hold

mod explain;
mod memo;
pub mod model;
mod problem;
mod search;

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use model::{CasRegister, Kv, Model, ModelKind};
use problem::{LinOp, Problem};
use search::{Limits, Outcome as SearchOutcome};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Longest one explanation may shrink for; past it the core is reported
/// as found so far (still valid, perhaps not minimal).
pub const EXPLAIN_TIME_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// Most failing keys explained in detail; the others are only counted.
/// Each explanation runs many small searches.
pub const EXPLAINED_KEYS_MAX: usize = 4;

/// The checker, for one model.
pub struct Linearizable {
    pub model: ModelKind,
    /// Shrink failures to a minimal core and describe them.
    pub explain: bool,
    /// What every key holds before the first operation (`null`: nothing).
    /// A cas-register starts at any JSON value (Knossos's
    /// `(cas-register 0)` is `0`); a kv key at a string (Porcupine's
    /// key/value histories start every key at `""`) or `null`, absent.
    pub init: serde_json::Value,
}

/// One operation as a report shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRef {
    pub process: String,
    pub f: String,
    /// The op as the model reads it, e.g. `cas 1 → 2`.
    pub desc: String,
    pub outcome: String,
    pub invoke_index: u64,
    pub invoke_time: i64,
    #[serde(default)]
    pub complete_index: Option<u64>,
    #[serde(default)]
    pub complete_time: Option<i64>,
    pub line: u64,
}

/// Why one key is not linearizable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    pub key: Option<String>,
    /// The op whose return no linearization passes.
    pub failing: OpRef,
    /// Ok ops whose results cannot all hold (including `failing`).
    pub core: Vec<OpRef>,
    /// Whether the core is minimal: letting any one core op but `failing`
    /// be indeterminate makes the rest linearizable.
    pub minimal: bool,
    /// History index of the failing return: the longest linearizable
    /// prefix is everything before it.
    pub prefix_end_index: u64,
    pub prefix_end_time: i64,
    /// Model states some linearization of the prefix reaches there.
    pub states: Vec<String>,
    /// Every op of the key that overlaps the core's time window.
    pub window: Vec<OpRef>,
    pub explanation: String,
}

/// Details of a `linearizable` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearReport {
    pub model: String,
    pub keys: usize,
    pub keys_invalid: usize,
    pub keys_unknown: usize,
    pub configurations: u64,
    /// Unknown keys and why (at most a few listed).
    pub unknown: Vec<(Option<String>, String)>,
    /// Failing keys, not explained beyond [`EXPLAINED_KEYS_MAX`].
    pub invalid_keys: Vec<Option<String>>,
    pub violations: Vec<Violation>,
}

impl Checker for Linearizable {
    fn name(&self) -> &str {
        "linearizable"
    }

    fn check(&self, history: &History, ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        match self.model {
            ModelKind::CasRegister => self.check_with(history, ctx, || CasRegister::with_init(&self.init)),
            ModelKind::Kv => match Kv::with_init(&self.init) {
                Ok(_) => self.check_with(history, ctx, || Kv::with_init(&self.init).expect("checked above")),
                Err(e) => Ok(CheckResult::unknown(
                    self.name(),
                    Instant::now(),
                    e,
                    serde_json::Value::Null,
                )),
            },
        }
    }
}

/// A key's ops, prepared: the search's ops and, for each, the index of its
/// operation in the history.
struct KeyOps {
    ops: Vec<LinOp>,
    operation: Vec<usize>,
}

impl Linearizable {
    fn check_with<M: Model>(
        &self,
        history: &History,
        ctx: &CheckContext,
        new_model: impl Fn() -> M,
    ) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let limits = Limits {
            deadline: ctx.deadline,
            mem_bytes_max: ctx.mem_bytes_max,
            configs_max: u64::MAX,
        };
        let groups = history.by_key();
        let mut report = LinearReport {
            model: self.model.name().to_string(),
            keys: groups.len(),
            keys_invalid: 0,
            keys_unknown: 0,
            configurations: 0,
            unknown: Vec::new(),
            invalid_keys: Vec::new(),
            violations: Vec::new(),
        };
        for (key, members) in groups {
            let mut model = new_model();
            let prepared = prepare(history, &members, &mut model)?;
            if limits.deadline.is_some_and(|d| Instant::now() >= d) {
                report.keys_unknown += 1;
                push_unknown(&mut report, key, "time budget exhausted before this key".into());
                continue;
            }
            let p = Problem::new(&prepared.ops);
            let s = search::search(&p, &mut model, &limits);
            report.configurations += s.configurations;
            match s.outcome {
                SearchOutcome::Linearizable => {}
                SearchOutcome::Unknown { reason, .. } => {
                    report.keys_unknown += 1;
                    push_unknown(&mut report, key, reason);
                }
                SearchOutcome::NotLinearizable { deepest, states } => {
                    report.keys_invalid += 1;
                    if self.explain && report.violations.len() < EXPLAINED_KEYS_MAX {
                        let failing = p.returns[deepest as usize].op as usize;
                        let v = explain_violation(history, key, &prepared, failing, &states, &mut model, &limits);
                        report.violations.push(v);
                    } else {
                        report.invalid_keys.push(key);
                    }
                }
            }
        }
        let (verdict, reason) = if report.keys_invalid > 0 {
            (Verdict::Invalid, None)
        } else if report.keys_unknown > 0 {
            let first = report.unknown.first().map(|(_, r)| r.clone()).unwrap_or_default();
            (
                Verdict::Unknown,
                Some(format!(
                    "{} of {} keys unknown: {first}",
                    report.keys_unknown, report.keys
                )),
            )
        } else if report.keys == 0 {
            (Verdict::Unknown, Some("no operations: nothing to judge".to_string()))
        } else {
            (Verdict::Valid, None)
        };
        Ok(CheckResult {
            checker: self.name().to_string(),
            verdict,
            reason,
            elapsed_ms: elapsed_ms(started),
            details: serde_json::to_value(&report).expect("report serializes"),
        })
    }
}

/// Most unknown keys listed by name.
const UNKNOWN_LISTED_MAX: usize = 16;

fn push_unknown(report: &mut LinearReport, key: Option<String>, reason: String) {
    if report.unknown.len() < UNKNOWN_LISTED_MAX {
        report.unknown.push((key, reason));
    }
}

/// Encodes a key's operations for the search: drops `fail` ops and
/// indeterminate reads, and rejects ops the model cannot read.
fn prepare<M: Model>(history: &History, members: &[usize], model: &mut M) -> Result<KeyOps, HistoryError> {
    let mut out = KeyOps {
        ops: Vec::with_capacity(members.len()),
        operation: Vec::with_capacity(members.len()),
    };
    for &i in members {
        let o = &history.operations[i];
        let f = history.f_of(o);
        let read_only = model.is_read_only(f);
        let ret = match o.outcome {
            Outcome::Fail => continue,
            Outcome::Info | Outcome::Pending if read_only => continue,
            Outcome::Info | Outcome::Pending => None,
            Outcome::Ok => o.complete.map(|c| c as u64),
        };
        let at = if o.outcome == Outcome::Ok {
            o.complete.unwrap_or(o.invoke)
        } else {
            o.invoke
        };
        let code = model.encode(f, history.value_of(o)).map_err(|reason| HistoryError {
            at: history.location(at),
            reason,
        })?;
        out.ops.push(LinOp {
            id: out.ops.len() as u32,
            invoke: o.invoke as u64,
            ret,
            code,
            read_only,
        });
        out.operation.push(i);
    }
    Ok(out)
}

fn op_ref(history: &History, operation: usize, desc: String) -> OpRef {
    let o = &history.operations[operation];
    let inv = history.invoke_op(o);
    let comp = history.complete_op(o);
    OpRef {
        process: o.process.to_string(),
        f: inv.f.clone(),
        desc,
        outcome: o.outcome.as_str().to_string(),
        invoke_index: inv.index,
        invoke_time: inv.time,
        complete_index: comp.map(|c| c.index),
        complete_time: comp.map(|c| c.time),
        line: history.lines[o.invoke],
    }
}

/// An op the search never saw (failed, or an indeterminate read).
fn describe_raw(history: &History, operation: usize) -> String {
    let o = &history.operations[operation];
    format!("{} {}", history.f_of(o), history.value_of(o))
}

/// Shrinks a failing key and writes up why it fails.
fn explain_violation<M: Model>(
    history: &History,
    key: Option<String>,
    prepared: &KeyOps,
    failing: usize,
    states: &[u32],
    model: &mut M,
    limits: &Limits,
) -> Violation {
    let cap = Instant::now() + EXPLAIN_TIME_MAX;
    let shrink_limits = Limits {
        deadline: Some(limits.deadline.map_or(cap, |d| d.min(cap))),
        ..*limits
    };
    let shrunk = explain::shrink(&prepared.ops, failing, model, &shrink_limits);
    let as_ref = |i: usize, model: &M| op_ref(history, prepared.operation[i], model.show_op(prepared.ops[i].code));
    let core: Vec<OpRef> = shrunk.core.iter().map(|&i| as_ref(i, model)).collect();
    let failing_ref = as_ref(failing, model);
    let states: Vec<String> = states.iter().map(|&s| model.show_state(s)).collect();
    let prefix_end = &history.ops[shrunk.cut as usize];

    // The window: every op of this key overlapping the core's span.
    let lo = core.iter().map(|o| o.invoke_index).min().unwrap_or(0);
    let hi = shrunk.cut;
    let searched: std::collections::HashMap<usize, usize> =
        prepared.operation.iter().enumerate().map(|(j, &i)| (i, j)).collect();
    let mut window = Vec::new();
    for (i, o) in history.operations.iter().enumerate() {
        if history.invoke_op(o).key != key {
            continue;
        }
        let end = o.complete.map(|c| c as u64).unwrap_or(u64::MAX);
        if o.invoke as u64 > hi || end < lo {
            continue;
        }
        let desc = match searched.get(&i) {
            Some(&j) => model.show_op(prepared.ops[j].code),
            None => describe_raw(history, i),
        };
        window.push(op_ref(history, i, desc));
    }
    let explanation = write_explanation(&key, &failing_ref, &core, &states, shrunk.minimal);
    Violation {
        key,
        failing: failing_ref,
        core,
        minimal: shrunk.minimal,
        prefix_end_index: prefix_end.index,
        prefix_end_time: prefix_end.time,
        states,
        window,
        explanation,
    }
}

/// The text a user reads first.
fn write_explanation(
    key: &Option<String>,
    failing: &OpRef,
    core: &[OpRef],
    states: &[String],
    minimal: bool,
) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    let key_text = key.as_ref().map(|k| format!("key {k}: ")).unwrap_or_default();
    let _ = writeln!(
        t,
        "{key_text}no linearization gets past the return of `{}` by process {} (history index {}; invoked at line {}).",
        failing.desc,
        failing.process,
        failing.complete_index.unwrap_or(failing.invoke_index),
        failing.line,
    );
    let _ = writeln!(
        t,
        "Just before that return, the linearizations of the prefix leave the state at one of: {}.",
        if states.is_empty() {
            "(none)".to_string()
        } else {
            states.join(", ")
        }
    );
    let _ = writeln!(
        t,
        "{} cannot all have taken effect as observed{}, even letting every other \
         operation take effect at any point after its invocation, or never:",
        if core.len() == 1 {
            "This operation".to_string()
        } else {
            format!("These {} operations", core.len())
        },
        if minimal {
            " (a minimal set: let any one of them be indeterminate and the rest can)"
        } else {
            ""
        }
    );
    for o in core {
        let _ = writeln!(
            t,
            "  line {:>6}  process {:>4}  {:<24} invoked at index {}, returned at {}",
            o.line,
            o.process,
            o.desc,
            o.invoke_index,
            o.complete_index.map(|c| c.to_string()).unwrap_or_else(|| "-".into())
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::CheckContext;
    use crate::pairing::History;

    fn test_history(lines: &[(u64, &str, &str, Value)]) -> History {
        History::from_script(lines).expect("valid test history")
    }
    use serde_json::{json, Value};

    fn verdict(model: ModelKind, lines: &[(u64, &str, &str, Value)]) -> Verdict {
        let h = test_history(lines);
        let c = Linearizable {
            model,
            explain: true,
            init: serde_json::Value::Null,
        };
        c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap().verdict
    }

    fn reg(lines: &[(u64, &str, &str, Value)]) -> Verdict {
        verdict(ModelKind::CasRegister, lines)
    }

    const N: Value = Value::Null;

    #[test]
    fn read_after_completed_write_must_see_it() {
        assert_eq!(
            reg(&[
                (0, "invoke", "write", json!(1)),
                (0, "ok", "write", json!(1)),
                (1, "invoke", "read", N),
                (1, "ok", "read", N),
            ]),
            Verdict::Invalid
        );
    }

    #[test]
    fn concurrent_read_may_see_either_value() {
        for seen in [N, json!(1)] {
            assert_eq!(
                reg(&[
                    (0, "invoke", "write", json!(1)),
                    (1, "invoke", "read", N),
                    (1, "ok", "read", seen.clone()),
                    (0, "ok", "write", json!(1)),
                ]),
                Verdict::Valid,
                "read of {seen}"
            );
        }
    }

    #[test]
    fn failed_write_did_not_happen() {
        assert_eq!(
            reg(&[
                (0, "invoke", "write", json!(1)),
                (0, "fail", "write", json!(1)),
                (1, "invoke", "read", N),
                (1, "ok", "read", json!(1)),
            ]),
            Verdict::Invalid
        );
    }

    #[test]
    fn info_write_may_take_effect_long_after_its_invoke_or_never() {
        let base = [
            (0, "invoke", "write", json!(1)),
            (0, "info", "write", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
        ];
        for (seen, want) in [
            (json!(1), Verdict::Valid),
            (json!(2), Verdict::Valid),
            (N, Verdict::Invalid),
        ] {
            let mut lines = base.to_vec();
            lines.push((2, "invoke", "read", N));
            lines.push((2, "ok", "read", seen.clone()));
            assert_eq!(reg(&lines), want, "read of {seen}");
        }
    }

    #[test]
    fn info_write_takes_effect_at_most_once() {
        // w1 (info), then w2 ok, read 1, then w2' ok, read 1 again: the one
        // indeterminate write cannot explain both reads.
        let lines = [
            (0, "invoke", "write", json!(1)),
            (0, "info", "write", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
            (2, "invoke", "read", N),
            (2, "ok", "read", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
            (2, "invoke", "read", N),
            (2, "ok", "read", json!(1)),
        ];
        assert_eq!(reg(&lines), Verdict::Invalid);
    }

    #[test]
    fn pending_invoke_counts_as_indeterminate() {
        assert_eq!(
            reg(&[
                (0, "invoke", "cas", json!([N, 5])),
                (1, "invoke", "read", N),
                (1, "ok", "read", json!(5)),
            ]),
            Verdict::Valid
        );
    }

    #[test]
    fn kv_append_order_is_checked() {
        let lines = [
            (0, "invoke", "append", json!("a")),
            (0, "ok", "append", json!("a")),
            (1, "invoke", "append", json!("b")),
            (1, "ok", "append", json!("b")),
            (2, "invoke", "get", N),
            (2, "ok", "get", json!("ba")),
        ];
        assert_eq!(verdict(ModelKind::Kv, &lines), Verdict::Invalid);
        let mut ok = lines.to_vec();
        ok[5].3 = json!("ab");
        assert_eq!(verdict(ModelKind::Kv, &ok), Verdict::Valid);
    }

    #[test]
    fn wrong_shape_for_the_model_is_an_input_error_naming_the_line() {
        let h = test_history(&[(0, "invoke", "cas", json!(3)), (0, "ok", "cas", json!(3))]);
        let c = Linearizable {
            model: ModelKind::CasRegister,
            explain: true,
            init: serde_json::Value::Null,
        };
        let e = c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap_err();
        assert_eq!(e.at.line, 2);
        assert!(e.reason.contains("[expected, new]"), "{}", e.reason);
    }

    #[test]
    fn violation_core_is_the_stale_read_and_the_writes() {
        let h = test_history(&[
            (0, "invoke", "write", json!(1)),
            (0, "ok", "write", json!(1)),
            (3, "invoke", "read", N),
            (3, "ok", "read", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
            (2, "invoke", "read", N),
            (2, "ok", "read", json!(1)),
        ]);
        let c = Linearizable {
            model: ModelKind::CasRegister,
            explain: true,
            init: serde_json::Value::Null,
        };
        let r = c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap();
        let report: LinearReport = serde_json::from_value(r.details).unwrap();
        let v = &report.violations[0];
        assert_eq!(v.failing.desc, "read → 1");
        assert_eq!(v.failing.invoke_index, 6);
        let core: Vec<&str> = v.core.iter().map(|o| o.desc.as_str()).collect();
        // Two minimal cores exist: with `write 1` indeterminate, the first
        // read of 1 still pins it before `write 2`.
        assert!(
            core == ["write 1", "write 2", "read → 1"] || core == ["read → 1", "write 2", "read → 1"],
            "{core:?}"
        );
        assert!(v.minimal);
        assert_eq!(v.states, ["2"]);
        assert_eq!(v.prefix_end_index, 7);
    }
}
