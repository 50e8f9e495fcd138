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
const DOMAIN: &[u8] = b"drift.repair.entry.v1\0";

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
        lww_cmp(
            self.ts,
            self.value.as_deref(),
            other.ts,
            other.value.as_deref(),
        )
    }
}

/// The canonical digest of an entry.
pub fn digest(key: &[u8], ts: u64, value: Option<&[u8]>) -> Digest {
    let mut h = Sha256::new();
    let mut head = [0u8; DOMAIN.len() + 4];
    head[..DOMAIN.len()].copy_from_slice(DOMAIN);
    head[DOMAIN.len()..].copy_from_slice(&(key.len() as u32).to_be_bytes());
    h.update(head);
    h.update(key);
    let mut mid = [0u8; 8 + 1 + 4];
    mid[..8].copy_from_slice(&ts.to_be_bytes());
    match value {
        None => {
            mid[8] = 1;
            h.update(&mid[..9]);
        }
        Some(v) => {
            mid[8] = 0;
            mid[9..].copy_from_slice(&(v.len() as u32).to_be_bytes());
            h.update(mid);
            h.update(v);
        }
    }
    h.finalize().into()
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
        assert_eq!(
            digest(b"a", 1, Some(b"x")),
            Entry::put(b"a", 1, b"x").digest()
        );
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
