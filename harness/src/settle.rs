//! After the faults, for real servers and the simulator alike (over a
//! [`Stage`]): the heal phase (every fault stopped, every server back,
//! the replicas given time to converge; the `healed` event) and the
//! final digests once the final phase's writes have settled (the
//! `final-digests` event the `digest` checker judges).

use crate::nemesis::{self, Stage};
use serde_json::json;

/// How often convergence is looked at.
const POLL_MS: u64 = 200;

/// The heal: every fault stopped and every server back
/// ([`nemesis::heal_all`]; with `table` and `kv` their hooks off too),
/// then up to `limit_ms` for a leader and one applied index everywhere.
/// Records `healed`.
pub async fn heal<S: Stage>(s: &S, table: bool, kv: bool, limit_ms: u64) {
    let note = nemesis::heal_all(s, table, kv).await;
    let converged = converged(s, limit_ms).await;
    s.event("healed", json!({"converged": converged.is_ok(), "note": note}));
}

/// Once the servers agree (up to `limit_ms`), every answering server's
/// applied index and digest. Records `final-digests`.
pub async fn final_digests<S: Stage>(s: &S, limit_ms: u64) {
    let converged = converged(s, limit_ms).await;
    let nodes = s
        .with_cluster(|c, _| {
            c.ids()
                .into_iter()
                .filter_map(|i| {
                    c.digest(i)
                        .map(|(a, d)| json!({"node": i, "applied_index": a, "digest": d}))
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    s.event(
        "final-digests",
        json!({
            "converged": converged.is_ok(),
            "note": converged.as_ref().err(),
            "nodes": nodes,
        }),
    );
}

/// Waits up to `limit_ms` until a leader is known and every server is up
/// at one applied index; else where each stood (the `note` of an event
/// that did not converge).
pub async fn converged<S: Stage>(s: &S, limit_ms: u64) -> Result<(), String> {
    let deadline = s.now_ms() + limit_ms;
    loop {
        let look = s.with_cluster(|c, _| {
            let ids = c.ids();
            let applied: Vec<Option<String>> = ids.iter().map(|&i| c.applied_index(i)).collect();
            let agree = c.leader().is_some() && applied.iter().all(|a| a.is_some() && *a == applied[0]);
            (agree, applied_line(&ids, &applied))
        });
        let (agree, last) = look.unwrap_or_else(|| (false, nemesis::POISONED.into()));
        if agree {
            return Ok(());
        }
        if s.now_ms() >= deadline {
            return Err(format!("applied indices {last}"));
        }
        if !s.sleep_until_ms(s.now_ms() + POLL_MS).await {
            return Err(format!("the run stopped first; applied indices {last}"));
        }
    }
}

/// "n1 120, n2 120, n3 no answer": each server's applied index, for a
/// person reading the node events or the error.
pub fn applied_line(ids: &[u64], applied: &[Option<String>]) -> String {
    ids.iter()
        .zip(applied)
        .map(|(i, a)| format!("n{i} {}", a.as_deref().unwrap_or("no answer")))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applied_line_names_each_server_without_debug_text() {
        let line = applied_line(&[1, 2, 3], &[Some("120".into()), None, Some("0".into())]);
        assert_eq!(line, "n1 120, n2 no answer, n3 0");
    }
}
