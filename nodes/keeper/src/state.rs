//! The committed, replicated state: the znode tree, sessions, and the
//! tree digest — everything a snapshot holds.
//!
//! It changes only through [`State::apply`] of a [`Delta`], in log order.
//! Invariants (checked by `check_invariants`, which tests call after
//! every apply): every node's parent exists; a node's `num_children`
//! equals its children in the map; `ephemerals` indexes exactly the
//! ephemeral nodes by owner; `digest_sum` is the wrapping sum of node
//! digests when digests are on.

use crate::acl::{Acl, Id};
use crate::digest::{self, Digest};
use crate::node::{Node, Stat};
use crate::path;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

/// A client session as replicated: its timeout and the ids it has
/// authenticated as (sorted, no duplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub timeout_ms: i32,
    pub auth: Vec<Id>,
}

/// A state's snapshot contents at one moment ([`State::freeze`]), in
/// the order a snapshot lists them.
#[derive(Debug)]
pub struct Frozen {
    nodes: Vec<(Arc<str>, Arc<Node>)>,
    sessions: Vec<(i64, Session)>,
    next_session_id: i64,
}

impl Frozen {
    /// Every node in path order.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.nodes.iter().map(|(p, n)| (&**p, &**n))
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every session in id order.
    pub fn sessions(&self) -> &[(i64, Session)] {
        &self.sessions
    }

    pub fn next_session_id(&self) -> i64 {
        self.next_session_id
    }
}

/// One change to the state, with the value it replaces so it can be
/// undone and its digest change computed without a lookup.
// Node deltas are nearly all deltas: boxing them would add two
// allocations to every write for the sake of the rare session delta.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Node {
        path: String,
        before: Option<Node>,
        after: Option<Node>,
    },
    Session {
        id: i64,
        before: Option<Session>,
        after: Option<Session>,
    },
    NextSessionId {
        before: i64,
        after: i64,
    },
}

impl Delta {
    /// What this delta adds to the tree's digest sum.
    pub fn digest_change(&self) -> u64 {
        match self {
            Delta::Node { before, after, .. } => {
                let add = after.as_ref().map_or(0, |n| n.digest);
                let sub = before.as_ref().map_or(0, |n| n.digest);
                add.wrapping_sub(sub)
            }
            _ => 0,
        }
    }
}

/// System nodes every tree starts with, as in ZooKeeper.
pub const SYSTEM_PATHS: [&str; 3] = ["/", "/zookeeper", "/zookeeper/quota"];

/// ZooKeeper's dynamic configuration node. Its data is what the cluster
/// file says, the same on every server, so it lives outside the tree (the
/// server answers its reads, and it changes no digest); writes meet it as
/// ZooKeeper's do: its ACL is read-only for everyone and it can never be
/// deleted.
pub const CONFIG_PATH: &str = "/zookeeper/config";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Keys and nodes are shared, so a background snapshot's copy of the
    /// tree ([`State::freeze`]) costs a pair of pointers a node and
    /// reference counts, not a copy of each node; a node changed while a
    /// copy holds it is replaced, never changed in place.
    pub(crate) nodes: BTreeMap<Arc<str>, Arc<Node>>,
    pub(crate) sessions: BTreeMap<i64, Session>,
    pub(crate) next_session_id: i64,
    /// Ephemeral paths by owning session.
    pub(crate) ephemerals: BTreeMap<i64, BTreeSet<String>>,
    pub(crate) digest_sum: u64,
    pub(crate) digest_on: bool,
    /// zxid of the last committed entry.
    pub(crate) last_zxid: i64,
}

impl State {
    /// The initial tree: the system nodes with open ACLs at zxid 0.
    pub fn new(digest_on: bool) -> State {
        let mut s = State {
            nodes: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session_id: 1,
            ephemerals: BTreeMap::new(),
            digest_sum: 0,
            digest_on,
            last_zxid: 0,
        };
        let acl: Arc<[Acl]> = Acl::open().into();
        for p in SYSTEM_PATHS {
            let children = SYSTEM_PATHS
                .iter()
                .filter(|c| **c != "/" && **c != p && path::parent(c) == p)
                .count() as i32;
            let stat = Stat {
                num_children: children,
                ..Stat::default()
            };
            let node = make_node(p, Arc::from(&b""[..]), stat, acl.clone(), 0, digest_on);
            s.digest_sum = s.digest_sum.wrapping_add(node.digest);
            s.nodes.insert(Arc::from(p), Arc::new(node));
        }
        s
    }

    /// Assembles a state from loaded parts, deriving the ephemeral index
    /// and the digest sum from the nodes (whose digests must be set).
    pub fn from_parts(
        nodes: BTreeMap<Arc<str>, Arc<Node>>,
        sessions: BTreeMap<i64, Session>,
        next_session_id: i64,
        last_zxid: i64,
        digest_on: bool,
    ) -> State {
        let mut ephemerals: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
        let mut digest_sum = 0u64;
        for (p, n) in &nodes {
            if let Some(owner) = ephemeral_owner(n) {
                ephemerals.entry(owner).or_default().insert(p.to_string());
            }
            digest_sum = digest_sum.wrapping_add(n.digest);
        }
        State {
            nodes,
            sessions,
            next_session_id,
            ephemerals,
            digest_sum,
            digest_on,
            last_zxid,
        }
    }

    /// The tree, sessions and session counter as they are now, for a
    /// snapshot written while the state goes on changing. The nodes are
    /// copied into a flat list, not a map: 24 bytes a node against the
    /// 39 a clone of the map takes (measured on a million ClickHouse
    /// block-id paths), which is most of what a snapshot adds to a large
    /// tree's memory.
    pub fn freeze(&self) -> Frozen {
        Frozen {
            nodes: self.nodes.iter().map(|(p, n)| (p.clone(), n.clone())).collect(),
            sessions: self.sessions.iter().map(|(id, s)| (*id, s.clone())).collect(),
            next_session_id: self.next_session_id,
        }
    }

    /// Every node in path order.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.nodes.iter().map(|(p, n)| (&**p, &**n))
    }

    pub fn next_session_id(&self) -> i64 {
        self.next_session_id
    }

    /// How many nodes are below `path`, at any depth: the keys that start
    /// with `path/` are one range of the map.
    pub fn descendants(&self, path: &str) -> usize {
        let prefix = if path == "/" {
            "/".to_string()
        } else {
            format!("{path}/")
        };
        self.nodes
            .range::<str, _>((Bound::Excluded(prefix.as_str()), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix.as_str()))
            .count()
    }

    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path).map(|n| &**n)
    }

    pub fn session(&self, id: i64) -> Option<&Session> {
        self.sessions.get(&id)
    }

    pub fn sessions(&self) -> &BTreeMap<i64, Session> {
        &self.sessions
    }

    /// The ephemeral znodes `session` owns, in path order.
    pub fn ephemerals_of(&self, session: i64) -> impl Iterator<Item = &str> {
        self.ephemerals.get(&session).into_iter().flatten().map(String::as_str)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn last_zxid(&self) -> i64 {
        self.last_zxid
    }

    pub fn digest_on(&self) -> bool {
        self.digest_on
    }

    /// The committed tree's digest.
    pub fn digest(&self) -> Digest {
        Digest::of_sum(self.digest_on, self.digest_sum)
    }

    /// The digest recomputed from every node's fields.
    pub fn recompute_digest(&self) -> u64 {
        self.nodes
            .iter()
            .fold(0u64, |sum, (p, n)| sum.wrapping_add(digest::recompute(p, n)))
    }

    /// Names of `path`'s children, sorted. Walks the path-ordered map in
    /// one pass while its keys are children without children of their
    /// own (a part, a block id, a log entry), and searches past a child's
    /// subtree when it meets one; the key to resume from is kept in one
    /// buffer.
    pub fn children(&self, path: &str) -> Vec<String> {
        let prefix = path::child_prefix(path);
        let mut out = Vec::new();
        let mut from = prefix.clone();
        'subtrees: loop {
            for (key, _) in self
                .nodes
                .range::<str, _>((Bound::Included(from.as_str()), Bound::Unbounded))
            {
                if !key.starts_with(&prefix) {
                    break 'subtrees;
                }
                let rest = &key[prefix.len()..];
                match rest.find('/') {
                    // a child, or "/" itself (empty rest, only when listing "/")
                    None => {
                        if !rest.is_empty() {
                            out.push(rest.to_string());
                        }
                    }
                    // a descendant of a child already listed (a child sorts
                    // before its descendants): skip past that child's subtree
                    // ('0' follows '/')
                    Some(i) => {
                        from.clear();
                        from.push_str(&key[..prefix.len() + i]);
                        from.push('0');
                        continue 'subtrees;
                    }
                }
            }
            break;
        }
        out
    }

    /// Applies one delta, moving its new values into the tree. The caller
    /// guarantees it was planned against exactly this state (its `before`
    /// values are current).
    pub fn apply(&mut self, delta: Delta) {
        let change = delta.digest_change();
        match delta {
            Delta::Node { path, before, after } => {
                debug_assert_eq!(self.get(path.as_str()), before.as_ref(), "stale delta for {path}");
                if let Some(owner) = before.as_ref().and_then(ephemeral_owner) {
                    if let Some(set) = self.ephemerals.get_mut(&owner) {
                        set.remove(&path);
                        if set.is_empty() {
                            self.ephemerals.remove(&owner);
                        }
                    }
                }
                match after {
                    Some(n) => {
                        if let Some(owner) = ephemeral_owner(&n) {
                            self.ephemerals.entry(owner).or_default().insert(path.clone());
                        }
                        // one search of the map: a node that was there is
                        // replaced in place, a new one inserted
                        let slot = if before.is_some() {
                            self.nodes.get_mut(path.as_str())
                        } else {
                            None
                        };
                        match slot {
                            Some(slot) => *slot = Arc::new(n),
                            None => {
                                self.nodes.insert(Arc::from(path), Arc::new(n));
                            }
                        }
                    }
                    None => {
                        self.nodes.remove(path.as_str());
                    }
                }
                self.digest_sum = self.digest_sum.wrapping_add(change);
            }
            Delta::Session { id, after, .. } => match after {
                Some(s) => {
                    self.sessions.insert(id, s);
                }
                None => {
                    self.sessions.remove(&id);
                }
            },
            Delta::NextSessionId { after, .. } => self.next_session_id = after,
        }
    }

    /// Checks the invariants in the module header; panics naming the first
    /// broken one. O(tree): for tests and the full-digest mode.
    pub fn check_invariants(&self) {
        let mut children: BTreeMap<&str, i32> = BTreeMap::new();
        let mut ephemerals: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
        for (p, n) in self.nodes() {
            assert_eq!(n.stat.data_length as usize, n.data.len(), "{p}: data_length");
            if p != "/" {
                let parent = path::parent(p);
                assert!(self.nodes.contains_key(parent), "{p}: parent missing");
                *children.entry(parent).or_default() += 1;
            }
            if let Some(owner) = ephemeral_owner(n) {
                ephemerals.entry(owner).or_default().insert(p.to_string());
            }
        }
        for (p, n) in self.nodes() {
            let have = children.get(p).copied().unwrap_or(0);
            assert_eq!(n.stat.num_children, have, "{p}: num_children");
        }
        assert_eq!(ephemerals, self.ephemerals, "ephemeral index");
        if self.digest_on {
            assert_eq!(self.recompute_digest(), self.digest_sum, "digest sum");
        }
    }
}

fn ephemeral_owner(n: &Node) -> Option<i64> {
    match n.kind() {
        crate::node::Kind::Ephemeral { owner } => Some(owner),
        _ => None,
    }
}

/// Builds a node value with its hashes (0 when digests are off).
pub fn make_node(path: &str, data: Arc<[u8]>, stat: Stat, acl: Arc<[Acl]>, seq: i64, digest_on: bool) -> Node {
    debug_assert_eq!(stat.data_length as usize, data.len());
    let (content, digest) = if digest_on {
        let content = digest::content_hash(path, &data);
        (content, digest::digest_from_content(content, &stat, seq))
    } else {
        (0, 0)
    };
    Node {
        data,
        stat,
        acl,
        seq,
        content,
        digest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(s: &mut State, p: &str) {
        let parent = path::parent(p).to_string();
        let mut pn = s.get(&parent).unwrap().clone();
        let before = pn.clone();
        pn.stat.num_children += 1;
        let pn = make_node(&parent, pn.data.clone(), pn.stat, pn.acl.clone(), pn.seq, true);
        s.apply(Delta::Node {
            path: parent,
            before: Some(before),
            after: Some(pn),
        });
        let n = make_node(p, Arc::from(&b""[..]), Stat::default(), Acl::open().into(), 0, true);
        s.apply(Delta::Node {
            path: p.to_string(),
            before: None,
            after: Some(n),
        });
    }

    #[test]
    fn children_lists_direct_children_only_in_order() {
        let mut s = State::new(true);
        for p in ["/a", "/a/b", "/a/b/c", "/a-b", "/a/b-c", "/a/b/c/d", "/a/z", "/b"] {
            add(&mut s, p);
        }
        s.check_invariants();
        assert_eq!(s.children("/"), ["a", "a-b", "b", "zookeeper"]);
        assert_eq!(s.children("/a"), ["b", "b-c", "z"]);
        assert_eq!(s.children("/a/b"), ["c"]);
        assert!(s.children("/a/b/c/d").is_empty());
        assert!(s.children("/missing").is_empty());
    }

    proptest::proptest! {
        /// `children` against its definition: the last segment of every
        /// key whose parent is the path, sorted. Names are drawn from
        /// characters that sort around '/' ('-', '.', '0'), so subtrees
        /// and siblings interleave in the map.
        #[test]
        fn children_are_the_keys_whose_parent_is_the_path(
            paths in proptest::collection::vec("(/[-.0a/]{1,3}){1,4}", 1..40),
        ) {
            let mut s = State::new(false);
            for p in paths {
                if path::validate(&p).is_err() {
                    continue;
                }
                // its missing ancestors first, as a tree must have them
                let mut at = 1;
                while let Some(i) = p[at..].find('/') {
                    if s.get(&p[..at + i]).is_none() {
                        add(&mut s, &p[..at + i]);
                    }
                    at += i + 1;
                }
                if s.get(&p).is_none() {
                    add(&mut s, &p);
                }
            }
            let keys: Vec<String> = s.nodes().map(|(k, _)| k.to_string()).collect();
            for parent in &keys {
                let want: Vec<String> = keys
                    .iter()
                    .filter(|k| *k != "/" && path::parent(k) == parent.as_str())
                    .map(|k| k.rsplit('/').next().unwrap_or_default().to_string())
                    .collect();
                proptest::prop_assert_eq!(s.children(parent), want, "children of {}", parent);
            }
        }
    }

    #[test]
    fn initial_tree_has_the_system_nodes_and_a_consistent_digest() {
        let s = State::new(true);
        s.check_invariants();
        assert_eq!(s.children("/zookeeper"), ["quota"]);
        assert_eq!(s.digest().value, digest::tree_value(s.recompute_digest()));
        assert_eq!(State::new(false).digest(), Digest::NONE);
    }
}
