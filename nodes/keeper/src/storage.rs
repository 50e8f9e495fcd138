//! Preprocess / commit / rollback: the keeper state machine as Raft
//! drives it (ClickHouse Keeper's preprocess/commit split).
//!
//! * `preprocess` applies a write speculatively to the uncommitted
//!   overlay, so a later request sees earlier uncommitted ones, and
//!   returns the digest the tree will have once it commits. The leader
//!   writes that digest into the log entry; a follower compares it.
//! * `commit` makes the oldest preprocessed entry's deltas real and
//!   returns its response and the watch events it fires.
//! * `rollback_after` drops preprocessed entries past a zxid (Raft
//!   truncated them) and rebuilds the overlay from what remains.
//!
//! Time and zxid come from the log entry, never from a clock.
//! Invariant: committed state + pending deltas (in order) = overlay view;
//! the overlay's digest = committed digest + pending digest changes.

use crate::acl::{self, PERM_ADMIN, PERM_READ};
use crate::digest::Digest;
use crate::error::ZkError;
use crate::node::Node;
use crate::plan::{Overlay as OverlayView, Planner};
use crate::request::{Read, Response, Write};
use crate::state::{Delta, Session, State};
use crate::watch::{self, WatchEvent};
use std::collections::{BTreeMap, VecDeque};

/// How digests are kept (`digest` in a node's and a cluster's config,
/// `--digest` of `drift test`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DigestMode {
    /// No digests: entries carry none and nothing is checked.
    Off,
    /// Kept incrementally from node digests (the default).
    Incremental,
    /// Incremental, and after every commit recomputed from scratch and
    /// asserted equal (catches bugs in the incremental upkeep; O(tree)).
    Full,
}

impl DigestMode {
    pub fn name(self) -> &'static str {
        match self {
            DigestMode::Off => "off",
            DigestMode::Incremental => "incremental",
            DigestMode::Full => "full",
        }
    }

    pub fn parse(s: &str) -> Option<DigestMode> {
        match s {
            "off" => Some(DigestMode::Off),
            "incremental" => Some(DigestMode::Incremental),
            "full" => Some(DigestMode::Full),
            _ => None,
        }
    }
}

/// Latest uncommitted values, with how many pending entries touch each.
#[derive(Debug, Default, Clone)]
struct Overlay {
    nodes: BTreeMap<String, (Option<Node>, u32)>,
    sessions: BTreeMap<i64, (Option<Session>, u32)>,
    next_session_id: Option<(i64, u32)>,
    digest_sum: u64,
}

impl OverlayView for Overlay {
    fn node(&self, path: &str) -> Option<&Option<Node>> {
        self.nodes.get(path).map(|(n, _)| n)
    }

    fn session(&self, id: i64) -> Option<&Option<Session>> {
        self.sessions.get(&id).map(|(s, _)| s)
    }

    fn next_session_id(&self) -> Option<i64> {
        self.next_session_id.map(|(v, _)| v)
    }

    fn node_paths(&self) -> Vec<&str> {
        self.nodes.keys().map(String::as_str).collect()
    }
}

impl Overlay {
    fn push(&mut self, d: &Delta) {
        match d {
            Delta::Node { path, after, .. } => match self.nodes.get_mut(path) {
                Some(e) => {
                    e.0 = after.clone();
                    e.1 += 1;
                }
                None => {
                    self.nodes.insert(path.clone(), (after.clone(), 1));
                }
            },
            Delta::Session { id, after, .. } => {
                let e = self.sessions.entry(*id).or_insert((None, 0));
                e.0 = after.clone();
                e.1 += 1;
            }
            Delta::NextSessionId { after, .. } => {
                let refs = self.next_session_id.map_or(0, |(_, r)| r);
                self.next_session_id = Some((*after, refs + 1));
            }
        }
        self.digest_sum = self.digest_sum.wrapping_add(d.digest_change());
    }

    /// Forgets one pending touch of what `d` changed (it committed).
    fn release(&mut self, d: &Delta) {
        match d {
            Delta::Node { path, .. } => {
                let e = self.nodes.get_mut(path).expect("overlay holds every pending path");
                e.1 -= 1;
                if e.1 == 0 {
                    self.nodes.remove(path);
                }
            }
            Delta::Session { id, .. } => {
                let e = self.sessions.get_mut(id).expect("overlay holds every pending session");
                e.1 -= 1;
                if e.1 == 0 {
                    self.sessions.remove(id);
                }
            }
            Delta::NextSessionId { .. } => {
                let (v, r) = self.next_session_id.expect("overlay holds the pending counter");
                self.next_session_id = if r == 1 { None } else { Some((v, r - 1)) };
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Pending {
    zxid: i64,
    session: i64,
    deltas: Vec<Delta>,
    response: Response,
}

/// What committing an entry produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub zxid: i64,
    pub session: i64,
    pub response: Response,
    /// Watch events the entry fires, in a deterministic order.
    pub events: Vec<WatchEvent>,
    /// The committed tree's digest after this entry.
    pub digest: Digest,
}

/// The keeper state machine.
#[derive(Debug, Clone)]
pub struct Storage {
    state: State,
    overlay: Overlay,
    pending: VecDeque<Pending>,
    /// Recompute the digest from scratch after every commit (the `Full`
    /// mode; whether digests are on at all is the state's).
    full_check: bool,
    last_preprocessed: i64,
}

impl Storage {
    pub fn new(mode: DigestMode) -> Storage {
        Storage::from_state(State::new(mode != DigestMode::Off), mode == DigestMode::Full)
    }

    /// Resumes from a loaded state (a snapshot) with nothing pending.
    /// Digests are on or off as the state was built; `full_check`
    /// recomputes them after every commit.
    pub fn from_state(state: State, full_check: bool) -> Storage {
        let overlay = Overlay {
            digest_sum: state.digest_sum,
            ..Overlay::default()
        };
        Storage {
            last_preprocessed: state.last_zxid,
            state,
            overlay,
            pending: VecDeque::new(),
            full_check,
        }
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn mode(&self) -> DigestMode {
        match (self.state.digest_on(), self.full_check) {
            (false, _) => DigestMode::Off,
            (true, false) => DigestMode::Incremental,
            (true, true) => DigestMode::Full,
        }
    }

    /// zxid of the last preprocessed entry (= last committed if none pending).
    pub fn last_preprocessed_zxid(&self) -> i64 {
        self.last_preprocessed
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// The committed tree's digest.
    pub fn digest(&self) -> Digest {
        self.state.digest()
    }

    /// The digest the tree has once every preprocessed entry commits.
    pub fn uncommitted_digest(&self) -> Digest {
        Digest::of_sum(self.state.digest_on(), self.overlay.digest_sum)
    }

    /// Applies `req` speculatively as entry `zxid` at `time_ms` and returns
    /// the digest after it. `zxid` must exceed every zxid preprocessed.
    pub fn preprocess(&mut self, session: i64, zxid: i64, time_ms: i64, req: &Write) -> Digest {
        assert!(
            zxid > self.last_preprocessed,
            "zxid {zxid} not after {}",
            self.last_preprocessed
        );
        let (deltas, response) = Planner::new(&self.state, &self.overlay, session, zxid, time_ms).plan(req);
        for d in &deltas {
            self.overlay.push(d);
        }
        self.pending.push_back(Pending {
            zxid,
            session,
            deltas,
            response,
        });
        self.last_preprocessed = zxid;
        self.uncommitted_digest()
    }

    /// Commits the oldest preprocessed entry, which must be `zxid`.
    pub fn commit(&mut self, zxid: i64) -> Committed {
        let p = self.pending.pop_front().expect("commit without a preprocessed entry");
        assert_eq!(p.zxid, zxid, "commit out of order");
        assert!(zxid > self.state.last_zxid, "commit of an old zxid");
        let mut events = Vec::new();
        for d in p.deltas {
            watch::events_of(&d, &mut events);
            self.overlay.release(&d);
            self.state.apply(d);
        }
        self.state.last_zxid = zxid;
        if self.mode() == DigestMode::Full {
            let full = self.state.recompute_digest();
            assert_eq!(
                full, self.state.digest_sum,
                "incremental digest {:#x} != recomputed {full:#x} after zxid {zxid}",
                self.state.digest_sum
            );
        }
        Committed {
            zxid,
            session: p.session,
            response: p.response,
            events,
            digest: self.digest(),
        }
    }

    /// Drops every preprocessed entry with a zxid above `zxid` and
    /// rebuilds the overlay from the rest.
    pub fn rollback_after(&mut self, zxid: i64) {
        while self.pending.back().is_some_and(|p| p.zxid > zxid) {
            self.pending.pop_back();
        }
        let mut overlay = Overlay {
            digest_sum: self.state.digest_sum,
            ..Overlay::default()
        };
        for p in &self.pending {
            for d in &p.deltas {
                overlay.push(d);
            }
        }
        self.overlay = overlay;
        self.last_preprocessed = self.pending.back().map_or(self.state.last_zxid, |p| p.zxid);
    }

    /// getAllChildrenNumber: how many nodes are below `path` at any depth,
    /// for a session that may read it.
    pub fn all_children_number(&self, session: i64, path: &str) -> Result<usize, ZkError> {
        let ids: &[crate::acl::Id] = self.state.session(session).map_or(&[], |s| &s.auth);
        if crate::path::validate(path).is_err() {
            return Err(ZkError::BadArguments);
        }
        let node = self.state.get(path).ok_or(ZkError::NoNode)?;
        if !acl::allowed(&node.acl, PERM_READ, ids) {
            return Err(ZkError::NoAuth);
        }
        Ok(self.state.descendants(path))
    }

    /// Serves a read from the committed tree for `session`.
    pub fn read(&self, session: i64, req: &Read) -> Response {
        let ids: &[crate::acl::Id] = self.state.session(session).map_or(&[], |s| &s.auth);
        let path = match req {
            Read::GetData { path } | Read::Exists { path } | Read::GetChildren { path } | Read::GetAcl { path } => path,
        };
        if crate::path::validate(path).is_err() {
            return Response::Error(ZkError::BadArguments);
        }
        let Some(node) = self.state.get(path) else {
            return Response::Error(ZkError::NoNode);
        };
        let can = |perm| acl::allowed(&node.acl, perm, ids);
        match req {
            Read::Exists { .. } => Response::Exists { stat: node.stat },
            Read::GetData { .. } if can(PERM_READ) => Response::GetData {
                data: node.data.to_vec(),
                stat: node.stat,
            },
            Read::GetChildren { .. } if can(PERM_READ) => Response::GetChildren {
                children: self.state.children(path),
                stat: node.stat,
            },
            Read::GetAcl { .. } if can(PERM_READ | PERM_ADMIN) => Response::GetAcl {
                acl: node.acl.to_vec(),
                stat: node.stat,
            },
            _ => Response::Error(ZkError::NoAuth),
        }
    }
}
