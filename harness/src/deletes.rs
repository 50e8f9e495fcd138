//! The delete workload inside a campaign: what the history must record
//! for the convergence checker (docs/ARCHITECTURE.md, "History": the
//! `put`, `delete`, `get`, `kv-config`, `kv-repair`, `kv-gc` and
//! `kv-replica` shapes), written as the workers go.
//!
//! * [`config_event`] — the `kv-config` line: RF, W, R and the GC policy
//!   the checker judges by.
//! * [`KvRequests`] — the workload's client in the one worker loop: puts
//!   (values no other put carries), deletes and reads on a few keys, each
//!   through a server it picks,
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

use crate::recorder::Recorder;
use drift_checkers::convergence::{CONFIG_F, REPAIR_F, REPLICA_F};
use drift_checkers::history::{OpType, Process};
use drift_workloads::worker::{Client, Ended};
use drift_workloads::{OpSpec, Rng, Workload};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

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

/// The delete workload's client in the one worker loop
/// (`drift_workloads::worker::run`): each operation one kv request to a
/// server drawn for it, never retried (an indeterminate one retires its
/// process).
pub struct KvRequests {
    w: u64,
    r: Recorder,
    client: Arc<KvClient>,
    workload: Workload,
    http: reqwest::Client,
    unique: u64,
}

impl KvRequests {
    /// Worker `w`'s client, sending with `http`.
    pub fn new(w: u64, r: Recorder, client: Arc<KvClient>, workload: Workload, http: reqwest::Client) -> KvRequests {
        KvRequests {
            w,
            r,
            client,
            workload,
            http,
            unique: 0,
        }
    }
}

impl Client for KvRequests {
    /// The operation and the server it goes to.
    type Op = (OpSpec, usize);

    fn draw(&mut self, rng: &mut Rng) -> (OpSpec, usize) {
        let op = self.workload.next(rng, self.w, &mut self.unique);
        (op, rng.below(self.client.servers.len() as u64) as usize)
    }

    async fn attempt(&mut self, (op, at): &(OpSpec, usize), _n: u32, process: u64) -> Ended {
        let (node, base) = &self.client.servers[*at];
        let record = |kind: OpType, value: Value, error: Option<String>| {
            self.r.record(
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
        let outcome = drift_workloads::kv::execute(&self.http, base, op, self.client.op_timeout).await;
        let (kind, value, error) = outcome.completion();
        record(kind, value, error);
        Ended::of(kind)
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
