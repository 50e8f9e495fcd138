//! The simulated run's history (ops stamped with simulated time from
//! the main phase's start) and the znode workers' world in the
//! simulator: its client's sessions, its executor's virtual time, that
//! history.

use super::client::{SimZk, Spec};
use super::exec::{self, W};
use drift_checkers::history::{Op, OpType, Process};
use drift_keeper::sim::Cluster;
use drift_workloads::{OpSpec, Outcome};
use serde_json::json;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The history as it is recorded: ops stamped with simulated time.
#[derive(Default)]
pub struct Recording {
    pub ops: Vec<Op>,
    /// Simulated time of the main phase's start: history times count
    /// from it.
    pub t0_us: u64,
}

pub type H = Rc<RefCell<Recording>>;

#[allow(clippy::too_many_arguments)] // one field of the history's operation each
fn record(
    w: &W,
    h: &H,
    process: Process,
    kind: OpType,
    f: &str,
    value: Value,
    key: Option<String>,
    node: Option<String>,
    error: Option<String>,
) {
    let mut r = h.borrow_mut();
    let time = at_ns(exec::now_us(w), r.t0_us);
    r.ops.push(Op {
        index: 0,
        time,
        process,
        kind,
        f: f.into(),
        value,
        key: key.map(Into::into),
        node: node.map(Into::into),
        error,
    });
}

/// A client's operation through the server `node` names.
#[allow(clippy::too_many_arguments)] // one field of the history's operation each
pub fn record_at(
    w: &W,
    h: &H,
    process: u64,
    kind: OpType,
    f: &str,
    value: Value,
    key: Option<String>,
    node: Option<String>,
    error: Option<String>,
) {
    record(w, h, Process::Client(process), kind, f, value, key, node, error);
}

/// Simulated µs `at_us` as history time: ns from the main phase's start.
fn at_ns(at_us: u64, t0_us: u64) -> i64 {
    (at_us as i64 - t0_us as i64) * 1000
}

/// A nemesis event of simulated µs `at_us` (a server's log line, a
/// broken invariant) as a history operation.
fn nemesis_op(at_us: u64, t0_us: u64, f: &str, value: Value) -> Op {
    Op {
        index: 0,
        time: at_ns(at_us, t0_us),
        process: Process::Nemesis,
        kind: OpType::Info,
        f: f.into(),
        value,
        key: None,
        node: None,
        error: None,
    }
}

/// A client's invocation of `f`.
pub fn invoke(w: &W, h: &H, process: u64, f: &str, value: Value, key: Option<String>) {
    record(
        w,
        h,
        Process::Client(process),
        OpType::Invoke,
        f,
        value,
        key,
        None,
        None,
    );
}

pub fn event(w: &W, h: &H, f: &str, value: Value) {
    record(w, h, Process::Nemesis, OpType::Info, f, value, None, None, None);
}

pub fn record_outcome(w: &W, h: &H, p: u64, f: &str, key: &Option<String>, o: &Outcome) {
    let (kind, value, err) = o.completion();
    record(w, h, Process::Client(p), kind, f, value, key.clone(), None, err);
}

/// The znode workers' world in the simulator: its client's sessions, its
/// executor's virtual time, its history.
pub struct Sim {
    pub w: W,
    pub h: H,
    pub spec: Spec,
}

impl drift_workloads::worker::Clock for Sim {
    fn now_us(&self) -> u64 {
        exec::now_us(&self.w)
    }

    async fn sleep_until_us(&self, at_us: u64) {
        exec::sleep_until(&self.w, at_us).await
    }
}

impl drift_workloads::worker::World for Sim {
    type Session = SimZk;

    async fn connect(&self, hint: u64, detached: bool) -> Option<SimZk> {
        SimZk::connect(&self.w, &self.spec, hint as usize, detached).await.ok()
    }

    fn record_invoke(&self, process: u64, op: &OpSpec) {
        invoke(&self.w, &self.h, process, op.f, op.value.clone(), op.key.clone());
    }

    fn record_outcome(&self, process: u64, op: &OpSpec, outcome: &Outcome) {
        record_outcome(&self.w, &self.h, process, op.f, &op.key, outcome);
    }

    fn record_event(&self, f: &str, value: Value) {
        event(&self.w, &self.h, f, value);
    }
}

/// The servers' own log lines onto the history's timeline (through the
/// one log-line→event map, `crate::events`), and the broken invariants
/// as `invariant-violated` events: each node's log as JSON lines (its
/// keeper's lines, its kv server's (`"service": "kv"`) and its table
/// replica's (`"service": "table"`), in time order),
/// and the violations as (server, what).
#[allow(clippy::type_complexity)]
///
/// The servers' log lines are taken out of the cluster, the kv service and
/// the table (each line's fields become its JSON object, not copied).
pub fn onto_timeline(
    cluster: &mut Cluster,
    mut kv: Option<&mut super::kv::KvSim>,
    mut table: Option<&mut super::table::TableSim>,
    t0_us: u64,
    ops: &mut Vec<Op>,
) -> (BTreeMap<u64, Vec<String>>, Vec<(u64, String)>) {
    let mut logs = BTreeMap::new();
    let mut seen = crate::events::Witnessed::default();
    for id in cluster.ids() {
        let keeper = cluster.take_log(id).into_iter().map(|l| (l, None));
        let service = kv
            .as_mut()
            .and_then(|k| k.logs.remove(&id))
            .unwrap_or_default()
            .into_iter()
            .map(|l| (l, Some("kv")));
        let replica = table
            .as_mut()
            .and_then(|t| t.logs.remove(&id))
            .unwrap_or_default()
            .into_iter()
            .map(|l| (l, Some("table")));
        let mut all: Vec<_> = keeper.chain(service).chain(replica).collect();
        // by time; the keeper's lines first within a time (a stable sort)
        all.sort_by_key(|((at, _, _), _)| *at);
        let mut lines = Vec::with_capacity(all.len());
        for ((at, ev, fields), service) in all {
            // the line's own fields win over the four every line has
            let mut o = match fields {
                Value::Object(f) => f,
                _ => serde_json::Map::new(),
            };
            let ts_ms = super::config::EPOCH_MS + (at / 1000) as i64;
            o.entry("ts_ms").or_insert(json!(ts_ms));
            o.entry("node").or_insert(json!(id));
            if let Some(s) = service {
                o.entry("service").or_insert(json!(s));
            }
            o.entry("event").or_insert(json!(ev));
            let line = Value::Object(o);
            if let Some((f, v)) = crate::events::history_event(id, &line, &mut seen) {
                ops.push(nemesis_op(at, t0_us, f, v));
            }
            lines.push(line.to_string());
        }
        logs.insert(id, lines);
    }
    let mut broken: Vec<(u64, u64, String)> = cluster
        .invariants
        .violations
        .iter()
        .map(|v| (v.at_us, v.node, v.what.clone()))
        .collect();
    broken.extend(kv.into_iter().flat_map(|k| k.violations.iter().cloned()));
    broken.extend(table.into_iter().flat_map(|t| t.violations.iter().cloned()));
    for (at_us, node, what) in &broken {
        let value = json!({"node": node, "what": what});
        ops.push(nemesis_op(*at_us, t0_us, "invariant-violated", value));
    }
    (logs, broken.into_iter().map(|(_, n, w)| (n, w)).collect())
}
