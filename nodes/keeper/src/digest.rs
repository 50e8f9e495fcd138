//! The tree digest: a replicated fingerprint of the whole znode tree.
//!
//! Node digest = SipHash-2-4-64 (keys 0, 0) over a little-endian encoding
//! of every Stat field, the TTL and — unlike Keeper, whose TODO admits the
//! hole — the sequential counter, together with the SipHash-2-4 of the
//! length-prefixed path and data (cached per node, so adding a child does
//! not rehash the parent's data); 0 maps to 1 (0 means "no digest"). Tree digest = wrapping sum
//! of node digests, so it is order-independent and kept incrementally:
//! replace a node and the sum changes by (new − old). A tree sum of 0 is
//! reported as 1.
//!
//! Any change to what is hashed must bump [`DIGEST_VERSION`]: the version
//! travels with every value, and a replica compares only values of the
//! version it computes.

use crate::node::{Kind, Node, Stat};
use siphasher::sip::SipHasher24;
use std::hash::Hasher;

/// Version of the digest function. 0 means "no digest".
pub const DIGEST_VERSION: u8 = 1;
pub const NO_DIGEST: u8 = 0;

/// A digest value with the version that computed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    pub version: u8,
    pub value: u64,
}

impl Digest {
    pub const NONE: Digest = Digest {
        version: NO_DIGEST,
        value: 0,
    };

    /// Two digests disagree only when both were computed by the same
    /// version and differ (DESIGN.md: a version a replica does not
    /// understand cannot be compared).
    pub fn mismatches(self, other: Digest) -> bool {
        self.version != NO_DIGEST && self.version == other.version && self.value != other.value
    }
}

/// SipHash-2-4 of a node's path and data, length-prefixed: the part of
/// its digest that only changes with its data, cached in the node so a
/// stat-only change (a child added) does not rehash the data.
pub fn content_hash(path: &str, data: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(0, 0);
    h.write(&(path.len() as u64).to_le_bytes());
    h.write(path.as_bytes());
    h.write(&(data.len() as u64).to_le_bytes());
    h.write(data);
    h.finish()
}

/// Bytes of the fixed-size part: content hash, 11 Stat fields, TTL, seq.
const FIELDS_BYTES: usize = 8 + 4 * 8 + 3 * 4 + 8 + 2 * 4 + 8 + 8 + 8;

/// The node digest from its content hash and fields: SipHash-2-4 over
/// one buffer (one call, no per-field overhead). 0 maps to 1.
pub fn digest_from_content(content: u64, stat: &Stat, seq: i64) -> u64 {
    let ttl = match Kind::from_owner_field(stat.ephemeral_owner) {
        Kind::Ttl { ttl_ms } => ttl_ms,
        _ => 0,
    };
    let mut buf = [0u8; FIELDS_BYTES];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&content.to_le_bytes());
    for v in [stat.czxid, stat.mzxid, stat.ctime, stat.mtime] {
        put(&v.to_le_bytes());
    }
    for v in [stat.version, stat.cversion, stat.aversion] {
        put(&v.to_le_bytes());
    }
    put(&stat.ephemeral_owner.to_le_bytes());
    put(&stat.data_length.to_le_bytes());
    put(&stat.num_children.to_le_bytes());
    put(&stat.pzxid.to_le_bytes());
    put(&ttl.to_le_bytes());
    put(&seq.to_le_bytes());
    debug_assert_eq!(at, FIELDS_BYTES);
    let mut h = SipHasher24::new_with_keys(0, 0);
    h.write(&buf);
    match h.finish() {
        0 => 1,
        d => d,
    }
}

/// The digest of a node stored at `path`.
pub fn node_digest(path: &str, data: &[u8], stat: &Stat, seq: i64) -> u64 {
    digest_from_content(content_hash(path, data), stat, seq)
}

/// Recomputes a node's digest from its fields (the full-recompute check).
pub fn recompute(path: &str, node: &Node) -> u64 {
    node_digest(path, &node.data, &node.stat, node.seq)
}

/// The value a tree sum is reported as.
pub fn tree_value(sum: u64) -> u64 {
    if sum == 0 {
        1
    } else {
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_and_the_sequential_counter_change_the_digest() {
        let stat = Stat {
            czxid: 1,
            mzxid: 2,
            ctime: 3,
            mtime: 4,
            version: 5,
            cversion: 6,
            aversion: 7,
            ephemeral_owner: 0,
            data_length: 1,
            num_children: 0,
            pzxid: 8,
        };
        let base = node_digest("/a", b"x", &stat, 0);
        let variants = [
            node_digest("/b", b"x", &stat, 0),
            node_digest("/a", b"y", &stat, 0),
            node_digest("/a", b"x", &stat, 1),
            node_digest("/a", b"x", &Stat { czxid: 9, ..stat }, 0),
            node_digest("/a", b"x", &Stat { mzxid: 9, ..stat }, 0),
            node_digest("/a", b"x", &Stat { ctime: 9, ..stat }, 0),
            node_digest("/a", b"x", &Stat { mtime: 9, ..stat }, 0),
            node_digest("/a", b"x", &Stat { version: 9, ..stat }, 0),
            node_digest("/a", b"x", &Stat { cversion: 9, ..stat }, 0),
            node_digest("/a", b"x", &Stat { aversion: 9, ..stat }, 0),
            node_digest(
                "/a",
                b"x",
                &Stat {
                    ephemeral_owner: 9,
                    ..stat
                },
                0,
            ),
            node_digest("/a", b"x", &Stat { data_length: 9, ..stat }, 0),
            node_digest(
                "/a",
                b"x",
                &Stat {
                    num_children: 9,
                    ..stat
                },
                0,
            ),
            node_digest("/a", b"x", &Stat { pzxid: 9, ..stat }, 0),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i} hashes like the base");
        }
        // path and data boundaries are length-prefixed
        assert_ne!(node_digest("/ab", b"c", &stat, 0), node_digest("/a", b"bc", &stat, 0));
    }

    #[test]
    fn digests_of_other_versions_are_not_compared() {
        let a = Digest { version: 1, value: 5 };
        assert!(a.mismatches(Digest { version: 1, value: 6 }));
        assert!(!a.mismatches(Digest { version: 2, value: 6 }));
        assert!(!Digest::NONE.mismatches(Digest::NONE));
    }
}
