//! The insert-retry workload inside a campaign: what the history must
//! record for the dedup checker (docs/ARCHITECTURE.md, "History": the
//! `insert`, `read` and `dedup-window` shapes), written as the workers go.
//!
//! * [`window_event`] — the `dedup-window` line: the table's window (ids
//!   and seconds), the clock-skew bound ε the checker allows, and the
//!   replicas the final phase must read.
//! * [`worker`] — one client process: logical inserts at its pace, each
//!   attempt an `insert` operation (invoke with the exact blocks, then
//!   `ok` with the server's summary, `fail` with the code of a definite
//!   error, or `info`), retried after an indeterminate outcome — same
//!   rows, same token, same split — on the same replica or another until
//!   `ok`, a definite failure, or its attempts run out. A delayed-retry
//!   insert is sent once more after the window has passed, whatever its
//!   first outcome, so the window's edge is exercised.
//! * [`final_reads`] — after the heal: `SYSTEM SYNC REPLICA` and a read
//!   of every row on every replica, a `read` operation keyed by the
//!   replica, retried until it answers.
//!
//! What it does not do: judge. It never decides whether a row should be
//! there; that is the dedup checker's, from what was recorded.

use crate::campaign::Pace;
use crate::recorder::Recorder;
use drift_checkers::history::{OpType, Process};
use drift_workloads::table::{self, AttemptOutcome, Dialect, InsertGen};
use drift_workloads::Rng;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The operation name of an insert attempt and of a replica's final read.
pub const INSERT_F: &str = "insert";
pub const READ_F: &str = "read";
/// Tries a replica's final read gets before the phase records it failed.
const FINAL_READ_TRIES: u32 = 10;
/// A retry after an indeterminate outcome waits between these (ms): long
/// enough for a restarted replica or a new session, short enough that a
/// retry usually lands inside the window.
const RETRY_DELAY_MS: (u64, u64) = (50, 400);

/// The replicas a campaign writes to: (replica name as the table names
/// it, `http://addr/`).
#[derive(Clone, Debug)]
pub struct Replicas(pub Vec<(String, String)>);

impl Replicas {
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|(n, _)| n.clone()).collect()
    }
}

/// The insert client's knobs, from the plan.
#[derive(Clone, Debug)]
pub struct InsertClient {
    pub replicas: Replicas,
    pub op_timeout: Duration,
    pub attempts_max: u32,
    /// How long a delayed retry waits: past the window's seconds, with
    /// two cleanup periods for the leader to act on them.
    pub delayed_retry: Duration,
    /// What the replicas' server takes (drift's table: everything).
    pub dialect: Dialect,
}

/// The `dedup-window` line's value.
pub fn window_event(window: u64, window_s: u64, epsilon_ms: u64, replicas: &Replicas) -> Value {
    json!({
        "window": window,
        "window_seconds": window_s,
        "epsilon_ms": epsilon_ms,
        "replicas": replicas.names(),
    })
}

fn record_attempt_invoke(r: &Recorder, process: u64, value: Value, replica: &str) {
    r.record(
        Process::Client(process),
        OpType::Invoke,
        INSERT_F,
        value,
        None,
        Some(replica.to_string()),
        None,
    );
}

fn record_attempt_outcome(r: &Recorder, process: u64, replica: &str, o: &AttemptOutcome) {
    let (kind, value, error) = match o {
        AttemptOutcome::Ok(summary) => (OpType::Ok, summary.clone(), None),
        AttemptOutcome::Fail(code, why) => (OpType::Fail, json!({"code": code}), Some(why.clone())),
        AttemptOutcome::Info(code, why) => (OpType::Info, json!({"code": code}), Some(why.clone())),
    };
    r.record(
        Process::Client(process),
        kind,
        INSERT_F,
        value,
        None,
        Some(replica.to_string()),
        error,
    );
}

async fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        tokio::time::sleep(t - now).await;
    }
}

/// One client process of the workload, until `pace.until`.
pub async fn worker(w: u64, pace: Pace, r: Recorder, client: Arc<InsertClient>) {
    let mut rng = Rng::new(Rng::derive(pace.seed, &format!("worker-{w}")));
    let Ok(http) = reqwest::Client::builder().build() else {
        r.event("worker-failed", json!({"worker": w, "why": "no HTTP client"}));
        return;
    };
    let replicas = &client.replicas.0;
    let mut gen = InsertGen::for_dialect(w, client.dialect);
    let mut process = w;
    let mut next = Instant::now() + pace.every.mul_f64(rng.unit());
    while Instant::now() < pace.until {
        sleep_until(next).await;
        next = next.max(Instant::now()) + pace.every.mul_f64(0.5 + rng.unit());
        if Instant::now() >= pace.until {
            break;
        }
        let l = gen.next(&mut rng);
        let mut at = rng.below(replicas.len() as u64) as usize;
        let mut delayed_sent = false;
        for n in 1..=client.attempts_max {
            let (name, url) = &replicas[at];
            record_attempt_invoke(&r, process, l.invoke_value(n, name), name);
            let o = table::attempt(&http, url, &l, client.op_timeout, &client.dialect).await;
            record_attempt_outcome(&r, process, name, &o);
            let wait = match &o {
                AttemptOutcome::Ok(_) if l.delayed() && !delayed_sent => {
                    // sent again past the window: 1 or 2 copies may stay
                    delayed_sent = true;
                    client.delayed_retry
                }
                AttemptOutcome::Ok(_) | AttemptOutcome::Fail(..) => break,
                AttemptOutcome::Info(..) => {
                    // the process may still be executing it: a new one
                    process += pace.stride;
                    if l.delayed() && !delayed_sent {
                        delayed_sent = true;
                        client.delayed_retry
                    } else {
                        Duration::from_millis(RETRY_DELAY_MS.0 + rng.below(RETRY_DELAY_MS.1 - RETRY_DELAY_MS.0))
                    }
                }
            };
            if Instant::now() + wait >= pace.until {
                break;
            }
            tokio::time::sleep(wait).await;
            // the same replica, or another one
            if replicas.len() > 1 && rng.below(2) == 1 {
                at = (at + 1 + rng.below(replicas.len() as u64 - 1) as usize) % replicas.len();
            }
        }
    }
}

/// The final phase: every replica synced and read, each read retried
/// until it answers; a replica that never does is an event (the dedup
/// checker then says which replica went unread).
pub async fn final_reads(r: Recorder, client: Arc<InsertClient>, first_process: u64, per_read: Duration) {
    let Ok(http) = reqwest::Client::builder().build() else {
        r.event("final-op-failed", json!({"f": READ_F, "why": "no HTTP client"}));
        return;
    };
    let mut process = 1_000_000 + first_process;
    for (name, url) in &client.replicas.0 {
        let mut done = false;
        for _ in 0..FINAL_READ_TRIES {
            r.record(
                Process::Client(process),
                OpType::Invoke,
                READ_F,
                Value::Null,
                Some(name.clone()),
                Some(name.clone()),
                None,
            );
            let got = table::sync_and_read(&http, url, per_read).await;
            let (kind, value, error) = match got {
                Ok(rows) => (OpType::Ok, Value::Array(rows), None),
                // a read changes nothing: a failed one did not happen; say
                // what the replica was stuck on, for whoever reads the run
                Err(e) => {
                    let state = table::replica_state(&http, url).await;
                    (OpType::Fail, Value::Null, Some(format!("{e}; replica state: {state}")))
                }
            };
            r.record(
                Process::Client(process),
                kind,
                READ_F,
                value,
                Some(name.clone()),
                Some(name.clone()),
                error,
            );
            process += 1;
            if kind == OpType::Ok {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !done {
            r.event("final-op-failed", json!({"f": READ_F, "key": name}));
        }
    }
}
