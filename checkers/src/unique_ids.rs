//! `unique-ids`: every id a `generate` returned `ok` is distinct (Jepsen's
//! unique-ids checker). Failed and indeterminate generates constrain
//! nothing: an id nobody saw cannot be a duplicate.

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// Most duplicated ids listed in a report.
const DUPLICATES_LISTED_MAX: usize = 32;

pub struct UniqueIds;

impl Checker for UniqueIds {
    fn name(&self) -> &str {
        "unique-ids"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let mut seen: BTreeMap<String, u64> = BTreeMap::new();
        let (mut attempted, mut acknowledged) = (0u64, 0u64);
        for o in &h.operations {
            if h.f_of(o) != "generate" {
                continue;
            }
            attempted += 1;
            if o.outcome != Outcome::Ok {
                continue;
            }
            let v = h.value_of(o);
            if v.is_null() {
                let at = o.complete.unwrap_or(o.invoke);
                return Err(HistoryError {
                    at: h.location(at),
                    reason: "ok generate without an id".into(),
                });
            }
            acknowledged += 1;
            *seen.entry(v.to_string()).or_default() += 1;
        }
        let duplicated: Vec<Value> = seen
            .iter()
            .filter(|(_, &n)| n > 1)
            .take(DUPLICATES_LISTED_MAX)
            .map(|(id, &n)| json!({"id": serde_json::from_str::<Value>(id).unwrap_or(Value::Null), "count": n}))
            .collect();
        let duplicated_count = seen.values().filter(|&&n| n > 1).count();
        let verdict = if duplicated_count > 0 {
            Verdict::Invalid
        } else if acknowledged == 0 {
            Verdict::Unknown
        } else {
            Verdict::Valid
        };
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason: match verdict {
                Verdict::Unknown => Some("no id was acknowledged: nothing to judge".to_string()),
                Verdict::Invalid => Some(format!(
                    "{duplicated_count} ids acknowledged more than once (the first: {})",
                    duplicated.first().map_or(Value::Null, |d| d["id"].clone())
                )),
                Verdict::Valid => None,
            },
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "attempted": attempted,
                "acknowledged": acknowledged,
                "distinct": seen.len(),
                "duplicated_count": duplicated_count,
                "duplicated": duplicated,
            }),
        })
    }
}
