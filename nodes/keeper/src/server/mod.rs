//! One keeper server as a sans-IO state machine: Raft (raft-rs) driving
//! the keeper's tree, ZooKeeper clients, peers. It owns no socket, thread,
//! clock or file: a driver hands it [`Input`]s with the time in an
//! [`Env`], and carries out the [`Effect`]s it returns (send a frame to a
//! peer or a client, close a connection, write a snapshot, log a line,
//! stop). The real driver is `drift node` (`nodes/node`); the simulator
//! steps several of these in one thread over a simulated network and
//! disk. Its files go through the [`Disk`] it is opened on.
//!
//! The digest protocol (ClickHouse Keeper's; docs/ARCHITECTURE.md, "The
//! keeper"): the leader preprocesses a write right before proposing it
//! (one state machine, so in log order) and puts the tree digest after it
//! into the entry; every replica compares its digest after preprocess and
//! after commit; a mismatch is [`Effect::DigestMismatch`], after which the
//! server does nothing more. Followers preprocess entries as they are
//! persisted; a truncation by a new leader rolls the uncommitted overlay
//! back; a snapshot from the leader replaces tree, overlay and digest
//! together, its digest checked on load.
//!
//! Sessions: created and closed through the log; heartbeats reach the
//! server a client is connected to, which reports live sessions to the
//! leader; the leader alone decides expiry and proposes the close.
//!
//! What enters the log (see [`crate::limit`]): a client's write is checked
//! against the log decoder's limits on the server it reached and answered
//! `MarshallingError` when over one; the leader checks again before it
//! proposes anything, and admits a forwarded write only from the
//! authenticated peer that names itself as its origin and holds the
//! session (the last server to report it alive). Raft messages from peers
//! pass [`crate::peer_check`] before they are stepped, and a snapshot must
//! decode before raft sees it. A committed entry that still cannot be
//! applied (an older version's log, a bug) becomes the same no-op on every
//! replica, logged, with an error to its client: only a digest mismatch
//! stops a server.
//!
//! Reads are served from the local tree once it has applied the session's
//! last seen zxid; with quorum reads, after a Raft read-index round. A
//! session's requests are answered in the order they came, reads among
//! them (see [`Conn::queue`]).
//!
//! Batching: [`KeeperServer::step`] takes one input; [`KeeperServer::advance`]
//! persists and sends what Raft has ready. A driver steps every input
//! that is waiting, then advances once, so one fsync carries many writes.

mod admin;
mod clients;
mod replication;

use crate::changelog;
use crate::disk::Disk;
use crate::entry::DigestMismatch;
use crate::peer::PeerMsg;
use crate::proto::ClientRequest;
use crate::raftlog::{RaftLog, StoreError};
use crate::session::SessionTracker;
use crate::snapshot::{self, SnapshotError, SnapshotMeta, Snapshots};
use crate::state::{Frozen, State};
use crate::watch::WatchManager;
use crate::{DigestMode, Storage};
use raft::RawNode;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

pub use admin::AdminAnswer;

/// Exit code of a server that found its tree diverged from the leader's.
pub const DIGEST_ABORT_EXIT: i32 = 86;
/// How long a request may wait for its commit before the client is told
/// the connection was lost.
const PENDING_TIMEOUT_US: u64 = 30_000_000;
/// A read-index round unanswered this long is asked again: raft drops a
/// round when there is no leader or one that has not committed in its term,
/// and a round's message or its answer may be lost on the way.
const READ_INDEX_RETRY_US: u64 = 500_000;
/// A quorum read whose rounds went unanswered this long: its client is
/// told the connection was lost (it reconnects, perhaps to a server that
/// sees a leader).
const READ_INDEX_TIMEOUT_US: u64 = 6_000_000;
/// A quorum read waiting for a read-index round.
#[derive(Debug, Clone, Copy)]
struct ReadRound {
    /// The read's connection and its place in the connection's queue.
    conn: u64,
    seq: u64,
    /// The round is a session's revalidation, not a read (`seq` unused).
    connect: bool,
    /// When the read came.
    since_us: u64,
}

/// A read-index round in flight: the reads it answers, and when it was
/// asked for.
#[derive(Debug, Clone)]
struct ReadBatch {
    sent_us: u64,
    reads: Vec<ReadRound>,
}

/// ZooKeeper's dynamic configuration node.
const CONFIG_NODE: &str = crate::state::CONFIG_PATH;
/// Most containers / TTL nodes reaped per scan.
const REAP_PER_SCAN_MAX: usize = 64;
/// What the `undecodable` fault hook proposes: an entry no replica can
/// decode (format byte 0 is no format).
const UNDECODABLE_ENTRY: &[u8] = b"\0undecodable entry (fault hook)";
/// Raft rounds one `advance` handles at most: the first, and those for
/// writes that answers sent in the round before let go.
const READY_ROUNDS_MAX: usize = 4;
/// Election timeouts a server that is behind (see `fall_behind`) waits
/// for the entries it misses before it takes part in elections again.
const BEHIND_TIMEOUTS: u64 = 10;

/// One server of the cluster as the others and the clients know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub raft: SocketAddr,
    pub client: SocketAddr,
}

/// A session's password: SipHash-2-4 of its id under `key` (two salts,
/// 16 bytes), so every server holding the key checks it without asking.
pub fn session_password(key: (u64, u64), session: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    for salt in [1u64, 2] {
        let mut h =
            siphasher::sip::SipHasher24::new_with_keys(key.0 ^ 0x6472_6966_7421, key.1 ^ 0x7061_7373_7764 ^ salt);
        std::hash::Hasher::write_i64(&mut h, session);
        out.extend_from_slice(&std::hash::Hasher::finish(&h).to_be_bytes());
    }
    out
}

/// What a server needs to know to run: the cluster file's keeper part.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub id: u64,
    pub members: Vec<Member>,
    pub tick_ms: u64,
    pub election_ticks: usize,
    pub snapshot_distance: u64,
    pub reserved_log_items: u64,
    pub rotate_interval: u64,
    /// Bytes of the newest log entries held in memory; older ones are
    /// read back from the changelog when a follower or a replay needs them.
    pub log_cache_bytes: usize,
    /// Room reserved ahead of the changelog's end at a time
    /// (`changelog::Config::reserve_bytes`).
    pub log_reserve_bytes: u64,
    pub quorum_reads: bool,
    /// Quorum reads share read-index rounds: one in flight, the reads
    /// that come meanwhile together in the next (else each read asks for
    /// its own). The simulator runs with it unless told otherwise (`drift
    /// test --sim-read-rounds per-read`, and half of swarm mode's seeds);
    /// the node does not: a read
    /// then waits up to a round longer, and a write queued behind it on
    /// its session with it. Real ClickHouse, all of whose threads share
    /// one session, had more commits lost on their way to a killed
    /// server, and 18.16 keeps such a part on its writer alone
    /// (BENCHMARKS.md, "A pull that stops at a reload, and what real
    /// ClickHouse disagreed about").
    pub shared_read_rounds: bool,
    /// Log each block id (a child of a node named `blocks`, as a
    /// replicated table keeps them) created or removed by an applied
    /// entry, with its zxid and ctime: the dedup checker's witness.
    pub witness_blocks: bool,
    pub digest: DigestMode,
    pub session_timeout_min_ms: u64,
    pub session_timeout_max_ms: u64,
    /// Seeds the election jitter: which server's timeout fires first is
    /// the same for every start of the same configuration.
    pub seed: u64,
    /// Keys the session passwords ([`session_password`]): alike on every
    /// server of a cluster, and unknown to clients, or one could compute
    /// another's password.
    pub session_key: (u64, u64),
    /// The first start of a new cluster: a server without Raft state may
    /// vote. Without it, no state means lost state (see `quiet`).
    pub bootstrap: bool,
    /// The fault hooks (diverge, clock, isolate, …) answer only this
    /// token; without one, nothing can trigger them.
    pub fault_token: Option<String>,
    /// How snapshots are written and how many are kept.
    pub snapshots: snapshot::Config,
    /// Leave the sync of the log's new entries to the driver
    /// ([`Effect::SyncLog`], answered by [`Input::LogSynced`]) instead of
    /// syncing before the step returns. The server goes on taking input
    /// while the disk works; what must wait for the entries to be durable
    /// (an acknowledgement to the leader, a vote) waits for the answer,
    /// and one sync covers every entry written before it began.
    pub deferred_log_sync: bool,
}

impl ServerConfig {
    fn digest_name(&self) -> &'static str {
        match self.digest {
            DigestMode::Off => "off",
            DigestMode::Incremental => "incremental",
            DigestMode::Full => "full",
        }
    }
}

/// The time, as the driver tells it with every input.
#[derive(Debug, Clone, Copy, Default)]
pub struct Env {
    /// The server's monotonic clock, in microseconds from any origin.
    pub now_us: u64,
    /// The wall clock, in milliseconds since the Unix epoch: the time a
    /// write carries into the log, and TTLs.
    pub wall_ms: i64,
}

/// What happens to a server.
#[derive(Debug)]
pub enum Input {
    /// One tick of `tick_ms` passed.
    Tick,
    /// A message from the authenticated peer `from`.
    Peer { from: u64, msg: PeerMsg },
    /// A client connected, from `peer` if known.
    Accepted { conn: u64, peer: Option<SocketAddr> },
    /// A whole frame (after its length) from a client.
    Frame { conn: u64, payload: Vec<u8> },
    /// A four-letter word instead of a client's first frame.
    FourLetter { conn: u64, word: [u8; 4] },
    /// A client's connection ended (or the driver gave it up).
    Closed { conn: u64 },
    /// The snapshot of [`Effect::WriteSnapshot`] is durable (its file's
    /// size), or could not be written; with how long the driver saw the
    /// tree's copy take (the step that asked for it) and the write.
    SnapshotWritten {
        index: u64,
        term: u64,
        result: Result<u64, String>,
        copy_ms: f64,
        write_ms: f64,
    },
    /// The sync of [`Effect::SyncLog`] numbered `number` is done (and so is
    /// every one numbered below it), or failed.
    LogSynced { number: u64, result: Result<(), String> },
}

/// What a server asks its driver to do, in order.
#[derive(Debug)]
pub enum Effect {
    /// Send to a peer (dropped if it cannot be reached: Raft retransmits).
    Peer { to: u64, msg: PeerMsg },
    /// Send a frame (length included) to a client.
    Client { conn: u64, frame: Vec<u8> },
    /// End a client's connection: stop reading from it, send what was
    /// queued for it, then close it.
    Close { conn: u64 },
    /// Write this snapshot to the server's disk (off the server's path,
    /// it may take a while), then answer with [`Input::SnapshotWritten`].
    WriteSnapshot(SnapshotJob),
    /// Sync this log file (see [`crate::changelog::sync_left`]), then
    /// answer with [`Input::LogSynced`] and this number. Asked in
    /// increasing numbers; a driver may answer several with one sync
    /// begun after the last of them was asked, answering its number.
    /// `len`: the file's length once this number's entries were written
    /// (a sync must cover at least that much; the simulator's covers no
    /// more).
    SyncLog { number: u64, file: String, len: u64 },
    /// One line for the server's log.
    Log {
        event: &'static str,
        fields: serde_json::Value,
    },
    /// The server cannot go on (its storage failed): stop it. It does
    /// nothing after this.
    Fatal { reason: String },
    /// This replica's tree differs from the one the log's digest
    /// describes: stop it ([`DIGEST_ABORT_EXIT`]). It does nothing after
    /// this.
    DigestMismatch(DigestMismatch),
    /// The effects since the last `Flush` are a batch: send them now (the
    /// server is about to write its log, or is done for this input). A
    /// driver may hold peer and client frames back until this and send
    /// each destination's in one write; one that sends at once ignores it.
    Flush,
}

/// A snapshot to write: the tree at `meta.last_index`.
#[derive(Debug)]
pub struct SnapshotJob {
    pub state: Frozen,
    pub meta: SnapshotMeta,
    pub config: snapshot::Config,
}

impl SnapshotJob {
    /// Encodes the snapshot and writes it to `disk` (synced, renamed into
    /// place, older ones beyond the kept count removed): its file's size.
    pub fn write(&self, disk: &mut dyn Disk) -> Result<u64, String> {
        Snapshots::new(self.config)
            .write(disk, &self.state, &self.meta)
            .map(|(_, size)| size)
            .map_err(|e| e.to_string())
    }
}

/// Why a server could not open its storage.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("node id {0} is not in the cluster")]
    UnknownId(u64),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The hard state says entries are committed past the log's end: the
    /// log lost entries this server counted as committed.
    #[error(
        "the hard state has entries committed to index {commit}, the log and snapshot end at {last}: committed entries are missing"
    )]
    LostCommitted { commit: u64, last: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ConnState {
    Handshake,
    /// A follower that has not applied the session a client resumes asks
    /// the leader's commit index (a read-index round) and answers once it
    /// applied that far: the session then exists here, or it is gone.
    Revalidating(Revalidation),
    Session(i64),
}

/// A resumed session a follower does not know yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Revalidation {
    req: crate::proto::ConnectRequest,
    /// The commit index to apply before answering; `u64::MAX` until the
    /// round comes back.
    until_index: u64,
}

struct Conn {
    state: ConnState,
    last_zxid: i64,
    /// The client's address (for `stat` and `whoami`).
    peer: Option<SocketAddr>,
    /// Frames received from it and sent to it.
    received: u64,
    sent: u64,
    /// The client's handshake had no readOnly flag: its answer has none.
    flagless: bool,
    /// The session's requests not answered yet, in the order they came.
    /// ZooKeeper answers a session's requests in that order, reads among
    /// them (a pipelining client such as kazoo pairs each answer with its
    /// oldest request): an answer leaves only once every request before it
    /// has been answered, a read is served only at the head (so after the
    /// session's earlier writes applied here), and with quorum reads a
    /// write behind an unanswered read is held back until that read is
    /// served (so no read sees a later write of its own session; a local
    /// read is served when the write before it applies, before any later
    /// one). At most
    /// [`SESSION_QUEUE_MAX`] entries: a client past it is cut off.
    queue: VecDeque<Slot>,
    /// The sequence number of the session's next request on this connection.
    next_seq: u64,
    /// Whether its connect request came and waits for its answer (a new
    /// session being committed, or a resumed one being revalidated).
    connecting: bool,
    /// Requests that came after the connect request, before its answer:
    /// a client may send them at once (the zookeeper-client crate sends
    /// its `addAuth` packets right behind its connect request), and
    /// ZooKeeper takes them once the session is established. At most
    /// [`EARLY_FRAMES_MAX`]; a client past it is cut off.
    early: Vec<Vec<u8>>,
}

/// Requests held for a connection whose session is not established yet.
const EARLY_FRAMES_MAX: usize = 256;

/// Most unanswered requests one connection may have queued: a client
/// pipelining more than this is not waiting for its answers, and is cut
/// off rather than grow the server's memory without bound.
const SESSION_QUEUE_MAX: usize = 10_000;

/// One request of a connection's queue (see [`Conn::queue`]).
struct Slot {
    seq: u64,
    state: SlotState,
}

impl Slot {
    /// A read that, with quorum reads, holds the writes behind it.
    fn holds_writes(&self) -> bool {
        matches!(&self.state, SlotState::Read(r) if r.holds_writes)
    }
}

enum SlotState {
    /// Answered: leaves once everything before it has.
    Answer(Vec<u8>),
    /// A write on its way through the log; its answer when it commits.
    Write,
    /// A write behind an unanswered read of its session: submitted once
    /// no read is before it.
    Held { write: crate::Write, kind: PendingKind },
    /// A read, served at the head once servable.
    Read(ParkedRead),
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
    fn record(&mut self, since_us: u64, now_us: u64) {
        let ms = now_us.saturating_sub(since_us) as f64 / 1e3;
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
    /// A request of a session; `seq` is its place in its connection's queue.
    Write {
        xid: i32,
        opcode: i32,
        multi: Vec<i32>,
        seq: u64,
    },
    Connect,
    Close {
        xid: i32,
        seq: u64,
    },
}

struct Pending {
    conn: u64,
    kind: PendingKind,
    since_us: u64,
    /// The leader that has the request: this server when it proposed it,
    /// else the one it was forwarded to (0: none yet).
    via: u64,
}

struct ParkedRead {
    xid: i32,
    opcode: i32,
    body: ClientRequest,
    /// Serve once this zxid (or, for quorum reads, this raft index) is applied.
    until_zxid: i64,
    until_index: u64,
    /// When it arrived (a read-index round that never answers times out).
    since_us: u64,
    /// With quorum reads, a write behind it waits until it is answered
    /// (it may be servable only after that write applied); a request the
    /// server answers from its own state (whoAmI, addWatch,
    /// removeWatches) holds nothing.
    holds_writes: bool,
}

/// An entry this server preprocessed and has not committed yet.
#[derive(Clone, Copy)]
struct Preprocessed {
    index: u64,
    term: u64,
    /// The entry's zxid; for a skipped entry, the last zxid before it.
    zxid: i64,
    /// The digest the entry carries, checked again after commit.
    carried: crate::Digest,
    /// The entry cannot be applied (it does not decode, or its zxid is
    /// not after the last one): every replica finds the same and commits
    /// it as a no-op.
    skipped: bool,
}

/// A Raft `Ready` handed on before its log entries were durable: what it
/// may send only once they are.
struct Unpersisted {
    /// The `Ready`'s number.
    number: u64,
    /// Messages Raft allows out only after the `Ready` is persisted.
    messages: Vec<raft::prelude::Message>,
    /// Its entries wait for the driver's sync of this number (else it
    /// waits only for the `Ready`s before it: its hard state was synced
    /// at once).
    synced_by_driver: bool,
}

/// The snapshot being written by the driver.
struct Writing {
    index: u64,
    term: u64,
}

/// Test-only switches that plant known bugs, so the simulator can show it
/// finds them. Each is off unless a test turns it on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlantedBugs {
    /// Send the messages Raft allows only after its state is durable
    /// before persisting it.
    pub send_before_sync: bool,
    /// Keep the preprocessed overlay when a new leader truncates the log.
    pub skip_truncation_rollback: bool,
    /// Answer a quorum read from the local tree at once.
    pub local_read_in_quorum_round: bool,
    /// Skip the digest check when applying an entry.
    pub skip_digest_check: bool,
}

pub struct KeeperServer<D: Disk> {
    id: u64,
    cfg: ServerConfig,
    raw: RawNode<RaftLog<D>>,
    ks: Storage,
    snaps: Snapshots,
    conns: BTreeMap<u64, Conn>,
    pending: BTreeMap<u64, Pending>,
    next_req: u64,
    /// Preprocessed, uncommitted entries, in log order.
    preprocessed: VecDeque<Preprocessed>,
    applied_index: u64,
    /// Read-index rounds in flight, by ctx: with `shared_read_rounds` one
    /// at a time (a second only while a lost one waits to be asked
    /// again), else one per read.
    read_index_wait: BTreeMap<u64, ReadBatch>,
    /// Quorum reads that came while a round was in flight: they go
    /// together in the next one.
    reads_next: Vec<ReadRound>,
    /// A round was asked for during this `advance`: Raft has its messages.
    read_round_started: bool,
    tracker: SessionTracker,
    closing: BTreeSet<i64>,
    alive: BTreeSet<i64>,
    watches: WatchManager,
    diverge_next: bool,
    /// The `lose-multi` fault hook: the next multi that creates a path
    /// containing this is never submitted, and its client's connection is
    /// closed (a write lost on its way to the log: the client cannot know).
    lose_multi: Option<String>,
    clock_offset_ms: i64,
    ticks: u64,
    received: u64,
    sent: u64,
    latency: Latency,
    session_key: (u64, u64),
    /// Set while a server that lost its Raft state waits to hear from a
    /// leader (see `step_raft`).
    quiet: bool,
    /// A commit index a leader announced that this server's log does not
    /// reach (its data dir was dropped after it had acknowledged those
    /// entries): until its log does, it neither votes nor campaigns, and
    /// it asks the leader for a snapshot (see `fall_behind`). 0: not behind.
    behind: u64,
    /// The tick of the last snapshot request, so they go out one per
    /// election timeout.
    behind_asked_tick: u64,
    /// The tick `behind` was set at: past [`BEHIND_TIMEOUTS`] election
    /// timeouts the server stops waiting (a heartbeat's commit is a peer's
    /// word, and a peer that lies must not silence a server for good).
    behind_since_tick: u64,
    /// The snapshot the driver is writing, if any.
    writing: Option<Writing>,
    /// Peers whose Raft traffic this server drops (the `isolate` fault
    /// hook: a partition of the Raft links, both ways when set on both
    /// ends).
    isolated: BTreeSet<u64>,
    /// The cluster's server ids.
    voters: Vec<u64>,
    /// Leader: the servers that hold each session — those that reported
    /// it alive this term, and the one it was created through; a forwarded
    /// write is admitted only from one of them. A client moving between
    /// servers is briefly held by both, so this is a set, not one owner.
    /// Valid for the term it names: a new term starts it afresh (see
    /// `holders()`).
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
    incoming_snapshot: Option<(u64, u64, State, SnapshotMeta)>,
    /// Set while a Raft `Ready` is handled: nothing may be proposed then.
    in_ready: bool,
    /// `Ready`s whose entries the driver is syncing, and those after them,
    /// in order (with `deferred_log_sync`).
    unpersisted: VecDeque<Unpersisted>,
    /// Connections whose held writes were released while a `Ready` was
    /// handled, submitted once it is done.
    release_after_ready: BTreeSet<u64>,
    /// Connections whose session was established while a `Ready` was
    /// handled: the requests they sent early are served after it.
    early_after_ready: BTreeSet<u64>,
    /// The time of the input being handled.
    env: Env,
    /// Effects of the input being handled.
    out: Vec<Effect>,
    /// Why the server stopped (storage failed, digest mismatch): it takes
    /// no more input.
    halted: bool,
    bugs: PlantedBugs,
}

impl<D: Disk> KeeperServer<D> {
    /// Opens the server on `disk`: the newest snapshot, the log after it,
    /// the entries past the snapshot preprocessed again. Effects: the log
    /// lines of the start (a torn changelog tail, "started").
    pub fn open(cfg: ServerConfig, mut disk: D, env: Env) -> Result<(KeeperServer<D>, Vec<Effect>), OpenError> {
        let me = cfg
            .members
            .iter()
            .find(|m| m.id == cfg.id)
            .ok_or(OpenError::UnknownId(cfg.id))?
            .clone();
        let snaps = Snapshots::new(cfg.snapshots);
        snaps.clean_incomplete(&mut disk)?;
        let mode = cfg.digest;
        let digest_on = mode != DigestMode::Off;
        let (ks, snap) = match snaps.list(&disk)?.pop() {
            Some((index, term, name)) => {
                let bytes = disk.read(&name).map_err(|error| SnapshotError::Io {
                    file: name.clone(),
                    error,
                })?;
                let (state, _meta) = snapshot::decode(&name, &bytes, digest_on)?;
                (
                    Storage::from_state(state, mode == DigestMode::Full),
                    Some((index, term)),
                )
            }
            None => (Storage::new(mode), None),
        };
        let snapshot_index = snap.as_ref().map_or(0, |s| s.0);
        let voters: Vec<u64> = cfg.members.iter().map(|m| m.id).collect();
        let log_cfg = changelog::Config {
            rotate_interval: cfg.rotate_interval,
            reserved_log_items: cfg.reserved_log_items,
            zstd_level: 1,
            cache_bytes: cfg.log_cache_bytes,
            reserve_bytes: cfg.log_reserve_bytes,
        };
        let (store, report, fresh) = RaftLog::open(disk, voters.clone(), log_cfg, snap)?;
        // election timeouts spread per server by the seed; raft-rs draws
        // its randomized timeout from [min, max), one value wide here, so
        // it draws nothing
        let mut h = siphasher::sip::SipHasher13::new_with_keys(cfg.seed, cfg.id);
        std::hash::Hasher::write_u64(&mut h, cfg.id);
        let jitter = (std::hash::Hasher::finish(&h) % cfg.election_ticks as u64) as usize;
        let election = cfg.election_ticks + jitter;
        let rc = raft::Config {
            id: cfg.id,
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
        // raft-rs panics on such a store; it is damage, reported as such
        let last = raft::Storage::last_index(&store)?;
        let commit = store.hard_state().commit;
        if commit > last {
            return Err(OpenError::LostCommitted { commit, last });
        }
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&rc, store, &logger)?;
        let mut server = KeeperServer {
            id: cfg.id,
            session_key: cfg.session_key,
            isolated: BTreeSet::new(),
            voters,
            holders: (0, BTreeMap::new()),
            announced: ((0, 0), BTreeSet::new()),
            incoming_snapshot: None,
            writing: None,
            // a server without Raft state that is not part of a new
            // cluster's first start lost its state: it may have voted in a
            // term it no longer knows, so it stays quiet until a leader
            // speaks
            quiet: fresh && !cfg.bootstrap,
            behind: 0,
            behind_asked_tick: 0,
            behind_since_tick: 0,
            raw,
            ks,
            snaps,
            conns: BTreeMap::new(),
            pending: BTreeMap::new(),
            // request ids travel in log entries and outlive this process:
            // each incarnation starts past the last one's (milliseconds
            // since the epoch × 1000: ahead unless the last one issued more
            // than a thousand requests per millisecond it ran)
            next_req: env.wall_ms.max(1) as u64 * 1000,
            preprocessed: VecDeque::new(),
            applied_index: snapshot_index,
            read_index_wait: BTreeMap::new(),
            reads_next: Vec::new(),
            read_round_started: false,
            tracker: SessionTracker::new(),
            closing: BTreeSet::new(),
            alive: BTreeSet::new(),
            watches: WatchManager::new(),
            diverge_next: false,
            lose_multi: None,
            clock_offset_ms: 0,
            ticks: 0,
            received: 0,
            sent: 0,
            latency: Latency::default(),
            in_ready: false,
            unpersisted: VecDeque::new(),
            release_after_ready: BTreeSet::new(),
            early_after_ready: BTreeSet::new(),
            env,
            out: Vec::new(),
            halted: false,
            bugs: PlantedBugs::default(),
            cfg,
        };
        if let Some(t) = &report.torn_tail {
            server.log(
                crate::NodeEvent::ChangelogTornTail.name(),
                serde_json::json!({"file": t.file, "offset": t.offset, "reason": t.reason}),
            );
        }
        server.catch_up_preprocess()?;
        server.log(
            "started",
            serde_json::json!({"applied_index": server.applied_index, "client": me.client.to_string()}),
        );
        let out = std::mem::take(&mut server.out);
        Ok((server, out))
    }

    /// Handles one input; its effects go to `sink`, in order.
    pub fn step(&mut self, env: Env, input: Input, sink: &mut dyn FnMut(Effect)) {
        if self.halted {
            return;
        }
        self.env = env;
        match input {
            Input::Tick => self.tick(),
            Input::Peer { from, msg } => self.on_peer(from, msg),
            Input::Accepted { conn, peer } => {
                self.conns.insert(
                    conn,
                    Conn {
                        peer,
                        state: ConnState::Handshake,
                        last_zxid: 0,
                        received: 0,
                        sent: 0,
                        flagless: false,
                        queue: VecDeque::new(),
                        next_seq: 0,
                        connecting: false,
                        early: Vec::new(),
                    },
                );
            }
            Input::Frame { conn, payload } => {
                self.received += 1;
                self.on_frame(conn, &payload);
            }
            Input::FourLetter { conn, word } => {
                let text = self.four_letter(&word);
                self.send_raw(conn, text.into_bytes());
                self.drop_conn(conn);
            }
            Input::Closed { conn } => {
                self.conns.remove(&conn);
            }
            Input::SnapshotWritten {
                index,
                term,
                result,
                copy_ms,
                write_ms,
            } => self.snapshot_written(index, term, result, (copy_ms, write_ms)),
            Input::LogSynced { number, result } => self.log_synced(number, result),
        }
        self.flush(sink);
    }

    /// Persists and sends what Raft has ready, applies what committed,
    /// and serves the reads that became servable; effects to `sink`, in
    /// order. What may leave before the log is written (a leader's
    /// appends, replies to committed requests) reaches `sink` before the
    /// disk is touched, so a driver sends it while the write is under way.
    pub fn advance(&mut self, env: Env, sink: &mut dyn FnMut(Effect)) {
        if self.halted {
            return;
        }
        self.env = env;
        self.handle_ready(sink);
        // a snapshot raft did not take (an older one) is not kept
        self.incoming_snapshot = None;
        self.flush(sink);
    }

    /// Hands the effects so far to `sink`.
    fn flush(&mut self, sink: &mut dyn FnMut(Effect)) {
        if self.out.is_empty() {
            return;
        }
        for e in self.out.drain(..) {
            sink(e);
        }
        sink(Effect::Flush);
    }

    /// Whether the server stopped (see [`Effect::Fatal`] and
    /// [`Effect::DigestMismatch`]).
    pub fn halted(&self) -> bool {
        self.halted
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == raft::StateRole::Leader
    }

    pub fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The candidate this server voted for in its current term (0: none).
    pub fn vote(&self) -> u64 {
        self.raw.raft.vote
    }

    /// The index of the last entry in this server's log (or of its
    /// snapshot).
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The digest of the applied tree.
    pub fn digest(&self) -> crate::Digest {
        self.ks.digest()
    }

    /// The applied tree.
    pub fn state(&self) -> &State {
        self.ks.state()
    }

    /// The term of the entry at `index` in this server's log, if it holds
    /// it (or its snapshot ends there).
    pub fn entry_term(&self, index: u64) -> Option<u64> {
        raft::Storage::term(self.raw.store(), index).ok()
    }

    /// The entry at `index` in this server's log as Raft sees it, if it
    /// still holds it: entries received but not yet written (between a
    /// `step` and the `advance` that persists them) included. The commit
    /// index can reach those — a leader's append carries both — while the
    /// changelog still holds the entries they replace.
    pub fn entry(&self, index: u64) -> Option<raft::prelude::Entry> {
        self.raw
            .raft
            .raft_log
            .slice(index, index + 1, None, raft::GetEntriesContext::empty(false))
            .ok()?
            .pop()
    }

    /// The digest of the applied tree, computed when digests are off.
    pub fn tree_digest(&self) -> u64 {
        if self.ks.mode() == DigestMode::Off {
            crate::digest::tree_value(self.ks.state().recompute_digest())
        } else {
            self.ks.digest().value
        }
    }

    /// The disk the server runs on (a simulator crashes it).
    pub fn disk(&self) -> &D {
        &self.raw.store().disk
    }

    /// Ticks handled since it started.
    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    pub fn disk_mut(&mut self) -> &mut D {
        &mut self.raw.mut_store().disk
    }

    /// Takes the disk back (the server is done with).
    pub fn into_disk(self) -> D {
        self.raw.raft.r.raft_log.store.disk
    }

    /// Plants known bugs (tests of the simulator only).
    pub fn plant_bugs(&mut self, bugs: PlantedBugs) {
        self.bugs = bugs;
    }

    fn emit(&mut self, e: Effect) {
        if !self.halted {
            self.out.push(e);
        }
    }

    fn log(&mut self, event: &'static str, fields: serde_json::Value) {
        self.emit(Effect::Log { event, fields });
    }

    /// Stops the server: storage it cannot trust.
    fn fail(&mut self, reason: String) {
        self.emit(Effect::Fatal { reason });
        self.halted = true;
    }

    fn now_ms(&self) -> u64 {
        self.env.now_us / 1000
    }

    /// The wall clock as this server's fault hook skews it.
    fn wall_ms(&self) -> i64 {
        self.env.wall_ms + self.clock_offset_ms
    }
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

/// The keys of `m` whose value arrived (`since`, µs) more than `age_us`
/// before `now_us`.
fn older_than<V>(m: &BTreeMap<u64, V>, age_us: u64, now_us: u64, since: impl Fn(&V) -> u64) -> Vec<u64> {
    m.iter()
        .filter(|(_, v)| now_us.saturating_sub(since(v)) > age_us)
        .map(|(k, _)| *k)
        .collect()
}
