//! `digest`: the keeper's divergence detector, judged from the nemesis
//! events a campaign records on the history's timeline.
//!
//! Valid when: no node aborted on a digest mismatch except where a
//! divergence was injected; every injected divergence (`diverge-applied`,
//! node and log index) aborted that node at exactly that log index; and
//! at the end (`final-digests`) every replica reported the same tree
//! digest at the same applied index; and no `invariant-violated` event (a
//! simulated cluster's state checks: one leader per term, committed
//! entries never change, …). Without a `final-digests` event the verdict
//! is unknown. It does not check what clients read.

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::History;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

pub struct DigestChecker;

fn at(v: &Value) -> Option<(u64, u64)> {
    Some((v["node"].as_u64()?, v["log_index"].as_u64()?))
}

impl Checker for DigestChecker {
    fn name(&self) -> &str {
        "digest"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let (mut aborts, mut diverged, mut injected, mut finals) = (Vec::new(), Vec::new(), 0u64, None);
        let mut violated = Vec::new();
        for &i in &h.nemesis {
            let op = &h.ops[i];
            match op.f.as_str() {
                "digest-abort" => aborts.extend(at(&op.value)),
                "diverge-applied" => diverged.extend(at(&op.value)),
                "start-diverge" => injected += 1,
                "final-digests" => finals = Some(op.value.clone()),
                "invariant-violated" => violated.push(format!(
                    "node {}: {}",
                    op.value["node"],
                    op.value["what"].as_str().unwrap_or("?")
                )),
                _ => {}
            }
        }
        let mut problems = violated;
        for &(node, index) in &aborts {
            if !diverged.contains(&(node, index)) {
                problems.push(format!(
                    "node {node} aborted at log index {index} with no divergence injected there"
                ));
            }
        }
        for &(node, index) in &diverged {
            if !aborts.contains(&(node, index)) {
                problems.push(format!(
                    "divergence applied on node {node} at log index {index} did not abort it"
                ));
            }
        }
        let Some(finals) = finals else {
            return Ok(CheckResult::unknown(
                self.name(),
                started,
                "no final-digests event: the run did not reach its final phase",
                json!({"aborts": aborts, "divergences_applied": diverged, "problems": problems}),
            ));
        };
        if finals["converged"] == false {
            problems.push(format!(
                "replicas did not converge: {}",
                finals["note"].as_str().unwrap_or("no note")
            ));
        }
        // digests compare only at the same applied index: applied index ->
        // digest -> nodes
        let mut at_index: BTreeMap<String, BTreeMap<String, Vec<u64>>> = BTreeMap::new();
        for n in finals["nodes"].as_array().map(Vec::as_slice).unwrap_or_default() {
            at_index
                .entry(n["applied_index"].as_str().unwrap_or("?").to_string())
                .or_default()
                .entry(n["digest"].as_str().unwrap_or("?").to_string())
                .or_default()
                .push(n["node"].as_u64().unwrap_or(0));
        }
        for (index, by_digest) in &at_index {
            if by_digest.len() > 1 {
                problems.push(format!(
                    "replicas disagree at the end: at applied index {index}, {by_digest:?}"
                ));
            }
        }
        if at_index.is_empty() {
            problems.push("no replica reported a digest at the end".into());
        }
        Ok(CheckResult {
            checker: self.name().into(),
            verdict: Verdict::valid_if(problems.is_empty()),
            reason: problems.first().map(|p| {
                if problems.len() > 1 {
                    format!("{} problems; the first: {p}", problems.len())
                } else {
                    p.clone()
                }
            }),
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "divergences_injected": injected, "divergences_applied": diverged, "aborts": aborts,
                "final": finals, "problems": problems,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nemesis(events: &[(&str, Value)]) -> History {
        let mut lines: Vec<(u64, &str, &str, Value)> =
            events.iter().map(|(f, v)| (0, "nemesis", *f, v.clone())).collect();
        lines.push((0, "invoke", "read", Value::Null));
        History::from_script(&lines).unwrap()
    }

    fn verdict(events: &[(&str, Value)]) -> Verdict {
        DigestChecker
            .check(&nemesis(events), &CheckContext::new(None, 1 << 20))
            .unwrap()
            .verdict
    }

    fn finals(digests: &[&str]) -> (&'static str, Value) {
        let nodes: Vec<Value> = digests
            .iter()
            .enumerate()
            .map(|(i, d)| json!({"node": i + 1, "applied_index": "9", "digest": d}))
            .collect();
        ("final-digests", json!({"converged": true, "nodes": nodes}))
    }

    #[test]
    fn an_injected_divergence_must_abort_at_its_index_and_nothing_else_may() {
        let ok = [
            ("start-diverge", json!({})),
            ("diverge-applied", json!({"node": 2, "log_index": 7})),
            ("digest-abort", json!({"node": 2, "log_index": 7})),
            finals(&["a", "a", "a"]),
        ];
        assert_eq!(verdict(&ok), Verdict::Valid);
        let wrong_index = [
            ("diverge-applied", json!({"node": 2, "log_index": 7})),
            ("digest-abort", json!({"node": 2, "log_index": 8})),
            finals(&["a"]),
        ];
        assert_eq!(verdict(&wrong_index), Verdict::Invalid);
        let missed = [("diverge-applied", json!({"node": 2, "log_index": 7})), finals(&["a"])];
        assert_eq!(verdict(&missed), Verdict::Invalid);
        let spurious = [("digest-abort", json!({"node": 1, "log_index": 3})), finals(&["a"])];
        assert_eq!(verdict(&spurious), Verdict::Invalid);
    }

    #[test]
    fn a_broken_invariant_of_a_simulated_cluster_is_a_problem() {
        let violated = [
            (
                "invariant-violated",
                json!({"node": 2, "what": "two leaders in term 3: 1 and 2"}),
            ),
            finals(&["a", "a"]),
        ];
        assert_eq!(verdict(&violated), Verdict::Invalid);
        assert_eq!(verdict(&[finals(&["a", "a"])]), Verdict::Valid);
    }

    #[test]
    fn replicas_must_agree_at_the_end() {
        assert_eq!(verdict(&[finals(&["a", "b", "a"])]), Verdict::Invalid);
        assert_eq!(verdict(&[]), Verdict::Unknown);
        // a node one entry behind has another digest, and that is no
        // disagreement; two at the same index with different digests are
        let lagging = json!({"converged": true, "nodes": [
            {"node": 1, "applied_index": "9", "digest": "a"},
            {"node": 2, "applied_index": "8", "digest": "b"},
            {"node": 3, "applied_index": "9", "digest": "a"},
        ]});
        assert_eq!(verdict(&[("final-digests", lagging)]), Verdict::Valid);
        let split = json!({"converged": true, "nodes": [
            {"node": 1, "applied_index": "8", "digest": "c"},
            {"node": 2, "applied_index": "8", "digest": "b"},
            {"node": 3, "applied_index": "9", "digest": "a"},
        ]});
        assert_eq!(verdict(&[("final-digests", split)]), Verdict::Invalid);
        // replicas that never came to one index: the note says where each stood
        let apart = json!({"converged": false, "note": "applied indices n1 9, n2 no answer",
            "nodes": [{"node": 1, "applied_index": "9", "digest": "a"}]});
        let r = DigestChecker
            .check(&nemesis(&[("final-digests", apart)]), &CheckContext::new(None, 1 << 20))
            .unwrap();
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(
            r.details["problems"],
            json!(["replicas did not converge: applied indices n1 9, n2 no answer"])
        );
    }
}
