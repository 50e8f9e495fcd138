//! Session expiry, as the leader tracks it. Not replicated: heartbeats
//! reach whichever server a client is connected to, and only the leader's
//! decision to expire a session goes through the log (as `CloseSession`),
//! so every replica deletes the same ephemerals at the same log index.
//!
//! Time comes in as `now_ms` from the driver's clock (Env), never read here.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default, Clone)]
pub struct SessionTracker {
    /// session → (deadline, timeout)
    sessions: BTreeMap<i64, (u64, u64)>,
    by_deadline: BTreeSet<(u64, i64)>,
}

impl SessionTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts tracking (or refreshes) a session seen alive at `now_ms`.
    pub fn touch(&mut self, session: i64, timeout_ms: u64, now_ms: u64) {
        if let Some((deadline, _)) = self.sessions.get(&session) {
            self.by_deadline.remove(&(*deadline, session));
        }
        let deadline = now_ms.saturating_add(timeout_ms);
        self.sessions.insert(session, (deadline, timeout_ms));
        self.by_deadline.insert((deadline, session));
    }

    /// Refreshes a known session with its own timeout; false if unknown.
    pub fn heartbeat(&mut self, session: i64, now_ms: u64) -> bool {
        match self.sessions.get(&session) {
            Some(&(_, timeout)) => {
                self.touch(session, timeout, now_ms);
                true
            }
            None => false,
        }
    }

    pub fn remove(&mut self, session: i64) {
        if let Some((deadline, _)) = self.sessions.remove(&session) {
            self.by_deadline.remove(&(deadline, session));
        }
    }

    /// Sessions whose deadline passed at `now_ms`, oldest first. They stay
    /// tracked until `remove` (after their CloseSession commits).
    pub fn expired(&self, now_ms: u64) -> Vec<i64> {
        self.by_deadline
            .iter()
            .take_while(|(d, _)| *d <= now_ms)
            .map(|(_, s)| *s)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_push_the_deadline_and_silence_expires() {
        let mut t = SessionTracker::new();
        t.touch(1, 100, 0);
        t.touch(2, 100, 0);
        assert!(t.expired(99).is_empty());
        assert!(t.heartbeat(1, 90));
        assert_eq!(t.expired(150), [2]);
        assert_eq!(t.expired(190), [2, 1]);
        t.remove(2);
        assert_eq!(t.expired(1000), [1]);
        assert!(!t.heartbeat(3, 0));
    }
}
