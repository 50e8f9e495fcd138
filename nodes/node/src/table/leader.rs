//! What the leader does: assign merges and clean up (old block ids by the
//! dedup window, old log entries, lost replicas). `OPTIMIZE TABLE` assigns
//! merges from any replica through the same path.
//!
//! Merge assignments are serialised through the shared log node's version:
//! an assigner reads the version, pulls the log (so its virtual parts hold
//! every merge assigned before), selects, and creates the entry in a multi
//! that sets the log node at that version. A concurrent assignment makes
//! the multi fail, and the loser selects again — two assigned merges never
//! take the same part.

use super::coord::ZkErr;
use super::events::Ev;
use super::replica::Replica;
use drift_table::cleanup::{log_cleanup, ReplicaPointer};
use drift_table::dedup::block_ids_to_remove;
use drift_table::entry::{EntryKind, LogEntry};
use drift_table::merge::{select_merge, MergeInputs};
use drift_table::part::PartInfo;
use drift_table::quorum;
use drift_table::zk::{sequence_of, CreateMode, KeeperOp, MULTI_OPS_MAX};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Attempts of one assignment against concurrent assigners.
const ASSIGN_ATTEMPTS_MAX: usize = 5;
/// Merges one `OPTIMIZE … FINAL` assigns at most.
const OPTIMIZE_MERGES_MAX: usize = 100;

impl Replica {
    pub async fn leader_loop(self: Arc<Self>) {
        let period = Duration::from_millis(self.schema.settings.merge_selecting_period_ms);
        let cleanup_every = Duration::from_millis(self.schema.settings.cleanup_delay_period_ms);
        let mut last_cleanup = Instant::now();
        loop {
            tokio::time::sleep(period).await;
            if self.readonly().is_some() || !self.check_leader().await {
                continue;
            }
            if !self.st().merges_stopped {
                if let Err(e) = self.assign_merge(false).await {
                    self.log("merge_assign_failed", serde_json::json!({"error": e}));
                }
            }
            if last_cleanup.elapsed() >= cleanup_every {
                last_cleanup = Instant::now();
                if let Err(e) = self.clean_blocks().await {
                    self.log(
                        "cleanup_failed",
                        serde_json::json!({"what": "blocks", "error": e.to_string()}),
                    );
                }
                if let Err(e) = self.clean_log().await {
                    self.log(
                        "cleanup_failed",
                        serde_json::json!({"what": "log", "error": e.to_string()}),
                    );
                }
                self.events.add(Ev::CleanupRuns, 1);
            }
        }
    }

    /// Block numbers held by insert locks in `partition`.
    async fn locked_numbers(&self, partition: &str) -> Result<BTreeSet<u64>, ZkErr> {
        match self.coord.children(&self.paths.partition_numbers(partition)).await {
            Ok(kids) => Ok(kids.iter().filter_map(|k| sequence_of(k, "block-")).collect()),
            Err(ZkErr::NoNode) => Ok(BTreeSet::new()),
            Err(e) => Err(e),
        }
    }

    /// Parts whose quorum is still pending.
    async fn quorum_pending(&self) -> Result<BTreeSet<PartInfo>, ZkErr> {
        let parallel = self.coord.children(&self.paths.quorum_parallel()).await?;
        let status = self.coord.get(&self.paths.quorum_status()).await?.map(|(d, _)| d);
        Ok(quorum::pending(&parallel, status.as_deref()))
    }

    /// Assigns one merge if one is due (`force`: any two mergeable
    /// neighbours will do). Returns the part it will make.
    pub async fn assign_merge(&self, force: bool) -> Result<Option<PartInfo>, String> {
        let _g = self.assign_lock.lock().await;
        let e = |what: &'static str| move |err: ZkErr| format!("{what}: {err}");
        for _ in 0..ASSIGN_ATTEMPTS_MAX {
            let (_, log_stat) = self
                .coord
                .get(&self.paths.log())
                .await
                .map_err(e("log node"))?
                .ok_or("no log node")?;
            // ClickHouse's merge predicate: the virtual parts as they are
            // now, then the locks, then the log. Only parts already virtual
            // before the lock read may merge (drift_table::merge: a number
            // between two of them was taken before the read, so it is
            // locked, pulled, or dead); a part committed after the read —
            // its lower neighbour's number perhaps still held by a lock the
            // read missed — waits for the next round. A partition with such
            // a part had its first number taken before the read, so the
            // read lists it.
            let before = self.st().queue.virtual_parts().clone();
            let partitions = match self.coord.children(&self.paths.block_numbers()).await {
                Ok(kids) => kids,
                Err(ZkErr::NoNode) => Vec::new(),
                Err(err) => return Err(e("block numbers")(err)),
            };
            let mut locked: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
            for p in partitions {
                let held = self.locked_numbers(&p).await.map_err(e("block numbers"))?;
                locked.insert(p, held);
            }
            self.pull_log().await.map_err(e("pulling the log"))?;
            let (current, virtual_parts) = {
                let st = self.st();
                let mut current = drift_table::part::ActivePartSet::new();
                for p in st.queue.current().iter().filter(|p| before.containing(p).is_some()) {
                    current
                        .add(p.clone())
                        .map_err(|err| format!("the current parts: {err}"))?;
                }
                (current, st.queue.virtual_parts().clone())
            };
            let pending = self.quorum_pending().await.map_err(e("quorum"))?;
            let selected = {
                let locked_fn = |p: &str| locked.get(p).cloned().unwrap_or_default();
                let s = &self.schema.settings;
                let inputs = MergeInputs {
                    current: &current,
                    virtual_parts: &virtual_parts,
                    locked: &locked_fn,
                    quorum_pending: &pending,
                    parts_to_merge_min: if force { 2 } else { s.parts_to_merge_min },
                    max_parts_to_merge_at_once: s.max_parts_to_merge_at_once,
                };
                select_merge(&inputs)
            };
            let Some((parts, into)) = selected else {
                return Ok(None);
            };
            let entry = LogEntry {
                create_time_s: super::replica::wall_ms() / 1000,
                source_replica: self.name.clone(),
                kind: EntryKind::MergeParts {
                    parts: parts.clone(),
                    into: into.clone(),
                },
            };
            let ops = [
                KeeperOp::SetData {
                    path: self.paths.log(),
                    data: Vec::new(),
                    version: log_stat.version,
                },
                KeeperOp::Create {
                    path: self.paths.log_prefix(),
                    data: entry.encode().into_bytes(),
                    mode: CreateMode::PersistentSequential,
                },
            ];
            match self.coord.multi(&ops).await {
                Ok(_) => {
                    self.log(
                        "merge_assigned",
                        serde_json::json!({"into": into.name(), "parts": parts.iter().map(|p| p.name()).collect::<Vec<_>>()}),
                    );
                    let _ = self.pull_log().await;
                    return Ok(Some(into));
                }
                Err(x) if x.err == ZkErr::BadVersion => continue,
                Err(x) => return Err(format!("assigning a merge: {}", x.err)),
            }
        }
        Err("other replicas kept assigning merges first".into())
    }

    /// `OPTIMIZE TABLE`: assigns merges (with `final_`, until every
    /// partition is one part or nothing more can merge) and waits until
    /// this replica holds their results.
    pub async fn optimize(&self, final_: bool, timeout: Duration) -> Result<usize, String> {
        let mut made = Vec::new();
        for _ in 0..if final_ { OPTIMIZE_MERGES_MAX } else { 1 } {
            match self.assign_merge(true).await? {
                Some(p) => made.push(p),
                None => break,
            }
        }
        let deadline = Instant::now() + timeout;
        for p in &made {
            loop {
                if self.st().queue.current().containing(p).is_some() {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "merge into {p} assigned but not done on this replica within {} s",
                        timeout.as_secs()
                    ));
                }
                self.wake.notify_one();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(made.len())
    }

    /// Removes block ids outside the dedup window (see
    /// `drift_table::dedup`).
    pub async fn clean_blocks(&self) -> Result<usize, ZkErr> {
        let s = &self.schema.settings;
        if s.replicated_deduplication_window == 0 {
            return Ok(0);
        }
        let dir = self.paths.blocks();
        let ids = self.coord.children(&dir).await?;
        let window = s.replicated_deduplication_window;
        if (ids.len() as u64) <= window && s.replicated_deduplication_window_seconds >= 365 * 24 * 3600 {
            return Ok(0);
        }
        let stats = self
            .coord
            .get_many(&ids.iter().map(|i| format!("{dir}/{i}")).collect::<Vec<_>>())
            .await?;
        let dated: Vec<(String, i64)> = ids
            .into_iter()
            .zip(stats)
            .filter_map(|(id, st)| st.map(|(_, stat)| (id, stat.ctime)))
            .collect();
        let remove = block_ids_to_remove(&dated, window, s.replicated_deduplication_window_seconds);
        let n = self.delete_all(&dir, &remove).await?;
        if n > 0 {
            self.events.add(Ev::CleanedBlockIds, n as u64);
            self.log(
                "block_ids_cleaned",
                serde_json::json!({"removed": n, "kept": dated.len() - n}),
            );
        }
        Ok(n)
    }

    /// Deletes `dir/<name>` for each name, a multi per chunk; a chunk that
    /// fails (a node already gone) is deleted one by one.
    async fn delete_all(&self, dir: &str, names: &[String]) -> Result<usize, ZkErr> {
        let mut n = 0;
        for chunk in names.chunks(MULTI_OPS_MAX) {
            let ops: Vec<KeeperOp> = chunk
                .iter()
                .map(|id| KeeperOp::Delete {
                    path: format!("{dir}/{id}"),
                    version: -1,
                })
                .collect();
            match self.coord.multi(&ops).await {
                Ok(_) => n += chunk.len(),
                Err(x) if x.index.is_some() => {
                    for id in chunk {
                        match self.coord.delete(&format!("{dir}/{id}"), None).await {
                            Ok(()) => n += 1,
                            Err(ZkErr::NoNode) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(x) => return Err(x.err),
            }
        }
        Ok(n)
    }

    /// Removes log entries every replica that is not lost has copied, and
    /// marks lost the inactive replicas too far behind.
    pub async fn clean_log(&self) -> Result<usize, ZkErr> {
        let c = &self.coord;
        let names = c.children(&self.paths.log()).await?;
        let indexed: Vec<(u64, &String)> = names
            .iter()
            .filter_map(|n| sequence_of(n, "log-").map(|i| (i, n)))
            .collect();
        let newest = indexed.iter().map(|(i, _)| *i).max();
        let mut pointers = Vec::new();
        let mut versions = BTreeMap::new();
        for r in c.children(&self.paths.replicas()).await? {
            let Some((ptr, stat)) = c.get(&self.paths.log_pointer_of(&r)).await? else {
                continue;
            };
            let log_pointer = std::str::from_utf8(&ptr)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            let is_active = c.exists(&self.paths.is_active_of(&r)).await?.is_some();
            let is_lost = c.get(&self.paths.is_lost_of(&r)).await?.is_some_and(|(d, _)| d == b"1");
            versions.insert(r.clone(), stat.version);
            pointers.push(ReplicaPointer {
                name: r,
                log_pointer,
                is_active,
                is_lost,
            });
        }
        let s = &self.schema.settings;
        let plan = log_cleanup(
            newest,
            &pointers,
            s.min_replicated_logs_to_keep,
            s.max_replicated_logs_to_keep,
        );
        for r in &plan.mark_lost {
            // only if its pointer did not move since it was read
            let ops = [
                KeeperOp::Check {
                    path: self.paths.log_pointer_of(r),
                    version: versions[r],
                },
                KeeperOp::SetData {
                    path: self.paths.is_lost_of(r),
                    data: b"1".to_vec(),
                    version: -1,
                },
            ];
            if c.multi(&ops).await.is_ok() {
                self.log("replica_marked_lost", serde_json::json!({"replica": r}));
            } else {
                return Ok(0);
            }
        }
        let old: Vec<String> = indexed
            .iter()
            .filter(|(i, _)| *i < plan.remove_below)
            .map(|(_, n)| (*n).clone())
            .collect();
        let n = self.delete_all(&self.paths.log(), &old).await?;
        if n > 0 {
            self.events.add(Ev::CleanedLogEntries, n as u64);
        }
        Ok(n)
    }
}

impl Replica {
    /// `ALTER TABLE … DROP PARTITION`: takes a block number above every
    /// block of the partition (waiting for inserts that hold lower ones),
    /// logs a `DROP_RANGE` covering them while releasing it, removes the
    /// partition's block ids (its rows may be inserted again), and waits
    /// until this replica has dropped the range.
    pub async fn drop_partition(&self, partition: &str, timeout: Duration) -> Result<(), String> {
        let c = &self.coord;
        let e = |what: &'static str| move |err: ZkErr| format!("{what}: {err}");
        let deadline = Instant::now() + timeout;
        c.ensure(&self.paths.partition_numbers(partition))
            .await
            .map_err(e("block numbers"))?;
        let lock = c
            .create(
                &self.paths.lock_prefix(partition),
                &drift_table::zk::lock_holder(&self.paths),
                CreateMode::EphemeralSequential,
            )
            .await
            .map_err(e("taking a block number"))?;
        let n = sequence_of(&lock, &self.paths.lock_prefix(partition)).ok_or("the lock has no number")?;
        loop {
            let held = self.locked_numbers(partition).await.map_err(e("block numbers"))?;
            if held.range(..n).next().is_none() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = c.delete(&lock, None).await;
                return Err(format!(
                    "inserts into partition {partition} kept their block numbers past the timeout"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let range = PartInfo::new(partition, 0, n, drift_table::part::LEVEL_MAX);
        let entry = LogEntry {
            create_time_s: super::replica::wall_ms() / 1000,
            source_replica: self.name.clone(),
            kind: EntryKind::DropRange { range: range.clone() },
        };
        c.multi(&[
            KeeperOp::Create {
                path: self.paths.log_prefix(),
                data: entry.encode().into_bytes(),
                mode: CreateMode::PersistentSequential,
            },
            KeeperOp::Delete {
                path: lock,
                version: -1,
            },
        ])
        .await
        .map_err(|x| format!("logging the drop: {}", x.err))?;
        let ids: Vec<String> = c
            .children(&self.paths.blocks())
            .await
            .map_err(e("block ids"))?
            .into_iter()
            .filter(|id| drift_table::dedup::partition_of(id) == Some(partition))
            .collect();
        self.delete_all(&self.paths.blocks(), &ids)
            .await
            .map_err(e("removing block ids"))?;
        self.log(
            "partition_dropped",
            serde_json::json!({"partition": partition, "range": range.name(), "block_ids": ids.len()}),
        );
        self.pull_log().await.map_err(e("pulling the log"))?;
        loop {
            let pending = {
                let st = self.st();
                let found = st
                    .queue
                    .entries()
                    .any(|q| matches!(&q.entry.kind, EntryKind::DropRange { range: r } if *r == range));
                found
            };
            if !pending {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the drop of partition {partition} is logged but not done here yet"
                ));
            }
            self.wake.notify_one();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
