//! One kv server's data: a [`Replica`] for every range of the ring it
//! holds, each journaled so the driver can log every change before it
//! acknowledges it, and rebuilt from that log at start.
//!
//! Pure: the driver brings the clock (`now_ts`, microseconds, the same
//! clock that stamps writes) and does the files and the network.
//!
//! Invariants: a server holds exactly the ranges the ring gives it; a
//! write to a key of a range it does not hold changes nothing and says so;
//! replaying the records [`KvStore::take_records`] returned, in order,
//! onto an empty store rebuilds the same entries, GC horizons and repair
//! times (tested).

use crate::entry::Entry;
use crate::gc::{self, GcPolicy};
use crate::replica::{Change, Merged, Replica};
use crate::ring::Ring;
use crate::wal::Record;
use std::collections::BTreeMap;

/// How tombstones are collected, as the cluster file chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcMode {
    /// Older than `grace`: a replica not repaired within it may resurrect.
    Time,
    /// Older than `grace` and than the last completed repair with every
    /// other replica of the range.
    Repair,
}

#[derive(Debug, Clone)]
pub struct KvStore {
    server: u64,
    ring: Ring,
    replicas: BTreeMap<usize, Replica>,
}

/// A range's state for the final reads: its Merkle root and entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeDump {
    pub range: usize,
    /// The root hash as 64 hex digits, and its entry count.
    pub root: String,
    pub count: u64,
    pub entries: Vec<Entry>,
}

impl KvStore {
    pub fn new(server: u64, ring: Ring, depth: u32) -> KvStore {
        let replicas = ring
            .ranges_of(server)
            .into_iter()
            .map(|j| {
                let mut r = Replica::new(ring.range(j), depth);
                r.keep_journal();
                (j, r)
            })
            .collect();
        KvStore { server, ring, replicas }
    }

    pub fn server(&self) -> u64 {
        self.server
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Ranges this server holds, ascending.
    pub fn ranges(&self) -> Vec<usize> {
        self.replicas.keys().copied().collect()
    }

    pub fn replica(&self, range: usize) -> Option<&Replica> {
        self.replicas.get(&range)
    }

    pub fn replica_mut(&mut self, range: usize) -> Option<&mut Replica> {
        self.replicas.get_mut(&range)
    }

    /// Merges a write; `OutOfRange` when this server does not hold its key.
    pub fn merge(&mut self, e: Entry) -> Merged {
        let j = self.ring.range_of_key(&e.key);
        match self.replicas.get_mut(&j) {
            Some(r) => r.merge(e),
            None => Merged::OutOfRange,
        }
    }

    /// This server's version of `key`; `Err` when it does not hold it.
    pub fn get(&self, key: &[u8]) -> Result<Option<Entry>, usize> {
        let j = self.ring.range_of_key(key);
        self.replicas.get(&j).map(|r| r.get(key)).ok_or(j)
    }

    /// Every change since the last call, as log records, in the order
    /// they happened within each range.
    pub fn take_records(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        for (&j, r) in &mut self.replicas {
            out.extend(r.take_journal().into_iter().map(|change| Record {
                range: j as u32,
                change,
            }));
        }
        out
    }

    /// Applies logged records (at start, before serving). Records of a
    /// range this server does not hold are skipped and counted.
    pub fn replay(&mut self, records: impl IntoIterator<Item = Record>) -> usize {
        let mut skipped = 0;
        for rec in records {
            let Some(r) = self.replicas.get_mut(&(rec.range as usize)) else {
                skipped += 1;
                continue;
            };
            match rec.change {
                Change::Applied(e) => {
                    r.restore(e);
                }
                Change::Purged { before } => {
                    r.purge_tombstones_before(before);
                }
                Change::Repaired { peer, started_ts } => r.record_repair(peer, started_ts),
            }
        }
        // what the replay itself journaled is already in the log
        self.take_records();
        skipped
    }

    /// The whole state as records: a compacted log that replays to it.
    pub fn image(&self) -> Vec<Record> {
        let mut out = Vec::new();
        for (&j, r) in &self.replicas {
            let range = j as u32;
            out.push(Record {
                range,
                change: Change::Purged { before: r.gc_horizon() },
            });
            for (peer, started_ts) in r.repaired_peers() {
                out.push(Record {
                    range,
                    change: Change::Repaired { peer, started_ts },
                });
            }
            out.extend(r.entries().map(|e| Record {
                range,
                change: Change::Applied(e),
            }));
        }
        out
    }

    /// A GC pass at `now_ts`: purges the tombstones `mode` allows with
    /// `grace` (microseconds). Returns tombstones purged per range.
    pub fn collect_garbage(&mut self, mode: GcMode, grace: u64, now_ts: u64) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (&j, r) in &mut self.replicas {
            let policy = match mode {
                GcMode::Time => GcPolicy::Time { grace },
                GcMode::Repair => GcPolicy::RepairGated {
                    grace,
                    peers: self
                        .ring
                        .replicas(j)
                        .into_iter()
                        .filter(|&p| p != self.server)
                        .collect(),
                },
            };
            out.push((j, gc::collect(r, &policy, now_ts)));
        }
        out
    }

    /// Every range's root and entries.
    pub fn dump(&self) -> Vec<RangeDump> {
        self.replicas
            .iter()
            .map(|(&j, r)| {
                let (hash, count) = r.tree().root();
                RangeDump {
                    range: j,
                    root: hash.iter().map(|w| format!("{w:016x}")).collect(),
                    count,
                    entries: r.entries().collect(),
                }
            })
            .collect()
    }

    /// Turns the test-only repair defect on or off on every range.
    pub fn set_defect_repair_overwrites(&mut self, on: bool) {
        for r in self.replicas.values_mut() {
            r.defect_repair_overwrites = on;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal;

    fn store(server: u64) -> KvStore {
        KvStore::new(server, Ring::new(vec![1, 2, 3, 4], 2).unwrap(), 6)
    }

    fn key_of_range(s: &KvStore, j: usize, salt: u32) -> Vec<u8> {
        (0u32..)
            .map(|i| format!("k{salt}-{i}").into_bytes())
            .find(|k| s.ring().range_of_key(k) == j)
            .unwrap()
    }

    #[test]
    fn a_server_takes_only_keys_of_its_ranges() {
        let mut s = store(1);
        assert_eq!(s.ranges(), vec![0, 3]);
        let mine = key_of_range(&s, 0, 0);
        let other = key_of_range(&s, 1, 0);
        assert_eq!(s.merge(Entry::put(&mine, 5, b"x")), Merged::Applied);
        assert_eq!(s.merge(Entry::put(&other, 5, b"x")), Merged::OutOfRange);
        assert_eq!(s.get(&mine).unwrap().unwrap().ts, 5);
        assert_eq!(s.get(&other), Err(1));
    }

    #[test]
    fn the_log_replays_to_the_same_state_and_so_does_its_image() {
        let mut s = store(2);
        let mut log = Vec::new();
        let keys: Vec<Vec<u8>> = (0..40).map(|i| key_of_range(&s, [0, 1][i % 2], i as u32)).collect();
        for (i, k) in keys.iter().enumerate() {
            s.merge(Entry::put(k, 10 + i as u64, b"v"));
            if i % 3 == 0 {
                s.merge(Entry::tombstone(k, 100 + i as u64));
            }
            if i % 7 == 0 {
                // loses LWW: not applied, not logged
                s.merge(Entry::put(k, 1, b"old"));
            }
        }
        s.replica_mut(1).unwrap().record_repair(3, 77);
        s.collect_garbage(GcMode::Time, 50, 160);
        for r in s.take_records() {
            wal::encode(&r, &mut log);
        }
        let decoded = wal::decode(&log);
        assert!(decoded.torn.is_none());
        let mut again = store(2);
        assert_eq!(again.replay(decoded.records), 0);
        assert_eq!(again.dump(), s.dump());
        assert_eq!(again.replica(1).unwrap().repaired_with(3), 77);
        assert_eq!(again.replica(0).unwrap().gc_horizon(), 110);
        let mut from_image = store(2);
        from_image.replay(s.image());
        assert_eq!(from_image.dump(), s.dump());
        assert!(again.take_records().is_empty(), "a replay logs nothing anew");
    }

    #[test]
    fn repair_gated_gc_waits_for_every_peer_of_the_range() {
        let mut s = store(1);
        let k = key_of_range(&s, 0, 9);
        s.merge(Entry::tombstone(&k, 10));
        // range 0's replicas are 1 and 2: no repair with 2 yet
        assert_eq!(s.collect_garbage(GcMode::Repair, 5, 1_000), vec![(0, 0), (3, 0)]);
        s.replica_mut(0).unwrap().record_repair(2, 500);
        assert_eq!(s.collect_garbage(GcMode::Repair, 5, 1_000), vec![(0, 1), (3, 0)]);
        assert_eq!(s.get(&k).unwrap(), None);
    }
}
