//! `counter`: every `ok` read lies within what the adds allow (Jepsen's
//! counter checker, generalised to negative deltas). For a read over
//! [invoke, return]:
//! * adds that returned `ok` before the read's invoke certainly happened;
//! * adds invoked before the read returned, not failed and not certain,
//!   may or may not have (they widen the bounds by their sign);
//! * later adds cannot be visible.
//!
//! The counter starts at 0. Not checked: monotonicity across reads.

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use serde_json::{json, Value};
use std::time::Instant;

/// Most out-of-bounds reads listed in a report.
const ERRORS_LISTED_MAX: usize = 32;

pub struct Counter;

struct Add {
    delta: i128,
    invoke: usize,
    /// Return position when ok.
    ok_at: Option<usize>,
}

impl Checker for Counter {
    fn name(&self) -> &str {
        "counter"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let mut adds = Vec::new();
        let mut reads = Vec::new();
        for o in &h.operations {
            match (h.f_of(o), o.outcome) {
                ("add", Outcome::Fail) => {}
                ("add", outcome) => {
                    let v = &h.invoke_op(o).value;
                    let Some(delta) = v.as_i64() else {
                        return Err(HistoryError {
                            at: h.location(o.invoke),
                            reason: format!("counter add must carry an integer delta, got {v}"),
                        });
                    };
                    let ok_at = if outcome == Outcome::Ok { o.complete } else { None };
                    adds.push(Add {
                        delta: delta as i128,
                        invoke: o.invoke,
                        ok_at,
                    });
                }
                ("read", Outcome::Ok) => {
                    let at = o.complete.expect("ok op has a completion");
                    let v = h.value_of(o);
                    let Some(value) = v.as_i64() else {
                        return Err(HistoryError {
                            at: h.location(at),
                            reason: format!("counter read must return an integer, got {v}"),
                        });
                    };
                    reads.push((o.invoke, at, value as i128));
                }
                _ => {}
            }
        }
        if reads.is_empty() {
            return Ok(CheckResult::unknown(
                self.name(),
                started,
                "no ok read: nothing to judge the adds against",
                json!({"adds": adds.len(), "reads": 0}),
            ));
        }
        let mut errors: Vec<Value> = Vec::new();
        let mut error_count = 0usize;
        for &(invoke, ret, value) in &reads {
            let (mut lower, mut upper) = (0i128, 0i128);
            for a in &adds {
                if a.ok_at.is_some_and(|r| r < invoke) {
                    lower += a.delta;
                    upper += a.delta;
                } else if a.invoke < ret {
                    lower += a.delta.min(0);
                    upper += a.delta.max(0);
                }
            }
            if value < lower || value > upper {
                error_count += 1;
                if errors.len() < ERRORS_LISTED_MAX {
                    errors.push(json!({
                        "line": h.lines[ret], "index": ret, "value": value as i64,
                        "lower": lower as i64, "upper": upper as i64,
                    }));
                }
            }
        }
        let verdict = Verdict::valid_if(error_count == 0);
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason: errors.first().map(|e| {
                format!(
                    "{error_count} reads out of bounds; the first ({}) read {} where only {}..={} could be",
                    e["line"], e["value"], e["lower"], e["upper"]
                )
            }),
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "adds": adds.len(), "reads": reads.len(),
                "error_count": error_count, "errors": errors,
            }),
        })
    }
}
