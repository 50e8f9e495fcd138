//! The insert-retry workload inside a campaign: what the history must
//! record for the dedup checker (docs/ARCHITECTURE.md, "History": the
//! `insert`, `read` and `dedup-window` shapes), written as the workers go.
//!
//! * [`window_event`] — the `dedup-window` line: the table's window (ids
//!   and seconds), the clock-skew bound ε the checker allows, and the
//!   replicas the final phase must read.
//! * [`TableService`] — the replicas as the client reaches them: over
//!   HTTP ([`HttpTable`]) or in the simulator.
//! * [`Inserter`] — the workload's client in the one worker loop: logical
//!   inserts at its worker's pace, each attempt an `insert` operation
//!   (invoke with the exact blocks, then
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

use crate::recorder::Recorder;
use drift_checkers::history::{OpType, Process};
use drift_workloads::table::{self, AttemptOutcome, Dialect, InsertGen};
use drift_workloads::worker::{Client, Ended, Then};
use drift_workloads::Rng;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The operation name of an insert attempt and of a replica's final read.
pub const INSERT_F: &str = "insert";
pub const READ_F: &str = "read";
/// Most tries of a replica's final read (a bound on the history it adds;
/// its time share usually ends it first).
const FINAL_READ_TRIES_MAX: u32 = 200;
/// The pause between two of them, and the least time one gets.
const FINAL_READ_PAUSE: Duration = Duration::from_secs(1);
const FINAL_READ_TIMEOUT_MIN: Duration = Duration::from_secs(5);
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

/// The `dedup-window` line's value; `witness`: the coordinator records
/// every block id it creates and removes (the checker's rule 6a).
pub fn window_event(window: u64, window_s: u64, epsilon_ms: u64, replicas: Vec<String>, witness: bool) -> Value {
    json!({
        "window": window,
        "window_seconds": window_s,
        "epsilon_ms": epsilon_ms,
        "replicas": replicas,
        "witness": witness,
    })
}

/// A table's replicas as the workload's client reaches them: over HTTP
/// ([`HttpTable`]), or inside the simulator (the `sim` module's table). The
/// client's policy ([`Inserter`]) and the final phase ([`final_reads`])
/// are written once over it.
pub trait TableService {
    /// The replicas' names, as the table names them; a replica is asked
    /// by its index here.
    fn replicas(&self) -> Vec<String>;
    /// Attempt `n` of `l` on replica `at`.
    async fn attempt(&self, at: usize, l: &table::LogicalInsert, n: u32) -> AttemptOutcome;
    /// `SYSTEM SYNC REPLICA` on replica `at`, then all its rows, within
    /// `timeout`.
    async fn sync_and_read(&self, at: usize, timeout: Duration) -> Result<Vec<Value>, String>;
    /// What replica `at` says of itself, for a failed final read's record.
    async fn replica_state(&self, at: usize) -> String;
    /// A client's operation into the history.
    #[allow(clippy::too_many_arguments)] // one field of the history's operation each
    fn record(
        &self,
        process: u64,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: Option<String>,
        error: Option<String>,
    );
    /// An event into the history.
    fn event(&self, f: &str, value: Value);
    /// What the campaign is doing now (the progress line).
    fn set_phase(&self, _what: String) {}
    /// The service's clock (µs from any origin), and a wait on it.
    fn now_us(&self) -> u64;
    async fn sleep_us(&self, us: u64);
}

/// drift's table or ClickHouse over HTTP, recorded by a campaign's
/// [`Recorder`].
#[derive(Clone)]
pub struct HttpTable {
    r: Recorder,
    client: Arc<InsertClient>,
    http: reqwest::Client,
    t0: Instant,
}

impl HttpTable {
    pub fn new(r: Recorder, client: Arc<InsertClient>, http: reqwest::Client) -> HttpTable {
        HttpTable {
            r,
            client,
            http,
            t0: Instant::now(),
        }
    }
}

impl TableService for HttpTable {
    fn replicas(&self) -> Vec<String> {
        self.client.replicas.names()
    }

    async fn attempt(&self, at: usize, l: &table::LogicalInsert, n: u32) -> AttemptOutcome {
        let url = &self.client.replicas.0[at].1;
        table::attempt(&self.http, url, l, n, self.client.op_timeout, &self.client.dialect).await
    }

    async fn sync_and_read(&self, at: usize, timeout: Duration) -> Result<Vec<Value>, String> {
        table::sync_and_read(&self.http, &self.client.replicas.0[at].1, timeout).await
    }

    async fn replica_state(&self, at: usize) -> String {
        table::replica_state(&self.http, &self.client.replicas.0[at].1).await
    }

    fn record(
        &self,
        process: u64,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: Option<String>,
        error: Option<String>,
    ) {
        self.r
            .record(Process::Client(process), kind, f, value, key, node, error);
    }

    fn event(&self, f: &str, value: Value) {
        self.r.event(f, value);
    }

    fn set_phase(&self, what: String) {
        self.r.set_phase(what);
    }

    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    async fn sleep_us(&self, us: u64) {
        tokio::time::sleep(Duration::from_micros(us)).await
    }
}

/// The insert-retry workload's client in the one worker loop
/// (`drift_workloads::worker::run`): logical inserts through a
/// [`TableService`], each attempt an `insert` operation, retried by
/// [`Inserter`]'s policy ([`Client::then`]).
pub struct Inserter<S: TableService> {
    service: S,
    gen: InsertGen,
    replicas: Vec<String>,
    attempts_max: u32,
    delayed_retry: Duration,
    /// The replica the next attempt goes to.
    at: usize,
    /// Whether a delayed-retry insert was sent again past the window.
    delayed_sent: bool,
}

impl<S: TableService> Inserter<S> {
    /// Worker `w`'s client through `service`, with the policy's knobs
    /// from `client`.
    pub fn new(w: u64, service: S, client: &InsertClient) -> Inserter<S> {
        Inserter {
            gen: InsertGen::for_dialect(w, client.dialect),
            replicas: service.replicas(),
            service,
            attempts_max: client.attempts_max,
            delayed_retry: client.delayed_retry,
            at: 0,
            delayed_sent: false,
        }
    }
}

impl<S: TableService> Client for Inserter<S> {
    type Op = table::LogicalInsert;

    /// A logical insert and the replica of its first attempt.
    fn draw(&mut self, rng: &mut Rng) -> table::LogicalInsert {
        let l = self.gen.next(rng);
        self.at = rng.below(self.replicas.len() as u64) as usize;
        self.delayed_sent = false;
        l
    }

    async fn attempt(&mut self, l: &table::LogicalInsert, n: u32, process: u64) -> Ended {
        let name = self.replicas[self.at].clone();
        let node = Some(name.clone());
        self.service.record(
            process,
            OpType::Invoke,
            INSERT_F,
            l.invoke_value(n, &name),
            None,
            node.clone(),
            None,
        );
        let o = self.service.attempt(self.at, l, n).await;
        let (kind, value, error) = o.completion();
        self.service.record(process, kind, INSERT_F, value, None, node, error);
        Ended::of(kind)
    }

    /// Until `ok`, a definite failure, or the attempts run out: after an
    /// indeterminate outcome the same insert again — same rows, token and
    /// split — a moment later, on the same replica or another; a
    /// delayed-retry insert once more past the window, whatever its first
    /// outcome (1 or 2 copies may then stay).
    fn then(&mut self, l: &table::LogicalInsert, n: u32, ended: Ended, rng: &mut Rng) -> Then {
        if n >= self.attempts_max {
            return Then::Done;
        }
        let wait = match ended.kind {
            OpType::Info | OpType::Ok if l.delayed() && !self.delayed_sent => {
                self.delayed_sent = true;
                self.delayed_retry
            }
            OpType::Info => Duration::from_millis(RETRY_DELAY_MS.0 + rng.below(RETRY_DELAY_MS.1 - RETRY_DELAY_MS.0)),
            _ => return Then::Done,
        };
        // the same replica, or another one
        let replicas = self.replicas.len();
        if replicas > 1 && rng.below(2) == 1 {
            self.at = (self.at + 1 + rng.below(replicas as u64 - 1) as usize) % replicas;
        }
        Then::Again {
            after_us: wait.as_micros() as u64,
        }
    }
}

/// The final phase: every replica synced and read, each read retried
/// (a second apart) until it answers or `per_replica` has passed since its
/// first try — a replica that lost its coordinator session in the last
/// fault can take many seconds to get a new one (ClickHouse 18.16's
/// restarting thread tries every ten); a replica that never answers is an
/// event (the dedup checker then says which replica went unread).
pub async fn final_reads<S: TableService>(service: &S, first_process: u64, per_replica: Duration) {
    let mut process = drift_workloads::worker::FINAL_PROCESS_BASE + first_process;
    let per_replica_us = per_replica.as_micros() as u64;
    let pause_us = FINAL_READ_PAUSE.as_micros() as u64;
    for (at, name) in service.replicas().into_iter().enumerate() {
        let deadline = service.now_us() + per_replica_us;
        service.set_phase(format!("sync and final read of replica {name}"));
        let mut done = false;
        for _ in 0..FINAL_READ_TRIES_MAX {
            let node = Some(name.clone());
            service.record(
                process,
                OpType::Invoke,
                READ_F,
                Value::Null,
                node.clone(),
                node.clone(),
                None,
            );
            let left = Duration::from_micros(deadline.saturating_sub(service.now_us())).max(FINAL_READ_TIMEOUT_MIN);
            let (kind, value, error) = match service.sync_and_read(at, left).await {
                Ok(rows) => (OpType::Ok, Value::Array(rows), None),
                // a read changes nothing: a failed one did not happen; say
                // what the replica was stuck on, for whoever reads the run
                Err(e) => {
                    let state = service.replica_state(at).await;
                    (OpType::Fail, Value::Null, Some(format!("{e}; replica state: {state}")))
                }
            };
            service.record(process, kind, READ_F, value, node.clone(), node, error);
            process += 1;
            if kind == OpType::Ok {
                done = true;
                break;
            }
            if service.now_us() + pause_us >= deadline {
                break;
            }
            service.sleep_us(pause_us).await;
        }
        if !done {
            service.event("final-op-failed", json!({"f": READ_F, "key": name}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A replica that answers every query `Code: 999 … Session expired`
    /// for `sick`, then syncs and reads one row: what a ClickHouse server
    /// whose coordinator session is being renewed does.
    fn recovering_replica(sick: Duration) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let since = Instant::now();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut buf = vec![0u8; 64 << 10];
                let n = s.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let (status, body) = if since.elapsed() < sick {
                    ("500 Internal Server Error", "Code: 999, e.displayText() = Coordination::Exception: Session expired (Session expired), e.what() = Coordination::Exception\n".to_string())
                } else if req.contains("SELECT id, p, tag") {
                    ("200 OK", "{\"id\":16,\"p\":1,\"tag\":\"L1\"}\n".to_string())
                } else {
                    ("200 OK", String::new())
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        addr
    }

    #[test]
    fn a_replica_renewing_its_session_is_read_once_it_has_one() {
        let addr = recovering_replica(Duration::from_secs(6));
        let dir = std::env::temp_dir().join(format!("drift-final-reads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let (r, handle) = Recorder::start(&path, Instant::now()).unwrap();
        let client = Arc::new(InsertClient {
            replicas: Replicas(vec![("r1".into(), format!("http://{addr}/"))]),
            op_timeout: Duration::from_secs(2),
            attempts_max: 1,
            delayed_retry: Duration::from_secs(1),
            dialect: Dialect::DRIFT,
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let service = HttpTable::new(r.clone(), client, reqwest::Client::new());
        rt.block_on(final_reads(&service, 0, Duration::from_secs(30)));
        drop(service);
        drop(r);
        handle.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let reads: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|o| o["f"] == READ_F && o["type"] != "invoke")
            .collect();
        assert!(reads.len() > 1, "it failed first: {text}");
        assert_eq!(reads.last().unwrap()["type"], "ok", "{text}");
        assert_eq!(reads.last().unwrap()["value"], json!([[16, 1, "L1"]]));
        assert!(!text.contains("final-op-failed"), "{text}");
    }
}
