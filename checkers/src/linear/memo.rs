//! The search's memory of configurations already explored, with
//! *dominance*: a configuration is skipped when one with the same return,
//! state and open-op set has been seen using a subset of its indeterminate
//! ops. Using fewer of them leaves every option the other has (an unused
//! indeterminate op can still be used later), so anything the dominated
//! configuration could reach, the recorded one reaches too.
//!
//! This is sound inside a depth-first search as well: a recorded
//! configuration is either fully explored (and failed) or on the stack
//! (and will explore everything its dominated copies could).
//!
//! Layout: a hash map from the configuration with its indeterminate bits
//! cleared to the head of a list, in one pool, of the indeterminate-bit
//! sets recorded for it.

use rustc_hash::FxBuildHasher as FxBuild;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// A search configuration (see `search`): return index, model state, and
/// the bits of linearized open ops (slots) and indeterminate ops.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Config<const W: usize> {
    pub r: u32,
    pub s: u32,
    pub bits: [u64; W],
}

impl<const W: usize> Hash for Config<W> {
    #[inline]
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(((self.r as u64) << 32) | self.s as u64);
        for w in self.bits {
            h.write_u64(w);
        }
    }
}

impl<const W: usize> Config<W> {
    #[inline]
    pub fn has(&self, bit: u32) -> bool {
        self.bits[(bit / 64) as usize] & (1u64 << (bit % 64)) != 0
    }

    #[inline]
    pub fn with(mut self, bit: u32) -> Self {
        self.bits[(bit / 64) as usize] |= 1u64 << (bit % 64);
        self
    }

    #[inline]
    pub fn without(mut self, bit: u32) -> Self {
        self.bits[(bit / 64) as usize] &= !(1u64 << (bit % 64));
        self
    }
}

const NIL: u32 = u32::MAX;

struct Node<const W: usize> {
    info: [u64; W],
    next: u32,
}

pub(crate) struct Memo<const W: usize> {
    /// Which bits are indeterminate ops (the rest are slots).
    info_mask: [u64; W],
    heads: HashMap<Config<W>, u32, FxBuild>,
    pool: Vec<Node<W>>,
}

/// Whether a configuration was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Insert {
    New,
    Dominated,
    /// Recording it would pass the memory cap.
    Full,
}

impl<const W: usize> Memo<W> {
    pub fn new(n_slots: u32) -> Self {
        let mut info_mask = [u64::MAX; W];
        for bit in 0..n_slots {
            info_mask[(bit / 64) as usize] &= !(1u64 << (bit % 64));
        }
        Memo {
            info_mask,
            heads: HashMap::default(),
            pool: Vec::new(),
        }
    }

    /// Configurations recorded.
    pub fn len(&self) -> usize {
        self.pool.len()
    }

    /// Records `c` unless a recorded configuration dominates it, or unless
    /// recording it would make the memo's tables pass `bytes_max` (counting
    /// old and new tables while one grows).
    pub fn insert(&mut self, c: Config<W>, bytes_max: usize) -> Insert {
        let mut key = c;
        let mut info = [0u64; W];
        for (w, mask) in self.info_mask.iter().enumerate() {
            info[w] = c.bits[w] & mask;
            key.bits[w] &= !mask;
        }
        let head = self.heads.get(&key).copied();
        let mut at = head.unwrap_or(NIL);
        while at != NIL {
            let node = &self.pool[at as usize];
            if (0..W).all(|w| node.info[w] & !info[w] == 0) {
                return Insert::Dominated;
            }
            at = node.next;
        }
        if self.bytes_if_grown(head.is_none()) > bytes_max {
            return Insert::Full;
        }
        let index = self.pool.len() as u32;
        self.pool.push(Node {
            info,
            next: head.unwrap_or(NIL),
        });
        self.heads.insert(key, index);
        Insert::New
    }

    /// Bytes the tables take after the next insert, counting a growing
    /// table twice (old and new coexist while it moves).
    fn bytes_if_grown(&self, new_key: bool) -> usize {
        let head_bytes = std::mem::size_of::<(Config<W>, u32)>() + 1;
        let node_bytes = std::mem::size_of::<Node<W>>();
        let heads_cap = self.heads.capacity();
        let pool_cap = self.pool.capacity();
        let heads = if new_key && self.heads.len() == heads_cap {
            3 * heads_cap.max(4)
        } else {
            heads_cap
        };
        let pool = if self.pool.len() == pool_cap {
            3 * pool_cap.max(4)
        } else {
            pool_cap
        };
        heads * head_bytes + pool * node_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = usize::MAX;

    fn config(r: u32, s: u32, bits: u64) -> Config<1> {
        Config { r, s, bits: [bits] }
    }

    #[test]
    fn fewer_indeterminate_ops_dominate_more() {
        // slots: bits 0..2; indeterminate: bits 2..
        let mut m = Memo::<1>::new(2);
        assert_eq!(m.insert(config(0, 0, 0b0100), CAP), Insert::New);
        assert_eq!(m.insert(config(0, 0, 0b1100), CAP), Insert::Dominated);
        assert_eq!(m.insert(config(0, 0, 0b1000), CAP), Insert::New);
        // different slots, state or return: no dominance
        assert_eq!(m.insert(config(0, 0, 0b0101), CAP), Insert::New);
        assert_eq!(m.insert(config(0, 1, 0b0100), CAP), Insert::New);
        assert_eq!(m.insert(config(1, 0, 0b0100), CAP), Insert::New);
        assert_eq!(m.len(), 5);
    }

    #[test]
    fn exact_duplicates_are_dominated() {
        let mut m = Memo::<1>::new(0);
        assert_eq!(m.insert(config(3, 3, 5), CAP), Insert::New);
        assert_eq!(m.insert(config(3, 3, 5), CAP), Insert::Dominated);
    }

    #[test]
    fn insert_refuses_to_pass_the_cap() {
        let mut m = Memo::<1>::new(0);
        let mut full = false;
        for i in 0..100_000u64 {
            match m.insert(config(0, i as u32, 0), 64 << 10) {
                Insert::Full => {
                    full = true;
                    break;
                }
                Insert::New => {}
                Insert::Dominated => unreachable!(),
            }
        }
        assert!(full);
        assert!(m.bytes_if_grown(false) <= 3 * (64 << 10));
    }
}
