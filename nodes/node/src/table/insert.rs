//! The insert path: rows become blocks (`drift_table::block::split_insert`),
//! and each block is committed on its own, in two coordinator round
//! trips. What each step asks and what each answer means — the block id's
//! check riding with the block number's lock, the commit multi, a lost
//! commit answer settled through the lock, the retries — is the sans-IO
//! `drift_table::insert::BlockInsert`'s; this module makes its
//! coordinator calls, writes and removes its part files, holds the commit
//! gate around the commit, waits for quorums, and turns how a block ended
//! into the client's answer.
//!
//! Errors raised before a block number is taken (read-only, 285, 286, bad
//! input) are definite failures; everything after is indeterminate for the
//! client (319 or a keeper error), as the dedup checker expects.

use super::coord::{MultiErr, OpResult, ZkErr};
use super::error::{
    TResult, TableError, KEEPER_EXCEPTION, TABLE_IS_READ_ONLY, TOO_FEW_LIVE_REPLICAS, UNKNOWN_STATUS_OF_INSERT,
    UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
};
use super::events::Ev;
use super::hooks::Hooks;
use super::replica::{wall_ms, Replica};
use drift_table::block::split_insert;
use drift_table::dedup::{block_id, token_block_id};
use drift_table::format::{self, Checksums};
use drift_table::insert::{
    BlockInsert, BlockSpec, Defects, Done, Fail, Input, MultiFail, Note, Now, Refused, Resolution, Settle, Step,
    BLOCK_ATTEMPTS_MAX,
};
use drift_table::part::PartInfo;
use drift_table::quorum;
use drift_table::Block;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest an insert waits at its commit under the `hold-commits` hook.
const HOLD_COMMITS_MAX: Duration = Duration::from_secs(60);

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

/// A coordinator call's failure as the insert's core tells them apart.
fn fail_of(e: &ZkErr) -> Fail {
    match e {
        ZkErr::NodeExists => Fail::NodeExists,
        ZkErr::NoNode => Fail::NoNode,
        ZkErr::BadVersion => Fail::BadVersion,
        ZkErr::Lost(why) => Fail::Lost(why.clone()),
        ZkErr::NoSession => Fail::NoSession,
        other => Fail::Other(other.to_string()),
    }
}

fn multi_fail(e: MultiErr) -> MultiFail {
    MultiFail {
        index: e.index,
        fail: fail_of(&e.err),
    }
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
        let status = if s.quorum_parallel {
            None
        } else {
            c.get(&self.paths.quorum_status())
                .await
                .map_err(|e| keeper_error("quorum status", &e))?
                .map(|(d, _)| d)
        };
        quorum::may_start(required, active, total, s.quorum_parallel, status.as_deref()).map_err(|e| {
            let code = match e {
                quorum::NotNow::TooFewReplicas { .. } => TOO_FEW_LIVE_REPLICAS,
                quorum::NotNow::PreviousWaiting(_) => UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
            };
            TableError::new(code, e.to_string())
        })?;
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
        let armed = |f: &std::sync::atomic::AtomicBool| f.load(std::sync::atomic::Ordering::SeqCst);
        let mut b = BlockInsert::new(BlockSpec {
            paths: self.paths.clone(),
            replica: self.name.clone(),
            partition: partition.to_string(),
            id: id.map(str::to_string),
            sums: sums.encode(),
            quorum,
            quorum_parallel: s.quorum_parallel,
            naive: self.naive_insert_path,
            // the test-only defects: look for no id, leave none behind,
            // or keep no part
            defects: Defects {
                skip_dedup: armed(&self.hooks.skip_dedup),
                no_block_id: armed(&self.hooks.no_block_id),
                lose_part: armed(&self.hooks.lose_part),
            },
        });
        // shared with other commits, exclusive of a queue reload (see
        // Replica::reload_gate): held from the commit until its part is
        // current, let go before a long resolution
        let mut commit_gate = None;
        let mut input = Input::Start;
        let t0 = Instant::now();
        let now = || Now {
            wall_ms: wall_ms().max(0) as u64,
            mono_ms: t0.elapsed().as_millis() as u64,
        };
        loop {
            let step = b.on(now(), input);
            self.notes(b.take_notes());
            input = match step {
                Step::Allocate(ops) => {
                    let r = self.timed_multi(&ops).await;
                    Input::Allocated(match r {
                        Ok(results) => match results.last() {
                            Some(OpResult::Created(p)) => Ok(p.clone()),
                            _ => Err(MultiFail {
                                index: None,
                                fail: Fail::Other("the lock's create returned no path".into()),
                            }),
                        },
                        Err(e) => Err(multi_fail(e)),
                    })
                }
                Step::CheckId(path) => {
                    self.events.add(Ev::InsertKeeperRoundTrips, 1);
                    Input::IdExists(
                        self.coord
                            .exists(&path)
                            .await
                            .map(|n| n.is_some())
                            .map_err(|e| fail_of(&e)),
                    )
                }
                Step::MakeDir(path) => Input::DirMade(self.coord.ensure(&path).await.map_err(|e| fail_of(&e))),
                Step::WritePart(name) => {
                    let (store, f2, n2) = (self.store.clone(), files.clone(), name.clone());
                    let written = tokio::task::spawn_blocking(move || store.write_part(&n2, &f2))
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| e.to_string()));
                    Input::PartWritten(written)
                }
                Step::Commit(ops) => {
                    self.hold_commit(&ops).await;
                    commit_gate = Some(self.reload_gate.read().await);
                    let r = self.timed_multi(&ops).await;
                    let r = self.commit_reply_hooks(&ops, r).map(|_| ()).map_err(multi_fail);
                    if r.is_err() {
                        commit_gate = None;
                    }
                    Input::Committed(r)
                }
                Step::DefectCommit(ops) => {
                    Input::Committed(self.coord.multi(&ops).await.map(|_| ()).map_err(multi_fail))
                }
                Step::Discard { part, lock } => {
                    self.discard(&part, &lock).await;
                    Input::Discarded
                }
                step @ (Step::DeleteLock(_) | Step::PartNodeExists(_) | Step::SleepUntil(_)) => {
                    self.settle_step(step, now().mono_ms).await
                }
                Step::Done(done) => return self.block_done(done, block, quorum, id, s, commit_gate).await,
            };
        }
    }

    /// A multi of the insert, counted and timed.
    async fn timed_multi(&self, ops: &[drift_table::zk::KeeperOp]) -> Result<Vec<OpResult>, MultiErr> {
        self.events.add(Ev::InsertKeeperRoundTrips, 1);
        let t = Instant::now();
        let r = self.coord.multi(ops).await;
        self.events.add(Ev::InsertKeeperMicros, t.elapsed().as_micros() as u64);
        r
    }

    /// The `hold-commits` hook: the commit waits while it is on (at most
    /// [`HOLD_COMMITS_MAX`]).
    async fn hold_commit(&self, ops: &[drift_table::zk::KeeperOp]) {
        if !self.hooks.hold_commits.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let part = ops
            .get(2)
            .map(|o| o.path().rsplit('/').next().unwrap_or_default().to_string());
        self.log("commit_held", serde_json::json!({"part": part}));
        let until = Instant::now() + HOLD_COMMITS_MAX;
        while self.hooks.hold_commits.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The hooks that lose a commit's answer after it happened:
    /// `cut-after-commit` (and the coordinator cut) and
    /// `fail-commit-reply`.
    fn commit_reply_hooks(
        &self,
        ops: &[drift_table::zk::KeeperOp],
        r: Result<Vec<OpResult>, MultiErr>,
    ) -> Result<Vec<OpResult>, MultiErr> {
        let part = ops
            .get(2)
            .map(|o| o.path().rsplit('/').next().unwrap_or_default().to_string());
        match r {
            Ok(_) if Hooks::take(&self.hooks.cut_after_commit) => {
                self.log(
                    "fault_hook",
                    serde_json::json!({"hook": "cut-after-commit", "part": part}),
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
                    serde_json::json!({"hook": "fail-commit-reply", "part": part}),
                );
                Err(MultiErr {
                    index: None,
                    err: ZkErr::Lost("the reply was dropped (fault hook)".into()),
                })
            }
            other => other,
        }
    }

    /// One step of settling a lost commit ([`Resolution`]): the lock's
    /// delete (not tried without a session), the part node's check, or a
    /// wait (from `mono_ms`, the monotonic clock now).
    async fn settle_step(&self, step: Step, mono_ms: u64) -> Input {
        match step {
            Step::DeleteLock(lock) if self.coord.has_session() => {
                Input::LockDeleted(self.coord.delete(&lock, None).await.map_err(|e| fail_of(&e)))
            }
            Step::DeleteLock(_) => Input::LockDeleted(Err(Fail::NoSession)),
            Step::PartNodeExists(p) => Input::PartNode(
                self.coord
                    .exists(&p)
                    .await
                    .map(|n| n.is_some())
                    .map_err(|e| fail_of(&e)),
            ),
            Step::SleepUntil(at) => {
                tokio::time::sleep(Duration::from_millis(at.saturating_sub(mono_ms))).await;
                Input::Woke
            }
            other => Input::PartWritten(Err(format!("not a step of settling a commit: {other:?}"))),
        }
    }

    /// The insert core's notes as log lines.
    fn notes(&self, notes: Vec<Note>) {
        for n in notes {
            match n {
                Note::CommitResolved { part, committed } => self.log(
                    "commit_resolved",
                    serde_json::json!({"part": part, "committed": committed}),
                ),
                Note::DefectLostPart { part, block_id } => self.log(
                    "defect_lost_part",
                    serde_json::json!({"part": part, "block_id": block_id}),
                ),
            }
        }
    }

    /// How a block ended, as the client's answer: a committed part made
    /// current (then its quorum awaited), a duplicate (its quorum
    /// awaited), or the error.
    async fn block_done(
        self: &Arc<Self>,
        done: Done,
        block: Block,
        quorum: u32,
        id: Option<&str>,
        s: &InsertSettings,
        commit_gate: Option<tokio::sync::RwLockReadGuard<'_, ()>>,
    ) -> TResult<BlockOutcome> {
        match done {
            Done::Committed(part) => {
                self.committed(&part, Arc::new(block));
                drop(commit_gate);
                if quorum > 0 {
                    self.wait_quorum(&part, s).await?;
                }
                Ok(BlockOutcome::Committed(part))
            }
            Done::DefectLost(part) => Ok(BlockOutcome::Committed(part)),
            Done::Duplicate => {
                self.events.add(Ev::DuplicatedInsertedBlocks, 1);
                if quorum > 0 {
                    self.wait_duplicate_quorum(id, s).await?;
                }
                Ok(BlockOutcome::Duplicate)
            }
            Done::Refused(r) => Err(match r {
                Refused::Keeper(why) | Refused::LockGone(why) | Refused::PartWrite(why) => {
                    TableError::new(KEEPER_EXCEPTION, why)
                }
                Refused::QuorumBusy => TableError::new(
                    UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE,
                    "Quorum for previous write has not been satisfied yet (another quorum insert committed first)",
                ),
                Refused::NotCommitted => TableError::new(
                    KEEPER_EXCEPTION,
                    format!("the block was found not committed {BLOCK_ATTEMPTS_MAX} times"),
                ),
            }),
            Done::Unknown { part, lock, why } => {
                // the background resolver settles it once it can
                self.st().precommitted.insert(part.clone(), lock);
                self.events.add(Ev::UnknownStatusInserts, 1);
                Err(TableError::new(
                    UNKNOWN_STATUS_OF_INSERT,
                    format!("Unknown status of insert: the commit of part {part} got no answer ({why}) and the coordinator could not be asked in time"),
                ))
            }
        }
    }

    /// Settles a commit whose reply was lost, through its lock (the same
    /// [`Resolution`] as an insert's). `None` when the coordinator could
    /// not be asked before `deadline`.
    pub async fn resolve(&self, name: &str, lock: &str, deadline: Instant) -> Option<Resolved> {
        let t0 = Instant::now();
        let mono = || t0.elapsed().as_millis() as u64;
        let left = deadline.saturating_duration_since(t0).as_millis() as u64;
        let (mut r, mut step) = Resolution::start(&self.paths, name, lock, left);
        loop {
            let input = self.settle_step(step, mono()).await;
            match r.on(mono(), input) {
                Settle::Step(next) => step = next,
                Settle::Settled(Some(true)) => return Some(Resolved::Committed),
                Settle::Settled(Some(false)) => return Some(Resolved::NotCommitted),
                Settle::Settled(None) => return None,
            }
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
                            Ok(d) if quorum::wait_over(part, false, d.as_ref().map(|(d, _)| &d[..])) => break,
                            _ => {}
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
