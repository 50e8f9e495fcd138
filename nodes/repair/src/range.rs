//! Token ranges and their equal-width subdivision.
//!
//! A tree covers [lo, hi) of the token space (bounds as u64, so hi may be
//! 2^32). At depth d the range splits into 2^d buckets with one boundary
//! rule shared by [`TokenRange::bucket_of`] and [`TokenRange::range_of`]:
//! bucket b = [lo + ⌈b·W/2^d⌉, lo + ⌈(b+1)·W/2^d⌉), W = hi − lo. Hence
//! every token is in exactly one bucket at every depth, and bucket b at
//! depth d is the union of buckets 2b and 2b+1 at depth d+1 — which is
//! what makes a node's hash independent of the tree's depth.

/// Deepest subdivision: 2^40 buckets of a 2^32-wide range are empty or one
/// token each, so nothing deeper is ever useful.
pub const DEPTH_MAX: u32 = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenRange {
    pub lo: u64,
    pub hi: u64,
}

impl TokenRange {
    /// The whole ring [0, 2^32).
    pub const FULL: TokenRange = TokenRange { lo: 0, hi: 1 << 32 };

    pub fn new(lo: u64, hi: u64) -> Option<TokenRange> {
        (lo < hi && hi <= 1 << 32).then_some(TokenRange { lo, hi })
    }

    pub fn width(&self) -> u64 {
        self.hi - self.lo
    }

    pub fn contains(&self, token: u32) -> bool {
        (self.lo..self.hi).contains(&(token as u64))
    }

    /// The bucket of `token` at `depth`. Requires `contains(token)`.
    #[inline]
    pub fn bucket_of(&self, token: u32, depth: u32) -> u64 {
        debug_assert!(self.contains(token) && depth <= DEPTH_MAX);
        let offset = token as u64 - self.lo;
        let w = self.width();
        if w.is_power_of_two() {
            // the common case (the whole ring, or aligned sub-ranges):
            // floor(offset · 2^depth / 2^k) by shifts, no 128-bit division
            let k = w.trailing_zeros();
            return if depth <= k {
                offset >> (k - depth)
            } else {
                offset << (depth - k)
            };
        }
        (((offset as u128) << depth) / w as u128) as u64
    }

    /// The token range of bucket `b` at `depth`.
    pub fn range_of(&self, depth: u32, b: u64) -> TokenRange {
        debug_assert!(depth <= DEPTH_MAX && b < 1u64 << depth);
        let w = self.width() as u128;
        let n = 1u128 << depth;
        let edge = |i: u128| self.lo + (i * w).div_ceil(n) as u64;
        TokenRange {
            lo: edge(b as u128),
            hi: edge(b as u128 + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_ranges_share_one_boundary_rule() {
        for r in [
            TokenRange::FULL,
            TokenRange { lo: 7, hi: 1000 },
            TokenRange { lo: 5, hi: 8 },
        ] {
            for depth in [0, 1, 3, 5, 12] {
                for b in 0..(1u64 << depth).min(64) {
                    let sub = r.range_of(depth, b);
                    if sub.lo < sub.hi {
                        assert_eq!(r.bucket_of(sub.lo as u32, depth), b);
                        assert_eq!(r.bucket_of((sub.hi - 1) as u32, depth), b);
                    }
                    if sub.lo > r.lo {
                        assert_ne!(r.bucket_of((sub.lo - 1) as u32, depth), b);
                    }
                    // children partition the parent
                    let (l, rr) = (r.range_of(depth + 1, 2 * b), r.range_of(depth + 1, 2 * b + 1));
                    assert_eq!((l.lo, l.hi, rr.hi), (sub.lo, rr.lo, sub.hi));
                }
            }
        }
        assert_eq!(TokenRange::FULL.bucket_of(u32::MAX, 16), (1 << 16) - 1);
        // the shift fast path agrees with the division rule
        for r in [
            TokenRange::FULL,
            TokenRange {
                lo: 1 << 20,
                hi: 1 << 21,
            },
            TokenRange { lo: 0, hi: 16 },
        ] {
            for depth in [0, 3, 4, 5, 20, 36] {
                for t in [r.lo, r.lo + 1, (r.lo + r.hi) / 2, r.hi - 1] {
                    let slow = ((((t - r.lo) as u128) << depth) / r.width() as u128) as u64;
                    assert_eq!(r.bucket_of(t as u32, depth), slow, "{r:?} depth {depth} token {t}");
                }
            }
        }
        assert_eq!(TokenRange::FULL.bucket_of(0, 16), 0);
    }
}
