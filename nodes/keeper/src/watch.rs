//! Watches: notifications of changes, ZooKeeper's semantics — one-shot
//! watches set by reads, and the persistent ones of `addWatch` (3.6+).
//!
//! Which events a committed delta fires is replicated logic
//! ([`events_of`]); who is watching is per server and not replicated
//! ([`WatchManager`]): a session's watches live on the server it is
//! connected to, registered by its reads.
//!
//! * data watch (getData, or exists on an existing node): NodeDataChanged,
//!   NodeDeleted;
//! * exists watch on a missing node: NodeCreated (kept with data watches);
//! * child watch (getChildren): NodeChildrenChanged, NodeDeleted;
//! * persistent watch (addWatch PERSISTENT): every event on its path
//!   (created, deleted, data and children changed), and it stays;
//! * persistent recursive watch (addWatch PERSISTENT_RECURSIVE): created,
//!   deleted and data changed on its path and every path below it (not
//!   children changed: the created and deleted events say it), and it
//!   stays.
//!
//! A session hears an event once, however many of its watches it fires.

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
    /// addWatch PERSISTENT: stays after it fires.
    Persistent,
    /// addWatch PERSISTENT_RECURSIVE: its path and everything below it.
    PersistentRecursive,
}

/// Which of a session's watches on a path removeWatches and checkWatches
/// name (ZooKeeper's `WatcherType`, as 3.9 reads it): a one-shot children
/// or data watch, any watch at all, or a persistent one of either mode.
/// (3.8 knows the first three only, and its children or data type takes a
/// persistent watch on the path as well.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchType {
    Child,
    Data,
    Any,
    Persistent,
    PersistentRecursive,
}

impl WatchType {
    fn kinds(self) -> &'static [WatchKind] {
        match self {
            WatchType::Child => &[WatchKind::Child],
            WatchType::Data => &[WatchKind::Data],
            WatchType::Any => &[
                WatchKind::Data,
                WatchKind::Child,
                WatchKind::Persistent,
                WatchKind::PersistentRecursive,
            ],
            WatchType::Persistent => &[WatchKind::Persistent],
            WatchType::PersistentRecursive => &[WatchKind::PersistentRecursive],
        }
    }
}

/// The watches registered on one server.
#[derive(Debug, Default, Clone)]
pub struct WatchManager {
    data: BTreeMap<String, BTreeSet<i64>>,
    child: BTreeMap<String, BTreeSet<i64>>,
    persistent: BTreeMap<String, BTreeSet<i64>>,
    recursive: BTreeMap<String, BTreeSet<i64>>,
    per_session: BTreeMap<i64, usize>,
}

impl WatchManager {
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&mut self, kind: WatchKind) -> &mut BTreeMap<String, BTreeSet<i64>> {
        match kind {
            WatchKind::Data => &mut self.data,
            WatchKind::Child => &mut self.child,
            WatchKind::Persistent => &mut self.persistent,
            WatchKind::PersistentRecursive => &mut self.recursive,
        }
    }

    /// Registers a watch; false when the session is at its limit.
    pub fn register(&mut self, session: i64, path: &str, kind: WatchKind) -> bool {
        if self
            .per_session
            .get(&session)
            .is_some_and(|c| *c >= WATCHES_PER_SESSION_MAX)
        {
            return false;
        }
        if self.map(kind).entry(path.to_string()).or_default().insert(session) {
            *self.per_session.entry(session).or_default() += 1;
        }
        true
    }

    /// Whether `session` has a watch of `which` on `path`; unless
    /// `check_only`, those watches are removed (removeWatches).
    pub fn remove(&mut self, session: i64, path: &str, which: WatchType, check_only: bool) -> bool {
        let mut found = 0;
        for &kind in which.kinds() {
            let map = self.map(kind);
            let Some(set) = map.get_mut(path) else { continue };
            if check_only {
                found += usize::from(set.contains(&session));
                continue;
            }
            if set.remove(&session) {
                found += 1;
                if set.is_empty() {
                    map.remove(path);
                }
            }
        }
        if !check_only && found > 0 {
            if let Some(c) = self.per_session.get_mut(&session) {
                *c = c.saturating_sub(found);
            }
        }
        found > 0
    }

    /// Fires `events`: returns (session, event) once for every session a
    /// watch of which they trigger, and removes the one-shot watches they
    /// fired (the persistent ones stay).
    pub fn trigger(&mut self, events: &[WatchEvent]) -> Vec<(i64, WatchEvent)> {
        let mut out = Vec::new();
        for e in events {
            let mut sessions = BTreeSet::new();
            if let Some(set) = self.persistent.get(&e.path) {
                sessions.extend(set.iter().copied());
            }
            if e.kind != EventType::NodeChildrenChanged {
                // the path itself and each of its ancestors
                let mut p = e.path.as_str();
                loop {
                    if let Some(set) = self.recursive.get(p) {
                        sessions.extend(set.iter().copied());
                    }
                    if p == "/" {
                        break;
                    }
                    p = path::parent(p);
                }
            }
            let maps: &[&str] = match e.kind {
                EventType::NodeCreated | EventType::NodeDataChanged => &["data"],
                EventType::NodeChildrenChanged => &["child"],
                EventType::NodeDeleted => &["data", "child"],
            };
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
        for map in [
            &mut self.data,
            &mut self.child,
            &mut self.persistent,
            &mut self.recursive,
        ] {
            map.retain(|_, set| {
                set.remove(&session);
                !set.is_empty()
            });
        }
        self.per_session.remove(&session);
    }

    pub fn count(&self) -> usize {
        [&self.data, &self.child, &self.persistent, &self.recursive]
            .iter()
            .flat_map(|m| m.values())
            .map(BTreeSet::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventType, path: &str) -> WatchEvent {
        WatchEvent {
            kind,
            path: path.into(),
        }
    }

    #[test]
    fn one_shot_watches_fire_once() {
        let mut w = WatchManager::new();
        w.register(1, "/a", WatchKind::Data);
        assert_eq!(w.trigger(&[ev(EventType::NodeDataChanged, "/a")]).len(), 1);
        assert!(w.trigger(&[ev(EventType::NodeDataChanged, "/a")]).is_empty());
    }

    #[test]
    fn a_persistent_watch_fires_for_every_event_on_its_path_and_stays() {
        let mut w = WatchManager::new();
        w.register(1, "/a", WatchKind::Persistent);
        for kind in [
            EventType::NodeCreated,
            EventType::NodeDataChanged,
            EventType::NodeChildrenChanged,
            EventType::NodeDeleted,
        ] {
            assert_eq!(w.trigger(&[ev(kind, "/a")]), vec![(1, ev(kind, "/a"))]);
        }
        assert!(
            w.trigger(&[ev(EventType::NodeCreated, "/a/b")]).is_empty(),
            "not below it"
        );
        assert_eq!(w.count(), 1);
    }

    #[test]
    fn a_recursive_watch_fires_for_its_subtree_but_not_for_children_changed() {
        let mut w = WatchManager::new();
        w.register(1, "/r", WatchKind::PersistentRecursive);
        w.register(1, "/r/x", WatchKind::Data);
        let fired = w.trigger(&[
            ev(EventType::NodeCreated, "/r/x/y"),
            ev(EventType::NodeChildrenChanged, "/r/x"),
            ev(EventType::NodeDataChanged, "/r/x"),
            ev(EventType::NodeDeleted, "/rx"),
        ]);
        assert_eq!(
            fired,
            vec![
                (1, ev(EventType::NodeCreated, "/r/x/y")),
                (1, ev(EventType::NodeDataChanged, "/r/x"))
            ],
            "once per session, though both watches match /r/x; /rx is not below /r"
        );
        w.remove_session(1);
        assert_eq!(w.count(), 0);
    }

    #[test]
    fn remove_takes_only_the_named_kind_and_check_takes_nothing() {
        let mut w = WatchManager::new();
        for kind in [
            WatchKind::Data,
            WatchKind::Child,
            WatchKind::Persistent,
            WatchKind::PersistentRecursive,
        ] {
            w.register(1, "/a", kind);
        }
        w.register(2, "/a", WatchKind::Data);
        assert!(w.remove(1, "/a", WatchType::Data, true), "checked");
        assert!(w.remove(1, "/a", WatchType::Data, false), "removed");
        assert!(!w.remove(1, "/a", WatchType::Data, true), "gone");
        assert!(!w.remove(1, "/a", WatchType::Data, false), "nothing to remove");
        assert!(!w.remove(1, "/b", WatchType::Any, false), "another path");
        assert_eq!(w.count(), 4, "the other kinds and the other session's stay");
        assert!(w.remove(1, "/a", WatchType::Persistent, false));
        assert_eq!(
            w.trigger(&[ev(EventType::NodeDataChanged, "/a")]),
            vec![
                (1, ev(EventType::NodeDataChanged, "/a")),
                (2, ev(EventType::NodeDataChanged, "/a"))
            ],
            "session 1's recursive watch still fires, session 2's data watch fires"
        );
        assert!(w.remove(1, "/a", WatchType::Any, false), "the child and recursive ones");
        assert_eq!(w.count(), 0);
        assert_eq!(w.per_session.get(&1), Some(&0), "the session's count follows");
    }
}
