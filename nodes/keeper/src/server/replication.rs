//! The server's Raft side: peers' messages, proposing and forwarding
//! writes, ticks, Ready handling, preprocess and apply with the digest
//! checks, snapshots made and installed.

use super::{
    context, older_than, parse_context, ConnState, KeeperServer, Pending, PendingKind, Preprocessed, ReadBatch,
    ReadRound, Unpersisted, Writing, BEHIND_TIMEOUTS, PENDING_TIMEOUT_US, READY_ROUNDS_MAX, READ_INDEX_RETRY_US,
    READ_INDEX_TIMEOUT_US, REAP_PER_SCAN_MAX,
};
use crate::disk::Disk;
use crate::entry::{check_digest, Entry as KEntry, Phase};
use crate::peer::PeerMsg;
use crate::proto::{self, opcode, ConnectResponse};
use crate::session::SessionTracker;
use crate::snapshot::{self, SnapshotMeta};
use crate::watch::{EventType, WatchManager};
use crate::{Create, Op, Response, Storage, Write, ZkError};
use protobuf::Message as _;
use raft::prelude::{Entry, EntryType, Message};
use raft::StateRole;
use std::collections::{BTreeMap, BTreeSet};

/// The same request, applied differently (the `diverge` fault): its own
/// effect, plus a node only this replica has, so the trees differ for good
/// (a later write cannot paper over it).
fn diverged(w: &Write) -> Write {
    let marker = Op::Create(Create {
        path: "/diverged-".into(),
        data: vec![],
        acl: crate::acl::Acl::open(),
        mode: crate::CreateMode::PersistentSequential,
        ttl_ms: 0,
    });
    match w {
        Write::Op(op) => Write::Multi(vec![op.clone(), marker]),
        _ => Write::Op(marker),
    }
}

impl<D: Disk> KeeperServer<D> {
    /// Leader: who holds which session, as learnt in this term (a new
    /// leader learns it afresh: the map of an earlier term is dropped).
    pub(super) fn holders(&mut self) -> &mut BTreeMap<i64, BTreeSet<u64>> {
        let term = self.raw.raft.term;
        if self.holders.0 != term {
            self.holders = (term, BTreeMap::new());
        }
        &mut self.holders.1
    }

    /// Follower: the sessions the current leader heard are held here.
    pub(super) fn announced(&mut self) -> &mut BTreeSet<i64> {
        let to = (self.leader(), self.raw.raft.term);
        if self.announced.0 != to {
            self.announced = (to, BTreeSet::new());
        }
        &mut self.announced.1
    }

    pub(super) fn last_zxid(&self) -> i64 {
        self.ks.state().last_zxid()
    }

    fn send_peer(&mut self, to: u64, msg: PeerMsg) {
        self.emit(super::Effect::Peer { to, msg });
    }

    // ---------------------------------------------------------------- peers

    pub(super) fn on_peer(&mut self, from: u64, m: PeerMsg) {
        match m {
            PeerMsg::Raft(bytes) => self.on_raft(from, &bytes, false),
            PeerMsg::Snapshot(bytes) => self.on_raft(from, &bytes, true),
            PeerMsg::Forward {
                origin,
                req,
                session,
                write,
            } => match self.admit_forward(from, origin, session, &write) {
                Ok(w) => self.propose(session, w, origin, req),
                Err(why) => {
                    self.log(
                        "forward_refused",
                        serde_json::json!({"from": from, "session": session, "why": why}),
                    );
                    self.send_peer(from, PeerMsg::Refused { req });
                }
            },
            PeerMsg::Refused { req } => {
                // only the leader the request went to can refuse it
                if self.pending.get(&req).is_some_and(|p| p.via == from) {
                    self.fail_pending(req);
                }
            }
            PeerMsg::Touch { sessions } => {
                if self.is_leader() {
                    let now = self.now_ms();
                    for s in sessions {
                        self.tracker.heartbeat(s, now);
                        if self.ks.state().session(s).is_some() {
                            self.holders().entry(s).or_default().insert(from);
                        }
                    }
                }
            }
        }
    }

    /// A Raft message from peer `from`: stepped once it passed
    /// [`crate::peer_check`] (and, for a snapshot, once its tree decoded
    /// and matched what the message says it is); else dropped and logged.
    fn on_raft(&mut self, from: u64, bytes: &[u8], snapshot_frame: bool) {
        let checked = Message::parse_from_bytes(bytes)
            .map_err(|e| format!("not a raft message: {e}"))
            .and_then(|msg| {
                let is_snapshot = msg.msg_type == raft::prelude::MessageType::MsgSnapshot;
                if is_snapshot != snapshot_frame {
                    return Err(format!(
                        "{:?} in a {} frame",
                        msg.msg_type,
                        if snapshot_frame { "snapshot" } else { "raft" }
                    ));
                }
                crate::peer_check::check(&self.raw, &msg, from, &self.voters).map_err(|e| e.to_string())?;
                if is_snapshot {
                    self.decode_incoming_snapshot(&msg)?;
                }
                Ok(msg)
            });
        match checked {
            Ok(msg) if !self.isolated.contains(&msg.from) => self.step_raft(msg),
            Ok(_) => {}
            Err(why) => self.log("peer_message_refused", serde_json::json!({"from": from, "why": why})),
        }
    }

    /// Decodes the tree a `MsgSnapshot` carries and keeps it for
    /// `install_snapshot`: a snapshot that does not decode, or whose own
    /// metadata disagrees with the message's, never reaches raft.
    fn decode_incoming_snapshot(&mut self, msg: &Message) -> Result<(), String> {
        let meta = msg.get_snapshot().get_metadata();
        let name = snapshot::file_name(meta.index, meta.term);
        let digest_on = self.ks.mode() != crate::DigestMode::Off;
        let (state, kmeta) = snapshot::decode(&name, msg.get_snapshot().get_data(), digest_on)
            .map_err(|e| format!("snapshot does not decode: {e}"))?;
        if (kmeta.last_index, kmeta.last_term) != (meta.index, meta.term) {
            return Err(format!(
                "snapshot holds index {} term {}, the message says {} {}",
                kmeta.last_index, kmeta.last_term, meta.index, meta.term
            ));
        }
        self.incoming_snapshot = Some((meta.index, meta.term, state, kmeta));
        Ok(())
    }

    /// The write a peer forwarded, if the leader may propose it: it comes
    /// from the peer it names as its origin, decodes whole, is within the
    /// log's limits, and is a client's write under a session that peer
    /// holds (or opens a session).
    fn admit_forward(&self, from: u64, origin: u64, session: i64, bytes: &[u8]) -> Result<Write, String> {
        if origin != from {
            return Err(format!("origin {origin} on peer {from}'s connection"));
        }
        if !self.is_leader() {
            return Err("not the leader".into());
        }
        let mut r = crate::codec::Reader::new(bytes);
        let w = Write::decode(&mut r)
            .and_then(|w| r.finish().map(|()| w))
            .map_err(|e| format!("write does not decode: {e}"))?;
        crate::limit::check(&w).map_err(|e| e.to_string())?;
        match &w {
            Write::CreateSession { .. } if session == 0 => Ok(w),
            Write::CreateSession { .. } => Err("createSession under a session".into()),
            Write::Reap { .. } => Err("reap is the leader's own".into()),
            _ if self.holders.0 == self.raw.raft.term
                && self.holders.1.get(&session).is_some_and(|h| h.contains(&from)) =>
            {
                Ok(w)
            }
            _ => Err(format!("session {session:#x} is not held by node {from}")),
        }
    }

    /// Steps a Raft message, with two guards for a server whose data dir
    /// was dropped (Raft assumes durable state; this server lost its own):
    /// a leader's heartbeat may name a commit index past this server's now
    /// empty log, so the commit is clamped (lower is always safe) and the
    /// server asks for a snapshot (`fall_behind`); and until it has heard
    /// from a leader, the server casts no votes (it may have voted in this
    /// term before it lost its state).
    fn step_raft(&mut self, mut msg: Message) {
        use raft::prelude::MessageType::*;
        if self.behind > 0 && matches!(msg.msg_type, MsgRequestVote | MsgRequestPreVote) && msg.index < self.behind {
            // this log misses entries known committed: its vote could
            // elect a candidate that misses them too. A candidate whose
            // log reaches them may have it.
            return;
        }
        // an append names the leader's commit: see below
        let append_commit = (msg.msg_type == MsgAppend).then_some((msg.from, msg.commit));
        if self.quiet {
            match msg.msg_type {
                MsgAppend | MsgHeartbeat | MsgSnapshot => {
                    self.quiet = false;
                    self.log("rejoined", serde_json::json!({"leader": msg.from, "term": msg.term}));
                }
                MsgRequestVote | MsgRequestPreVote => return,
                _ => {}
            }
        }
        if msg.msg_type == MsgAppendResponse && msg.reject && msg.request_snapshot != raft::INVALID_INDEX {
            // a follower that lost its log asks for a snapshot at the
            // commit it heard (`fall_behind`); raft-rs, which takes a
            // follower's acknowledged match as durable, would drop the
            // request as stale when that match is past the index asked at
            if let Some(pr) = self.raw.raft.mut_prs().get_mut(msg.from) {
                if pr.state == raft::ProgressState::Replicate && msg.index < pr.matched {
                    msg.index = pr.matched;
                }
            }
        }
        if msg.msg_type == MsgHeartbeat {
            let last = self.raw.raft.raft_log.last_index();
            if msg.commit > last {
                self.fall_behind(msg.from, msg.term, msg.commit, last);
            }
            msg.commit = msg.commit.min(last);
        }
        let _ = self.raw.step(msg);
        if let Some((leader, commit)) = append_commit {
            // entries to the leader's commit that this log still lacks
            // after the append are committed: until it has them it votes
            // only for candidates that do (a server that lost its disk
            // may have acknowledged them, and counted towards their
            // commit)
            let last = self.raw.raft.raft_log.last_index();
            if commit > last && commit > self.behind {
                self.note_behind(leader, commit, last);
            }
        }
        if self.behind > 0 && self.raw.raft.raft_log.last_index() >= self.behind {
            let index = self.raw.raft.raft_log.last_index();
            self.log("caught_up", serde_json::json!({ "index": index }));
            self.behind = 0;
        }
    }

    /// A leader's heartbeat names a commit past this server's log: its
    /// data dir was dropped after it acknowledged those entries, and the
    /// leader, which remembers them as replicated here, would send them
    /// only with its next entry — never, in an idle cluster. So the server
    /// asks for a snapshot as raft-rs's own snapshot request does: a
    /// rejected append at the leader's view of its match, carrying the
    /// index the snapshot must reach. Until its log reaches that commit it
    /// neither votes nor campaigns.
    fn fall_behind(&mut self, leader: u64, term: u64, commit: u64, last: u64) {
        self.note_behind(leader, commit, last);
        let every = self.cfg.election_ticks as u64;
        if self.behind_asked_tick != 0 && self.ticks < self.behind_asked_tick + every {
            return;
        }
        self.behind_asked_tick = self.ticks.max(1);
        let mut m = Message::default();
        m.set_msg_type(raft::prelude::MessageType::MsgAppendResponse);
        m.to = leader;
        m.from = self.id;
        m.term = term;
        m.index = commit;
        m.reject = true;
        m.reject_hint = last;
        m.log_term = self.raw.raft.raft_log.term(last).unwrap_or(0);
        m.request_snapshot = commit;
        self.send_messages(vec![m]);
    }

    /// Entries to `commit` are committed and this log ends at `last`:
    /// until it reaches `commit`, its votes go only to candidates whose
    /// log does.
    fn note_behind(&mut self, leader: u64, commit: u64, last: u64) {
        if self.behind == 0 {
            self.behind_since_tick = self.ticks;
            self.log(
                "behind",
                serde_json::json!({"leader": leader, "commit": commit, "last_index": last}),
            );
        }
        self.behind = self.behind.max(commit);
    }

    fn send_messages(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let to = m.to;
            if self.isolated.contains(&to) {
                continue;
            }
            if let Ok(bytes) = m.write_to_bytes() {
                let snapshot = m.msg_type == raft::prelude::MessageType::MsgSnapshot;
                let frame = if snapshot {
                    PeerMsg::Snapshot(bytes)
                } else {
                    PeerMsg::Raft(bytes)
                };
                self.send_peer(to, frame);
                // raft-rs holds a follower in its snapshot state, sending
                // nothing, until the snapshot is reported: a snapshot lost
                // with its follower (down, cut off, killed while
                // installing) would leave that follower behind for good.
                // Reported sent at once, the follower is probed again; one
                // that installed it takes the entries after it, one that
                // did not is sent a snapshot again. (A snapshot a peer
                // asked for, see `fall_behind`, would otherwise also be
                // sent again after every answer and never the entries
                // after it.)
                if snapshot {
                    self.raw.report_snapshot(to, raft::SnapshotStatus::Finish);
                }
            }
        }
    }

    // ---------------------------------------------------------------- writes

    /// Sends a write on its way: proposed here if leader, else forwarded.
    pub(super) fn submit(&mut self, session: i64, w: Write, conn: u64, kind: PendingKind) {
        let req = self.next_req;
        self.next_req += 1;
        let via = self.leader();
        self.pending.insert(
            req,
            Pending {
                conn,
                kind,
                since_us: self.env.now_us,
                via,
            },
        );
        if self.is_leader() {
            self.propose(session, w, self.id, req);
        } else if via != 0 {
            // the leader admits a forwarded write only from the session's
            // holder: say so first, on the same link (so in order)
            if session != 0 && self.announced().insert(session) {
                self.send_peer(
                    via,
                    PeerMsg::Touch {
                        sessions: vec![session],
                    },
                );
            }
            let mut wr = crate::codec::Writer::new();
            w.encode(&mut wr);
            let origin = self.id;
            self.send_peer(
                via,
                PeerMsg::Forward {
                    origin,
                    req,
                    session,
                    write: wr.buf,
                },
            );
        } else {
            self.fail_pending(req);
        }
    }

    /// Leader: preprocess and propose (in one state machine: log order).
    /// Nothing over the log's limits is proposed, whoever asked.
    pub(super) fn propose(&mut self, session: i64, w: Write, origin: u64, req: u64) {
        if let Err(over) = crate::limit::check(&w) {
            self.log(
                "proposal_refused",
                serde_json::json!({"request": w.name(), "why": over.to_string()}),
            );
            self.refuse(origin, req);
            return;
        }
        let zxid = self.ks.last_preprocessed_zxid() + 1;
        let time_ms = self.wall_ms();
        let digest = self.ks.preprocess(session, zxid, time_ms, &w);
        let e = KEntry {
            zxid,
            time_ms,
            session,
            digest,
            request: w,
        };
        match self.raw.propose(context(origin, req), e.encode()) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                self.preprocessed.push_back(Preprocessed {
                    index,
                    term: self.raw.raft.term,
                    zxid,
                    carried: digest,
                    skipped: false,
                });
            }
            Err(_) => {
                self.ks.rollback_after(zxid - 1);
                if origin == 0 {
                    if let Write::CloseSession = e.request {
                        // an expiry raft refused: decide it again next tick
                        self.closing.remove(&session);
                    }
                }
                self.refuse(origin, req);
            }
        }
    }

    /// Tells whoever asked for request `req` that it was not proposed.
    fn refuse(&mut self, origin: u64, req: u64) {
        if origin == self.id {
            self.fail_pending(req);
        } else if origin != 0 {
            self.send_peer(origin, PeerMsg::Refused { req });
        }
    }

    /// A request whose fate this server cannot learn (no leader, refused,
    /// or the leader that had it is gone): the connection is dropped, as a
    /// ZooKeeper server drops its clients when it loses its leader. The
    /// client hears connection loss for everything in flight (the outcome
    /// is unknown) and reconnects with its session; a close is retried
    /// there, so an answered close always means a committed one.
    fn fail_pending(&mut self, req: u64) {
        if let Some(p) = self.pending.remove(&req) {
            self.drop_conn(p.conn);
        }
    }

    // ---------------------------------------------------------------- ticks

    pub(super) fn tick(&mut self) {
        self.ticks += 1;
        if self.behind > 0 && self.ticks - self.behind_since_tick > BEHIND_TIMEOUTS * self.cfg.election_ticks as u64 {
            let (commit, last) = (self.behind, self.raw.raft.raft_log.last_index());
            self.log(
                "behind_given_up",
                serde_json::json!({"level": "WARN", "commit": commit, "last_index": last}),
            );
            self.behind = 0;
        }
        // a quiet server neither campaigns nor votes until a leader
        // speaks, nor one whose log misses committed entries until it has
        // them
        if !self.quiet {
            if self.behind == 0 {
                self.raw.tick();
            } else {
                // a server behind does not campaign, but its election
                // clock runs: with check-quorum a follower ignores every
                // candidate until an election timeout passes without its
                // leader, so a frozen clock would keep it deaf to the
                // candidates whose log reaches the entries it misses
                // (`step_raft` lets only those have its vote), and no
                // leader could be elected while it waits for a leader that
                // is gone
                let r = &mut self.raw.raft;
                r.election_elapsed = (r.election_elapsed + 1).min(r.election_timeout());
            }
        }
        let now = self.now_ms();
        // sessions seen alive here reach the leader's tracker
        if self.ticks.is_multiple_of(2) && !self.alive.is_empty() {
            let alive: Vec<i64> = std::mem::take(&mut self.alive).into_iter().collect();
            if self.is_leader() {
                for s in alive {
                    if self.tracker.heartbeat(s, now) {
                        let me = self.id;
                        self.holders().entry(s).or_default().insert(me);
                    }
                }
            } else if self.leader() != 0 {
                let leader = self.leader();
                self.send_peer(leader, PeerMsg::Touch { sessions: alive });
            }
        }
        if self.is_leader() {
            for s in self.tracker.expired(now) {
                if self.closing.insert(s) {
                    self.log("session_expired", serde_json::json!({ "session": s }));
                    self.propose(s, Write::CloseSession, 0, 0);
                }
            }
            if self.ticks.is_multiple_of((2000 / self.cfg.tick_ms).max(1)) {
                self.reap();
            }
        }
        let now_us = self.env.now_us;
        // read-index rounds raft dropped (no leader, or one that has not
        // committed in its term yet) or whose messages were lost never
        // answer: asked again under a new ctx, until the read's time is up
        // and its client is told the connection was lost
        for ctx in older_than(&self.read_index_wait, READ_INDEX_RETRY_US, now_us, |b| b.sent_us) {
            let Some(batch) = self.read_index_wait.remove(&ctx) else {
                continue;
            };
            for read in batch.reads {
                if now_us.saturating_sub(read.since_us) >= READ_INDEX_TIMEOUT_US {
                    self.drop_conn(read.conn);
                } else {
                    self.reads_next.push(read);
                }
            }
        }
        self.start_read_round();
        // requests waiting too long: tell the client
        for r in older_than(&self.pending, PENDING_TIMEOUT_US, now_us, |p| p.since_us) {
            self.fail_pending(r);
        }
    }

    /// Leader: propose the deletion of empty containers and expired TTL
    /// nodes (the entry re-checks, at its own time, that they still are).
    fn reap(&mut self) {
        let now = self.wall_ms();
        let doomed: Vec<String> = self
            .ks
            .state()
            .nodes()
            .filter(|(_, n)| {
                n.stat.num_children == 0
                    && match n.kind() {
                        crate::node::Kind::Container => n.stat.cversion > 0,
                        crate::node::Kind::Ttl { ttl_ms } => now.saturating_sub(n.stat.mtime) > ttl_ms,
                        _ => false,
                    }
            })
            .map(|(p, _)| p.to_string())
            .take(REAP_PER_SCAN_MAX)
            .collect();
        for path in doomed {
            self.propose(0, Write::Reap { path }, 0, 0);
        }
    }

    // ---------------------------------------------------------------- ready

    /// Handles what Raft has ready, then submits the writes that it
    /// released (answers that left let held writes go): raft-rs takes no
    /// proposal between `ready()` and `advance()` (its unstable log would
    /// no longer end where the `Ready` said), so they wait for the round's
    /// end, and get a round of their own.
    pub(super) fn handle_ready(&mut self, sink: &mut dyn FnMut(super::Effect)) {
        for _ in 0..READY_ROUNDS_MAX {
            self.in_ready = true;
            self.handle_ready_once(sink);
            self.in_ready = false;
            let released = std::mem::take(&mut self.release_after_ready);
            let early = std::mem::take(&mut self.early_after_ready);
            let read_round = std::mem::take(&mut self.read_round_started);
            if self.halted || (released.is_empty() && early.is_empty() && !read_round) {
                return;
            }
            for conn in early {
                self.take_early_frames(conn);
            }
            for conn in released {
                self.release_held(conn);
            }
            if !self.raw.has_ready() {
                return;
            }
        }
    }

    fn handle_ready_once(&mut self, sink: &mut dyn FnMut(super::Effect)) {
        if !self.raw.has_ready() {
            return;
        }
        let mut rd = self.raw.ready();
        // A snapshot's Ready is persisted before it is advanced: raft-rs
        // counts its index as applied at the advance, which it allows only
        // up to what is durable. The syncs still out are made first, in
        // order.
        // A Ready that cuts a conflicting suffix is persisted at once
        // too: the cut is synced as it is made, and what the syncs still
        // out would answer for may be gone with it.
        let cuts = rd
            .entries()
            .first()
            .is_some_and(|e| e.index < self.raw.store().next_index());
        let inline = !self.cfg.deferred_log_sync || !rd.snapshot().is_empty() || cuts;
        if inline && !self.unpersisted.is_empty() {
            if let Err(e) = self.persist_now() {
                return self.fail(format!("changelog sync: {e}"));
            }
        }
        if let Some(ss) = rd.ss() {
            self.on_role(ss.raft_state, ss.leader_id);
        }
        self.send_messages(rd.take_messages());
        if !rd.snapshot().is_empty() {
            let s = rd.snapshot().clone();
            self.install_snapshot(&s);
        }
        let committed = rd.take_committed_entries();
        self.apply(committed);
        if self.halted {
            return;
        }
        let entries = rd.take_entries();
        self.preprocess_appended(&entries);
        if self.halted {
            return;
        }
        if self.bugs.send_before_sync {
            // planted bug: acknowledges entries and votes not yet durable
            let persisted = rd.take_persisted_messages();
            self.send_messages(persisted);
        }
        // the leader's appends and the replies so far go out while the
        // log is written
        self.flush(sink);
        let store = self.raw.mut_store();
        let left = if inline {
            store.append(&entries).map(|()| None)
        } else {
            store.append_unsynced(&entries)
        };
        let left = match left {
            Ok(left) => left,
            Err(e) => return self.fail(format!("changelog append: {e}")),
        };
        if let Some(hs) = rd.hs() {
            let hs = hs.clone();
            if let Err(e) = self.raw.mut_store().set_hard_state(hs) {
                return self.fail(format!("hard state: {e}"));
            }
        }
        let persisted = rd.take_persisted_messages();
        let read_states = rd.take_read_states();
        if left.is_some() || !self.unpersisted.is_empty() {
            // durable once the driver's sync (or an earlier one) is done
            let number = rd.number();
            self.raw.advance_append_async(rd);
            if let Some(file) = &left {
                self.out.push(super::Effect::SyncLog {
                    number,
                    file: file.clone(),
                    len: self.raw.store().tail_len(),
                });
                self.flush(sink);
            }
            self.unpersisted.push_back(Unpersisted {
                number,
                messages: persisted,
                synced_by_driver: left.is_some(),
            });
            self.read_states_done(read_states);
            self.raw.advance_apply();
            self.after_apply();
            return;
        }
        self.send_messages(persisted);
        self.read_states_done(read_states);
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            let mut hs = self.raw.store().hard_state().clone();
            hs.commit = commit;
            if let Err(e) = self.raw.mut_store().set_hard_state(hs) {
                return self.fail(format!("hard state: {e}"));
            }
        }
        self.send_messages(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed);
        if self.halted {
            return;
        }
        self.raw.advance_apply();
        self.after_apply();
    }

    fn after_apply(&mut self) {
        self.maybe_snapshot();
        self.serve_parked();
        // the reads that came while the answered round was out
        self.start_read_round();
    }

    /// Serves the reads whose read-index round answered.
    fn read_states_done(&mut self, read_states: Vec<raft::ReadState>) {
        for rs in read_states {
            let ctx = u64::from_be_bytes(
                rs.request_ctx
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0; 8]),
            );
            if let Some(batch) = self.read_index_wait.remove(&ctx) {
                for read in batch.reads {
                    self.read_index_done(read.conn, read.seq, read.connect, rs.index);
                }
            }
        }
    }

    /// Syncs here what the driver is still syncing, and sends what waited
    /// for it: every `Ready` handed on is durable after this (the
    /// driver's answers, when they come, find nothing left to release).
    fn persist_now(&mut self) -> Result<(), String> {
        self.raw.mut_store().sync_unsynced().map_err(|e| e.to_string())?;
        let last = self.unpersisted.back().map(|u| u.number);
        let messages: Vec<Message> = self.unpersisted.drain(..).flat_map(|u| u.messages).collect();
        if let Some(n) = last {
            self.persisted(n, messages);
        }
        Ok(())
    }

    /// Every `Ready` up to `number` is durable: Raft learns so, the log
    /// learns how far its entries are (Raft's persisted index), and what
    /// the `Ready`s held back goes out.
    fn persisted(&mut self, number: u64, messages: Vec<Message>) {
        self.raw.on_persist_ready(number);
        let durable = self.raw.raft.raft_log.persisted;
        self.raw.mut_store().synced_through(durable);
        self.send_messages(messages);
    }

    /// The driver's sync numbered `number` is done: every `Ready` up to it,
    /// and those after that waited only for it, are durable. Raft learns
    /// so, and what they held back goes out.
    pub(super) fn log_synced(&mut self, number: u64, result: Result<(), String>) {
        if let Err(e) = result {
            return self.fail(format!("changelog sync: {e}"));
        }
        let mut last = None;
        let mut messages = Vec::new();
        while let Some(u) = self.unpersisted.front() {
            if u.synced_by_driver && u.number > number {
                break;
            }
            let u = self.unpersisted.pop_front().expect("a front");
            last = Some(u.number);
            messages.extend(u.messages);
        }
        if let Some(n) = last {
            self.persisted(n, messages);
        }
    }

    /// Puts a quorum read in the next read-index round, asked for at once
    /// unless one is in flight.
    pub(super) fn ask_read_index(&mut self, read: ReadRound) {
        self.reads_next.push(read);
        self.start_read_round();
    }

    /// Asks Raft for a read-index round for the reads waiting. With
    /// `shared_read_rounds`, not while a round is in flight: reads that
    /// come while one is out go together in the next, so many concurrent
    /// reads cost a round or two, not one each. Every read in a round
    /// came before the round was asked for, so the index it answers (the leader's commit, confirmed by a quorum
    /// after that moment) covers every write completed before the read
    /// came: the read is linearizable.
    pub(super) fn start_read_round(&mut self) {
        if self.reads_next.is_empty() || (self.cfg.shared_read_rounds && !self.read_index_wait.is_empty()) {
            return;
        }
        let ctx = self.next_req;
        self.next_req += 1;
        self.raw.read_index(ctx.to_be_bytes().to_vec());
        let batch = ReadBatch {
            sent_us: self.env.now_us,
            reads: std::mem::take(&mut self.reads_next),
        };
        self.read_index_wait.insert(ctx, batch);
        self.read_round_started = true;
    }

    fn on_role(&mut self, role: StateRole, leader: u64) {
        let term = self.raw.raft.term;
        self.log(
            crate::NodeEvent::Role.name(),
            serde_json::json!({"role": format!("{role:?}"), "leader": leader, "term": term}),
        );
        // requests the old leader had may commit or vanish: their clients
        // hear connection loss now (the outcome is unknown) rather than
        // wait out the pending timeout while their sessions stay alive
        let orphaned: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.via != 0 && p.via != leader)
            .map(|(r, _)| *r)
            .collect();
        for r in orphaned {
            self.fail_pending(r);
        }
        // read-index rounds in flight are lost with the old leader: asked
        // again at the next tick, of the new one
        for batch in self.read_index_wait.values_mut() {
            batch.sent_us = 0;
        }
        if role == StateRole::Leader {
            // every known session gets a fresh deadline under this leader
            let now = self.now_ms();
            self.tracker = SessionTracker::new();
            self.closing.clear();
            let sessions: Vec<(i64, i32)> = self
                .ks
                .state()
                .sessions()
                .iter()
                .map(|(id, s)| (*id, s.timeout_ms))
                .collect();
            for (id, t) in sessions {
                self.tracker.touch(id, t as u64, now);
            }
        }
    }

    /// Preprocesses entries being persisted; a conflicting suffix (a new
    /// leader overwrote it) rolls the overlay back first.
    fn preprocess_appended(&mut self, entries: &[Entry]) {
        for e in entries {
            if let Some(pos) = self.preprocessed.iter().position(|p| p.index >= e.index) {
                let p = self.preprocessed[pos];
                if p.index == e.index && p.term == e.term {
                    continue;
                }
                let keep = if pos == 0 {
                    self.last_zxid()
                } else {
                    self.preprocessed[pos - 1].zxid
                };
                if !self.bugs.skip_truncation_rollback {
                    self.ks.rollback_after(keep);
                }
                self.preprocessed.truncate(pos);
            }
            if e.entry_type != EntryType::EntryNormal || e.data.is_empty() {
                continue;
            }
            self.preprocess_entry(e);
            if self.halted {
                return;
            }
        }
    }

    fn preprocess_entry(&mut self, e: &Entry) -> Preprocessed {
        let ke = match self.entry_to_apply(e) {
            Ok(ke) => ke,
            Err(why) => {
                self.log(
                    "entry_unusable",
                    serde_json::json!({"level": "ERROR", "log_index": e.index, "why": why}),
                );
                let p = Preprocessed {
                    index: e.index,
                    term: e.term,
                    zxid: self.ks.last_preprocessed_zxid(),
                    carried: crate::Digest::NONE,
                    skipped: true,
                };
                self.preprocessed.push_back(p);
                return p;
            }
        };
        let diverged = std::mem::take(&mut self.diverge_next).then(|| diverged(&ke.request));
        let request = diverged.as_ref().unwrap_or(&ke.request);
        let d = self.ks.preprocess(ke.session, ke.zxid, ke.time_ms, request);
        if diverged.is_some() {
            // a request that fails as a whole (a multi whose first op is
            // refused) leaves the tree as the original would: no
            // divergence, so the hook waits for the next entry. Without
            // digests to compare, the divergence is taken as applied.
            let comparable = ke.digest.version != crate::digest::NO_DIGEST && ke.digest.version == d.version;
            if !comparable || ke.digest.mismatches(d) {
                self.log(
                    crate::NodeEvent::DivergeApplied.name(),
                    serde_json::json!({"log_index": e.index}),
                );
            } else {
                self.diverge_next = true;
            }
        }
        if !self.bugs.skip_digest_check {
            if let Err(m) = check_digest(e.index, Phase::Preprocess, &ke, d) {
                self.emit(super::Effect::DigestMismatch(m));
                self.halted = true;
            }
        }
        let p = Preprocessed {
            index: e.index,
            term: e.term,
            zxid: ke.zxid,
            carried: ke.digest,
            skipped: false,
        };
        self.preprocessed.push_back(p);
        p
    }

    /// The entry `e` carries, if it can be applied: it decodes, and its
    /// zxid follows the last one preprocessed. What decides this is the
    /// entry and the log before it, so every replica decides the same.
    fn entry_to_apply(&self, e: &Entry) -> Result<KEntry, String> {
        let ke = KEntry::decode(&e.data).map_err(|err| format!("does not decode: {err}"))?;
        let last = self.ks.last_preprocessed_zxid();
        if ke.zxid <= last {
            return Err(format!("zxid {:#x} is not after {last:#x}", ke.zxid));
        }
        Ok(ke)
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for e in entries {
            if self.halted {
                return;
            }
            if e.index <= self.applied_index {
                continue;
            }
            if e.entry_type == EntryType::EntryNormal && !e.data.is_empty() {
                // preprocessed already, unless replayed after a restart
                while self.preprocessed.front().is_some_and(|p| p.index < e.index) {
                    self.preprocessed.pop_front();
                }
                let p = match self.preprocessed.front() {
                    Some(&p) if p.index == e.index && p.term == e.term => p,
                    _ => {
                        self.preprocessed.clear();
                        let last = self.last_zxid();
                        self.ks.rollback_after(last);
                        let p = self.preprocess_entry(&e);
                        if self.halted {
                            return;
                        }
                        p
                    }
                };
                self.preprocessed.pop_front();
                let (origin, req) = parse_context(&e.context);
                if p.skipped {
                    self.log(
                        "entry_skipped",
                        serde_json::json!({"level": "ERROR", "log_index": e.index, "zxid": p.zxid}),
                    );
                    self.on_skipped(origin, req);
                } else {
                    let c = self.ks.commit(p.zxid);
                    if p.carried.mismatches(c.digest) && !self.bugs.skip_digest_check {
                        // decoded again only to describe the request
                        if let Ok(ke) = KEntry::decode(&e.data) {
                            if let Err(m) = check_digest(e.index, Phase::Commit, &ke, c.digest) {
                                self.emit(super::Effect::DigestMismatch(m));
                                self.halted = true;
                                return;
                            }
                        }
                    }
                    self.on_committed(origin, req, c);
                }
            }
            self.applied_index = e.index;
        }
    }

    /// The dedup witness: one log line per block id (a child of a node
    /// named `blocks`) the entry created or removed, with the entry's
    /// zxid and, for a creation, the id's ctime (the time the cleanup
    /// orders ids by). Every replica logs the same lines; the harness
    /// keeps one per zxid and path.
    fn witness_blocks(&mut self, c: &crate::Committed) {
        for e in &c.events {
            let op = match e.kind {
                EventType::NodeCreated => "create",
                EventType::NodeDeleted => "remove",
                _ => continue,
            };
            let parent = crate::path::parent(&e.path);
            if !(parent.ends_with("/blocks") && e.path.len() > parent.len() + 1) {
                continue;
            }
            let node = self.ks.state().get(&e.path);
            let (ctime, data) = match (op, node) {
                ("create", Some(n)) => (Some(n.stat.ctime), Some(String::from_utf8_lossy(&n.data).into_owned())),
                _ => (None, None),
            };
            self.log(
                crate::NodeEvent::BlockId.name(),
                serde_json::json!({"op": op, "path": e.path, "zxid": c.zxid, "session": c.session,
                    "ctime_ms": ctime, "data": data}),
            );
        }
    }

    /// A committed entry that could not be applied: its client, if it is
    /// here, hears `MarshallingError` (or loses the connection for a
    /// session's open or close), as for a request over a limit.
    fn on_skipped(&mut self, origin: u64, req: u64) {
        if origin != self.id {
            return;
        }
        match self.pending.remove(&req) {
            Some(Pending {
                conn,
                kind: PendingKind::Write { xid, seq, .. },
                ..
            }) => {
                let zxid = self.last_zxid();
                self.answer(conn, seq, proto::encode_error(xid, zxid, ZkError::MarshallingError));
            }
            Some(p) => self.drop_conn(p.conn),
            None => {}
        }
    }

    fn on_committed(&mut self, origin: u64, req: u64, c: crate::Committed) {
        for (session, event) in self.watches.trigger(&c.events) {
            self.deliver(session, c.zxid, &event);
        }
        if self.cfg.witness_blocks {
            self.witness_blocks(&c);
        }
        let mine = if origin == self.id {
            self.pending.remove(&req)
        } else {
            None
        };
        if let Some(p) = &mine {
            self.latency.record(p.since_us, self.env.now_us);
        }
        match &c.response {
            Response::CreateSession { session_id } => {
                let timeout = self.ks.state().session(*session_id).map_or(0, |s| s.timeout_ms);
                if self.is_leader() {
                    let now = self.now_ms();
                    self.tracker.touch(*session_id, timeout as u64, now);
                    if origin != 0 {
                        self.holders().entry(*session_id).or_default().insert(origin);
                    }
                }
                if let Some(p) = mine {
                    let mut flagless = false;
                    if let Some(conn) = self.conns.get_mut(&p.conn) {
                        conn.state = ConnState::Session(*session_id);
                        conn.last_zxid = c.zxid;
                        flagless = conn.flagless;
                    }
                    let resp = ConnectResponse::accepted(
                        timeout,
                        *session_id,
                        super::session_password(self.session_key, *session_id),
                        !flagless,
                    );
                    self.send_raw(p.conn, resp.encode());
                    self.take_early_frames(p.conn);
                }
            }
            Response::CloseSession => {
                let s = c.session;
                self.tracker.remove(s);
                self.holders().remove(&s);
                self.announced().remove(&s);
                self.closing.remove(&s);
                self.watches.remove_session(s);
                if let Some(Pending {
                    conn,
                    kind: PendingKind::Close { xid, seq },
                    ..
                }) = mine
                {
                    self.answer(conn, seq, proto::encode_error(xid, c.zxid, ZkError::Ok));
                }
                let gone: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, k)| k.state == ConnState::Session(s))
                    .map(|(id, _)| *id)
                    .collect();
                for id in gone {
                    // the reply goes out before the connection closes
                    self.drop_conn(id);
                }
            }
            resp => {
                if let Some(Pending {
                    conn,
                    kind:
                        PendingKind::Write {
                            xid,
                            opcode,
                            multi,
                            seq,
                        },
                    ..
                }) = mine
                {
                    if let Some(k) = self.conns.get_mut(&conn) {
                        k.last_zxid = k.last_zxid.max(c.zxid);
                    }
                    let frame = if opcode == opcode::AUTH {
                        proto::encode_error(xid, c.zxid, resp.error())
                    } else {
                        proto::encode_reply_shaped(xid, c.zxid, opcode, &multi, resp)
                    };
                    self.answer(conn, seq, frame);
                }
            }
        }
    }

    /// After a restart: preprocess what the log holds past the snapshot.
    /// A log that cannot be read back is a failed start, never "nothing
    /// to replay": the server would otherwise rejoin without entries it
    /// acknowledged.
    pub(super) fn catch_up_preprocess(&mut self) -> Result<(), crate::raftlog::StoreError> {
        let first = self.applied_index + 1;
        let last = raft::Storage::last_index(self.raw.store())?;
        if last < first {
            return Ok(());
        }
        let entries = raft::Storage::entries(
            self.raw.store(),
            first,
            last + 1,
            None,
            raft::GetEntriesContext::empty(false),
        )?;
        for e in entries {
            if e.entry_type == EntryType::EntryNormal && !e.data.is_empty() {
                self.preprocess_entry(&e);
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- snapshots

    /// Starts a snapshot once `snapshot_distance` entries were applied
    /// since the last one (or raft wants one for a lagging follower). The
    /// server only copies the tree ([`crate::state::State::freeze`]); the
    /// driver encodes, compresses and writes it
    /// ([`super::Effect::WriteSnapshot`]), so a large tree does
    /// not stall clients and heartbeats for the time that takes. The log
    /// is compacted once the file is durable (`snapshot_written`). One
    /// snapshot at a time.
    fn maybe_snapshot(&mut self) {
        if self.writing.is_some() {
            return;
        }
        let last = self.raw.store().snapshot_index();
        let wanted = self.raw.store().snapshot_wanted();
        if self.applied_index <= last || (self.applied_index - last < self.cfg.snapshot_distance && wanted == 0) {
            return;
        }
        let index = self.applied_index;
        let term = raft::Storage::term(self.raw.store(), index).unwrap_or(self.raw.raft.term);
        let meta = SnapshotMeta {
            last_index: index,
            last_term: term,
            zxid: self.last_zxid(),
            digest: self.ks.digest(),
        };
        let state = self.ks.state().freeze();
        self.writing = Some(Writing { index, term });
        let config = self.snaps.config;
        self.emit(super::Effect::WriteSnapshot(super::SnapshotJob { state, meta, config }));
    }

    /// The driver wrote the snapshot (or could not): a written file lets
    /// the log be compacted below it, unless a snapshot installed from the
    /// leader meanwhile already covers more.
    pub(super) fn snapshot_written(&mut self, index: u64, term: u64, result: Result<u64, String>, took: (f64, f64)) {
        if self.writing.as_ref().is_none_or(|w| (w.index, w.term) != (index, term)) {
            // not the one asked for: nothing to do with it
            return;
        }
        let (copy_ms, write_ms) = took;
        self.writing = None;
        if let Err(e) = result {
            return self.fail(format!("snapshot: {e}"));
        }
        let store = self.raw.mut_store();
        if index <= store.snapshot_index() {
            return;
        }
        match store.set_snapshot(index, term) {
            Ok(()) => self.log(
                "snapshot",
                serde_json::json!({"index": index, "term": term, "copy_ms": copy_ms, "write_ms": write_ms}),
            ),
            Err(e) => self.fail(format!("snapshot: {e}")),
        }
    }

    /// Installs the leader's snapshot raft hands over. The driver lets a
    /// snapshot it is writing finish before it hands this server a
    /// snapshot message, so only this writes snapshot files now.
    fn install_snapshot(&mut self, s: &raft::prelude::Snapshot) {
        let meta = s.get_metadata();
        let name = snapshot::file_name(meta.index, meta.term);
        // raft hands over only a snapshot this server stepped, and it
        // stepped only one it had decoded (`decode_incoming_snapshot`)
        let (state, kmeta) = match self.incoming_snapshot.take() {
            Some((index, term, state, kmeta)) if (index, term) == (meta.index, meta.term) => (state, kmeta),
            _ => {
                return self.fail(format!(
                    "raft installs snapshot {name}, which was not checked when it arrived"
                ))
            }
        };
        self.ks = Storage::from_state(state, self.ks.mode() == crate::DigestMode::Full);
        self.preprocessed.clear();
        let snaps = &self.snaps;
        let store = self.raw.mut_store();
        if let Err(e) = snaps
            .write_bytes(&mut store.disk, &name, &s.data)
            .map_err(|e| e.to_string())
            .and_then(|_| store.set_snapshot(meta.index, meta.term).map_err(|e| e.to_string()))
        {
            return self.fail(format!("installing snapshot: {e}"));
        }
        self.applied_index = meta.index;
        // the tree jumped: sessions may have ended and watched nodes
        // changed with no event. As ZooKeeper does after a full sync, the
        // clients reconnect (and re-send their watches with the zxid they
        // saw, which fires what changed since)
        self.watches = WatchManager::new();
        let conns: Vec<u64> = self.conns.keys().copied().collect();
        for c in conns {
            self.drop_conn(c);
        }
        self.log(
            crate::NodeEvent::SnapshotInstalled.name(),
            serde_json::json!({"index": meta.index, "zxid": kmeta.zxid}),
        );
    }
}
