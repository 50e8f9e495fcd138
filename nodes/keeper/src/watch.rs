//! Watches: one-shot notifications of changes, ZooKeeper's semantics.
//!
//! Which events a committed delta fires is replicated logic
//! ([`events_of`]); who is watching is per server and not replicated
//! ([`WatchManager`]): a session's watches live on the server it is
//! connected to, registered by its reads.
//!
//! * data watch (getData, or exists on an existing node): NodeDataChanged,
//!   NodeDeleted;
//! * exists watch on a missing node: NodeCreated (kept with data watches);
//! * child watch (getChildren): NodeChildrenChanged, NodeDeleted.

use crate::path;
use crate::state::Delta;
use std::collections::{BTreeMap, BTreeSet};

/// Most watches one session may hold on one server.
pub const WATCHES_PER_SESSION_MAX: usize = 65_536;

/// ZooKeeper's event types, numbered as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    NodeCreated = 1,
    NodeDeleted = 2,
    NodeDataChanged = 3,
    NodeChildrenChanged = 4,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchEvent {
    pub kind: EventType,
    pub path: String,
}

/// Appends the events a committed delta fires.
pub fn events_of(d: &Delta, out: &mut Vec<WatchEvent>) {
    let Delta::Node { path, before, after } = d else {
        return;
    };
    let mut push = |kind, path: &str| {
        out.push(WatchEvent {
            kind,
            path: path.to_string(),
        })
    };
    match (before, after) {
        (None, Some(_)) => {
            push(EventType::NodeCreated, path);
            if path != "/" {
                push(EventType::NodeChildrenChanged, path::parent(path));
            }
        }
        (Some(_), None) => {
            push(EventType::NodeDeleted, path);
            if path != "/" {
                push(EventType::NodeChildrenChanged, path::parent(path));
            }
        }
        (Some(b), Some(a)) if a.stat.version != b.stat.version || a.data != b.data => {
            push(EventType::NodeDataChanged, path)
        }
        _ => {}
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchKind {
    /// getData / exists.
    Data,
    /// getChildren.
    Child,
}

/// The watches registered on one server.
#[derive(Debug, Default, Clone)]
pub struct WatchManager {
    data: BTreeMap<String, BTreeSet<i64>>,
    child: BTreeMap<String, BTreeSet<i64>>,
    per_session: BTreeMap<i64, usize>,
}

impl WatchManager {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a watch; false when the session is at its limit.
    pub fn register(&mut self, session: i64, path: &str, kind: WatchKind) -> bool {
        let count = self.per_session.entry(session).or_default();
        if *count >= WATCHES_PER_SESSION_MAX {
            return false;
        }
        let map = match kind {
            WatchKind::Data => &mut self.data,
            WatchKind::Child => &mut self.child,
        };
        if map.entry(path.to_string()).or_default().insert(session) {
            *count += 1;
        }
        true
    }

    /// Fires `events`: returns (session, event) for every watch they
    /// trigger, and removes those watches (one-shot).
    pub fn trigger(&mut self, events: &[WatchEvent]) -> Vec<(i64, WatchEvent)> {
        let mut out = Vec::new();
        for e in events {
            let maps: &[&str] = match e.kind {
                EventType::NodeCreated | EventType::NodeDataChanged => &["data"],
                EventType::NodeChildrenChanged => &["child"],
                EventType::NodeDeleted => &["data", "child"],
            };
            let mut sessions = BTreeSet::new();
            for m in maps {
                let map = if *m == "data" { &mut self.data } else { &mut self.child };
                if let Some(set) = map.remove(&e.path) {
                    for s in &set {
                        if let Some(c) = self.per_session.get_mut(s) {
                            *c = c.saturating_sub(1);
                        }
                    }
                    sessions.extend(set);
                }
            }
            out.extend(sessions.into_iter().map(|s| (s, e.clone())));
        }
        out
    }

    /// Drops every watch of a closed session.
    pub fn remove_session(&mut self, session: i64) {
        for map in [&mut self.data, &mut self.child] {
            map.retain(|_, set| {
                set.remove(&session);
                !set.is_empty()
            });
        }
        self.per_session.remove(&session);
    }

    pub fn count(&self) -> usize {
        self.data.values().chain(self.child.values()).map(BTreeSet::len).sum()
    }
}
