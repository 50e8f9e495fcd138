//! `set`: elements added, then read back (Jepsen's set checker). Judged on
//! the last `ok` read:
//! * lost — an `ok` add missing from it;
//! * unexpected — an element in it that no add ever attempted;
//! * recovered — an indeterminate add present in it (fine, reported).
//!
//! Without an `ok` read nothing can be judged: the verdict is `unknown`.
//! It does not check reads other than the last (no per-read staleness).

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Instant;

/// Most elements listed per category in a report.
pub(crate) const ELEMENTS_LISTED_MAX: usize = 64;

pub struct SetChecker;

pub(crate) fn listed(set: &BTreeSet<String>) -> Vec<Value> {
    set.iter()
        .take(ELEMENTS_LISTED_MAX)
        .map(|e| serde_json::from_str(e).unwrap_or(Value::Null))
        .collect()
}

impl Checker for SetChecker {
    fn name(&self) -> &str {
        "set"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let mut attempted = BTreeSet::new();
        let mut acked = BTreeSet::new();
        let mut final_read: Option<BTreeSet<String>> = None;
        for o in &h.operations {
            match (h.f_of(o), o.outcome) {
                ("add", Outcome::Fail) => {}
                ("add", outcome) => {
                    let e = h.value_of(o).to_string();
                    attempted.insert(e.clone());
                    if outcome == Outcome::Ok {
                        acked.insert(e);
                    }
                }
                ("read", Outcome::Ok) => {
                    let items = h.array_of(o)?;
                    final_read = Some(items.iter().map(Value::to_string).collect());
                }
                _ => {}
            }
        }
        let Some(read) = final_read else {
            return Ok(CheckResult::unknown(
                self.name(),
                started,
                "no ok read: nothing to judge the adds against",
                json!({"attempted": attempted.len(), "acknowledged": acked.len()}),
            ));
        };
        let lost: BTreeSet<String> = acked.difference(&read).cloned().collect();
        let unexpected: BTreeSet<String> = read.difference(&attempted).cloned().collect();
        let recovered: BTreeSet<String> = read
            .intersection(&attempted)
            .filter(|e| !acked.contains(*e))
            .cloned()
            .collect();
        let verdict = Verdict::valid_if(lost.is_empty() && unexpected.is_empty());
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason: (verdict == Verdict::Invalid).then(|| {
                let first = |s: &BTreeSet<String>| s.iter().next().cloned().unwrap_or_default();
                match (lost.len(), unexpected.len()) {
                    (0, u) => format!("{u} elements read that no add attempted (the first: {})", first(&unexpected)),
                    (l, 0) => format!("{l} acknowledged adds missing from the final read (the first: {})", first(&lost)),
                    (l, u) => format!(
                        "{l} acknowledged adds missing from the final read (the first: {}), {u} elements no add attempted",
                        first(&lost)
                    ),
                }
            }),
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "attempted": attempted.len(),
                "acknowledged": acked.len(),
                "read": read.len(),
                "lost_count": lost.len(), "lost": listed(&lost),
                "unexpected_count": unexpected.len(), "unexpected": listed(&unexpected),
                "recovered_count": recovered.len(), "recovered": listed(&recovered),
            }),
        })
    }
}
