//! One keeper server process: the driver of the sans-IO
//! [`KeeperServer`] (`drift_keeper::server`), which holds every protocol
//! decision — Raft, the digest checks, sessions, reads, snapshots. This
//! file turns sockets, ticks and signals into its inputs and carries out
//! its effects: frames to peers and clients, connections closed, snapshot
//! files written on a worker thread, JSON log lines, exits.
//!
//! One thread runs the server (the loop); sockets have their own threads
//! that only move bytes and hand events to the loop over a channel. The
//! loop hands the server every event that is waiting, then lets it
//! advance once, so one fsync carries many writes.

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
    /// Exit when the process that started this node goes away (a campaign
    /// killed mid-run must not leave its nodes running).
    pub exit_with_parent: bool,
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
    Accepted {
        conn: u64,
        tx: tokio::sync::mpsc::Sender<Vec<u8>>,
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
    Closed {
        conn: u64,
    },
    Admin {
        line: String,
        reply: SyncSender<String>,
    },
}

/// A client connection as the driver holds it.
struct Conn {
    /// Frames for the connection's writer task.
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    /// A duplicate of its socket, to shut it down.
    stream: TcpStream,
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
    client_io(
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

    let mut node = Driver {
        server,
        io: Io {
            id: opts.id,
            conns: BTreeMap::new(),
            links,
            dir,
            writing: None,
            gone: Vec::new(),
            began: Instant::now(),
        },
        started,
        tick: Duration::from_millis(cfg.tick_ms),
        table_admin: opts.table_admin,
        kv_admin: opts.kv_admin,
        parent: opts.exit_with_parent.then(std::os::unix::process::parent_id),
    };
    for e in opened {
        node.io.execute(e);
    }
    node.run(rx, &stop);
    log(node.io.id, "stopped", serde_json::json!({}));
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
    conns: BTreeMap<u64, Conn>,
    links: Links,
    /// The data directory (the snapshot worker opens its own handle).
    dir: std::path::PathBuf,
    writing: Option<Writing>,
    /// Connections dropped for being too slow, for the server to hear of.
    gone: Vec<u64>,
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
        while !stop.load(Ordering::Relaxed) {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(ev) => {
                    self.handle(ev);
                    // take what else is waiting, so one Ready (one fsync)
                    // carries many proposals
                    for _ in 0..EVENTS_PER_READY_MAX {
                        match rx.try_recv() {
                            Ok(ev) => self.handle(ev),
                            Err(_) => break,
                        }
                    }
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
            let env = self.env();
            let io = &mut self.io;
            io.began = Instant::now();
            self.server.advance(env, &mut |e| io.execute(e));
            self.closed_conns();
            self.poll_snapshot(false);
        }
    }

    fn step(&mut self, input: Input) {
        let env = self.env();
        let io = &mut self.io;
        io.began = Instant::now();
        self.server.step(env, input, &mut |e| io.execute(e));
        self.closed_conns();
    }

    /// Tells the server of the connections its effects found gone.
    fn closed_conns(&mut self) {
        while let Some(conn) = self.io.gone.pop() {
            self.step(Input::Closed { conn });
        }
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
            Event::Accepted { conn, tx, stream } => {
                let peer = stream.peer_addr().ok();
                self.io.conns.insert(conn, Conn { tx, stream });
                self.step(Input::Accepted { conn, peer });
            }
            Event::Frame { conn, payload } => self.step(Input::Frame { conn, payload }),
            Event::FourLetter { conn, word } => self.step(Input::FourLetter { conn, word }),
            Event::Closed { conn } => {
                self.io.conns.remove(&conn);
                self.step(Input::Closed { conn });
            }
            Event::Admin { line, reply } => {
                let env = self.env();
                let io = &mut self.io;
                let answer = self.server.admin(env, &line, &mut |e| io.execute(e));
                self.closed_conns();
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
    /// Carries out one effect of the server.
    fn execute(&mut self, e: Effect) {
        match e {
            Effect::Peer { to, msg } => self.links.send(to, &msg),
            Effect::Client { conn, frame } => {
                if let Some(c) = self.conns.get(&conn) {
                    if c.tx.try_send(frame).is_err() {
                        // too slow or gone: drop the connection, the
                        // session lives on
                        if let Some(c) = self.conns.remove(&conn) {
                            let _ = c.stream.shutdown(std::net::Shutdown::Read);
                        }
                        self.gone.push(conn);
                    }
                }
            }
            Effect::Close { conn } => {
                // its reader stops at once; its writer sends what is
                // queued, then closes the socket
                if let Some(c) = self.conns.remove(&conn) {
                    let _ = c.stream.shutdown(std::net::Shutdown::Read);
                }
            }
            Effect::WriteSnapshot(job) => {
                let copy_ms = self.began.elapsed().as_secs_f64() * 1e3;
                self.write_snapshot(job, copy_ms)
            }
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

/// Client connections. One thread runs every connection's reader and
/// writer as tasks on a single-threaded tokio runtime, so a burst of
/// requests over many connections costs that thread one wake-up instead of
/// two thread switches per request. The loop reaches a connection through
/// its frame queue and shuts it down through a duplicate of its socket.
/// A write that cannot finish within `write_stall` (the longest session
/// timeout: a client that takes no bytes for that long is gone) ends its
/// connection's writer, which frees what was queued for it.
fn client_io(listener: TcpListener, tx: Sender<Event>, write_stall: Duration) -> Result<(), NodeError> {
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
    thread::Builder::new()
        .name("client-io".into())
        .spawn(move || rt.block_on(accept_clients(listener, tx, write_stall)))
        .map_err(runtime("client I/O thread"))?;
    Ok(())
}

async fn accept_clients(listener: tokio::net::TcpListener, tx: Sender<Event>, write_stall: Duration) {
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
        if tx
            .send(Event::Accepted {
                conn,
                tx: wtx,
                stream: handle,
            })
            .is_err()
        {
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
