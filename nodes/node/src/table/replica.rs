//! One replica of one table: its state, its session, and the tasks that
//! keep it in step with the shared log.
//!
//! Tasks (all on the table runtime; none holds the state lock across an
//! await):
//!
//! * the session loop — connects, registers the replica (creating it,
//!   cloning a healthy replica when it is new, wiped or lost, reconciling
//!   local parts with the coordinator otherwise), marks it active, stands
//!   for leader, and makes the replica read-only whenever no session is
//!   live;
//! * the log puller — copies new log entries into the replica's queue and
//!   moves `log_pointer` in the same multi;
//! * the queue runner — runs entries out of order (`exec.rs`);
//! * the leader's chores — merge assignment and cleanup (`leader.rs`);
//! * housekeeping — removes replaced parts after [`OLD_PARTS_LIFETIME`].
//!
//! Fault model: the coordinator may be unreachable, slow or lose replies;
//! the session may expire; the process may be killed at any point (every
//! durable step is a coordinator multi or an fsynced rename); another
//! replica's part may arrive corrupt. Not covered: a coordinator that loses
//! acknowledged writes, or disks that lie about fsync.

use super::coord::{Coordinator, ZkErr};
use super::events::{Ev, Events};
use super::hooks::Hooks;
use super::store::PartStore;
use drift_table::entry::LogEntry;
use drift_table::format;
use drift_table::part::{ActivePartSet, PartInfo};
use drift_table::queue::Queue;
use drift_table::replica::{PullNext, Pulled, Pulls};
use drift_table::schema::Schema;
use drift_table::zk::{CreateMode, Paths};
use drift_table::Block;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// How long a part replaced by a merge (or covered by a fetched part) stays
/// on disk: long enough for a replica fetching it to finish.
pub const OLD_PARTS_LIFETIME: Duration = Duration::from_secs(10);
/// How often the log puller looks without a watch firing.
pub const PULL_PERIOD: Duration = Duration::from_secs(1);
/// How long the puller lets new log entries gather after its watch fires.
pub const PULL_DEBOUNCE: Duration = Duration::from_millis(5);
/// Pause between attempts to get a session.
pub const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub struct ReplicaConfig {
    pub schema: Schema,
    /// The replica's name (`r<node id>`).
    pub name: String,
    pub node: u64,
    pub interserver: SocketAddr,
    pub naive_insert_path: bool,
    /// The cluster's secret, which signs part fetches between replicas.
    pub secret: Vec<u8>,
    /// Every peer id of the cluster (who may fetch parts).
    pub peers: std::collections::BTreeSet<u64>,
}

/// What the replica holds in memory. Guarded by one mutex taken briefly.
pub struct State {
    pub queue: Queue,
    /// Decoded rows of every part on disk (active or outdated).
    pub blocks: BTreeMap<String, Arc<Block>>,
    /// Parts replaced in the current set, with when.
    pub outdated: Vec<(PartInfo, Instant)>,
    /// Next log index to copy, and the version of `log_pointer`'s znode.
    pub log_pointer: u64,
    pub log_pointer_version: i32,
    pub is_leader: bool,
    /// Why the replica refuses writes (no session, not registered yet).
    pub readonly: Option<String>,
    pub merges_stopped: bool,
    /// Parts written whose commit outcome is not known yet → the path of
    /// the block number lock their commit deletes.
    pub precommitted: BTreeMap<String, String>,
    /// Whether the replica has been registered in this process.
    pub registered: bool,
    pub last_queue_update_ms: i64,
}

pub struct Replica {
    pub schema: Schema,
    pub name: String,
    pub node: u64,
    pub paths: Paths,
    pub store: Arc<PartStore>,
    pub coord: Coordinator,
    pub hooks: Hooks,
    pub events: Events,
    pub interserver: SocketAddr,
    pub naive_insert_path: bool,
    pub http: reqwest::Client,
    /// Signs this replica's part fetches.
    pub signer: crate::http_auth::Signer,
    /// Checks the part fetches other replicas send.
    pub verifier: crate::http_auth::Verifier,
    /// Other replicas' interserver addresses, as last read.
    pub hosts: Mutex<BTreeMap<String, String>>,
    state: Mutex<State>,
    /// Wakes the queue runner (new entries, finished entries).
    pub wake: Notify,
    /// Serialises log pulls.
    pub pull_lock: tokio::sync::Mutex<()>,
    /// Commits that change what this replica lists (an insert's, a
    /// fetch's, a merge's) hold it shared across their multi and the
    /// current set's update; a queue reload holds it alone, so the set it
    /// builds from the coordinator's listing misses no commit.
    pub reload_gate: tokio::sync::RwLock<()>,
    /// Serialises merge assignment on this replica.
    pub assign_lock: tokio::sync::Mutex<()>,
    pub started: Instant,
}

impl Replica {
    pub fn new(cfg: ReplicaConfig, store: PartStore, coord: Coordinator) -> Replica {
        let paths = Paths::new(&cfg.schema.settings.zookeeper_path, &cfg.name);
        Replica {
            paths,
            store: Arc::new(store),
            coord,
            name: cfg.name,
            node: cfg.node,
            hooks: Hooks::default(),
            events: Events::default(),
            interserver: cfg.interserver,
            naive_insert_path: cfg.naive_insert_path,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("an HTTP client without TLS builds"),
            signer: crate::http_auth::Signer::new(cfg.secret.clone(), cfg.node),
            verifier: crate::http_auth::Verifier::new(cfg.secret, cfg.node, cfg.peers),
            hosts: Mutex::new(BTreeMap::new()),
            state: Mutex::new(State {
                queue: Queue::new(ActivePartSet::new()),
                blocks: BTreeMap::new(),
                outdated: Vec::new(),
                log_pointer: 0,
                log_pointer_version: -1,
                is_leader: false,
                readonly: Some("starting".into()),
                merges_stopped: false,
                precommitted: BTreeMap::new(),
                registered: false,
                last_queue_update_ms: 0,
            }),
            schema: cfg.schema,
            wake: Notify::new(),
            pull_lock: tokio::sync::Mutex::new(()),
            reload_gate: tokio::sync::RwLock::new(()),
            assign_lock: tokio::sync::Mutex::new(()),
            started: Instant::now(),
        }
    }

    pub fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("replica state lock not poisoned")
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn log(&self, event: &str, fields: serde_json::Value) {
        let mut m = serde_json::json!({
            "ts_ms": wall_ms(), "node": self.node, "table": self.schema.name, "replica": self.name, "event": event
        });
        if let (Some(o), serde_json::Value::Object(f)) = (m.as_object_mut(), fields) {
            o.extend(f);
        }
        eprintln!("{m}");
    }

    pub fn readonly(&self) -> Option<String> {
        self.st().readonly.clone()
    }

    fn set_readonly(&self, why: Option<&str>) {
        let mut st = self.st();
        let changed = st.readonly.as_deref() != why;
        st.readonly = why.map(str::to_string);
        if why.is_some() {
            st.is_leader = false;
        }
        drop(st);
        if changed {
            self.log("readonly", serde_json::json!({"why": why}));
        }
    }

    /// Loads the rows of a part on disk into the cache (checked).
    pub fn load_part(&self, name: &str) -> Result<Arc<Block>, String> {
        if let Some(b) = self.st().blocks.get(name) {
            return Ok(b.clone());
        }
        let files = self.store.read_checked(&self.schema, name)?;
        let block = Arc::new(format::decode_part(&self.schema, &files).map_err(|e| format!("part {name}: {e}"))?);
        self.st().blocks.insert(name.to_string(), block.clone());
        Ok(block)
    }

    /// Records parts that left the current set; they are removed from disk
    /// after [`OLD_PARTS_LIFETIME`].
    pub fn outdate(&self, parts: Vec<PartInfo>) {
        let now = Instant::now();
        self.st().outdated.extend(parts.into_iter().map(|p| (p, now)));
    }

    // ---- the session ------------------------------------------------------

    /// Keeps a session: connect, activate, watch it end, repeat.
    pub async fn session_loop(self: Arc<Self>) {
        loop {
            self.set_readonly(Some("no coordinator session"));
            if let Err(e) = self.coord.connect().await {
                self.log("connect_failed", serde_json::json!({"error": e.to_string()}));
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
            match self.activate().await {
                Ok(()) => self.set_readonly(None),
                Err(e) => {
                    self.log("activate_failed", serde_json::json!({"error": e}));
                    self.coord.drop_session();
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            }
            self.wake.notify_one();
            // the session ends when the client reports it terminated
            // the session ends when the client reports it terminated, or
            // when it is dropped (a cut); no client clone is kept here,
            // so a dropped session is really let go
            let mut w = match self.coord.client() {
                Ok(client) => client.state_watcher(),
                Err(_) => continue,
            };
            loop {
                tokio::select! {
                    s = w.changed() => {
                        if s.is_terminated() {
                            self.log("session_ended", serde_json::json!({"state": format!("{s:?}")}));
                            break;
                        }
                    }
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {
                        if !self.coord.has_session() {
                            self.log("session_ended", serde_json::json!({"state": "dropped"}));
                            break;
                        }
                    }
                }
            }
            self.coord.drop_session();
        }
    }

    /// After a new session: the table's nodes, the replica's registration
    /// (first time in this process), `is_active`, `host`, the candidacy.
    async fn activate(&self) -> Result<(), String> {
        let c = &self.coord;
        let e = |what: &str| {
            let what = what.to_string();
            move |err: ZkErr| format!("{what}: {err}")
        };
        for p in self.paths.table_skeleton() {
            c.ensure(&p).await.map_err(e(&p))?;
        }
        c.ensure(&self.paths.quorum_last_part())
            .await
            .map_err(e("quorum/last_part"))?;
        let registered = self.st().registered;
        let lost = match c.get(&self.paths.is_lost_of(&self.name)).await.map_err(e("is_lost"))? {
            Some((d, _)) => d == b"1",
            None => false,
        };
        if !registered || lost {
            self.register(lost).await?;
            self.st().registered = true;
        }
        self.mark_active().await?;
        c.set(
            &self.paths.host_of(&self.name),
            self.interserver.to_string().as_bytes(),
            None,
        )
        .await
        .map_err(e("host"))?;
        c.create(
            &format!("{}/leader-", self.paths.leader_election()),
            self.name.as_bytes(),
            CreateMode::EphemeralSequential,
        )
        .await
        .map_err(e("leader candidacy"))?;
        Ok(())
    }

    /// `is_active`, ephemeral, holding the session id. One left by this
    /// replica's previous session (or process) is replaced.
    async fn mark_active(&self) -> Result<(), String> {
        let path = self.paths.is_active_of(&self.name);
        let me = self.coord.session_id().unwrap_or(0);
        for _ in 0..3 {
            match self
                .coord
                .create(&path, me.to_string().as_bytes(), CreateMode::Ephemeral)
                .await
            {
                Ok(_) => return Ok(()),
                Err(ZkErr::NodeExists) => {
                    if let Some(stat) = self.coord.exists(&path).await.map_err(|e| format!("is_active: {e}"))? {
                        if stat.ephemeral_owner != me {
                            let _ = self.coord.delete(&path, Some(stat.version)).await;
                        } else {
                            return Ok(());
                        }
                    }
                }
                Err(e) => return Err(format!("is_active: {e}")),
            }
        }
        Err("is_active: another session keeps recreating it".into())
    }

    // ---- registration, reconciliation, cloning ----------------------------

    /// First activation in this process: create the replica if the
    /// coordinator does not know it; clone a healthy one if this replica is
    /// new, wiped or lost; otherwise reconcile local parts and load the
    /// queue.
    async fn register(&self, lost: bool) -> Result<(), String> {
        let c = &self.coord;
        let me = self.paths.me();
        let exists = c.exists(&me).await.map_err(|e| format!("replica node: {e}"))?.is_some();
        let identity = self.store.identity().map_err(|e| e.to_string())?;
        let wiped = exists && identity.is_none();
        if !exists {
            let ops = drift_table::replica::register_ops(&self.paths, &self.name, &self.interserver.to_string());
            c.multi(&ops)
                .await
                .map_err(|e| format!("creating replica {}: {}", self.name, e.err))?;
            self.log("replica_created", serde_json::json!({}));
        }
        if !exists || wiped || lost {
            // a wiped or lost replica's leftovers in the coordinator go first
            self.clear_replica_nodes().await?;
            for p in self.store.list().map_err(|e| e.to_string())? {
                self.store.detach(&p, "clone").map_err(|e| e.to_string())?;
            }
            self.clone_replica(!exists).await?;
        } else {
            self.reconcile().await?;
        }
        self.load_queue().await?;
        self.store
            .set_identity(&format!("{}\n{}\n", self.name, self.paths.table))
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Deletes this replica's queue and part znodes.
    async fn clear_replica_nodes(&self) -> Result<(), String> {
        let c = &self.coord;
        for dir in [self.paths.queue_of(&self.name), self.paths.parts_of(&self.name)] {
            let kids = c.children(&dir).await.map_err(|e| format!("{dir}: {e}"))?;
            for ops in drift_table::replica::clear_ops(&dir, &kids) {
                c.multi(&ops).await.map_err(|e| format!("clearing {dir}: {}", e.err))?;
            }
        }
        Ok(())
    }

    /// Copies a healthy replica's state: its log pointer, a GET_PART for
    /// each of its parts, and its queue. With no other replica, starts at
    /// the log's beginning.
    async fn clone_replica(&self, new: bool) -> Result<(), String> {
        let c = &self.coord;
        let e = |what: &'static str| move |err: ZkErr| format!("cloning ({what}): {err}");
        let replicas = c.children(&self.paths.replicas()).await.map_err(e("replicas"))?;
        let mut candidates = Vec::new();
        for r in replicas.iter().filter(|r| **r != self.name) {
            let lost = c.get(&self.paths.is_lost_of(r)).await.map_err(e("is_lost"))?;
            let active = c.exists(&self.paths.is_active_of(r)).await.map_err(e("is_active"))?;
            candidates.push(drift_table::replica::CloneCandidate {
                name: r.clone(),
                is_lost: lost.map(|(d, _)| d),
                active: active.is_some(),
            });
        }
        let Some(src) = drift_table::replica::clone_source(&self.name, &candidates) else {
            // nobody to clone: start from the log (a new table's first
            // replica), keeping whatever the log still holds
            let log = c.children(&self.paths.log()).await.map_err(e("log"))?;
            let (pointer, ops) = drift_table::replica::start_from_log_ops(&self.paths, &self.name, &log);
            c.multi(&ops)
                .await
                .map_err(|x| format!("cloning (pointer): {}", x.err))?;
            if !new {
                self.log("clone_without_source", serde_json::json!({"log_pointer": pointer}));
            }
            return Ok(());
        };
        loop {
            let Some((ptr, ptr_stat)) = c
                .get(&self.paths.log_pointer_of(&src))
                .await
                .map_err(e("source pointer"))?
            else {
                return Err(format!("cloning: replica {src} has no log_pointer"));
            };
            // the queue before the parts: an entry the source runs
            // between the two reads is then copied twice (its queue entry
            // and its part), never missed (the simulator found replicas
            // diverging when the parts were read first)
            let queue_dir = self.paths.queue_of(&src);
            let queue = c.children(&queue_dir).await.map_err(e("source queue"))?;
            let datas = c
                .get_many(&queue.iter().map(|q| format!("{queue_dir}/{q}")).collect::<Vec<_>>())
                .await
                .map_err(e("source queue entries"))?;
            let parts = c
                .children(&self.paths.parts_of(&src))
                .await
                .map_err(e("source parts"))?;
            let queued: Vec<Vec<u8>> = datas.into_iter().flatten().map(|(d, _)| d).collect();
            let now_s = wall_ms() / 1000;
            for ops in drift_table::replica::clone_queue_ops(&self.paths, &src, &parts, &queued, now_s) {
                c.multi(&ops).await.map_err(|x| format!("cloning (queue): {}", x.err))?;
            }
            // the pointer moves only if the source's did not meanwhile
            let done = c
                .multi(&drift_table::replica::clone_done_ops(
                    &self.paths,
                    &self.name,
                    &src,
                    &ptr,
                    ptr_stat.version,
                ))
                .await;
            match done {
                Ok(_) => {
                    self.events.add(Ev::ReplicaClones, 1);
                    self.log(
                        "cloned",
                        serde_json::json!({"source": src, "parts": parts.len(), "queue": queue.len(), "new": new}),
                    );
                    return Ok(());
                }
                Err(x) if x.err == ZkErr::BadVersion => {
                    self.clear_replica_nodes().await?;
                }
                Err(x) => return Err(format!("cloning (pointer): {}", x.err)),
            }
        }
    }

    /// A restarted replica: its disk against what the coordinator lists
    /// for it (`drift_table::reconcile`: old parts a merge replaced go,
    /// unexpected ones and broken ones are detached, listed parts not held
    /// are fetched again).
    async fn reconcile(&self) -> Result<(), String> {
        let c = &self.coord;
        let listed: BTreeSet<String> = c
            .children(&self.paths.parts_of(&self.name))
            .await
            .map_err(|e| format!("reconcile: {e}"))?
            .into_iter()
            .collect();
        let on_disk = self.store.list().map_err(|e| e.to_string())?;
        let sorted = drift_table::reconcile::sort(&listed, &on_disk);
        for p in &sorted.remove {
            // replaced by a merge that committed: an old part
            self.store.remove(p).map_err(|e| e.to_string())?;
        }
        for p in &sorted.unexpected {
            self.log("part_unexpected", serde_json::json!({"part": p}));
            self.store.detach(p, "unexpected").map_err(|e| e.to_string())?;
        }
        let checked: BTreeMap<String, Result<(), String>> = sorted
            .check
            .iter()
            .map(|p| (p.clone(), self.store.read_checked(&self.schema, p).map(|_| ())))
            .collect();
        let settled = drift_table::reconcile::settle(&listed, &checked)?;
        for (p, why) in &settled.broken {
            self.events.add(Ev::ReplicatedPartChecksFailed, 1);
            self.log("part_broken", serde_json::json!({"part": p, "why": why}));
            self.store.detach(p, "broken").map_err(|e| e.to_string())?;
        }
        // listed but not held: forget it here and queue its fetch, atomically
        let now_s = wall_ms() / 1000;
        for part in settled.refetch {
            let p = part.name();
            c.multi(&drift_table::replica::refetch_ops(
                &self.paths,
                &self.name,
                &part,
                now_s,
            ))
            .await
            .map_err(|e| format!("re-queueing missing part {p}: {}", e.err))?;
            self.log("part_missing_refetch", serde_json::json!({"part": p}));
        }
        self.st().queue = Queue::new(settled.current);
        Ok(())
    }

    /// Reads the replica's queue and log pointer from the coordinator into
    /// memory (after registration).
    pub(super) async fn load_queue(&self) -> Result<(), String> {
        let _alone = self.reload_gate.write().await;
        let c = &self.coord;
        let dir = self.paths.queue_of(&self.name);
        // the parts the coordinator lists for this replica: a part on disk
        // it does not list (a fetch cut off before its commit, an insert
        // whose commit is not known yet, an old part) is not current, or a
        // queued fetch of it would be taken as done without ever listing
        // it; commits and their current-set updates hold `reload_gate`
        // shared, so none falls between this listing and the swap below
        let listed: BTreeSet<String> = c
            .children(&self.paths.parts_of(&self.name))
            .await
            .map_err(|e| format!("parts: {e}"))?
            .into_iter()
            .collect();
        let kids = c.children(&dir).await.map_err(|e| format!("queue: {e}"))?;
        let datas = c
            .get_many(&kids.iter().map(|k| format!("{dir}/{k}")).collect::<Vec<_>>())
            .await
            .map_err(|e| format!("queue entries: {e}"))?;
        let (ptr, stat) = c
            .get(&self.paths.log_pointer_of(&self.name))
            .await
            .map_err(|e| format!("log_pointer: {e}"))?
            .ok_or("no log_pointer")?;
        let pointer = drift_table::replica::parse_pointer(&ptr);
        let mut current = ActivePartSet::new();
        for p in self.store.list().map_err(|e| e.to_string())? {
            if !listed.contains(&p) {
                continue;
            }
            if let Ok(pi) = PartInfo::parse(&p) {
                let _ = current.add(pi);
            }
        }
        let mut q = Queue::new(current);
        let mut obsolete = Vec::new();
        for (k, d) in kids.iter().zip(datas) {
            let Some((d, _)) = d else { continue };
            match std::str::from_utf8(&d)
                .map_err(|e| e.to_string())
                .and_then(|t| LogEntry::decode(t).map_err(|e| e.to_string()))
            {
                Ok(entry) => obsolete.extend(q.push(k.clone(), entry)?),
                Err(why) => self.log("queue_entry_unreadable", serde_json::json!({"entry": k, "why": why})),
            }
        }
        for z in obsolete {
            let _ = c.delete(&format!("{dir}/{z}"), None).await;
        }
        let mut st = self.st();
        // entries running now finish against the new queue
        let old = std::mem::replace(&mut st.queue, q);
        st.queue.adopt_running(&old);
        st.log_pointer = pointer;
        st.log_pointer_version = stat.version;
        st.last_queue_update_ms = wall_ms();
        Ok(())
    }

    // ---- the log puller -----------------------------------------------------

    /// Copies new log entries into the queue: batches that double up to
    /// `MULTI_OPS_MAX` (a replica far behind catches up in few round
    /// trips), each one multi creating the queue entries and moving
    /// `log_pointer` (version-checked, so two pullers never copy twice).
    pub async fn pull_log(&self) -> Result<usize, ZkErr> {
        self.pull_log_known(None).await
    }

    /// [`Replica::pull_log`] from the log's children as `known` lists them
    /// (read just now, by a watch), or as read here.
    async fn pull_log_known(&self, mut known: Option<Vec<String>>) -> Result<usize, ZkErr> {
        let _g = self.pull_lock.lock().await;
        let mut pulls = Pulls::default();
        loop {
            match pulls.after(self.pull_once(known.take()).await?) {
                PullNext::Again => {}
                PullNext::Done { copied, past_reload } => {
                    if let Some(n) = past_reload {
                        self.log("pulled_past_reload", serde_json::json!({"entries": n}));
                    }
                    if copied > 0 {
                        self.wake.notify_one();
                    }
                    return Ok(copied);
                }
                PullNext::GaveUp(why) => return Err(ZkErr::Other(why)),
            }
        }
    }

    /// One pass of the puller over the log (as `known` lists it, or as
    /// read here), under the pull lock.
    async fn pull_once(&self, known: Option<Vec<String>>) -> Result<Pulled, ZkErr> {
        if !self.st().registered {
            return Ok(Pulled::Done(0));
        }
        let c = &self.coord;
        let names = match known {
            Some(n) => n,
            None => c.children(&self.paths.log()).await?,
        };
        let pointer = self.st().log_pointer;
        let drift_table::replica::ToCopy { entries: new, gap } = drift_table::replica::to_copy(&names, pointer);
        if let Some(oldest_kept) = gap {
            // entries this replica never copied were cleaned: it is lost
            // unless the gap is only numbers no entry took
            self.log(
                "log_gap",
                serde_json::json!({"log_pointer": pointer, "oldest_entry": oldest_kept}),
            );
        }
        let mut copied = 0;
        let mut batch = 1usize;
        let mut at = 0;
        while at < new.len() {
            let chunk = &new[at..(at + batch).min(new.len())];
            let paths: Vec<String> = chunk.iter().map(|(_, n)| format!("{}/{n}", self.paths.log())).collect();
            let datas = c.get_many(&paths).await?;
            let datas: Vec<(u64, Option<Vec<u8>>)> = chunk
                .iter()
                .zip(datas)
                .map(|((i, _), d)| (*i, d.map(|(d, _)| d)))
                .collect();
            let next = chunk.last().expect("non-empty chunk").0 + 1;
            let version = self.st().log_pointer_version;
            let drift_table::replica::CopyBatch {
                ops,
                entries,
                unreadable,
            } = drift_table::replica::copy_batch(&self.paths, &self.name, &datas, next, version);
            for (index, why) in unreadable {
                self.log("log_entry_unreadable", serde_json::json!({"index": index, "why": why}));
            }
            let results = match c.multi(&ops).await {
                Ok(r) => r,
                Err(e) if e.err == ZkErr::BadVersion => {
                    // someone else moved the pointer (a previous incarnation's
                    // pull finishing late): reload from the coordinator. Not
                    // read again, the queue in memory lacks what that pull
                    // copied, and the pull fails: a merge chosen from that
                    // queue would span a part it never heard of and drop its
                    // rows (the simulator found this, seed 625 of its first
                    // 1,000-seed sweep with merges). Reloaded, the entries
                    // past the new pointer are still to copy: the caller
                    // pulls again, or a merge chosen after this pull would
                    // span them (swarm seed 202 of insert-retry)
                    return match self.load_queue().await {
                        Ok(_) => Ok(Pulled::Reloaded(copied)),
                        Err(e) => {
                            self.log("queue_reload_failed", serde_json::json!({"error": e}));
                            Err(ZkErr::Other(format!("the queue is not read again: {e}")))
                        }
                    };
                }
                Err(e) => return Err(e.err),
            };
            let mut obsolete = Vec::new();
            {
                let mut st = self.st();
                for (r, e) in results.iter().zip(entries) {
                    if let super::coord::OpResult::Created(path) = r {
                        let znode = path.rsplit('/').next().unwrap_or(path).to_string();
                        match st.queue.push(znode, e) {
                            Ok(o) => obsolete.extend(o),
                            Err(why) => eprintln!("queue push refused: {why}"),
                        }
                    }
                }
                st.log_pointer = next;
                st.log_pointer_version = version + 1;
                st.last_queue_update_ms = wall_ms();
            }
            for z in obsolete {
                let _ = c
                    .delete(&format!("{}/{z}", self.paths.queue_of(&self.name)), None)
                    .await;
            }
            copied += chunk.len();
            self.events.add(Ev::LogEntriesPulled, chunk.len() as u64);
            at += chunk.len();
            batch = drift_table::replica::next_batch(batch);
        }
        Ok(Pulled::Done(copied))
    }

    /// Pulls whenever the log changes (or every [`PULL_PERIOD`]).
    pub async fn pull_loop(self: Arc<Self>) {
        loop {
            if self.readonly().is_some() && !self.st().registered {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let (known, watcher) = match self.coord.watch_children(&self.paths.log()).await {
                Ok((kids, w)) => (Some(kids), Some(w)),
                Err(_) => (None, None),
            };
            if let Err(e) = self.pull_log_known(known).await {
                if e != ZkErr::NoSession {
                    self.log("pull_failed", serde_json::json!({"error": e.to_string()}));
                }
            }
            match watcher {
                Some(w) => {
                    let _ = tokio::time::timeout(PULL_PERIOD, w.changed()).await;
                    // entries come in bursts under load: one pull copies a burst
                    tokio::time::sleep(PULL_DEBOUNCE).await;
                }
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Removes parts outdated for longer than [`OLD_PARTS_LIFETIME`].
    pub async fn housekeeping_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let due: Vec<PartInfo> = {
                let mut st = self.st();
                let now = Instant::now();
                let (due, keep): (Vec<_>, Vec<_>) = st
                    .outdated
                    .drain(..)
                    .partition(|(_, t)| now.duration_since(*t) >= OLD_PARTS_LIFETIME);
                st.outdated = keep;
                due.into_iter()
                    .map(|(p, _)| p)
                    .filter(|p| !st.queue.current().contains_exactly(p))
                    .collect()
            };
            for p in due {
                let name = p.name();
                self.st().blocks.remove(&name);
                if let Err(e) = self.store.remove(&name) {
                    self.log(
                        "old_part_remove_failed",
                        serde_json::json!({"part": name, "error": e.to_string()}),
                    );
                }
            }
        }
    }

    /// Whether this replica is the leader now (the lowest candidacy).
    pub async fn check_leader(&self) -> bool {
        let dir = self.paths.leader_election();
        let leader = match self.coord.children(&dir).await {
            Ok(kids) => match kids.first() {
                Some(first) => self
                    .coord
                    .get(&format!("{dir}/{first}"))
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|(d, _)| d == self.name.as_bytes()),
                None => false,
            },
            Err(_) => false,
        };
        let mut st = self.st();
        let was = st.is_leader;
        st.is_leader = leader && st.readonly.is_none();
        let now = st.is_leader;
        drop(st);
        if was != now {
            self.log("leader", serde_json::json!({"is_leader": now}));
        }
        now
    }
}
