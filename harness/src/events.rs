//! One map from a node's log line to the event it puts on the history's
//! timeline, for the process monitor of a campaign (`campaign.rs`, which
//! tails the servers' log files) and for the simulator (`sim/`, which
//! reads its servers' logs at the end): the same line becomes the same
//! history event in both worlds. The names are the node's
//! ([`drift_keeper::NodeEvent`]); the match is exhaustive, so an event a
//! node learns to log is given its meaning here.

use drift_keeper::NodeEvent;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The dedup witness's lines already recorded: every keeper replica logs
/// each block id's creation and removal, and a restarted one logs again
/// what it replays; one history line each.
#[derive(Default)]
pub struct Witnessed(BTreeSet<(i64, String, String)>);

/// The history event (its `f` and value) that `line`, logged by `node`,
/// becomes, if any.
pub fn history_event(node: u64, line: &Value, seen: &mut Witnessed) -> Option<(&'static str, Value)> {
    let event = NodeEvent::parse(line["event"].as_str()?)?;
    let index = line["log_index"].as_u64().unwrap_or(0);
    Some(match event {
        NodeEvent::BlockId => {
            let (Some(zxid), Some(op), Some(path)) =
                (line["zxid"].as_i64(), line["op"].as_str(), line["path"].as_str())
            else {
                return None;
            };
            if !seen.0.insert((zxid, op.to_string(), path.to_string())) {
                return None;
            }
            (
                drift_checkers::dedup::WITNESS_F,
                json!({"op": op, "path": path, "zxid": zxid, "ctime_ms": line["ctime_ms"], "session": line["session"],
                    "data": line["data"]}),
            )
        }
        NodeEvent::InsertBlock => (
            drift_checkers::dedup::BLOCK_OF_F,
            json!({"query_id": line["query_id"], "block_id": line["block_id"], "node": node}),
        ),
        NodeEvent::DigestMismatch => (
            "digest-abort",
            json!({"node": node, "log_index": index, "phase": line["phase"], "request": line["request"]}),
        ),
        NodeEvent::DivergeApplied => ("diverge-applied", json!({"node": node, "log_index": index})),
        NodeEvent::Role if line["role"] == "Leader" => ("leader", json!({"node": node, "term": line["term"]})),
        NodeEvent::Role => return None,
        NodeEvent::Panic => ("node-panic", json!({"node": node, "what": line["what"]})),
        NodeEvent::SnapshotInstalled => ("snapshot-installed", json!({"node": node, "index": line["index"]})),
        NodeEvent::ChangelogTornTail => ("torn-tail-repaired", json!({"node": node, "file": line["file"]})),
        // the final phase records the repairs it asks for itself
        NodeEvent::KvRepair if line["trigger"] == "schedule" => {
            let mut e = line.clone();
            if let Some(o) = e.as_object_mut() {
                for k in ["ts_ms", "service", "event", "trigger"] {
                    o.remove(k);
                }
            }
            (drift_checkers::convergence::REPAIR_F, e)
        }
        NodeEvent::KvRepair => return None,
        NodeEvent::KvGc => (
            drift_checkers::convergence::GC_F,
            json!({"node": node, "grace_ms": line["grace_ms"], "horizon_ts": line["horizon_ts"], "purged": line["purged"],
                "mode": line["mode"], "forced": line["forced"]}),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_abort_carries_its_phase_and_request_and_a_witness_line_is_recorded_once() {
        let mut seen = Witnessed::default();
        let abort = json!({"event": "digest_mismatch", "log_index": 7, "phase": "apply", "request": "create /a"});
        let (f, v) = history_event(2, &abort, &mut seen).unwrap();
        assert_eq!(f, "digest-abort");
        assert_eq!(
            v,
            json!({"node": 2, "log_index": 7, "phase": "apply", "request": "create /a"})
        );
        let witness = json!({"event": "block_id", "op": "create", "path": "/t/blocks/x", "zxid": 9, "session": 1});
        assert!(history_event(1, &witness, &mut seen).is_some());
        assert!(
            history_event(2, &witness, &mut seen).is_none(),
            "the second replica's line is the same commit"
        );
        assert!(history_event(1, &json!({"event": "role", "role": "Follower"}), &mut seen).is_none());
        assert!(history_event(1, &json!({"event": "started"}), &mut seen).is_none());
        let repair = json!({"event": "kv_repair", "trigger": "schedule", "ts_ms": 1, "range": 3});
        assert_eq!(history_event(1, &repair, &mut seen).unwrap().1, json!({"range": 3}));
    }
}
