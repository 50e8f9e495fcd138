//! Entries and last-write-wins.
//!
//! An entry is a key, a timestamp and a value or a tombstone. Its digest is
//! SHA-256 of a canonical encoding: a domain tag, then length-prefixed
//! fields, so ("ab", "c") and ("a", "bc") differ and a tombstone differs
//! from an empty value.
//!
//! LWW is a total order on versions: higher ts wins, then a tombstone
//! beats a value, then the larger value (bytewise). It is a join, so the
//! outcome of merging never depends on who starts or in what order.

use sha2::{Digest as _, Sha256};
use std::cmp::Ordering;

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// Domain tag of the entry digest; bump the version with the encoding.
/// Short on purpose: every byte of it is hashed for every entry, and a
/// 100-byte entry should stay within two SHA-256 blocks.
const DOMAIN: &[u8] = b"drift.e1";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub key: Vec<u8>,
    pub ts: u64,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
}

impl Entry {
    pub fn put(key: &[u8], ts: u64, value: &[u8]) -> Entry {
        Entry {
            key: key.to_vec(),
            ts,
            value: Some(value.to_vec()),
        }
    }

    pub fn tombstone(key: &[u8], ts: u64) -> Entry {
        Entry {
            key: key.to_vec(),
            ts,
            value: None,
        }
    }

    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }

    pub fn digest(&self) -> Digest {
        digest(&self.key, self.ts, self.value.as_deref())
    }

    /// LWW order of two versions of the same key.
    pub fn lww_cmp(&self, other: &Entry) -> Ordering {
        lww_cmp(self.ts, self.value.as_deref(), other.ts, other.value.as_deref())
    }
}

/// Entries whose canonical encoding fits this many bytes are hashed from
/// one stack buffer in a single call: the hasher's per-call buffering
/// costs more than the copy.
const INLINE_BYTES: usize = 256;

/// The canonical digest of an entry.
pub fn digest(key: &[u8], ts: u64, value: Option<&[u8]>) -> Digest {
    let total = DOMAIN.len() + 4 + key.len() + 8 + 1 + value.map_or(0, |v| 4 + v.len());
    if total <= INLINE_BYTES {
        let mut buf = [0u8; INLINE_BYTES];
        let mut at = 0;
        canonical(key, ts, value, |b| {
            buf[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        });
        debug_assert_eq!(at, total);
        return Sha256::digest(&buf[..at]).into();
    }
    let mut h = Sha256::new();
    canonical(key, ts, value, |b| h.update(b));
    h.finalize().into()
}

/// The canonical encoding of an entry, as [`digest`] hashes it (for
/// benchmarks and tools; the digest never builds it on the heap).
pub fn canonical_bytes(key: &[u8], ts: u64, value: Option<&[u8]>) -> Vec<u8> {
    let mut v = Vec::new();
    canonical(key, ts, value, |b| v.extend_from_slice(b));
    v
}

/// Feeds the canonical encoding to `put`, part by part: the domain, the
/// key with its length, the timestamp, then a tombstone flag or 0 and the
/// value with its length.
fn canonical(key: &[u8], ts: u64, value: Option<&[u8]>, mut put: impl FnMut(&[u8])) {
    put(DOMAIN);
    put(&(key.len() as u32).to_be_bytes());
    put(key);
    put(&ts.to_be_bytes());
    match value {
        None => put(&[1]),
        Some(v) => {
            put(&[0]);
            put(&(v.len() as u32).to_be_bytes());
            put(v);
        }
    }
}

/// LWW order of (ts, value-or-tombstone) versions.
pub fn lww_cmp(ts_a: u64, a: Option<&[u8]>, ts_b: u64, b: Option<&[u8]>) -> Ordering {
    ts_a.cmp(&ts_b).then_with(|| match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_unambiguous() {
        assert_ne!(digest(b"ab", 1, Some(b"c")), digest(b"a", 1, Some(b"bc")));
        assert_ne!(digest(b"a", 1, None), digest(b"a", 1, Some(b"")));
        assert_ne!(digest(b"a", 1, Some(b"x")), digest(b"a", 2, Some(b"x")));
        assert_eq!(digest(b"a", 1, Some(b"x")), Entry::put(b"a", 1, b"x").digest());
    }

    #[test]
    fn the_stack_and_the_streaming_paths_hash_the_same_encoding() {
        for value in [None, Some(&[5u8; 10][..]), Some(&[5u8; INLINE_BYTES][..])] {
            let want: Digest = Sha256::digest(canonical_bytes(b"key", 9, value)).into();
            assert_eq!(digest(b"key", 9, value), want, "{:?}", value.map(<[u8]>::len));
        }
    }

    #[test]
    fn lww_orders_ts_then_tombstone_then_value() {
        let v = |ts, x: &[u8]| Entry::put(b"k", ts, x);
        let t = |ts| Entry::tombstone(b"k", ts);
        assert_eq!(v(2, b"a").lww_cmp(&v(1, b"z")), Ordering::Greater);
        assert_eq!(t(1).lww_cmp(&v(1, b"z")), Ordering::Greater);
        assert_eq!(v(1, b"b").lww_cmp(&v(1, b"a")), Ordering::Greater);
        assert_eq!(v(0, b"").lww_cmp(&t(u64::MAX)), Ordering::Less);
        assert_eq!(t(3).lww_cmp(&t(3)), Ordering::Equal);
    }
}
