//! One keeper node: Raft (raft-rs) driving the keeper core, ZooKeeper
//! clients on the client port, peers on the Raft port.
//!
//! One thread owns all state (the loop); sockets have their own threads
//! that only move bytes and hand events to the loop over a channel.
//!
//! The digest protocol (ClickHouse Keeper's; docs/ARCHITECTURE.md, "The keeper"): the leader preprocesses a
//! write right before proposing it (one thread, so in log order) and puts
//! the tree digest after it into the entry; every replica compares its
//! digest after preprocess and after commit; a mismatch prints one FATAL
//! JSON line and exits with [`DIGEST_ABORT_EXIT`]. Followers preprocess
//! entries as they are persisted; a truncation by a new leader rolls the
//! uncommitted overlay back; a snapshot from the leader replaces tree,
//! overlay and digest together, its digest checked on load.
//!
//! Sessions: created and closed through the log; heartbeats reach the
//! server a client is connected to, which reports live sessions to the
//! leader; the leader alone decides expiry and proposes the close.
//!
//! What enters the log (see `drift_keeper::limit`): a client's write is
//! checked against the log decoder's limits on the server it reached and
//! answered `MarshallingError` when over one; the leader checks again
//! before it proposes anything, and admits a forwarded write only from
//! the authenticated peer that names itself as its origin and holds the
//! session (the last node to report it alive). Raft messages from peers
//! pass [`crate::peer_check`] before they are stepped, and a snapshot
//! must decode before raft sees it. A committed entry that still cannot
//! be applied (an older version's log, a bug) becomes the same no-op on
//! every replica, logged, with an error to its client: only a digest
//! mismatch stops a node.
//! Reads are served from the local tree once it has applied the session's
//! last seen zxid; with quorum reads, after a Raft read-index round.

use crate::config::ClusterConfig;
use crate::error::{NodeError, StoreError};
use crate::fsdisk::FsDisk;
use crate::raftlog::RaftLog;
use crate::transport::{self, Identity, Links, PeerMsg};
use drift_keeper::changelog;
use drift_keeper::entry::{check_digest, DigestMismatch, Entry as KEntry, Phase};
use drift_keeper::jute;
use drift_keeper::proto::{
    self, opcode, ClientRequest, ConnectRequest, ConnectResponse, Request, XID_PING, XID_SET_WATCHES,
};
use drift_keeper::session::SessionTracker;
use drift_keeper::snapshot::{self, SnapshotMeta, Snapshots};
use drift_keeper::watch::{EventType, WatchEvent, WatchKind, WatchManager};
use drift_keeper::{Create, Op, Read, Response, Storage, Write, ZkError};
use protobuf::Message as _;
use raft::prelude::{Entry, EntryType, Message};
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Exit code of a node that found its tree diverged from the leader's.
pub const DIGEST_ABORT_EXIT: i32 = 86;
/// Frames queued per client connection before it is dropped as too slow.
const CONN_QUEUE_MAX: usize = 8192;
/// How long a request may wait for its commit before the client is told
/// the connection was lost.
const PENDING_TIMEOUT: Duration = Duration::from_secs(30);
/// A read-index round unanswered this long was dropped by raft.
const READ_INDEX_TIMEOUT: Duration = Duration::from_secs(3);
/// Most events handled between two Raft Readies (bounds the latency one
/// Ready adds to the events queued behind it).
const EVENTS_PER_READY_MAX: usize = 512;
/// ZooKeeper's dynamic configuration node.
const CONFIG_NODE: &str = "/zookeeper/config";
/// Most containers / TTL nodes reaped per scan.
const REAP_PER_SCAN_MAX: usize = 64;
/// Admin connections served at a time; more are closed at once.
const ADMIN_CONNS_MAX: usize = 8;
/// An admin connection must send its command line within this.
const ADMIN_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest admin command line.
const ADMIN_LINE_BYTES_MAX: usize = 512;
/// What the `undecodable` fault hook proposes: an entry no replica can
/// decode (format byte 0 is no format).
const UNDECODABLE_ENTRY: &[u8] = b"\0undecodable entry (fault hook)";

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
    /// vote. Without it, no state means lost state (see `Node::quiet`).
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Handshake,
    Session(i64),
}

struct Conn {
    /// Frames for the connection's writer task.
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    /// A duplicate of its socket, to shut it down.
    stream: TcpStream,
    state: ConnState,
    last_zxid: i64,
    /// The client's address (for `stat` and `whoami`).
    peer: Option<SocketAddr>,
    /// Frames received from it and sent to it.
    received: u64,
    sent: u64,
}

/// Request latencies since the server started: from a request's arrival
/// to its reply (ZooKeeper's `Latency min/avg/max`).
#[derive(Default)]
struct Latency {
    count: u64,
    total_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

impl Latency {
    fn record(&mut self, since: Instant) {
        let ms = since.elapsed().as_secs_f64() * 1e3;
        self.min_ms = if self.count == 0 { ms } else { self.min_ms.min(ms) };
        self.max_ms = self.max_ms.max(ms);
        self.total_ms += ms;
        self.count += 1;
    }

    fn line(&self) -> String {
        let avg = if self.count == 0 {
            0.0
        } else {
            self.total_ms / self.count as f64
        };
        format!("Latency min/avg/max: {:.0}/{avg:.4}/{:.0}", self.min_ms, self.max_ms)
    }
}

enum PendingKind {
    Write { xid: i32, opcode: i32, multi: Vec<i32> },
    Connect,
    Close { xid: i32 },
}

struct Pending {
    conn: u64,
    kind: PendingKind,
    since: Instant,
    /// The leader that has the request: this node when it proposed it,
    /// else the one it was forwarded to (0: none yet).
    via: u64,
}

struct ParkedRead {
    conn: u64,
    xid: i32,
    opcode: i32,
    body: ClientRequest,
    /// Serve once this zxid (or, for quorum reads, this raft index) is applied.
    until_zxid: i64,
    until_index: u64,
    /// When it arrived (a read-index round that never answers times out).
    since: Instant,
}

struct Node {
    id: u64,
    cfg: ClusterConfig,
    raw: RawNode<RaftLog>,
    ks: Storage,
    links: Links,
    snaps: Snapshots,
    conns: BTreeMap<u64, Conn>,
    pending: BTreeMap<u64, Pending>,
    next_req: u64,
    /// Preprocessed, uncommitted entries, in log order.
    preprocessed: VecDeque<Preprocessed>,
    applied_index: u64,
    parked: Vec<ParkedRead>,
    /// Quorum reads waiting for their read-index round: ctx → read.
    read_index_wait: BTreeMap<u64, ParkedRead>,
    tracker: SessionTracker,
    closing: BTreeSet<i64>,
    alive: BTreeSet<i64>,
    watches: WatchManager,
    diverge_next: bool,
    clock_offset_ms: i64,
    fault_token: Option<String>,
    table_admin: Option<TableAdmin>,
    kv_admin: Option<TableAdmin>,
    started: Instant,
    ticks: u64,
    received: u64,
    sent: u64,
    latency: Latency,
    passwd_key: (u64, u64),
    /// The parent to outlive no longer than (see NodeOptions).
    parent: Option<u32>,
    /// Set while a node that lost its Raft state waits to hear from a
    /// leader (see `step`).
    quiet: bool,
    /// A commit index a leader announced that this node's log does not
    /// reach (its data dir was dropped after it had acknowledged those
    /// entries): until its log does, it neither votes nor campaigns, and
    /// it asks the leader for a snapshot (see `step`). 0: not behind.
    behind: u64,
    /// The tick of the last snapshot request, so they go out one per
    /// election timeout.
    behind_asked_tick: u64,
    /// The tick `behind` was set at: past [`BEHIND_TIMEOUTS`] election
    /// timeouts the node stops waiting (a heartbeat's commit is a peer's
    /// word, and a peer that lies must not silence a server for good).
    behind_since_tick: u64,
    /// The snapshot being written in the background, if any.
    snapshot_job: Option<SnapshotJob>,
    /// Peers whose Raft traffic this node drops (the `isolate` fault hook:
    /// a partition of the Raft links, both ways when set on both ends).
    isolated: BTreeSet<u64>,
    /// The cluster's node ids.
    voters: Vec<u64>,
    /// Leader: the servers that hold each session — those that reported
    /// it alive this term, and the one it was created through; a forwarded
    /// write is admitted only from one of them. A client moving between
    /// servers is briefly held by both, so this is a set, not one owner.
    /// Valid for the term it names: a new term starts it afresh (see
    /// [`Node::holders`]).
    ///
    /// Trust: a server learns a holder from the holder's own `Touch`,
    /// and only an authenticated peer can send one, so this stops writes
    /// forwarded by a server that never claimed the session (a stale or
    /// misrouted forward, a stranger). A peer holding the cluster secret
    /// is a member and could claim any session; the secret is the
    /// boundary (ARCHITECTURE.md, "The keeper: one entry, one digest").
    holders: (u64, BTreeMap<i64, BTreeSet<u64>>),
    /// Follower: sessions reported as held here to the leader and term it
    /// names (reported again before the first write forwarded to another).
    announced: ((u64, u64), BTreeSet<i64>),
    /// A snapshot from the leader, decoded and checked before raft was
    /// stepped with it: (index, term, tree, its metadata).
    incoming_snapshot: Option<(u64, u64, drift_keeper::state::State, SnapshotMeta)>,
}

fn now_ms(started: Instant) -> u64 {
    started.elapsed().as_millis() as u64
}

/// Election timeouts a server that is behind (see `fall_behind`) waits
/// for the entries it misses before it takes part in elections again.
const BEHIND_TIMEOUTS: u64 = 10;

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
    let line = serde_json::json!({
        "level": "FATAL", "event": "digest_mismatch", "node": node,
        "log_index": m.log_index, "phase": m.phase.to_string(), "request": m.request,
        "expected": format!("{:#018x}", m.expected.value), "actual": format!("{:#018x}", m.actual.value),
        "digest_version": m.expected.version,
    });
    eprintln!("{line}");
    let _ = std::io::stderr().flush();
    std::process::exit(DIGEST_ABORT_EXIT);
}

/// Runs a node until SIGTERM/SIGINT. Errors are setup failures.
pub fn run(opts: NodeOptions) -> Result<(), NodeError> {
    let cfg = opts.config.clone();
    let me = cfg.peer(opts.id).ok_or(NodeError::UnknownId(opts.id))?.clone();
    let dir = cfg.node_dir(opts.id);
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| NodeError::Io { path, source }
    };
    let mut disk = FsDisk::open(&dir).map_err(io(&dir))?;
    let snaps = Snapshots::new(snapshot::Config::default());
    snaps.clean_incomplete(&mut disk)?;
    let mode = cfg.digest_mode();
    let digest_on = mode != drift_keeper::DigestMode::Off;
    let (ks, snap) = match snaps.list(&disk)?.pop() {
        Some((index, term, name)) => {
            let bytes = drift_keeper::disk::Disk::read(&disk, &name).map_err(io(&dir.join(&name)))?;
            let (state, _meta) = snapshot::decode(&name, &bytes, digest_on)?;
            (
                Storage::from_state(state, mode == drift_keeper::DigestMode::Full),
                Some((index, term, bytes)),
            )
        }
        None => (Storage::new(mode), None),
    };
    let snapshot_index = snap.as_ref().map_or(0, |s| s.0);
    let voters: Vec<u64> = cfg.peers.iter().map(|p| p.id).collect();
    let log_cfg = changelog::Config {
        rotate_interval: cfg.rotate_interval,
        reserved_log_items: cfg.reserved_log_items,
        zstd_level: 1,
    };
    let (store, report, fresh) = RaftLog::open(disk, voters.clone(), log_cfg, snap)?;
    if let Some(t) = &report.torn_tail {
        log(
            opts.id,
            "changelog_torn_tail",
            serde_json::json!({"file": t.file, "offset": t.offset, "reason": t.reason}),
        );
    }
    // deterministic election timeouts, spread per node by the seed
    let mut h = siphasher::sip::SipHasher13::new_with_keys(cfg.seed, opts.id);
    std::hash::Hasher::write_u64(&mut h, opts.id);
    let jitter = (std::hash::Hasher::finish(&h) % cfg.election_ticks as u64) as usize;
    let election = cfg.election_ticks + jitter;
    let rc = raft::Config {
        id: opts.id,
        election_tick: election,
        heartbeat_tick: (cfg.election_ticks / 5).max(1),
        min_election_tick: election,
        max_election_tick: election + 1,
        applied: snapshot_index,
        check_quorum: true,
        pre_vote: true,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        ..raft::Config::default()
    };
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let raw = RawNode::new(&rc, store, &logger)?;

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
        voters.clone(),
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

    let mut node = Node {
        id: opts.id,
        passwd_key: (cfg.seed ^ 0x6472_6966_7421, 0x7061_7373_7764),
        isolated: BTreeSet::new(),
        voters,
        holders: (0, BTreeMap::new()),
        announced: ((0, 0), BTreeSet::new()),
        incoming_snapshot: None,
        snapshot_job: None,
        // a node without Raft state that is not part of a new cluster's
        // first start lost its state: it may have voted in a term it no
        // longer knows, so it stays quiet until a leader speaks
        quiet: fresh && !opts.bootstrap,
        behind: 0,
        behind_asked_tick: 0,
        behind_since_tick: 0,
        cfg,
        raw,
        ks,
        links,
        snaps,
        conns: BTreeMap::new(),
        pending: BTreeMap::new(),
        // request ids travel in log entries and outlive this process: each
        // incarnation starts past the last one's (milliseconds since the
        // epoch × 1000: ahead unless the last one issued more than a
        // thousand requests per millisecond it ran)
        next_req: wall_ms().max(1) as u64 * 1000,
        preprocessed: VecDeque::new(),
        applied_index: snapshot_index,
        parked: Vec::new(),
        read_index_wait: BTreeMap::new(),
        tracker: SessionTracker::new(),
        closing: BTreeSet::new(),
        alive: BTreeSet::new(),
        watches: WatchManager::new(),
        diverge_next: false,
        clock_offset_ms: 0,
        fault_token: opts.fault_token,
        table_admin: opts.table_admin,
        kv_admin: opts.kv_admin,
        parent: opts.exit_with_parent.then(std::os::unix::process::parent_id),
        started: Instant::now(),
        ticks: 0,
        received: 0,
        sent: 0,
        latency: Latency::default(),
    };
    node.catch_up_preprocess()?;
    log(
        node.id,
        "started",
        serde_json::json!({"applied_index": node.applied_index, "client": me.client.to_string()}),
    );
    node.run(rx, &stop);
    log(node.id, "stopped", serde_json::json!({}));
    Ok(())
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

fn context(origin: u64, req: u64) -> Vec<u8> {
    let mut c = origin.to_be_bytes().to_vec();
    c.extend_from_slice(&req.to_be_bytes());
    c
}

fn parse_context(c: &[u8]) -> (u64, u64) {
    if c.len() != 16 {
        return (0, 0);
    }
    (
        u64::from_be_bytes(c[..8].try_into().expect("8")),
        u64::from_be_bytes(c[8..].try_into().expect("8")),
    )
}

/// The same request, applied differently (the `diverge` fault): its own
/// effect, plus a node only this replica has, so the trees differ for good
/// (a later write cannot paper over it).
fn diverged(w: &Write) -> Write {
    let marker = Op::Create(Create {
        path: "/diverged-".into(),
        data: vec![],
        acl: drift_keeper::acl::Acl::open(),
        mode: drift_keeper::CreateMode::PersistentSequential,
        ttl_ms: 0,
    });
    match w {
        Write::Op(op) => Write::Multi(vec![op.clone(), marker]),
        _ => Write::Op(marker),
    }
}

/// The keys of `m` whose value arrived (`since`) longer than `age` ago.
fn older_than<V>(m: &BTreeMap<u64, V>, age: Duration, since: impl Fn(&V) -> Instant) -> Vec<u64> {
    m.iter()
        .filter(|(_, v)| since(v).elapsed() > age)
        .map(|(k, _)| *k)
        .collect()
}

/// A snapshot a worker thread is writing: its identity, and where the
/// file's bytes (or why there are none) arrive once it is durable.
struct SnapshotJob {
    index: u64,
    term: u64,
    /// How long the loop spent copying the tree.
    copy_ms: f64,
    /// The file's bytes and how long encoding and writing them took.
    done: Receiver<Result<(Vec<u8>, f64), String>>,
}

/// An entry this node preprocessed and has not committed yet.
#[derive(Clone, Copy)]
struct Preprocessed {
    index: u64,
    term: u64,
    /// The entry's zxid; for a skipped entry, the last zxid before it.
    zxid: i64,
    /// The digest the entry carries, checked again after commit.
    carried: drift_keeper::Digest,
    /// The entry cannot be applied (it does not decode, or its zxid is
    /// not after the last one): every replica finds the same and commits
    /// it as a no-op.
    skipped: bool,
}

impl Node {
    fn run(&mut self, rx: Receiver<Event>, stop: &AtomicBool) {
        let tick = Duration::from_millis(self.cfg.tick_ms);
        let mut next_tick = Instant::now() + tick;
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
                next_tick += tick;
                self.tick();
            }
            self.handle_ready();
            // a snapshot raft did not take (an older one) is not kept
            self.incoming_snapshot = None;
            self.finish_snapshot(false);
        }
    }

    fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    /// Leader: who holds which session, as learnt in this term (a new
    /// leader learns it afresh: the map of an earlier term is dropped).
    fn holders(&mut self) -> &mut BTreeMap<i64, BTreeSet<u64>> {
        let term = self.raw.raft.term;
        if self.holders.0 != term {
            self.holders = (term, BTreeMap::new());
        }
        &mut self.holders.1
    }

    /// Follower: the sessions the current leader heard are held here.
    fn announced(&mut self) -> &mut BTreeSet<i64> {
        let to = (self.leader(), self.raw.raft.term);
        if self.announced.0 != to {
            self.announced = (to, BTreeSet::new());
        }
        &mut self.announced.1
    }

    fn last_zxid(&self) -> i64 {
        self.ks.state().last_zxid()
    }

    fn passwd(&self, session: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        for salt in [1u64, 2] {
            let mut h = siphasher::sip::SipHasher24::new_with_keys(self.passwd_key.0, self.passwd_key.1 ^ salt);
            std::hash::Hasher::write_i64(&mut h, session);
            out.extend_from_slice(&std::hash::Hasher::finish(&h).to_be_bytes());
        }
        out
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Peer { from, msg } => self.on_peer(from, msg),
            Event::Accepted { conn, tx, stream } => {
                self.conns.insert(
                    conn,
                    Conn {
                        tx,
                        peer: stream.peer_addr().ok(),
                        stream,
                        state: ConnState::Handshake,
                        last_zxid: 0,
                        received: 0,
                        sent: 0,
                    },
                );
            }
            Event::Frame { conn, payload } => {
                self.received += 1;
                self.on_frame(conn, &payload);
            }
            Event::FourLetter { conn, word } => {
                let text = self.four_letter(&word);
                self.send_raw(conn, text.into_bytes());
                self.drop_conn(conn);
            }
            Event::Closed { conn } => {
                self.conns.remove(&conn);
            }
            Event::Admin { line, reply } => {
                let _ = reply.send(self.admin(&line));
            }
        }
    }

    fn send_raw(&mut self, conn: u64, frame: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        self.sent += 1;
        c.sent += 1;
        if c.tx.try_send(frame).is_err() {
            // too slow or gone: drop the connection, the session lives on
            self.drop_conn(conn);
        }
    }

    /// Ends a connection: its reader stops at once; its writer sends what
    /// is queued, then closes the socket.
    fn drop_conn(&mut self, conn: u64) {
        if let Some(c) = self.conns.remove(&conn) {
            let _ = c.stream.shutdown(std::net::Shutdown::Read);
        }
    }

    // ---------------------------------------------------------------- peers

    fn on_peer(&mut self, from: u64, m: PeerMsg) {
        match m {
            PeerMsg::Raft(bytes) => self.on_raft(from, &bytes, false),
            PeerMsg::Snapshot(bytes) => self.on_raft(from, &bytes, true),
            PeerMsg::Forward {
                origin,
                req,
                session,
                write,
            } => match self.admit_forward(from, origin, session, &write) {
                Ok(w) => self.propose(session, w, origin, req),
                Err(why) => {
                    log(
                        self.id,
                        "forward_refused",
                        serde_json::json!({"from": from, "session": session, "why": why}),
                    );
                    self.links.send(from, &PeerMsg::Refused { req });
                }
            },
            PeerMsg::Refused { req } => {
                // only the leader the request went to can refuse it
                if self.pending.get(&req).is_some_and(|p| p.via == from) {
                    self.fail_pending(req);
                }
            }
            PeerMsg::Touch { sessions } => {
                if self.is_leader() {
                    let now = now_ms(self.started);
                    for s in sessions {
                        self.tracker.heartbeat(s, now);
                        if self.ks.state().session(s).is_some() {
                            self.holders().entry(s).or_default().insert(from);
                        }
                    }
                }
            }
        }
    }

    /// A Raft message from peer `from`: stepped once it passed
    /// [`crate::peer_check`] (and, for a snapshot, once its tree decoded
    /// and matched what the message says it is); else dropped and logged.
    fn on_raft(&mut self, from: u64, bytes: &[u8], snapshot_frame: bool) {
        let checked = Message::parse_from_bytes(bytes)
            .map_err(|e| format!("not a raft message: {e}"))
            .and_then(|msg| {
                let is_snapshot = msg.msg_type == raft::prelude::MessageType::MsgSnapshot;
                if is_snapshot != snapshot_frame {
                    return Err(format!(
                        "{:?} in a {} frame",
                        msg.msg_type,
                        if snapshot_frame { "snapshot" } else { "raft" }
                    ));
                }
                crate::peer_check::check(&self.raw, &msg, from, &self.voters)?;
                if is_snapshot {
                    self.decode_incoming_snapshot(&msg)?;
                }
                Ok(msg)
            });
        match checked {
            Ok(msg) if !self.isolated.contains(&msg.from) => self.step(msg),
            Ok(_) => {}
            Err(why) => log(
                self.id,
                "peer_message_refused",
                serde_json::json!({"from": from, "why": why}),
            ),
        }
    }

    /// Decodes the tree a `MsgSnapshot` carries and keeps it for
    /// [`Node::install_snapshot`]: a snapshot that does not decode, or
    /// whose own metadata disagrees with the message's, never reaches raft.
    fn decode_incoming_snapshot(&mut self, msg: &Message) -> Result<(), String> {
        let meta = msg.get_snapshot().get_metadata();
        let name = snapshot::file_name(meta.index, meta.term);
        let digest_on = self.ks.mode() != drift_keeper::DigestMode::Off;
        let (state, kmeta) = snapshot::decode(&name, msg.get_snapshot().get_data(), digest_on)
            .map_err(|e| format!("snapshot does not decode: {e}"))?;
        if (kmeta.last_index, kmeta.last_term) != (meta.index, meta.term) {
            return Err(format!(
                "snapshot holds index {} term {}, the message says {} {}",
                kmeta.last_index, kmeta.last_term, meta.index, meta.term
            ));
        }
        self.incoming_snapshot = Some((meta.index, meta.term, state, kmeta));
        Ok(())
    }

    /// The write a peer forwarded, if the leader may propose it: it comes
    /// from the peer it names as its origin, decodes whole, is within the
    /// log's limits, and is a client's write under a session that peer
    /// holds (or opens a session).
    fn admit_forward(&self, from: u64, origin: u64, session: i64, bytes: &[u8]) -> Result<Write, String> {
        if origin != from {
            return Err(format!("origin {origin} on peer {from}'s connection"));
        }
        if !self.is_leader() {
            return Err("not the leader".into());
        }
        let mut r = drift_keeper::codec::Reader::new(bytes);
        let w = Write::decode(&mut r)
            .and_then(|w| r.finish().map(|()| w))
            .map_err(|e| format!("write does not decode: {e}"))?;
        drift_keeper::limit::check(&w).map_err(|e| e.to_string())?;
        match &w {
            Write::CreateSession { .. } if session == 0 => Ok(w),
            Write::CreateSession { .. } => Err("createSession under a session".into()),
            Write::Reap { .. } => Err("reap is the leader's own".into()),
            _ if self.holders.0 == self.raw.raft.term
                && self.holders.1.get(&session).is_some_and(|h| h.contains(&from)) =>
            {
                Ok(w)
            }
            _ => Err(format!("session {session:#x} is not held by node {from}")),
        }
    }

    /// Steps a Raft message, with two guards for a node whose data dir
    /// was dropped (Raft assumes durable state; this node lost its own):
    /// a leader's heartbeat may name a commit index past this node's now
    /// empty log, so the commit is clamped (lower is always safe) and the
    /// leader's probe then finds the gap and sends a snapshot; and until it
    /// has heard from a leader, the node casts no votes (it may have voted
    /// in this term before it lost its state).
    fn step(&mut self, mut msg: Message) {
        use raft::prelude::MessageType::*;
        if self.behind > 0 && matches!(msg.msg_type, MsgRequestVote | MsgRequestPreVote) {
            // a vote from a log missing committed entries could elect a
            // leader without them
            return;
        }
        if self.quiet {
            match msg.msg_type {
                MsgAppend | MsgHeartbeat | MsgSnapshot => {
                    self.quiet = false;
                    log(
                        self.id,
                        "rejoined",
                        serde_json::json!({"leader": msg.from, "term": msg.term}),
                    );
                }
                MsgRequestVote | MsgRequestPreVote => return,
                _ => {}
            }
        }
        if msg.msg_type == MsgHeartbeat {
            let last = self.raw.raft.raft_log.last_index();
            if msg.commit > last {
                self.fall_behind(msg.from, msg.term, msg.commit, last);
            }
            msg.commit = msg.commit.min(last);
        }
        let _ = self.raw.step(msg);
        if self.behind > 0 && self.raw.raft.raft_log.last_index() >= self.behind {
            log(
                self.id,
                "caught_up",
                serde_json::json!({"index": self.raw.raft.raft_log.last_index()}),
            );
            self.behind = 0;
        }
    }

    /// A leader's heartbeat names a commit past this node's log: its data
    /// dir was dropped after it acknowledged those entries, and the
    /// leader, which remembers them as replicated here, would send them
    /// only with its next entry — never, in an idle cluster. So the node
    /// asks for a snapshot as raft-rs's own snapshot request does: a
    /// rejected append at the leader's view of its match, carrying the
    /// index the snapshot must reach. Until its log reaches that commit it
    /// neither votes nor campaigns.
    fn fall_behind(&mut self, leader: u64, term: u64, commit: u64, last: u64) {
        if self.behind == 0 {
            self.behind_since_tick = self.ticks;
            log(
                self.id,
                "behind",
                serde_json::json!({"leader": leader, "commit": commit, "last_index": last}),
            );
        }
        self.behind = self.behind.max(commit);
        let every = self.cfg.election_ticks as u64;
        if self.behind_asked_tick != 0 && self.ticks < self.behind_asked_tick + every {
            return;
        }
        self.behind_asked_tick = self.ticks.max(1);
        let mut m = Message::default();
        m.set_msg_type(raft::prelude::MessageType::MsgAppendResponse);
        m.to = leader;
        m.from = self.id;
        m.term = term;
        m.index = commit;
        m.reject = true;
        m.reject_hint = last;
        m.log_term = self.raw.raft.raft_log.term(last).unwrap_or(0);
        m.request_snapshot = commit;
        self.send_messages(vec![m]);
    }

    fn send_messages(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let to = m.to;
            if self.isolated.contains(&to) {
                continue;
            }
            if let Ok(bytes) = m.write_to_bytes() {
                let snapshot = m.msg_type == raft::prelude::MessageType::MsgSnapshot;
                let frame = if snapshot {
                    PeerMsg::Snapshot(bytes)
                } else {
                    PeerMsg::Raft(bytes)
                };
                self.links.send(to, &frame);
                // a snapshot a peer asked for (see `fall_behind`) stays
                // asked for until reported sent: raft-rs would send it
                // again after every answer and never the entries after it
                let requested = self
                    .raw
                    .raft
                    .prs()
                    .get(to)
                    .is_some_and(|pr| pr.pending_request_snapshot != raft::INVALID_INDEX);
                if snapshot && requested {
                    self.raw.report_snapshot(to, raft::SnapshotStatus::Finish);
                }
            }
        }
    }

    // ---------------------------------------------------------------- writes

    /// Sends a write on its way: proposed here if leader, else forwarded.
    fn submit(&mut self, session: i64, w: Write, conn: u64, kind: PendingKind) {
        let req = self.next_req;
        self.next_req += 1;
        self.pending.insert(
            req,
            Pending {
                conn,
                kind,
                since: Instant::now(),
                via: self.leader(),
            },
        );
        if self.is_leader() {
            self.propose(session, w, self.id, req);
        } else if self.leader() != 0 {
            // the leader admits a forwarded write only from the session's
            // holder: say so first, on the same link (so in order)
            if session != 0 && self.announced().insert(session) {
                self.links.send(
                    self.leader(),
                    &PeerMsg::Touch {
                        sessions: vec![session],
                    },
                );
            }
            let mut wr = drift_keeper::codec::Writer::new();
            w.encode(&mut wr);
            self.links.send(
                self.leader(),
                &PeerMsg::Forward {
                    origin: self.id,
                    req,
                    session,
                    write: wr.buf,
                },
            );
        } else {
            self.fail_pending(req);
        }
    }

    /// Leader: preprocess and propose (under the one loop: log order).
    /// Nothing over the log's limits is proposed, whoever asked.
    fn propose(&mut self, session: i64, w: Write, origin: u64, req: u64) {
        if let Err(over) = drift_keeper::limit::check(&w) {
            log(
                self.id,
                "proposal_refused",
                serde_json::json!({"request": w.name(), "why": over.to_string()}),
            );
            self.refuse(origin, req);
            return;
        }
        let zxid = self.ks.last_preprocessed_zxid() + 1;
        let time_ms = wall_ms() + self.clock_offset_ms;
        let digest = self.ks.preprocess(session, zxid, time_ms, &w);
        let e = KEntry {
            zxid,
            time_ms,
            session,
            digest,
            request: w,
        };
        match self.raw.propose(context(origin, req), e.encode()) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                self.preprocessed.push_back(Preprocessed {
                    index,
                    term: self.raw.raft.term,
                    zxid,
                    carried: digest,
                    skipped: false,
                });
            }
            Err(_) => {
                self.ks.rollback_after(zxid - 1);
                if origin == 0 {
                    if let Write::CloseSession = e.request {
                        // an expiry raft refused: decide it again next tick
                        self.closing.remove(&session);
                    }
                }
                self.refuse(origin, req);
            }
        }
    }

    /// Tells whoever asked for request `req` that it was not proposed.
    fn refuse(&mut self, origin: u64, req: u64) {
        if origin == self.id {
            self.fail_pending(req);
        } else if origin != 0 {
            self.links.send(origin, &PeerMsg::Refused { req });
        }
    }

    /// A request whose fate this node cannot learn (no leader, refused,
    /// or the leader that had it is gone): the connection is dropped, as a
    /// ZooKeeper server drops its clients when it loses its leader. The
    /// client hears connection loss for everything in flight (the outcome
    /// is unknown) and reconnects with its session; a close is retried
    /// there, so an answered close always means a committed one.
    fn fail_pending(&mut self, req: u64) {
        if let Some(p) = self.pending.remove(&req) {
            self.drop_conn(p.conn);
        }
    }

    // ---------------------------------------------------------------- clients

    fn on_frame(&mut self, conn: u64, payload: &[u8]) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.received += 1;
        match c.state {
            ConnState::Handshake => match ConnectRequest::decode(payload) {
                Ok(req) => self.on_connect(conn, req),
                Err(_) => self.drop_conn(conn),
            },
            ConnState::Session(session) => match Request::decode(payload) {
                Ok(req) => {
                    self.alive.insert(session);
                    self.on_request(conn, session, req)
                }
                Err(e) => {
                    log(
                        self.id,
                        "bad_client_frame",
                        serde_json::json!({"conn": conn, "error": e.to_string()}),
                    );
                    self.drop_conn(conn)
                }
            },
        }
    }

    fn on_connect(&mut self, conn: u64, req: ConnectRequest) {
        if req.last_zxid_seen > self.last_zxid() {
            // this server is behind what the client saw: try another
            self.drop_conn(conn);
            return;
        }
        let timeout = (req.timeout_ms.max(0) as u64)
            .clamp(self.cfg.session_timeout_min_ms, self.cfg.session_timeout_max_ms) as i32;
        if req.session_id == 0 {
            self.submit(
                0,
                Write::CreateSession { timeout_ms: timeout },
                conn,
                PendingKind::Connect,
            );
            return;
        }
        let known = self.ks.state().session(req.session_id).map(|s| s.timeout_ms);
        match known {
            Some(t) if req.passwd == self.passwd(req.session_id) => {
                let resp = ConnectResponse::accepted(t, req.session_id, self.passwd(req.session_id));
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.state = ConnState::Session(req.session_id);
                    c.last_zxid = req.last_zxid_seen;
                }
                self.alive.insert(req.session_id);
                // the session is held here now: the leader hears it before
                // this node forwards a write under it
                self.announced().remove(&req.session_id);
                if self.is_leader() {
                    let me = self.id;
                    self.holders().entry(req.session_id).or_default().insert(me);
                }
                self.send_raw(conn, resp.encode());
            }
            // a follower may not have applied the session yet: only the
            // leader says a session is gone; here the client tries another
            None if !self.is_leader() => self.drop_conn(conn),
            _ => {
                self.send_raw(conn, ConnectResponse::expired().encode());
                self.drop_conn(conn);
            }
        }
    }

    fn on_request(&mut self, conn: u64, session: i64, req: Request) {
        let zxid = self.last_zxid();
        match req.body {
            ClientRequest::Ping => self.send_raw(conn, proto::encode_error(XID_PING, zxid, ZkError::Ok)),
            ClientRequest::Write(Write::CloseSession) => {
                self.submit(session, Write::CloseSession, conn, PendingKind::Close { xid: req.xid })
            }
            ClientRequest::Write(w) => {
                // an auth is answered under the xid it came with, as
                // ZooKeeper does: kazoo sends -4, other clients their own
                // counter (and match the answer by it)
                let xid = req.xid;
                if let Err(over) = drift_keeper::limit::check(&w) {
                    // as ZooKeeper answers a field over jute.maxbuffer
                    log(
                        self.id,
                        "request_refused",
                        serde_json::json!({"session": session, "request": w.name(), "why": over.to_string()}),
                    );
                    self.send_raw(conn, proto::encode_error(xid, zxid, ZkError::MarshallingError));
                    return;
                }
                self.submit(
                    session,
                    w,
                    conn,
                    PendingKind::Write {
                        xid,
                        opcode: req.opcode,
                        multi: req.multi_opcodes,
                    },
                )
            }
            body @ (ClientRequest::Read(_) | ClientRequest::MultiRead(_) | ClientRequest::GetEphemerals { .. }) => {
                let last = self.conns.get(&conn).map_or(0, |c| c.last_zxid);
                let mut read = ParkedRead {
                    conn,
                    xid: req.xid,
                    opcode: req.opcode,
                    body,
                    until_zxid: last,
                    until_index: 0,
                    since: Instant::now(),
                };
                if self.cfg.quorum_reads {
                    let ctx = self.next_req;
                    self.next_req += 1;
                    self.raw.read_index(ctx.to_be_bytes().to_vec());
                    read.until_index = u64::MAX;
                    self.read_index_wait.insert(ctx, read);
                } else if last <= zxid {
                    self.serve(session, read);
                } else {
                    self.parked.push(read);
                }
            }
            ClientRequest::SetWatches {
                relative_zxid,
                data,
                exist,
                child,
                persistent,
                persistent_recursive,
            } => {
                self.set_watches(session, relative_zxid, data, exist, child);
                // persistent watches come back as they were: they fire for
                // what happens from now on
                for (paths, kind) in [
                    (persistent, WatchKind::Persistent),
                    (persistent_recursive, WatchKind::PersistentRecursive),
                ] {
                    for p in paths {
                        self.watches.register(session, &p, kind);
                    }
                }
                self.send_raw(conn, proto::encode_error(XID_SET_WATCHES, zxid, ZkError::Ok));
            }
            ClientRequest::AddWatch { path, recursive } => {
                let err = if drift_keeper::path::validate(&path).is_err() {
                    ZkError::BadArguments
                } else {
                    let kind = if recursive {
                        WatchKind::PersistentRecursive
                    } else {
                        WatchKind::Persistent
                    };
                    if self.watches.register(session, &path, kind) {
                        ZkError::Ok
                    } else {
                        ZkError::BadArguments
                    }
                };
                self.send_raw(conn, proto::encode_error_response(req.xid, zxid, err));
            }
            ClientRequest::WhoAmI => {
                let users = self.who_am_i(conn, session);
                self.send_raw(conn, proto::encode_who_am_i(req.xid, zxid, &users));
            }
            ClientRequest::Unsupported => {
                self.send_raw(conn, proto::encode_error(req.xid, zxid, ZkError::Unimplemented))
            }
        }
    }

    /// Who `session` on `conn` is, as whoAmI answers: the client's address
    /// (ZooKeeper's implicit `ip` identity), then each identity it added.
    fn who_am_i(&self, conn: u64, session: i64) -> Vec<(String, String)> {
        let mut users = Vec::new();
        if let Some(ip) = self.conns.get(&conn).and_then(|c| c.peer).map(|a| a.ip()) {
            users.push(("ip".to_string(), ip.to_string()));
        }
        for id in self.ks.state().session(session).map_or(&[][..], |s| &s.auth) {
            // a digest id is `user:hash`; the user is what whoAmI names
            let user = match id.scheme.as_str() {
                "digest" => id.id.split(':').next().unwrap_or("").to_string(),
                _ => id.id.clone(),
            };
            users.push((id.scheme.clone(), user));
        }
        users
    }

    /// `/zookeeper/config`, ZooKeeper's dynamic configuration node, read
    /// as a client reads it: every server, its peer and client addresses.
    /// It lives outside the replicated tree (it is what the cluster file
    /// says, the same on every server), so it changes no digest.
    fn config_node(&self) -> Vec<u8> {
        let mut text = String::new();
        for p in &self.cfg.peers {
            text.push_str(&format!(
                "server.{}={}:{}:{}:participant;{}\n",
                p.id,
                p.raft.ip(),
                p.raft.port(),
                p.raft.port(),
                p.client
            ));
        }
        text.push_str("version=0");
        text.into_bytes()
    }

    /// A read of the config node, or `/zookeeper`'s children (which list
    /// it); `None` for any other read.
    fn read_config(&self, session: i64, read: &Read) -> Option<Response> {
        let config_stat = || drift_keeper::node::Stat {
            data_length: self.config_node().len() as i32,
            ..Default::default()
        };
        match read {
            Read::GetData { path } if path == CONFIG_NODE => Some(Response::GetData {
                data: self.config_node(),
                stat: config_stat(),
            }),
            Read::Exists { path } if path == CONFIG_NODE => Some(Response::Exists { stat: config_stat() }),
            Read::GetAcl { path } if path == CONFIG_NODE => Some(Response::GetAcl {
                acl: drift_keeper::acl::Acl::open(),
                stat: config_stat(),
            }),
            Read::GetChildren { path } if path == "/zookeeper" => match self.ks.read(session, read) {
                Response::GetChildren { mut children, mut stat } => {
                    children.push("config".to_string());
                    children.sort();
                    stat.num_children += 1;
                    Some(Response::GetChildren { children, stat })
                }
                other => Some(other),
            },
            _ => None,
        }
    }

    fn serve(&mut self, session: i64, r: ParkedRead) {
        let zxid = self.last_zxid();
        self.latency.record(r.since);
        let frame = match &r.body {
            ClientRequest::GetEphemerals { prefix } => {
                let ephemerals: Vec<String> = self
                    .ks
                    .state()
                    .ephemerals_of(session)
                    .filter(|p| p.starts_with(prefix.as_str()))
                    .map(str::to_string)
                    .collect();
                proto::encode_strings_reply(r.xid, zxid, &ephemerals)
            }
            ClientRequest::Read(wr) => {
                let resp = self
                    .read_config(session, &wr.read)
                    .unwrap_or_else(|| self.ks.read(session, &wr.read));
                if wr.watch {
                    let (path, kind) = match &wr.read {
                        Read::GetChildren { path } => (path, WatchKind::Child),
                        Read::GetData { path } | Read::Exists { path } | Read::GetAcl { path } => {
                            (path, WatchKind::Data)
                        }
                    };
                    let register = match resp.error() {
                        ZkError::Ok => true,
                        ZkError::NoNode => matches!(wr.read, Read::Exists { .. }),
                        _ => false,
                    };
                    if register {
                        self.watches.register(session, path, kind);
                    }
                }
                proto::encode_reply(r.xid, zxid, r.opcode, &resp)
            }
            ClientRequest::MultiRead(reads) => {
                let answers: Vec<(Read, Response)> = reads
                    .iter()
                    .map(|x| {
                        let resp = self.read_config(session, x).unwrap_or_else(|| self.ks.read(session, x));
                        (x.clone(), resp)
                    })
                    .collect();
                proto::encode_multi_read(r.xid, zxid, &answers)
            }
            _ => return,
        };
        self.send_raw(r.conn, frame);
    }

    fn serve_parked(&mut self) {
        let zxid = self.last_zxid();
        let applied = self.applied_index;
        let ready: Vec<ParkedRead> = {
            let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.parked)
                .into_iter()
                .partition(|r| r.until_zxid <= zxid && r.until_index <= applied);
            self.parked = later;
            now
        };
        for r in ready {
            let session = match self.conns.get(&r.conn).map(|c| c.state) {
                Some(ConnState::Session(s)) => s,
                _ => continue,
            };
            self.serve(session, r);
        }
    }

    fn set_watches(&mut self, session: i64, rel: i64, data: Vec<String>, exist: Vec<String>, child: Vec<String>) {
        let mut fire = Vec::new();
        // a data or child watch fires at once if its node changed (or went)
        // since the zxid the client last saw; else it is registered
        type Changed = fn(&drift_keeper::node::Stat) -> i64;
        let kinds: [(Vec<String>, Changed, EventType, WatchKind); 2] = [
            (data, |s| s.mzxid, EventType::NodeDataChanged, WatchKind::Data),
            (child, |s| s.pzxid, EventType::NodeChildrenChanged, WatchKind::Child),
        ];
        for (paths, changed, event, kind) in kinds {
            for p in paths {
                match self.ks.state().get(&p) {
                    None => fire.push(WatchEvent {
                        kind: EventType::NodeDeleted,
                        path: p,
                    }),
                    Some(n) if changed(&n.stat) > rel => fire.push(WatchEvent { kind: event, path: p }),
                    Some(_) => {
                        self.watches.register(session, &p, kind);
                    }
                }
            }
        }
        for p in exist {
            if self.ks.state().get(&p).is_some() {
                fire.push(WatchEvent {
                    kind: EventType::NodeCreated,
                    path: p,
                });
            } else {
                self.watches.register(session, &p, WatchKind::Data);
            }
        }
        let zxid = self.last_zxid();
        for e in fire {
            self.deliver(session, zxid, &e);
        }
    }

    fn deliver(&mut self, session: i64, zxid: i64, e: &WatchEvent) {
        let conns: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == ConnState::Session(session))
            .map(|(id, _)| *id)
            .collect();
        for c in conns {
            self.send_raw(c, proto::encode_watch_event(zxid, e));
        }
    }

    // ---------------------------------------------------------------- raft

    fn tick(&mut self) {
        self.ticks += 1;
        if self.parent.is_some_and(|p| p != std::os::unix::process::parent_id()) {
            log(self.id, "parent_gone", serde_json::json!({}));
            std::process::exit(0);
        }
        if self.behind > 0 && self.ticks - self.behind_since_tick > BEHIND_TIMEOUTS * self.cfg.election_ticks as u64 {
            log(
                self.id,
                "behind_given_up",
                serde_json::json!({"level": "WARN", "commit": self.behind,
                    "last_index": self.raw.raft.raft_log.last_index()}),
            );
            self.behind = 0;
        }
        // a quiet node neither campaigns nor votes until a leader speaks,
        // nor one whose log misses committed entries until it has them
        if !self.quiet && self.behind == 0 {
            self.raw.tick();
        }
        let now = now_ms(self.started);
        // sessions seen alive here reach the leader's tracker
        if self.ticks.is_multiple_of(2) && !self.alive.is_empty() {
            let alive: Vec<i64> = std::mem::take(&mut self.alive).into_iter().collect();
            if self.is_leader() {
                for s in alive {
                    if self.tracker.heartbeat(s, now) {
                        let me = self.id;
                        self.holders().entry(s).or_default().insert(me);
                    }
                }
            } else if self.leader() != 0 {
                self.links.send(self.leader(), &PeerMsg::Touch { sessions: alive });
            }
        }
        if self.is_leader() {
            for s in self.tracker.expired(now) {
                if self.closing.insert(s) {
                    log(self.id, "session_expired", serde_json::json!({"session": s}));
                    self.propose(s, Write::CloseSession, 0, 0);
                }
            }
            if self.ticks.is_multiple_of((2000 / self.cfg.tick_ms).max(1)) {
                self.reap();
            }
        }
        // read-index rounds raft dropped (no leader, or one that has not
        // committed in its term yet) never answer: the client reconnects
        for ctx in older_than(&self.read_index_wait, READ_INDEX_TIMEOUT, |r| r.since) {
            if let Some(r) = self.read_index_wait.remove(&ctx) {
                self.drop_conn(r.conn);
            }
        }
        // requests waiting too long: tell the client
        for r in older_than(&self.pending, PENDING_TIMEOUT, |p| p.since) {
            self.fail_pending(r);
        }
    }

    /// Leader: propose the deletion of empty containers and expired TTL
    /// nodes (the entry re-checks, at its own time, that they still are).
    fn reap(&mut self) {
        let now = wall_ms() + self.clock_offset_ms;
        let doomed: Vec<String> = self
            .ks
            .state()
            .nodes()
            .filter(|(_, n)| {
                n.stat.num_children == 0
                    && match n.kind() {
                        drift_keeper::node::Kind::Container => n.stat.cversion > 0,
                        drift_keeper::node::Kind::Ttl { ttl_ms } => now.saturating_sub(n.stat.mtime) > ttl_ms,
                        _ => false,
                    }
            })
            .map(|(p, _)| p.to_string())
            .take(REAP_PER_SCAN_MAX)
            .collect();
        for path in doomed {
            self.propose(0, Write::Reap { path }, 0, 0);
        }
    }

    fn handle_ready(&mut self) {
        if !self.raw.has_ready() {
            return;
        }
        let mut rd = self.raw.ready();
        if let Some(ss) = rd.ss() {
            self.on_role(ss.raft_state, ss.leader_id);
        }
        self.send_messages(rd.take_messages());
        if !rd.snapshot().is_empty() {
            let s = rd.snapshot().clone();
            self.install_snapshot(&s);
        }
        let committed = rd.take_committed_entries();
        self.apply(committed);
        let entries = rd.take_entries();
        self.preprocess_appended(&entries);
        if let Err(e) = self.raw.mut_store().append(&entries) {
            self.die(&format!("changelog append: {e}"));
        }
        if let Some(hs) = rd.hs() {
            let hs = hs.clone();
            if let Err(e) = self.raw.mut_store().set_hard_state(hs) {
                self.die(&format!("hard state: {e}"));
            }
        }
        let persisted = rd.take_persisted_messages();
        self.send_messages(persisted);
        for rs in rd.take_read_states() {
            let ctx = u64::from_be_bytes(
                rs.request_ctx
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0; 8]),
            );
            if let Some(mut r) = self.read_index_wait.remove(&ctx) {
                r.until_index = rs.index;
                self.parked.push(r);
            }
        }
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            let mut hs = self.raw.store().hard_state().clone();
            hs.commit = commit;
            if let Err(e) = self.raw.mut_store().set_hard_state(hs) {
                self.die(&format!("hard state: {e}"));
            }
        }
        self.send_messages(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed);
        self.raw.advance_apply();
        self.maybe_snapshot();
        self.serve_parked();
    }

    fn die(&self, why: &str) -> ! {
        log(self.id, "fatal", serde_json::json!({"level": "FATAL", "reason": why}));
        std::process::exit(1);
    }

    fn on_role(&mut self, role: StateRole, leader: u64) {
        log(
            self.id,
            "role",
            serde_json::json!({"role": format!("{role:?}"), "leader": leader, "term": self.raw.raft.term}),
        );
        // requests the old leader had may commit or vanish: their clients
        // hear connection loss now (the outcome is unknown) rather than
        // wait out PENDING_TIMEOUT while their sessions stay alive
        let orphaned: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.via != 0 && p.via != leader)
            .map(|(r, _)| *r)
            .collect();
        for r in orphaned {
            self.fail_pending(r);
        }
        // read-index rounds in flight are lost with the old leader
        for (_, r) in std::mem::take(&mut self.read_index_wait) {
            self.drop_conn(r.conn);
        }
        if role == StateRole::Leader {
            // every known session gets a fresh deadline under this leader
            let now = now_ms(self.started);
            self.tracker = SessionTracker::new();
            self.closing.clear();
            let sessions: Vec<(i64, i32)> = self
                .ks
                .state()
                .sessions()
                .iter()
                .map(|(id, s)| (*id, s.timeout_ms))
                .collect();
            for (id, t) in sessions {
                self.tracker.touch(id, t as u64, now);
            }
        }
    }

    /// Preprocesses entries being persisted; a conflicting suffix (a new
    /// leader overwrote it) rolls the overlay back first.
    fn preprocess_appended(&mut self, entries: &[Entry]) {
        for e in entries {
            if let Some(pos) = self.preprocessed.iter().position(|p| p.index >= e.index) {
                let p = self.preprocessed[pos];
                if p.index == e.index && p.term == e.term {
                    continue;
                }
                let keep = if pos == 0 {
                    self.last_zxid()
                } else {
                    self.preprocessed[pos - 1].zxid
                };
                self.ks.rollback_after(keep);
                self.preprocessed.truncate(pos);
            }
            if e.entry_type != EntryType::EntryNormal || e.data.is_empty() {
                continue;
            }
            self.preprocess_entry(e);
        }
    }

    fn preprocess_entry(&mut self, e: &Entry) -> Preprocessed {
        let ke = match self.entry_to_apply(e) {
            Ok(ke) => ke,
            Err(why) => {
                log(
                    self.id,
                    "entry_unusable",
                    serde_json::json!({"level": "ERROR", "log_index": e.index, "why": why}),
                );
                let p = Preprocessed {
                    index: e.index,
                    term: e.term,
                    zxid: self.ks.last_preprocessed_zxid(),
                    carried: drift_keeper::Digest::NONE,
                    skipped: true,
                };
                self.preprocessed.push_back(p);
                return p;
            }
        };
        let diverged = std::mem::take(&mut self.diverge_next).then(|| {
            log(self.id, "diverge_applied", serde_json::json!({"log_index": e.index}));
            diverged(&ke.request)
        });
        let request = diverged.as_ref().unwrap_or(&ke.request);
        let d = self.ks.preprocess(ke.session, ke.zxid, ke.time_ms, request);
        if let Err(m) = check_digest(e.index, Phase::Preprocess, &ke, d) {
            fatal_digest(self.id, &m);
        }
        let p = Preprocessed {
            index: e.index,
            term: e.term,
            zxid: ke.zxid,
            carried: ke.digest,
            skipped: false,
        };
        self.preprocessed.push_back(p);
        p
    }

    /// The entry `e` carries, if it can be applied: it decodes, and its
    /// zxid follows the last one preprocessed. What decides this is the
    /// entry and the log before it, so every replica decides the same.
    fn entry_to_apply(&self, e: &Entry) -> Result<KEntry, String> {
        let ke = KEntry::decode(&e.data).map_err(|err| format!("does not decode: {err}"))?;
        let last = self.ks.last_preprocessed_zxid();
        if ke.zxid <= last {
            return Err(format!("zxid {:#x} is not after {last:#x}", ke.zxid));
        }
        Ok(ke)
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for e in entries {
            if e.index <= self.applied_index {
                continue;
            }
            if e.entry_type == EntryType::EntryNormal && !e.data.is_empty() {
                // preprocessed already, unless replayed after a restart
                while self.preprocessed.front().is_some_and(|p| p.index < e.index) {
                    self.preprocessed.pop_front();
                }
                let p = match self.preprocessed.front() {
                    Some(&p) if p.index == e.index && p.term == e.term => p,
                    _ => {
                        self.preprocessed.clear();
                        self.ks.rollback_after(self.last_zxid());
                        self.preprocess_entry(&e)
                    }
                };
                self.preprocessed.pop_front();
                let (origin, req) = parse_context(&e.context);
                if p.skipped {
                    log(
                        self.id,
                        "entry_skipped",
                        serde_json::json!({"level": "ERROR", "log_index": e.index, "zxid": p.zxid}),
                    );
                    self.on_skipped(origin, req);
                } else {
                    let c = self.ks.commit(p.zxid);
                    if p.carried.mismatches(c.digest) {
                        // decoded again only to describe the request
                        if let Ok(ke) = KEntry::decode(&e.data) {
                            if let Err(m) = check_digest(e.index, Phase::Commit, &ke, c.digest) {
                                fatal_digest(self.id, &m);
                            }
                        }
                    }
                    self.on_committed(origin, req, c);
                }
            }
            self.applied_index = e.index;
        }
    }

    /// A committed entry that could not be applied: its client, if it is
    /// here, hears `MarshallingError` (or loses the connection for a
    /// session's open or close), as for a request over a limit.
    fn on_skipped(&mut self, origin: u64, req: u64) {
        if origin != self.id {
            return;
        }
        match self.pending.remove(&req) {
            Some(Pending {
                conn,
                kind: PendingKind::Write { xid, .. },
                ..
            }) => {
                let zxid = self.last_zxid();
                self.send_raw(conn, proto::encode_error(xid, zxid, ZkError::MarshallingError));
            }
            Some(p) => self.drop_conn(p.conn),
            None => {}
        }
    }

    fn on_committed(&mut self, origin: u64, req: u64, c: drift_keeper::Committed) {
        for (session, event) in self.watches.trigger(&c.events) {
            self.deliver(session, c.zxid, &event);
        }
        let mine = if origin == self.id {
            self.pending.remove(&req)
        } else {
            None
        };
        if let Some(p) = &mine {
            self.latency.record(p.since);
        }
        match &c.response {
            Response::CreateSession { session_id } => {
                let timeout = self.ks.state().session(*session_id).map_or(0, |s| s.timeout_ms);
                if self.is_leader() {
                    self.tracker.touch(*session_id, timeout as u64, now_ms(self.started));
                    if origin != 0 {
                        self.holders().entry(*session_id).or_default().insert(origin);
                    }
                }
                if let Some(p) = mine {
                    let resp = ConnectResponse::accepted(timeout, *session_id, self.passwd(*session_id));
                    if let Some(conn) = self.conns.get_mut(&p.conn) {
                        conn.state = ConnState::Session(*session_id);
                        conn.last_zxid = c.zxid;
                    }
                    self.send_raw(p.conn, resp.encode());
                }
            }
            Response::CloseSession => {
                let s = c.session;
                self.tracker.remove(s);
                self.holders().remove(&s);
                self.announced().remove(&s);
                self.closing.remove(&s);
                self.watches.remove_session(s);
                if let Some(Pending {
                    conn,
                    kind: PendingKind::Close { xid },
                    ..
                }) = mine
                {
                    self.send_raw(conn, proto::encode_error(xid, c.zxid, ZkError::Ok));
                }
                let gone: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, k)| k.state == ConnState::Session(s))
                    .map(|(id, _)| *id)
                    .collect();
                for id in gone {
                    // the writer flushes the reply before its socket closes
                    self.drop_conn(id);
                }
            }
            resp => {
                if let Some(Pending {
                    conn,
                    kind: PendingKind::Write { xid, opcode, multi },
                    ..
                }) = mine
                {
                    if let Some(k) = self.conns.get_mut(&conn) {
                        k.last_zxid = k.last_zxid.max(c.zxid);
                    }
                    let frame = if opcode == opcode::AUTH {
                        proto::encode_error(xid, c.zxid, resp.error())
                    } else {
                        proto::encode_reply_shaped(xid, c.zxid, opcode, &multi, resp)
                    };
                    self.send_raw(conn, frame);
                }
            }
        }
    }

    /// After a restart: preprocess what the log holds past the snapshot.
    /// A log that cannot be read back is a failed start, never "nothing
    /// to replay": the server would otherwise rejoin without entries it
    /// acknowledged.
    fn catch_up_preprocess(&mut self) -> Result<(), StoreError> {
        let first = self.applied_index + 1;
        let last = raft::Storage::last_index(self.raw.store())?;
        if last < first {
            return Ok(());
        }
        let entries = raft::Storage::entries(
            self.raw.store(),
            first,
            last + 1,
            None,
            raft::GetEntriesContext::empty(false),
        )?;
        for e in entries {
            if e.entry_type == EntryType::EntryNormal && !e.data.is_empty() {
                self.preprocess_entry(&e);
            }
        }
        Ok(())
    }

    /// Starts a snapshot once `snapshot_distance` entries were applied
    /// since the last one (or raft wants one for a lagging follower). The
    /// loop only copies the tree; a worker thread encodes, compresses and
    /// writes it, so a large tree does not stall clients and heartbeats
    /// for the time that takes. The log is compacted once the file is
    /// durable ([`Node::finish_snapshot`]). One snapshot at a time.
    fn maybe_snapshot(&mut self) {
        if self.snapshot_job.is_some() {
            return;
        }
        let last = self.raw.store().snapshot_index();
        let wanted = self.raw.store().snapshot_wanted();
        if self.applied_index <= last || (self.applied_index - last < self.cfg.snapshot_distance && wanted == 0) {
            return;
        }
        let index = self.applied_index;
        let term = raft::Storage::term(self.raw.store(), index).unwrap_or(self.raw.raft.term);
        let meta = SnapshotMeta {
            last_index: index,
            last_term: term,
            zxid: self.last_zxid(),
            digest: self.ks.digest(),
        };
        let copying = Instant::now();
        let state = self.ks.state().clone();
        let copy_ms = copying.elapsed().as_secs_f64() * 1e3;
        let config = self.snaps.config;
        let dir = self.raw.store().disk.dir().to_path_buf();
        let (tx, rx) = mpsc::sync_channel(1);
        let spawned = thread::Builder::new().name("snapshot".into()).spawn(move || {
            let started = Instant::now();
            let bytes = snapshot::encode(&state, &meta, config.compress, config.zstd_level);
            drop(state);
            let name = snapshot::file_name(meta.last_index, meta.last_term);
            let written = FsDisk::open(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))
                .and_then(|mut disk| {
                    Snapshots::new(config)
                        .write_bytes(&mut disk, &name, &bytes)
                        .map_err(|e| e.to_string())
                });
            let _ = tx.send(written.map(|()| (bytes, started.elapsed().as_secs_f64() * 1e3)));
        });
        if let Err(e) = spawned {
            self.die(&format!("snapshot: cannot start its thread: {e}"));
        }
        self.snapshot_job = Some(SnapshotJob {
            index,
            term,
            copy_ms,
            done: rx,
        });
    }

    /// Takes the running snapshot's outcome if it is there (or, with
    /// `wait`, once it is): a written file lets the log be compacted below
    /// it, unless a snapshot installed from the leader meanwhile already
    /// covers more.
    fn finish_snapshot(&mut self, wait: bool) {
        let Some(job) = &self.snapshot_job else { return };
        let outcome = if wait {
            job.done.recv().map_err(|_| mpsc::TryRecvError::Disconnected)
        } else {
            job.done.try_recv()
        };
        let (index, term, copy_ms) = (job.index, job.term, job.copy_ms);
        let (bytes, write_ms) = match outcome {
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => self.die("snapshot: its thread ended without a result"),
            Ok(Err(e)) => self.die(&format!("snapshot: {e}")),
            Ok(Ok(done)) => done,
        };
        self.snapshot_job = None;
        let store = self.raw.mut_store();
        if index <= store.snapshot_index() {
            return;
        }
        match store.set_snapshot(index, term, bytes) {
            Ok(()) => log(
                self.id,
                "snapshot",
                serde_json::json!({"index": index, "term": term, "copy_ms": copy_ms, "write_ms": write_ms}),
            ),
            Err(e) => self.die(&format!("snapshot: {e}")),
        }
    }

    fn install_snapshot(&mut self, s: &raft::prelude::Snapshot) {
        // one writer of snapshot files at a time
        self.finish_snapshot(true);
        let meta = s.get_metadata();
        let name = snapshot::file_name(meta.index, meta.term);
        // raft hands over only a snapshot this node stepped, and it stepped
        // only one it had decoded ([`Node::decode_incoming_snapshot`])
        let (state, kmeta) = match self.incoming_snapshot.take() {
            Some((index, term, state, kmeta)) if (index, term) == (meta.index, meta.term) => (state, kmeta),
            _ => self.die(&format!(
                "raft installs snapshot {name}, which was not checked when it arrived"
            )),
        };
        self.ks = Storage::from_state(state, self.ks.mode() == drift_keeper::DigestMode::Full);
        self.preprocessed.clear();
        let bytes = s.data.to_vec();
        let store = self.raw.mut_store();
        if let Err(e) = self
            .snaps
            .write_bytes(&mut store.disk, &name, &bytes)
            .map_err(|e| e.to_string())
            .and_then(|_| {
                store
                    .set_snapshot(meta.index, meta.term, bytes)
                    .map_err(|e| e.to_string())
            })
        {
            self.die(&format!("installing snapshot: {e}"));
        }
        self.applied_index = meta.index;
        // the tree jumped: sessions may have ended and watched nodes
        // changed with no event. As ZooKeeper does after a full sync, the
        // clients reconnect (and re-send their watches with the zxid they
        // saw, which fires what changed since)
        self.watches = WatchManager::new();
        let conns: Vec<u64> = self.conns.keys().copied().collect();
        for c in conns {
            self.drop_conn(c);
        }
        log(
            self.id,
            "snapshot_installed",
            serde_json::json!({"index": meta.index, "zxid": kmeta.zxid}),
        );
    }

    // ---------------------------------------------------------------- admin

    fn admin(&mut self, line: &str) -> String {
        let mut words = line.split_whitespace();
        let token = words.next().unwrap_or("");
        if self.fault_token.as_deref() != Some(token) {
            return "error bad token".into();
        }
        match (words.next(), words.next()) {
            (Some("diverge"), _) => {
                self.diverge_next = true;
                "ok".into()
            }
            (Some("undecodable"), _) => self.propose_undecodable(),
            (Some("clock"), Some(ms)) => match ms.parse::<i64>() {
                Ok(v) => {
                    self.clock_offset_ms = v;
                    if let Some(kv) = &self.kv_admin {
                        kv(&format!("clock {v}"));
                    }
                    "ok".into()
                }
                Err(_) => "error clock needs an integer offset in ms".into(),
            },
            (Some("isolate"), Some(ids)) => match ids
                .split(',')
                .map(str::parse::<u64>)
                .collect::<Result<BTreeSet<u64>, _>>()
            {
                Ok(set) => {
                    log(
                        self.id,
                        "isolate",
                        serde_json::json!({"from": set.iter().collect::<Vec<_>>()}),
                    );
                    self.isolated = set;
                    "ok".into()
                }
                Err(_) => "error isolate needs comma-separated peer ids".into(),
            },
            (Some("heal"), _) => {
                self.isolated.clear();
                log(self.id, "heal", serde_json::json!({}));
                "ok".into()
            }
            (Some("status"), _) => self.four_letter(b"dgst"),
            (Some("table"), _) => match &self.table_admin {
                Some(f) => f(line.splitn(3, ' ').nth(2).unwrap_or("")),
                None => "error this node has no tables".into(),
            },
            (Some("kv"), _) => match &self.kv_admin {
                Some(f) => f(line.splitn(3, ' ').nth(2).unwrap_or("")),
                None => "error this node has no kv service".into(),
            },
            _ => "error unknown command (diverge | undecodable | clock <ms> | isolate <ids> | heal | status | table <hook> | kv <hook>)".into(),
        }
    }

    /// The `undecodable` fault hook, on the leader: proposes an entry no
    /// replica can decode, as an older version's log or a bug might hold.
    /// Every replica, this one included, must commit it as the same no-op.
    fn propose_undecodable(&mut self) -> String {
        if !self.is_leader() {
            return "error not the leader".into();
        }
        if self.raw.propose(Vec::new(), UNDECODABLE_ENTRY.to_vec()).is_err() {
            return "error raft refused the proposal".into();
        }
        let index = self.raw.raft.raft_log.last_index();
        log(self.id, "undecodable_proposed", serde_json::json!({"log_index": index}));
        self.preprocessed.push_back(Preprocessed {
            index,
            term: self.raw.raft.term,
            zxid: self.ks.last_preprocessed_zxid(),
            carried: drift_keeper::Digest::NONE,
            skipped: true,
        });
        format!("ok {index}")
    }

    fn four_letter(&self, word: &[u8; 4]) -> String {
        let st = self.ks.state();
        let role = match self.raw.raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            _ => "candidate",
        };
        // with digests off nothing keeps one: compute it on demand, so an
        // operator (and the campaign's final check) can still compare
        // trees; only the words that report it pay for it
        let digest = || {
            if self.ks.mode() == drift_keeper::DigestMode::Off {
                drift_keeper::Digest {
                    version: drift_keeper::digest::DIGEST_VERSION,
                    value: drift_keeper::digest::tree_value(st.recompute_digest()),
                }
            } else {
                self.ks.digest()
            }
        };
        match word {
            b"ruok" => "imok".into(),
            b"dgst" => {
                let d = digest();
                format!(
                    "applied_index\t{}\nzxid\t{}\ndigest\t{:#018x}\ndigest_version\t{}\n",
                    self.applied_index,
                    st.last_zxid(),
                    d.value,
                    d.version
                )
            }
            b"lgif" => {
                let s = self.raw.store();
                format!(
                    "first_log_idx\t{}\nlast_log_idx\t{}\nlast_log_term\t{}\nlast_committed_log_idx\t{}\nleader_committed_log_idx\t{}\ntarget_committed_log_idx\t{}\nlast_snapshot_idx\t{}\n",
                    raft::Storage::first_index(s).unwrap_or(0),
                    raft::Storage::last_index(s).unwrap_or(0),
                    self.raw.raft.raft_log.last_term(),
                    self.applied_index,
                    self.raw.raft.raft_log.committed,
                    self.raw.raft.raft_log.committed,
                    s.snapshot_index()
                )
            }
            b"mntr" => {
                let ephemerals = st.nodes().filter(|(_, n)| n.is_ephemeral()).count();
                let d = digest();
                format!(
                "zk_version\tdrift-keeper {}\nzk_server_state\t{role}\nzk_znode_count\t{}\nzk_ephemerals_count\t{ephemerals}\nzk_watch_count\t{}\nzk_num_alive_connections\t{}\nzk_outstanding_requests\t{}\nzk_packets_received\t{}\nzk_packets_sent\t{}\nzk_last_zxid\t{}\nzk_digest\t{:#018x}\n",
                env!("CARGO_PKG_VERSION"), st.node_count(), self.watches.count(), self.conns.len(), self.pending.len(),
                self.received, self.sent, st.last_zxid(), d.value
                )
            }
            b"srvr" | b"stat" => {
                // `stat` lists the clients first, as ZooKeeper's does
                let mut clients = String::new();
                if word == b"stat" {
                    clients.push_str("Clients:\n");
                    for (id, c) in &self.conns {
                        let addr = c.peer.map_or_else(|| "unknown".to_string(), |a| a.to_string());
                        clients.push_str(&format!(
                            " /{addr}[{}](queued=0,recved={},sent={},sid={})\n",
                            u8::from(matches!(c.state, ConnState::Session(_))),
                            c.received,
                            c.sent,
                            match c.state {
                                ConnState::Session(s) => format!("{s:#x}"),
                                ConnState::Handshake => format!("conn {id}"),
                            }
                        ));
                    }
                    clients.push('\n');
                }
                format!(
                    "Zookeeper version: drift-keeper {}\n{clients}{}\nReceived: {}\nSent: {}\nConnections: {}\nOutstanding: {}\nZxid: {:#x}\nMode: {role}\nNode count: {}\n",
                    env!("CARGO_PKG_VERSION"), self.latency.line(), self.received, self.sent, self.conns.len(), self.pending.len(), st.last_zxid(), st.node_count()
                )
            }
            b"conf" => format!(
                "serverId={}\ntickTime={}\nelectionTicks={}\nquorumReads={}\ndigest={}\nsnapshotDistance={}\nreservedLogItems={}\nrotateInterval={}\nminSessionTimeout={}\nmaxSessionTimeout={}\n",
                self.id, self.cfg.tick_ms, self.cfg.election_ticks, self.cfg.quorum_reads, self.cfg.digest,
                self.cfg.snapshot_distance, self.cfg.reserved_log_items, self.cfg.rotate_interval,
                self.cfg.session_timeout_min_ms, self.cfg.session_timeout_max_ms
            ),
            _ => String::new(),
        }
    }
}
