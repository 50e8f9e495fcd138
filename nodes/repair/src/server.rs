//! One kv server's decisions, sans-IO: what it does with a client's
//! request, a peer's version or read, a repair message, a timer and a
//! fault hook — with the clock readings as arguments, and what must be
//! logged or answered as values.
//!
//! Its drivers — the node's kv module (HTTP, the log file, tokio timers)
//! and the simulator (simulated links, disk and time) — do the sending,
//! the waiting and the syncing: a write's or a repair's changes are in
//! [`KvServer::take_records`] after the call that made them, and what the
//! driver answers for them waits until it has synced them.
//!
//! * A write is stamped with this server's clock (the machine's plus the
//!   `clock` fault's offset, never going back: [`Stamper`]) and driven by
//!   a [`WriteRound`]; a read by a [`ReadRound`].
//! * A version a peer sends is held to a client's limits, and may be no
//!   further ahead of this server's clock than [`TS_SKEW_MAX_US`].
//! * The responder's side of repair sessions lives in a [`Held`] table:
//!   bounded in all ([`SESSIONS_MAX`]) and per peer
//!   ([`SESSIONS_PER_PEER_MAX`]), idle ones dropped after
//!   [`SESSION_IDLE_US`].
//! * Scheduled repair and GC are the driver's timers; whether a pass runs
//!   and with which policy is decided here (the `skip-repair` and
//!   `gc-tombstones` faults pause or force them).

use crate::coord::{ReadRound, Stamper, WriteRound};
use crate::entry::Entry;
use crate::held::{Held, Limits as HeldLimits};
use crate::kv::{GcMode, KvStore};
use crate::replica::Merged;
use crate::ring::Ring;
use crate::session::{Initiator, Limits, Report, Responder, SessionConfig, SessionError, Step, HASH_BYTES_DEFAULT};
use crate::wal::Record;
use serde_json::{json, Value};

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
/// [`SESSION_IDLE_US`] is dropped to make room, and a peer's oldest gives
/// way to its newest.
pub const SESSIONS_MAX: usize = 1024;
pub const SESSIONS_PER_PEER_MAX: usize = 8;
pub const SESSION_IDLE_US: u64 = 30_000_000;
/// Rounds a session may take: hello, a level per tree level and below it,
/// then the fingerprint, stream and done rounds.
pub const SESSION_ROUNDS_MAX: usize = crate::range::DEPTH_MAX as usize + 8;
/// Repair passes one request may ask for.
pub const REPAIR_ROUNDS_MAX: usize = 10;
/// The kv defect `repair-overwrites` (a repair takes the peer's version
/// whatever its timestamp): planted to prove the convergence checker
/// finds it.
pub const DEFECT_REPAIR_OVERWRITES: &str = "repair-overwrites";

/// The service's parameters, as the cluster file declares them.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub id: u64,
    pub ring: Ring,
    pub tree_depth: u32,
    pub w: usize,
    pub r: usize,
    pub gc: GcMode,
    pub gc_grace_ms: u64,
    pub gc_interval_ms: u64,
    /// 0: no scheduled repair.
    pub repair_interval_ms: u64,
    /// How long a coordinator waits for its replicas.
    pub request_timeout_ms: u64,
    /// The cluster's seed: repair sessions draw theirs from it.
    pub seed: u64,
}

/// Why a request was refused, with the HTTP status that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub why: String,
}

fn refuse(status: u16, why: impl Into<String>) -> Refusal {
    Refusal {
        status,
        why: why.into(),
    }
}

/// A line for the server's log: its event name and fields.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    pub event: &'static str,
    pub fields: Value,
}

fn line(event: &'static str, fields: Value) -> LogLine {
    LogLine { event, fields }
}

/// A repair session this server started, between the driver's rounds.
pub struct Outgoing {
    pub range: usize,
    pub peer: u64,
    pub session: u64,
    pub started_ts: u64,
    pub init: Initiator,
    /// The first message to send.
    pub first: Vec<u8>,
}

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
    /// The report of a session of `range` with `peer` that took
    /// `took_us` of the driver's time.
    pub fn new(
        range: usize,
        peer: u64,
        started_ts: u64,
        finished_ts: u64,
        took_us: u64,
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
            duration_ms: took_us as f64 / 1e3,
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

    /// The `kv_repair` log line of this report.
    pub fn log_line(&self, scheduled: bool) -> LogLine {
        let mut fields = serde_json::to_value(self).unwrap_or(Value::Null);
        fields["trigger"] = if scheduled { "schedule" } else { "request" }.into();
        line("kv_repair", fields)
    }
}

/// A client's request, parsed by the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    /// A value, or a tombstone for `None`, with this many acks (or W).
    Write { value: Option<Vec<u8>>, w: Option<usize> },
    /// A read from this many replicas (or R).
    Read { r: Option<usize> },
}

/// What a GC pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gc {
    pub purged: usize,
    pub horizon: u64,
}

/// One kv server's state and decisions (see the module header).
pub struct KvServer {
    cfg: ServerConfig,
    store: KvStore,
    stamper: Stamper,
    clock_offset_ms: i64,
    repair_paused: bool,
    gc_paused: bool,
    /// The `gc-tombstones` fault: passes purge by time with this grace
    /// (ms) instead of the policy.
    gc_grace_override_ms: Option<u64>,
    next_session: u64,
    sessions: Held<Responder>,
}

impl KvServer {
    /// A server whose replicas `store` holds (replayed from its log).
    pub fn new(cfg: ServerConfig, store: KvStore) -> KvServer {
        KvServer {
            cfg,
            store,
            stamper: Stamper::default(),
            clock_offset_ms: 0,
            repair_paused: false,
            gc_paused: false,
            gc_grace_override_ms: None,
            next_session: 0,
            sessions: Held::new(HeldLimits {
                max: SESSIONS_MAX,
                per_peer_max: SESSIONS_PER_PEER_MAX,
                idle_us: SESSION_IDLE_US,
            }),
        }
    }

    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    pub fn ring(&self) -> &Ring {
        &self.cfg.ring
    }

    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// The log records of every change since the last call: the driver
    /// appends them, and syncs them before it answers for them.
    pub fn take_records(&mut self) -> Vec<Record> {
        self.store.take_records()
    }

    /// Replays a log's records into the replicas; how many were skipped
    /// (for ranges this server no longer holds).
    pub fn replay(&mut self, records: impl IntoIterator<Item = Record>) -> usize {
        self.store.replay(records)
    }

    /// Every replica as records (a compacted log).
    pub fn image(&self) -> Vec<Record> {
        self.store.image()
    }

    /// This server's clock at machine time `wall_us`, with the `clock`
    /// fault's offset.
    pub fn now_ts(&self, wall_us: u64) -> u64 {
        (wall_us as i64)
            .saturating_add(self.clock_offset_ms.saturating_mul(1000))
            .max(0) as u64
    }

    /// Checks a key from a client or a peer.
    pub fn check_key(key: &[u8]) -> Result<(), Refusal> {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(refuse(400, format!("a key must have 1..={KEY_BYTES_MAX} bytes")));
        }
        if std::str::from_utf8(key).is_err() {
            return Err(refuse(400, "a key must be UTF-8"));
        }
        Ok(())
    }

    fn check_value(v: &[u8]) -> Result<(), Refusal> {
        if v.len() > VALUE_BYTES_MAX {
            return Err(refuse(413, format!("a value has at most {VALUE_BYTES_MAX} bytes")));
        }
        if std::str::from_utf8(v).is_err() {
            return Err(refuse(400, "a value must be UTF-8"));
        }
        Ok(())
    }

    fn quorum(&self, name: &str, asked: Option<usize>, default: usize) -> Result<usize, Refusal> {
        let rf = self.cfg.ring.rf();
        let n = asked.unwrap_or(default);
        if !(1..=rf).contains(&n) {
            return Err(refuse(400, format!("?{name}={n}: must be between 1 and rf ({rf})")));
        }
        Ok(n)
    }

    /// A client's write of `key`, coordinated here at machine time
    /// `wall_us`: the round the driver sends to every replica.
    pub fn begin_write(
        &mut self,
        wall_us: u64,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
        w: Option<usize>,
    ) -> Result<WriteRound, Refusal> {
        Self::check_key(&key)?;
        if let Some(v) = &value {
            Self::check_value(v)?;
        }
        let w = self.quorum("w", w, self.cfg.w)?;
        let ts = self.stamper.next(self.now_ts(wall_us));
        let j = self.cfg.ring.range_of_key(&key);
        Ok(WriteRound::new(Entry { key, ts, value }, self.cfg.ring.replicas(j), w))
    }

    /// A client's read of `key`: the round the driver asks every replica.
    pub fn begin_read(&self, key: Vec<u8>, r: Option<usize>) -> Result<ReadRound, Refusal> {
        Self::check_key(&key)?;
        let r = self.quorum("r", r, self.cfg.r)?;
        let j = self.cfg.ring.range_of_key(&key);
        Ok(ReadRound::new(key, self.cfg.ring.replicas(j), r))
    }

    /// Merges a version a peer (or this server's own coordinator) sent,
    /// at machine time `wall_us`: held to a client's limits and to the
    /// skew bound. The driver syncs its record before answering.
    pub fn merge(&mut self, wall_us: u64, e: Entry) -> Result<Merged, Refusal> {
        if e.key.is_empty() || e.key.len() > KEY_BYTES_MAX || std::str::from_utf8(&e.key).is_err() {
            return Err(refuse(
                400,
                format!("a merged key must be UTF-8 of 1..={KEY_BYTES_MAX} bytes"),
            ));
        }
        if let Some(v) = &e.value {
            Self::check_value(v).map_err(|r| refuse(r.status, format!("merged: {}", r.why)))?;
        }
        let now = self.now_ts(wall_us);
        if e.ts > now.saturating_add(TS_SKEW_MAX_US) {
            return Err(refuse(
                400,
                format!(
                    "a merged version stamped {} s ahead of this server's clock (at most {} s)",
                    (e.ts - now) / 1_000_000,
                    TS_SKEW_MAX_US / 1_000_000
                ),
            ));
        }
        match self.store.merge(e) {
            Merged::OutOfRange => Err(refuse(421, "this server holds no replica of the key")),
            m => Ok(m),
        }
    }

    /// This server's version of `key` (a peer's read).
    pub fn get(&self, key: &[u8]) -> Result<Option<Entry>, Refusal> {
        self.store
            .get(key)
            .map_err(|j| refuse(421, format!("this server holds no replica of range {j}")))
    }

    /// The sessions a repair of the ranges this server is the primary of
    /// (or `only`), with every other replica (or `peers`), `rounds` times
    /// over, runs: (range, peer), in order.
    pub fn repair_plan(
        &self,
        only: Option<usize>,
        peers: Option<&[u64]>,
        rounds: usize,
    ) -> Result<Vec<(usize, u64)>, Refusal> {
        let ring = &self.cfg.ring;
        if let Some(j) = only {
            if j >= ring.ranges() || !ring.replicas(j).contains(&self.cfg.id) {
                return Err(refuse(400, format!("?range={j}: this server holds no such range")));
            }
        }
        if !(1..=REPAIR_ROUNDS_MAX).contains(&rounds) {
            return Err(refuse(400, format!("?rounds= must be in 1..={REPAIR_ROUNDS_MAX}")));
        }
        let ranges = match only {
            Some(j) => vec![j],
            None => ring.primary_of(self.cfg.id),
        };
        let mut plan = Vec::new();
        for _ in 0..rounds {
            for &j in &ranges {
                for p in ring.replicas(j) {
                    if p != self.cfg.id && peers.is_none_or(|ps| ps.contains(&p)) {
                        plan.push((j, p));
                    }
                }
            }
        }
        Ok(plan)
    }

    /// Whether a scheduled repair pass runs now.
    pub fn scheduled_repair(&self) -> bool {
        self.cfg.repair_interval_ms > 0 && !self.repair_paused
    }

    /// Starts a session of range `j` with `peer`, this server initiating,
    /// at machine time `wall_us`.
    pub fn start_session(&mut self, wall_us: u64, j: usize, peer: u64) -> Result<Outgoing, String> {
        let session = self.next_session;
        self.next_session += 1;
        let started_ts = self.now_ts(wall_us);
        let cfg = SessionConfig {
            seed: splitmix(self.cfg.seed ^ (self.cfg.id << 40) ^ session),
            row_level: true,
            started_ts,
            hash_bytes: HASH_BYTES_DEFAULT,
            set_reconciliation: true,
        };
        let replica = self
            .store
            .replica(j)
            .ok_or_else(|| format!("this server holds no range {j}"))?;
        let (mut init, first) = Initiator::start(replica, peer, cfg);
        init.set_limits(Self::repair_limits());
        Ok(Outgoing {
            range: j,
            peer,
            session,
            started_ts,
            init,
            first,
        })
    }

    /// The peer's reply to a message of `out`: the next message, or the
    /// session's report (its changes then in [`Self::take_records`]).
    pub fn on_session_reply(&mut self, out: &mut Outgoing, reply: &[u8]) -> Result<Step, String> {
        let j = out.range;
        let replica = self
            .store
            .replica_mut(j)
            .ok_or_else(|| format!("this server holds no range {j}"))?;
        out.init.on_reply(replica, reply).map_err(|e| e.to_string())
    }

    /// What a session takes from a peer: the repair's limits at this
    /// service's key and value limits, and [`TS_SKEW_MAX_US`].
    pub fn repair_limits() -> Limits {
        Limits {
            key_bytes_max: KEY_BYTES_MAX,
            value_bytes_max: VALUE_BYTES_MAX,
            skew_us: TS_SKEW_MAX_US,
        }
    }

    /// Answers one message of a session `from` started, at monotonic
    /// time `mono_us` (idle sessions are judged on it) and machine time
    /// `wall_us`. A session is bound to a range `from` replicates too.
    /// Returns the reply, whether the session finished (the driver syncs
    /// its changes before answering then), and a line for what the peer
    /// sent that was refused.
    pub fn on_repair_message(
        &mut self,
        mono_us: u64,
        wall_us: u64,
        j: usize,
        from: u64,
        session: u64,
        msg: &[u8],
    ) -> Result<(Vec<u8>, bool, Option<LogLine>), Refusal> {
        let ring = &self.cfg.ring;
        if j >= ring.ranges() || !ring.replicas(j).contains(&from) {
            return Err(refuse(503, format!("server {from} holds no replica of range {j}")));
        }
        let started_ts = self.now_ts(wall_us);
        if crate::wire::Msg::opens_session(msg) {
            // a hello begins a session: one held under its id is of an
            // earlier life of the peer (its count starts again when it
            // restarts), left unfinished, and gives way
            self.sessions.close(from, session);
        }
        let s = self
            .sessions
            .get_or_open(from, session, mono_us, || {
                Responder::new(from, started_ts).with_limits(Self::repair_limits())
            })
            .map_err(|e| refuse(503, e))?;
        let replica = self
            .store
            .replica_mut(j)
            .ok_or_else(|| refuse(503, format!("this server holds no range {j}")))?;
        let mut refused = None;
        let reply = s.on_request(replica, msg).unwrap_or_else(|e| {
            // what a peer sent that this side refused is worth a line
            if matches!(e, SessionError::Protocol(_)) {
                refused = Some(line(
                    "kv_repair_refused",
                    json!({"from": from, "range": j, "session": session, "reason": e.to_string()}),
                ));
            }
            Responder::error_reply(&e)
        });
        let finished = s.is_finished();
        if finished {
            self.sessions.close(from, session);
        }
        Ok((reply, finished, refused))
    }

    /// A GC pass at machine time `wall_us`: the policy, or a pass by time
    /// with grace `forced_grace_ms`; with its log line when it purged or
    /// was forced.
    pub fn collect_garbage(&mut self, wall_us: u64, forced_grace_ms: Option<u64>) -> (Gc, Option<LogLine>) {
        let now = self.now_ts(wall_us);
        let (mode, grace_ms) = match forced_grace_ms {
            Some(g) => (GcMode::Time, g),
            None => (self.cfg.gc, self.cfg.gc_grace_ms),
        };
        let grace = grace_ms.saturating_mul(1000);
        let purged: usize = self
            .store
            .collect_garbage(mode, grace, now)
            .iter()
            .map(|(_, n)| n)
            .sum();
        let horizon = now.saturating_sub(grace);
        let log = (purged > 0 || forced_grace_ms.is_some()).then(|| {
            line(
                "kv_gc",
                json!({"grace_ms": grace_ms, "horizon_ts": horizon, "purged": purged,
                    "mode": if mode == GcMode::Time { "time" } else { "repair" }, "forced": forced_grace_ms.is_some()}),
            )
        });
        (Gc { purged, horizon }, log)
    }

    /// A scheduled GC pass (every `gc_interval_ms`): none while paused,
    /// by the `gc-tombstones` grace while that fault holds.
    pub fn scheduled_gc(&mut self, wall_us: u64) -> Option<(Gc, Option<LogLine>)> {
        if self.gc_paused {
            return None;
        }
        Some(self.collect_garbage(wall_us, self.gc_grace_override_ms))
    }

    /// Every range's root and entries, as JSON (the final reads).
    pub fn dump(&self) -> Value {
        let ring = &self.cfg.ring;
        let ranges: Vec<Value> = self
            .store
            .dump()
            .into_iter()
            .map(|r| {
                let tr = ring.range(r.range);
                let gc = self.store.replica(r.range).map_or(0, |x| x.gc_horizon());
                json!({
                    "range": r.range, "lo": tr.lo, "hi": tr.hi, "replicas": ring.replicas(r.range),
                    "root": r.root, "count": r.count, "gc_horizon": gc,
                    "entries": r.entries.iter().map(|e| json!([
                        String::from_utf8_lossy(&e.key), e.ts, e.value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned())
                    ])).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({"server": self.cfg.id, "ranges": ranges})
    }

    /// A fault hook at machine time `wall_us`: `clock <ms>`; `gc
    /// <grace_ms>` (one pass by time with that grace); `gc-grace
    /// <ms>|off` (every pass so until `off`, and a pass now); `gc-off`,
    /// `gc-on` (pause the passes); `repair-off`, `repair-on` (pause the
    /// scheduled repairs); `defect-overwrite on|off`. The answer, and
    /// lines to log.
    pub fn admin(&mut self, wall_us: u64, cmd: &str) -> (String, Vec<LogLine>) {
        let mut w = cmd.split_whitespace();
        let mut logs = Vec::new();
        let gc_now = |s: &mut KvServer, g: u64, logs: &mut Vec<LogLine>| {
            let (gc, l) = s.collect_garbage(wall_us, Some(g));
            logs.extend(l);
            format!("ok purged {} horizon {}", gc.purged, gc.horizon)
        };
        let answer = match (w.next(), w.next(), w.next()) {
            (Some("clock"), Some(ms), None) => match ms.parse::<i64>() {
                Ok(v) => {
                    self.clock_offset_ms = v;
                    "ok".into()
                }
                Err(_) => "error clock needs an integer offset in ms".into(),
            },
            (Some("gc"), Some(ms), None) => match ms.parse::<u64>() {
                Ok(g) => gc_now(self, g, &mut logs),
                Err(_) => "error gc needs a grace in ms".into(),
            },
            (Some("gc-grace"), Some("off"), None) => {
                self.gc_grace_override_ms = None;
                "ok".into()
            }
            (Some("gc-grace"), Some(ms), None) => match ms.parse::<u64>() {
                Ok(g) => {
                    self.gc_grace_override_ms = Some(g);
                    gc_now(self, g, &mut logs)
                }
                Err(_) => "error gc-grace needs a grace in ms, or off".into(),
            },
            (Some(pause @ ("gc-off" | "gc-on")), None, None) => {
                self.gc_paused = pause == "gc-off";
                "ok".into()
            }
            (Some(pause @ ("repair-off" | "repair-on")), None, None) => {
                self.repair_paused = pause == "repair-off";
                logs.push(line("kv_repair_paused", json!({"paused": self.repair_paused})));
                "ok".into()
            }
            (Some("defect-overwrite"), Some(on @ ("on" | "off")), None) => {
                self.store.set_defect_repair_overwrites(on == "on");
                logs.push(line("kv_defect", json!({"repair_overwrites": on == "on"})));
                "ok".into()
            }
            _ => "error kv hooks: clock <ms> | gc <grace_ms> | gc-grace <ms>|off | gc-off | gc-on | repair-off | repair-on | defect-overwrite on|off".into(),
        };
        (answer, logs)
    }
}

/// Whether a server down for `absent_ms` comes back rebuilt from its
/// peers rather than from its log: under GC by time, once it was away
/// longer than the grace its tombstones may have been purged everywhere
/// else, and a repair would bring back what they deleted. (With GC gated
/// on repair nothing is purged that it has not seen.)
pub fn rebuild_after_absence(gc: GcMode, gc_grace_ms: u64, absent_ms: u64) -> bool {
    gc == GcMode::Time && absent_ms > gc_grace_ms
}

/// A client's answer: HTTP status and JSON body, for a write of `key`
/// wanting `w` acks.
pub fn write_answer(key: &[u8], res: &crate::coord::WriteResult) -> (u16, Value) {
    let w = res.wanted;
    let status = if res.acks >= w { 200 } else { 503 };
    let mut v =
        json!({"key": String::from_utf8_lossy(key), "ts": res.ts, "acks": res.acks, "replicas": res.acked, "w": w});
    if status != 200 {
        v["error"] = format!("{} of {w} replicas acknowledged: {}", res.acks, res.errors.join("; ")).into();
    }
    (status, v)
}

/// A client's answer to a read of `key`.
pub fn read_answer(key: &[u8], res: &crate::coord::ReadResult) -> (u16, Value) {
    let (key, r) = (String::from_utf8_lossy(key), res.wanted);
    if res.replies < r {
        return (
            503,
            json!({"error": format!("{} of {r} replicas answered: {}", res.replies, res.errors.join("; ")),
                "key": key, "replies": res.replies, "r": r}),
        );
    }
    let w = res.winner.as_ref();
    (
        200,
        json!({
            "key": key,
            "value": w.and_then(|e| e.value.as_ref()).map(|v| String::from_utf8_lossy(v).into_owned()),
            "ts": w.map(|e| e.ts),
            "tombstone": w.is_some_and(|e| e.value.is_none()),
            "replies": res.replies, "r": r,
        }),
    )
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests;
