//! The insert path.
//!
//! Rows become blocks (`drift_table::block::split_insert`); each block is
//! committed on its own, in two coordinator round trips:
//!
//! 1. one multi checks that the block's id is absent and takes a block
//!    number (an ephemeral-sequential lock under the partition). "Node
//!    exists" on the id means a duplicate: the block is dropped and the
//!    client told success.
//! 2. the part is written and fsynced; one multi then creates the log
//!    entry, this replica's part node, the block id (holding the part's
//!    name), the quorum node if asked, and deletes the lock.
//!
//! A commit whose reply is lost is resolved through its lock: deleting the
//! lock succeeds only if the commit did not happen (the commit deletes it)
//! and makes sure it never will; when the lock is already gone, the part's
//! node says whether the commit happened. A block found not committed is
//! tried again from step 1; one that cannot be resolved before
//! [`RESOLVE_TIMEOUT`] answers 319 and stays "precommitted" until the
//! background resolver (same logic) settles it.
//!
//! Errors raised before a block number is taken (read-only, 285, 286, bad
//! input) are definite failures; everything after is indeterminate for the
//! client (319 or a keeper error), as the dedup checker expects.

use super::coord::{MultiErr, ZkErr};
use super::error::{
    TResult, TableError, KEEPER_EXCEPTION, TABLE_IS_READ_ONLY, TOO_FEW_LIVE_REPLICAS, UNKNOWN_STATUS_OF_INSERT,
    UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
};
use super::events::Ev;
use super::hooks::Hooks;
use super::replica::{wall_ms, Replica};
use drift_table::block::split_insert;
use drift_table::dedup::{block_id, token_block_id};
use drift_table::entry::{EntryKind, LogEntry};
use drift_table::format::{self, Checksums};
use drift_table::part::PartInfo;
use drift_table::quorum::QuorumEntry;
use drift_table::zk::{allocate_ops, commit_ops, sequence_of, Commit, KeeperOp, QuorumMode, COMMIT_BLOCK_OP};
use drift_table::Block;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest an insert waits at its commit under the `hold-commits` hook.
const HOLD_COMMITS_MAX: Duration = Duration::from_secs(60);

/// How long an insert tries to learn whether a commit whose reply was lost
/// happened, before it answers 319.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(15);
/// Fresh attempts of a block found not committed.
const BLOCK_ATTEMPTS_MAX: usize = 3;

/// `insert_quorum`: off, N replicas, or a majority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuorumSetting {
    Off,
    N(u32),
    Auto,
}

#[derive(Clone, Debug)]
pub struct InsertSettings {
    pub deduplicate: bool,
    pub token: Option<String>,
    pub quorum: QuorumSetting,
    pub quorum_timeout: Duration,
    pub quorum_parallel: bool,
    pub max_block_rows: usize,
    /// The client's `query_id`, logged with each block's id so that a
    /// campaign can tie an attempt to the block ids it made.
    pub query_id: Option<String>,
}

impl Default for InsertSettings {
    fn default() -> Self {
        InsertSettings {
            deduplicate: true,
            token: None,
            quorum: QuorumSetting::Off,
            quorum_timeout: Duration::from_secs(600),
            quorum_parallel: true,
            max_block_rows: drift_table::block::MAX_INSERT_BLOCK_SIZE_DEFAULT,
            query_id: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InsertSummary {
    pub written_rows: u64,
    pub written_blocks: u64,
    pub deduplicated_blocks: u64,
    /// Parts this insert committed.
    pub parts: Vec<String>,
}

enum BlockOutcome {
    Committed(PartInfo),
    Duplicate,
}

pub enum Resolved {
    Committed,
    NotCommitted,
}

fn keeper_error(what: &str, e: &ZkErr) -> TableError {
    TableError::new(KEEPER_EXCEPTION, format!("{what}: {e}"))
}

impl Replica {
    pub async fn insert(self: &Arc<Self>, rows: Block, s: &InsertSettings) -> TResult<InsertSummary> {
        self.events.add(Ev::InsertQuery, 1);
        if let Some(why) = self.readonly() {
            return Err(TableError::new(
                TABLE_IS_READ_ONLY,
                format!("Table is in readonly mode (replica path: {}): {why}", self.paths.me()),
            ));
        }
        let required = self.quorum_precondition(s).await?;
        let blocks = split_insert(&self.schema, &rows, s.max_block_rows.max(1));
        let window = self.schema.settings.replicated_deduplication_window;
        let mut summary = InsertSummary::default();
        for (ordinal, (partition, block)) in blocks.into_iter().enumerate() {
            let files = format::encode_part(&self.schema, &block);
            let sums = Checksums::of(&files);
            let id = (s.deduplicate && window > 0).then(|| match &s.token {
                Some(t) => token_block_id(&partition, t, ordinal),
                None => block_id(&partition, &sums),
            });
            if let Some(id) = &id {
                // as ClickHouse logs "Wrote block with ID …" under its query id
                self.log(
                    drift_keeper::NodeEvent::InsertBlock.name(),
                    serde_json::json!({"query_id": s.query_id, "block_id": id, "ordinal": ordinal,
                        "partition": partition}),
                );
            }
            let rows = block.rows() as u64;
            match self
                .insert_block(&partition, block, &files, &sums, id.as_deref(), required, s)
                .await?
            {
                BlockOutcome::Committed(part) => {
                    summary.written_rows += rows;
                    summary.written_blocks += 1;
                    summary.parts.push(part.name());
                }
                BlockOutcome::Duplicate => summary.deduplicated_blocks += 1,
            }
        }
        Ok(summary)
    }

    /// The quorum an insert needs (0: none), after checking it can be met:
    /// enough active replicas (285), and for a non-parallel quorum no other
    /// quorum insert still waiting (286). Nothing is written before this.
    async fn quorum_precondition(&self, s: &InsertSettings) -> TResult<u32> {
        if s.quorum == QuorumSetting::Off || s.quorum == QuorumSetting::N(1) || s.quorum == QuorumSetting::N(0) {
            return Ok(0);
        }
        let c = &self.coord;
        let replicas = c
            .children(&self.paths.replicas())
            .await
            .map_err(|e| keeper_error("listing replicas", &e))?;
        let total = replicas.len() as u32;
        let required = match s.quorum {
            QuorumSetting::Auto => total / 2 + 1,
            QuorumSetting::N(n) => n,
            QuorumSetting::Off => 0,
        };
        let mut active = 0u32;
        for r in &replicas {
            if c.exists(&self.paths.is_active_of(r))
                .await
                .map_err(|e| keeper_error("is_active", &e))?
                .is_some()
            {
                active += 1;
            }
        }
        if active < required {
            return Err(TableError::new(
                TOO_FEW_LIVE_REPLICAS,
                format!("Number of alive replicas ({active}) is less than requested quorum ({required}/{total})"),
            ));
        }
        if !s.quorum_parallel {
            if let Some((data, _)) = c
                .get(&self.paths.quorum_status())
                .await
                .map_err(|e| keeper_error("quorum status", &e))?
            {
                let what = std::str::from_utf8(&data)
                    .ok()
                    .and_then(|t| QuorumEntry::decode(t).ok())
                    .map(|q| format!("part {} has {}/{}", q.part, q.replicas.len(), q.required))
                    .unwrap_or_default();
                return Err(TableError::new(
                    UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
                    format!("Quorum for previous write has not been satisfied yet. Status: {what}"),
                ));
            }
        }
        Ok(required)
    }

    #[allow(clippy::too_many_arguments)]
    async fn insert_block(
        self: &Arc<Self>,
        partition: &str,
        block: Block,
        files: &BTreeMap<String, Vec<u8>>,
        sums: &Checksums,
        id: Option<&str>,
        quorum: u32,
        s: &InsertSettings,
    ) -> TResult<BlockOutcome> {
        let block = Arc::new(block);
        for _ in 0..BLOCK_ATTEMPTS_MAX {
            let t = Instant::now();
            // the test-only defects: look for no id, or leave none behind
            let skip = self.hooks.skip_dedup.load(std::sync::atomic::Ordering::SeqCst);
            let leave_none = skip || self.hooks.no_block_id.load(std::sync::atomic::Ordering::SeqCst);
            let (check_id, commit_id) = (id.filter(|_| !skip), id.filter(|_| !leave_none));
            let allocated = self.allocate(partition, check_id).await;
            self.events.add(Ev::InsertKeeperMicros, t.elapsed().as_micros() as u64);
            let Some(lock) = allocated? else {
                self.events.add(Ev::DuplicatedInsertedBlocks, 1);
                if quorum > 0 {
                    self.wait_duplicate_quorum(id, s).await?;
                }
                return Ok(BlockOutcome::Duplicate);
            };
            let number = sequence_of(&lock, &self.paths.lock_prefix(partition))
                .ok_or_else(|| TableError::new(KEEPER_EXCEPTION, format!("lock {lock} has no block number")))?;
            let part = PartInfo::new(partition, number, number, 0);
            let name = part.name();
            let store = self.store.clone();
            let (n2, f2) = (name.clone(), files.clone());
            let written = tokio::task::spawn_blocking(move || store.write_part(&n2, &f2))
                .await
                .map_err(|e| TableError::new(KEEPER_EXCEPTION, e.to_string()))
                .and_then(|r| r.map_err(|e| TableError::new(KEEPER_EXCEPTION, format!("writing part {name}: {e}"))));
            if let Err(e) = written {
                self.discard(&name, &lock).await;
                return Err(e);
            }
            if self.hooks.lose_part.load(std::sync::atomic::Ordering::SeqCst) {
                self.lose_part(&name, &lock, id).await?;
                return Ok(BlockOutcome::Committed(part));
            }
            if self.hooks.hold_commits.load(std::sync::atomic::Ordering::SeqCst) {
                self.log("commit_held", serde_json::json!({"part": name}));
                let until = Instant::now() + HOLD_COMMITS_MAX;
                while self.hooks.hold_commits.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // shared with other commits, exclusive of a queue reload (see
            // Replica::reload_gate); let go before a long resolution
            let mut commit_gate = Some(self.reload_gate.read().await);
            match self.commit(&part, &lock, commit_id, sums, quorum, s).await {
                Ok(()) => {}
                Err(CommitFail::Duplicate) => {
                    drop(commit_gate.take());
                    self.discard(&name, &lock).await;
                    self.events.add(Ev::DuplicatedInsertedBlocks, 1);
                    if quorum > 0 {
                        self.wait_duplicate_quorum(id, s).await?;
                    }
                    return Ok(BlockOutcome::Duplicate);
                }
                Err(CommitFail::Definite(e)) => {
                    self.discard(&name, &lock).await;
                    return Err(e);
                }
                Err(CommitFail::Unknown(why)) => {
                    commit_gate.take();
                    match self.resolve(&name, &lock, Instant::now() + RESOLVE_TIMEOUT).await {
                        Some(Resolved::Committed) => {
                            self.log("commit_resolved", serde_json::json!({"part": name, "committed": true}))
                        }
                        Some(Resolved::NotCommitted) => {
                            self.log("commit_resolved", serde_json::json!({"part": name, "committed": false}));
                            self.discard(&name, &lock).await;
                            continue;
                        }
                        None => {
                            // the background resolver settles it once it can
                            self.st().precommitted.insert(name.clone(), lock.clone());
                            self.events.add(Ev::UnknownStatusInserts, 1);
                            return Err(TableError::new(
                            UNKNOWN_STATUS_OF_INSERT,
                            format!("Unknown status of insert: the commit of part {name} got no answer ({why}) and the coordinator could not be asked in time"),
                        ));
                        }
                    }
                }
            }
            self.committed(&part, block.clone());
            commit_gate.take();
            if quorum > 0 {
                self.wait_quorum(&part, s).await?;
            }
            return Ok(BlockOutcome::Committed(part));
        }
        Err(TableError::new(
            KEEPER_EXCEPTION,
            format!("the block was found not committed {BLOCK_ATTEMPTS_MAX} times"),
        ))
    }

    /// Round trip 1 (2 in the naive path): `None` for a duplicate, else the
    /// lock's path.
    async fn allocate(&self, partition: &str, id: Option<&str>) -> TResult<Option<String>> {
        let c = &self.coord;
        if self.naive_insert_path {
            if let Some(id) = id {
                self.events.add(Ev::InsertKeeperRoundTrips, 1);
                if c.exists(&self.paths.block(id))
                    .await
                    .map_err(|e| keeper_error("checking the block id", &e))?
                    .is_some()
                {
                    return Ok(None);
                }
            }
        }
        for _ in 0..2 {
            self.events.add(Ev::InsertKeeperRoundTrips, 1);
            let ops = if self.naive_insert_path {
                allocate_ops(&self.paths, partition, None)
            } else {
                allocate_ops(&self.paths, partition, id)
            };
            let last = ops.len() - 1;
            match c.multi(&ops).await {
                Ok(results) => match results.last() {
                    Some(super::coord::OpResult::Created(p)) => return Ok(Some(p.clone())),
                    _ => return Err(TableError::new(KEEPER_EXCEPTION, "the lock's create returned no path")),
                },
                Err(MultiErr {
                    index: Some(0),
                    err: ZkErr::NodeExists,
                }) if id.is_some() && last > 0 => return Ok(None),
                Err(MultiErr {
                    index: Some(i),
                    err: ZkErr::NoNode,
                }) if i == last => {
                    // the partition's first block: its lock directory
                    c.ensure(&self.paths.partition_numbers(partition))
                        .await
                        .map_err(|e| keeper_error("creating the partition's block numbers", &e))?;
                }
                Err(e) => return Err(keeper_error("allocating a block number", &e.err)),
            }
        }
        Err(TableError::new(
            KEEPER_EXCEPTION,
            "the partition's lock directory keeps vanishing",
        ))
    }

    /// Round trip 2.
    async fn commit(
        &self,
        part: &PartInfo,
        lock: &str,
        id: Option<&str>,
        sums: &Checksums,
        quorum: u32,
        s: &InsertSettings,
    ) -> Result<(), CommitFail> {
        let name = part.name();
        let entry = LogEntry {
            create_time_s: wall_ms() / 1000,
            source_replica: self.name.clone(),
            kind: EntryKind::GetPart {
                part: part.clone(),
                block_id: id.map(str::to_string),
                quorum,
            },
        }
        .encode();
        let qmode = if quorum > 0 {
            let q = QuorumEntry::new(part.clone(), quorum, &self.name).encode();
            if s.quorum_parallel {
                QuorumMode::Parallel(q)
            } else {
                QuorumMode::Status(q)
            }
        } else {
            QuorumMode::None
        };
        let quorum_op = (quorum > 0).then(|| COMMIT_BLOCK_OP + usize::from(id.is_some()));
        let sums_text = sums.encode();
        let ops = commit_ops(
            &self.paths,
            &Commit {
                log_entry: &entry,
                lock_path: lock,
                block_id: id,
                part: &name,
                part_data: &sums_text,
                quorum: qmode,
            },
        );
        self.events.add(Ev::InsertKeeperRoundTrips, 1);
        let t = Instant::now();
        let r = self.coord.multi(&ops).await;
        self.events.add(Ev::InsertKeeperMicros, t.elapsed().as_micros() as u64);
        let r = match r {
            Ok(_) if Hooks::take(&self.hooks.cut_after_commit) => {
                self.log(
                    "fault_hook",
                    serde_json::json!({"hook": "cut-after-commit", "part": name}),
                );
                self.coord.set_cut(true);
                Err(MultiErr {
                    index: None,
                    err: ZkErr::Lost("the reply was dropped and the coordinator cut (fault hook)".into()),
                })
            }
            Ok(_) if Hooks::take(&self.hooks.fail_commit_reply) => {
                self.log(
                    "fault_hook",
                    serde_json::json!({"hook": "fail-commit-reply", "part": name}),
                );
                Err(MultiErr {
                    index: None,
                    err: ZkErr::Lost("the reply was dropped (fault hook)".into()),
                })
            }
            other => other,
        };
        match r {
            Ok(_) => Ok(()),
            Err(MultiErr {
                index: Some(i),
                err: ZkErr::NodeExists,
            }) if id.is_some() && i == COMMIT_BLOCK_OP => Err(CommitFail::Duplicate),
            Err(MultiErr {
                index: Some(i),
                err: ZkErr::NodeExists,
            }) if Some(i) == quorum_op => Err(CommitFail::Definite(TableError::new(
                UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
                "Quorum for previous write has not been satisfied yet (another quorum insert committed first)",
            ))),
            Err(MultiErr {
                index: Some(1),
                err: ZkErr::NoNode,
            }) => Err(CommitFail::Definite(TableError::new(
                KEEPER_EXCEPTION,
                format!("the block number lock {lock} is gone (the session expired): part {name} was not committed"),
            ))),
            Err(MultiErr { index: Some(i), err }) => Err(CommitFail::Definite(keeper_error(
                &format!("committing part {name} (op {i})"),
                &err,
            ))),
            Err(MultiErr { index: None, err }) => match err {
                ZkErr::Lost(_) | ZkErr::NoSession => Err(CommitFail::Unknown(err.to_string())),
                other => Err(CommitFail::Definite(keeper_error(
                    &format!("committing part {name}"),
                    &other,
                ))),
            },
        }
    }

    /// Settles a commit whose reply was lost, through its lock (see the
    /// module header). `None` when the coordinator could not be asked
    /// before `deadline`.
    pub async fn resolve(&self, name: &str, lock: &str, deadline: Instant) -> Option<Resolved> {
        loop {
            if self.coord.has_session() {
                match self.coord.delete(lock, None).await {
                    Ok(()) => return Some(Resolved::NotCommitted),
                    Err(ZkErr::NoNode) => match self.coord.exists(&self.paths.my_part(name)).await {
                        Ok(Some(_)) => return Some(Resolved::Committed),
                        Ok(None) => return Some(Resolved::NotCommitted),
                        Err(_) => {}
                    },
                    Err(_) => {}
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A committed block: its part is current here.
    fn committed(&self, part: &PartInfo, block: Arc<Block>) {
        let name = part.name();
        let mut st = self.st();
        st.precommitted.remove(&name);
        st.blocks.insert(name.clone(), block.clone());
        match st.queue.add_current(part.clone()) {
            Ok(gone) => {
                drop(st);
                self.outdate(gone);
            }
            Err(e) => {
                drop(st);
                self.log("insert_part_refused", serde_json::json!({"part": name, "error": e}));
            }
        }
        self.events.add(Ev::InsertedBlocks, 1);
        self.events.add(Ev::InsertedRows, block.rows() as u64);
    }

    /// The `defect-lose-part` commit: the block id is recorded and the
    /// lock released, but no log entry or part znode is made and the local
    /// part goes, so the insert is answered as written while its rows are
    /// nowhere and every retry is deduplicated against the surviving id.
    async fn lose_part(&self, name: &str, lock: &str, id: Option<&str>) -> TResult<()> {
        let mut ops = vec![KeeperOp::Delete {
            path: lock.to_string(),
            version: -1,
        }];
        if let Some(id) = id {
            ops.push(KeeperOp::Create {
                path: self.paths.block(id),
                data: name.as_bytes().to_vec(),
                mode: drift_table::zk::CreateMode::Persistent,
            });
        }
        self.coord
            .multi(&ops)
            .await
            .map_err(|e| keeper_error("the defect's commit", &e.err))?;
        self.discard(name, lock).await;
        self.log("defect_lost_part", serde_json::json!({"part": name, "block_id": id}));
        Ok(())
    }

    /// A block that did not commit: its part goes, its lock too (if this
    /// session still holds it). It was never current: a queue reload
    /// takes only parts the coordinator lists (`Replica::load_queue`).
    async fn discard(&self, name: &str, lock: &str) {
        self.st().precommitted.remove(name);
        if let Err(e) = self.store.remove(name) {
            self.log(
                "part_discard_failed",
                serde_json::json!({"part": name, "error": e.to_string()}),
            );
        }
        let _ = self.coord.delete(lock, None).await;
    }

    /// A quorum insert whose block is a duplicate: as ClickHouse does, it
    /// is answered only once the block's existing part has its quorum
    /// (else 319), so an `ok` promises the quorum whichever attempt wrote
    /// the part. A part with no quorum pending (reached, or never asked)
    /// needs no wait.
    async fn wait_duplicate_quorum(&self, id: Option<&str>, s: &InsertSettings) -> TResult<()> {
        let Some(id) = id else { return Ok(()) };
        let existing = self
            .coord
            .get(&self.paths.block(id))
            .await
            .map_err(|e| keeper_error("the duplicate block's part", &e))?
            .and_then(|(d, _)| PartInfo::parse(&String::from_utf8_lossy(&d)).ok());
        let Some(part) = existing else { return Ok(()) };
        // its quorum node is the parallel one if that exists, else the
        // status node, which `wait_quorum` takes as done when it names
        // another part or is gone
        let parallel = self
            .coord
            .exists(&self.paths.quorum_parallel_part(&part.name()))
            .await
            .map_err(|e| keeper_error("quorum", &e))?
            .is_some();
        let mut wait = s.clone();
        wait.quorum_parallel = parallel;
        self.wait_quorum(&part, &wait).await
    }

    /// Waits until the part's quorum is reached (its quorum node deleted,
    /// or replaced by a later insert's), else 319.
    async fn wait_quorum(&self, part: &PartInfo, s: &InsertSettings) -> TResult<()> {
        let name = part.name();
        let path = if s.quorum_parallel {
            self.paths.quorum_parallel_part(&name)
        } else {
            self.paths.quorum_status()
        };
        let deadline = Instant::now() + s.quorum_timeout;
        let fail = |why: String| {
            self.events.add(Ev::UnknownStatusInserts, 1);
            TableError::new(
                UNKNOWN_STATUS_OF_INSERT,
                format!("Unknown quorum status. The data was inserted in the local replica but we could not verify quorum. Reason: {why}"),
            )
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(fail(format!(
                    "Timeout while waiting for quorum ({} ms)",
                    s.quorum_timeout.as_millis()
                )));
            }
            match self.coord.watch_exists(&path).await {
                Ok((None, _)) => break,
                Ok((Some(_), w)) => {
                    if !s.quorum_parallel {
                        match self.coord.get(&path).await {
                            Ok(Some((d, _))) => {
                                let other = std::str::from_utf8(&d)
                                    .ok()
                                    .and_then(|t| QuorumEntry::decode(t).ok())
                                    .is_some_and(|q| q.part != *part);
                                if other {
                                    break;
                                }
                            }
                            Ok(None) => break,
                            Err(_) => {}
                        }
                    }
                    let _ = tokio::time::timeout(left, w.changed()).await;
                }
                Err(ZkErr::NoSession) => return Err(fail("the session expired while waiting".into())),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        match self.coord.exists(&self.paths.quorum_failed_part(&name)).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err(fail(format!("the quorum of part {name} failed"))),
            Err(e) => Err(fail(format!("could not read the quorum's outcome: {e}"))),
        }
    }

    /// Settles parts left precommitted by a 319 (or a crash of the insert
    /// path), every second.
    pub async fn resolver_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let pending: Vec<(String, String)> = self
                .st()
                .precommitted
                .iter()
                .map(|(a, b)| (a.clone(), b.clone()))
                .collect();
            for (name, lock) in pending {
                let deadline = Instant::now();
                match self.resolve(&name, &lock, deadline).await {
                    Some(Resolved::Committed) => {
                        let Ok(part) = PartInfo::parse(&name) else { continue };
                        match self.load_part(&name) {
                            Ok(block) => self.committed(&part, block),
                            Err(e) => {
                                self.log("precommitted_unreadable", serde_json::json!({"part": name, "error": e}))
                            }
                        }
                        self.log(
                            "precommitted_resolved",
                            serde_json::json!({"part": name, "committed": true}),
                        );
                    }
                    Some(Resolved::NotCommitted) => {
                        self.log(
                            "precommitted_resolved",
                            serde_json::json!({"part": name, "committed": false}),
                        );
                        self.discard(&name, &lock).await;
                    }
                    None => {}
                }
            }
        }
    }
}

enum CommitFail {
    Duplicate,
    Definite(TableError),
    Unknown(String),
}

/// `insert_quorum`'s URL value.
pub fn parse_quorum(v: &str) -> TResult<QuorumSetting> {
    if v == "auto" {
        return Ok(QuorumSetting::Auto);
    }
    v.parse::<u32>()
        .map(|n| {
            if n <= 1 {
                QuorumSetting::Off
            } else {
                QuorumSetting::N(n)
            }
        })
        .map_err(|_| {
            TableError::new(
                super::error::BAD_ARGUMENTS,
                format!("insert_quorum={v}: expected a number or auto"),
            )
        })
}
