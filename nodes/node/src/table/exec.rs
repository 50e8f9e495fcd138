//! Running queue entries: fetches, merges, drops.
//!
//! An entry's effect becomes durable in one multi that records the result
//! under this replica (`parts/<new part>`, the replaced parts removed) and
//! deletes the queue entry; a part fetched for a quorum insert also adds
//! this replica to the quorum node (or, completing it, deletes it) in the
//! same multi. A crash before the multi leaves the entry queued and, at
//! most, an unlisted part on disk that the restart detaches.
//!
//! A fetched part is checked against its checksums before it is written;
//! a part that fails is refused, counted and fetched again after backoff.
//! A GET_PART no replica can serve stays queued (retried with backoff),
//! except a quorum insert's part that no replica lists at all: that part
//! is lost for good, so its quorum is marked failed and its block id
//! removed (a retry of the insert then inserts anew), as ClickHouse does.

use super::coord::{MultiErr, ZkErr};
use super::events::Ev;
use super::hooks::Hooks;
use super::interserver;
use super::replica::Replica;
use drift_table::entry::{EntryKind, LogEntry};
use drift_table::format;
use drift_table::part::PartInfo;
use drift_table::queue::Selected;
use drift_table::quorum;
use drift_table::zk::KeeperOp;
use drift_table::Block;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often the runner looks at the queue without being woken (backoffs
/// expire on their own).
const RUNNER_PERIOD: Duration = Duration::from_millis(100);

/// How an entry ended.
enum Outcome {
    Done,
    /// Leave it queued; retry after backoff.
    Retry(String),
    /// Remove it without doing it (its part is lost for good).
    Dropped(String),
}

/// Where a part is fetched from: the replica, its interserver address, the
/// part (the one wanted or one covering it), and its listing in the
/// coordinator when the search already read it.
struct Source {
    replica: String,
    host: String,
    part: PartInfo,
    listing: Option<Vec<u8>>,
}

impl Replica {
    /// Selects runnable entries and runs each on its own task.
    pub async fn runner_loop(self: Arc<Self>) {
        loop {
            loop {
                let selected = {
                    let mut st = self.st();
                    if st.readonly.is_some() {
                        None
                    } else {
                        let (f, m) = (
                            self.schema.settings.fetch_pool_size,
                            if st.merges_stopped {
                                0
                            } else {
                                self.schema.settings.merge_pool_size
                            },
                        );
                        let now = self.now_ms();
                        st.queue.select(now, f, m)
                    }
                };
                let Some(sel) = selected else { break };
                let me = self.clone();
                tokio::spawn(async move { me.run_entry(sel).await });
            }
            let _ = tokio::time::timeout(RUNNER_PERIOD, self.wake.notified()).await;
        }
    }

    async fn run_entry(self: Arc<Self>, sel: Selected) {
        let outcome = match &sel.entry.kind {
            EntryKind::GetPart { part, quorum, block_id } => {
                self.get_part(&sel, part, *quorum, block_id.as_deref()).await
            }
            EntryKind::MergeParts { parts, into } => self.merge_parts(&sel, parts, into).await,
            EntryKind::DropRange { range } => self.drop_range(&sel, range).await,
        };
        let outcome = outcome.unwrap_or_else(|e| Outcome::Retry(e.to_string()));
        match outcome {
            Outcome::Done => {}
            Outcome::Retry(why) => {
                let now = self.now_ms();
                self.st().queue.finish_err(&sel.znode, now, &why);
            }
            Outcome::Dropped(why) => {
                let mut st = self.st();
                if let Err(e) = st.queue.drop_running(&sel.znode) {
                    drop(st);
                    self.log(
                        "queue_remove_failed",
                        serde_json::json!({"entry": sel.znode, "dropped": why, "error": e}),
                    );
                }
            }
        }
        self.wake.notify_one();
    }

    fn queue_entry_path(&self, znode: &str) -> String {
        format!("{}/{znode}", self.paths.queue_of(&self.name))
    }

    /// Commits an entry's result: `ops` plus the queue entry's delete.
    /// Returns the parts that left the current set.
    async fn commit_entry(&self, sel: &Selected, ops: Vec<KeeperOp>) -> Result<(), ZkErr> {
        self.commit_entry_as(sel, ops, None).await
    }

    /// [`Replica::commit_entry`] for an entry done by installing `covering`
    /// (a part that contains the entry's own): it joins the current set
    /// first, so the entry's part lands covered.
    async fn commit_entry_as(
        &self,
        sel: &Selected,
        ops: Vec<KeeperOp>,
        covering: Option<&PartInfo>,
    ) -> Result<(), ZkErr> {
        let (ops, queue_op) = drift_table::replica::entry_done(ops, &self.queue_entry_path(&sel.znode));
        let _commit = self.reload_gate.read().await;
        match self.coord.multi(&ops).await {
            Ok(_) if Hooks::take(&self.hooks.fail_entry_commit_reply) => {
                self.log(
                    "fault_hook",
                    serde_json::json!({"hook": "fail-entry-commit-reply", "entry": sel.znode}),
                );
                return Err(ZkErr::Lost("the reply was dropped (fault hook)".into()));
            }
            Ok(_) => {}
            // nothing but the entry's removal, and the entry is gone: an
            // earlier run of it committed and lost the reply
            Err(MultiErr {
                index: Some(i),
                err: ZkErr::NoNode,
            }) if i == queue_op && queue_op == 0 => {}
            // a listing this commit replaces, or the entry, is gone: an
            // earlier commit landed with other ops and lost its answer;
            // no retry from this memory can succeed (the simulator found
            // an entry stuck so, seed 135 of its first sweep with quorum
            // inserts)
            Err(MultiErr {
                index: Some(i),
                err: ZkErr::NoNode,
            }) if drift_table::replica::commit_shows_stale_memory(
                &self.paths,
                &ops,
                i,
                &self.queue_entry_path(&sel.znode),
            ) =>
            {
                drop(_commit);
                self.reload_stale(&sel.znode).await;
                return Err(ZkErr::NoNode);
            }
            Err(e) => return Err(e.err),
        }
        self.finish_local(sel, covering);
        Ok(())
    }

    /// Reads the queue and the current parts again, under the pull lock,
    /// after a commit found the coordinator ahead of memory.
    async fn reload_stale(&self, entry: &str) {
        let _pull = self.pull_lock.lock().await;
        let error = self.load_queue().await.err();
        self.log(
            "stale_commit_reloaded",
            serde_json::json!({"entry": entry, "error": error}),
        );
    }

    /// The entry's result, committed at the coordinator, in the replica's
    /// memory: the part current (and `covering`, when that is what it
    /// installed), the entry gone, what they replace outdated.
    fn finish_local(&self, sel: &Selected, covering: Option<&PartInfo>) {
        let gone = {
            let mut st = self.st();
            st.last_queue_update_ms = super::replica::wall_ms();
            let mut gone = Vec::new();
            if let Some(c) = covering {
                match st.queue.add_current(c.clone()) {
                    Ok(g) => gone = g,
                    Err(e) => {
                        drop(st);
                        self.log(
                            "queue_finish_refused",
                            serde_json::json!({"entry": sel.znode, "error": e}),
                        );
                        return;
                    }
                }
            }
            // refused only when a reload after an earlier run's commit left
            // the entry out; that reload took the part in from the listing
            st.queue.finish_ok(&sel.znode).map(|mut g| {
                g.append(&mut gone);
                g
            })
        };
        match gone {
            Ok(gone) => self.outdate(gone),
            Err(e) => self.log(
                "queue_finish_refused",
                serde_json::json!({"entry": sel.znode, "error": e}),
            ),
        }
    }

    /// Ops that remove this replica's znodes for `parts` (the ones a new
    /// part replaces).
    fn drop_part_ops(&self, parts: &[PartInfo]) -> Vec<KeeperOp> {
        parts
            .iter()
            .map(|p| KeeperOp::Delete {
                path: self.paths.my_part(&p.name()),
                version: -1,
            })
            .collect()
    }

    /// Current parts a new part would replace.
    fn replaced_by(&self, part: &PartInfo) -> Vec<PartInfo> {
        self.st()
            .queue
            .current()
            .contained_by(part)
            .into_iter()
            .filter(|p| p != part)
            .collect()
    }

    fn have(&self, part: &PartInfo) -> bool {
        self.st().queue.current().containing(part).is_some()
    }

    /// Installs a part's files (checked) and caches its rows.
    /// Writes a fetched part once its files match their checksums and
    /// those checksums are the ones `listed` in the coordinator for it
    /// (as its writer committed them), not merely the ones the transfer
    /// itself carried.
    async fn install(
        &self,
        part: &PartInfo,
        files: std::collections::BTreeMap<String, Vec<u8>>,
        listed: &format::Checksums,
    ) -> Result<format::Checksums, String> {
        let sums = drift_table::replica::check_fetched(&self.schema, &files, listed).map_err(|why| {
            self.events.add(Ev::ReplicatedPartChecksFailed, 1);
            format!("part {part} refused: {why}")
        })?;
        let block = format::decode_part(&self.schema, &files).map_err(|e| format!("part {part}: {e}"))?;
        let name = part.name();
        let store = self.store.clone();
        let name2 = name.clone();
        let written = tokio::task::spawn_blocking(move || store.write_part(&name2, &files))
            .await
            .map_err(|e| e.to_string())?;
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.to_string()),
        }
        self.st().blocks.insert(name, Arc::new(block));
        Ok(sums)
    }

    /// The quorum ops for a part this replica now holds: adds it to the
    /// quorum node naming the part, or deletes the node when that completes
    /// it. Empty when no quorum waits for this part.
    async fn quorum_ops(&self, part: &PartInfo) -> Result<Vec<KeeperOp>, ZkErr> {
        for path in quorum::nodes_of(&self.paths, part) {
            let guard = self.status_guard(&path).await?;
            let Some((data, stat)) = self.coord.get(&path).await? else {
                continue;
            };
            let guard = guard.as_ref().map(|(d, v)| (&d[..], *v));
            if let Some(ops) = quorum::held_ops(&self.paths, &self.name, part, &path, &data, stat.version, guard) {
                return Ok(ops);
            }
        }
        Ok(Vec::new())
    }

    /// `quorum/last_part` as read before the status node at `path` (none
    /// for a parallel node): see `drift_table::quorum::Guard`.
    async fn status_guard(&self, path: &str) -> Result<Option<(Vec<u8>, i32)>, ZkErr> {
        if path != self.paths.quorum_status() {
            return Ok(None);
        }
        Ok(self
            .coord
            .get(&self.paths.quorum_last_part())
            .await?
            .map(|(d, st)| (d, st.version)))
    }

    /// Records a part this replica now holds (and drops what it replaces)
    /// together with the entry's removal; retries a lost quorum race.
    async fn commit_part(
        &self,
        sel: &Selected,
        part: &PartInfo,
        sums: &format::Checksums,
        quorum: bool,
    ) -> Result<(), ZkErr> {
        // a covering part fetched in place of the entry's own
        let covering = (sel.entry.new_part() != part).then_some(part);
        for _ in 0..5 {
            let extra = if quorum {
                self.quorum_ops(part).await?
            } else {
                Vec::new()
            };
            let ops = drift_table::replica::held_ops(&self.paths, part, sums, &self.replaced_by(part), extra);
            match self.commit_entry_as(sel, ops, covering).await {
                // the quorum node changed under us: read it again
                Err(ZkErr::BadVersion) => continue,
                // listed already: only this replica lists its parts, and
                // only in this multi, so an earlier run of the entry
                // committed all of it (the part, what it replaces, the
                // quorum, the entry's removal) and lost the reply
                Err(ZkErr::NodeExists) => {
                    let _commit = self.reload_gate.read().await;
                    self.finish_local(sel, covering);
                    return Ok(());
                }
                other => return other,
            }
        }
        Err(ZkErr::Other("quorum node kept changing".into()))
    }

    async fn get_part(
        &self,
        sel: &Selected,
        part: &PartInfo,
        quorum: u32,
        block_id: Option<&str>,
    ) -> Result<Outcome, ZkErr> {
        if self.have(part) {
            // already here (our own insert, or a covering part)
            let mut ops = Vec::new();
            if quorum > 0 && sel.entry.source_replica != self.name && self.st().queue.current().contains_exactly(part) {
                ops.extend(self.quorum_ops(part).await?);
            }
            self.commit_entry(sel, ops).await?;
            return Ok(Outcome::Done);
        }
        if self.hooks.fetches_stopped.load(Ordering::SeqCst) {
            return Ok(Outcome::Retry("fetches are stopped".into()));
        }
        // first try: the writer, which has the part unless it was merged
        // away; after a failure, every replica
        let prefer = (sel.tries <= 1).then_some(sel.entry.source_replica.as_str());
        let (found, anywhere) = match self.find_replica_having(part, prefer).await? {
            Some(source) => (Some(source), true),
            // merged away everywhere: a part that contains it will do, as
            // ClickHouse fetches a covering part
            None => self.covering_part(part).await?,
        };
        let Some(found) = found else {
            let lost = if quorum > 0 {
                self.fail_quorum_if_lost(part, block_id).await?
            } else if !anywhere {
                // no replica at all, active or not, holds it or a part
                // that covers it: its writer lost it before anyone fetched
                // it (a wiped disk). ClickHouse calls it lost forever; the
                // entry goes (the rows are gone, and a checker must see
                // that, not a queue stuck on them)
                self.events.add(Ev::ReplicatedDataLoss, 1);
                self.log("part_lost_forever", serde_json::json!({"part": part.name()}));
                Some(format!(
                    "part {part} is lost forever: no replica holds it or a part covering it"
                ))
            } else {
                None
            };
            if let Some(why) = lost {
                self.coord
                    .delete(&self.queue_entry_path(&sel.znode), None)
                    .await
                    .or_else(|e| if e == ZkErr::NoNode { Ok(()) } else { Err(e) })?;
                return Ok(Outcome::Dropped(why));
            }
            self.events.add(Ev::ReplicatedPartFailedFetches, 1);
            // as ClickHouse records it in system.replication_queue
            let e = super::error::TableError::new(
                super::error::NO_REPLICA_HAS_PART,
                format!("No active replica has part {part} or covering part"),
            );
            return Ok(Outcome::Retry(e.to_string()));
        };
        if found.part != *part {
            self.log(
                "fetch_covering",
                serde_json::json!({"part": part.name(), "covering": found.part.name(), "from": found.replica}),
            );
        }
        let quorum = quorum > 0 && found.part == *part;
        self.fetch_and_commit(sel, found, quorum).await
    }

    async fn fetch_and_commit(&self, sel: &Selected, found: Source, quorum: bool) -> Result<Outcome, ZkErr> {
        let (part, source, host) = (&found.part, found.replica.as_str(), found.host.as_str());
        // what the part must be: its checksums as the source lists them in
        // the coordinator; a part it does not list is not fetched
        let listing = match found.listing {
            Some(data) => Some(data),
            None => self
                .coord
                .get(&self.paths.part_of(source, &part.name()))
                .await?
                .map(|(d, _)| d),
        };
        let listed = match listing {
            Some(data) => match format::Checksums::decode(&data) {
                Ok(sums) => sums,
                Err(e) => {
                    return Ok(Outcome::Retry(format!(
                        "part {part}: {source} lists checksums that do not decode: {e}"
                    )))
                }
            },
            None => return Ok(Outcome::Retry(format!("part {part}: {source} does not list it"))),
        };
        let files = match interserver::fetch(&self.http, &self.signer, host, &self.schema.name, &part.name()).await {
            Ok(f) => f,
            Err(e) => {
                self.hosts.lock().expect("hosts lock").remove(source);
                self.events.add(Ev::ReplicatedPartFailedFetches, 1);
                self.log(
                    "fetch_failed",
                    serde_json::json!({"part": part.name(), "from": source, "error": e}),
                );
                return Ok(Outcome::Retry(format!("fetch of {part} from {source}: {e}")));
            }
        };
        let sums = match self.install(part, files, &listed).await {
            Ok(s) => s,
            Err(e) => {
                self.events.add(Ev::ReplicatedPartFailedFetches, 1);
                self.log(
                    "fetch_refused",
                    serde_json::json!({"part": part.name(), "from": source, "error": e}),
                );
                return Ok(Outcome::Retry(e));
            }
        };
        self.commit_part(sel, part, &sums, quorum).await?;
        self.events.add(Ev::ReplicatedPartFetches, 1);
        Ok(Outcome::Done)
    }

    /// One pass over every replica's listing: the largest part an active
    /// replica (not this one) lists that contains `part`, with the replica
    /// and its interserver address; and whether any replica at all, active
    /// or not, lists `part` or a part containing it.
    async fn covering_part(&self, part: &PartInfo) -> Result<(Option<Source>, bool), ZkErr> {
        let mut search = drift_table::replica::CoveringSearch::new(part, &self.name);
        let replicas = self.coord.children(&self.paths.replicas()).await?;
        for r in &replicas {
            let listed = match self.coord.children(&self.paths.parts_of(r)).await {
                Ok(l) => l,
                Err(ZkErr::NoNode) => continue,
                Err(e) => return Err(e),
            };
            if search.listed(r, &listed) && self.coord.exists(&self.paths.is_active_of(r)).await?.is_some() {
                search.active(r);
            }
        }
        let (best, anywhere) = search.found();
        let found = match best {
            Some((replica, part)) => self.host_of(&replica).await?.map(|host| Source {
                replica,
                host,
                part,
                listing: None,
            }),
            None => None,
        };
        Ok((found, anywhere))
    }

    /// A replica's interserver address, cached (a failed fetch forgets it).
    async fn host_of(&self, r: &str) -> Result<Option<String>, ZkErr> {
        if let Some(h) = self.hosts.lock().expect("hosts lock").get(r) {
            return Ok(Some(h.clone()));
        }
        let Some((host, _)) = self.coord.get(&self.paths.host_of(r)).await? else {
            return Ok(None);
        };
        let host = String::from_utf8_lossy(&host).to_string();
        self.hosts
            .lock()
            .expect("hosts lock")
            .insert(r.to_string(), host.clone());
        Ok(Some(host))
    }

    /// A replica (not this one) that lists `part`, with its interserver
    /// address and the listing: `prefer` if it lists it (one round trip),
    /// else an active one found by asking each.
    async fn find_replica_having(&self, part: &PartInfo, prefer: Option<&str>) -> Result<Option<Source>, ZkErr> {
        let source = |replica: &str, host, listing| Source {
            replica: replica.to_string(),
            host,
            part: part.clone(),
            listing: Some(listing),
        };
        if let Some(r) = prefer.filter(|r| *r != self.name) {
            if let Some((listing, _)) = self.coord.get(&self.paths.part_of(r, &part.name())).await? {
                if let Some(host) = self.host_of(r).await? {
                    return Ok(Some(source(r, host, listing)));
                }
            }
        }
        let replicas = self.coord.children(&self.paths.replicas()).await?;
        for r in replicas.iter().filter(|r| **r != self.name) {
            let Some((listing, _)) = self.coord.get(&self.paths.part_of(r, &part.name())).await? else {
                continue;
            };
            if self.coord.exists(&self.paths.is_active_of(r)).await?.is_none() {
                continue;
            }
            if let Some(host) = self.host_of(r).await? {
                return Ok(Some(source(r, host, listing)));
            }
        }
        Ok(None)
    }

    /// If no replica (active or not) lists `part` and a quorum node still
    /// waits for it, the insert's part is lost: mark its quorum failed and
    /// remove its block id, in one multi. Returns why, when it did.
    async fn fail_quorum_if_lost(&self, part: &PartInfo, block_id: Option<&str>) -> Result<Option<String>, ZkErr> {
        let name = part.name();
        // another replica gave up on it already
        if self
            .coord
            .exists(&self.paths.quorum_failed_part(&name))
            .await?
            .is_some()
        {
            return Ok(Some(format!("part {name} is on no replica: its quorum failed")));
        }
        let replicas = self.coord.children(&self.paths.replicas()).await?;
        for r in &replicas {
            if self.coord.exists(&self.paths.part_of(r, &name)).await?.is_some() {
                return Ok(None);
            }
        }
        let mut quorum_node = None;
        for path in quorum::nodes_of(&self.paths, part) {
            let guard = self.status_guard(&path).await?;
            if let Some((data, stat)) = self.coord.get(&path).await? {
                if quorum::decode_data(&data).is_some_and(|q| q.part == *part) {
                    quorum_node = Some((path, stat.version, guard));
                    break;
                }
            }
        }
        let Some((qpath, version, guard)) = quorum_node else {
            return Ok(None);
        };
        let holder = match block_id {
            Some(id) => self
                .coord
                .get(&self.paths.block(id))
                .await?
                .map(|(d, st)| (id, d, st.version)),
            None => None,
        };
        let ops = quorum::fail_ops(
            &self.paths,
            part,
            &qpath,
            version,
            guard.as_ref().map(|(d, v)| (&d[..], *v)),
            holder.as_ref().map(|(id, d, v)| (*id, &d[..], *v)),
        );
        match self.coord.multi(&ops).await {
            Ok(_) => {
                self.events.add(Ev::ReplicatedDataLoss, 1);
                self.log("quorum_failed", serde_json::json!({"part": name, "block_id": block_id}));
                Ok(Some(format!("part {name} is on no replica: its quorum failed")))
            }
            // someone else did it, or the part appeared: look again later
            Err(e) if matches!(e.err, ZkErr::NoNode | ZkErr::BadVersion | ZkErr::NodeExists) => Ok(None),
            Err(e) => Err(e.err),
        }
    }

    async fn merge_parts(&self, sel: &Selected, parts: &[PartInfo], into: &PartInfo) -> Result<Outcome, ZkErr> {
        if self.have(into) {
            self.commit_entry(sel, Vec::new()).await?;
            return Ok(Outcome::Done);
        }
        let all_here = {
            let st = self.st();
            parts.iter().all(|p| st.queue.current().contains_exactly(p))
        };
        if !all_here {
            // the sources are not all here: take the merged part instead
            if self.hooks.fetches_stopped.load(Ordering::SeqCst) {
                return Ok(Outcome::Retry("fetches are stopped".into()));
            }
            return match self.find_replica_having(into, None).await? {
                Some(source) => self.fetch_and_commit(sel, source, false).await,
                None => Ok(Outcome::Retry(format!(
                    "source parts of {into} are not all here and no replica has {into} yet"
                ))),
            };
        }
        let mut blocks = Vec::with_capacity(parts.len());
        for p in parts {
            match self.load_part(&p.name()) {
                Ok(b) => blocks.push((*b).clone()),
                Err(e) => return Ok(Outcome::Retry(e)),
            }
        }
        let schema = self.schema.clone();
        let merged = tokio::task::spawn_blocking(move || {
            let b = Block::merge(&schema, &blocks);
            format::encode_part(&schema, &b)
        })
        .await
        .map_err(|e| ZkErr::Other(e.to_string()))?;
        // a part made here: its own checksums are the ones to match
        let own = format::Checksums::of(&merged);
        let sums = match self.install(into, merged, &own).await {
            Ok(s) => s,
            Err(e) => return Ok(Outcome::Retry(e)),
        };
        self.commit_part(sel, into, &sums, false).await?;
        self.events.add(Ev::ReplicatedPartMerges, 1);
        Ok(Outcome::Done)
    }

    async fn drop_range(&self, sel: &Selected, range: &PartInfo) -> Result<Outcome, ZkErr> {
        let gone = self.st().queue.current().contained_by(range);
        self.commit_entry(sel, self.drop_part_ops(&gone)).await?;
        Ok(Outcome::Done)
    }
}

/// Decodes a log or queue entry's text.
pub fn decode_entry(data: &[u8]) -> Result<LogEntry, String> {
    std::str::from_utf8(data)
        .map_err(|e| e.to_string())
        .and_then(|t| LogEntry::decode(t).map_err(|e| e.to_string()))
}
