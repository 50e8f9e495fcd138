//! The kv server's write-ahead log, as bytes: what a record is and how a
//! log is read back. The driver appends and syncs; this module only
//! encodes and decodes, so it is pure.
//!
//! A record is `[payload length u32 LE][CRC-32 of the payload u32 LE]
//! [payload]`; the payload is a tag byte and the change:
//!
//! * 1 applied: range u32, key length u32, key, ts u64, then 0 and value
//!   length u32 and value, or 1 for a tombstone;
//! * 2 purged: range u32, before u64;
//! * 3 repaired: range u32, peer u64, started_ts u64.
//!
//! All integers little-endian. Reading stops at the first record that is
//! cut short or fails its checksum: a crash mid-append leaves exactly such
//! a torn tail, and what precedes it is everything that was synced.
//! Invariant: `decode(encode(r)) == r`, and a log cut at any byte decodes
//! to a prefix of its records (tested).

use crate::entry::Entry;
use crate::replica::{Change, PeerId};

/// Largest payload: a key and a value of the kv service's limits with
/// room to spare. A length past it is a torn or corrupt header, never a
/// record to allocate for.
pub const PAYLOAD_BYTES_MAX: usize = 4 << 20;
const HEADER_BYTES: usize = 8;

/// One logged change of one range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub range: u32,
    pub change: Change,
}

/// Appends `r`'s bytes to `out`.
pub fn encode(r: &Record, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    match &r.change {
        Change::Applied(e) => {
            out.push(1);
            out.extend_from_slice(&r.range.to_le_bytes());
            out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
            out.extend_from_slice(&e.key);
            out.extend_from_slice(&e.ts.to_le_bytes());
            match &e.value {
                Some(v) => {
                    out.push(0);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
                None => out.push(1),
            }
        }
        Change::Purged { before } => {
            out.push(2);
            out.extend_from_slice(&r.range.to_le_bytes());
            out.extend_from_slice(&before.to_le_bytes());
        }
        Change::Repaired { peer, started_ts } => {
            out.push(3);
            out.extend_from_slice(&r.range.to_le_bytes());
            out.extend_from_slice(&peer.to_le_bytes());
            out.extend_from_slice(&started_ts.to_le_bytes());
        }
    }
    let len = out.len() - start - HEADER_BYTES;
    assert!(
        len <= PAYLOAD_BYTES_MAX,
        "a kv record of {len} bytes: the server's limits let it through"
    );
    let crc = crc32fast::hash(&out[start + HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What reading a log found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    pub records: Vec<Record>,
    /// Bytes of whole, intact records: the log is cut here before appending.
    pub valid_bytes: usize,
    /// Why reading stopped before the end, if it did.
    pub torn: Option<String>,
}

/// Reads every intact record from the start of `bytes`.
pub fn decode(bytes: &[u8]) -> Decoded {
    let mut d = Decoded::default();
    let mut at = 0;
    while at < bytes.len() {
        match record_at(&bytes[at..]) {
            Ok((r, used)) => {
                d.records.push(r);
                at += used;
            }
            Err(why) => {
                d.torn = Some(format!("at byte {at}: {why}"));
                break;
            }
        }
    }
    d.valid_bytes = at;
    d
}

fn record_at(b: &[u8]) -> Result<(Record, usize), String> {
    if b.len() < HEADER_BYTES {
        return Err(format!("a header cut short ({} of {HEADER_BYTES} bytes)", b.len()));
    }
    let len = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    if len > PAYLOAD_BYTES_MAX {
        return Err(format!("a length of {len} bytes, over {PAYLOAD_BYTES_MAX}"));
    }
    let Some(payload) = b.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Err(format!(
            "a payload cut short ({} of {len} bytes)",
            b.len() - HEADER_BYTES
        ));
    };
    if crc32fast::hash(payload) != crc {
        return Err("a checksum mismatch".into());
    }
    let r = payload_record(payload).ok_or("a payload that does not parse")?;
    Ok((r, HEADER_BYTES + len))
}

fn payload_record(p: &[u8]) -> Option<Record> {
    let mut c = Cursor { b: p, at: 0 };
    let tag = c.u8()?;
    let range = c.u32()?;
    let change = match tag {
        1 => {
            let klen = c.u32()? as usize;
            let key = c.bytes(klen)?.to_vec();
            let ts = c.u64()?;
            let value = match c.u8()? {
                0 => {
                    let vlen = c.u32()? as usize;
                    Some(c.bytes(vlen)?.to_vec())
                }
                1 => None,
                _ => return None,
            };
            Change::Applied(Entry { key, ts, value })
        }
        2 => Change::Purged { before: c.u64()? },
        3 => {
            let peer: PeerId = c.u64()?;
            Change::Repaired {
                peer,
                started_ts: c.u64()?,
            }
        }
        _ => return None,
    };
    (c.at == p.len()).then_some(Record { range, change })
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record {
                range: 0,
                change: Change::Applied(Entry::put(b"k1", 7, b"v")),
            },
            Record {
                range: 2,
                change: Change::Applied(Entry::tombstone(b"k2", u64::MAX)),
            },
            Record {
                range: 1,
                change: Change::Purged { before: 99 },
            },
            Record {
                range: 1,
                change: Change::Repaired {
                    peer: 3,
                    started_ts: 1234,
                },
            },
            Record {
                range: 0,
                change: Change::Applied(Entry::put(b"", 0, b"")),
            },
        ]
    }

    #[test]
    fn records_round_trip() {
        let mut buf = Vec::new();
        for r in sample() {
            encode(&r, &mut buf);
        }
        let d = decode(&buf);
        assert_eq!(d.records, sample());
        assert_eq!((d.valid_bytes, d.torn), (buf.len(), None));
    }

    #[test]
    fn a_log_cut_anywhere_reads_back_a_prefix_and_says_where_it_tore() {
        let mut buf = Vec::new();
        let mut ends = vec![0];
        for r in sample() {
            encode(&r, &mut buf);
            ends.push(buf.len());
        }
        for cut in 0..buf.len() {
            let d = decode(&buf[..cut]);
            let whole = ends.iter().filter(|&&e| e <= cut).count() - 1;
            assert_eq!(d.records, sample()[..whole], "cut at {cut}");
            assert_eq!(d.valid_bytes, ends[whole]);
            assert_eq!(d.torn.is_some(), cut != ends[whole]);
        }
    }

    #[test]
    fn a_flipped_byte_ends_the_log_at_its_record() {
        let mut buf = Vec::new();
        for r in sample() {
            encode(&r, &mut buf);
        }
        let first = decode(&buf).records.len();
        let mut bad = buf.clone();
        bad[HEADER_BYTES + 2] ^= 0x40;
        let d = decode(&bad);
        assert!(d.records.is_empty() && d.valid_bytes == 0, "{d:?}");
        assert!(d.torn.unwrap().contains("checksum"));
        assert_eq!(first, 5);
        // a length past the limit is not allocated for
        let mut huge = vec![0xff; 8];
        huge.extend_from_slice(&[0; 16]);
        assert!(decode(&huge).torn.unwrap().contains("over"));
    }
}
