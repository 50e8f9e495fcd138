//! One keeper server process: the driver of the sans-IO
//! [`KeeperServer`] (`drift_keeper::server`), which holds every protocol
//! decision — Raft, the digest checks, sessions, reads, snapshots. This
//! file turns sockets, ticks and signals into its inputs and carries out
//! its effects: frames to peers and clients, connections closed, snapshot
//! files written on a worker thread, log files synced on another, JSON
//! log lines, exits.
//!
//! One thread runs the server (the loop); sockets have their own threads
//! that only move bytes and hand events to the loop over a channel. The
//! loop hands the server every event that is waiting, then lets it
//! advance once, so one fsync carries many writes. The server marks the
//! end of each batch of its effects (`Effect::Flush`: before it writes its
//! log, and at the end of each input); the loop holds frames until then
//! and sends each peer its batch in one write and the clients theirs to
//! their I/O thread in one hand-off, one wake-up for all.
//!
//! With `log_sync = "deferred"` (the default) the server only writes the
//! log's new entries and asks for their sync. While other events wait,
//! the sync thread syncs them and the loop goes on with the events; each
//! of its syncs covers every entry written before it began, so under
//! load a sync carries the entries of every Ready that came while the
//! previous one ran (group commit across clients and peers). On a
//! follower, when no event waits, the loop syncs itself: nothing is lost
//! by waiting then, and the two hand-offs between threads are saved. A
//! leader always hands its syncs on: every write's commit passes through
//! its loop (proposals forwarded to it, the followers' acknowledgements),
//! and any of them arriving during a sync on the loop waited its whole
//! length (BENCHMARKS.md, "The leader's syncs on the sync thread"). What
//! must wait for the entries to be durable waits in the server for the
//! answer.

use crate::config::ClusterConfig;
use crate::error::NodeError;
use crate::fsdisk::FsDisk;
use crate::transport::{self, Identity, Links, PeerMsg};
use drift_keeper::entry::DigestMismatch;
use drift_keeper::jute;
use drift_keeper::proto;
use drift_keeper::server::{AdminAnswer, Effect, Env, Input, KeeperServer, OpenError, SnapshotJob};
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Exit code of a server that found its tree diverged from the leader's.
pub use drift_keeper::server::DIGEST_ABORT_EXIT;
/// Frames queued per client connection before it is dropped as too slow.
const CONN_QUEUE_MAX: usize = 8192;
/// Most events handled between two Raft Readies (bounds the latency one
/// Ready adds to the events queued behind it).
const EVENTS_PER_READY_MAX: usize = 512;
/// Log syncs the loop makes itself, one after another, while no other
/// event waits (each releases what waited for it, which may ask for more).
const SYNC_ROUNDS_ON_LOOP_MAX: usize = 4;
/// Admin connections served at a time; more are closed at once.
const ADMIN_CONNS_MAX: usize = 8;
/// An admin connection must send its command line within this.
const ADMIN_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest admin command line.
const ADMIN_LINE_BYTES_MAX: usize = 512;

/// Answers the admin endpoint's `<token> table …` commands.
pub type TableAdmin = Arc<dyn Fn(&str) -> String + Send + Sync>;

pub struct NodeOptions {
    pub id: u64,
    pub config: ClusterConfig,
    /// Fault hooks (diverge, clock) are reachable only with this token, on
    /// `admin`; without both, nothing can trigger them.
    pub fault_token: Option<String>,
    pub admin: Option<SocketAddr>,
    /// Exit once this process (the one that started the node) is no
    /// longer its parent: a campaign killed mid-run must not leave its
    /// nodes running, even one killed before the node began to watch (the
    /// parent's PID read at start would then already be init's).
    pub exit_with_parent: Option<u32>,
    /// Peers reached through another address than their Raft address (a
    /// harness's per-link proxy).
    pub peer_via: Vec<(u64, SocketAddr)>,
    /// The first start of a new cluster: a node without Raft state may
    /// vote. Without it, no state means lost state.
    pub bootstrap: bool,
    /// Where `<token> table …` admin commands go (the node's tables).
    pub table_admin: Option<TableAdmin>,
    /// Where `<token> kv …` admin commands go (the node's kv service);
    /// `clock` reaches it too, so its writes are stamped by the same
    /// skewed clock.
    pub kv_admin: Option<TableAdmin>,
}

enum Event {
    /// A message from the authenticated peer `from`.
    Peer {
        from: u64,
        msg: PeerMsg,
    },
    /// A client connection, registered with the dispatcher already;
    /// `stream` duplicates its socket, to shut it down.
    Accepted {
        conn: u64,
        stream: TcpStream,
    },
    Frame {
        conn: u64,
        payload: Vec<u8>,
    },
    FourLetter {
        conn: u64,
        word: [u8; 4],
    },
    /// A connection's reader ended, or its writer fell behind by
    /// [`CONN_QUEUE_MAX`] frames or gave up (too slow or gone: the
    /// connection is dropped, its session lives on).
    Closed {
        conn: u64,
    },
    Admin {
        line: String,
        reply: SyncSender<String>,
    },
    /// The sync thread synced the log through this number.
    LogSynced {
        number: u64,
        result: Result<(), String>,
    },
}

/// What the loop has for a client connection, in the order the server
/// made it: a frame, or the end (the writer sends what is queued, then
/// closes the socket).
#[derive(Debug, PartialEq)]
enum ToConn {
    Frame(u64, Vec<u8>),
    Close(u64),
}

/// Each connection's frame queue, by connection: filled by the
/// dispatcher, emptied by the connection's writer task. Both run on the
/// client I/O thread, so the lock is never contended.
type Writers = Arc<std::sync::Mutex<BTreeMap<u64, tokio::sync::mpsc::Sender<Vec<u8>>>>>;

/// Where the log's syncs ran, for the node's `stopped` line: rounds the
/// loop synced itself, and rounds of asks it handed to the sync thread,
/// those handed on while the server led also counted apart (a leader
/// hands on every round).
#[derive(Default)]
struct SyncCounts {
    on_loop: u64,
    handed_on: u64,
    handed_on_as_leader: u64,
}

/// The snapshot a worker thread is writing.
struct Writing {
    index: u64,
    term: u64,
    /// How long the step that copied the tree took.
    copy_ms: f64,
    /// The file's bytes and how long encoding and writing them took.
    done: Receiver<Result<(u64, f64), String>>,
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One JSON log line on stderr.
fn log(node: u64, event: &str, fields: serde_json::Value) {
    let mut m = serde_json::json!({"ts_ms": wall_ms(), "node": node, "event": event});
    if let (Some(o), serde_json::Value::Object(f)) = (m.as_object_mut(), fields) {
        o.extend(f);
    }
    eprintln!("{m}");
}

/// Prints the FATAL line and exits: a diverged replica must not serve.
fn fatal_digest(node: u64, m: &DigestMismatch) -> ! {
    let mut line = serde_json::json!({
        "level": "FATAL", "event": drift_keeper::NodeEvent::DigestMismatch.name(), "node": node,
    });
    if let (Some(o), serde_json::Value::Object(f)) = (line.as_object_mut(), m.log_fields()) {
        o.extend(f);
    }
    eprintln!("{line}");
    let _ = std::io::stderr().flush();
    std::process::exit(DIGEST_ABORT_EXIT);
}

/// Runs a node until SIGTERM/SIGINT. Errors are setup failures.
pub fn run(opts: NodeOptions) -> Result<(), NodeError> {
    let cfg = opts.config.clone();
    let me = cfg.peer(opts.id).ok_or(NodeError::UnknownId(opts.id))?.clone();
    let dir = cfg.node_dir(opts.id);
    let disk = FsDisk::open(&dir).map_err(|source| NodeError::Io {
        path: dir.clone(),
        source,
    })?;
    let started = Instant::now();
    let env = Env {
        now_us: 0,
        wall_ms: wall_ms(),
    };
    let server_cfg = cfg.server_config(opts.id, opts.bootstrap, opts.fault_token.clone());
    let (server, opened) = KeeperServer::open(server_cfg, disk, env).map_err(|e| match e {
        OpenError::UnknownId(id) => NodeError::UnknownId(id),
        OpenError::Store(e) => NodeError::Store(e),
        OpenError::Snapshot(e) => NodeError::Snapshot(e),
        OpenError::Raft(e) => NodeError::Raft(e),
        e @ OpenError::LostCommitted { .. } => NodeError::Damaged(e.to_string()),
    })?;
    let voters: Vec<u64> = cfg.peers.iter().map(|p| p.id).collect();

    let bind = |what: &'static str, addr: SocketAddr| {
        TcpListener::bind(addr).map_err(|source| NodeError::Bind { what, addr, source })
    };
    let raft_listener = bind("raft", me.raft)?;
    let client_listener = bind("client", me.client)?;
    let peers: Vec<(u64, SocketAddr)> = cfg
        .peers
        .iter()
        .map(|p| {
            let via = opts.peer_via.iter().find(|(id, _)| *id == p.id);
            (p.id, via.map_or(p.raft, |(_, a)| *a))
        })
        .collect();
    let identity = Identity {
        id: opts.id,
        ip: me.raft.ip(),
        secret: Arc::new(cfg.secret_bytes()),
    };
    let links = Links::start(&identity, &peers);

    let (tx, rx) = mpsc::channel::<Event>();
    let ptx = tx.clone();
    let node_id = opts.id;
    transport::listen(
        raft_listener,
        identity,
        voters,
        move |from, msg| ptx.send(Event::Peer { from, msg }).is_ok(),
        move |event, why| log(node_id, event, serde_json::json!({"why": why})),
    );
    let to_clients = client_io(
        client_listener,
        tx.clone(),
        Duration::from_millis(cfg.session_timeout_max_ms),
    )?;
    if let (Some(_), Some(addr)) = (&opts.fault_token, opts.admin) {
        // the loop answers: the hooks change its state
        let tx = std::sync::Mutex::new(tx.clone());
        admin_listener(
            addr,
            Arc::new(move |line| {
                let (rtx, rrx) = mpsc::sync_channel(1);
                let sent = tx.lock().map(|t| t.send(Event::Admin { line, reply: rtx }).is_ok());
                if !matches!(sent, Ok(true)) {
                    return "error the node is stopping".into();
                }
                rrx.recv_timeout(Duration::from_secs(5))
                    .unwrap_or_else(|_| "error timeout".into())
            }),
        )?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|source| NodeError::Runtime {
            what: "signal handler",
            source,
        })?;
    }

    let log_sync = match cfg.log_sync {
        crate::config::LogSync::Deferred => Some(log_syncer(dir.clone(), tx.clone())?),
        crate::config::LogSync::Inline => None,
    };
    let mut node = Driver {
        server,
        io: Io {
            id: opts.id,
            conns: BTreeMap::new(),
            to_clients,
            out: Vec::new(),
            to_peers: BTreeMap::new(),
            hold: false,
            links,
            dir,
            log_sync,
            sync_asks: Vec::new(),
            syncs: SyncCounts::default(),
            writing: None,
            began: Instant::now(),
        },
        started,
        tick: Duration::from_millis(cfg.tick_ms),
        table_admin: opts.table_admin,
        kv_admin: opts.kv_admin,
        parent: opts.exit_with_parent,
    };
    for e in opened {
        node.io.execute(e);
    }
    node.run(rx, &stop);
    let n = &node.io.syncs;
    log(
        node.io.id,
        "stopped",
        serde_json::json!({"log_syncs": {
            "on_loop": n.on_loop, "handed_on": n.handed_on, "handed_on_as_leader": n.handed_on_as_leader,
        }}),
    );
    Ok(())
}

/// The loop's state: the server, and what carries out its effects.
struct Driver {
    server: KeeperServer<FsDisk>,
    io: Io,
    started: Instant,
    tick: Duration,
    table_admin: Option<TableAdmin>,
    kv_admin: Option<TableAdmin>,
    /// The parent to outlive no longer than (see NodeOptions).
    parent: Option<u32>,
}

/// What the server's effects act on: connections, peer links, the
/// snapshot worker. Apart from the server, so effects run while the
/// server is still working (a leader's appends leave before its own
/// write to disk).
struct Io {
    id: u64,
    /// Open client connections: a duplicate of each socket, to shut it
    /// down.
    conns: BTreeMap<u64, TcpStream>,
    /// To the client I/O thread's dispatcher.
    to_clients: tokio::sync::mpsc::UnboundedSender<Vec<ToConn>>,
    /// What the server's effects since its last flush have for clients.
    out: Vec<ToConn>,
    /// And for each peer: frames, one after another.
    to_peers: BTreeMap<u64, Vec<u8>>,
    /// Flushes wait for the end of the batch of events being handled.
    hold: bool,
    links: Links,
    /// The data directory (the snapshot worker opens its own handle).
    dir: std::path::PathBuf,
    /// To the log's sync thread (with `log_sync = "deferred"`).
    log_sync: Option<Sender<(u64, String)>>,
    /// The server's asks for log syncs not yet handed on.
    sync_asks: Vec<(u64, String)>,
    syncs: SyncCounts,
    writing: Option<Writing>,
    /// When the current step began (a snapshot's copy of the tree is
    /// timed from it).
    began: Instant,
}

impl Driver {
    fn env(&self) -> Env {
        Env {
            now_us: self.started.elapsed().as_micros() as u64,
            wall_ms: wall_ms(),
        }
    }

    fn run(&mut self, rx: Receiver<Event>, stop: &AtomicBool) {
        let mut next_tick = Instant::now() + self.tick;
        // an event taken to see whether the loop is idle (see `syncs`)
        let mut taken: Option<Event> = None;
        while !stop.load(Ordering::Relaxed) {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let next = match taken.take() {
                Some(ev) => Ok(ev),
                None => rx.recv_timeout(wait),
            };
            match next {
                Ok(ev) => {
                    // what the events' steps make goes out once they are
                    // all handled, each destination's in one write (a
                    // forward per step was a write, and a wake-up of the
                    // leader's reader, per client request)
                    self.io.hold = true;
                    self.handle(ev);
                    // take what else is waiting, so one Ready (one fsync)
                    // carries many proposals
                    for _ in 0..EVENTS_PER_READY_MAX {
                        match rx.try_recv() {
                            Ok(ev) => self.handle(ev),
                            Err(_) => break,
                        }
                    }
                    self.io.hold = false;
                    self.io.send_out();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if Instant::now() >= next_tick {
                next_tick += self.tick;
                if self.parent.is_some_and(|p| p != std::os::unix::process::parent_id()) {
                    log(self.io.id, "parent_gone", serde_json::json!({}));
                    std::process::exit(0);
                }
                self.step(Input::Tick);
            }
            self.advance();
            self.poll_snapshot(false);
            self.io.send_out();
            self.syncs(&rx, &mut taken);
        }
    }

    /// Carries out the server's asks for log syncs. A leader hands them
    /// to the sync thread and goes on at once (see the module's comment).
    /// On a follower, while other events wait, the sync thread takes them
    /// and the loop goes on with the events; when none waits, the loop
    /// syncs itself (one round of the same sync, without the two thread
    /// hand-offs) and goes on with what the answer released. An event
    /// taken to look is kept in `taken`.
    fn syncs(&mut self, rx: &Receiver<Event>, taken: &mut Option<Event>) {
        for _ in 0..SYNC_ROUNDS_ON_LOOP_MAX {
            if self.io.sync_asks.is_empty() {
                return;
            }
            if self.server.is_leader() {
                return self.io.hand_syncs_on(true);
            }
            if taken.is_none() {
                *taken = rx.try_recv().ok();
            }
            if taken.is_some() {
                return self.io.hand_syncs_on(false);
            }
            // the newest ask's file: an older ask's other file was synced
            // as the log left it
            let (number, file) = self.io.sync_asks.pop().expect("an ask");
            self.io.sync_asks.clear();
            self.io.syncs.on_loop += 1;
            let result = drift_keeper::changelog::sync_left(self.server.disk_mut(), &file).map_err(|e| e.to_string());
            self.step(Input::LogSynced { number, result });
            self.advance();
            self.io.send_out();
        }
        // still asking: the thread takes the rest
        let leading = self.server.is_leader();
        self.io.hand_syncs_on(leading);
    }

    fn advance(&mut self) {
        let env = self.env();
        let io = &mut self.io;
        io.began = Instant::now();
        self.server.advance(env, &mut |e| io.execute(e));
    }

    fn step(&mut self, input: Input) {
        let env = self.env();
        let io = &mut self.io;
        io.began = Instant::now();
        self.server.step(env, input, &mut |e| io.execute(e));
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Peer { from, msg } => {
                if matches!(msg, PeerMsg::Snapshot(_)) {
                    // installing it writes snapshot files: the one being
                    // written finishes first
                    self.poll_snapshot(true);
                }
                self.step(Input::Peer { from, msg });
            }
            Event::Accepted { conn, stream } => {
                let peer = stream.peer_addr().ok();
                self.io.conns.insert(conn, stream);
                self.step(Input::Accepted { conn, peer });
            }
            Event::Frame { conn, payload } => self.step(Input::Frame { conn, payload }),
            Event::FourLetter { conn, word } => self.step(Input::FourLetter { conn, word }),
            Event::Closed { conn } => {
                self.io.close(conn);
                self.step(Input::Closed { conn });
            }
            Event::Admin { line, reply } => {
                let env = self.env();
                let io = &mut self.io;
                let answer = self.server.admin(env, &line, &mut |e| io.execute(e));
                let text = match answer {
                    AdminAnswer::Reply(text) => text,
                    AdminAnswer::ClockSet(v) => {
                        if let Some(kv) = &self.kv_admin {
                            kv(&format!("clock {v}"));
                        }
                        "ok".into()
                    }
                    AdminAnswer::Table(rest) => match &self.table_admin {
                        Some(f) => f(&rest),
                        None => "error this node has no tables".into(),
                    },
                    AdminAnswer::Kv(rest) => match &self.kv_admin {
                        Some(f) => f(&rest),
                        None => "error this node has no kv service".into(),
                    },
                };
                let _ = reply.send(text);
            }
            Event::LogSynced { number, result } => self.step(Input::LogSynced { number, result }),
        }
    }

    /// Hands the server the running snapshot's outcome if it is there (or,
    /// with `wait`, once it is).
    fn poll_snapshot(&mut self, wait: bool) {
        let Some(w) = &self.io.writing else { return };
        let outcome = if wait {
            w.done.recv().map_err(|_| mpsc::TryRecvError::Disconnected)
        } else {
            w.done.try_recv()
        };
        let (index, term, copy_ms) = (w.index, w.term, w.copy_ms);
        let (result, write_ms) = match outcome {
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => (Err("its thread ended without a result".to_string()), 0.0),
            Ok(Err(e)) => (Err(e), 0.0),
            Ok(Ok((size, ms))) => (Ok(size), ms),
        };
        self.io.writing = None;
        self.step(Input::SnapshotWritten {
            index,
            term,
            result,
            copy_ms,
            write_ms,
        });
    }
}

impl Io {
    /// Hands the asks for log syncs to the sync thread.
    fn hand_syncs_on(&mut self, leading: bool) {
        if self.sync_asks.is_empty() {
            return;
        }
        self.syncs.handed_on += 1;
        self.syncs.handed_on_as_leader += u64::from(leading);
        for ask in std::mem::take(&mut self.sync_asks) {
            let sent = self.log_sync.as_ref().is_some_and(|s| s.send(ask).is_ok());
            if !sent {
                // the server waits for an answer no one will give
                self.execute(Effect::Fatal {
                    reason: "the log's sync thread is not running".into(),
                });
            }
        }
    }

    /// Carries out one effect of the server.
    fn execute(&mut self, e: Effect) {
        match e {
            Effect::Peer { to, msg } => msg.encode_into(self.to_peers.entry(to).or_default()),
            Effect::Flush if self.hold => {}
            Effect::Flush => self.send_out(),
            Effect::Client { conn, frame } => {
                if self.conns.contains_key(&conn) {
                    self.out.push(ToConn::Frame(conn, frame));
                }
            }
            Effect::Close { conn } => self.close(conn),
            Effect::WriteSnapshot(job) => {
                let copy_ms = self.began.elapsed().as_secs_f64() * 1e3;
                self.write_snapshot(job, copy_ms)
            }
            // the loop decides where it runs once the step is done
            Effect::SyncLog { number, file, .. } => self.sync_asks.push((number, file)),
            Effect::Log { event, fields } => log(self.id, event, fields),
            Effect::Fatal { reason } => {
                log(
                    self.id,
                    "fatal",
                    serde_json::json!({"level": "FATAL", "reason": reason}),
                );
                std::process::exit(1);
            }
            Effect::DigestMismatch(m) => fatal_digest(self.id, &m),
        }
    }

    /// Ends a connection: its reader stops at once; its writer sends what
    /// is queued for it, then closes the socket.
    fn close(&mut self, conn: u64) {
        if let Some(stream) = self.conns.remove(&conn) {
            let _ = stream.shutdown(std::net::Shutdown::Read);
            self.out.push(ToConn::Close(conn));
        }
    }

    /// Sends what the server's effects since its last flush made: each
    /// peer's frames in one write, the clients' to their I/O thread in one
    /// hand-off (one wake-up of that thread, not one per frame).
    fn send_out(&mut self) {
        for (to, frames) in std::mem::take(&mut self.to_peers) {
            self.links.send_frames(to, frames);
        }
        if !self.out.is_empty() {
            // the thread only ends with the process
            let _ = self.to_clients.send(std::mem::take(&mut self.out));
        }
    }

    /// Encodes and writes a snapshot on a worker thread, so a large tree
    /// does not stall clients and heartbeats for the time that takes.
    fn write_snapshot(&mut self, job: SnapshotJob, copy_ms: f64) {
        let (index, term) = (job.meta.last_index, job.meta.last_term);
        let dir = self.dir.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        let spawned = thread::Builder::new().name("snapshot".into()).spawn(move || {
            let started = Instant::now();
            let written = FsDisk::open(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))
                .and_then(|mut disk| job.write(&mut disk));
            drop(job);
            let _ = tx.send(written.map(|bytes| (bytes, started.elapsed().as_secs_f64() * 1e3)));
        });
        if let Err(e) = spawned {
            log(
                self.id,
                "fatal",
                serde_json::json!({"level": "FATAL", "reason": format!("snapshot: cannot start its thread: {e}")}),
            );
            std::process::exit(1);
        }
        self.writing = Some(Writing {
            index,
            term,
            copy_ms,
            done: rx,
        });
    }
}

/// Starts the log's sync thread: it syncs the file the server asks it to
/// (on a handle of its own on the data directory), taking every request
/// that came while its last sync ran into one round, and answers the
/// round's newest number, which a sync of the newest file begun after
/// every write of the round covers.
fn log_syncer(dir: std::path::PathBuf, tx: Sender<Event>) -> Result<Sender<(u64, String)>, NodeError> {
    let mut disk = FsDisk::open(&dir).map_err(|source| NodeError::Io {
        path: dir.clone(),
        source,
    })?;
    let (asks, rx) = mpsc::channel::<(u64, String)>();
    thread::Builder::new()
        .name("log-sync".into())
        .spawn(move || {
            while let Ok(mut ask) = rx.recv() {
                // the round's newest ask: its file's sync covers the older
                // asks (a file the log left was synced as it left it)
                while let Ok(newer) = rx.try_recv() {
                    ask = newer;
                }
                let (number, file) = ask;
                let result = drift_keeper::changelog::sync_left(&mut disk, &file).map_err(|e| e.to_string());
                if tx.send(Event::LogSynced { number, result }).is_err() {
                    return;
                }
            }
        })
        .map_err(|source| NodeError::Runtime {
            what: "log sync thread",
            source,
        })?;
    Ok(asks)
}

/// Client connections. One thread runs every connection's reader and
/// writer as tasks on a single-threaded tokio runtime, so a burst of
/// requests over many connections costs that thread one wake-up instead of
/// two thread switches per request. The loop sends it each of the server's
/// batches of client frames in one send (the returned queue), which a dispatcher task
/// deals out to the connections' writers; it shuts a connection down
/// through a duplicate of its socket. A write that cannot finish within
/// `write_stall` (the longest session timeout: a client that takes no
/// bytes for that long is gone) ends its connection's writer, which frees
/// what was queued for it.
fn client_io(
    listener: TcpListener,
    tx: Sender<Event>,
    write_stall: Duration,
) -> Result<tokio::sync::mpsc::UnboundedSender<Vec<ToConn>>, NodeError> {
    let runtime = |what| move |source| NodeError::Runtime { what, source };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(runtime("client I/O runtime"))?;
    let listener = {
        let _in_runtime = rt.enter();
        listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
            .map_err(runtime("client listener"))?
    };
    let (to_clients, batches) = tokio::sync::mpsc::unbounded_channel();
    let writers = Writers::default();
    thread::Builder::new()
        .name("client-io".into())
        .spawn(move || {
            rt.spawn(dispatch(batches, writers.clone(), tx.clone()));
            rt.block_on(accept_clients(listener, tx, writers, write_stall))
        })
        .map_err(runtime("client I/O thread"))?;
    Ok(to_clients)
}

/// Deals each batch from the loop out to the connections' writers, in
/// order. A writer that is gone, or that fell [`CONN_QUEUE_MAX`] frames
/// behind, loses its queue, and the loop hears the connection closed.
async fn dispatch(mut batches: tokio::sync::mpsc::UnboundedReceiver<Vec<ToConn>>, writers: Writers, tx: Sender<Event>) {
    while let Some(batch) = batches.recv().await {
        let mut writers = writers.lock().unwrap_or_else(|e| e.into_inner());
        for item in batch {
            match item {
                ToConn::Frame(conn, frame) => {
                    let Some(w) = writers.get(&conn) else { continue };
                    if w.try_send(frame).is_err() {
                        writers.remove(&conn);
                        if tx.send(Event::Closed { conn }).is_err() {
                            return;
                        }
                    }
                }
                // dropping the queue: the writer sends what it holds,
                // then closes its side
                ToConn::Close(conn) => drop(writers.remove(&conn)),
            }
        }
    }
}

async fn accept_clients(listener: tokio::net::TcpListener, tx: Sender<Event>, writers: Writers, write_stall: Duration) {
    let mut next = 1u64;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // out of descriptors or the like: let it pass, then retry
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let conn = next;
        next += 1;
        let _ = stream.set_nodelay(true);
        let Some((stream, handle)) = stream
            .into_std()
            .and_then(|s| Ok((s.try_clone()?, s)))
            .ok()
            .and_then(|(s, handle)| Some((tokio::net::TcpStream::from_std(s).ok()?, handle)))
        else {
            continue;
        };
        let (reader, writer) = stream.into_split();
        let (wtx, wrx) = tokio::sync::mpsc::channel::<Vec<u8>>(CONN_QUEUE_MAX);
        // registered before the loop hears of it, so its first frame
        // finds its queue
        writers.lock().unwrap_or_else(|e| e.into_inner()).insert(conn, wtx);
        if tx.send(Event::Accepted { conn, stream: handle }).is_err() {
            return;
        }
        tokio::spawn(write_frames(writer, wrx, write_stall));
        tokio::spawn(read_frames(conn, reader, tx.clone()));
    }
}

/// Sends what the loop queued for one connection, everything queued at
/// the moment in one write; once the loop drops the queue, the rest is
/// flushed and the write side closed. A write stalled for `stall` ends
/// it: the queue goes (the loop's next send finds it closed and drops the
/// connection) and dropping the write half closes that side.
async fn write_frames(
    mut w: tokio::net::tcp::OwnedWriteHalf,
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    stall: Duration,
) {
    use tokio::io::AsyncWriteExt;
    while let Some(first) = rx.recv().await {
        let frames = transport::coalesce(first, || rx.try_recv().ok());
        match tokio::time::timeout(stall, w.write_all(&frames)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
    let _ = w.shutdown().await;
}

/// Reads one connection's frames and hands them to the loop: a
/// four-letter word instead of a first frame is answered and ends it; a
/// bad length, a short frame or the end of the stream closes it.
async fn read_frames(conn: u64, r: tokio::net::tcp::OwnedReadHalf, tx: Sender<Event>) {
    use tokio::io::AsyncReadExt;
    let mut r = tokio::io::BufReader::with_capacity(transport::READ_BUFFER_BYTES, r);
    let mut first = true;
    loop {
        let mut head = [0u8; 4];
        let ev = match r.read_exact(&mut head).await {
            Err(_) => Event::Closed { conn },
            Ok(_) if first && proto::FOUR_LETTER_WORDS.iter().any(|w| **w == head) => {
                Event::FourLetter { conn, word: head }
            }
            // a negative length reads as more than the most a frame holds
            Ok(_) => match transport::Body::new(u32::from_be_bytes(head), jute::FRAME_BYTES_MAX) {
                Ok(mut body) => match (&mut r).take(body.len as u64).read_to_end(&mut body.buf).await {
                    Ok(_) => body
                        .complete()
                        .map_or(Event::Closed { conn }, |payload| Event::Frame { conn, payload }),
                    Err(_) => Event::Closed { conn },
                },
                Err(_) => Event::Closed { conn },
            },
        };
        first = false;
        let more = matches!(ev, Event::Frame { .. });
        if tx.send(ev).is_err() || !more {
            return;
        }
    }
}

/// The fault hooks' endpoint: one thread per connection (at most
/// [`ADMIN_CONNS_MAX`]), each allowed [`ADMIN_READ_TIMEOUT`] to send one
/// command line, so an idle or slow connection delays no other.
/// The admin endpoint: a line protocol on `addr`, one command line per
/// connection, answered by `answer`. At most [`ADMIN_CONNS_MAX`]
/// connections at a time; a line must arrive within [`ADMIN_READ_TIMEOUT`].
pub fn admin_listener(addr: SocketAddr, answer: Arc<dyn Fn(String) -> String + Send + Sync>) -> Result<(), NodeError> {
    let l = TcpListener::bind(addr).map_err(|source| NodeError::Bind {
        what: "admin",
        addr,
        source,
    })?;
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    thread::Builder::new()
        .name("admin".into())
        .spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let Some(slot) = transport::Slot::take(&open, ADMIN_CONNS_MAX) else {
                    continue;
                };
                let answer = answer.clone();
                let _ = thread::Builder::new().name("admin-conn".into()).spawn(move || {
                    let _slot = slot;
                    admin_conn(s, &*answer);
                });
            }
        })
        .map_err(|source| NodeError::Runtime {
            what: "admin thread",
            source,
        })?;
    Ok(())
}

/// Reads one command line (until a newline, [`ADMIN_LINE_BYTES_MAX`]
/// bytes, the end of the stream, or the deadline), answers it, and writes
/// the answer back.
fn admin_conn(mut s: TcpStream, answer: &(dyn Fn(String) -> String + Send + Sync)) {
    let deadline = Instant::now() + ADMIN_READ_TIMEOUT;
    let mut line = Vec::new();
    let mut buf = [0u8; 128];
    while !line.contains(&b'\n') && line.len() < ADMIN_LINE_BYTES_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(_) => return,
        }
    }
    let line = String::from_utf8_lossy(&line).trim().to_string();
    let _ = s.write_all(format!("{}\n", answer(line)).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sync thread answers each round with the highest number asked,
    /// in order, treats a segment the log removed meanwhile as synced, and
    /// reports a failure with its number (the server then stops).
    #[test]
    fn the_log_sync_thread_answers_the_highest_number_asked_and_reports_failures() {
        let dir = std::env::temp_dir().join(format!("drift-log-sync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("changelog_1.bin"), b"entries").unwrap();
        let (tx, rx) = mpsc::channel();
        let asks = log_syncer(dir.clone(), tx).unwrap();
        let wait = Duration::from_secs(10);
        let answer = || match rx.recv_timeout(wait).unwrap() {
            Event::LogSynced { number, result } => (number, result),
            _ => panic!("only the sync thread sends here"),
        };
        for (n, file) in [
            (1, "changelog_1.bin"),
            (2, "changelog_1.bin"),
            (3, "changelog_gone.bin"),
        ] {
            asks.send((n, file.to_string())).unwrap();
        }
        let mut last = 0;
        while last < 3 {
            let (n, result) = answer();
            assert!(n > last, "answers in increasing numbers: {n} after {last}");
            assert_eq!(result, Ok(()));
            last = n;
        }
        asks.send((4, "../escape".to_string())).unwrap();
        let (n, result) = answer();
        assert_eq!(n, 4);
        let e = result.unwrap_err();
        assert!(e.contains("bad file name") && e.contains("../escape"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The server's effects wait for its flush (or, while the loop handles
    /// a batch of events, for the batch's end), then go out together: the
    /// clients' frames as one hand-off to their I/O thread, in order, and
    /// each peer's messages in one write.
    #[test]
    fn effects_go_out_at_the_servers_flush_each_destination_in_one_write() {
        let secret = Arc::new(vec![5u8; 32]);
        let me = |id| Identity {
            id,
            ip: "127.0.0.1".parse().unwrap(),
            secret: secret.clone(),
        };
        let peer = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer_addr = peer.local_addr().unwrap();
        let (ptx, prx) = mpsc::channel();
        transport::listen(
            peer,
            me(2),
            vec![1, 2],
            move |from, msg| ptx.send((from, msg)).is_ok(),
            |_, _| {},
        );
        let client = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(client.local_addr().unwrap()).unwrap();
        let (to_clients, mut batches) = tokio::sync::mpsc::unbounded_channel();
        let mut io = Io {
            id: 1,
            conns: BTreeMap::from([(7, stream)]),
            to_clients,
            out: Vec::new(),
            to_peers: BTreeMap::new(),
            hold: false,
            links: Links::start(&me(1), &[(1, peer_addr), (2, peer_addr)]),
            dir: std::env::temp_dir(),
            log_sync: None,
            sync_asks: Vec::new(),
            syncs: SyncCounts::default(),
            writing: None,
            began: Instant::now(),
        };
        let touch = |s| PeerMsg::Touch { sessions: vec![s] };
        let wait = Duration::from_secs(10);
        // the first message dials, through the link's writer
        io.execute(Effect::Peer { to: 2, msg: touch(0) });
        io.execute(Effect::Flush);
        assert_eq!(prx.recv_timeout(wait).unwrap(), (1, touch(0)));
        let deadline = Instant::now() + wait;
        while !io.links.direct_ready(2) {
            assert!(
                Instant::now() < deadline,
                "the link's writer did not hand over its connection"
            );
            thread::yield_now();
        }
        io.execute(Effect::Client {
            conn: 7,
            frame: b"one".to_vec(),
        });
        io.execute(Effect::Peer { to: 2, msg: touch(1) });
        io.execute(Effect::Client {
            conn: 7,
            frame: b"two".to_vec(),
        });
        io.execute(Effect::Peer { to: 2, msg: touch(2) });
        // a frame for a connection the loop does not hold is dropped
        io.execute(Effect::Client {
            conn: 8,
            frame: b"gone".to_vec(),
        });
        assert!(batches.try_recv().is_err(), "client frames went before the flush");
        assert_eq!(io.links.direct_sent(2), 0, "a peer message went before the flush");
        io.execute(Effect::Flush);
        assert_eq!(
            batches.try_recv().unwrap(),
            vec![ToConn::Frame(7, b"one".to_vec()), ToConn::Frame(7, b"two".to_vec())]
        );
        assert!(batches.try_recv().is_err());
        assert_eq!(io.links.direct_sent(2), 1, "the two messages went in one write");
        assert_eq!(prx.recv_timeout(wait).unwrap(), (1, touch(1)));
        assert_eq!(prx.recv_timeout(wait).unwrap(), (1, touch(2)));
        // a close goes after the frames made before it
        io.execute(Effect::Client {
            conn: 7,
            frame: b"last".to_vec(),
        });
        io.execute(Effect::Close { conn: 7 });
        io.execute(Effect::Client {
            conn: 7,
            frame: b"after".to_vec(),
        });
        io.execute(Effect::Flush);
        assert_eq!(
            batches.try_recv().unwrap(),
            vec![ToConn::Frame(7, b"last".to_vec()), ToConn::Close(7)]
        );
        // while the loop handles a batch of events, the steps' flushes
        // wait for its end: their frames go out together
        io.hold = true;
        for s in [3, 4] {
            io.execute(Effect::Peer { to: 2, msg: touch(s) });
            io.execute(Effect::Flush);
        }
        assert_eq!(
            io.links.direct_sent(2),
            1,
            "a step's flush sent while the loop held them"
        );
        io.hold = false;
        io.send_out();
        assert_eq!(io.links.direct_sent(2), 2, "the held messages went in one write");
        assert_eq!(prx.recv_timeout(wait).unwrap(), (1, touch(3)));
        assert_eq!(prx.recv_timeout(wait).unwrap(), (1, touch(4)));
    }
}
