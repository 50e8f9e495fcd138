//! The tree digest: a replicated fingerprint of the whole znode tree.
//!
//! Node digest = SipHash-2-4-64 (keys 0, 0) over the zigzag varints of
//! every Stat field (the TTL of a TTL node is encoded in its
//! `ephemeralOwner`, so it is in) and — unlike Keeper, whose TODO admits
//! the hole — the sequential counter, after the SipHash-2-4 of the path and
//! data (cached per node, so adding a child does not rehash the parent's
//! data); 0 maps to 1 (0 means "no digest"). Tree digest = wrapping sum
//! of node digests, so it is order-independent and kept incrementally:
//! replace a node and the sum changes by (new − old). A tree sum of 0 is
//! reported as 1.
//!
//! Any change to what is hashed must bump [`DIGEST_VERSION`]: the version
//! travels with every value, and a replica compares only values of the
//! version it computes.

use crate::node::{Node, Stat};
use siphasher::sip::SipHasher24;
use std::hash::Hasher;

/// Version of the digest function. 0 means "no digest".
pub const DIGEST_VERSION: u8 = 2;
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

    /// The digest a tree with node-digest sum `sum` reports (`NONE` when
    /// digests are off).
    pub fn of_sum(on: bool, sum: u64) -> Digest {
        if on {
            Digest {
                version: DIGEST_VERSION,
                value: tree_value(sum),
            }
        } else {
            Digest::NONE
        }
    }

    /// Two digests disagree only when both were computed by the same
    /// version and differ (docs/ARCHITECTURE.md, "The keeper": a version a replica does not
    /// understand cannot be compared).
    pub fn mismatches(self, other: Digest) -> bool {
        self.version != NO_DIGEST && self.version == other.version && self.value != other.value
    }
}

/// SipHash-2-4 of a node's path and data: the part of its digest that
/// only changes with its data, cached in the node so a stat-only change (a
/// child added) does not rehash the data. The path goes in with a varint
/// length and the data is the rest, which keeps the input unambiguous.
pub fn content_hash(path: &str, data: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(0, 0);
    let mut len = [0u8; VARINT_MAX];
    let n = put_varint(&mut len, 0, path.len() as u64);
    h.write(&len[..n]);
    h.write(path.as_bytes());
    h.write(data);
    h.finish()
}

/// Longest LEB128 encoding of a u64.
const VARINT_MAX: usize = 10;
/// Most bytes of the fields part: content hash, then 11 Stat fields and
/// the sequential counter as varints.
const FIELDS_BYTES_MAX: usize = 8 + 12 * VARINT_MAX;

/// Writes `v` as LEB128 at `at`; returns the new end.
fn put_varint(buf: &mut [u8], mut at: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        buf[at] = (v as u8) | 0x80;
        v >>= 7;
        at += 1;
    }
    buf[at] = v as u8;
    at + 1
}

/// Zigzag: small magnitudes of either sign stay short.
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The node digest from its content hash and fields: SipHash-2-4 over one
/// buffer, the fields as zigzag varints (a concatenation of varints is
/// prefix-free, so distinct fields give distinct inputs, and the typical
/// node hashes 4–5 blocks instead of 12). 0 maps to 1.
pub fn digest_from_content(content: u64, stat: &Stat, seq: i64) -> u64 {
    let mut buf = [0u8; FIELDS_BYTES_MAX];
    let n = encode_fields(&mut buf, content, stat, seq);
    let mut h = SipHasher24::new_with_keys(0, 0);
    h.write(&buf[..n]);
    match h.finish() {
        0 => 1,
        d => d,
    }
}

/// The fields part as hashed; returns its length.
fn encode_fields(buf: &mut [u8; FIELDS_BYTES_MAX], content: u64, stat: &Stat, seq: i64) -> usize {
    buf[..8].copy_from_slice(&content.to_le_bytes());
    let mut at = 8;
    for v in [
        stat.czxid,
        stat.mzxid,
        stat.ctime,
        stat.mtime,
        stat.version as i64,
        stat.cversion as i64,
        stat.aversion as i64,
        stat.ephemeral_owner,
        stat.data_length as i64,
        stat.num_children as i64,
        stat.pzxid,
        seq,
    ] {
        at = put_varint(buf, at, zigzag(v));
    }
    at
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
        // the path is length-prefixed, so the path/data boundary counts
        assert_ne!(node_digest("/ab", b"c", &stat, 0), node_digest("/a", b"bc", &stat, 0));
        // neighbouring fields cannot trade values
        assert_ne!(
            node_digest(
                "/a",
                b"x",
                &Stat {
                    version: 1,
                    cversion: 0,
                    ..stat
                },
                0
            ),
            node_digest(
                "/a",
                b"x",
                &Stat {
                    version: 0,
                    cversion: 1,
                    ..stat
                },
                0
            )
        );
    }

    /// Reads back what `encode_fields` wrote: the encoding is injective.
    fn decode_fields(b: &[u8]) -> (u64, Vec<i64>) {
        let content = u64::from_le_bytes(b[..8].try_into().unwrap());
        let mut out = Vec::new();
        let (mut v, mut shift) = (0u64, 0);
        for &byte in &b[8..] {
            v |= ((byte & 0x7f) as u64) << shift;
            shift += 7;
            if byte < 0x80 {
                out.push(((v >> 1) as i64) ^ -((v & 1) as i64));
                (v, shift) = (0, 0);
            }
        }
        assert_eq!(shift, 0, "a varint ran past the end");
        (content, out)
    }

    proptest::proptest! {
        #[test]
        fn the_fields_encoding_reads_back_exactly(
            content: u64, zxids: [i64; 3], times: [i64; 2], versions: [i32; 3],
            owner: i64, lens: [i32; 2], seq: i64,
        ) {
            let stat = Stat {
                czxid: zxids[0], mzxid: zxids[1], pzxid: zxids[2], ctime: times[0], mtime: times[1],
                version: versions[0], cversion: versions[1], aversion: versions[2],
                ephemeral_owner: owner, data_length: lens[0], num_children: lens[1],
            };
            let mut buf = [0u8; FIELDS_BYTES_MAX];
            let n = encode_fields(&mut buf, content, &stat, seq);
            let (c, fields) = decode_fields(&buf[..n]);
            proptest::prop_assert_eq!(c, content);
            proptest::prop_assert_eq!(fields, vec![
                stat.czxid, stat.mzxid, stat.ctime, stat.mtime, versions[0] as i64, versions[1] as i64,
                versions[2] as i64, owner, lens[0] as i64, lens[1] as i64, stat.pzxid, seq,
            ]);
        }
    }

    #[test]
    fn digests_of_other_versions_are_not_compared() {
        let a = Digest { version: 1, value: 5 };
        assert!(a.mismatches(Digest { version: 1, value: 6 }));
        assert!(!a.mismatches(Digest { version: 2, value: 6 }));
        assert!(!Digest::NONE.mismatches(Digest::NONE));
    }
}
