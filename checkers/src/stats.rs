//! `stats`: counts of ok / fail / info per `f` (Jepsen's stats checker).
//! Invalid when no op was attempted, or none succeeded — a run that never
//! gets an op through tests nothing. In a campaign only the main phase
//! counts for that (ops invoked before the `healed` event): the final
//! reads after the heal nearly always succeed. An `f` that never succeeded is listed
//! (`never_ok`) but does not fail the run: a CAS with a random expected
//! value may well fail every time in a short run.

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Instant;

pub struct Stats;

#[derive(Default)]
struct Counts {
    ok: u64,
    fail: u64,
    info: u64,
}

impl Checker for Stats {
    fn name(&self) -> &str {
        "stats"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let mut by_f: BTreeMap<&str, Counts> = BTreeMap::new();
        let healed = h.nemesis.iter().copied().find(|&i| h.ops[i].f == "healed");
        let mut main_ok = 0u64;
        for o in &h.operations {
            if o.outcome == Outcome::Ok && healed.is_none_or(|at| o.invoke < at) {
                main_ok += 1;
            }
            let c = by_f.entry(h.f_of(o)).or_default();
            match o.outcome {
                Outcome::Ok => c.ok += 1,
                Outcome::Fail => c.fail += 1,
                Outcome::Info | Outcome::Pending => c.info += 1,
            }
        }
        let never_ok: Vec<&str> = by_f.iter().filter(|(_, c)| c.ok == 0).map(|(f, _)| *f).collect();
        let total = by_f.values().fold(Counts::default(), |t, c| Counts {
            ok: t.ok + c.ok,
            fail: t.fail + c.fail,
            info: t.info + c.info,
        });
        let by_f_json: serde_json::Map<String, serde_json::Value> = by_f
            .iter()
            .map(|(f, c)| (f.to_string(), json!({"ok": c.ok, "fail": c.fail, "info": c.info})))
            .collect();
        // an empty history holds nothing to judge (unknown, as for every
        // checker); one where nothing succeeded is a run that failed
        let reason = match (h.operations.is_empty(), main_ok, healed) {
            (true, _, _) => Some("no operation was attempted: nothing to judge"),
            (false, 0, Some(_)) => Some("no operation succeeded before the heal"),
            (false, 0, None) => Some("no operation succeeded"),
            _ => None,
        };
        let verdict = match (h.operations.is_empty(), reason) {
            (true, _) => Verdict::Unknown,
            (false, r) => Verdict::valid_if(r.is_none()),
        };
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason: reason.map(str::to_string),
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "ok": total.ok, "fail": total.fail, "info": total.info,
                "by_f": by_f_json, "never_ok": never_ok, "ok_before_heal": healed.map(|_| main_ok),
            }),
        })
    }
}
