//! The server's client side: the ZooKeeper handshake, requests and their
//! per-session order (each connection's queue: answers leave in request
//! order, reads are served at the head once servable, a write behind an
//! unanswered read waits for it), watches.

use super::{ConnState, KeeperServer, ParkedRead, PendingKind, Slot, SlotState, CONFIG_NODE, SESSION_QUEUE_MAX};
use crate::disk::Disk;
use crate::proto::{self, ClientRequest, ConnectRequest, ConnectResponse, Request, XID_PING, XID_SET_WATCHES};
use crate::watch::{EventType, WatchEvent, WatchKind};
use crate::{Read, Response, Write, ZkError};

impl<D: Disk> KeeperServer<D> {
    pub(super) fn send_raw(&mut self, conn: u64, frame: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        self.sent += 1;
        c.sent += 1;
        self.emit(super::Effect::Client { conn, frame });
    }

    /// Ends a connection: its reader stops at once; what is queued for it
    /// is sent, then it closes.
    pub(super) fn drop_conn(&mut self, conn: u64) {
        if self.conns.remove(&conn).is_some() {
            self.emit(super::Effect::Close { conn });
        }
    }

    pub(super) fn on_frame(&mut self, conn: u64, payload: &[u8]) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.received += 1;
        match c.state {
            // requests behind a connect request not answered yet wait for
            // the session, as ZooKeeper's do
            ConnState::Handshake | ConnState::Revalidating(_) | ConnState::Session(_) if c.connecting => {
                if c.early.len() >= super::EARLY_FRAMES_MAX {
                    self.drop_conn(conn);
                } else {
                    c.early.push(payload.to_vec());
                }
            }
            ConnState::Handshake => match ConnectRequest::decode(payload) {
                Ok(req) => {
                    c.connecting = true;
                    self.on_connect(conn, req)
                }
                Err(_) => self.drop_conn(conn),
            },
            ConnState::Revalidating(_) => self.drop_conn(conn),
            ConnState::Session(session) => match Request::decode(payload) {
                Ok(req) => {
                    self.alive.insert(session);
                    self.on_request(conn, session, req)
                }
                Err(e) => {
                    self.log(
                        "bad_client_frame",
                        serde_json::json!({"conn": conn, "error": e.to_string()}),
                    );
                    self.drop_conn(conn)
                }
            },
        }
    }

    /// Serves the requests that came behind the connect request of
    /// `conn`, now that its session is established.
    pub(super) fn take_early_frames(&mut self, conn: u64) {
        // raft-rs takes nothing new while a Ready is handled (see
        // `handle_ready`): after it; frames that come meanwhile queue
        // behind these
        if self.in_ready {
            self.early_after_ready.insert(conn);
            return;
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.connecting = false;
        let frames = std::mem::take(&mut c.early);
        // counted when they came
        c.received = c.received.saturating_sub(frames.len() as u64);
        for frame in frames {
            self.on_frame(conn, &frame);
        }
    }

    fn on_connect(&mut self, conn: u64, req: ConnectRequest) {
        let flagless = req.read_only.is_none();
        if let Some(c) = self.conns.get_mut(&conn) {
            c.flagless = flagless;
        }
        if req.last_zxid_seen > self.last_zxid() {
            // this server is behind what the client saw: try another
            self.drop_conn(conn);
            return;
        }
        let timeout = (req.timeout_ms.max(0) as u64)
            .clamp(self.cfg.session_timeout_min_ms, self.cfg.session_timeout_max_ms) as i32;
        if req.session_id == 0 {
            self.submit(
                0,
                Write::CreateSession { timeout_ms: timeout },
                conn,
                PendingKind::Connect,
            );
            return;
        }
        self.resume(conn, req, false);
    }

    /// Answers the resumption of session `req.session_id`: accepted if this
    /// server has it (and the password matches), expired if the leader (or,
    /// after a revalidation, the leader's commit index applied here) says
    /// it is gone; a follower that has not heard of it yet revalidates it
    /// first (see [`ConnState::Revalidating`]).
    fn resume(&mut self, conn: u64, req: ConnectRequest, revalidated: bool) {
        let flagless = req.read_only.is_none();
        let known = self.ks.state().session(req.session_id).map(|s| s.timeout_ms);
        match known {
            Some(t) if same_secret(&req.passwd, &super::session_password(self.session_key, req.session_id)) => {
                let resp = ConnectResponse::accepted(t, req.session_id, req.passwd, !flagless);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.state = ConnState::Session(req.session_id);
                    c.last_zxid = req.last_zxid_seen;
                }
                self.alive.insert(req.session_id);
                // the session is held here now: the leader hears it before
                // this server forwards a write under it
                self.announced().remove(&req.session_id);
                if self.is_leader() {
                    let me = self.id;
                    self.holders().entry(req.session_id).or_default().insert(me);
                }
                self.send_raw(conn, resp.encode());
                self.take_early_frames(conn);
            }
            // a follower may not have applied the session yet: it learns
            // how far the leader has committed before it says
            None if !self.is_leader() && !revalidated => {
                self.ask_read_index(super::ReadRound {
                    conn,
                    seq: 0,
                    connect: true,
                    since_us: self.env.now_us,
                });
                self.log(
                    "session_revalidating",
                    serde_json::json!({"session": format!("{:#x}", req.session_id)}),
                );
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.state = ConnState::Revalidating(super::Revalidation {
                        req,
                        until_index: u64::MAX,
                    });
                }
            }
            _ => {
                self.send_raw(conn, ConnectResponse::expired(!flagless).encode());
                self.drop_conn(conn);
            }
        }
    }

    /// A session's request: answered at once (a ping), or queued in the
    /// connection's order (everything else; see [`super::Conn::queue`]).
    fn on_request(&mut self, conn: u64, session: i64, req: Request) {
        let zxid = self.last_zxid();
        if let ClientRequest::Ping = req.body {
            // pings carry nothing and clients match them by their own
            // xid: they do not wait behind the session's requests
            self.send_raw(conn, proto::encode_error(XID_PING, zxid, ZkError::Ok));
            return;
        }
        let Some(queued) = self.conns.get(&conn).map(|c| c.queue.len()) else {
            return;
        };
        if queued >= SESSION_QUEUE_MAX {
            self.log(
                "client_queue_full",
                serde_json::json!({"level": "WARN", "session": session, "queued": SESSION_QUEUE_MAX}),
            );
            self.drop_conn(conn);
            return;
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let seq = c.next_seq;
        c.next_seq += 1;
        // with quorum reads, a write waits while a read before it is
        // unanswered: the read is servable only once its read-index round
        // is back, which may be after this write applied. A local read is
        // servable as soon as it reaches the head — when the write before
        // it applies, so before any later write of its session does — and
        // writes go on behind it at once, as ZooKeeper pipelines them.
        let behind_read = self.cfg.quorum_reads && c.queue.iter().any(|s| s.holds_writes());
        let state = match req.body {
            ClientRequest::Ping => unreachable!("answered above"),
            ClientRequest::Write(Write::CloseSession) => self.write_slot(
                conn,
                session,
                Write::CloseSession,
                PendingKind::Close { xid: req.xid, seq },
                behind_read,
            ),
            ClientRequest::Write(w) if self.loses(&w) => {
                // the lose-multi hook: the write never reaches the log
                self.lose_multi = None;
                self.log(
                    "multi_lost_by_hook",
                    serde_json::json!({"session": session, "xid": req.xid}),
                );
                self.drop_conn(conn);
                return;
            }
            ClientRequest::Write(w) => {
                // an auth is answered under the xid it came with, as
                // ZooKeeper does: kazoo sends -4, other clients their own
                // counter (and match the answer by it)
                let xid = req.xid;
                if let Err(over) = crate::limit::check(&w) {
                    // refused by field, the connection kept (ZooKeeper bounds
                    // the whole frame by jute.maxbuffer and hangs up)
                    self.log(
                        "request_refused",
                        serde_json::json!({"session": session, "request": w.name(), "why": over.to_string()}),
                    );
                    SlotState::Answer(proto::encode_error(xid, zxid, ZkError::MarshallingError))
                } else {
                    let kind = PendingKind::Write {
                        xid,
                        opcode: req.opcode,
                        multi: req.multi_opcodes,
                        seq,
                    };
                    self.write_slot(conn, session, w, kind, behind_read)
                }
            }
            body @ (ClientRequest::Read(_)
            | ClientRequest::MultiRead(_)
            | ClientRequest::GetEphemerals { .. }
            | ClientRequest::GetAllChildrenNumber { .. }) => {
                let last = self.conns.get(&conn).map_or(0, |c| c.last_zxid);
                let mut read = ParkedRead {
                    xid: req.xid,
                    opcode: req.opcode,
                    body,
                    until_zxid: last,
                    until_index: 0,
                    since_us: self.env.now_us,
                    holds_writes: self.cfg.quorum_reads,
                };
                if self.cfg.quorum_reads && !self.bugs.local_read_in_quorum_round {
                    read.until_index = u64::MAX;
                    self.ask_read_index(super::ReadRound {
                        conn,
                        seq,
                        connect: false,
                        since_us: self.env.now_us,
                    });
                }
                SlotState::Read(read)
            }
            ClientRequest::SetWatches {
                relative_zxid,
                data,
                exist,
                child,
                persistent,
                persistent_recursive,
            } => {
                self.set_watches(session, relative_zxid, data, exist, child);
                // persistent watches come back as they were: they fire for
                // what happens from now on
                for (paths, kind) in [
                    (persistent, WatchKind::Persistent),
                    (persistent_recursive, WatchKind::PersistentRecursive),
                ] {
                    for p in paths {
                        self.watches.register(session, &p, kind);
                    }
                }
                SlotState::Answer(proto::encode_error(XID_SET_WATCHES, zxid, ZkError::Ok))
            }
            // answered from this server's own state in the session's
            // order, once every request before it is answered: a whoAmI
            // right after an addauth names the new identity, and a watch
            // added right after a write does not fire for it
            body @ (ClientRequest::WhoAmI | ClientRequest::AddWatch { .. } | ClientRequest::RemoveWatches { .. }) => {
                SlotState::Read(ParkedRead {
                    xid: req.xid,
                    opcode: req.opcode,
                    body,
                    until_zxid: 0,
                    until_index: 0,
                    since_us: self.env.now_us,
                    // answered as soon as it reaches the head, before a
                    // later write of its session can apply
                    holds_writes: false,
                })
            }
            ClientRequest::Unsupported { code } => SlotState::Answer(proto::encode_error(req.xid, zxid, code)),
        };
        // a submit that found no leader dropped the connection
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.queue.push_back(Slot { seq, state });
        self.pump(conn);
    }

    /// Whether the `lose-multi` hook takes `w`: a multi creating a path
    /// that contains the hook's fragment.
    fn loses(&self, w: &Write) -> bool {
        let (Some(fragment), Write::Multi(ops)) = (&self.lose_multi, w) else {
            return false;
        };
        ops.iter()
            .any(|op| matches!(op, crate::request::Op::Create(c) if c.path.contains(fragment.as_str())))
    }

    /// The queue slot of a write: submitted now, or held behind a read.
    fn write_slot(&mut self, conn: u64, session: i64, w: Write, kind: PendingKind, behind_read: bool) -> SlotState {
        if behind_read {
            return SlotState::Held { write: w, kind };
        }
        self.submit(session, w, conn, kind);
        SlotState::Write
    }

    /// The answer to the request `seq` of `conn`: it leaves once every
    /// request before it has been answered.
    pub(super) fn answer(&mut self, conn: u64, seq: u64, frame: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.queue.iter_mut().find(|s| s.seq == seq) {
            Some(slot) => slot.state = SlotState::Answer(frame),
            // a request this connection never queued: nothing to answer
            None => return,
        }
        self.pump(conn);
    }

    /// Sends what can leave from the head of `conn`'s queue — answers, and
    /// reads that are servable — then submits the held writes that no
    /// longer have a read before them.
    fn pump(&mut self, conn: u64) {
        loop {
            let zxid = self.ks.state().last_zxid();
            let applied = self.applied_index;
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            let ConnState::Session(session) = c.state else {
                return;
            };
            match c.queue.front().map(|s| &s.state) {
                Some(SlotState::Answer(_)) => {
                    if let Some(Slot {
                        state: SlotState::Answer(frame),
                        ..
                    }) = c.queue.pop_front()
                    {
                        self.send_raw(conn, frame);
                    }
                }
                Some(SlotState::Read(r)) if r.until_zxid <= zxid && r.until_index <= applied => {
                    if let Some(Slot {
                        state: SlotState::Read(r),
                        ..
                    }) = c.queue.pop_front()
                    {
                        if let Some(frame) = self.serve(conn, session, r) {
                            self.send_raw(conn, frame);
                        }
                    }
                }
                _ => break,
            }
        }
        self.release_held(conn);
    }

    /// Submits `conn`'s held writes up to its first unanswered read (after
    /// the Raft round when one is being handled: see `handle_ready`).
    pub(super) fn release_held(&mut self, conn: u64) {
        if self.in_ready {
            self.release_after_ready.insert(conn);
            return;
        }
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            let ConnState::Session(session) = c.state else {
                return;
            };
            let Some(slot) = c
                .queue
                .iter_mut()
                .take_while(|s| !s.holds_writes())
                .find(|s| matches!(s.state, SlotState::Held { .. }))
            else {
                return;
            };
            let SlotState::Held { write, kind } = std::mem::replace(&mut slot.state, SlotState::Write) else {
                unreachable!("found held");
            };
            self.submit(session, write, conn, kind);
        }
    }

    /// Who `session` on `conn` is, as whoAmI answers: the client's address
    /// (ZooKeeper's implicit `ip` identity), then each identity it added.
    fn who_am_i(&self, conn: u64, session: i64) -> Vec<(String, String)> {
        let mut users = Vec::new();
        if let Some(ip) = self.conns.get(&conn).and_then(|c| c.peer).map(|a| a.ip()) {
            users.push(("ip".to_string(), ip.to_string()));
        }
        for id in self.ks.state().session(session).map_or(&[][..], |s| &s.auth) {
            // a digest id is `user:hash`; the user is what whoAmI names
            let user = match id.scheme.as_str() {
                "digest" => id.id.split(':').next().unwrap_or("").to_string(),
                _ => id.id.clone(),
            };
            users.push((id.scheme.clone(), user));
        }
        users
    }

    /// `/zookeeper/config`, ZooKeeper's dynamic configuration node, read
    /// as a client reads it: every server, its peer and client addresses.
    /// It lives outside the replicated tree (it is what the cluster file
    /// says, the same on every server), so it changes no digest.
    fn config_node(&self) -> Vec<u8> {
        let mut text = String::new();
        for p in &self.cfg.members {
            text.push_str(&format!(
                "server.{}={}:{}:{}:participant;{}\n",
                p.id,
                p.raft.ip(),
                p.raft.port(),
                p.raft.port(),
                p.client
            ));
        }
        text.push_str("version=0");
        text.into_bytes()
    }

    /// Whether the config node is the one outside the tree (not a znode
    /// of that name an older build let a client create).
    fn config_is_virtual(&self) -> bool {
        self.ks.state().get(CONFIG_NODE).is_none()
    }

    /// A read of the config node, or `/zookeeper`'s children (which list
    /// it); `None` for any other read, and for every read when a tree made
    /// by an older build holds a znode of that name (an ordinary node, see
    /// `plan.rs`).
    fn read_config(&self, session: i64, read: &Read) -> Option<Response> {
        if !self.config_is_virtual() {
            return None;
        }
        // version -1, as ZooKeeper's setData at -1 leaves it
        let config_stat = || crate::node::Stat {
            data_length: self.config_node().len() as i32,
            version: -1,
            ..Default::default()
        };
        match read {
            Read::GetData { path } if path == CONFIG_NODE => Some(Response::GetData {
                data: self.config_node(),
                stat: config_stat(),
            }),
            Read::Exists { path } if path == CONFIG_NODE => Some(Response::Exists { stat: config_stat() }),
            Read::GetAcl { path } if path == CONFIG_NODE => Some(Response::GetAcl {
                acl: vec![crate::acl::Acl::world(crate::acl::PERM_READ)],
                stat: config_stat(),
            }),
            Read::GetChildren { path } if path == CONFIG_NODE => Some(Response::GetChildren {
                children: Vec::new(),
                stat: config_stat(),
            }),
            Read::GetChildren { path } if path == "/zookeeper" => match self.ks.read(session, read) {
                Response::GetChildren { mut children, mut stat } => {
                    children.push("config".to_string());
                    children.sort();
                    stat.num_children += 1;
                    Some(Response::GetChildren { children, stat })
                }
                other => Some(other),
            },
            _ => None,
        }
    }

    /// The answer to a read, from the tree as it is now.
    fn serve(&mut self, conn: u64, session: i64, r: ParkedRead) -> Option<Vec<u8>> {
        let zxid = self.last_zxid();
        self.latency.record(r.since_us, self.env.now_us);
        let frame = match &r.body {
            ClientRequest::WhoAmI => proto::encode_who_am_i(r.xid, zxid, &self.who_am_i(conn, session)),
            ClientRequest::AddWatch { path, recursive } => {
                let err = if crate::path::validate(path).is_err() {
                    ZkError::BadArguments
                } else {
                    let kind = if *recursive {
                        WatchKind::PersistentRecursive
                    } else {
                        WatchKind::Persistent
                    };
                    if self.watches.register(session, path, kind) {
                        ZkError::Ok
                    } else {
                        ZkError::BadArguments
                    }
                };
                proto::encode_error_response(r.xid, zxid, err)
            }
            ClientRequest::RemoveWatches { path, kind, check_only } => {
                // ZooKeeper answers NoWatcher when the session has none
                // of that kind there, and MarshallingError for a watcher
                // type it does not know
                let err = match kind {
                    None => ZkError::MarshallingError,
                    Some(kind) if self.watches.remove(session, path, *kind, *check_only) => ZkError::Ok,
                    Some(_) => ZkError::NoWatcher,
                };
                proto::encode_error(r.xid, zxid, err)
            }
            ClientRequest::GetAllChildrenNumber { path } => match self.ks.all_children_number(session, path) {
                // the config node is below both, outside the tree
                Ok(n) => {
                    let config = usize::from(self.config_is_virtual() && (path == "/" || path == "/zookeeper"));
                    proto::encode_count_reply(r.xid, zxid, (n + config).min(i32::MAX as usize) as i32)
                }
                Err(ZkError::NoNode) if path == CONFIG_NODE => proto::encode_count_reply(r.xid, zxid, 0),
                Err(e) => proto::encode_error(r.xid, zxid, e),
            },
            ClientRequest::GetEphemerals { prefix } => {
                let ephemerals: Vec<String> = self
                    .ks
                    .state()
                    .ephemerals_of(session)
                    .filter(|p| p.starts_with(prefix.as_str()))
                    .map(str::to_string)
                    .collect();
                proto::encode_strings_reply(r.xid, zxid, &ephemerals)
            }
            ClientRequest::Read(wr) => {
                let resp = self
                    .read_config(session, &wr.read)
                    .unwrap_or_else(|| self.ks.read(session, &wr.read));
                if wr.watch {
                    let (path, kind) = match &wr.read {
                        Read::GetChildren { path } => (path, WatchKind::Child),
                        Read::GetData { path } | Read::Exists { path } | Read::GetAcl { path } => {
                            (path, WatchKind::Data)
                        }
                    };
                    let register = match resp.error() {
                        ZkError::Ok => true,
                        ZkError::NoNode => matches!(wr.read, Read::Exists { .. }),
                        _ => false,
                    };
                    if register {
                        self.watches.register(session, path, kind);
                    }
                }
                proto::encode_reply(r.xid, zxid, r.opcode, &resp)
            }
            ClientRequest::MultiRead(reads) => {
                let answers: Vec<(Read, Response)> = reads
                    .iter()
                    .map(|x| {
                        let resp = self.read_config(session, x).unwrap_or_else(|| self.ks.read(session, x));
                        (x.clone(), resp)
                    })
                    .collect();
                proto::encode_multi_read(r.xid, zxid, &answers)
            }
            ClientRequest::Ping
            | ClientRequest::Write(_)
            | ClientRequest::SetWatches { .. }
            | ClientRequest::Unsupported { .. } => return None,
        };
        Some(frame)
    }

    /// Serves the reads at the head of every queue that became servable,
    /// and answers the revalidated sessions whose index has applied.
    pub(super) fn serve_parked(&mut self) {
        let applied = self.applied_index;
        let ready: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(&c.state, ConnState::Revalidating(r) if r.until_index <= applied))
            .map(|(id, _)| *id)
            .collect();
        for conn in ready {
            let Some(c) = self.conns.get_mut(&conn) else { continue };
            let ConnState::Revalidating(r) = std::mem::replace(&mut c.state, ConnState::Handshake) else {
                continue;
            };
            self.resume(conn, r.req, true);
        }
        let waiting: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.queue.front().is_some_and(|s| matches!(s.state, SlotState::Read(_))))
            .map(|(id, _)| *id)
            .collect();
        for conn in waiting {
            self.pump(conn);
        }
    }

    /// A quorum read's round came back: it may be served once `index` is
    /// applied.
    pub(super) fn read_index_done(&mut self, conn: u64, seq: u64, connect: bool, index: u64) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if connect {
            if let ConnState::Revalidating(r) = &mut c.state {
                r.until_index = index;
            }
            return;
        }
        if let Some(Slot {
            state: SlotState::Read(r),
            ..
        }) = c.queue.iter_mut().find(|s| s.seq == seq)
        {
            r.until_index = index;
        }
    }

    fn set_watches(&mut self, session: i64, rel: i64, data: Vec<String>, exist: Vec<String>, child: Vec<String>) {
        let mut fire = Vec::new();
        // a data or child watch fires at once if its node changed (or went)
        // since the zxid the client last saw; else it is registered
        type Changed = fn(&crate::node::Stat) -> i64;
        let kinds: [(Vec<String>, Changed, EventType, WatchKind); 2] = [
            (data, |s| s.mzxid, EventType::NodeDataChanged, WatchKind::Data),
            (child, |s| s.pzxid, EventType::NodeChildrenChanged, WatchKind::Child),
        ];
        for (paths, changed, event, kind) in kinds {
            for p in paths {
                match self.ks.state().get(&p) {
                    None => fire.push(WatchEvent {
                        kind: EventType::NodeDeleted,
                        path: p,
                    }),
                    Some(n) if changed(&n.stat) > rel => fire.push(WatchEvent { kind: event, path: p }),
                    Some(_) => {
                        self.watches.register(session, &p, kind);
                    }
                }
            }
        }
        for p in exist {
            if self.ks.state().get(&p).is_some() {
                fire.push(WatchEvent {
                    kind: EventType::NodeCreated,
                    path: p,
                });
            } else {
                self.watches.register(session, &p, WatchKind::Data);
            }
        }
        let zxid = self.last_zxid();
        for e in fire {
            self.deliver(session, zxid, &e);
        }
    }

    pub(super) fn deliver(&mut self, session: i64, zxid: i64, e: &WatchEvent) {
        let conns: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == ConnState::Session(session))
            .map(|(id, _)| *id)
            .collect();
        for c in conns {
            self.send_raw(c, proto::encode_watch_event(zxid, e));
        }
    }
}

/// Compares a password a client sent with the right one in a time that
/// does not depend on where they first differ.
fn same_secret(sent: &[u8], right: &[u8]) -> bool {
    sent.len() == right.len() && sent.iter().zip(right).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}
