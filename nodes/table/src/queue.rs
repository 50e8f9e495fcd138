//! A replica's queue: the log entries it copied and has not done yet, run
//! out of order.
//!
//! Selection walks the queue in its current order and takes the first
//! entry that can run now; the chosen entry moves to the tail, so one that
//! keeps failing never blocks those behind it. An entry that cannot run
//! records why (`postpone_reason`, shown in `system.replication_queue`):
//!
//! * it failed recently: exponential backoff from [`BACKOFF_BASE_MS`] up to
//!   [`BACKOFF_MAX_MS`];
//! * its pool (fetches or merges) is full;
//! * its part covers, or is covered by, a part another running entry is
//!   making;
//! * a drop range while an earlier entry making a part inside it is queued.
//!
//! The invariant (checked by [`Queue::check_invariant`], after every
//! operation in the property tests): `virtual_parts` — the parts this
//! replica will have once the queue drains — equals the current parts with
//! the queue's entries applied in queue order. Merge selection reasons
//! about the future through it without asking anybody.

use crate::entry::{EntryKind, LogEntry};
use crate::part::{ActivePartSet, Added, PartInfo};
use std::collections::{BTreeMap, VecDeque};

/// First retry delay after a failure; doubles per failure.
pub const BACKOFF_BASE_MS: u64 = 50;
/// Longest retry delay: a fetch that failed because its source was down
/// must be tried again soon after the source is back.
pub const BACKOFF_MAX_MS: u64 = 5_000;
/// Most entries a queue holds; the log puller stops copying at this.
pub const QUEUE_ENTRIES_MAX: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pool {
    Fetch,
    Merge,
}

impl Pool {
    fn of(e: &LogEntry) -> Pool {
        match e.kind {
            EntryKind::MergeParts { .. } => Pool::Merge,
            // fetches and drops are short and I/O-bound
            _ => Pool::Fetch,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueEntry {
    /// The entry's znode name in the replica's queue (`queue-0000000007`).
    pub znode: String,
    pub entry: LogEntry,
    pub executing: bool,
    pub num_tries: u32,
    pub num_postponed: u32,
    pub postpone_reason: String,
    pub last_exception: String,
    /// When the entry may be tried again (ms on the driver's clock).
    pub next_try_ms: u64,
}

/// An entry handed to the driver to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub znode: String,
    pub entry: LogEntry,
    pub pool: Pool,
    /// This run's number (1 for the first try).
    pub tries: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Queue {
    /// By znode: znode names sort in the order the log was copied.
    entries: BTreeMap<String, QueueEntry>,
    /// Selection order: a selected entry moves to the back.
    order: VecDeque<String>,
    current: ActivePartSet,
    virtual_parts: ActivePartSet,
    /// Parts running entries are making → their znode.
    future: BTreeMap<PartInfo, String>,
    running_fetches: usize,
    running_merges: usize,
}

impl Queue {
    /// A queue over the parts the replica has.
    pub fn new(current: ActivePartSet) -> Queue {
        Queue {
            virtual_parts: current.clone(),
            current,
            ..Queue::default()
        }
    }

    pub fn current(&self) -> &ActivePartSet {
        &self.current
    }

    pub fn virtual_parts(&self) -> &ActivePartSet {
        &self.virtual_parts
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, znode: &str) -> bool {
        self.entries.contains_key(znode)
    }

    /// Entries in znode order.
    pub fn entries(&self) -> impl Iterator<Item = &QueueEntry> {
        self.entries.values()
    }

    /// Parts running entries are making.
    pub fn future_parts(&self) -> impl Iterator<Item = &PartInfo> {
        self.future.keys()
    }

    /// Adds an entry copied from the log. Znodes arrive in increasing
    /// order; one already queued is ignored. A drop range removes the
    /// queued, not running, entries whose part it contains: making them
    /// would be wasted. Returns the znodes so removed (the driver deletes
    /// them from the coordinator).
    pub fn push(&mut self, znode: String, entry: LogEntry) -> Result<Vec<String>, String> {
        if self.entries.contains_key(&znode) {
            return Ok(Vec::new());
        }
        if let Some(last) = self.entries.keys().next_back() {
            assert!(*last < znode, "queue znodes arrive in order: {last} then {znode}");
        }
        let mut obsolete = Vec::new();
        match &entry.kind {
            EntryKind::DropRange { range } => {
                obsolete = self
                    .entries
                    .values()
                    .filter(|e| !e.executing && !matches!(e.entry.kind, EntryKind::DropRange { .. }))
                    .filter(|e| range.contains(e.entry.new_part()))
                    .map(|e| e.znode.clone())
                    .collect();
                for z in &obsolete {
                    self.entries.remove(z);
                    self.order.retain(|o| o != z);
                }
                for p in self.virtual_parts.contained_by(range) {
                    self.virtual_parts.remove(&p);
                }
            }
            _ => {
                self.virtual_parts.add(entry.new_part().clone())?;
            }
        }
        self.order.push_back(znode.clone());
        self.entries.insert(
            znode.clone(),
            QueueEntry {
                znode,
                entry,
                executing: false,
                num_tries: 0,
                num_postponed: 0,
                postpone_reason: String::new(),
                last_exception: String::new(),
                next_try_ms: 0,
            },
        );
        if !obsolete.is_empty() {
            self.recompute_virtual()?;
        }
        Ok(obsolete)
    }

    fn running(&self, pool: Pool) -> usize {
        match pool {
            Pool::Fetch => self.running_fetches,
            Pool::Merge => self.running_merges,
        }
    }

    fn running_mut(&mut self, pool: Pool) -> &mut usize {
        match pool {
            Pool::Fetch => &mut self.running_fetches,
            Pool::Merge => &mut self.running_merges,
        }
    }

    /// Why `e` cannot run now, or `None` if it can.
    fn postpone_reason(&self, e: &QueueEntry, now_ms: u64, fetch_pool: usize, merge_pool: usize) -> Option<String> {
        if now_ms < e.next_try_ms {
            return Some(format!(
                "backoff after {} failed tries (next in {} ms)",
                e.num_tries,
                e.next_try_ms - now_ms
            ));
        }
        let pool = Pool::of(&e.entry);
        let size = match pool {
            Pool::Fetch => fetch_pool,
            Pool::Merge => merge_pool,
        };
        if self.running(pool) >= size {
            return Some(format!("the {pool:?} pool is full ({size} running)").to_lowercase());
        }
        let part = e.entry.new_part();
        if let Some((f, z)) = self.future.iter().find(|(f, _)| f.contains(part) || part.contains(f)) {
            return Some(format!("part {f} is being made by {z}"));
        }
        match &e.entry.kind {
            // a merge whose sources are not here yet still runs: the driver
            // fetches the merged part from a replica that made it, else the
            // entry fails and backs off while the sources arrive
            EntryKind::MergeParts { .. } => {}
            EntryKind::DropRange { range } => {
                // the entries before it that make parts in its range (they
                // were running when it arrived) run first, failed or not
                let earlier = self.entries.values().find(|o| {
                    o.znode < e.znode
                        && !matches!(o.entry.kind, EntryKind::DropRange { .. })
                        && range.overlaps(o.entry.new_part())
                });
                if let Some(o) = earlier {
                    return Some(format!(
                        "part {} inside the range is still to be made",
                        o.entry.new_part()
                    ));
                }
            }
            EntryKind::GetPart { .. } => {}
        }
        None
    }

    /// The first entry that can run now, marked running and moved to the
    /// tail; entries passed over are postponed with their reason.
    pub fn select(&mut self, now_ms: u64, fetch_pool: usize, merge_pool: usize) -> Option<Selected> {
        let mut chosen = None;
        for (i, z) in self.order.iter().enumerate() {
            let e = &self.entries[z];
            if e.executing {
                continue;
            }
            match self.postpone_reason(e, now_ms, fetch_pool, merge_pool) {
                None => {
                    chosen = Some(i);
                    break;
                }
                Some(why) => {
                    let e = self.entries.get_mut(z).expect("ordered entry exists");
                    e.num_postponed += 1;
                    e.postpone_reason = why;
                }
            }
        }
        let z = self.order.remove(chosen?).expect("index in range");
        self.order.push_back(z.clone());
        let e = self.entries.get_mut(&z).expect("ordered entry exists");
        e.executing = true;
        e.num_tries += 1;
        e.postpone_reason.clear();
        let pool = Pool::of(&e.entry);
        let selected = Selected {
            znode: z.clone(),
            entry: e.entry.clone(),
            pool,
            tries: e.num_tries,
        };
        if !matches!(selected.entry.kind, EntryKind::DropRange { .. }) {
            self.future.insert(selected.entry.new_part().clone(), z);
        }
        *self.running_mut(pool) += 1;
        Some(selected)
    }

    /// Ends `znode`'s run: None when it is not queued or not running here
    /// (the queue was reloaded under the run, and the entry is gone).
    fn end_run(&mut self, znode: &str) -> Option<QueueEntry> {
        let e = self.entries.get_mut(znode).filter(|e| e.executing)?;
        e.executing = false;
        let e = e.clone();
        self.future.retain(|_, z| z != znode);
        let pool = Pool::of(&e.entry);
        *self.running_mut(pool) -= 1;
        Some(e)
    }

    /// After a reload (`self` built anew from the coordinator): every
    /// entry `old` was running that is still queued runs on here, so it is
    /// neither selected twice nor finished against a queue that never
    /// started it.
    pub fn adopt_running(&mut self, old: &Queue) {
        for (z, e) in old.entries.iter().filter(|(_, e)| e.executing) {
            let Some(mine) = self.entries.get_mut(z) else { continue };
            if mine.executing {
                continue;
            }
            mine.executing = true;
            mine.num_tries = mine.num_tries.max(e.num_tries);
            let entry = mine.entry.clone();
            if !matches!(entry.kind, EntryKind::DropRange { .. }) {
                self.future.insert(entry.new_part().clone(), z.clone());
            }
            *self.running_mut(Pool::of(&entry)) += 1;
        }
    }

    /// The entry ran: its part is now current (or, for a drop, the parts
    /// in its range are gone). Returns the parts that left the current set.
    /// Refused (an error) when `znode` is not running here.
    pub fn finish_ok(&mut self, znode: &str) -> Result<Vec<PartInfo>, String> {
        let e = self
            .end_run(znode)
            .ok_or_else(|| format!("{znode} is not running here"))?;
        self.entries.remove(znode);
        self.order.retain(|z| z != znode);
        let removed = match &e.entry.kind {
            EntryKind::DropRange { range } => {
                let gone = self.current.contained_by(range);
                for p in &gone {
                    self.current.remove(p);
                }
                gone
            }
            _ => match self.current.add(e.entry.new_part().clone())? {
                Added::Active(gone) => gone,
                Added::Covered(_) => Vec::new(),
            },
        };
        Ok(removed)
    }

    /// The entry failed: it stays queued and waits out its backoff.
    /// Nothing to do when `znode` is not running here any more.
    pub fn finish_err(&mut self, znode: &str, now_ms: u64, error: &str) {
        let Some(ended) = self.end_run(znode) else { return };
        let tries = ended.num_tries;
        let e = self.entries.get_mut(znode).expect("still queued");
        let shift = tries.saturating_sub(1).min(16);
        e.next_try_ms = now_ms + (BACKOFF_BASE_MS << shift).min(BACKOFF_MAX_MS);
        e.last_exception = error.to_string();
    }

    /// The running `znode` will never run again (its part is on no
    /// replica: lost forever, or its quorum failed): its run ends and it
    /// leaves the queue. One queued but not running here (a reload took
    /// it under the run) leaves too; one another run holds is refused.
    pub fn drop_running(&mut self, znode: &str) -> Result<bool, String> {
        self.end_run(znode);
        self.remove(znode)
    }

    /// Removes an entry that will never run (a part no replica holds that
    /// the quorum machinery gave up on). Refused while it runs.
    pub fn remove(&mut self, znode: &str) -> Result<bool, String> {
        match self.entries.get(znode) {
            None => return Ok(false),
            Some(e) if e.executing => return Err(format!("{znode} is running")),
            Some(_) => {}
        }
        self.entries.remove(znode);
        self.order.retain(|z| z != znode);
        self.recompute_virtual()?;
        Ok(true)
    }

    /// A part this replica made itself (its own insert), current at once.
    pub fn add_current(&mut self, part: PartInfo) -> Result<Vec<PartInfo>, String> {
        self.virtual_parts.add(part.clone())?;
        Ok(match self.current.add(part)? {
            Added::Active(gone) => gone,
            Added::Covered(_) => Vec::new(),
        })
    }

    /// A part this replica lost (found missing or broken).
    pub fn remove_current(&mut self, part: &PartInfo) -> Result<bool, String> {
        let removed = self.current.remove(part);
        self.recompute_virtual()?;
        Ok(removed)
    }

    /// `current` with the queue applied in znode order.
    fn replay(&self) -> Result<ActivePartSet, String> {
        let mut v = self.current.clone();
        for e in self.entries.values() {
            match &e.entry.kind {
                EntryKind::DropRange { range } => {
                    for p in v.contained_by(range) {
                        v.remove(&p);
                    }
                }
                _ => {
                    v.add(e.entry.new_part().clone())?;
                }
            }
        }
        Ok(v)
    }

    fn recompute_virtual(&mut self) -> Result<(), String> {
        self.virtual_parts = self.replay()?;
        Ok(())
    }

    /// Checks `virtual_parts == current + queue` and the running counts.
    pub fn check_invariant(&self) -> Result<(), String> {
        let replayed = self.replay()?;
        if replayed != self.virtual_parts {
            return Err(format!(
                "virtual parts {:?} but current + queue gives {:?}",
                self.virtual_parts.iter().map(|p| p.name()).collect::<Vec<_>>(),
                replayed.iter().map(|p| p.name()).collect::<Vec<_>>()
            ));
        }
        let running = |pool| {
            self.entries
                .values()
                .filter(|e| e.executing && Pool::of(&e.entry) == pool)
                .count()
        };
        if running(Pool::Fetch) != self.running_fetches || running(Pool::Merge) != self.running_merges {
            return Err("running counts disagree with the entries".into());
        }
        if self.order.len() != self.entries.len() {
            return Err("selection order and entries disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: &str) -> PartInfo {
        PartInfo::parse(n).unwrap()
    }

    fn get(part: &str) -> LogEntry {
        LogEntry {
            create_time_s: 0,
            source_replica: "r1".into(),
            kind: EntryKind::GetPart {
                part: p(part),
                block_id: None,
                quorum: 0,
            },
        }
    }

    fn merge(parts: &[&str]) -> LogEntry {
        let parts: Vec<PartInfo> = parts.iter().map(|n| p(n)).collect();
        LogEntry {
            create_time_s: 0,
            source_replica: "r1".into(),
            kind: EntryKind::MergeParts {
                into: PartInfo::merged(&parts),
                parts,
            },
        }
    }

    #[test]
    fn a_failing_entry_backs_off_and_does_not_block_the_rest() {
        let mut q = Queue::new(ActivePartSet::new());
        q.push("queue-0000000000".into(), get("1_0_0_0")).unwrap();
        q.push("queue-0000000001".into(), get("1_1_1_0")).unwrap();
        let a = q.select(0, 1, 1).unwrap();
        assert_eq!(a.znode, "queue-0000000000");
        // the fetch pool (size 1) is full
        assert_eq!(q.select(0, 1, 1), None);
        q.finish_err(&a.znode, 0, "no replica has it");
        let b = q.select(10, 1, 1).unwrap();
        assert_eq!(b.znode, "queue-0000000001", "the failed entry waits out its backoff");
        q.finish_ok(&b.znode).unwrap();
        assert_eq!(q.select(10, 1, 1), None);
        let e = q.entries().next().unwrap();
        assert!(e.postpone_reason.contains("backoff"), "{}", e.postpone_reason);
        assert_eq!(e.last_exception, "no replica has it");
        assert_eq!(q.select(BACKOFF_BASE_MS, 1, 1).unwrap().znode, "queue-0000000000");
        q.check_invariant().unwrap();
    }

    #[test]
    fn a_merge_waits_for_its_sources_and_replaces_them() {
        let mut q = Queue::new(ActivePartSet::new());
        q.push("queue-0000000000".into(), get("1_0_0_0")).unwrap();
        q.push("queue-0000000001".into(), get("1_1_1_0")).unwrap();
        q.push("queue-0000000002".into(), merge(&["1_0_0_0", "1_1_1_0"]))
            .unwrap();
        assert_eq!(
            q.virtual_parts().iter().map(|p| p.name()).collect::<Vec<_>>(),
            ["1_0_1_1"]
        );
        let first = q.select(0, 8, 8).unwrap();
        // the second get runs; the merge waits: a source is being made
        let second = q.select(0, 8, 8).unwrap();
        assert_eq!(second.znode, "queue-0000000001");
        assert_eq!(q.select(0, 8, 8), None);
        let m = q.entries().find(|e| e.znode == "queue-0000000002").unwrap();
        assert!(m.postpone_reason.contains("being made"), "{}", m.postpone_reason);
        q.finish_ok(&first.znode).unwrap();
        q.finish_ok(&second.znode).unwrap();
        let m = q.select(0, 8, 8).unwrap();
        assert_eq!(m.pool, Pool::Merge);
        assert_eq!(q.finish_ok(&m.znode).unwrap(), vec![p("1_0_0_0"), p("1_1_1_0")]);
        assert_eq!(q.current(), q.virtual_parts());
        q.check_invariant().unwrap();
    }

    #[test]
    fn a_drop_range_removes_what_it_would_waste_and_waits_for_running_work() {
        let mut q = Queue::new(ActivePartSet::new());
        q.add_current(p("1_0_0_0")).unwrap();
        q.push("queue-0000000000".into(), get("1_1_1_0")).unwrap();
        q.push("queue-0000000001".into(), get("1_2_2_0")).unwrap();
        let running = q.select(0, 8, 8).unwrap();
        let drop = LogEntry {
            create_time_s: 0,
            source_replica: "r1".into(),
            kind: EntryKind::DropRange {
                range: p("1_0_5_999999999"),
            },
        };
        let gone = q.push("queue-0000000002".into(), drop).unwrap();
        assert_eq!(gone, ["queue-0000000001"]);
        q.check_invariant().unwrap();
        assert_eq!(q.select(0, 8, 8), None, "the drop waits for the running fetch");
        q.finish_ok(&running.znode).unwrap();
        let d = q.select(0, 8, 8).unwrap();
        assert_eq!(q.finish_ok(&d.znode).unwrap(), vec![p("1_0_0_0"), p("1_1_1_0")]);
        assert!(q.current().is_empty() && q.virtual_parts().is_empty());
        q.check_invariant().unwrap();
    }

    #[test]
    fn a_reload_under_running_entries_keeps_them_running_and_finishing_a_gone_one_is_refused() {
        let mut old = Queue::new(ActivePartSet::new());
        old.push("queue-0000000000".into(), get("1_0_0_0")).unwrap();
        old.push("queue-0000000001".into(), get("1_1_1_0")).unwrap();
        let a = old.select(0, 8, 8).unwrap();
        let b = old.select(0, 8, 8).unwrap();
        // reloaded from the coordinator: b's run already deleted its entry
        let mut q = Queue::new(ActivePartSet::new());
        q.push(a.znode.clone(), a.entry.clone()).unwrap();
        q.adopt_running(&old);
        q.check_invariant().unwrap();
        assert_eq!(q.select(0, 8, 8), None, "a still runs: not selected twice");
        // a's run ends against the reloaded queue; b's entry is not there
        q.finish_ok(&a.znode).unwrap();
        assert!(q.finish_ok(&b.znode).unwrap_err().contains("not running here"));
        q.finish_err(&b.znode, 0, "late");
        q.check_invariant().unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn a_running_entry_whose_part_is_lost_leaves_the_queue_and_frees_its_pool_slot() {
        let mut q = Queue::new(ActivePartSet::new());
        q.push("queue-1".into(), get("0_1_1_0")).unwrap();
        q.push("queue-2".into(), get("0_2_2_0")).unwrap();
        let a = q.select(0, 1, 0).unwrap();
        assert!(q.select(0, 1, 0).is_none(), "a pool of one is full");
        assert_eq!(q.drop_running(&a.znode), Ok(true));
        assert!(!q.contains(&a.znode));
        assert!(!q.virtual_parts().contains_exactly(&p("0_1_1_0")));
        assert_eq!(q.select(0, 1, 0).map(|s| s.znode), Some("queue-2".to_string()));
        q.check_invariant().unwrap();
        assert_eq!(q.drop_running("queue-9"), Ok(false), "not queued: nothing to drop");
    }
}
