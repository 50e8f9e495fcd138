//! The kv service in the node: leaderless last-write-wins replicas on a
//! token ring, any server coordinating, with Merkle anti-entropy repair
//! between servers.
//!
//! The pure parts — the ring, the replicas and their trees, the repair
//! session, the log records — are `drift_repair`; this module does the
//! network, the log file, the clock and the timers, on a tokio runtime of
//! its own beside the keeper's loop.
//!
//! * A write gets a timestamp from its coordinator's clock (microseconds
//!   since the epoch plus the `clock` fault's offset, never going back on
//!   one coordinator), goes to the key's RF replicas and is acknowledged
//!   after W of them logged and synced it. A read asks the replicas and
//!   returns the LWW winner of the first R answers (no read repair, so
//!   anti-entropy is what converges the replicas).
//! * Every `repair_interval_ms` each server repairs the ranges it is the
//!   primary of with every other replica of them, one session per range
//!   and peer; `POST /repair` runs the same on demand. The responder's
//!   side of a session lives in a table bounded by [`SESSIONS_MAX`].
//! * Every `gc_interval_ms` a GC pass purges tombstones by the cluster
//!   file's policy.
//!
//! # Layout
//! * [`durable`] — the replicas and their log on disk
//! * [`http`] — the client, replica and repair endpoints

pub mod durable;
pub mod http;

use crate::config::{ClusterConfig, KvDecl};
use crate::error::NodeError;
pub use drift_repair::coord::{ReadResult, WriteResult};
use drift_repair::coord::{ReadRound, Round, Stamper, WriteRound};
use drift_repair::held::{Held, Limits as HeldLimits};
use drift_repair::kv::{GcMode, KvStore};
use drift_repair::replica::Merged;
use drift_repair::ring::Ring;
use drift_repair::session::{Initiator, Report, Responder, SessionConfig, Step, HASH_BYTES_DEFAULT};
use drift_repair::wal::{self, Record};
use drift_repair::Entry;
use durable::{Durable, Syncer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The kv defect a node with fault hooks arms at start when the table's
/// defect variable names it (`drift_node::table::hooks::DEFECT_ENV`), so it
/// outlives the node's restarts within a campaign.
pub const DEFECT_REPAIR_OVERWRITES: &str = "repair-overwrites";

/// Longest key: keys travel in URL paths.
pub const KEY_BYTES_MAX: usize = 1024;
/// Largest value a write carries.
pub const VALUE_BYTES_MAX: usize = 64 << 10;
/// How far ahead of this server's clock a peer's version, or a GC
/// horizon a peer proposes, may be (far beyond any skew the `clock` fault
/// makes): a version stamped further would win every later write of its
/// key, and such a horizon would purge every tombstone.
pub const TS_SKEW_MAX_US: u64 = 10 * 60 * 1_000_000;
/// Responder sessions held at once, and by one peer; a session idle past
/// [`SESSION_IDLE`] is dropped to make room, and a peer's oldest gives
/// way to its newest.
pub const SESSIONS_MAX: usize = 1024;
pub const SESSIONS_PER_PEER_MAX: usize = 8;
pub const SESSION_IDLE: Duration = Duration::from_secs(30);
/// Rounds a session may take: hello, a level per tree level and below it,
/// then the fingerprint, stream and done rounds.
const SESSION_ROUNDS_MAX: usize = drift_repair::range::DEPTH_MAX as usize + 8;

/// A session's result, as the log line and `POST /repair` report it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionReport {
    pub range: usize,
    pub peer: u64,
    pub started_ts: u64,
    pub finished_ts: u64,
    pub duration_ms: f64,
    pub rounds: u32,
    pub bytes_to_peer: u64,
    pub bytes_from_peer: u64,
    pub reconciliation_bytes: u64,
    pub entries_to_peer: u64,
    pub entries_from_peer: u64,
    pub hashes_compared: u64,
    pub ranges_differing: usize,
    /// How the difference was found: `set` (a lookup table), `walk` (the
    /// Merkle walk, the responder's choice) or `set-then-walk` (the table
    /// did not decode).
    pub path: &'static str,
    pub error: Option<String>,
}

impl SessionReport {
    fn new(
        range: usize,
        peer: u64,
        started_ts: u64,
        finished_ts: u64,
        took: Duration,
        r: Result<Report, String>,
    ) -> Self {
        let (r, error) = match r {
            Ok(r) => (r, None),
            Err(e) => (Report::default(), Some(e)),
        };
        SessionReport {
            range,
            peer,
            started_ts,
            finished_ts,
            duration_ms: took.as_secs_f64() * 1e3,
            rounds: r.rounds,
            bytes_to_peer: r.bytes_a_to_b,
            bytes_from_peer: r.bytes_b_to_a,
            reconciliation_bytes: if error.is_none() { r.reconciliation_bytes() } else { 0 },
            entries_to_peer: r.entries_a_to_b,
            entries_from_peer: r.entries_b_to_a,
            hashes_compared: r.hashes_compared,
            ranges_differing: r.ranges.len(),
            path: match (r.set_cells, r.set_fallback) {
                (0, _) => "walk",
                (_, false) => "set",
                (_, true) => "set-then-walk",
            },
            error,
        }
    }
}

pub struct KvNode {
    pub id: u64,
    /// The memory clients' request bodies may hold together, and other
    /// servers' (crate::body).
    pub client_bodies: crate::body::Budget,
    pub peer_bodies: crate::body::Budget,
    cfg: KvDecl,
    gc_mode: GcMode,
    ring: Ring,
    peers: BTreeMap<u64, SocketAddr>,
    durable: Mutex<Durable>,
    syncer: Syncer,
    seed: u64,
    clock_offset_ms: AtomicI64,
    stamper: Mutex<Stamper>,
    repair_paused: AtomicBool,
    gc_paused: AtomicBool,
    /// The `gc-tombstones` fault: periodic passes purge by time with this
    /// grace (ms) instead of the cluster file's policy; `u64::MAX`: off.
    gc_grace_override_ms: AtomicU64,
    next_session: AtomicU64,
    sessions: Mutex<Held<Responder>>,
    /// The monotonic clock's origin (idle sessions are judged on it).
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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
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

    /// This server's clock, in microseconds, with the `clock` fault.
    pub fn now_ts(&self) -> u64 {
        let offset_us = self.clock_offset_ms.load(Ordering::Relaxed) * 1000;
        (wall_us() as i64).saturating_add(offset_us).max(0) as u64
    }

    /// A write's timestamp: this server's clock, never repeating or going
    /// back on this server (a skewed clock still moves other servers'
    /// writes behind or ahead of it, as LWW allows).
    fn next_ts(&self) -> u64 {
        let now = self.now_ts();
        self.stamper.lock().unwrap_or_else(|p| p.into_inner()).next(now)
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    pub fn config(&self) -> &KvDecl {
        &self.cfg
    }

    /// Merges `e` here, logs it and syncs the log before returning.
    pub fn apply_local(&self, e: Entry) -> Result<Merged, String> {
        let pos = {
            let mut d = self.lock();
            let merged = d.store.merge(e);
            if merged == Merged::OutOfRange {
                return Ok(merged);
            }
            (merged, d.persist().map_err(|e| format!("kv log: {e}"))?)
        };
        // synced even when kept: the version that won may not be yet
        self.syncer
            .sync_to(&self.durable, pos.1)
            .map_err(|e| format!("kv log sync: {e}"))?;
        Ok(pos.0)
    }

    /// This server's version of `key`; `Err` when it holds no replica of it.
    pub fn get_local(&self, key: &[u8]) -> Result<Option<Entry>, usize> {
        self.lock().store.get(key)
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
                Ok(Ok(Merged::OutOfRange)) => Err("this server holds no replica of the key".into()),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e),
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
            return self
                .get_local(&key)
                .map_err(|_| "this server holds no replica of the key".to_string());
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

    /// Coordinates a write (a value, or a tombstone for `None`): the
    /// decisions are [`WriteRound`]'s, this sends and waits.
    pub async fn write(self: &Arc<Self>, key: Vec<u8>, value: Option<Vec<u8>>, w: usize) -> WriteResult {
        let e = Entry {
            key,
            ts: self.next_ts(),
            value,
        };
        let j = self.ring.range_of_key(&e.key);
        let mut round = WriteRound::new(e, self.ring.replicas(j), w);
        let mut set = tokio::task::JoinSet::new();
        for &r in round.replicas() {
            let (me, e) = (self.clone(), round.entry().clone());
            set.spawn(async move { (r, me.merge_on(r, e).await) });
        }
        let res = self.gather(&mut round, &mut set).await;
        // the other replicas' writes go on: a write reaches every replica
        // it can, acknowledged or not
        set.detach_all();
        res
    }

    /// Coordinates a read of `key` from `r` replicas: the decisions are
    /// [`ReadRound`]'s, this asks and waits.
    pub async fn read(self: &Arc<Self>, key: Vec<u8>, r: usize) -> ReadResult {
        let j = self.ring.range_of_key(&key);
        let mut round = ReadRound::new(key, self.ring.replicas(j), r);
        let mut set = tokio::task::JoinSet::new();
        for &replica in round.replicas() {
            let (me, key) = (self.clone(), round.key().to_vec());
            set.spawn(async move { (replica, me.get_on(replica, key).await) });
        }
        let res = self.gather(&mut round, &mut set).await;
        set.abort_all();
        res
    }

    /// Runs one repair session of range `j` with `peer`, this server
    /// initiating.
    pub async fn repair_with(self: &Arc<Self>, j: usize, peer: u64, scheduled: bool) -> SessionReport {
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        let started_ts = self.now_ts();
        let t0 = Instant::now();
        let result = self.run_session(j, peer, session, started_ts).await;
        let report = SessionReport::new(j, peer, started_ts, self.now_ts(), t0.elapsed(), result);
        let mut line = serde_json::to_value(&report).unwrap_or(serde_json::Value::Null);
        line["trigger"] = if scheduled { "schedule" } else { "request" }.into();
        self.log(drift_keeper::NodeEvent::KvRepair.name(), line);
        report
    }

    async fn run_session(
        self: &Arc<Self>,
        j: usize,
        peer: u64,
        session: u64,
        started_ts: u64,
    ) -> Result<Report, String> {
        let cfg = SessionConfig {
            seed: splitmix(self.seed ^ (self.id << 40) ^ session),
            row_level: true,
            started_ts,
            hash_bytes: HASH_BYTES_DEFAULT,
            set_reconciliation: true,
        };
        let (mut init, mut msg) = {
            let d = self.lock();
            let replica = d
                .store
                .replica(j)
                .ok_or_else(|| format!("this server holds no range {j}"))?;
            let (mut init, msg) = Initiator::start(replica, peer, cfg);
            init.set_limits(Self::repair_limits());
            (init, msg)
        };
        let target = format!("/internal/repair?range={j}&from={}&session={session}", self.id);
        let url = self.peer_url(peer, &target)?;
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
            let (step, pos) = {
                let mut d = self.lock();
                let replica = d
                    .store
                    .replica_mut(j)
                    .ok_or_else(|| format!("this server holds no range {j}"))?;
                let step = init.on_reply(replica, &reply).map_err(|e| e.to_string())?;
                (step, d.persist().map_err(|e| format!("kv log: {e}"))?)
            };
            match step {
                Step::Send(next) => msg = next,
                Step::Done(report) => {
                    let me = self.clone();
                    tokio::task::spawn_blocking(move || me.syncer.sync_to(&me.durable, pos))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("kv log sync: {e}"))?;
                    return Ok(report);
                }
            }
        }
        Err(format!("the session took more than {SESSION_ROUNDS_MAX} rounds"))
    }

    /// What a repair session takes from a peer (drift_repair's limits at
    /// this service's key and value limits, and [`TS_SKEW_MAX_US`]).
    pub fn repair_limits() -> drift_repair::session::Limits {
        drift_repair::session::Limits {
            key_bytes_max: KEY_BYTES_MAX,
            value_bytes_max: VALUE_BYTES_MAX,
            skew_us: TS_SKEW_MAX_US,
        }
    }

    /// Answers one message of a session `from` started. A session is
    /// bound to a range `from` replicates too, and each peer holds at
    /// most [`SESSIONS_PER_PEER_MAX`] at once (its oldest gives way), so
    /// one peer cannot keep another's sessions out.
    pub fn on_repair_message(&self, j: usize, from: u64, session: u64, msg: &[u8]) -> Result<Vec<u8>, String> {
        if j >= self.ring.ranges() || !self.ring.replicas(j).contains(&from) {
            return Err(format!("server {from} holds no replica of range {j}"));
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let now_us = self.epoch.elapsed().as_micros() as u64;
        let started_ts = self.now_ts();
        let s = sessions.get_or_open(from, session, now_us, || {
            Responder::new(from, started_ts).with_limits(Self::repair_limits())
        })?;
        let (reply, pos) = {
            let mut d = self.lock();
            let replica = d
                .store
                .replica_mut(j)
                .ok_or_else(|| format!("this server holds no range {j}"))?;
            let reply = s.on_request(replica, msg).unwrap_or_else(|e| {
                // what a peer sent that this side refused is worth a line
                if matches!(e, drift_repair::session::SessionError::Protocol(_)) {
                    self.log(
                        "kv_repair_refused",
                        serde_json::json!({"from": from, "range": j, "session": session, "reason": e.to_string()}),
                    );
                }
                Responder::error_reply(&e)
            });
            (reply, d.persist().map_err(|e| format!("kv log: {e}"))?)
        };
        let finished = s.is_finished();
        if finished {
            sessions.close(from, session);
        }
        drop(sessions);
        if finished {
            self.syncer
                .sync_to(&self.durable, pos)
                .map_err(|e| format!("kv log sync: {e}"))?;
        }
        Ok(reply)
    }

    /// Repairs the ranges this server is the primary of (or `only`), with
    /// every other replica (or `peers`), `rounds` times over.
    pub async fn repair_now(
        self: &Arc<Self>,
        only: Option<usize>,
        peers: Option<&[u64]>,
        rounds: usize,
        scheduled: bool,
    ) -> Vec<SessionReport> {
        let ranges: Vec<usize> = match only {
            Some(j) => vec![j],
            None => self.ring.primary_of(self.id),
        };
        let mut out = Vec::new();
        for _ in 0..rounds {
            for &j in &ranges {
                for p in self.ring.replicas(j) {
                    if p == self.id || peers.is_some_and(|ps| !ps.contains(&p)) {
                        continue;
                    }
                    out.push(self.repair_with(j, p, scheduled).await);
                }
            }
        }
        out
    }

    /// A GC pass: the cluster file's policy, or a forced time-based pass
    /// with `grace_ms` (the `gc-tombstones` fault). Returns the purged
    /// count and the horizon.
    pub fn collect_garbage(&self, forced_grace_ms: Option<u64>) -> Result<(usize, u64), String> {
        let now = self.now_ts();
        let (mode, grace_ms) = match forced_grace_ms {
            Some(g) => (GcMode::Time, g),
            None => (self.gc_mode, self.cfg.gc_grace_ms),
        };
        let grace = grace_ms.saturating_mul(1000);
        let purged: usize = {
            let mut d = self.lock();
            let n = d.store.collect_garbage(mode, grace, now).iter().map(|(_, n)| n).sum();
            d.persist().map_err(|e| format!("kv log: {e}"))?;
            n
        };
        let horizon = now.saturating_sub(grace);
        if purged > 0 || forced_grace_ms.is_some() {
            self.log(
                drift_keeper::NodeEvent::KvGc.name(),
                serde_json::json!({"grace_ms": grace_ms, "horizon_ts": horizon, "purged": purged,
                    "mode": if mode == GcMode::Time { "time" } else { "repair" }, "forced": forced_grace_ms.is_some()}),
            );
        }
        Ok((purged, horizon))
    }

    /// Every range's root and entries, as JSON (the final reads).
    pub fn dump(&self) -> serde_json::Value {
        let d = self.lock();
        let ranges: Vec<serde_json::Value> = d
            .store
            .dump()
            .into_iter()
            .map(|r| {
                let tr = self.ring.range(r.range);
                let gc = d.store.replica(r.range).map_or(0, |x| x.gc_horizon());
                serde_json::json!({
                    "range": r.range, "lo": tr.lo, "hi": tr.hi, "replicas": self.ring.replicas(r.range),
                    "root": r.root, "count": r.count, "gc_horizon": gc,
                    "entries": r.entries.iter().map(|e| serde_json::json!([
                        String::from_utf8_lossy(&e.key), e.ts, e.value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned())
                    ])).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({"server": self.id, "ranges": ranges})
    }

    /// A fault hook: `clock <ms>`; `gc <grace_ms>` (one pass by time with
    /// that grace); `gc-grace <ms>|off` (every pass so until `off`, and a
    /// pass now); `gc-off`, `gc-on` (pause the passes); `repair-off`,
    /// `repair-on` (pause the scheduled repairs); `defect-overwrite on|off`.
    pub fn admin(&self, line: &str) -> String {
        let mut w = line.split_whitespace();
        match (w.next(), w.next()) {
            (Some("clock"), Some(ms)) => match ms.parse::<i64>() {
                Ok(v) => {
                    self.clock_offset_ms.store(v, Ordering::Relaxed);
                    "ok".into()
                }
                Err(_) => "error clock needs an integer offset in ms".into(),
            },
            (Some("gc"), Some(ms)) => match ms.parse::<u64>() {
                Ok(g) => match self.collect_garbage(Some(g)) {
                    Ok((n, h)) => format!("ok purged {n} horizon {h}"),
                    Err(e) => format!("error {e}"),
                },
                Err(_) => "error gc needs a grace in ms".into(),
            },
            (Some("gc-grace"), Some("off")) => {
                self.gc_grace_override_ms.store(u64::MAX, Ordering::Relaxed);
                "ok".into()
            }
            (Some("gc-grace"), Some(ms)) => match ms.parse::<u64>() {
                Ok(g) if g != u64::MAX => {
                    self.gc_grace_override_ms.store(g, Ordering::Relaxed);
                    match self.collect_garbage(Some(g)) {
                        Ok((n, h)) => format!("ok purged {n} horizon {h}"),
                        Err(e) => format!("error {e}"),
                    }
                }
                _ => "error gc-grace needs a grace in ms, or off".into(),
            },
            (Some(pause @ ("gc-off" | "gc-on")), None) => {
                self.gc_paused.store(pause == "gc-off", Ordering::Relaxed);
                "ok".into()
            }
            (Some("repair-off"), None) => {
                self.repair_paused.store(true, Ordering::Relaxed);
                self.log("kv_repair_paused", serde_json::json!({"paused": true}));
                "ok".into()
            }
            (Some("repair-on"), None) => {
                self.repair_paused.store(false, Ordering::Relaxed);
                self.log("kv_repair_paused", serde_json::json!({"paused": false}));
                "ok".into()
            }
            (Some("defect-overwrite"), Some(on @ ("on" | "off"))) => {
                self.lock().store.set_defect_repair_overwrites(on == "on");
                self.log("kv_defect", serde_json::json!({"repair_overwrites": on == "on"}));
                "ok".into()
            }
            _ => "error kv hooks: clock <ms> | gc <grace_ms> | gc-grace <ms>|off | gc-off | gc-on | repair-off | repair-on | defect-overwrite on|off".into(),
        }
    }

    async fn repair_loop(self: Arc<Self>) {
        if self.cfg.repair_interval_ms == 0 {
            return;
        }
        let every = Duration::from_millis(self.cfg.repair_interval_ms);
        loop {
            tokio::time::sleep(every).await;
            if !self.repair_paused.load(Ordering::Relaxed) {
                self.repair_now(None, None, 1, true).await;
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
            if self.gc_paused.load(Ordering::Relaxed) {
                continue;
            }
            let grace = self.gc_grace_override_ms.load(Ordering::Relaxed);
            let me = self.clone();
            let forced = (grace != u64::MAX).then_some(grace);
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || me.collect_garbage(forced)).await {
                self.log("kv_gc_failed", serde_json::json!({"level": "ERROR", "error": e}));
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
    // down longer than the grace: its tombstones may have been purged
    // everywhere else, so a repair would bring back what they deleted.
    // Such a replica is rebuilt from its peers, not repaired (with
    // repair-gated GC nothing is purged that it has not seen).
    let now = SystemTime::now();
    let mut rebuilt = None;
    if decl.gc != "repair" {
        if let Some(absent) = durable::absent_for(&dir, now).filter(|a| a.as_millis() > decl.gc_grace_ms as u128) {
            let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let to = durable::set_aside(&dir, secs).map_err(|source| NodeError::Io {
                path: dir.clone(),
                source,
            })?;
            rebuilt = Some((absent, to));
        }
    }
    let store = KvStore::new(id, ring.clone(), decl.tree_depth);
    let (durable, opened) = Durable::open(&dir, store, true).map_err(|source| NodeError::Io {
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
    let gc_mode = if decl.gc == "repair" {
        GcMode::Repair
    } else {
        GcMode::Time
    };
    let node = Arc::new(KvNode {
        id,
        gc_mode,
        ring,
        peers,
        durable: Mutex::new(durable),
        syncer: Syncer::default(),
        seed: cfg.seed,
        clock_offset_ms: AtomicI64::new(0),
        stamper: Mutex::new(Stamper::default()),
        repair_paused: AtomicBool::new(false),
        gc_paused: AtomicBool::new(false),
        gc_grace_override_ms: AtomicU64::new(u64::MAX),
        next_session: AtomicU64::new(0),
        sessions: Mutex::new(Held::new(HeldLimits {
            max: SESSIONS_MAX,
            per_peer_max: SESSIONS_PER_PEER_MAX,
            idle_us: SESSION_IDLE.as_micros() as u64,
        })),
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
        serde_json::json!({"http": addr.to_string(), "ranges": node.lock().store.ranges(),
            "records_replayed": opened.records, "records_skipped": opened.skipped}),
    );
    Ok(Some(Kv { node, _runtime: rt }))
}
