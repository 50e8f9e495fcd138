//! Raft's `Storage` on the keeper's changelog and snapshots.
//!
//! Each Raft entry is stored whole (its protobuf bytes) as one changelog
//! record, so type and context survive. The hard state lives in
//! `raft_state`, replaced atomically. The newest keeper snapshot doubles as
//! Raft's snapshot (its file bytes are what a lagging follower receives).
//!
//! Obligations of the driver: call [`RaftLog::append`] and
//! [`RaftLog::set_hard_state`] before sending `persisted_messages`
//! (both return only after fsync); build a snapshot when
//! [`RaftLog::snapshot_wanted`] says a peer asked for a newer one.
//!
//! Index window: `first_index` is the first record whose predecessor's
//! term is known (a record or the snapshot); entries kept below the
//! snapshot (`reserved_log_items`) stay readable so a follower slightly
//! behind catches up by log rather than by snapshot.

use crate::changelog::{self, Changelog, ChangelogError, LogRecord};
use crate::disk::Disk;
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use std::cell::Cell;

/// The Raft log's storage failed: the changelog, the hard state file, or
/// the entries it holds.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("changelog: {0}")]
    Changelog(#[from] ChangelogError),
    #[error("{file}: {source}")]
    Io { file: &'static str, source: std::io::Error },
    #[error("{0} is corrupt")]
    Corrupt(&'static str),
    /// An entry read back from the log does not parse.
    #[error("log entry {index}: {reason}")]
    Entry { index: u64, reason: String },
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
}

pub const HARD_STATE: &str = "raft_state";
const HARD_STATE_TMP: &str = "raft_state.tmp";

pub struct RaftLog<D: Disk> {
    pub disk: D,
    changelog: Changelog,
    hard_state: HardState,
    conf_state: ConfState,
    snapshot_index: u64,
    snapshot_term: u64,
    /// Whether a snapshot file stands at (snapshot_index, snapshot_term):
    /// what a lagging follower is sent, read from disk when it is (a large
    /// tree's snapshot is not also held in memory).
    has_snapshot: bool,
    /// A peer asked for a snapshot newer than the one held.
    wanted: Cell<u64>,
    /// (term, vote) as last made durable.
    persisted: (u64, u64),
    /// The first entry written by [`RaftLog::append_unsynced`] and not
    /// yet known durable ([`RaftLog::synced_through`]): the commit index
    /// written to disk stays below it, so a crash never leaves a hard
    /// state committing past the log that survived it.
    unsynced_from: Option<u64>,
}

fn err(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

impl<D: Disk> RaftLog<D> {
    /// Opens the log in `disk` for a cluster of `voters`, after the newest
    /// snapshot (index, term; its file in `disk`) if there is one. Also says whether the
    /// node has no Raft state at all (a new node, or one whose data was
    /// dropped): then it may have voted in a term it no longer knows.
    pub fn open(
        mut disk: D,
        voters: Vec<u64>,
        cfg: changelog::Config,
        snapshot: Option<(u64, u64)>,
    ) -> Result<(RaftLog<D>, changelog::LoadReport, bool), StoreError> {
        let (mut log, report) = Changelog::open(&mut disk, cfg)?;
        let (hard_state, fresh) = match disk.read(HARD_STATE) {
            Ok(bytes) => (decode_hard_state(&bytes).ok_or(StoreError::Corrupt(HARD_STATE))?, false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (HardState::default(), true),
            Err(source) => {
                return Err(StoreError::Io {
                    file: HARD_STATE,
                    source,
                })
            }
        };
        let has_snapshot = snapshot.is_some();
        let (snapshot_index, snapshot_term) = snapshot.unwrap_or((0, 0));
        // a snapshot holds only applied, so committed, entries: a crash
        // after its file was renamed into place but before the commit index
        // behind it was persisted leaves the hard state behind it, and raft
        // refuses a commit index below the snapshot's
        let mut hard_state = hard_state;
        hard_state.commit = hard_state.commit.max(snapshot_index);
        // a log that ends before the snapshot is useless: start after it
        if log.last_index().is_none_or(|l| l < snapshot_index) || log.start_index() > snapshot_index + 1 {
            log.reset(&mut disk, snapshot_index + 1)?;
        }
        let conf_state = ConfState {
            voters,
            ..ConfState::default()
        };
        Ok((
            RaftLog {
                disk,
                changelog: log,
                conf_state,
                snapshot_index,
                snapshot_term,
                has_snapshot,
                wanted: Cell::new(0),
                persisted: (hard_state.term, hard_state.vote),
                hard_state,
                unsynced_from: None,
            },
            report,
            fresh,
        ))
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn snapshot_index(&self) -> u64 {
        self.snapshot_index
    }

    /// The highest index a peer asked a snapshot for and did not get.
    pub fn snapshot_wanted(&self) -> u64 {
        self.wanted.get()
    }

    /// Appends entries (overwriting a conflicting suffix); returns after fsync.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
        self.append_unsynced(entries)?;
        self.sync_unsynced()
    }

    /// Syncs what [`RaftLog::append_unsynced`] left unsynced: the last
    /// segment, whose sync covers it all (the segments before it were
    /// synced as the log left them).
    pub fn sync_unsynced(&mut self) -> Result<(), StoreError> {
        if self.unsynced_from.is_some() {
            if let Some(name) = self.changelog.last_segment() {
                crate::changelog::sync_left(&mut self.disk, name)?;
            }
            self.unsynced_from = None;
        }
        Ok(())
    }

    /// Appends entries as [`RaftLog::append`] does, but leaves the last
    /// segment's sync to the caller: returns the file to sync before
    /// anything that depends on these entries being durable (an
    /// acknowledgement, a vote) goes out. Raft reads them back from here
    /// at once, durable or not.
    /// A conflicting suffix is cut and the cut synced before this
    /// returns, so what is unsynced afterwards starts at the first entry
    /// written; a caller that counts on [`RaftLog::synced_through`] for
    /// earlier writes must not cut (the server syncs inline then).
    pub fn append_unsynced(&mut self, entries: &[Entry]) -> Result<Option<String>, StoreError> {
        let Some(first) = entries.first().map(|e| e.index) else {
            return Ok(None);
        };
        if first < self.changelog.next_index() {
            self.unsynced_from = Some(first);
        } else {
            self.unsynced_from.get_or_insert(first);
        }
        let records: Vec<LogRecord> = entries
            .iter()
            .map(|e| LogRecord {
                index: e.index,
                term: e.term,
                kind: e.entry_type as u8,
                data: e.write_to_bytes().expect("raft entries encode"),
            })
            .collect();
        Ok(self.changelog.append_unsynced(&mut self.disk, &records)?)
    }

    /// The bytes the log's last segment holds, as written.
    pub fn tail_len(&self) -> u64 {
        self.changelog.tail_len()
    }

    /// The index the next appended entry gets.
    pub fn next_index(&self) -> u64 {
        self.changelog.next_index()
    }

    /// The entries up to `last` are durable now (a sync of the log that
    /// began after they were written ended).
    pub fn synced_through(&mut self, last: u64) {
        if self.unsynced_from.is_some_and(|u| u <= last) {
            self.unsynced_from = (last < self.changelog.next_index().saturating_sub(1)).then_some(last + 1);
        }
    }

    /// Records the hard state. Term and vote are made durable (atomic
    /// replace, fsync) before this returns whenever they change; the commit
    /// index alone is kept in memory and written with the next durable
    /// write — it is only a hint on restart (the leader re-teaches it), and
    /// an fsync per commit would double the cost of every write.
    pub fn set_hard_state(&mut self, hs: HardState) -> Result<(), StoreError> {
        let durable = hs.term != self.persisted.0 || hs.vote != self.persisted.1;
        self.hard_state = hs;
        if durable {
            self.persist_hard_state()?;
        }
        Ok(())
    }

    /// Writes the hard state (term, vote, commit) durably. The commit
    /// index written stops before entries not yet durable: Raft may know
    /// an index committed that this log has written but not synced.
    pub fn persist_hard_state(&mut self) -> Result<(), StoreError> {
        let hs = &self.hard_state;
        let commit = match self.unsynced_from {
            Some(u) => hs.commit.min(u - 1),
            None => hs.commit,
        };
        let mut b = Vec::with_capacity(28);
        b.extend_from_slice(&hs.term.to_be_bytes());
        b.extend_from_slice(&hs.vote.to_be_bytes());
        b.extend_from_slice(&commit.to_be_bytes());
        let crc = crc(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        let io = |source| StoreError::Io {
            file: HARD_STATE,
            source,
        };
        self.disk.write(HARD_STATE_TMP, &b).map_err(io)?;
        self.disk.sync(HARD_STATE_TMP).map_err(io)?;
        self.disk.rename(HARD_STATE_TMP, HARD_STATE).map_err(io)?;
        self.persisted = (hs.term, hs.vote);
        Ok(())
    }

    /// Records a snapshot this node made or installed (its file written to
    /// the disk as [`snapshot::file_name`] names it), and drops log
    /// segments it covers (keeping `reserved_log_items`).
    pub fn set_snapshot(&mut self, index: u64, term: u64) -> Result<(), StoreError> {
        self.snapshot_index = index;
        self.snapshot_term = term;
        self.has_snapshot = true;
        if self.wanted.get() <= index {
            self.wanted.set(0);
        }
        if self.changelog.last_index().is_none_or(|l| l < index) {
            // installed from the leader: everything before is superseded
            self.changelog.reset(&mut self.disk, index + 1)?;
            self.unsynced_from = None;
        } else {
            self.changelog.compact(&mut self.disk, index)?;
        }
        if self.hard_state.commit < index {
            self.hard_state.commit = index;
        }
        // the snapshot's index must be a commit index a restart can trust
        self.persist_hard_state()
    }

    fn record_term(&self, idx: u64) -> Option<u64> {
        self.changelog.term(idx)
    }

    /// Bytes of log entries held in memory.
    pub fn cached_bytes(&self) -> usize {
        self.changelog.cached_bytes()
    }
}

fn crc(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

fn decode_hard_state(b: &[u8]) -> Option<HardState> {
    if b.len() != 28 || crc(&b[..24]).to_be_bytes() != b[24..28] {
        return None;
    }
    let w = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Some(HardState {
        term: w(0),
        vote: w(8),
        commit: w(16),
        ..HardState::default()
    })
}

impl<D: Disk> raft::Storage for RaftLog<D> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState {
            hard_state: self.hard_state.clone(),
            conf_state: self.conf_state.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index()? {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index()? + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        // an entry no longer cached is read back from its segment; a read
        // that fails is this server's own disk failing, which raft treats
        // as fatal (the process stops, naming the file)
        for i in low..high {
            let Some(r) = self.changelog.get(&self.disk, i).map_err(err)? else {
                break;
            };
            let e = Entry::parse_from_bytes(&r.data).map_err(err)?;
            size += r.data.len() as u64;
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e);
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot_index {
            return Ok(self.snapshot_term);
        }
        if let Some(t) = self.record_term(idx) {
            return Ok(t);
        }
        if idx < self.first_index()? {
            Err(raft::Error::Store(StorageError::Compacted))
        } else {
            Err(raft::Error::Store(StorageError::Unavailable))
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        let start = self.changelog.start_index();
        Ok(
            if start <= self.snapshot_index && self.changelog.last_index().is_some() {
                start + 1
            } else {
                self.snapshot_index + 1
            },
        )
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self
            .changelog
            .last_index()
            .unwrap_or(self.snapshot_index)
            .max(self.snapshot_index))
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_index < request_index || !self.has_snapshot {
            self.wanted.set(self.wanted.get().max(request_index.max(1)));
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        let name = crate::snapshot::file_name(self.snapshot_index, self.snapshot_term);
        let bytes = self
            .disk
            .read(&name)
            .map_err(|e| err(format!("snapshot {name}: {e}")))?;
        let mut s = Snapshot {
            data: bytes.into(),
            ..Snapshot::default()
        };
        let meta = s.mut_metadata();
        meta.index = self.snapshot_index;
        meta.term = self.snapshot_term;
        meta.set_conf_state(self.conf_state.clone());
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::MemDisk;
    use raft::Storage;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: vec![index as u8; 3].into(),
            context: b"ctx".to_vec().into(),
            ..Entry::default()
        }
    }

    const CFG: changelog::Config = changelog::Config {
        rotate_interval: 4,
        reserved_log_items: 2,
        zstd_level: 1,
        // about one entry: every older one is read back from its segment
        cache_bytes: 16,
        reserve_bytes: 0,
    };

    /// A new log on an in-memory disk holding entries 1..=10 of term 1
    /// and the hard state (term, vote, commit).
    fn ten_entries(hs: (u64, u64, u64)) -> RaftLog<MemDisk> {
        let (mut log, _, fresh) = RaftLog::open(MemDisk::new(), vec![1, 2, 3], CFG, None).unwrap();
        assert!(fresh, "no raft state yet");
        log.append(&(1..=10).map(|i| entry(i, 1)).collect::<Vec<_>>()).unwrap();
        let (term, vote, commit) = hs;
        log.set_hard_state(HardState {
            term,
            vote,
            commit,
            ..HardState::default()
        })
        .unwrap();
        log
    }

    /// A term change synced while appended entries wait for their sync
    /// (a follower's first append from a new leader, commit index
    /// included): a crash then must not leave a hard state that commits
    /// past the log that survived, which the server refuses to start on.
    #[test]
    fn a_hard_state_synced_before_the_entries_commits_no_further_than_the_durable_log() {
        let mut log = ten_entries((1, 1, 10));
        // 11 and 12 go to the segment of 9..=12 (four entries a segment)
        let left = log
            .append_unsynced(&(11..=12).map(|i| entry(i, 2)).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(left, Some(crate::changelog::segment_name(9)));
        let hs = |commit| HardState {
            term: 2,
            vote: 0,
            commit,
            ..HardState::default()
        };
        log.set_hard_state(hs(12)).unwrap();
        assert_eq!(log.hard_state().commit, 12, "Raft's own view is kept");
        let mut disk = log.disk.clone();
        disk.crash();
        let (back, _, _) = RaftLog::open(disk, vec![1, 2, 3], CFG, None).unwrap();
        assert_eq!(back.last_index().unwrap(), 10);
        assert_eq!((back.hard_state().term, back.hard_state().commit), (2, 10));
        // once the entries are synced the commit index goes to disk whole
        log.disk.sync(&crate::changelog::segment_name(9)).unwrap();
        log.synced_through(12);
        log.persist_hard_state().unwrap();
        let mut disk = log.disk.clone();
        disk.crash();
        let (back, _, _) = RaftLog::open(disk, vec![1, 2, 3], CFG, None).unwrap();
        assert_eq!((back.last_index().unwrap(), back.hard_state().commit), (12, 12));
    }

    #[test]
    fn entries_hard_state_and_snapshot_window_survive_a_reopen() {
        let mut log = ten_entries((2, 3, 9));
        let cfg = CFG;
        assert_eq!(
            log.entries(3, 5, None, GetEntriesContext::empty(false)).unwrap(),
            [entry(3, 1), entry(4, 1)]
        );
        let name = crate::snapshot::file_name(8, 1);
        log.disk.write(&name, b"snap").unwrap();
        log.disk.sync(&name).unwrap();
        log.set_snapshot(8, 1).unwrap();
        assert!(log.cached_bytes() <= 16, "{} bytes cached", log.cached_bytes());
        // two reserved items below the snapshot stay readable: the first
        // index moves up from 1 to 6
        assert_eq!(
            log.first_index().unwrap(),
            6,
            "the segment below the reserved items went"
        );
        assert_eq!(log.term(8).unwrap(), 1);
        let mut disk = log.disk;
        disk.crash();
        let (log, _, fresh) = RaftLog::open(disk, vec![1, 2, 3], cfg, Some((8, 1))).unwrap();
        assert!(!fresh);
        // commit 10 was never made durable on its own; the snapshot made 9
        assert_eq!(log.hard_state().commit, 9);
        assert_eq!(log.last_index().unwrap(), 10);
        assert_eq!(
            log.entries(9, 11, None, GetEntriesContext::empty(false)).unwrap(),
            [entry(9, 1), entry(10, 1)]
        );
        let snap = log.snapshot(8, 2).unwrap();
        assert_eq!((snap.get_metadata().index, &snap.data[..]), (8, &b"snap"[..]));
        assert!(log.snapshot(9, 2).is_err());
        assert_eq!(log.snapshot_wanted(), 9);
    }

    #[test]
    fn a_snapshot_newer_than_the_persisted_commit_index_raises_it() {
        let log = ten_entries((1, 1, 3));
        let cfg = CFG;
        let mut disk = log.disk;
        disk.crash();
        // the snapshot at 8 reached the disk, its commit index did not
        let (log, _, _) = RaftLog::open(disk, vec![1], cfg, Some((8, 1))).unwrap();
        assert_eq!(log.hard_state().commit, 8);
        assert_eq!(log.initial_state().unwrap().hard_state.commit, 8);
    }
}
