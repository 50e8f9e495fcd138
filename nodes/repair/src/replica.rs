//! A leaderless LWW key/value replica of one token range, with its Merkle
//! tree kept up to date on every write.
//!
//! Every write is a merge: a version is applied only if it wins LWW over
//! the local one, so a repair stream can never overwrite a newer local
//! write, and applying the same entries in any order gives the same
//! state. Entries are ordered by (token, key), so a token range is one
//! contiguous scan.
//!
//! Invariant: the tree equals a tree built from scratch over the entries
//! (tested), and `gc_horizon` only grows.

use crate::entry::{self, Digest, Entry};
use crate::range::TokenRange;
use crate::token::token;
use crate::tree::MerkleTree;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One stored version, with its digest cached (the tree update needs the
/// old digest, and the session fingerprints it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub ts: u64,
    pub value: Option<Vec<u8>>,
    pub digest: Digest,
}

impl Version {
    /// This version as the entry of `key`.
    pub fn to_entry(&self, key: &[u8]) -> Entry {
        Entry {
            key: key.to_vec(),
            ts: self.ts,
            value: self.value.clone(),
        }
    }
}

/// Identifies a peer replica for repair-gated GC.
pub type PeerId = u64;

#[derive(Debug, Clone)]
pub struct Replica {
    range: TokenRange,
    entries: BTreeMap<(u32, Vec<u8>), Version>,
    tree: MerkleTree,
    /// Tombstones older than this have been purged here.
    gc_horizon: u64,
    /// Per peer: start time of the last repair session with it that
    /// completed (everything written before then is on both sides).
    repaired_with: BTreeMap<PeerId, u64>,
    /// What changed since the driver last took it, when it asked for a
    /// journal (a server logs every change before it counts as durable).
    journal: Option<Vec<Change>>,
    /// A test-only defect: a repair writes what it receives over the local
    /// version instead of merging it (never on unless a test or a fault
    /// hook turns it on).
    pub defect_repair_overwrites: bool,
}

/// One change to a replica, as its journal records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A version that was applied (it won LWW, or a defect wrote it).
    Applied(Entry),
    /// Tombstones older than this were purged.
    Purged { before: u64 },
    /// A repair session with `peer` that started at `started_ts` completed.
    Repaired { peer: PeerId, started_ts: u64 },
}

/// What a merge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged {
    Applied,
    /// The local version wins or is the same.
    Kept,
    /// The key's token is outside this replica's range.
    OutOfRange,
}

impl Replica {
    pub fn new(range: TokenRange, depth: u32) -> Replica {
        Replica {
            range,
            entries: BTreeMap::new(),
            tree: MerkleTree::new(range, depth),
            gc_horizon: 0,
            repaired_with: BTreeMap::new(),
            journal: None,
            defect_repair_overwrites: false,
        }
    }

    /// Starts recording every change for [`Replica::take_journal`].
    pub fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The changes since the last call (empty without a journal).
    pub fn take_journal(&mut self) -> Vec<Change> {
        self.journal.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn journal(&mut self, c: Change) {
        if let Some(j) = &mut self.journal {
            j.push(c);
        }
    }

    pub fn range(&self) -> TokenRange {
        self.range
    }

    pub fn tree(&self) -> &MerkleTree {
        &self.tree
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn gc_horizon(&self) -> u64 {
        self.gc_horizon
    }

    pub fn get(&self, key: &[u8]) -> Option<Entry> {
        Some(self.entries.get(&(token(key), key.to_vec()))?.to_entry(key))
    }

    /// Merges a version of a key (a client write, or a repair stream).
    pub fn merge(&mut self, e: Entry) -> Merged {
        self.write(e, false)
    }

    /// Merges a version a repair received — or, under the test-only
    /// defect, writes it over whatever is here.
    pub fn merge_repaired(&mut self, e: Entry) -> Merged {
        let blindly = self.defect_repair_overwrites;
        self.write(e, blindly)
    }

    /// Writes a version as a log replay does: the log holds the changes
    /// in the order they were applied, so each is written over what is
    /// here (a replay then rebuilds exactly the state that was logged).
    pub fn restore(&mut self, e: Entry) -> Merged {
        self.write(e, true)
    }

    /// Every peer with a completed session, and that session's start.
    pub fn repaired_peers(&self) -> impl Iterator<Item = (PeerId, u64)> + '_ {
        self.repaired_with.iter().map(|(p, t)| (*p, *t))
    }

    fn write(&mut self, e: Entry, blindly: bool) -> Merged {
        let t = token(&e.key);
        if !self.range.contains(t) {
            return Merged::OutOfRange;
        }
        let k = (t, e.key);
        if let Some(old) = self.entries.get(&k) {
            let order = entry::lww_cmp(e.ts, e.value.as_deref(), old.ts, old.value.as_deref());
            if order == Ordering::Equal || (order == Ordering::Less && !blindly) {
                return Merged::Kept;
            }
        }
        if self.journal.is_some() {
            self.journal(Change::Applied(Entry {
                key: k.1.clone(),
                ts: e.ts,
                value: e.value.clone(),
            }));
        }
        let digest = entry::digest(&k.1, e.ts, e.value.as_deref());
        let new = Version {
            ts: e.ts,
            value: e.value,
            digest,
        };
        let old = self.entries.insert(k, new);
        self.tree.update(t, old.as_ref().map(|v| &v.digest), Some(&digest));
        Merged::Applied
    }

    /// Entries in a token range, in (token, key) order.
    pub fn entries_in(&self, r: TokenRange) -> impl Iterator<Item = (u32, &[u8], &Version)> {
        // a valid range has lo < hi <= 2^32, so lo fits a token
        let start = (r.lo.min(u32::MAX as u64) as u32, Vec::new());
        self.entries
            .range(start..)
            .take_while(move |((t, _), _)| (*t as u64) < r.hi)
            .map(|((t, k), v)| (*t, k.as_slice(), v))
    }

    /// Every entry, in (token, key) order.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        self.entries.iter().map(|((_, k), v)| v.to_entry(k))
    }

    /// Removes tombstones with ts < `before` and raises the GC horizon.
    /// Returns how many were purged.
    pub fn purge_tombstones_before(&mut self, before: u64) -> usize {
        // no timestamp is below 0: no scan
        if before == 0 {
            return 0;
        }
        let doomed: Vec<(u32, Vec<u8>)> = self
            .entries
            .iter()
            .filter(|(_, v)| v.value.is_none() && v.ts < before)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &doomed {
            let v = self.entries.remove(k).expect("doomed entry exists");
            self.tree.update(k.0, Some(&v.digest), None);
        }
        self.gc_horizon = self.gc_horizon.max(before);
        self.journal(Change::Purged { before });
        doomed.len()
    }

    /// Records that a session with `peer` that started at `started_ts`
    /// completed.
    pub fn record_repair(&mut self, peer: PeerId, started_ts: u64) {
        let e = self.repaired_with.entry(peer).or_insert(0);
        *e = (*e).max(started_ts);
        self.journal(Change::Repaired { peer, started_ts });
    }

    /// Start time of the last completed session with `peer` (0: never).
    pub fn repaired_with(&self, peer: PeerId) -> u64 {
        self.repaired_with.get(&peer).copied().unwrap_or(0)
    }

    /// The same replica with a tree of another depth (built from the
    /// cached digests, no rehashing).
    pub fn with_depth(&self, depth: u32) -> Replica {
        let tree = MerkleTree::build(
            self.range,
            depth,
            self.entries.iter().map(|((t, _), v)| (*t, &v.digest)),
        );
        Replica { tree, ..self.clone() }
    }

    /// Rebuilds the tree from the entries (the reference the incremental
    /// upkeep is tested against).
    pub fn rebuilt_tree(&self) -> MerkleTree {
        MerkleTree::build(
            self.range,
            self.tree.depth(),
            self.entries.iter().map(|((t, _), v)| (*t, &v.digest)),
        )
    }
}
