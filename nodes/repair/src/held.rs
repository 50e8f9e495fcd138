//! The responder's side of the repair sessions a kv server holds for its
//! peers, bounded, sans-IO (time is an argument): at most `max` at once
//! and `per_peer_max` of one peer — a peer's oldest gives way to its
//! newest, so one peer cannot keep another's sessions out — and a session
//! idle for `idle_us` is dropped to make room.

use std::collections::BTreeMap;

/// The limits of the held sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max: usize,
    pub per_peer_max: usize,
    pub idle_us: u64,
}

/// Sessions by (peer, session id); `S` is the responder's state.
#[derive(Debug)]
pub struct Held<S> {
    limits: Limits,
    sessions: BTreeMap<(u64, u64), (S, u64)>,
}

impl<S> Held<S> {
    pub fn new(limits: Limits) -> Held<S> {
        Held {
            limits,
            sessions: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Session `id` of `peer` at `now_us`, opened with `open` if it is
    /// new: sessions idle too long are dropped first, and the peer's
    /// oldest when it holds its most; refused (why) when the server holds
    /// its most.
    pub fn get_or_open(&mut self, peer: u64, id: u64, now_us: u64, open: impl FnOnce() -> S) -> Result<&mut S, String> {
        let key = (peer, id);
        if !self.sessions.contains_key(&key) {
            let idle_us = self.limits.idle_us;
            self.sessions
                .retain(|_, (_, used)| now_us.saturating_sub(*used) < idle_us);
            let oldest = self
                .sessions
                .range((peer, 0)..=(peer, u64::MAX))
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            let theirs = self.sessions.range((peer, 0)..=(peer, u64::MAX)).count();
            if let Some(oldest) = oldest.filter(|_| theirs >= self.limits.per_peer_max) {
                self.sessions.remove(&oldest);
            }
            if self.sessions.len() >= self.limits.max {
                return Err(format!("{} repair sessions are open here", self.limits.max));
            }
            self.sessions.insert(key, (open(), now_us));
        }
        let (s, used) = self.sessions.get_mut(&key).expect("held or inserted above");
        *used = now_us;
        Ok(s)
    }

    /// Drops session `id` of `peer` (it finished).
    pub fn close(&mut self, peer: u64, id: u64) {
        self.sessions.remove(&(peer, id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max: 3,
        per_peer_max: 2,
        idle_us: 1_000,
    };

    #[test]
    fn a_session_is_held_and_used_until_closed() {
        let mut h = Held::new(LIMITS);
        *h.get_or_open(1, 7, 0, || 0u32).unwrap() += 1;
        *h.get_or_open(1, 7, 10, || 100).unwrap() += 1;
        assert_eq!(
            *h.get_or_open(1, 7, 20, || 100).unwrap(),
            2,
            "the held one, not a new one"
        );
        h.close(1, 7);
        assert!(h.is_empty());
    }

    #[test]
    fn a_peer_at_its_most_gives_up_its_oldest_not_another_peers() {
        let mut h = Held::new(LIMITS);
        h.get_or_open(1, 1, 0, || 'a').unwrap();
        h.get_or_open(2, 1, 1, || 'b').unwrap();
        h.get_or_open(1, 2, 2, || 'c').unwrap();
        // peer 1 holds two: its third replaces its oldest (session 1)
        h.get_or_open(1, 3, 3, || 'd').unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(*h.get_or_open(2, 1, 4, || 'x').unwrap(), 'b', "peer 2's session kept");
        assert_eq!(*h.get_or_open(1, 2, 5, || 'x').unwrap(), 'c');
    }

    #[test]
    fn the_server_at_its_most_refuses_until_one_goes_idle() {
        let mut h = Held::new(LIMITS);
        h.get_or_open(1, 1, 0, || ()).unwrap();
        h.get_or_open(2, 1, 0, || ()).unwrap();
        h.get_or_open(3, 1, 500, || ()).unwrap();
        let e = h.get_or_open(4, 1, 600, || ()).unwrap_err();
        assert_eq!(e, "3 repair sessions are open here");
        // at 1,000 µs the first two have been idle their limit: dropped
        h.get_or_open(4, 1, 1_000, || ()).unwrap();
        assert_eq!(h.len(), 2);
    }
}
