//! `total-queue`: every acknowledged enqueue comes out exactly once, and
//! nothing comes out that was never put in (Jepsen's total-queue checker).
//! Dequeued = `ok` dequeue values, every element of `ok` drains, and the
//! elements an `info` drain says it took (a partial drain: it took those,
//! then could not go on).
//! * lost — enqueued `ok`, never dequeued. A dequeue whose outcome is
//!   unknown (`info`, or no completion) may have taken one element without
//!   saying which — a delete whose reply was lost: so lost elements are a
//!   violation only when there are more of them than such dequeues, each
//!   of which could have taken any one of them (it may take effect any
//!   time after its invoke);
//! * duplicated — dequeued more than once (counting repeats);
//! * unexpected — dequeued, never attempted;
//! * recovered — enqueue indeterminate, yet dequeued (fine, reported).
//!
//! A drain that completes `ok` emptied the queue: as in Jepsen, it proves
//! the queue empty at its completion, whatever it returned. `lost` means
//! something only then: until a drain emptied the queue a lost element
//! cannot be told from one still queued, so without an `ok` drain the
//! verdict is `unknown` (unless something came out twice or from nowhere,
//! which no later drain can excuse).

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use crate::set::listed;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

pub struct TotalQueue;

impl Checker for TotalQueue {
    fn name(&self) -> &str {
        "total-queue"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let mut attempted = BTreeSet::new();
        let mut acked = BTreeSet::new();
        let mut dequeued: BTreeMap<String, u64> = BTreeMap::new();
        let mut emptied = false;
        // dequeues that may have taken an element unseen
        let mut unknown_dequeues = 0usize;
        for o in &h.operations {
            match (h.f_of(o), o.outcome) {
                (_, Outcome::Fail) => {}
                ("enqueue", outcome) => {
                    let e = h.invoke_op(o).value.to_string();
                    attempted.insert(e.clone());
                    if outcome == Outcome::Ok {
                        acked.insert(e);
                    }
                }
                ("dequeue", Outcome::Ok) => {
                    *dequeued.entry(h.value_of(o).to_string()).or_default() += 1;
                }
                ("dequeue", Outcome::Info | Outcome::Pending) => unknown_dequeues += 1,
                ("drain", Outcome::Ok) => {
                    emptied = true;
                    for e in h.array_of(o)? {
                        *dequeued.entry(e.to_string()).or_default() += 1;
                    }
                }
                ("drain", Outcome::Info) => {
                    let took = h.complete_op(o).and_then(|c| c.value.as_array());
                    for e in took.into_iter().flatten() {
                        *dequeued.entry(e.to_string()).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        let out: BTreeSet<String> = dequeued.keys().cloned().collect();
        let lost: BTreeSet<String> = acked.difference(&out).cloned().collect();
        let unexpected: BTreeSet<String> = out.difference(&attempted).cloned().collect();
        let duplicated: BTreeSet<String> = dequeued
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(e, _)| e.clone())
            .collect();
        let recovered: BTreeSet<String> = out
            .intersection(&attempted)
            .filter(|e| !acked.contains(*e))
            .cloned()
            .collect();
        let verdict = if !unexpected.is_empty() || !duplicated.is_empty() {
            Verdict::Invalid
        } else if !emptied {
            Verdict::Unknown
        } else {
            Verdict::valid_if(lost.len() <= unknown_dequeues)
        };
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason: match verdict {
                Verdict::Unknown => Some(
                    "no drain completed ok (emptied the queue): a lost element cannot be told from one still queued"
                        .to_string(),
                ),
                Verdict::Invalid => Some(
                    [
                        (!unexpected.is_empty())
                            .then(|| format!("{} dequeued that no enqueue attempted", unexpected.len())),
                        (!duplicated.is_empty()).then(|| format!("{} dequeued more than once", duplicated.len())),
                        (lost.len() > unknown_dequeues).then(|| {
                            format!(
                                "{} acknowledged enqueues never dequeued, more than the {unknown_dequeues} dequeues of unknown outcome could have taken",
                                lost.len()
                            )
                        }),
                    ]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(", "),
                ),
                Verdict::Valid => None,
            },
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "attempted": attempted.len(), "acknowledged": acked.len(),
                "dequeued": dequeued.values().sum::<u64>(),
                "lost_count": lost.len(), "lost": listed(&lost),
                "unknown_dequeues": unknown_dequeues,
                "duplicated_count": duplicated.len(), "duplicated": listed(&duplicated),
                "unexpected_count": unexpected.len(), "unexpected": listed(&unexpected),
                "recovered_count": recovered.len(), "recovered": listed(&recovered),
            }),
        })
    }
}
