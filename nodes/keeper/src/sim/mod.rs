//! A deterministic simulation of a keeper cluster: N [`KeeperServer`]s
//! stepped in one thread from one seeded event queue, over a simulated
//! network ([`NetConfig`]), simulated disks ([`disk::SimDisk`]) and
//! per-server clocks. Nothing here reads the machine's clock or draws
//! unseeded randomness: the same seed and the same calls give the same
//! run, event for event, which [`Cluster::trace_hash`] summarises.
//!
//! Clients are the caller's: [`Cluster::connect`], [`Cluster::send`] and
//! [`Cluster::next_client_event`] carry real ZooKeeper frames between the
//! caller's simulated clients and the servers, with delays drawn like any
//! other link's. Faults: [`Cluster::kill`] (a crash, possibly in the
//! middle of a write, with the disk's kill mode applied to what was not
//! synced), [`Cluster::restart`], [`Cluster::pause`], link cuts of any
//! shape ([`Cluster::cut`]), clock skew and divergence through the
//! servers' own fault hooks ([`Cluster::admin`]), corruption of a stopped
//! server's files ([`Cluster::corrupt`]).
//!
//! While it runs, [`Invariants`] watches what no history can show: one
//! leader per term, committed entries that never change, digest aborts
//! only where a divergence was injected (and every injected one caught at
//! its index), no storage failure that was not a simulated crash.
//!
//! The network: peer links are ordered streams as the real transport's
//! TCP connections are — a message is lost only while its link is cut or
//! its receiver is down. Raft's own messages may besides be dropped,
//! duplicated and reordered (with [`NetConfig`]'s odds): Raft tolerates
//! that, and it reaches code paths an ordered link never does. The
//! keeper's other peer messages (forwarded writes, session reports)
//! travel in order, as they rely on.

pub mod disk;
mod invariants;
pub mod rng;

pub use invariants::{Invariants, Violation};

use crate::peer::PeerMsg;
use crate::server::{AdminAnswer, Effect, Env, Input, KeeperServer, Member, PlantedBugs, ServerConfig};
use disk::{KillMode, SimDisk};
use rng::SimRng;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// How messages travel.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// One-way delay of a message, uniform in this range (µs).
    pub delay_us: (u64, u64),
    /// Odds a message is slow, and by how much more at most (µs): a tail.
    pub slow: (f64, u64),
    /// Odds a Raft message is lost, duplicated, or delivered out of order.
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Clogging: the odds a peer message clogs its link, and the longest
    /// a clog lasts (µs). A clogged link delivers nothing until the clog
    /// ends, then everything it holds, in order.
    pub clog: (f64, u64),
    /// A client connection's one-way delay (µs).
    pub client_delay_us: (u64, u64),
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            delay_us: (100, 2_000),
            slow: (0.01, 50_000),
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            clog: (0.0, 2_000_000),
            client_delay_us: (50, 500),
        }
    }
}

/// A simulated cluster's make-up.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub nodes: u64,
    pub seed: u64,
    /// Every server's configuration; id, members and bootstrap are set
    /// per server.
    pub server: ServerConfig,
    pub net: NetConfig,
    /// Each server's clock runs fast or slow by up to this much (parts
    /// per million), drawn per server.
    pub clock_drift_ppm: u64,
    /// What a crash does to unsynced writes.
    pub kill_mode: KillMode,
    /// How long writing a snapshot takes (µs), uniform in this range.
    pub snapshot_write_us: (u64, u64),
    /// How long a log sync the server leaves to its driver takes (µs),
    /// uniform in this range (with `server.deferred_log_sync`). Syncs of
    /// one server finish in the order asked, as one sync thread's do.
    pub log_sync_us: (u64, u64),
    /// The wall clock when the simulation starts (ms since the epoch).
    pub epoch_ms: i64,
    pub bugs: PlantedBugs,
    /// 0: a server advances (persists, sends, applies) after every input.
    /// Else it advances this long (µs) after the first input of a batch,
    /// taking every input that arrives meanwhile first — as the node's
    /// driver steps what waited while its last write ran, then advances
    /// once — so a Raft round carries new proposals and commits together.
    pub batch_us: u64,
}

/// What the simulation hands the caller's clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// A frame's payload (its length stripped) from the server on `conn`.
    Frame { conn: u64, payload: Vec<u8> },
    /// The connection ended.
    Closed { conn: u64 },
    /// A timer set with [`Cluster::timer`] fired.
    Timer { token: u64 },
}

#[derive(Debug)]
enum Ev {
    /// A server's tick, of the chain numbered so (see `Node::ticks`).
    Tick(u64, u64),
    Peer {
        from: u64,
        to: u64,
        msg: PeerMsg,
    },
    Accept {
        node: u64,
        conn: u64,
    },
    Frame {
        node: u64,
        conn: u64,
        payload: Vec<u8>,
    },
    Hangup {
        node: u64,
        conn: u64,
    },
    SnapshotDone {
        node: u64,
        /// Boxed: a tree copy would make every queued event that large.
        job: Box<crate::server::SnapshotJob>,
        incarnation: u64,
    },
    /// A log sync the server asked for ([`Effect::SyncLog`]) ends: the
    /// `len` bytes the file had once the asking Ready's entries were
    /// written are durable now (not what was written since: the
    /// strictest a real sync promises), and the server is told.
    LogSynced {
        node: u64,
        number: u64,
        file: String,
        len: u64,
        incarnation: u64,
    },
    /// The end of a server's batch of inputs (see [`SimConfig::batch_us`]).
    Advance(u64),
    Client(ClientEvent),
}

// The queue moves events as it orders them: keep them small (box what is large).
const _: () = assert!(std::mem::size_of::<Ev>() <= 96);

impl Ev {
    /// The server the event happens at (none for the caller's events).
    fn node(&self) -> Option<u64> {
        match self {
            Ev::Tick(n, _) => Some(*n),
            Ev::Peer { to, .. } => Some(*to),
            Ev::Accept { node, .. } | Ev::Frame { node, .. } | Ev::Hangup { node, .. } => Some(*node),
            Ev::SnapshotDone { node, .. } | Ev::LogSynced { node, .. } => Some(*node),
            Ev::Advance(n) => Some(*n),
            Ev::Client(_) => None,
        }
    }
}

/// A server's clock: the simulation's time, skewed and drifting.
#[derive(Debug, Clone, Copy)]
struct Clock {
    offset_us: i64,
    drift_ppm: i64,
}

impl Clock {
    fn local_us(&self, now_us: u64) -> u64 {
        let drifted = now_us as i128 + now_us as i128 * self.drift_ppm as i128 / 1_000_000;
        (drifted + self.offset_us as i128).max(0) as u64
    }
}

struct Node {
    server: Option<KeeperServer<SimDisk>>,
    /// The disk while the server is down.
    disk: Option<SimDisk>,
    clock: Clock,
    /// Events held while the server is paused (delivered on resume).
    held: Option<Vec<Ev>>,
    /// Counts starts, so a snapshot written for an earlier life is dropped.
    incarnation: u64,
    /// When its last log sync ends (the next ends no earlier).
    synced_at: u64,
    /// The number of its tick chain: a start or a resume begins a new one,
    /// and a tick of an older chain still queued (the server stopped or
    /// paused and came back within a tick) ends there, so a server never
    /// ticks faster than its clock.
    ticks: u64,
    /// An [`Ev::Advance`] is scheduled for the batch under way.
    advance_due: bool,
    /// The server's log lines: (simulated µs, event, fields).
    log: Vec<(u64, &'static str, serde_json::Value)>,
}

/// One connection between a caller's client and a server.
struct Conn {
    node: u64,
    open: bool,
    /// The latest delivery time scheduled each way, so each direction
    /// stays in order.
    to_server_at: u64,
    to_client_at: u64,
}

/// How a server stopped, as [`Cluster::down`] tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Down {
    /// Killed (or crashed at a simulated disk fault).
    Killed,
    /// Stopped itself on a digest mismatch at this log index.
    DigestAbort { index: u64 },
    /// Stopped itself on a storage failure.
    Fatal(String),
}

pub struct Cluster {
    cfg: SimConfig,
    now_us: u64,
    rng: SimRng,
    net_rng: SimRng,
    disk_rng: SimRng,
    /// Draws log syncs' durations (its own stream: runs without deferred
    /// syncs draw nothing from it, and replay as before it existed).
    sync_rng: SimRng,
    nodes: BTreeMap<u64, Node>,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    /// Directed links that deliver nothing.
    cut: BTreeSet<(u64, u64)>,
    /// The latest delivery time scheduled per directed peer link (ordered
    /// traffic).
    link_at: BTreeMap<(u64, u64), u64>,
    /// Clogged directed links, and when each clog ends (µs).
    clogged: BTreeMap<(u64, u64), u64>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    down: BTreeMap<u64, Down>,
    /// Servers whose disk was replaced (wiped, or refused at start), with
    /// the highest commit index at that moment: they recover once they
    /// applied it (see [`Cluster::recovering`]).
    lost: BTreeMap<u64, u64>,
    trace: siphasher::sip::SipHasher13,
    events: u64,
    pub invariants: Invariants,
}

/// Server `id`'s names in the simulated network (never a socket).
pub fn member(id: u64) -> Member {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10 + id as u8));
    Member {
        id,
        raft: SocketAddr::new(ip, 2182),
        client: SocketAddr::new(ip, 2181),
    }
}

/// What a caught panic said.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

fn trace_write(h: &mut siphasher::sip::SipHasher13, parts: &[u64]) {
    for p in parts {
        std::hash::Hasher::write_u64(h, *p);
    }
}

/// A peer message's hash for the trace: a Raft message's own bytes (most
/// of the traffic, not framed again only to be hashed), the others framed.
fn peer_hash(msg: &PeerMsg) -> u64 {
    match msg {
        PeerMsg::Raft(b) | PeerMsg::Snapshot(b) => bytes_hash(b),
        other => bytes_hash(&other.encode()),
    }
}

fn bytes_hash(b: &[u8]) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(1, 2);
    std::hash::Hasher::write(&mut h, b);
    std::hash::Hasher::finish(&h)
}

impl Cluster {
    /// A new cluster, every server started fresh (its first start).
    pub fn new(cfg: SimConfig) -> Cluster {
        let rng = SimRng::new(cfg.seed);
        let mut clock_rng = rng.fork("clocks");
        let mut c = Cluster {
            net_rng: rng.fork("net"),
            disk_rng: rng.fork("disk"),
            sync_rng: rng.fork("log-sync"),
            rng: rng.fork("cluster"),
            now_us: 0,
            nodes: BTreeMap::new(),
            queue: BTreeMap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            link_at: BTreeMap::new(),
            clogged: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_conn: 1,
            down: BTreeMap::new(),
            lost: BTreeMap::new(),
            trace: siphasher::sip::SipHasher13::new_with_keys(cfg.seed, 0x0074_7261_6365),
            events: 0,
            invariants: Invariants::default(),
            cfg,
        };
        let drift = c.cfg.clock_drift_ppm as i64;
        for id in 1..=c.cfg.nodes {
            let drift_ppm = if drift == 0 {
                0
            } else {
                clock_rng.between(0, 2 * drift as u64) as i64 - drift
            };
            c.nodes.insert(
                id,
                Node {
                    server: None,
                    disk: Some(SimDisk::new()),
                    clock: Clock {
                        offset_us: 0,
                        drift_ppm,
                    },
                    held: None,
                    incarnation: 0,
                    synced_at: 0,
                    ticks: 0,
                    advance_due: false,
                    log: Vec::new(),
                },
            );
        }
        for id in 1..=c.cfg.nodes {
            c.start(id, true);
        }
        c
    }

    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// A summary of every event handled so far: the same seed and calls
    /// give the same hash.
    pub fn trace_hash(&self) -> u64 {
        std::hash::Hasher::finish(&self.trace)
    }

    /// Events handled so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    pub fn server(&self, id: u64) -> Option<&KeeperServer<SimDisk>> {
        self.nodes.get(&id)?.server.as_ref()
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.server(id).is_some()
    }

    pub fn is_paused(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.held.is_some())
    }

    /// Why a server is down, if it stopped by itself or was killed.
    pub fn down(&self, id: u64) -> Option<&Down> {
        self.down.get(&id)
    }

    /// A server's log lines so far: (simulated µs, event, fields).
    pub fn log(&self, id: u64) -> &[(u64, &'static str, serde_json::Value)] {
        self.nodes.get(&id).map_or(&[], |n| n.log.as_slice())
    }

    /// Takes server `id`'s log lines out of the cluster (a finished run's
    /// lines, handed on without a copy).
    pub fn take_log(&mut self, id: u64) -> Vec<(u64, &'static str, serde_json::Value)> {
        self.nodes
            .get_mut(&id)
            .map(|n| std::mem::take(&mut n.log))
            .unwrap_or_default()
    }

    /// The current leader most servers that are up follow (0: none).
    pub fn leader(&self) -> u64 {
        let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
        for n in self.nodes.values() {
            if let Some(s) = &n.server {
                if s.leader() != 0 {
                    *votes.entry(s.leader()).or_default() += 1;
                }
            }
        }
        votes
            .into_iter()
            .max_by_key(|(id, v)| (*v, u64::MAX - id))
            .map_or(0, |(id, _)| id)
    }

    fn server_config(&self, id: u64, bootstrap: bool) -> ServerConfig {
        let mut s = self.cfg.server.clone();
        s.id = id;
        s.members = (1..=self.cfg.nodes).map(member).collect();
        s.bootstrap = bootstrap;
        s
    }

    fn env(&self, id: u64) -> Env {
        let local = self.nodes[&id].clock.local_us(self.now_us);
        Env {
            now_us: local,
            wall_ms: self.cfg.epoch_ms + (local / 1000) as i64,
        }
    }

    fn start(&mut self, id: u64, bootstrap: bool) {
        self.invariants.now_us = self.now_us;
        let env = self.env(id);
        let cfg = self.server_config(id, bootstrap);
        let bugs = self.cfg.bugs;
        let node = self.nodes.get_mut(&id).expect("a server of the cluster");
        let Some(disk) = node.disk.take() else { return };
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| KeeperServer::open(cfg, disk, env)));
        let opened = match opened {
            Ok(r) => r,
            Err(payload) => {
                self.invariants
                    .panicked(id, &format!("on start: {}", panic_text(&*payload)));
                self.down.insert(id, Down::Fatal("panicked on start".into()));
                self.invariants.forget_promises(id);
                node.disk = Some(SimDisk::new());
                return;
            }
        };
        match opened {
            Ok((mut server, out)) => {
                server.plant_bugs(bugs);
                self.invariants.started(&server);
                node.server = Some(server);
                node.incarnation += 1;
                self.down.remove(&id);
                self.apply(id, out);
                self.start_ticks(id);
            }
            Err(e) => {
                // a server whose storage cannot be opened stays down; the
                // disk is gone with the failed attempt
                self.down.insert(id, Down::Fatal(format!("open: {e}")));
                self.invariants.open_failed(id, &e.to_string());
                self.invariants.forget_promises(id);
                node.disk = Some(SimDisk::new());
                let mark = self.max_commit();
                self.lost.insert(id, mark);
            }
        }
    }

    fn tick_us(&mut self, id: u64) -> u64 {
        let ms = self.cfg.server.tick_ms;
        let drift = self.nodes[&id].clock.drift_ppm;
        // a fast clock ticks more often in simulated time
        ((ms * 1000) as i64 - (ms * 1000) as i64 * drift / 1_000_000).max(1) as u64
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at.max(self.now_us), self.seq), ev);
    }

    fn delay(&mut self, range: (u64, u64)) -> u64 {
        let mut d = self.net_rng.between(range.0, range.1);
        if self.net_rng.chance(self.cfg.net.slow.0) {
            d += self.net_rng.between(0, self.cfg.net.slow.1);
        }
        d
    }

    /// Sends a peer message over the simulated network.
    fn send_peer(&mut self, from: u64, to: u64, msg: PeerMsg) {
        if self.cut.contains(&(from, to)) || !self.nodes.contains_key(&to) {
            return;
        }
        let raft = matches!(msg, PeerMsg::Raft(_));
        if raft && self.net_rng.chance(self.cfg.net.loss) {
            return;
        }
        let (odds, longest) = self.cfg.net.clog;
        if self.net_rng.chance(odds) && !self.is_clogged(from, to) {
            let until = self.now_us + self.net_rng.between(longest / 10, longest);
            self.clog(from, to, until);
        }
        let d = self.delay(self.cfg.net.delay_us);
        let mut at = self.now_us + d;
        if let Some(&until) = self.clogged.get(&(from, to)).filter(|&&u| u > self.now_us) {
            at = at.max(until + d);
        }
        let reordered = raft && self.net_rng.chance(self.cfg.net.reorder);
        if !reordered {
            let last = self.link_at.entry((from, to)).or_insert(0);
            at = at.max(*last);
            *last = at;
        }
        if raft && self.net_rng.chance(self.cfg.net.duplicate) {
            let again = at + self.delay(self.cfg.net.delay_us);
            self.schedule(
                again,
                Ev::Peer {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
        self.schedule(at, Ev::Peer { from, to, msg });
    }

    /// Carries out a server's effects.
    fn apply(&mut self, id: u64, out: Vec<Effect>) {
        for e in out {
            match e {
                Effect::Peer { to, msg } => {
                    if let PeerMsg::Raft(bytes) = &msg {
                        self.invariants.sent(id, bytes);
                    }
                    self.send_peer(id, to, msg)
                }
                Effect::Client { conn, frame } => self.send_to_client(conn, frame),
                Effect::Close { conn } => self.close_to_client(conn),
                // every effect is delivered as it comes
                Effect::Flush => {}
                Effect::WriteSnapshot(job) => {
                    let d = self
                        .rng
                        .between(self.cfg.snapshot_write_us.0, self.cfg.snapshot_write_us.1);
                    let incarnation = self.nodes[&id].incarnation;
                    self.schedule(
                        self.now_us + d,
                        Ev::SnapshotDone {
                            node: id,
                            job: Box::new(job),
                            incarnation,
                        },
                    );
                }
                Effect::SyncLog { number, file, len } => {
                    let d = self.sync_rng.between(self.cfg.log_sync_us.0, self.cfg.log_sync_us.1);
                    let node = self.nodes.get_mut(&id).expect("known");
                    let at = (self.now_us + d).max(node.synced_at);
                    node.synced_at = at;
                    let incarnation = node.incarnation;
                    self.schedule(
                        at,
                        Ev::LogSynced {
                            node: id,
                            number,
                            file,
                            len,
                            incarnation,
                        },
                    );
                }
                Effect::Log { event, fields } => {
                    self.invariants.logged(id, event, &fields);
                    self.nodes
                        .get_mut(&id)
                        .expect("known")
                        .log
                        .push((self.now_us, event, fields));
                }
                Effect::Fatal { reason } => {
                    let crash = self.nodes[&id].server.as_ref().is_some_and(|s| s.disk().crashed());
                    if crash {
                        self.crash(id);
                    } else {
                        self.invariants.fatal(id, &reason);
                        self.stop(id, Down::Fatal(reason));
                    }
                    return;
                }
                Effect::DigestMismatch(m) => {
                    self.invariants.digest_mismatch(id, &m);
                    self.log_line(id, crate::NodeEvent::DigestMismatch.name(), m.log_fields());
                    self.stop(id, Down::DigestAbort { index: m.log_index });
                    return;
                }
            }
        }
    }

    fn log_line(&mut self, id: u64, event: &'static str, fields: serde_json::Value) {
        let now = self.now_us;
        if let Some(n) = self.nodes.get_mut(&id) {
            n.log.push((now, event, fields));
        }
    }

    fn send_to_client(&mut self, conn: u64, frame: Vec<u8>) {
        let d = self.delay(self.cfg.net.client_delay_us);
        let now = self.now_us;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if !c.open {
            return;
        }
        let at = (now + d).max(c.to_client_at);
        c.to_client_at = at;
        let payload = frame.get(4..).map(<[u8]>::to_vec).unwrap_or_default();
        self.schedule(at, Ev::Client(ClientEvent::Frame { conn, payload }));
    }

    /// The server ends a connection: what it sent arrives first.
    fn close_to_client(&mut self, conn: u64) {
        let now = self.now_us;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if !c.open {
            return;
        }
        c.open = false;
        let at = (now + 1).max(c.to_client_at);
        self.schedule(at, Ev::Client(ClientEvent::Closed { conn }));
    }

    /// Takes a server down: its connections close, its disk stays.
    fn stop(&mut self, id: u64, why: Down) {
        let node = self.nodes.get_mut(&id).expect("known");
        if let Some(server) = node.server.take() {
            node.disk = Some(server.into_disk());
        }
        node.held = None;
        node.advance_due = false;
        self.down.insert(id, why);
        let conns: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.node == id && c.open)
            .map(|(k, _)| *k)
            .collect();
        for conn in conns {
            self.close_to_client(conn);
        }
    }

    /// The server died: what it had not synced meets the kill mode.
    fn crash(&mut self, id: u64) {
        if let Some(s) = self.nodes.get(&id).and_then(|n| n.server.as_ref()) {
            self.invariants.crashing(s);
        }
        self.stop(id, Down::Killed);
        let mode = self.cfg.kill_mode;
        let node = self.nodes.get_mut(&id).expect("known");
        if let Some(d) = node.disk.as_mut() {
            d.reboot(mode, &mut self.disk_rng);
        }
        self.invariants.crashed(id);
    }

    // ------------------------------------------------------------ running

    /// Handles events until one for the caller's clients comes up (it is
    /// returned), or until simulated time reaches `until_us` (None).
    pub fn next_client_event(&mut self, until_us: u64) -> Option<ClientEvent> {
        loop {
            let Some((&(at, seq), _)) = self.queue.first_key_value() else {
                self.now_us = self.now_us.max(until_us);
                return None;
            };
            if at > until_us {
                self.now_us = self.now_us.max(until_us);
                return None;
            }
            let ev = self.queue.remove(&(at, seq)).expect("first key");
            self.now_us = at;
            if let Some(c) = self.handle(ev) {
                return Some(c);
            }
        }
    }

    /// Runs the cluster alone until `until_us` (client events that come up
    /// are dropped: use [`Cluster::next_client_event`] to see them).
    pub fn run_until(&mut self, until_us: u64) {
        while self.next_client_event(until_us).is_some() {}
    }

    fn handle(&mut self, ev: Ev) -> Option<ClientEvent> {
        self.events += 1;
        self.invariants.now_us = self.now_us;
        let kind = match &ev {
            Ev::Tick(..) => 1,
            Ev::Peer { msg, .. } => 10 + peer_hash(msg) % 1_000_000,
            Ev::Accept { conn, .. } => 2_000_000 + conn,
            Ev::Frame { payload, .. } => 3_000_000 + bytes_hash(payload) % 1_000_000,
            Ev::Hangup { conn, .. } => 4_000_000 + conn,
            Ev::SnapshotDone { .. } => 5,
            Ev::Advance(_) => 9,
            Ev::LogSynced { number, .. } => 11_000_000 + number % 1_000_000,
            Ev::Client(ClientEvent::Frame { payload, .. }) => 6_000_000 + bytes_hash(payload) % 1_000_000,
            Ev::Client(ClientEvent::Closed { conn }) => 7_000_000 + conn,
            Ev::Client(ClientEvent::Timer { token }) => 8_000_000 + token,
        };
        trace_write(&mut self.trace, &[self.now_us, ev.node().unwrap_or(0), kind]);
        let Some(id) = ev.node() else {
            let Ev::Client(c) = ev else {
                unreachable!("only client events have no server")
            };
            return Some(c);
        };
        let node = self.nodes.get_mut(&id).expect("known");
        if let Some(held) = node.held.as_mut() {
            // paused: nothing runs there; what arrives waits
            if !matches!(ev, Ev::Tick(..)) {
                held.push(ev);
            }
            return None;
        }
        // down: messages to it are lost; a hangup it never sees
        node.server.as_ref()?;
        let env = self.env(id);
        let mut out = Vec::new();
        // a panicking server is a finding, not the end of the simulation:
        // it is reported and taken down as a crash
        let stepped =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step_server(id, env, ev, &mut out)));
        match stepped {
            Ok(true) => {}
            Ok(false) => return None,
            Err(payload) => {
                self.invariants.panicked(id, &panic_text(&*payload));
                self.crash(id);
                return None;
            }
        }
        self.invariants.flushed(id, &out);
        self.apply(id, out);
        if let Some(s) = self.nodes[&id].server.as_ref() {
            self.invariants.observe(s);
        }
        None
    }

    /// Hands event `ev` to server `id` (up, not paused) and advances it;
    /// false when the event never reached it.
    fn step_server(&mut self, id: u64, env: Env, ev: Ev, out: &mut Vec<Effect>) -> bool {
        let advance_now = self.cfg.batch_us == 0 || matches!(ev, Ev::Advance(_));
        let server = self.nodes.get_mut(&id).and_then(|n| n.server.as_mut()).expect("up");
        match ev {
            Ev::Tick(_, chain) => {
                if chain != self.nodes[&id].ticks {
                    return false;
                }
                let server = self.nodes.get_mut(&id).and_then(|n| n.server.as_mut()).expect("up");
                server.step(env, Input::Tick, &mut |e| out.push(e));
                let tick = self.tick_us(id);
                self.schedule(self.now_us + tick, Ev::Tick(id, chain));
            }
            Ev::Peer { from, msg, .. } => {
                if self.cut.contains(&(from, id)) {
                    return false;
                }
                server.step(env, Input::Peer { from, msg }, &mut |e| out.push(e));
            }
            Ev::Accept { conn, .. } => {
                let peer = Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
                    // a port for the peer's address: any, but the same each run
                    40_000 + (conn % 25_000) as u16,
                ));
                server.step(env, Input::Accepted { conn, peer }, &mut |e| out.push(e));
            }
            Ev::Frame { conn, payload, .. } => server.step(env, Input::Frame { conn, payload }, &mut |e| out.push(e)),
            Ev::Hangup { conn, .. } => server.step(env, Input::Closed { conn }, &mut |e| out.push(e)),
            Ev::SnapshotDone { job, incarnation, .. } => {
                if incarnation != self.nodes[&id].incarnation {
                    return false;
                }
                let server = self.nodes.get_mut(&id).and_then(|n| n.server.as_mut()).expect("up");
                let result = job.write(server.disk_mut());
                let (index, term) = (job.meta.last_index, job.meta.last_term);
                server.step(
                    env,
                    Input::SnapshotWritten {
                        index,
                        term,
                        result,
                        copy_ms: 0.0,
                        write_ms: 0.0,
                    },
                    &mut |e| out.push(e),
                );
            }
            Ev::LogSynced {
                number,
                file,
                len,
                incarnation,
                ..
            } => {
                if incarnation != self.nodes[&id].incarnation {
                    return false;
                }
                let server = self.nodes.get_mut(&id).and_then(|n| n.server.as_mut()).expect("up");
                // as crate::changelog::sync_left: a file gone has nothing to sync
                let result = match server.disk_mut().sync_prefix(&file, len) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    r => r.map_err(|e| format!("changelog {file}: {e}")),
                };
                server.step(env, Input::LogSynced { number, result }, &mut |e| out.push(e));
            }
            Ev::Advance(_) => {
                self.nodes.get_mut(&id).expect("known").advance_due = false;
            }
            Ev::Client(_) => unreachable!("handled above"),
        }
        let batch_us = self.cfg.batch_us;
        let node = self.nodes.get_mut(&id).expect("known");
        if !advance_now {
            if !node.advance_due {
                node.advance_due = true;
                self.schedule(self.now_us + batch_us, Ev::Advance(id));
            }
            return true;
        }
        let server = node.server.as_mut().expect("up");
        if !server.halted() {
            server.advance(env, &mut |e| out.push(e));
        }
        true
    }

    // ------------------------------------------------------------ clients

    /// Opens a client connection to server `node`; its id.
    pub fn connect(&mut self, node: u64) -> u64 {
        let conn = self.next_conn;
        self.next_conn += 1;
        let d = self.delay(self.cfg.net.client_delay_us);
        let at = self.now_us + d;
        self.conns.insert(
            conn,
            Conn {
                node,
                open: true,
                to_server_at: at,
                to_client_at: at,
            },
        );
        if self.is_up(node) {
            self.schedule(at, Ev::Accept { node, conn });
        } else {
            // nobody listens there: refused
            self.close_to_client(conn);
        }
        conn
    }

    /// Sends a frame (length included) on `conn`; nothing if it closed.
    pub fn send(&mut self, conn: u64, frame: Vec<u8>) {
        let d = self.delay(self.cfg.net.client_delay_us);
        let now = self.now_us;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if !c.open {
            return;
        }
        let at = (now + d).max(c.to_server_at);
        c.to_server_at = at;
        let node = c.node;
        let payload = frame.get(4..).map(<[u8]>::to_vec).unwrap_or_default();
        self.schedule(at, Ev::Frame { node, conn, payload });
    }

    /// The client hangs up `conn`.
    pub fn hang_up(&mut self, conn: u64) {
        let now = self.now_us;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if !c.open {
            return;
        }
        c.open = false;
        let at = (now + 1).max(c.to_server_at);
        let node = c.node;
        self.schedule(at, Ev::Hangup { node, conn });
    }

    /// A [`ClientEvent::Timer`] with `token` at simulated time `at_us`.
    pub fn timer(&mut self, at_us: u64, token: u64) {
        self.schedule(at_us, Ev::Client(ClientEvent::Timer { token }));
    }

    /// A draw from the cluster's generator (for the caller's choices that
    /// must follow the seed).
    pub fn draw(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    // ------------------------------------------------------------ faults

    /// Kills server `id`: at once, or — with `mid_write` — at one of its
    /// next few disk operations, so it may die between a write and its
    /// sync. What it had not synced meets the kill mode.
    pub fn kill(&mut self, id: u64, mid_write: bool) {
        if mid_write {
            let n = self.disk_rng.between(1, 6);
            if let Some(s) = self.nodes.get_mut(&id).and_then(|n| n.server.as_mut()) {
                s.disk_mut().crash_after(n);
                return;
            }
        }
        if self.is_up(id) {
            self.crash(id);
        }
    }

    /// Whether server `id` runs with a crash armed that has not struck.
    pub fn armed(&self, id: u64) -> bool {
        self.nodes
            .get(&id)
            .and_then(|n| n.server.as_ref())
            .is_some_and(|s| s.disk().armed())
    }

    /// Starts a stopped server again on its disk. A server whose armed
    /// crash (see [`Cluster::kill`]) has not struck yet — it touched no
    /// disk since — dies now and starts again.
    pub fn restart(&mut self, id: u64) {
        if self.armed(id) {
            self.crash(id);
        }
        if !self.is_up(id) && self.nodes.contains_key(&id) {
            self.start(id, false);
        }
    }

    /// Drops a stopped server's data (a replaced machine); it rejoins
    /// without state on its next start.
    pub fn wipe(&mut self, id: u64) {
        if let Some(n) = self.nodes.get_mut(&id) {
            if n.server.is_none() {
                n.disk = Some(SimDisk::new());
                self.invariants.forget_promises(id);
                let mark = self.max_commit();
                self.lost.insert(id, mark);
            }
        }
    }

    /// Freezes server `id`: it handles nothing until [`Cluster::resume`].
    pub fn pause(&mut self, id: u64) {
        if let Some(n) = self.nodes.get_mut(&id) {
            if n.server.is_some() && n.held.is_none() {
                n.held = Some(Vec::new());
            }
        }
    }

    pub fn resume(&mut self, id: u64) {
        let Some(held) = self.nodes.get_mut(&id).and_then(|n| n.held.take()) else {
            return;
        };
        for ev in held {
            self.schedule(self.now_us, ev);
        }
        self.start_ticks(id);
    }

    /// Begins a new tick chain for server `id`, ending any older one.
    fn start_ticks(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known");
        node.ticks += 1;
        let chain = node.ticks;
        let tick = self.tick_us(id);
        self.schedule(self.now_us + tick, Ev::Tick(id, chain));
    }

    /// Cuts the directed links `links` (from, to), on top of any cut.
    pub fn cut(&mut self, links: &[(u64, u64)]) {
        self.cut.extend(links.iter().copied());
    }

    pub fn heal(&mut self) {
        self.cut.clear();
        self.clogged.clear();
    }

    /// The final phase's network: no more loss, duplicates or clogs (the
    /// delays and reordering stay). A network that keeps dropping Raft
    /// messages and clogging links after the heal keeps the cluster
    /// electing and expiring sessions, so the final reads time out and
    /// a run that found nothing says `unknown`.
    pub fn calm_network(&mut self) {
        self.cfg.net.loss = 0.0;
        self.cfg.net.duplicate = 0.0;
        self.cfg.net.clog.0 = 0.0;
        self.clogged.clear();
    }

    /// Whether the directed link `from` → `to` is cut: what the
    /// caller's own traffic between servers (a service beside the
    /// keeper) must not deliver either.
    pub fn is_cut(&self, from: u64, to: u64) -> bool {
        self.cut.contains(&(from, to))
    }

    /// Server `id`'s machine clock, in µs since the epoch: the
    /// simulation's time, skewed and drifting as the server's own — what
    /// a service beside the keeper on that machine reads.
    pub fn wall_us(&self, id: u64) -> u64 {
        let local = self
            .nodes
            .get(&id)
            .map_or(self.now_us, |n| n.clock.local_us(self.now_us));
        (self.cfg.epoch_ms.max(0) as u64) * 1000 + local
    }

    /// How many times server `id` has started: a service beside the
    /// keeper crashes with it and starts again with it.
    pub fn incarnation(&self, id: u64) -> u64 {
        self.nodes.get(&id).map_or(0, |n| n.incarnation)
    }

    /// Clogs the directed link `from` → `to` until `until_us`: what is
    /// sent over it meanwhile arrives after that, in order.
    pub fn clog(&mut self, from: u64, to: u64, until_us: u64) {
        self.clogged.insert((from, to), until_us);
    }

    fn is_clogged(&self, from: u64, to: u64) -> bool {
        self.clogged.get(&(from, to)).is_some_and(|&u| u > self.now_us)
    }

    /// Sends an admin command line to server `id` (with its fault token
    /// prepended); the answer.
    pub fn admin(&mut self, id: u64, command: &str) -> String {
        self.invariants.now_us = self.now_us;
        let token = self.cfg.server.fault_token.clone().unwrap_or_default();
        if command.starts_with("diverge") {
            self.invariants.diverge_armed(id);
        }
        let env = self.env(id);
        let Some(server) = self.nodes.get_mut(&id).and_then(|n| n.server.as_mut()) else {
            return "error down".into();
        };
        let mut out = Vec::new();
        let answer = server.admin(env, &format!("{token} {command}"), &mut |e| out.push(e));
        self.apply(id, out);
        match answer {
            AdminAnswer::Reply(s) => s,
            AdminAnswer::ClockSet(_) => "ok".into(),
            AdminAnswer::Table(_) | AdminAnswer::Kv(_) => "error no tables or kv in a simulated cluster".into(),
        }
    }

    /// Damages one of a stopped server's log or snapshot files (picked
    /// from the seed): flips one byte, or with `truncate` cuts the file
    /// short; what it damaged.
    pub fn corrupt(&mut self, id: u64, truncate: bool) -> Option<String> {
        self.invariants.now_us = self.now_us;
        let node = self.nodes.get_mut(&id)?;
        let disk = node.disk.as_mut()?;
        let names: Vec<String> = crate::disk::Disk::list(disk)
            .ok()?
            .into_iter()
            .filter(|n| n.starts_with("changelog") || n.starts_with("snapshot"))
            .collect();
        if names.is_empty() {
            return None;
        }
        let name = names[self.disk_rng.below(names.len() as u64) as usize].clone();
        let len = crate::disk::Disk::len(disk, &name).ok()? as usize;
        if len == 0 {
            return None;
        }
        let at = self.disk_rng.below(len as u64) as usize;
        self.invariants.corrupted(id);
        if truncate {
            crate::disk::Disk::truncate(&mut disk.mem, &name, at as u64).ok()?;
            return Some(format!("{name} to {at} bytes"));
        }
        disk.mem.flip(&name, at, 1 << self.disk_rng.below(8));
        Some(format!("{name} byte {at}"))
    }

    /// Every server that is up: (id, applied index, tree digest).
    /// The highest commit index a running server knows.
    fn max_commit(&self) -> u64 {
        self.nodes
            .values()
            .filter_map(|n| n.server.as_ref().map(|s| s.commit_index()))
            .max()
            .unwrap_or(0)
    }

    /// Servers that lost their disk and have not yet applied what was
    /// committed when they did. Raft's guarantees hold while these stay a
    /// minority: a fault schedule that takes more disks at once is outside
    /// them.
    pub fn recovering(&mut self) -> Vec<u64> {
        let nodes = &self.nodes;
        self.lost
            .retain(|id, mark| nodes[id].server.as_ref().is_none_or(|s| s.applied_index() < *mark));
        self.lost.keys().copied().collect()
    }

    pub fn states(&self) -> Vec<(u64, u64, u64)> {
        self.nodes
            .iter()
            .filter_map(|(id, n)| n.server.as_ref().map(|s| (*id, s.applied_index(), s.tree_digest())))
            .collect()
    }
}

#[cfg(test)]
mod tests;
