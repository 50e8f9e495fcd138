//! The Merkle tree over a token range: 2^depth equal-width leaves; a leaf
//! is the XOR of its entries' digests, an inner node the XOR of its two
//! children (= the XOR of every digest in its range), each with an entry
//! count so emptiness never relies on a hash being zero.
//!
//! Layout: one array in heap order, node (level l, index i) at
//! 2^l − 1 + i. Hashes are held as four u64 words so combining is four
//! XORs. Incremental upkeep is O(depth): XOR the old digest out and the
//! new one in along the leaf-to-root path.

use crate::entry::Digest;
use crate::range::TokenRange;

/// Deepest tree built: 2^25 − 1 nodes of 40 bytes is 1.3 GiB.
pub const TREE_DEPTH_MAX: u32 = 24;

/// A node hash as four little-endian words of the SHA-256 XOR.
pub type Hash = [u64; 4];

pub const ZERO: Hash = [0; 4];

#[inline]
pub fn hash_of(d: &Digest) -> Hash {
    let w = |i: usize| u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    [w(0), w(1), w(2), w(3)]
}

#[inline]
pub fn xor(a: Hash, b: Hash) -> Hash {
    [a[0] ^ b[0], a[1] ^ b[1], a[2] ^ b[2], a[3] ^ b[3]]
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerkleTree {
    range: TokenRange,
    depth: u32,
    hashes: Vec<Hash>,
    counts: Vec<u64>,
}

#[inline]
fn at(level: u32, i: u64) -> usize {
    ((1u64 << level) - 1 + i) as usize
}

impl MerkleTree {
    /// An empty tree. Panics past [`TREE_DEPTH_MAX`] (a configuration error).
    pub fn new(range: TokenRange, depth: u32) -> MerkleTree {
        assert!(depth <= TREE_DEPTH_MAX, "tree depth {depth} exceeds TREE_DEPTH_MAX");
        let n = (1usize << (depth + 1)) - 1;
        MerkleTree {
            range,
            depth,
            hashes: vec![ZERO; n],
            counts: vec![0; n],
        }
    }

    /// Builds from (token, digest) pairs: leaves first, then one pass up.
    pub fn build<'a>(
        range: TokenRange,
        depth: u32,
        entries: impl IntoIterator<Item = (u32, &'a Digest)>,
    ) -> MerkleTree {
        let mut t = MerkleTree::new(range, depth);
        for (token, d) in entries {
            let leaf = at(depth, range.bucket_of(token, depth));
            t.hashes[leaf] = xor(t.hashes[leaf], hash_of(d));
            t.counts[leaf] += 1;
        }
        for level in (0..depth).rev() {
            for i in 0..(1u64 << level) {
                let (l, r) = (at(level + 1, 2 * i), at(level + 1, 2 * i + 1));
                t.hashes[at(level, i)] = xor(t.hashes[l], t.hashes[r]);
                t.counts[at(level, i)] = t.counts[l] + t.counts[r];
            }
        }
        t
    }

    pub fn range(&self) -> TokenRange {
        self.range
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Replaces the digest of one entry at `token`: `old` leaves (None: the
    /// key was absent), `new` arrives (None: the key is gone). Identical
    /// old and new change nothing.
    #[inline]
    pub fn update(&mut self, token: u32, old: Option<&Digest>, new: Option<&Digest>) {
        let delta = xor(old.map_or(ZERO, hash_of), new.map_or(ZERO, hash_of));
        let dc: i64 = new.is_some() as i64 - old.is_some() as i64;
        if delta == ZERO && dc == 0 {
            return;
        }
        let mut i = self.range.bucket_of(token, self.depth);
        for level in (0..=self.depth).rev() {
            let k = at(level, i);
            self.hashes[k] = xor(self.hashes[k], delta);
            self.counts[k] = (self.counts[k] as i64 + dc) as u64;
            i >>= 1;
        }
    }

    /// Hash and entry count of node `i` at `level`.
    #[inline]
    pub fn node(&self, level: u32, i: u64) -> (Hash, u64) {
        debug_assert!(level <= self.depth && i < 1u64 << level);
        let k = at(level, i);
        (self.hashes[k], self.counts[k])
    }

    pub fn root(&self) -> (Hash, u64) {
        self.node(0, 0)
    }

    /// Bytes the node arrays take.
    pub fn memory_bytes(&self) -> usize {
        self.hashes.len() * std::mem::size_of::<Hash>() + self.counts.len() * 8
    }
}
