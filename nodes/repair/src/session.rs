//! A repair session between two replicas of one token range, as a
//! message exchange: the initiator sends, the responder answers, one round
//! trip at a time; every message is bytes ([`crate::wire`]), so the same
//! code runs in memory (tests, benches) and over the network.
//!
//! 1. Hello: agree on the tree depth (the shallower) and one `gc_before`
//!    (the larger GC horizon); both purge tombstones below it.
//! 2. Descent, one level per round: the initiator sends its node hashes
//!    (8 bytes of the 32-byte XOR, the word chosen by the session seed, so
//!    a collision in one session is not one in the next; for a pair of
//!    siblings only the left one — the right is parent ⊕ left) and 2-bit
//!    size classes; the responder answers mismatch bits and its classes.
//!    A mismatched node descends unless a side is empty or the walk is at
//!    the leaves. With the row-level round the walk goes on below the
//!    leaves over *virtual* nodes: the XOR of seeded 64-bit per-entry
//!    fingerprints of a sub-range, until a mismatched range holds at most
//!    one entry a side (or one token).
//! 3. Without the row-level round both sides stream every entry of the
//!    mismatched ranges (the classic Merkle repair: overstreaming).
//!    With it: the initiator sends its fingerprints of those ranges, the
//!    responder answers which it holds and the versions (key, ts,
//!    tombstone) of its entries the initiator lacks; the initiator decides
//!    every LWW winner, streams its winners and asks for the responder's.
//!    Only winners travel, and only to the side that lost (a tie on ts
//!    between two values needs the values, so both travel).
//!
//! Set reconciliation (`set_reconciliation`), for small differences
//! among many entries, takes three round trips whatever the tree:
//!
//! 1. SetHello: the initiator's sketch of the range — per bucket at a
//!    level of about a thousand entries a bucket, one byte of the XOR of
//!    its entries' 64-bit fingerprints. The responder counts the buckets
//!    that differ, estimates the keys that differ (balls into bins:
//!    k = −B·ln(1 − m/B)) and answers SetAck: an invertible Bloom lookup
//!    table of its entries' 32-bit fingerprints with 1.4 cells per
//!    possible differing fingerprint (two per key) — or, when no bucket
//!    differs or most do, HelloAck, and the session is the Merkle walk.
//! 2. The initiator subtracts its own table and peels it: the
//!    fingerprints only it holds and those only the responder holds.
//!    SetStream carries its entries of the first kind and the low 24 bits
//!    of the second; the responder merges and answers Entries with its
//!    entries whose fingerprints were asked for. Both versions of a key
//!    that differs travel (the loser is merged away), so no version list
//!    is needed. A table that does not peel sends the walk's first level
//!    instead, and the session goes on as a walk.
//! 3. Done and DoneAck, as below.
//!
//! Every received entry is merged, never written blindly, so a write that
//! races the stream survives, and an interrupted session leaves both sides
//! valid (a rerun converges).
//!
//! Hash truncation: 6 bytes per node by default (`hash_bytes`). The risk
//! that a differing node compares equal is 2^-48 ≈ 3.6·10^-15 per
//! comparison; a session compares 10^3–10^6 nodes, so under 4·10^-9 per
//! session, and independent between sessions (the session seed picks which word of
//! the 32-byte hash is sent, and keys the fingerprints), so a miss is
//! repaired by the next session. 8 bytes would put the reference scenario over
//! its 4 KiB reconciliation budget; 4 would make a miss per session about
//! one in 10^4 at a million comparisons.

use crate::entry::{self, Entry};
use crate::iblt::{self, Iblt};
use crate::range::{TokenRange, DEPTH_MAX};
use crate::replica::{PeerId, Replica};
use crate::tree::{Hash, MerkleTree};
use crate::wire::{Msg, VersionRef, WireError};

/// Why a repair session stopped: bytes that are not a message, a peer's
/// refusal, or a message that does not fit where the session is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("peer refused: {0}")]
    Refused(String),
    /// A message this side did not expect now, or whose content
    /// contradicts what was sent or agreed.
    #[error("repair protocol: {0}")]
    Protocol(String),
    #[error("session did not finish within its round limit")]
    RoundLimit,
}
use siphasher::sip::SipHasher13;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

#[derive(Debug, Clone, Copy)]
pub struct SessionConfig {
    /// Per-session randomness (from the driver's seeded RNG).
    pub seed: u64,
    /// Stream only LWW winners, found by a row-level fingerprint round.
    pub row_level: bool,
    /// The session's start time, recorded for repair-gated GC.
    pub started_ts: u64,
    /// Bytes of each node hash on the wire (1..=8); see the module header.
    pub hash_bytes: u8,
    /// Try set reconciliation first (see "Set reconciliation" in the
    /// module header); the responder falls back to the Merkle walk when
    /// the difference looks large, or finds none.
    pub set_reconciliation: bool,
}

/// Deepest sketch a responder takes: 2^20 bytes.
const SKETCH_LEVEL_MAX: u32 = 20;
/// A sketch this full of differing buckets says little about how many
/// keys differ: the walk decides then.
const SKETCH_SATURATED: f64 = 0.8;

/// The default node hash width: 48 bits.
pub const HASH_BYTES_DEFAULT: u8 = 6;

/// Per-level costs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LevelTrace {
    pub level: u32,
    /// Nodes compared at this level.
    pub compared: u64,
    pub mismatched: u64,
    /// Node hashes the initiator put on the wire.
    pub hashes_sent: u64,
    pub bytes_a_to_b: u64,
    pub bytes_b_to_a: u64,
}

/// What a session cost and found. Counts bytes on the wire both ways.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub depth: u32,
    pub rounds: u32,
    pub gc_before: u64,
    /// Tree nodes compared (levels 0..=depth): the reference scenario's "hashes exchanged".
    pub hashes_compared: u64,
    /// Node hashes actually sent (siblings are derived from their parent).
    pub hashes_sent: u64,
    /// Virtual nodes compared below the leaves (row-level round).
    pub virtual_compared: u64,
    pub fingerprints_sent: u64,
    pub versions_sent: u64,
    pub bytes_a_to_b: u64,
    pub bytes_b_to_a: u64,
    /// Bytes of whole entries inside those (the stream, not reconciliation).
    pub stream_bytes: u64,
    pub entries_a_to_b: u64,
    pub entries_b_to_a: u64,
    /// Mismatched token ranges, adjacent ones coalesced.
    pub ranges: Vec<(u64, u64)>,
    /// Cells of the responder's lookup table (0: set reconciliation was
    /// not tried or the responder chose the Merkle walk).
    pub set_cells: u64,
    /// The table did not decode and the session went on with the walk.
    pub set_fallback: bool,
    pub trace: Vec<LevelTrace>,
}

impl Report {
    pub fn entries_streamed(&self) -> u64 {
        self.entries_a_to_b + self.entries_b_to_a
    }

    /// Bytes spent finding what differs (everything but streamed entries).
    pub fn reconciliation_bytes(&self) -> u64 {
        self.bytes_a_to_b + self.bytes_b_to_a - self.stream_bytes
    }
}

/// A per-entry fingerprint: 64 bits of a SipHash keyed by the session.
pub fn fingerprint(seed: u64, digest: &entry::Digest) -> u64 {
    let mut h = SipHasher13::new_with_keys(seed, seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15);
    h.write(digest);
    h.finish()
}

/// An entry's 32-bit fingerprint for set reconciliation.
fn fp32(seed: u64, digest: &entry::Digest) -> u32 {
    fingerprint(seed, digest) as u32
}

/// Buckets of a set-reconciliation sketch: about a thousand entries each,
/// between 2^3 and 2^13 of them.
fn sketch_level(entries: usize) -> u32 {
    let bits = usize::BITS - entries.leading_zeros();
    bits.saturating_sub(10).clamp(3, 13)
}

/// One byte per bucket at `level`: the top byte of the XOR of the
/// bucket's entry fingerprints.
fn sketch(replica: &Replica, range: TokenRange, seed: u64, level: u32) -> Vec<u8> {
    let mut out = vec![0u8; 1 << level];
    for (t, _, v) in replica.entries_in(range) {
        out[range.bucket_of(t, level) as usize] ^= (fingerprint(seed, &v.digest) >> 56) as u8;
    }
    out
}

/// `replica`'s lookup table of `cells` cells over `range`.
fn table(replica: &Replica, range: TokenRange, seed: u64, cells: usize) -> Iblt {
    let mut t = Iblt::new(seed, cells);
    for (_, _, v) in replica.entries_in(range) {
        t.insert(fp32(seed, &v.digest));
    }
    t
}

fn class(count: u64) -> u8 {
    count.min(2) as u8
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Final {
    level: u32,
    index: u64,
    a_class: u8,
    b_class: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Same,
    Final,
    Descend,
}

/// The walk both sides run in lockstep.
#[derive(Debug, Clone)]
struct Walk {
    seed: u64,
    /// Mask of the hash bits sent.
    mask: u64,
    range: TokenRange,
    depth: u32,
    row_level: bool,
    level: u32,
    frontier: Vec<u64>,
    finals: Vec<Final>,
    /// A tree over the session's range when it is not the replica's own
    /// (two replicas whose ranges overlap repair the intersection).
    view: Option<MerkleTree>,
}

impl Walk {
    fn new(seed: u64, range: TokenRange, depth: u32, row_level: bool, hash_bytes: u8) -> Walk {
        let bits = 8 * hash_bytes.clamp(1, 8) as u32;
        Walk {
            seed,
            mask: if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 },
            range,
            depth,
            row_level,
            level: 0,
            frontier: vec![0],
            finals: Vec::new(),
            view: None,
        }
    }

    /// The walk over `range` of `replica`: its own tree when `range` is
    /// its range, else a tree built over the entries in `range` (which it
    /// must contain) at `depth`.
    fn over(replica: &Replica, range: TokenRange, seed: u64, depth: u32, row_level: bool, hash_bytes: u8) -> Walk {
        let mut w = Walk::new(seed, range, depth, row_level, hash_bytes);
        if range != replica.range() {
            let digests = replica.entries_in(range).map(|(t, _, v)| (t, &v.digest));
            w.view = Some(MerkleTree::build(range, depth, digests));
        }
        w
    }

    /// Whether a pair at `level` is sent as one hash (the sibling is the
    /// parent XOR the left child): parent and children hash alike.
    fn sibling_derived(&self, level: u32) -> bool {
        level > 0 && (level <= self.depth || level > self.depth + 1)
    }

    /// One side's hash and size class of node `i` at `level`.
    fn node(&self, r: &Replica, level: u32, i: u64) -> (u64, u8) {
        if level <= self.depth {
            let tree = self.view.as_ref().unwrap_or(r.tree());
            let (h, count): (Hash, u64) = tree.node(level, i);
            (h[(self.seed % 4) as usize] & self.mask, class(count))
        } else {
            let mut x = 0u64;
            let mut n = 0u64;
            for (_, _, v) in r.entries_in(self.range.range_of(level, i)) {
                x ^= fingerprint(self.seed, &v.digest);
                n += 1;
            }
            (x & self.mask, class(n))
        }
    }

    fn decide(&self, i: u64, mismatch: bool, a: u8, b: u8) -> Decision {
        if !mismatch {
            return Decision::Same;
        }
        if a == 0 || b == 0 {
            return Decision::Final;
        }
        if self.level < self.depth {
            return Decision::Descend;
        }
        if !self.row_level || (a == 1 && b == 1) {
            return Decision::Final;
        }
        if self.level >= DEPTH_MAX || self.range.range_of(self.level, i).width() <= 1 {
            return Decision::Final;
        }
        Decision::Descend
    }

    /// Applies a level's outcome: records finals and moves to the next
    /// frontier. Returns the number of mismatched nodes.
    fn advance(&mut self, mismatch: &[bool], a: &[u8], b: &[u8]) -> u64 {
        let mut next = Vec::new();
        let mut mismatched = 0;
        for (k, &i) in self.frontier.iter().enumerate() {
            mismatched += mismatch[k] as u64;
            match self.decide(i, mismatch[k], a[k], b[k]) {
                Decision::Same => {}
                Decision::Final => self.finals.push(Final {
                    level: self.level,
                    index: i,
                    a_class: a[k],
                    b_class: b[k],
                }),
                Decision::Descend => {
                    next.push(2 * i);
                    next.push(2 * i + 1);
                }
            }
        }
        self.frontier = next;
        self.level += 1;
        mismatched
    }

    fn final_range(&self, f: &Final) -> TokenRange {
        self.range.range_of(f.level, f.index)
    }

    fn coalesced(&self) -> Vec<(u64, u64)> {
        let mut rs: Vec<(u64, u64)> = self
            .finals
            .iter()
            .map(|f| {
                let r = self.final_range(f);
                (r.lo, r.hi)
            })
            .filter(|(lo, hi)| lo < hi)
            .collect();
        rs.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (lo, hi) in rs {
            match out.last_mut() {
                Some(last) if last.1 == lo => last.1 = hi,
                _ => out.push((lo, hi)),
            }
        }
        out
    }

    /// Finals where both sides hold entries.
    fn both(&self) -> impl Iterator<Item = &Final> {
        self.finals.iter().filter(|f| f.a_class > 0 && f.b_class > 0)
    }

    /// Finals that need the fingerprint exchange: both sides hold entries
    /// and one holds several. Where each holds exactly one, the mismatch
    /// already says the two differ, so no fingerprint need travel.
    fn fingerprinted(&self) -> impl Iterator<Item = &Final> {
        self.both().filter(|f| f.a_class > 1 || f.b_class > 1)
    }
}

fn entries_of(r: &Replica, range: TokenRange) -> Vec<Entry> {
    r.entries_in(range).map(|(_, k, v)| v.to_entry(k)).collect()
}

/// What a session takes from its peer, whatever the peer sends: a peer
/// is authenticated, but a bug or a bad clock on it must not reach every
/// replica through repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A key's bytes: 1..=this.
    pub key_bytes_max: usize,
    /// A value's bytes.
    pub value_bytes_max: usize,
    /// How far past this side's clock a version's timestamp, or a GC
    /// horizon, may be (µs).
    pub skew_us: u64,
}

impl Default for Limits {
    /// No limits: what a session takes unless its driver sets them (the
    /// kv service sets its own).
    fn default() -> Limits {
        Limits {
            key_bytes_max: usize::MAX,
            value_bytes_max: usize::MAX,
            skew_us: u64::MAX,
        }
    }
}

impl Limits {
    /// Refuses a GC horizon past `now` plus the skew: one such horizon
    /// would purge every tombstone of the range, and spread.
    fn check_horizon(&self, gc_before: u64, now: u64) -> Result<(), SessionError> {
        if gc_before > now.saturating_add(self.skew_us) {
            return Err(SessionError::Protocol(format!(
                "a GC horizon of {gc_before} µs is past this server's clock ({now} µs) by more than {} µs",
                self.skew_us
            )));
        }
        Ok(())
    }

    /// Refuses a message's entries (all of them: nothing is merged) when
    /// one is over a limit, outside the session's range, or stamped past
    /// `now` plus the skew (it would win over every later write).
    fn check_entries(&self, entries: &[Entry], range: TokenRange, now: u64) -> Result<(), SessionError> {
        for e in entries {
            let why = if e.key.is_empty() || e.key.len() > self.key_bytes_max {
                format!("a key of {} bytes (1..={})", e.key.len(), self.key_bytes_max)
            } else if e.value.as_ref().is_some_and(|v| v.len() > self.value_bytes_max) {
                format!("a value over {} bytes", self.value_bytes_max)
            } else if !range.contains(crate::token::token(&e.key)) {
                format!("a key outside the session's range [{}, {})", range.lo, range.hi)
            } else if e.ts > now.saturating_add(self.skew_us) {
                format!(
                    "a version stamped {} µs, past this server's clock ({now} µs) by more than {} µs",
                    e.ts, self.skew_us
                )
            } else {
                continue;
            };
            return Err(SessionError::Protocol(format!("refused entries: {why}")));
        }
        Ok(())
    }
}

fn merge_all(r: &mut Replica, entries: Vec<Entry>) {
    for e in entries {
        r.merge_repaired(e);
    }
}

// ---------------------------------------------------------------- initiator

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum APhase {
    Hello,
    Level,
    Fingerprints,
    Stream,
    /// Sent `Done`, waiting for its ack.
    Closing,
    Done,
}

pub struct Initiator {
    cfg: SessionConfig,
    limits: Limits,
    peer: PeerId,
    walk: Walk,
    phase: APhase,
    /// Classes the initiator sent for the current level.
    sent_classes: Vec<u8>,
    /// Keys whose fingerprints were sent, per fingerprinted final, to read
    /// the bitmaps (writes may land between rounds: the keys, not a
    /// re-scan, say which entry a bit is about).
    sent_keys: Vec<Vec<Vec<u8>>>,
    report: Report,
}

/// What to do after a reply.
#[derive(Debug)]
pub enum Step {
    Send(Vec<u8>),
    Done(Report),
}

impl Initiator {
    /// Opens a session with `peer` over the replica's range; returns the
    /// first message.
    pub fn start(replica: &Replica, peer: PeerId, cfg: SessionConfig) -> (Initiator, Vec<u8>) {
        Initiator::start_range(replica, replica.range(), peer, cfg)
    }

    /// Opens a session over `r`, a part of the replica's range (the
    /// intersection with a peer whose range differs): only entries in it
    /// are compared and streamed. Panics if the replica does not hold `r`.
    pub fn start_range(replica: &Replica, r: TokenRange, peer: PeerId, cfg: SessionConfig) -> (Initiator, Vec<u8>) {
        let own = replica.range();
        assert!(
            own.lo <= r.lo && r.hi <= own.hi,
            "a session over a range the replica does not hold"
        );
        let hello = if cfg.set_reconciliation {
            let level = sketch_level(replica.entries_in(r).count());
            Msg::SetHello {
                seed: cfg.seed,
                lo: r.lo,
                hi: r.hi,
                depth: replica.tree().depth(),
                gc_before: replica.gc_horizon(),
                row_level: cfg.row_level,
                hash_bytes: cfg.hash_bytes,
                level,
                sketch: sketch(replica, r, cfg.seed, level),
            }
        } else {
            Msg::Hello {
                seed: cfg.seed,
                lo: r.lo,
                hi: r.hi,
                depth: replica.tree().depth(),
                gc_before: replica.gc_horizon(),
                row_level: cfg.row_level,
                hash_bytes: cfg.hash_bytes,
            }
        };
        let mut a = Initiator {
            cfg,
            limits: Limits::default(),
            peer,
            walk: Walk::over(
                replica,
                r,
                cfg.seed,
                replica.tree().depth(),
                cfg.row_level,
                cfg.hash_bytes,
            ),
            phase: APhase::Hello,
            sent_classes: Vec::new(),
            sent_keys: Vec::new(),
            report: Report::default(),
        };
        let bytes = a.send(&hello);
        (a, bytes)
    }

    fn send(&mut self, m: &Msg) -> Vec<u8> {
        let e = m.encode();
        self.report.bytes_a_to_b += e.bytes.len() as u64;
        self.report.stream_bytes += e.entry_bytes as u64;
        if let Some(t) = self.report.trace.last_mut().filter(|_| matches!(m, Msg::Level { .. })) {
            t.bytes_a_to_b += e.bytes.len() as u64;
        }
        e.bytes
    }

    fn received(&mut self, bytes: &[u8], m: &Msg) {
        self.report.bytes_b_to_a += bytes.len() as u64;
        self.report.stream_bytes += m.encode().entry_bytes as u64;
        self.report.rounds += 1;
        if matches!(m, Msg::LevelAck { .. }) {
            if let Some(t) = self.report.trace.last_mut() {
                t.bytes_b_to_a += bytes.len() as u64;
            }
        }
    }

    /// What this side takes from the responder (the default's otherwise);
    /// its clock is the session's start, `started_ts`.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Handles the responder's reply.
    pub fn on_reply(&mut self, replica: &mut Replica, bytes: &[u8]) -> Result<Step, SessionError> {
        let m = Msg::decode(bytes)?;
        self.received(bytes, &m);
        match (self.phase, m) {
            (_, Msg::Error { reason }) => Err(SessionError::Refused(reason)),
            (APhase::Hello, Msg::HelloAck { depth, gc_before }) => {
                self.limits.check_horizon(gc_before, self.cfg.started_ts)?;
                self.walk.depth = self.walk.depth.min(depth);
                self.report.depth = self.walk.depth;
                self.report.gc_before = gc_before;
                replica.purge_tombstones_before(gc_before);
                self.phase = APhase::Level;
                Ok(Step::Send(self.level_msg(replica)))
            }
            (
                APhase::Hello,
                Msg::SetAck {
                    depth,
                    gc_before,
                    cells,
                },
            ) => {
                self.limits.check_horizon(gc_before, self.cfg.started_ts)?;
                self.walk.depth = self.walk.depth.min(depth);
                self.report.depth = self.walk.depth;
                self.report.gc_before = gc_before;
                replica.purge_tombstones_before(gc_before);
                self.reconcile(replica, &cells)
            }
            (APhase::Level, Msg::LevelAck { mismatch, classes }) => {
                let n = self.walk.frontier.len();
                let mismatched = mismatch.iter().filter(|&&m| m).count();
                if mismatch.len() != n || classes.len() != mismatched {
                    return Err(SessionError::Protocol(format!(
                        "level ack for {} nodes, expected {n}",
                        mismatch.len()
                    )));
                }
                let classes = expand_classes(&mismatch, &classes);
                let a = std::mem::take(&mut self.sent_classes);
                let level = self.walk.level;
                let mismatched = self.walk.advance(&mismatch, &a, &classes);
                if let Some(t) = self.report.trace.last_mut() {
                    t.mismatched = mismatched;
                }
                if level <= self.walk.depth {
                    self.report.hashes_compared += n as u64;
                } else {
                    self.report.virtual_compared += n as u64;
                }
                if !self.walk.frontier.is_empty() {
                    return Ok(Step::Send(self.level_msg(replica)));
                }
                self.report.ranges = self.walk.coalesced();
                self.after_walk(replica)
            }
            (
                APhase::Fingerprints,
                Msg::Versions {
                    present,
                    versions,
                    entries,
                },
            ) => {
                self.limits
                    .check_entries(&entries, self.walk.range, self.cfg.started_ts)?;
                self.report.entries_b_to_a += entries.len() as u64;
                merge_all(replica, entries);
                self.resolve(replica, present, versions)
            }
            (APhase::Stream, Msg::Entries { entries }) => {
                self.limits
                    .check_entries(&entries, self.walk.range, self.cfg.started_ts)?;
                self.report.entries_b_to_a += entries.len() as u64;
                merge_all(replica, entries);
                self.phase = APhase::Closing;
                Ok(Step::Send(self.send(&Msg::Done)))
            }
            (APhase::Closing, Msg::DoneAck) => Ok(self.finish(replica)),
            (phase, m) => Err(SessionError::Protocol(format!("unexpected {m:?} in phase {phase:?}"))),
        }
    }

    /// Decodes the responder's table against this side's: streams the
    /// entries only this side holds and asks for those only the responder
    /// holds; a table that does not decode leaves it to the Merkle walk.
    fn reconcile(&mut self, replica: &mut Replica, cells: &[u8]) -> Result<Step, SessionError> {
        let seed = self.cfg.seed;
        let theirs = Iblt::from_bytes(seed, cells)
            .ok_or_else(|| SessionError::Protocol(format!("{} bytes are not a lookup table", cells.len())))?;
        self.report.set_cells = theirs.len() as u64;
        let range = self.walk.range;
        let mut mine = table(replica, range, seed, theirs.len());
        mine.subtract(&theirs).map_err(SessionError::Protocol)?;
        let Some((only_mine, only_theirs)) = mine.decode() else {
            self.report.set_fallback = true;
            self.phase = APhase::Level;
            return Ok(Step::Send(self.level_msg(replica)));
        };
        let only_mine: BTreeSet<u32> = only_mine.into_iter().collect();
        let entries: Vec<Entry> = replica
            .entries_in(range)
            .filter(|(_, _, v)| only_mine.contains(&fp32(seed, &v.digest)))
            .map(|(_, k, v)| v.to_entry(k))
            .collect();
        let mask = (1u32 << crate::wire::WANT_BITS) - 1;
        let want: Vec<u32> = only_theirs.iter().map(|f| f & mask).collect();
        self.report.entries_a_to_b += entries.len() as u64;
        self.phase = APhase::Stream;
        Ok(Step::Send(self.send(&Msg::SetStream { entries, want })))
    }

    fn level_msg(&mut self, replica: &Replica) -> Vec<u8> {
        let level = self.walk.level;
        let nodes: Vec<(u64, u8)> = self
            .walk
            .frontier
            .iter()
            .map(|&i| self.walk.node(replica, level, i))
            .collect();
        let hashes: Vec<u64> = if self.walk.sibling_derived(level) {
            nodes.iter().step_by(2).map(|(h, _)| *h).collect()
        } else {
            nodes.iter().map(|(h, _)| *h).collect()
        };
        self.sent_classes = nodes.iter().map(|(_, c)| *c).collect();
        self.report.hashes_sent += if level <= self.walk.depth {
            hashes.len() as u64
        } else {
            0
        };
        self.report.trace.push(LevelTrace {
            level,
            compared: nodes.len() as u64,
            hashes_sent: hashes.len() as u64,
            ..LevelTrace::default()
        });
        let m = Msg::Level {
            level,
            hash_bytes: self.cfg.hash_bytes,
            hashes,
            classes: self.sent_classes.clone(),
        };
        self.send(&m)
    }

    fn after_walk(&mut self, replica: &mut Replica) -> Result<Step, SessionError> {
        if self.walk.finals.is_empty() {
            return Ok(self.finish(replica));
        }
        if !self.cfg.row_level {
            let mut entries = Vec::new();
            for f in &self.walk.finals {
                entries.extend(entries_of(replica, self.walk.final_range(f)));
            }
            self.report.entries_a_to_b += entries.len() as u64;
            self.phase = APhase::Stream;
            return Ok(Step::Send(self.send(&Msg::Stream {
                entries,
                want: Vec::new(),
            })));
        }
        let seed = self.cfg.seed;
        let (keys, fps): (Vec<Vec<Vec<u8>>>, Vec<Vec<u64>>) = self
            .walk
            .fingerprinted()
            .map(|f| {
                replica
                    .entries_in(self.walk.final_range(f))
                    .map(|(_, k, v)| (k.to_vec(), fingerprint(seed, &v.digest)))
                    .unzip()
            })
            .unzip();
        self.sent_keys = keys;
        self.report.fingerprints_sent = fps.iter().map(|v| v.len() as u64).sum();
        self.phase = APhase::Fingerprints;
        let m = Msg::Fingerprints { ranges: fps };
        Ok(Step::Send(self.send(&m)))
    }

    /// Decides every winner from the responder's versions.
    fn resolve(
        &mut self,
        replica: &mut Replica,
        present: Vec<Vec<bool>>,
        versions: Vec<VersionRef>,
    ) -> Result<Step, SessionError> {
        if present.len() != self.sent_keys.len() || present.iter().zip(&self.sent_keys).any(|(p, k)| p.len() != k.len())
        {
            return Err(SessionError::Protocol(
                "fingerprint bitmaps do not match what was sent".into(),
            ));
        }
        self.report.versions_sent = versions.len() as u64;
        let mut send: Vec<Entry> = Vec::new();
        let mut want: Vec<Vec<u8>> = Vec::new();
        let mut theirs: BTreeSet<&[u8]> = BTreeSet::new();
        for v in &versions {
            theirs.insert(&v.key);
            match replica.get(&v.key) {
                None => want.push(v.key.clone()),
                Some(mine) => {
                    let v_value = if v.tombstone { None } else { Some(&[][..]) };
                    let order = entry::lww_cmp(mine.ts, mine.value.as_deref().map(|_| &[][..]), v.ts, v_value);
                    match order {
                        // the test-only defect: the peer's version is taken
                        // and written over mine, newer or not
                        Ordering::Greater if replica.defect_repair_overwrites => want.push(v.key.clone()),
                        Ordering::Greater => send.push(mine),
                        Ordering::Less => want.push(v.key.clone()),
                        // same ts and kind: values differ (or both are
                        // tombstones, which cannot differ): both travel
                        Ordering::Equal if mine.value.is_some() => {
                            send.push(mine);
                            want.push(v.key.clone());
                        }
                        Ordering::Equal => {}
                    }
                }
            }
        }
        // my entries the responder does not hold, under keys it did not list:
        // those the fingerprints say it lacks, and the lone entry of every
        // one-to-one range
        // (the current version: a write since the fingerprints were sent is
        // newer, and the responder merges)
        let mut unmatched: Vec<Entry> = Vec::new();
        for (keys, held) in self.sent_keys.iter().zip(&present) {
            for (key, &h) in keys.iter().zip(held) {
                if !h {
                    unmatched.extend(replica.get(key));
                }
            }
        }
        for f in self.walk.both().filter(|f| f.a_class == 1 && f.b_class == 1) {
            unmatched.extend(entries_of(replica, self.walk.final_range(f)));
        }
        send.extend(unmatched.into_iter().filter(|e| !theirs.contains(e.key.as_slice())));
        // ranges the responder has nothing in
        for f in self.walk.finals.iter().filter(|f| f.b_class == 0) {
            send.extend(entries_of(replica, self.walk.final_range(f)));
        }
        self.report.entries_a_to_b += send.len() as u64;
        self.phase = APhase::Stream;
        Ok(Step::Send(self.send(&Msg::Stream { entries: send, want })))
    }

    fn finish(&mut self, replica: &mut Replica) -> Step {
        self.phase = APhase::Done;
        replica.record_repair(self.peer, self.cfg.started_ts);
        Step::Done(self.report.clone())
    }
}

// ---------------------------------------------------------------- responder

/// What the responder accepts next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RPhase {
    Hello,
    /// Sent its lookup table: a set stream comes next, or the walk's
    /// first level if the table did not decode.
    Set,
    Level,
    Fingerprints,
    Stream,
    /// Sent its entries; the repair counts once the initiator says it
    /// merged them.
    Done,
    Finished,
}

pub struct Responder {
    peer: PeerId,
    started_ts: u64,
    limits: Limits,
    phase: RPhase,
    walk: Option<Walk>,
    /// The initiator's hashes of the nodes that descended (for siblings).
    parents: Vec<u64>,
}

impl Responder {
    /// A responder for a session with `peer`, starting at `started_ts`.
    pub fn new(peer: PeerId, started_ts: u64) -> Responder {
        Responder {
            peer,
            started_ts,
            limits: Limits::default(),
            phase: RPhase::Hello,
            walk: None,
            parents: Vec::new(),
        }
    }

    /// What this side takes from the initiator (the default's otherwise);
    /// its clock is `started_ts`.
    pub fn with_limits(mut self, limits: Limits) -> Responder {
        self.limits = limits;
        self
    }

    /// Answers one request. A malformed or out-of-order request gets an
    /// `Error` message (and an `Err` for the driver to log).
    pub fn on_request(&mut self, replica: &mut Replica, bytes: &[u8]) -> Result<Vec<u8>, SessionError> {
        let reply = Msg::decode(bytes)
            .map_err(SessionError::from)
            .and_then(|m| self.handle(replica, m));
        match reply {
            Ok(m) => Ok(m.encode().bytes),
            Err(e) => Err(e),
        }
    }

    /// The session ended: the initiator's `Done` was answered, so the
    /// driver may forget this responder.
    pub fn is_finished(&self) -> bool {
        self.phase == RPhase::Finished
    }

    /// The error reply for a failed request.
    pub fn error_reply(e: &SessionError) -> Vec<u8> {
        Msg::Error { reason: e.to_string() }.encode().bytes
    }

    fn handle(&mut self, replica: &mut Replica, m: Msg) -> Result<Msg, SessionError> {
        match (self.phase, m) {
            (
                RPhase::Hello,
                Msg::Hello {
                    seed,
                    lo,
                    hi,
                    depth,
                    gc_before,
                    row_level,
                    hash_bytes,
                },
            ) => {
                let (mine, gc) = self.open(replica, seed, (lo, hi), depth, gc_before, row_level, hash_bytes)?;
                Ok(Msg::HelloAck {
                    depth: mine,
                    gc_before: gc,
                })
            }
            (
                RPhase::Hello,
                Msg::SetHello {
                    seed,
                    lo,
                    hi,
                    depth,
                    gc_before,
                    row_level,
                    hash_bytes,
                    level,
                    sketch: theirs,
                },
            ) => {
                let (mine, gc) = self.open(replica, seed, (lo, hi), depth, gc_before, row_level, hash_bytes)?;
                if level > SKETCH_LEVEL_MAX || theirs.len() != 1usize << level {
                    return Err(SessionError::Protocol(format!(
                        "a sketch of {} bytes at level {level}",
                        theirs.len()
                    )));
                }
                let buckets = theirs.len() as f64;
                let range = self.walk.as_ref().expect("walk exists").range;
                let ours = sketch(replica, range, seed, level);
                let differing = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count() as f64;
                // nothing differs (or too much): the walk is cheaper
                if differing == 0.0 || differing >= SKETCH_SATURATED * buckets {
                    return Ok(Msg::HelloAck {
                        depth: mine,
                        gc_before: gc,
                    });
                }
                // differing keys from differing buckets (balls into bins);
                // a key differs by up to two fingerprints
                let keys = -buckets * (1.0 - differing / buckets).ln();
                let cells = iblt::cells_for(2.0 * keys);
                if cells > iblt::CELLS_MAX {
                    return Ok(Msg::HelloAck {
                        depth: mine,
                        gc_before: gc,
                    });
                }
                let mut bytes = Vec::new();
                table(replica, range, seed, cells).encode(&mut bytes);
                self.phase = RPhase::Set;
                Ok(Msg::SetAck {
                    depth: mine,
                    gc_before: gc,
                    cells: bytes,
                })
            }
            (RPhase::Set, Msg::SetStream { entries, want }) => {
                let (seed, range) = {
                    let w = self.walk.as_ref().expect("walk exists");
                    (w.seed, w.range)
                };
                self.limits.check_entries(&entries, range, self.started_ts)?;
                let mask = (1u32 << crate::wire::WANT_BITS) - 1;
                let want: BTreeSet<u32> = want.into_iter().collect();
                let back: Vec<Entry> = replica
                    .entries_in(range)
                    .filter(|(_, _, v)| want.contains(&(fp32(seed, &v.digest) & mask)))
                    .map(|(_, k, v)| v.to_entry(k))
                    .collect();
                merge_all(replica, entries);
                self.phase = RPhase::Done;
                Ok(Msg::Entries { entries: back })
            }
            // the table did not decode: the walk, from its first level
            (
                RPhase::Set,
                Msg::Level {
                    level: 0,
                    hashes,
                    classes,
                    ..
                },
            ) => {
                self.phase = RPhase::Level;
                self.level(replica, hashes, classes)
            }
            (
                RPhase::Level,
                Msg::Level {
                    level: l,
                    hashes,
                    classes,
                    ..
                },
            ) if Some(l) == self.walk.as_ref().map(|w| w.level) => self.level(replica, hashes, classes),
            (RPhase::Fingerprints, Msg::Fingerprints { ranges }) => {
                self.phase = RPhase::Stream;
                self.versions(replica, ranges)
            }
            (RPhase::Stream, Msg::Stream { entries, want }) => {
                let walk = self.walk.as_ref().expect("walk exists");
                self.limits.check_entries(&entries, walk.range, self.started_ts)?;
                let back = if walk.row_level {
                    merge_all(replica, entries);
                    want.iter().filter_map(|k| replica.get(k)).collect()
                } else {
                    let mut back = Vec::new();
                    for f in &walk.finals {
                        back.extend(entries_of(replica, walk.final_range(f)));
                    }
                    merge_all(replica, entries);
                    back
                };
                self.phase = RPhase::Done;
                Ok(Msg::Entries { entries: back })
            }
            (RPhase::Done, Msg::Done) => {
                self.finish(replica);
                Ok(Msg::DoneAck)
            }
            (phase, m) => Err(SessionError::Protocol(format!(
                "unexpected {} in phase {phase:?}",
                msg_name(&m)
            ))),
        }
    }

    /// Checks a hello, agrees the GC horizon and starts the walk; returns
    /// this side's tree depth and the horizon.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        replica: &mut Replica,
        seed: u64,
        (lo, hi): (u64, u64),
        depth: u32,
        gc_before: u64,
        row_level: bool,
        hash_bytes: u8,
    ) -> Result<(u32, u64), SessionError> {
        if !(1..=8).contains(&hash_bytes) {
            return Err(SessionError::Protocol(format!("hash width {hash_bytes} out of 1..=8")));
        }
        let own = replica.range();
        let r = match TokenRange::new(lo, hi) {
            Some(r) if own.lo <= r.lo && r.hi <= own.hi => r,
            _ => {
                return Err(SessionError::Protocol(format!(
                    "range [{lo}, {hi}) is not within this replica's [{}, {})",
                    own.lo, own.hi
                )))
            }
        };
        self.limits.check_horizon(gc_before, self.started_ts)?;
        let gc = gc_before.max(replica.gc_horizon());
        replica.purge_tombstones_before(gc);
        let mine = replica.tree().depth();
        self.walk = Some(Walk::over(replica, r, seed, depth.min(mine), row_level, hash_bytes));
        self.phase = RPhase::Level;
        Ok((mine, gc))
    }

    fn level(&mut self, replica: &mut Replica, hashes: Vec<u64>, a_classes: Vec<u8>) -> Result<Msg, SessionError> {
        let walk = self.walk.as_mut().expect("walk exists");
        let level = walk.level;
        let n = walk.frontier.len();
        let derived = walk.sibling_derived(level);
        let expect_hashes = if derived { n / 2 } else { n };
        if hashes.len() != expect_hashes || a_classes.len() != n || (derived && self.parents.len() != n / 2) {
            return Err(SessionError::Protocol(format!(
                "level {level}: {} hashes for {n} nodes",
                hashes.len()
            )));
        }
        let a_hashes: Vec<u64> = if derived {
            hashes
                .iter()
                .zip(&self.parents)
                .flat_map(|(&left, &parent)| [left, parent ^ left])
                .collect()
        } else {
            hashes
        };
        let mine: Vec<(u64, u8)> = walk.frontier.iter().map(|&i| walk.node(replica, level, i)).collect();
        let mismatch: Vec<bool> = mine.iter().zip(&a_hashes).map(|((h, _), a)| h != a).collect();
        let b_classes: Vec<u8> = mine.iter().map(|(_, c)| *c).collect();
        // remember the initiator's hashes of the nodes that descend
        let frontier = walk.frontier.clone();
        self.parents = frontier
            .iter()
            .enumerate()
            .filter(|&(k, &i)| walk.decide(i, mismatch[k], a_classes[k], b_classes[k]) == Decision::Descend)
            .map(|(k, _)| a_hashes[k])
            .collect();
        walk.advance(&mismatch, &a_classes, &b_classes);
        if walk.frontier.is_empty() {
            if walk.finals.is_empty() {
                // nothing differs: the trees agree right now
                self.finish(replica);
            } else {
                self.phase = if walk.row_level {
                    RPhase::Fingerprints
                } else {
                    RPhase::Stream
                };
            }
        }
        let classes = b_classes
            .iter()
            .zip(&mismatch)
            .filter(|(_, &m)| m)
            .map(|(&c, _)| c)
            .collect();
        Ok(Msg::LevelAck { mismatch, classes })
    }

    fn versions(&mut self, replica: &Replica, ranges: Vec<Vec<u64>>) -> Result<Msg, SessionError> {
        let walk = self.walk.as_ref().expect("walk exists");
        let fingerprinted: Vec<Final> = walk.fingerprinted().copied().collect();
        if ranges.len() != fingerprinted.len() {
            return Err(SessionError::Protocol(format!(
                "{} fingerprint lists for {} ranges",
                ranges.len(),
                fingerprinted.len()
            )));
        }
        let mut present = Vec::with_capacity(fingerprinted.len());
        let mut versions = Vec::new();
        for f in walk.both().filter(|f| f.a_class == 1 && f.b_class == 1) {
            for (_, k, v) in replica.entries_in(walk.final_range(f)) {
                versions.push(VersionRef {
                    key: k.to_vec(),
                    ts: v.ts,
                    tombstone: v.value.is_none(),
                });
            }
        }
        for (f, theirs) in fingerprinted.iter().zip(&ranges) {
            let mut mine: BTreeMap<u64, (&[u8], u64, bool)> = BTreeMap::new();
            for (_, k, v) in replica.entries_in(walk.final_range(f)) {
                mine.insert(fingerprint(walk.seed, &v.digest), (k, v.ts, v.value.is_none()));
            }
            let theirs_set: BTreeSet<u64> = theirs.iter().copied().collect();
            present.push(theirs.iter().map(|fp| mine.contains_key(fp)).collect());
            for (fp, (k, ts, tomb)) in &mine {
                if !theirs_set.contains(fp) {
                    versions.push(VersionRef {
                        key: k.to_vec(),
                        ts: *ts,
                        tombstone: *tomb,
                    });
                }
            }
        }
        let mut entries = Vec::new();
        for f in walk.finals.iter().filter(|f| f.a_class == 0) {
            entries.extend(entries_of(replica, walk.final_range(f)));
        }
        Ok(Msg::Versions {
            present,
            versions,
            entries,
        })
    }

    fn finish(&mut self, replica: &mut Replica) {
        self.phase = RPhase::Finished;
        replica.record_repair(self.peer, self.started_ts);
    }
}

/// Classes for every node from those sent for the mismatched ones (the
/// others are never looked at: a matching node is done).
fn expand_classes(mismatch: &[bool], sent: &[u8]) -> Vec<u8> {
    let mut it = sent.iter();
    mismatch
        .iter()
        .map(|&m| if m { *it.next().expect("counted") } else { 0 })
        .collect()
}

fn msg_name(m: &Msg) -> &'static str {
    match m {
        Msg::Hello { .. } => "hello",
        Msg::HelloAck { .. } => "hello ack",
        Msg::SetHello { .. } => "set hello",
        Msg::SetAck { .. } => "set ack",
        Msg::SetStream { .. } => "set stream",
        Msg::Level { .. } => "level",
        Msg::LevelAck { .. } => "level ack",
        Msg::Fingerprints { .. } => "fingerprints",
        Msg::Versions { .. } => "versions",
        Msg::Stream { .. } => "stream",
        Msg::Entries { .. } => "entries",
        Msg::Done => "done",
        Msg::DoneAck => "done ack",
        Msg::Error { .. } => "error",
    }
}

/// Runs a whole session in memory between `a` (initiator, peer id `id_a`)
/// and `b` (responder, `id_b`).
pub fn run(
    a: &mut Replica,
    id_a: PeerId,
    b: &mut Replica,
    id_b: PeerId,
    cfg: SessionConfig,
) -> Result<Report, SessionError> {
    let (mut init, mut msg) = Initiator::start(a, id_b, cfg);
    let mut resp = Responder::new(id_a, cfg.started_ts);
    // a session is at most hello + DEPTH_MAX+1 levels + 3 rounds
    for _ in 0..(DEPTH_MAX + 8) {
        let reply = match resp.on_request(b, &msg) {
            Ok(r) => r,
            Err(e) => Responder::error_reply(&e),
        };
        match init.on_reply(a, &reply)? {
            Step::Send(next) => msg = next,
            Step::Done(report) => return Ok(report),
        }
    }
    Err(SessionError::RoundLimit)
}
