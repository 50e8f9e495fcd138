//! Planning a write: from a request and a view of the state (committed
//! tree + uncommitted overlay), the deltas it makes and the response it
//! gets. Pure: nothing is changed until the caller applies the deltas.
//!
//! A rejected request plans no deltas and an error response (Keeper's
//! "error delta"). A multi plans its ops in order, each seeing the ones
//! before it; if one fails, the multi plans nothing.
//!
//! Checks follow ZooKeeper's PrepRequestProcessor, in its order, so the
//! same bad request gets the same error code.

use crate::acl::{self, Acl, PERM_ADMIN, PERM_CREATE, PERM_DELETE, PERM_READ, PERM_WRITE};
use crate::error::ZkError;
use crate::node::{Kind, Node, Stat, DATA_BYTES_MAX, TTL_MS_MAX};
use crate::path;
use crate::request::{Create, Op, OpResult, Response, Write, MULTI_OPS_MAX};
use crate::state::{make_node, Delta, Session, State, CONFIG_PATH};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Uncommitted values layered over the committed state.
pub(crate) trait Overlay {
    /// `Some(v)` when the path has an uncommitted value (`v = None`: deleted).
    fn node(&self, path: &str) -> Option<&Option<Node>>;
    fn session(&self, id: i64) -> Option<&Option<Session>>;
    fn next_session_id(&self) -> Option<i64>;
    /// Paths of uncommitted nodes (for ephemerals of a closing session).
    fn node_paths(&self) -> Vec<&str>;
}

pub(crate) struct Planner<'a, O: Overlay> {
    state: &'a State,
    overlay: &'a O,
    local: BTreeMap<String, Option<Node>>,
    local_sessions: BTreeMap<i64, Option<Session>>,
    local_next_sid: Option<i64>,
    deltas: Vec<Delta>,
    session: i64,
    zxid: i64,
    time_ms: i64,
}

type Planned<T> = Result<T, ZkError>;

impl<'a, O: Overlay> Planner<'a, O> {
    pub fn new(state: &'a State, overlay: &'a O, session: i64, zxid: i64, time_ms: i64) -> Self {
        Planner {
            state,
            overlay,
            local: BTreeMap::new(),
            local_sessions: BTreeMap::new(),
            local_next_sid: None,
            deltas: Vec::new(),
            session,
            zxid,
            time_ms,
        }
    }

    /// Plans `req`: its deltas and its response.
    pub fn plan(mut self, req: &Write) -> (Vec<Delta>, Response) {
        let response = match self.plan_write(req) {
            Ok(r) => r,
            Err(e) => {
                self.deltas.clear();
                Response::Error(e)
            }
        };
        if matches!(response, Response::Multi { error, .. } if error != ZkError::Ok) {
            self.deltas.clear();
        }
        (self.deltas, response)
    }

    /// `path`'s node as this plan sees it. The configuration node, which
    /// lives outside the tree, is seen as ZooKeeper keeps it: read-only
    /// for everyone at version -1, so every write to it or under it is
    /// refused by the checks any node gets (deleting it is refused by
    /// name); a tree made by a build that let a client create a znode
    /// there keeps that znode.
    fn node(&self, path: &str) -> Option<&Node> {
        if let Some(v) = self.local.get(path) {
            return v.as_ref();
        }
        if let Some(v) = self.overlay.node(path) {
            return v.as_ref();
        }
        self.state.get(path).or_else(|| (path == CONFIG_PATH).then(config_node))
    }

    fn session(&self, id: i64) -> Option<&Session> {
        if let Some(v) = self.local_sessions.get(&id) {
            return v.as_ref();
        }
        if let Some(v) = self.overlay.session(id) {
            return v.as_ref();
        }
        self.state.session(id)
    }

    /// Plans `path`'s node to become `after`. `before` is its node as this
    /// plan sees it, which every caller has just looked up: taking it
    /// spares a lookup, and under a parent of many children each lookup of
    /// the tree's ordered map compares their long shared prefix at every
    /// step (BENCHMARKS.md).
    fn put_node(&mut self, path: &str, before: Option<Node>, after: Option<Node>) {
        debug_assert_eq!(self.node(path), before.as_ref(), "{path}: a stale before");
        self.deltas.push(Delta::Node {
            path: path.to_string(),
            before,
            after: after.clone(),
        });
        self.local.insert(path.to_string(), after);
    }

    fn put_session(&mut self, id: i64, after: Option<Session>) {
        let before = self.session(id).cloned();
        self.deltas.push(Delta::Session {
            id,
            before,
            after: after.clone(),
        });
        self.local_sessions.insert(id, after);
    }

    fn node_value(&self, path: &str, data: Arc<[u8]>, stat: Stat, acl: Arc<[Acl]>, seq: i64) -> Node {
        make_node(path, data, stat, acl, seq, self.state.digest_on())
    }

    /// Replaces `path`'s node, `old` as this plan sees it, with `f(stat,
    /// seq)` applied, recomputing its digest.
    fn update(&mut self, path: &str, old: Node, f: impl FnOnce(&mut Stat, &mut i64)) {
        let (mut stat, mut seq) = (old.stat, old.seq);
        f(&mut stat, &mut seq);
        let new = old.restat(stat, old.acl.clone(), seq, self.state.digest_on());
        self.put_node(path, Some(old), Some(new));
    }

    fn auth_ids(&self) -> &[acl::Id] {
        self.session(self.session).map_or(&[], |s| &s.auth)
    }

    fn check_acl(&self, node: &Node, perm: u32) -> Planned<()> {
        if acl::allowed(&node.acl, perm, self.auth_ids()) {
            Ok(())
        } else {
            Err(ZkError::NoAuth)
        }
    }

    /// A client write must come from a live session (0 is the system).
    fn live_session(&self) -> Planned<()> {
        if self.session == 0 || self.session(self.session).is_some() {
            Ok(())
        } else {
            Err(ZkError::SessionExpired)
        }
    }

    fn plan_write(&mut self, req: &Write) -> Planned<Response> {
        match req {
            Write::CreateSession { timeout_ms } => return self.create_session(*timeout_ms),
            Write::CloseSession => return self.close_session(),
            Write::Reap { path } => return self.reap(path),
            _ => {}
        }
        self.live_session()?;
        match req {
            Write::Op(op) => Ok(match self.op(op)? {
                OpResult::Create { path, stat } => Response::Create { path, stat },
                OpResult::Delete => Response::Delete,
                OpResult::SetData { stat } => Response::SetData { stat },
                OpResult::Check => Response::Check,
                OpResult::Error(e) => Response::Error(e),
            }),
            Write::SetAcl { path, acl, version } => self.set_acl(path, acl, *version),
            Write::Multi(ops) => self.multi(ops),
            Write::AddAuth { scheme, auth } => self.add_auth(scheme, auth),
            Write::Sync { path } => {
                valid(path)?;
                Ok(Response::Sync { path: path.clone() })
            }
            Write::CreateSession { .. } | Write::CloseSession | Write::Reap { .. } => {
                unreachable!("handled above")
            }
        }
    }

    fn op(&mut self, op: &Op) -> Planned<OpResult> {
        match op {
            Op::Create(c) => self.create(c),
            Op::Delete { path, version } => self.delete(path, *version, true),
            Op::SetData { path, data, version } => self.set_data(path, data, *version),
            Op::Check { path, version } => {
                valid(path)?;
                let node = self.node(path).ok_or(ZkError::NoNode)?;
                self.check_acl(node, PERM_READ)?;
                version_matches(*version, node.stat.version)?;
                Ok(OpResult::Check)
            }
        }
    }

    fn create(&mut self, c: &Create) -> Planned<OpResult> {
        // A sequential path is validated with its suffix, so "/q/" is fine.
        if c.mode.is_sequential() {
            valid(&format!("{}0", c.path))?;
        } else {
            valid(&c.path)?;
        }
        if c.path == "/" {
            return Err(ZkError::NodeExists);
        }
        if c.data.len() > DATA_BYTES_MAX {
            return Err(ZkError::BadArguments);
        }
        let kind = match (c.mode.is_ttl(), c.mode) {
            (true, _) if c.ttl_ms <= 0 || c.ttl_ms > TTL_MS_MAX => return Err(ZkError::BadArguments),
            (true, _) => Kind::Ttl { ttl_ms: c.ttl_ms },
            (false, _) if c.ttl_ms != 0 => return Err(ZkError::BadArguments),
            (false, crate::request::CreateMode::Container) => Kind::Container,
            (false, m) if m.is_ephemeral() => {
                if self.session == 0 {
                    return Err(ZkError::BadArguments);
                }
                Kind::Ephemeral { owner: self.session }
            }
            (false, _) => Kind::Persistent,
        };
        let parent_path = path::parent(&c.path).to_string();
        let parent = self.node(&parent_path).ok_or(ZkError::NoNode)?.clone();
        self.check_acl(&parent, PERM_CREATE)?;
        if parent.is_ephemeral() {
            return Err(ZkError::NoChildrenForEphemerals);
        }
        let path = if c.mode.is_sequential() {
            // ZooKeeper's %010d of a 32-bit counter; past i32::MAX it wraps
            // negative there. Refuse instead of reusing names.
            if parent.seq > i32::MAX as i64 {
                return Err(ZkError::BadArguments);
            }
            format!("{}{:010}", c.path, parent.seq)
        } else {
            c.path.clone()
        };
        if path.len() > path::PATH_BYTES_MAX {
            return Err(ZkError::BadArguments);
        }
        if self.node(&path).is_some() {
            return Err(ZkError::NodeExists);
        }
        let acl = acl::resolve(&c.acl, self.auth_ids())?;
        let stat = Stat {
            czxid: self.zxid,
            mzxid: self.zxid,
            ctime: self.time_ms,
            mtime: self.time_ms,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: kind.owner_field(),
            data_length: c.data.len() as i32,
            num_children: 0,
            pzxid: self.zxid,
        };
        let acl = acl::shared(acl, &parent.acl);
        let node = self.node_value(&path, Arc::from(&c.data[..]), stat, acl, 0);
        let zxid = self.zxid;
        self.update(&parent_path, parent, |st, seq| {
            st.cversion = st.cversion.wrapping_add(1);
            st.pzxid = zxid;
            st.num_children += 1;
            *seq += 1;
        });
        self.put_node(&path, None, Some(node));
        Ok(OpResult::Create { path, stat })
    }

    fn delete(&mut self, path: &str, version: i32, check_acl: bool) -> Planned<OpResult> {
        valid(path)?;
        let virtual_config = self.node(path).is_some_and(|n| std::ptr::eq(n, config_node()));
        if crate::state::SYSTEM_PATHS.contains(&path) || virtual_config {
            return Err(ZkError::BadArguments);
        }
        let parent_path = path::parent(path).to_string();
        let parent = self.node(&parent_path).ok_or(ZkError::NoNode)?.clone();
        if check_acl {
            self.check_acl(&parent, PERM_DELETE)?;
        }
        let node = self.node(path).ok_or(ZkError::NoNode)?.clone();
        version_matches(version, node.stat.version)?;
        if node.stat.num_children > 0 {
            return Err(ZkError::NotEmpty);
        }
        let zxid = self.zxid;
        self.update(&parent_path, parent, |st, _| {
            st.cversion = st.cversion.wrapping_add(1);
            st.pzxid = zxid;
            st.num_children -= 1;
        });
        self.put_node(path, Some(node), None);
        Ok(OpResult::Delete)
    }

    fn set_data(&mut self, path: &str, data: &[u8], version: i32) -> Planned<OpResult> {
        valid(path)?;
        if data.len() > DATA_BYTES_MAX {
            return Err(ZkError::BadArguments);
        }
        let node = self.node(path).ok_or(ZkError::NoNode)?.clone();
        self.check_acl(&node, PERM_WRITE)?;
        version_matches(version, node.stat.version)?;
        let stat = Stat {
            mzxid: self.zxid,
            mtime: self.time_ms,
            version: node.stat.version.wrapping_add(1),
            data_length: data.len() as i32,
            ..node.stat
        };
        let new = self.node_value(path, Arc::from(data), stat, node.acl.clone(), node.seq);
        self.put_node(path, Some(node), Some(new));
        Ok(OpResult::SetData { stat })
    }

    fn set_acl(&mut self, path: &str, acl_req: &[Acl], version: i32) -> Planned<Response> {
        valid(path)?;
        let node = self.node(path).ok_or(ZkError::NoNode)?.clone();
        self.check_acl(&node, PERM_ADMIN)?;
        version_matches(version, node.stat.aversion)?;
        let acl = acl::resolve(acl_req, self.auth_ids())?;
        let stat = Stat {
            aversion: node.stat.aversion.wrapping_add(1),
            ..node.stat
        };
        let new = node.restat(stat, acl.into(), node.seq, self.state.digest_on());
        self.put_node(path, Some(node), Some(new));
        Ok(Response::SetAcl { stat })
    }

    fn multi(&mut self, ops: &[Op]) -> Planned<Response> {
        if ops.len() > MULTI_OPS_MAX {
            return Err(ZkError::BadArguments);
        }
        let mut results = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match self.op(op) {
                Ok(r) => results.push(r),
                Err(e) => {
                    let mut failed: Vec<OpResult> = (0..i).map(|_| OpResult::Error(ZkError::Ok)).collect();
                    failed.push(OpResult::Error(e));
                    failed.extend((i + 1..ops.len()).map(|_| OpResult::Error(ZkError::RuntimeInconsistency)));
                    return Ok(Response::Multi {
                        error: e,
                        results: failed,
                    });
                }
            }
        }
        Ok(Response::Multi {
            error: ZkError::Ok,
            results,
        })
    }

    fn create_session(&mut self, timeout_ms: i32) -> Planned<Response> {
        if timeout_ms <= 0 {
            return Err(ZkError::BadArguments);
        }
        let id = self
            .local_next_sid
            .or_else(|| self.overlay.next_session_id())
            .unwrap_or(self.state.next_session_id);
        self.deltas.push(Delta::NextSessionId {
            before: id,
            after: id + 1,
        });
        self.local_next_sid = Some(id + 1);
        self.put_session(
            id,
            Some(Session {
                timeout_ms,
                auth: Vec::new(),
            }),
        );
        Ok(Response::CreateSession { session_id: id })
    }

    /// Closes the entry's session: its ephemerals go first (in path order,
    /// deepest first is not needed: ephemerals have no children).
    fn close_session(&mut self) -> Planned<Response> {
        let id = self.session;
        if id == 0 || self.session(id).is_none() {
            return Ok(Response::CloseSession);
        }
        let mut paths: Vec<String> = self
            .state
            .ephemerals
            .get(&id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        paths.extend(self.overlay.node_paths().into_iter().map(str::to_string));
        paths.extend(self.local.keys().cloned());
        paths.sort();
        paths.dedup();
        for p in paths {
            let owned = self.node(&p).is_some_and(|n| n.kind() == Kind::Ephemeral { owner: id });
            if owned {
                self.delete(&p, -1, false)?;
            }
        }
        self.put_session(id, None);
        Ok(Response::CloseSession)
    }

    fn add_auth(&mut self, scheme: &str, auth: &[u8]) -> Planned<Response> {
        if scheme != "digest" || self.session == 0 {
            return Err(ZkError::AuthFailed);
        }
        let credentials = std::str::from_utf8(auth).map_err(|_| ZkError::AuthFailed)?;
        let id = acl::digest_id(credentials)?;
        let mut session = self.session(self.session).cloned().ok_or(ZkError::SessionExpired)?;
        if !session.auth.contains(&id) {
            if session.auth.len() >= acl::ACL_ENTRIES_MAX {
                return Err(ZkError::AuthFailed);
            }
            session.auth.push(id);
            session.auth.sort();
        }
        self.put_session(self.session, Some(session));
        Ok(Response::AddAuth)
    }

    /// Deletes an empty container that once had children, or a childless
    /// TTL node unmodified for its TTL, as of the entry's time.
    fn reap(&mut self, path: &str) -> Planned<Response> {
        valid(path)?;
        let Some(node) = self.node(path) else {
            return Ok(Response::Reap { deleted: false });
        };
        let due = node.stat.num_children == 0
            && match node.kind() {
                Kind::Container => node.stat.cversion > 0,
                Kind::Ttl { ttl_ms } => self.time_ms.saturating_sub(node.stat.mtime) > ttl_ms,
                _ => false,
            };
        if !due {
            return Ok(Response::Reap { deleted: false });
        }
        self.delete(path, -1, false)?;
        Ok(Response::Reap { deleted: true })
    }
}

/// The configuration node as writes see it (see `Planner::node`).
fn config_node() -> &'static Node {
    static NODE: std::sync::OnceLock<Node> = std::sync::OnceLock::new();
    NODE.get_or_init(|| Node {
        data: Arc::from(&b""[..]),
        stat: Stat {
            version: -1,
            ..Stat::default()
        },
        acl: Arc::from(vec![Acl::world(PERM_READ)]),
        seq: 0,
        content: 0,
        digest: 0,
    })
}

fn valid(path: &str) -> Planned<()> {
    path::validate(path).map_err(|_| ZkError::BadArguments)
}

/// ZooKeeper's version check: -1 matches any version.
fn version_matches(expected: i32, actual: i32) -> Planned<()> {
    if expected == -1 || expected == actual {
        Ok(())
    } else {
        Err(ZkError::BadVersion)
    }
}
