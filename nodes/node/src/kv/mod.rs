//! The kv service in the node: leaderless last-write-wins replicas on a
//! token ring, any server coordinating, with Merkle anti-entropy repair
//! between servers.
//!
//! Every decision is the sans-IO server's, `drift_repair::server`
//! ([`KvServer`]: stamping and quorums, what a peer's version may be,
//! the responder's sessions, whether a scheduled repair or GC pass runs
//! and with which policy, the fault hooks); the simulator drives the same
//! server. This module is its driver: the HTTP between clients and
//! servers, the log file and its syncs, the clock and the timers, on a
//! tokio runtime of its own beside the keeper's loop.
//!
//! * A write goes to the key's RF replicas and is acknowledged after W of
//!   them logged and synced it. A read asks the replicas and returns the
//!   LWW winner of the first R answers (no read repair, so anti-entropy
//!   is what converges the replicas).
//! * Every `repair_interval_ms` each server repairs the ranges it is the
//!   primary of with every other replica of them, one session per range
//!   and peer; `POST /repair` runs the same on demand.
//! * Every `gc_interval_ms` a GC pass purges tombstones by the cluster
//!   file's policy.
//!
//! # Layout
//! * [`durable`] — the server and its log on disk
//! * [`http`] — the client, replica and repair endpoints

pub mod durable;
pub mod http;

use crate::config::{ClusterConfig, KvDecl};
use crate::error::NodeError;
pub use drift_repair::coord::{ReadResult, WriteResult};
use drift_repair::coord::{ReadRound, Round, WriteRound};
use drift_repair::kv::{GcMode, KvStore};
use drift_repair::replica::Merged;
use drift_repair::ring::Ring;
pub use drift_repair::server::{
    KvServer, LogLine, Refusal, SessionReport, DEFECT_REPAIR_OVERWRITES, KEY_BYTES_MAX, TS_SKEW_MAX_US, VALUE_BYTES_MAX,
};
use drift_repair::server::{ServerConfig, SESSION_ROUNDS_MAX};
use drift_repair::session::{Report, Step};
use drift_repair::wal::{self, Record};
use drift_repair::Entry;
use durable::{Durable, Position, Syncer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct KvNode {
    pub id: u64,
    /// The memory clients' request bodies may hold together, and other
    /// servers' (crate::body).
    pub client_bodies: crate::body::Budget,
    pub peer_bodies: crate::body::Budget,
    cfg: KvDecl,
    ring: Ring,
    peers: BTreeMap<u64, SocketAddr>,
    /// The server's state and decisions, and its log: one lock, so a
    /// change's record is appended before anyone sees the change.
    durable: Mutex<Durable>,
    syncer: Syncer,
    /// The monotonic clock's origin (idle repair sessions are judged on it).
    epoch: Instant,
    http: reqwest::Client,
    /// Signs what this server asks of its peers (`/internal/*`).
    signer: crate::http_auth::Signer,
    /// Checks what peers ask of this one.
    pub(crate) verifier: crate::http_auth::Verifier,
}

pub(crate) fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl KvNode {
    fn lock(&self) -> MutexGuard<'_, Durable> {
        self.durable.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn log(&self, event: &str, fields: serde_json::Value) {
        let mut m = serde_json::json!({
            "ts_ms": wall_us() / 1000, "node": self.id, "service": "kv", "event": event
        });
        if let (Some(o), serde_json::Value::Object(f)) = (m.as_object_mut(), fields) {
            o.extend(f);
        }
        eprintln!("{m}");
    }

    fn log_line(&self, l: LogLine) {
        self.log(l.event, l.fields);
    }

    /// This server's clock, in microseconds, with the `clock` fault.
    pub fn now_ts(&self) -> u64 {
        self.lock().server.now_ts(wall_us())
    }

    fn mono_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    pub fn config(&self) -> &KvDecl {
        &self.cfg
    }

    /// Runs `f` on the server under the lock, appends the changes it
    /// made to the log, and returns where the log ends with its result.
    fn changing<T>(&self, f: impl FnOnce(&mut KvServer) -> T) -> Result<(T, Position), String> {
        let mut d = self.lock();
        let t = f(&mut d.server);
        let pos = d.persist().map_err(|e| format!("kv log: {e}"))?;
        Ok((t, pos))
    }

    fn sync_to(&self, pos: Position) -> Result<(), String> {
        self.syncer
            .sync_to(&self.durable, pos)
            .map_err(|e| format!("kv log sync: {e}"))
    }

    /// Merges `e` here (a peer's version or this coordinator's own),
    /// logs it and syncs the log before returning.
    pub fn apply_local(&self, e: Entry) -> Result<Merged, Refusal> {
        let (merged, pos) = self
            .changing(|s| s.merge(wall_us(), e))
            .map_err(|why| Refusal { status: 500, why })?;
        let merged = merged?;
        // synced even when kept: the version that won may not be yet
        self.sync_to(pos).map_err(|why| Refusal { status: 500, why })?;
        Ok(merged)
    }

    /// This server's version of `key` (a peer's read).
    pub fn get_local(&self, key: &[u8]) -> Result<Option<Entry>, Refusal> {
        self.lock().server.get(key)
    }

    fn peer_url(&self, peer: u64, path: &str) -> Result<String, String> {
        let addr = self
            .peers
            .get(&peer)
            .ok_or_else(|| format!("no kv address for server {peer}"))?;
        Ok(format!("http://{addr}{path}"))
    }

    async fn merge_on(self: &Arc<Self>, replica: u64, e: Entry) -> Result<(), String> {
        if replica == self.id {
            let me = self.clone();
            return match tokio::task::spawn_blocking(move || me.apply_local(e)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(r)) => Err(r.why),
                Err(e) => Err(format!("local apply: {e}")),
            };
        }
        let target = "/internal/merge";
        let url = self.peer_url(replica, target)?;
        let mut body = Vec::new();
        let range = self.ring.range_of_key(&e.key) as u32;
        wal::encode(
            &Record {
                range,
                change: drift_repair::replica::Change::Applied(e),
            },
            &mut body,
        );
        let auth = self.signer.header("POST", target, &body);
        let resp = self
            .http
            .post(&url)
            .header(crate::http_auth::HEADER, auth)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("server {replica}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            Err(format!("server {replica}: {status}: {}", text.trim()))
        }
    }

    async fn get_on(self: &Arc<Self>, replica: u64, key: Vec<u8>) -> Result<Option<Entry>, String> {
        if replica == self.id {
            return self.get_local(&key).map_err(|r| r.why);
        }
        let target = format!("/internal/get/{}", http::percent_encode(&key));
        let url = self.peer_url(replica, &target)?;
        let resp = self
            .http
            .get(&url)
            .header(crate::http_auth::HEADER, self.signer.header("GET", &target, b""))
            .send()
            .await
            .map_err(|e| format!("server {replica}: {e}"))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| format!("server {replica}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "server {replica}: {status}: {}",
                String::from_utf8_lossy(&body).trim()
            ));
        }
        http::version_from_json(&key, &body).map_err(|e| format!("server {replica}: {e}"))
    }

    /// Feeds `round` the replies of the requests in `set` until it is
    /// decided or the request timeout passes; its result.
    async fn gather<R: Round>(
        &self,
        round: &mut R,
        set: &mut tokio::task::JoinSet<(u64, Result<R::Reply, String>)>,
    ) -> R::Result
    where
        R::Reply: Send + 'static,
    {
        let timeout_ms = self.cfg.request_timeout_ms;
        let deadline = tokio::time::sleep(Duration::from_millis(timeout_ms));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = set.join_next() => match next {
                    Some(Ok((r, reply))) => {
                        if let Some(res) = round.on_reply(r, reply) {
                            return res;
                        }
                    }
                    Some(Err(e)) => round.note(format!("replica task: {e}")),
                    None => return round.give_up("every replica task ended".into()),
                },
                _ = &mut deadline => return round.timed_out(timeout_ms),
            }
        }
    }

    /// Coordinates a client's write: the round is the server's, this
    /// sends it and waits.
    pub async fn write(
        self: &Arc<Self>,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
        w: Option<usize>,
    ) -> Result<WriteResult, Refusal> {
        let mut round: WriteRound = self.lock().server.begin_write(wall_us(), key, value, w)?;
        let mut set = tokio::task::JoinSet::new();
        for &r in round.replicas() {
            let (me, e) = (self.clone(), round.entry().clone());
            set.spawn(async move { (r, me.merge_on(r, e).await) });
        }
        let res = self.gather(&mut round, &mut set).await;
        // the other replicas' writes go on: a write reaches every replica
        // it can, acknowledged or not
        set.detach_all();
        Ok(res)
    }

    /// Coordinates a client's read: the round is the server's, this asks
    /// and waits.
    pub async fn read(self: &Arc<Self>, key: Vec<u8>, r: Option<usize>) -> Result<ReadResult, Refusal> {
        let mut round: ReadRound = self.lock().server.begin_read(key, r)?;
        let mut set = tokio::task::JoinSet::new();
        for &replica in round.replicas() {
            let (me, key) = (self.clone(), round.key().to_vec());
            set.spawn(async move { (replica, me.get_on(replica, key).await) });
        }
        let res = self.gather(&mut round, &mut set).await;
        set.abort_all();
        Ok(res)
    }

    /// Runs one repair session of range `j` with `peer`, this server
    /// initiating.
    pub async fn repair_with(self: &Arc<Self>, j: usize, peer: u64, scheduled: bool) -> SessionReport {
        let t0 = Instant::now();
        let out = self.lock().server.start_session(wall_us(), j, peer);
        let (started_ts, result) = match out {
            Ok(out) => (out.started_ts, self.run_session(out).await),
            Err(e) => (self.now_ts(), Err(e)),
        };
        let took_us = t0.elapsed().as_micros() as u64;
        let report = SessionReport::new(j, peer, started_ts, self.now_ts(), took_us, result);
        self.log_line(report.log_line(scheduled));
        report
    }

    async fn run_session(self: &Arc<Self>, mut out: drift_repair::server::Outgoing) -> Result<Report, String> {
        let (j, peer) = (out.range, out.peer);
        let target = format!("/internal/repair?range={j}&from={}&session={}", self.id, out.session);
        let url = self.peer_url(peer, &target)?;
        let mut msg = std::mem::take(&mut out.first);
        for _ in 0..SESSION_ROUNDS_MAX {
            let auth = self.signer.header("POST", &target, &msg);
            let resp = self
                .http
                .post(&url)
                .header(crate::http_auth::HEADER, auth)
                .body(msg)
                .send()
                .await
                .map_err(|e| format!("server {peer}: {e}"))?;
            let status = resp.status();
            let reply = resp.bytes().await.map_err(|e| format!("server {peer}: {e}"))?;
            if !status.is_success() {
                return Err(format!(
                    "server {peer}: {status}: {}",
                    String::from_utf8_lossy(&reply).trim()
                ));
            }
            let (step, pos) = self.changing(|s| s.on_session_reply(&mut out, &reply))?;
            match step? {
                Step::Send(next) => msg = next,
                Step::Done(report) => {
                    let me = self.clone();
                    tokio::task::spawn_blocking(move || me.sync_to(pos))
                        .await
                        .map_err(|e| e.to_string())??;
                    return Ok(report);
                }
            }
        }
        Err(format!("the session took more than {SESSION_ROUNDS_MAX} rounds"))
    }

    /// Answers one message of a session `from` started (the server's
    /// decision); syncs what a finished session changed before answering.
    pub fn on_repair_message(&self, j: usize, from: u64, session: u64, msg: &[u8]) -> Result<Vec<u8>, Refusal> {
        let mono = self.mono_us();
        let (answer, pos) = self
            .changing(|s| s.on_repair_message(mono, wall_us(), j, from, session, msg))
            .map_err(|why| Refusal { status: 503, why })?;
        let (reply, finished, refused) = answer?;
        if let Some(l) = refused {
            self.log_line(l);
        }
        if finished {
            self.sync_to(pos).map_err(|why| Refusal { status: 503, why })?;
        }
        Ok(reply)
    }

    /// Runs the sessions of a repair (`KvServer::repair_plan`), one at a time.
    pub async fn repair_now(self: &Arc<Self>, plan: Vec<(usize, u64)>, scheduled: bool) -> Vec<SessionReport> {
        let mut out = Vec::new();
        for (j, p) in plan {
            out.push(self.repair_with(j, p, scheduled).await);
        }
        out
    }

    /// Every range's root and entries, as JSON (the final reads).
    pub fn dump(&self) -> serde_json::Value {
        self.lock().server.dump()
    }

    /// A fault hook (`KvServer::admin`).
    pub fn admin(&self, line: &str) -> String {
        let ((answer, logs), pos) = match self.changing(|s| s.admin(wall_us(), line)) {
            Ok(v) => v,
            Err(e) => return format!("error {e}"),
        };
        for l in logs {
            self.log_line(l);
        }
        if let Err(e) = self.sync_to(pos) {
            return format!("error {e}");
        }
        answer
    }

    async fn repair_loop(self: Arc<Self>) {
        if self.cfg.repair_interval_ms == 0 {
            return;
        }
        let every = Duration::from_millis(self.cfg.repair_interval_ms);
        loop {
            tokio::time::sleep(every).await;
            let plan = {
                let d = self.lock();
                d.server
                    .scheduled_repair()
                    .then(|| d.server.repair_plan(None, None, 1).unwrap_or_default())
            };
            if let Some(plan) = plan {
                self.repair_now(plan, true).await;
            }
        }
    }

    async fn gc_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.cfg.gc_interval_ms);
        loop {
            tokio::time::sleep(every).await;
            // alive: a restart within the grace keeps its data
            if let Err(e) = self.lock().heartbeat() {
                self.log(
                    "kv_heartbeat_failed",
                    serde_json::json!({"level": "ERROR", "error": e.to_string()}),
                );
            }
            let me = self.clone();
            let pass = tokio::task::spawn_blocking(move || me.changing(|s| s.scheduled_gc(wall_us())));
            match pass.await {
                Ok(Ok((Some((_, Some(l))), _))) => self.log_line(l),
                Ok(Err(e)) => self.log("kv_gc_failed", serde_json::json!({"level": "ERROR", "error": e})),
                _ => {}
            }
        }
    }
}

/// The kv service of a running node; dropping it stops the service.
pub struct Kv {
    pub node: Arc<KvNode>,
    _runtime: tokio::runtime::Runtime,
}

/// Starts the kv service when the cluster file declares `[kv]` and this
/// peer has a `kv` address.
pub fn start(cfg: &ClusterConfig, id: u64) -> Result<Option<Kv>, NodeError> {
    let Some(decl) = cfg.kv.clone() else {
        return Ok(None);
    };
    let me = cfg.peer(id).ok_or(NodeError::UnknownId(id))?;
    let Some(addr) = me.kv else {
        return Ok(None);
    };
    let peers: BTreeMap<u64, SocketAddr> = cfg.peers.iter().filter_map(|p| Some((p.id, p.kv?))).collect();
    let peers_ids: std::collections::BTreeSet<u64> = peers.keys().copied().collect();
    let ring = Ring::new(peers.keys().copied().collect(), decl.rf)
        .map_err(|e| NodeError::Config(crate::error::ConfigError::Invalid(format!("[kv]: {e}"))))?;
    let dir = cfg.node_dir(id).join("kv");
    let gc_mode = if decl.gc == "repair" {
        GcMode::Repair
    } else {
        GcMode::Time
    };
    // down longer than the grace: rebuilt from its peers, not repaired
    // (drift_repair::server::rebuild_after_absence)
    let now = SystemTime::now();
    let mut rebuilt = None;
    if let Some(absent) = durable::absent_for(&dir, now)
        .filter(|a| drift_repair::server::rebuild_after_absence(gc_mode, decl.gc_grace_ms, a.as_millis() as u64))
    {
        let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let to = durable::set_aside(&dir, secs).map_err(|source| NodeError::Io {
            path: dir.clone(),
            source,
        })?;
        rebuilt = Some((absent, to));
    }
    let server = KvServer::new(
        ServerConfig {
            id,
            ring: ring.clone(),
            tree_depth: decl.tree_depth,
            w: decl.w(),
            r: decl.r(),
            gc: gc_mode,
            gc_grace_ms: decl.gc_grace_ms,
            gc_interval_ms: decl.gc_interval_ms,
            repair_interval_ms: decl.repair_interval_ms,
            request_timeout_ms: decl.request_timeout_ms,
            seed: cfg.seed,
        },
        KvStore::new(id, ring.clone(), decl.tree_depth),
    );
    let (durable, opened) = Durable::open(&dir, server, true).map_err(|source| NodeError::Io {
        path: dir.clone(),
        source,
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("kv")
        .enable_all()
        .build()
        .map_err(|source| NodeError::Runtime {
            what: "kv runtime",
            source,
        })?;
    let listener = std::net::TcpListener::bind(addr).map_err(|source| NodeError::Bind {
        what: "kv http",
        addr,
        source,
    })?;
    listener.set_nonblocking(true).map_err(|source| NodeError::Bind {
        what: "kv http",
        addr,
        source,
    })?;
    let node = Arc::new(KvNode {
        id,
        ring,
        peers,
        durable: Mutex::new(durable),
        syncer: Syncer::default(),
        epoch: Instant::now(),
        client_bodies: crate::body::Budget::new(http::CLIENT_BODIES_BYTES_MAX),
        peer_bodies: crate::body::Budget::new(http::PEER_BODIES_BYTES_MAX),
        signer: crate::http_auth::Signer::new(cfg.secret_bytes(), id),
        verifier: crate::http_auth::Verifier::new(cfg.secret_bytes(), id, peers_ids.clone()),
        // from this server's own address, as its Raft links are: a
        // partition names server addresses
        http: reqwest::Client::builder()
            .local_address(addr.ip())
            .timeout(Duration::from_millis(decl.request_timeout_ms.max(1_000) * 5))
            .build()
            .expect("an HTTP client without TLS builds"),
        cfg: decl,
    });
    {
        let _enter = rt.enter();
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| NodeError::Bind {
            what: "kv http",
            addr,
            source,
        })?;
        let n = node.clone();
        rt.spawn(crate::table::http::serve(listener, move |req| {
            http::handle(n.clone(), req)
        }));
        rt.spawn(node.clone().repair_loop());
        rt.spawn(node.clone().gc_loop());
    }
    if let Some((absent, to)) = &rebuilt {
        node.log(
            "kv_rebuild",
            serde_json::json!({"level": "WARN", "absent_ms": absent.as_millis() as u64, "gc_grace_ms": node.cfg.gc_grace_ms,
                "old_log": to.display().to_string()}),
        );
    }
    if let Some(why) = &opened.torn {
        node.log(
            "kv_log_torn",
            serde_json::json!({"level": "WARN", "at": why, "records": opened.records}),
        );
    }
    node.log(
        "kv_started",
        serde_json::json!({"http": addr.to_string(), "ranges": node.lock().server.store().ranges(),
            "records_replayed": opened.records, "records_skipped": opened.skipped}),
    );
    Ok(Some(Kv { node, _runtime: rt }))
}
