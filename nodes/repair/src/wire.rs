//! The repair session's messages and their byte encoding: varint
//! integers, length-prefixed bytes, packed bit and 2-bit arrays. Decoding
//! is bounded and total: malformed bytes are an error, never a panic.

use crate::entry::Entry;

/// Most items (hashes, entries, keys) one message may carry.
pub const ITEMS_MAX: usize = 1 << 24;
/// Longest key or value on the wire.
pub const BYTES_MAX: usize = 16 << 20;

/// Bytes that are not a repair message, and where they stop being one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("repair message: {what} at byte {at}")]
    Malformed { what: &'static str, at: usize },
    #[error("repair message: unknown message type {0}")]
    UnknownType(u8),
    #[error("repair message: {0} trailing bytes")]
    Trailing(usize),
}

/// A key's version without its value: enough to decide LWW but for the
/// last tie-break (equal ts, both values), which streams both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRef {
    pub key: Vec<u8>,
    pub ts: u64,
    pub tombstone: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Initiator → responder: open a session.
    Hello {
        seed: u64,
        lo: u64,
        hi: u64,
        depth: u32,
        gc_before: u64,
        row_level: bool,
        hash_bytes: u8,
    },
    /// Responder → initiator.
    HelloAck {
        depth: u32,
        gc_before: u64,
    },
    /// Initiator → responder: open a session by set reconciliation, with a
    /// sketch of the range (per bucket at `level`, one byte of the XOR of
    /// its entries' fingerprints) for the responder to estimate the
    /// difference from. The Merkle walk's fields come along, for when the
    /// responder prefers it (it then answers [`Msg::HelloAck`]).
    SetHello {
        seed: u64,
        lo: u64,
        hi: u64,
        depth: u32,
        gc_before: u64,
        row_level: bool,
        hash_bytes: u8,
        level: u32,
        sketch: Vec<u8>,
    },
    /// Responder: its invertible Bloom lookup table of the range's entry
    /// fingerprints, sized from the sketch ([`crate::iblt`]).
    SetAck {
        depth: u32,
        gc_before: u64,
        cells: Vec<u8>,
    },
    /// Initiator: the entries only it holds, and the fingerprints (low 24
    /// bits) of those only the responder holds. The responder answers
    /// [`Msg::Entries`].
    SetStream {
        entries: Vec<Entry>,
        want: Vec<u32>,
    },
    /// Initiator's truncated node hashes (`hash_bytes` each) for one
    /// level, and its 2-bit size classes (0 empty, 1 one entry, 2 more)
    /// per node.
    Level {
        level: u32,
        hash_bytes: u8,
        hashes: Vec<u64>,
        classes: Vec<u8>,
    },
    /// Responder: per node, mismatch or not; and its size class for each
    /// mismatched node (the others need none).
    LevelAck {
        mismatch: Vec<bool>,
        classes: Vec<u8>,
    },
    /// Initiator's per-entry fingerprints, one list per final range.
    Fingerprints {
        ranges: Vec<Vec<u64>>,
    },
    /// Responder: per range, which of the initiator's fingerprints it
    /// holds; the versions of its entries the initiator lacks; and whole
    /// entries of ranges where the initiator has none (they win).
    Versions {
        present: Vec<Vec<bool>>,
        versions: Vec<VersionRef>,
        entries: Vec<Entry>,
    },
    /// Initiator: its winning entries, and the keys it wants.
    Stream {
        entries: Vec<Entry>,
        want: Vec<Vec<u8>>,
    },
    /// Responder: the wanted entries (and, without the row-level round, all
    /// its entries of the mismatched ranges).
    Entries {
        entries: Vec<Entry>,
    },
    /// Initiator: it merged the responder's entries. Only now may the
    /// responder count the session as a repair (GC gates on it).
    Done,
    /// Responder: recorded.
    DoneAck,
    Error {
        reason: String,
    },
}

const T_HELLO: u8 = 1;
const T_HELLO_ACK: u8 = 2;
const T_LEVEL: u8 = 3;
const T_LEVEL_ACK: u8 = 4;
const T_FPS: u8 = 5;
const T_VERSIONS: u8 = 6;
const T_STREAM: u8 = 7;
const T_ENTRIES: u8 = 8;
const T_ERROR: u8 = 9;
const T_DONE: u8 = 10;
const T_DONE_ACK: u8 = 11;
const T_SET_HELLO: u8 = 12;
const T_SET_ACK: u8 = 13;
const T_SET_STREAM: u8 = 14;
/// Bits of a wanted fingerprint on the wire: enough that a false match
/// among a range's entries is rare, and a false match only streams one
/// entry more.
pub const WANT_BITS: u32 = 24;

struct W {
    buf: Vec<u8>,
    /// Bytes of whole entries (the stream payload, not reconciliation).
    entry_bytes: usize,
}

impl W {
    fn var(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.var(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn bits(&mut self, bits: &[bool]) {
        self.var(bits.len() as u64);
        for chunk in bits.chunks(8) {
            self.buf
                .push(chunk.iter().enumerate().fold(0u8, |b, (i, &x)| b | (x as u8) << i));
        }
    }

    /// 2-bit values; a list of nothing but 2s ("many", the common case
    /// high in the tree) is one flag byte.
    fn pairs(&mut self, vals: &[u8]) {
        self.var(vals.len() as u64);
        if vals.iter().all(|&v| v == 2) {
            self.buf.push(1);
            return;
        }
        self.buf.push(0);
        for chunk in vals.chunks(4) {
            self.buf
                .push(chunk.iter().enumerate().fold(0u8, |b, (i, &x)| b | (x & 3) << (2 * i)));
        }
    }

    fn entry(&mut self, e: &Entry) {
        let start = self.buf.len();
        self.bytes(&e.key);
        self.var(e.ts);
        match &e.value {
            None => self.buf.push(1),
            Some(v) => {
                self.buf.push(0);
                self.bytes(v);
            }
        }
        self.entry_bytes += self.buf.len() - start;
    }

    fn entries(&mut self, es: &[Entry]) {
        self.var(es.len() as u64);
        for e in es {
            self.entry(e);
        }
    }
}

struct R<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> R<'a> {
    fn err<T>(&self, what: &'static str) -> Result<T, WireError> {
        Err(WireError::Malformed { what, at: self.at })
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        let Some(&v) = self.b.get(self.at) else {
            return self.err("truncated");
        };
        self.at += 1;
        Ok(v)
    }

    fn var(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.err("varint too long")
    }

    fn count(&mut self, min_bytes: usize) -> Result<usize, WireError> {
        let n = self.var()? as usize;
        if n > ITEMS_MAX || n.saturating_mul(min_bytes) > self.b.len() - self.at {
            return self.err("impossible count");
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.var()? as usize;
        if n > BYTES_MAX || n > self.b.len() - self.at {
            return self.err("impossible length");
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        if self.b.len() - self.at < 8 {
            return self.err("truncated");
        }
        let v = u64::from_le_bytes(self.b[self.at..self.at + 8].try_into().expect("8 bytes"));
        self.at += 8;
        Ok(v)
    }

    fn bits(&mut self) -> Result<Vec<bool>, WireError> {
        let n = self.var()? as usize;
        if n > ITEMS_MAX || n.div_ceil(8) > self.b.len() - self.at {
            return self.err("impossible bit count");
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.b[self.at + i / 8] >> (i % 8) & 1 == 1);
        }
        self.at += n.div_ceil(8);
        Ok(out)
    }

    fn pairs(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.var()? as usize;
        if n > ITEMS_MAX {
            return self.err("impossible class count");
        }
        match self.u8()? {
            1 => return Ok(vec![2; n]),
            0 => {}
            _ => return self.err("bad class list flag"),
        }
        if n.div_ceil(4) > self.b.len() - self.at {
            return self.err("impossible class count");
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.b[self.at + i / 4] >> (2 * (i % 4)) & 3);
        }
        self.at += n.div_ceil(4);
        Ok(out)
    }

    fn entry(&mut self) -> Result<Entry, WireError> {
        let key = self.bytes()?.to_vec();
        let ts = self.var()?;
        let value = match self.u8()? {
            1 => None,
            0 => Some(self.bytes()?.to_vec()),
            _ => return self.err("bad tombstone flag"),
        };
        Ok(Entry { key, ts, value })
    }

    fn entries(&mut self) -> Result<Vec<Entry>, WireError> {
        let n = self.count(3)?;
        (0..n).map(|_| self.entry()).collect()
    }
}

/// An encoded message and how many of its bytes are streamed entries.
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub entry_bytes: usize,
}

impl Msg {
    pub fn encode(&self) -> Encoded {
        let mut w = W {
            buf: Vec::new(),
            entry_bytes: 0,
        };
        match self {
            Msg::Hello {
                seed,
                lo,
                hi,
                depth,
                gc_before,
                row_level,
                hash_bytes,
            } => {
                w.buf.push(T_HELLO);
                w.u64(*seed);
                w.var(*lo);
                w.var(*hi);
                w.var(*depth as u64);
                w.var(*gc_before);
                w.buf.push(*row_level as u8);
                w.buf.push(*hash_bytes);
            }
            Msg::HelloAck { depth, gc_before } => {
                w.buf.push(T_HELLO_ACK);
                w.var(*depth as u64);
                w.var(*gc_before);
            }
            Msg::SetHello {
                seed,
                lo,
                hi,
                depth,
                gc_before,
                row_level,
                hash_bytes,
                level,
                sketch,
            } => {
                w.buf.push(T_SET_HELLO);
                w.u64(*seed);
                w.var(*lo);
                w.var(*hi);
                w.var(*depth as u64);
                w.var(*gc_before);
                w.buf.push(*row_level as u8);
                w.buf.push(*hash_bytes);
                w.var(*level as u64);
                w.bytes(sketch);
            }
            Msg::SetAck {
                depth,
                gc_before,
                cells,
            } => {
                w.buf.push(T_SET_ACK);
                w.var(*depth as u64);
                w.var(*gc_before);
                w.bytes(cells);
            }
            Msg::SetStream { entries, want } => {
                w.buf.push(T_SET_STREAM);
                w.entries(entries);
                w.var(want.len() as u64);
                for f in want {
                    w.buf.extend_from_slice(&f.to_le_bytes()[..(WANT_BITS / 8) as usize]);
                }
            }
            Msg::Level {
                level,
                hash_bytes,
                hashes,
                classes,
            } => {
                w.buf.push(T_LEVEL);
                w.var(*level as u64);
                w.buf.push(*hash_bytes);
                w.var(hashes.len() as u64);
                let n = (*hash_bytes as usize).clamp(1, 8);
                for h in hashes {
                    w.buf.extend_from_slice(&h.to_le_bytes()[..n]);
                }
                w.pairs(classes);
            }
            Msg::LevelAck { mismatch, classes } => {
                w.buf.push(T_LEVEL_ACK);
                w.bits(mismatch);
                w.pairs(classes);
            }
            Msg::Fingerprints { ranges } => {
                w.buf.push(T_FPS);
                w.var(ranges.len() as u64);
                for r in ranges {
                    w.var(r.len() as u64);
                    for f in r {
                        w.u64(*f);
                    }
                }
            }
            Msg::Versions {
                present,
                versions,
                entries,
            } => {
                w.buf.push(T_VERSIONS);
                w.var(present.len() as u64);
                for p in present {
                    w.bits(p);
                }
                w.var(versions.len() as u64);
                for v in versions {
                    w.bytes(&v.key);
                    w.var(v.ts);
                    w.buf.push(v.tombstone as u8);
                }
                w.entries(entries);
            }
            Msg::Stream { entries, want } => {
                w.buf.push(T_STREAM);
                w.entries(entries);
                w.var(want.len() as u64);
                for k in want {
                    w.bytes(k);
                }
            }
            Msg::Entries { entries } => {
                w.buf.push(T_ENTRIES);
                w.entries(entries);
            }
            Msg::Done => w.buf.push(T_DONE),
            Msg::DoneAck => w.buf.push(T_DONE_ACK),
            Msg::Error { reason } => {
                w.buf.push(T_ERROR);
                w.bytes(reason.as_bytes());
            }
        }
        Encoded {
            bytes: w.buf,
            entry_bytes: w.entry_bytes,
        }
    }

    /// Whether `bytes` is a session's first message (a hello, either
    /// kind), without decoding the rest.
    pub fn opens_session(bytes: &[u8]) -> bool {
        matches!(bytes.first(), Some(&(T_HELLO | T_SET_HELLO)))
    }

    pub fn decode(bytes: &[u8]) -> Result<Msg, WireError> {
        let mut r = R { b: bytes, at: 0 };
        let msg = match r.u8()? {
            T_HELLO => Msg::Hello {
                seed: r.u64()?,
                lo: r.var()?,
                hi: r.var()?,
                depth: r.var()?.min(u32::MAX as u64) as u32,
                gc_before: r.var()?,
                row_level: r.u8()? != 0,
                hash_bytes: r.u8()?,
            },
            T_HELLO_ACK => Msg::HelloAck {
                depth: r.var()?.min(u32::MAX as u64) as u32,
                gc_before: r.var()?,
            },
            T_SET_HELLO => Msg::SetHello {
                seed: r.u64()?,
                lo: r.var()?,
                hi: r.var()?,
                depth: r.var()?.min(u32::MAX as u64) as u32,
                gc_before: r.var()?,
                row_level: r.u8()? != 0,
                hash_bytes: r.u8()?,
                level: r.var()?.min(u32::MAX as u64) as u32,
                sketch: r.bytes()?.to_vec(),
            },
            T_SET_ACK => Msg::SetAck {
                depth: r.var()?.min(u32::MAX as u64) as u32,
                gc_before: r.var()?,
                cells: r.bytes()?.to_vec(),
            },
            T_SET_STREAM => {
                let entries = r.entries()?;
                let w = (WANT_BITS / 8) as usize;
                let n = r.count(w)?;
                let mut want = Vec::with_capacity(n);
                for _ in 0..n {
                    let mut b = [0u8; 4];
                    b[..w].copy_from_slice(&r.b[r.at..r.at + w]);
                    r.at += w;
                    want.push(u32::from_le_bytes(b));
                }
                Msg::SetStream { entries, want }
            }
            T_LEVEL => {
                let level = r.var()?.min(u32::MAX as u64) as u32;
                let hash_bytes = r.u8()?;
                if !(1..=8).contains(&hash_bytes) {
                    return r.err("hash width out of 1..=8");
                }
                let w = hash_bytes as usize;
                let n = r.count(w)?;
                let mut hashes = Vec::with_capacity(n);
                for _ in 0..n {
                    let mut b = [0u8; 8];
                    b[..w].copy_from_slice(&r.b[r.at..r.at + w]);
                    r.at += w;
                    hashes.push(u64::from_le_bytes(b));
                }
                Msg::Level {
                    level,
                    hash_bytes,
                    hashes,
                    classes: r.pairs()?,
                }
            }
            T_LEVEL_ACK => Msg::LevelAck {
                mismatch: r.bits()?,
                classes: r.pairs()?,
            },
            T_FPS => {
                let n = r.count(1)?;
                let mut ranges = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = r.count(8)?;
                    ranges.push((0..k).map(|_| r.u64()).collect::<Result<_, _>>()?);
                }
                Msg::Fingerprints { ranges }
            }
            T_VERSIONS => {
                let n = r.count(1)?;
                let present = (0..n).map(|_| r.bits()).collect::<Result<_, _>>()?;
                let k = r.count(3)?;
                let mut versions = Vec::with_capacity(k);
                for _ in 0..k {
                    let key = r.bytes()?.to_vec();
                    let ts = r.var()?;
                    let tombstone = match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return r.err("bad tombstone flag"),
                    };
                    versions.push(VersionRef { key, ts, tombstone });
                }
                Msg::Versions {
                    present,
                    versions,
                    entries: r.entries()?,
                }
            }
            T_STREAM => {
                let entries = r.entries()?;
                let n = r.count(1)?;
                let want = (0..n)
                    .map(|_| r.bytes().map(<[u8]>::to_vec))
                    .collect::<Result<_, _>>()?;
                Msg::Stream { entries, want }
            }
            T_ENTRIES => Msg::Entries { entries: r.entries()? },
            T_DONE => Msg::Done,
            T_DONE_ACK => Msg::DoneAck,
            T_ERROR => Msg::Error {
                reason: String::from_utf8_lossy(r.bytes()?).into_owned(),
            },
            t => return Err(WireError::UnknownType(t)),
        };
        if r.at != bytes.len() {
            return Err(WireError::Trailing(bytes.len() - r.at));
        }
        Ok(msg)
    }
}
