//! The delete workload inside a campaign: what the history must record
//! for the convergence checker (docs/ARCHITECTURE.md, "History": the
//! `put`, `delete`, `get`, `kv-config`, `kv-repair`, `kv-gc` and
//! `kv-replica` shapes), written as the workers go.
//!
//! * [`config_event`] — the `kv-config` line: RF, W, R and the GC policy
//!   the checker judges by.
//! * [`worker`] — one client process: puts (values no other put carries),
//!   deletes and reads on a few keys, each through a server it picks,
//!   recorded with the timestamp the system assigned. An indeterminate
//!   write retires the process, as it may still be running.
//! * [`final_phase`] — after the heal, with every server's scheduled
//!   repair and GC paused: two rounds of repair of every range (each
//!   session a `kv-repair` line of pass 1), every server's content and
//!   Merkle roots (`kv-replica`), then one more round (pass 2), which
//!   must find nothing.
//!
//! What it does not do: judge. It never decides which version should
//! have won; that is the convergence checker's, from what was recorded.

use crate::pace::Pace;
use crate::recorder::Recorder;
use drift_checkers::convergence::{CONFIG_F, REPAIR_F, REPLICA_F};
use drift_checkers::history::{OpType, Process};
use drift_workloads::{Outcome, Rng, Workload};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The servers a campaign's workers talk to: (id, `http://addr`).
#[derive(Clone, Debug)]
pub struct KvClient {
    pub servers: Vec<(u64, String)>,
    pub op_timeout: Duration,
}

/// How long one server's final repair may take.
const FINAL_REPAIR_TIMEOUT: Duration = Duration::from_secs(120);

/// The `kv-config` line: its name and value.
pub const CONFIG_EVENT: &str = CONFIG_F;

/// The `kv-config` event, recorded as the main phase starts: the service's
/// parameters and the controller's clock then (`start_ts_us`, µs since the
/// epoch), from which findings count their times.
pub fn config_event(rf: u64, w: u64, r: u64, gc: &str, gc_grace_ms: u64, repair_interval_ms: u64) -> Value {
    let start_ts_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    json!({"rf": rf, "w": w, "r": r, "gc": gc, "gc_grace_ms": gc_grace_ms, "repair_interval_ms": repair_interval_ms,
        "start_ts_us": start_ts_us})
}

/// One client process of the workload, until `pace.until`.
pub async fn worker(w: u64, pace: Pace, r: Recorder, client: Arc<KvClient>, workload: Workload) {
    let mut rng = Rng::new(Rng::derive(pace.seed, &format!("worker-{w}")));
    let Ok(http) = reqwest::Client::builder().build() else {
        r.event("worker-failed", json!({"worker": w, "why": "no HTTP client"}));
        return;
    };
    let mut process = w;
    let mut unique = 0u64;
    let mut next = Instant::now() + pace.every.mul_f64(rng.unit());
    while Instant::now() < pace.until {
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        }
        next = next.max(Instant::now()) + pace.every.mul_f64(0.5 + rng.unit());
        if Instant::now() >= pace.until {
            break;
        }
        let op = workload.next(&mut rng, w, &mut unique);
        let (node, base) = &client.servers[rng.below(client.servers.len() as u64) as usize];
        let record = |kind: OpType, value: Value, error: Option<String>| {
            r.record(
                Process::Client(process),
                kind,
                op.f,
                value,
                op.key.clone(),
                Some(node.to_string()),
                error,
            )
        };
        record(OpType::Invoke, op.value.clone(), None);
        let outcome = drift_workloads::kv::execute(&http, base, &op, client.op_timeout).await;
        let (kind, value, error) = match outcome {
            Outcome::Ok(v) => (OpType::Ok, v, None),
            Outcome::Fail(e) => (OpType::Fail, Value::Null, Some(e)),
            Outcome::Info(e) | Outcome::Partial(_, e) => (OpType::Info, Value::Null, Some(e)),
        };
        record(kind, value, error);
        if kind == OpType::Info {
            process += pace.stride;
        }
    }
}

/// POSTs or GETs `path` on `base`, a few tries; the JSON answered.
async fn call(
    http: &reqwest::Client,
    method: &str,
    base: &str,
    path: &str,
    timeout: Duration,
) -> Result<Value, String> {
    let mut last = String::new();
    for _ in 0..drift_workloads::worker::FINAL_TRIES {
        let req = match method {
            "POST" => http.post(format!("{base}{path}")),
            _ => http.get(format!("{base}{path}")),
        };
        match req.timeout(timeout).send().await {
            Ok(resp) if resp.status().is_success() => match resp.bytes().await {
                Ok(b) => return serde_json::from_slice(&b).map_err(|e| format!("{base}{path}: not JSON: {e}")),
                Err(e) => last = format!("{base}{path}: {e}"),
            },
            Ok(resp) => last = format!("{base}{path}: {}", resp.status()),
            Err(e) => last = format!("{base}{path}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// Every server repairs its ranges `rounds` times over; each session is a
/// `kv-repair` line of pass `pass`.
async fn repair_all(http: &reqwest::Client, r: &Recorder, client: &KvClient, rounds: u32, pass: u64) {
    for (node, base) in &client.servers {
        r.set_phase(format!(
            "repair pass {pass} of 2 ({}), on server {node}",
            if pass == 1 {
                "two rounds over every range"
            } else {
                "must find nothing"
            }
        ));
        match call(
            http,
            "POST",
            base,
            &format!("/repair?rounds={rounds}"),
            FINAL_REPAIR_TIMEOUT,
        )
        .await
        {
            Ok(v) => {
                for s in v["sessions"].as_array().into_iter().flatten() {
                    let mut s = s.clone();
                    s["node"] = json!(node);
                    s["pass"] = json!(pass);
                    r.event(REPAIR_F, s);
                }
            }
            Err(e) => r.event(
                "final-op-failed",
                json!({"f": "repair", "node": node, "pass": pass, "why": e}),
            ),
        }
    }
}

/// The final phase (see the module header).
pub async fn final_phase(r: Recorder, client: Arc<KvClient>) {
    let Ok(http) = reqwest::Client::builder().build() else {
        r.event("final-op-failed", json!({"f": "repair", "why": "no HTTP client"}));
        return;
    };
    repair_all(&http, &r, &client, 2, 1).await;
    for (node, base) in &client.servers {
        r.set_phase(format!("final read of server {node}'s content and Merkle roots"));
        match call(&http, "GET", base, "/dump", client.op_timeout * 5).await {
            Ok(v) => r.event(REPLICA_F, v),
            Err(e) => r.event("final-op-failed", json!({"f": "dump", "node": node, "why": e})),
        }
    }
    repair_all(&http, &r, &client, 1, 2).await;
}
