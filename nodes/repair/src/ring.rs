//! The token ring: which servers hold which keys.
//!
//! The token space [0, 2^32) is cut into one range per server, of equal
//! width (range j = [⌈j·2^32/n⌉, ⌈(j+1)·2^32/n⌉)). Range j is replicated
//! on RF consecutive servers of the sorted id list, starting at the j-th:
//! its *primary* (which starts the range's repairs) and RF − 1 more. So
//! every server holds RF ranges and every range has RF distinct replicas.
//!
//! Invariant: every token is in exactly one range, and `replicas(j)` has
//! RF distinct ids (checked where the ring is built).

use crate::range::TokenRange;
use crate::token::token;

/// Most servers a ring holds: ids travel in 8 bytes and every server keeps
/// a replica per range it holds, so the limit is about memory per server,
/// and a test cluster never comes near it.
pub const SERVERS_MAX: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("a ring needs at least one server")]
    Empty,
    #[error("a ring holds at most {SERVERS_MAX} servers, not {0}")]
    TooMany(usize),
    #[error("server id {0} appears twice")]
    Duplicate(u64),
    #[error("replication factor {rf} must be between 1 and the number of servers ({servers})")]
    Replication { rf: usize, servers: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Server ids, ascending.
    servers: Vec<u64>,
    rf: usize,
}

impl Ring {
    pub fn new(mut servers: Vec<u64>, rf: usize) -> Result<Ring, RingError> {
        if servers.is_empty() {
            return Err(RingError::Empty);
        }
        if servers.len() > SERVERS_MAX {
            return Err(RingError::TooMany(servers.len()));
        }
        servers.sort_unstable();
        if let Some(w) = servers.windows(2).find(|w| w[0] == w[1]) {
            return Err(RingError::Duplicate(w[0]));
        }
        if rf == 0 || rf > servers.len() {
            return Err(RingError::Replication {
                rf,
                servers: servers.len(),
            });
        }
        Ok(Ring { servers, rf })
    }

    pub fn rf(&self) -> usize {
        self.rf
    }

    pub fn servers(&self) -> &[u64] {
        &self.servers
    }

    /// Number of ranges (one per server).
    pub fn ranges(&self) -> usize {
        self.servers.len()
    }

    /// The token range of range `j`.
    pub fn range(&self, j: usize) -> TokenRange {
        let n = self.servers.len() as u128;
        assert!((j as u128) < n, "range {j} of a ring of {n}");
        let edge = |i: u128| ((i << 32).div_ceil(n)) as u64;
        let r = TokenRange {
            lo: edge(j as u128),
            hi: edge(j as u128 + 1),
        };
        debug_assert!(r.lo < r.hi && r.hi <= 1 << 32);
        r
    }

    /// The range holding `token`.
    pub fn range_of_token(&self, token: u32) -> usize {
        let n = self.servers.len() as u64;
        // the largest j with ⌈j·2^32/n⌉ ≤ token: start from ⌊token·n/2^32⌋
        // and step up over a boundary rounding may leave below
        let mut j = ((token as u64 * n) >> 32) as usize;
        while j + 1 < self.servers.len() && self.range(j + 1).lo <= token as u64 {
            j += 1;
        }
        debug_assert!(self.range(j).contains(token));
        j
    }

    /// The range holding `key`.
    pub fn range_of_key(&self, key: &[u8]) -> usize {
        self.range_of_token(token(key))
    }

    /// The replicas of range `j`, its primary first.
    pub fn replicas(&self, j: usize) -> Vec<u64> {
        let n = self.servers.len();
        (0..self.rf).map(|k| self.servers[(j + k) % n]).collect()
    }

    /// The ranges `server` holds, ascending.
    pub fn ranges_of(&self, server: u64) -> Vec<usize> {
        (0..self.ranges())
            .filter(|&j| self.replicas(j).contains(&server))
            .collect()
    }

    /// The ranges whose primary is `server`.
    pub fn primary_of(&self, server: u64) -> Vec<usize> {
        (0..self.ranges()).filter(|&j| self.servers[j] == server).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_ring_once_and_every_range_has_rf_distinct_replicas() {
        for n in 1..=7usize {
            for rf in 1..=n {
                let ring = Ring::new((1..=n as u64).rev().collect(), rf).unwrap();
                assert_eq!(ring.range(0).lo, 0);
                assert_eq!(ring.range(n - 1).hi, 1 << 32);
                for j in 1..n {
                    assert_eq!(ring.range(j - 1).hi, ring.range(j).lo);
                }
                for j in 0..n {
                    let mut r = ring.replicas(j);
                    assert_eq!(r[0], j as u64 + 1, "the primary is the j-th server");
                    r.sort_unstable();
                    r.dedup();
                    assert_eq!(r.len(), rf);
                }
                for s in 1..=n as u64 {
                    assert_eq!(ring.ranges_of(s).len(), rf);
                    assert_eq!(ring.primary_of(s), vec![s as usize - 1]);
                }
            }
        }
    }

    #[test]
    fn every_token_finds_the_range_that_contains_it() {
        let ring = Ring::new(vec![1, 2, 3], 2).unwrap();
        for t in [
            0u32,
            1,
            1_431_655_765,
            1_431_655_766,
            2_863_311_530,
            2_863_311_531,
            u32::MAX,
        ] {
            let j = ring.range_of_token(t);
            assert!(ring.range(j).contains(t), "{t} in {j}");
        }
        for j in 0..3 {
            let r = ring.range(j);
            assert_eq!(ring.range_of_token(r.lo as u32), j);
            assert_eq!(ring.range_of_token((r.hi - 1) as u32), j);
        }
    }

    #[test]
    fn bad_rings_are_errors() {
        assert_eq!(Ring::new(vec![], 1), Err(RingError::Empty));
        assert_eq!(Ring::new(vec![1, 1], 1), Err(RingError::Duplicate(1)));
        assert!(matches!(Ring::new(vec![1, 2], 3), Err(RingError::Replication { .. })));
        assert!(matches!(Ring::new(vec![1, 2], 0), Err(RingError::Replication { .. })));
    }
}
