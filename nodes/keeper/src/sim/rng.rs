//! The simulator's randomness: SplitMix64, seeded, with named forks so
//! that adding a draw in one part (the network, say) does not shift every
//! other part's draws.

/// A seeded generator; the same seed draws the same sequence everywhere.
#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng {
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// An independent generator for the part named `tag`.
    pub fn fork(&self, tag: &str) -> SimRng {
        let mut h = siphasher::sip::SipHasher13::new_with_keys(self.state, 0x7369_6d75_6c61_7465);
        std::hash::Hasher::write(&mut h, tag.as_bytes());
        SimRng::new(std::hash::Hasher::finish(&h))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One of `items`, uniformly.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws_and_forks_are_independent() {
        let (mut a, mut b) = (SimRng::new(7), SimRng::new(7));
        let xs: Vec<u64> = (0..50).map(|_| a.below(1000)).collect();
        let ys: Vec<u64> = (0..50).map(|_| b.below(1000)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| *x < 1000));
        let mut f = SimRng::new(7).fork("net");
        let mut g = SimRng::new(7).fork("disk");
        assert_ne!(f.next_u64(), g.next_u64());
        let hits = (0..10_000).filter(|_| a.chance(0.25)).count();
        assert!((2_000..3_000).contains(&hits), "{hits}");
    }
}
