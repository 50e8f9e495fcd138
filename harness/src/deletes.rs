//! The delete workload inside a campaign: what the history must record
//! for the convergence checker (docs/ARCHITECTURE.md, "History": the
//! `put`, `delete`, `get`, `kv-config`, `kv-repair`, `kv-gc` and
//! `kv-replica` shapes), written as the workers go — once, over a
//! [`KvService`]: real servers over HTTP ([`HttpKv`]) or the simulated
//! ones (the simulator's `sim/kv.rs`).
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
use drift_workloads::{OpSpec, Outcome, Rng, Workload};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The kv service as the delete workload reaches it, and the history it
/// writes to.
pub trait KvService {
    /// The servers a client may ask.
    fn servers(&self) -> Vec<u64>;
    /// Sends `op` to `server`: what came of it.
    async fn request(&self, server: u64, op: &OpSpec) -> Outcome;
    /// Has `server` repair its ranges `rounds` times over: its answer,
    /// `{"sessions": [report…]}`.
    async fn repair(&self, server: u64, rounds: u32) -> Result<Value, String>;
    /// `server`'s content and Merkle roots.
    async fn dump(&self, server: u64) -> Result<Value, String>;
    /// A client's operation into the history.
    #[allow(clippy::too_many_arguments)] // one field of the history's operation each
    fn record(
        &self,
        process: u64,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: u64,
        error: Option<String>,
    );
    /// An event into the history.
    fn event(&self, f: &str, value: Value);
    /// What the campaign is doing now (the progress line).
    fn set_phase(&self, _what: String) {}
}

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
/// parameters and the clock then (`start_ts_us`, µs since the epoch: the
/// controller's, or the simulation's), from which findings count their
/// times.
pub fn config_event(k: &crate::plan::KvPlan, start_ts_us: u64, clock_skew_ms: u64) -> Value {
    json!({"rf": k.rf, "w": k.w, "r": k.r, "gc": k.gc.name(), "gc_grace_ms": k.gc_grace_ms,
        "repair_interval_ms": k.repair_interval_ms, "start_ts_us": start_ts_us, "clock_skew_ms": clock_skew_ms})
}

/// How far apart two kv servers' clocks may be in `plan`'s campaign (the
/// `kv-config` event's `clock_skew_ms`): on machines,
/// [`crate::plan::CLOCK_SKEW_MS`]; simulated, what the world's clock
/// drift makes of the run's length (each server drifts by up to the
/// drift either way, for the main phase and up to three minutes of setup,
/// heal and final phase); with the `clock` fault, its most besides.
pub fn clock_skew_ms(plan: &crate::plan::Plan) -> u64 {
    let fault = if plan.nemeses.contains(&crate::nemesis::FaultKind::Clock) {
        crate::plan::CLOCK_FAULT_SKEW_MS
    } else {
        0
    };
    let clocks = match &plan.sim {
        Some(sim) => 2 * sim.clock_drift_ppm * (plan.time_limit_s + 180) / 1000,
        None => crate::plan::CLOCK_SKEW_MS,
    };
    clocks + fault
}

/// The delete workload's client in the one worker loop
/// (`drift_workloads::worker::run`): each operation one kv request to a
/// server drawn for it, never retried (an indeterminate one retires its
/// process).
pub struct KvRequests<S: KvService> {
    w: u64,
    service: S,
    servers: Vec<u64>,
    workload: Workload,
    unique: u64,
}

impl<S: KvService> KvRequests<S> {
    /// Worker `w`'s client of `service`.
    pub fn new(w: u64, service: S, workload: Workload) -> KvRequests<S> {
        KvRequests {
            w,
            servers: service.servers(),
            service,
            workload,
            unique: 0,
        }
    }
}

impl<S: KvService> Client for KvRequests<S> {
    /// The operation and the server it goes to.
    type Op = (OpSpec, u64);

    fn draw(&mut self, rng: &mut Rng) -> (OpSpec, u64) {
        let op = self.workload.next(rng, self.w, &mut self.unique);
        (op, self.servers[rng.below(self.servers.len() as u64) as usize])
    }

    async fn attempt(&mut self, (op, node): &(OpSpec, u64), _n: u32, process: u64) -> Ended {
        let record = |kind: OpType, value: Value, error: Option<String>| {
            self.service
                .record(process, kind, op.f, value, op.key.clone(), *node, error)
        };
        record(OpType::Invoke, op.value.clone(), None);
        let outcome = self.service.request(*node, op).await;
        let (kind, value, error) = outcome.completion();
        record(kind, value, error);
        Ended::of(kind)
    }
}

/// Real kv servers over HTTP, and the campaign's recorder.
pub struct HttpKv {
    r: Recorder,
    client: Arc<KvClient>,
    http: reqwest::Client,
}

impl HttpKv {
    pub fn new(r: Recorder, client: Arc<KvClient>, http: reqwest::Client) -> HttpKv {
        HttpKv { r, client, http }
    }

    fn base(&self, server: u64) -> Result<&str, String> {
        self.client
            .servers
            .iter()
            .find(|(id, _)| *id == server)
            .map(|(_, b)| b.as_str())
            .ok_or_else(|| format!("no kv address for server {server}"))
    }
}

impl KvService for HttpKv {
    fn servers(&self) -> Vec<u64> {
        self.client.servers.iter().map(|(id, _)| *id).collect()
    }

    async fn request(&self, server: u64, op: &OpSpec) -> Outcome {
        match self.base(server) {
            Ok(base) => drift_workloads::kv::execute(&self.http, base, op, self.client.op_timeout).await,
            Err(e) => Outcome::Fail(e),
        }
    }

    async fn repair(&self, server: u64, rounds: u32) -> Result<Value, String> {
        let path = format!("/repair?rounds={rounds}");
        call(&self.http, "POST", self.base(server)?, &path, FINAL_REPAIR_TIMEOUT).await
    }

    async fn dump(&self, server: u64) -> Result<Value, String> {
        call(
            &self.http,
            "GET",
            self.base(server)?,
            "/dump",
            self.client.op_timeout * 5,
        )
        .await
    }

    fn record(
        &self,
        process: u64,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: u64,
        error: Option<String>,
    ) {
        self.r.record(
            Process::Client(process),
            kind,
            f,
            value,
            key,
            Some(node.to_string()),
            error,
        )
    }

    fn event(&self, f: &str, value: Value) {
        self.r.event(f, value);
    }

    fn set_phase(&self, what: String) {
        self.r.set_phase(what);
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
async fn repair_all<S: KvService>(s: &S, rounds: u32, pass: u64) {
    for node in s.servers() {
        s.set_phase(format!(
            "repair pass {pass} of 2 ({}), on server {node}",
            if pass == 1 {
                "two rounds over every range"
            } else {
                "must find nothing"
            }
        ));
        match s.repair(node, rounds).await {
            Ok(v) => {
                for report in v["sessions"].as_array().into_iter().flatten() {
                    let mut report = report.clone();
                    report["node"] = json!(node);
                    report["pass"] = json!(pass);
                    s.event(REPAIR_F, report);
                }
            }
            Err(e) => s.event(
                "final-op-failed",
                json!({"f": "repair", "node": node, "pass": pass, "why": e}),
            ),
        }
    }
}

/// The final phase (see the module header).
pub async fn final_phase<S: KvService>(s: &S) {
    repair_all(s, 2, 1).await;
    for node in s.servers() {
        s.set_phase(format!("final read of server {node}'s content and Merkle roots"));
        match s.dump(node).await {
            Ok(v) => s.event(REPLICA_F, v),
            Err(e) => s.event("final-op-failed", json!({"f": "dump", "node": node, "why": e})),
        }
    }
    repair_all(s, 1, 2).await;
}
