//! Jute, ZooKeeper's serialization: big-endian ints and longs, booleans
//! as one byte, strings and buffers as an int length (−1 for null) and
//! bytes, vectors as an int count (−1 for null) and items. Frames on the
//! wire are an int length and that many bytes.
//!
//! Decoding is bounded: every length is checked against what the frame
//! still holds and a named limit before anything is allocated, so a
//! malformed or hostile frame is an error, never a panic or a huge
//! allocation.

use crate::acl::{Acl, Id};
use crate::node::Stat;

/// Largest frame accepted: ZooKeeper's default `jute.maxbuffer` (1 MiB)
/// plus room for the request around the data.
pub const FRAME_BYTES_MAX: usize = (1 << 20) + (64 << 10);
/// Most items in one vector (children, ACL entries, watches, multi ops).
pub const VECTOR_ITEMS_MAX: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed packet at byte {offset}: {reason}")]
pub struct JuteError {
    pub offset: usize,
    pub reason: String,
}

pub type Result<T> = std::result::Result<T, JuteError>;

pub struct In<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> In<'a> {
    pub fn new(buf: &'a [u8]) -> In<'a> {
        In { buf, at: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    pub fn at(&self) -> usize {
        self.at
    }

    pub fn fail<T>(&self, reason: impl Into<String>) -> Result<T> {
        Err(JuteError {
            offset: self.at,
            reason: reason.into(),
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return self.fail(format!("needs {n} bytes, {} left", self.remaining()));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub fn int(&mut self) -> Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn long(&mut self) -> Result<i64> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn bool(&mut self) -> Result<bool> {
        Ok(self.take(1)?[0] != 0)
    }

    /// A buffer; null reads as empty.
    pub fn buffer(&mut self) -> Result<&'a [u8]> {
        let n = self.int()?;
        if n < 0 {
            return Ok(&[]);
        }
        self.take(n as usize)
    }

    /// A string; null reads as empty.
    pub fn string(&mut self) -> Result<String> {
        let at = self.at;
        let b = self.buffer()?;
        String::from_utf8(b.to_vec()).map_err(|_| JuteError {
            offset: at,
            reason: "string is not UTF-8".into(),
        })
    }

    /// A vector's count (null reads as 0), bounded by the limit and by the
    /// bytes left at `min_item_bytes` each.
    pub fn count(&mut self, min_item_bytes: usize) -> Result<usize> {
        let n = self.int()?;
        if n < 0 {
            return Ok(0);
        }
        let n = n as usize;
        if n > VECTOR_ITEMS_MAX || n.saturating_mul(min_item_bytes) > self.remaining() {
            return self.fail(format!("vector of {n} items cannot fit"));
        }
        Ok(n)
    }

    pub fn strings(&mut self) -> Result<Vec<String>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.string()).collect()
    }

    pub fn acl(&mut self) -> Result<Vec<Acl>> {
        let n = self.count(12)?;
        (0..n)
            .map(|_| {
                Ok(Acl {
                    perms: self.int()? as u32,
                    id: Id {
                        scheme: self.string()?,
                        id: self.string()?,
                    },
                })
            })
            .collect()
    }

    pub fn stat(&mut self) -> Result<Stat> {
        Ok(Stat {
            czxid: self.long()?,
            mzxid: self.long()?,
            ctime: self.long()?,
            mtime: self.long()?,
            version: self.int()?,
            cversion: self.int()?,
            aversion: self.int()?,
            ephemeral_owner: self.long()?,
            data_length: self.int()?,
            num_children: self.int()?,
            pzxid: self.long()?,
        })
    }
}

#[derive(Default)]
pub struct Out {
    pub buf: Vec<u8>,
}

impl Out {
    /// Starts a frame: a length placeholder patched by [`Out::finish`].
    pub fn frame() -> Out {
        Out { buf: vec![0; 4] }
    }

    /// Patches the frame length and returns the bytes.
    pub fn finish(mut self) -> Vec<u8> {
        let n = (self.buf.len() - 4) as i32;
        self.buf[..4].copy_from_slice(&n.to_be_bytes());
        self.buf
    }

    pub fn int(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn long(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }

    pub fn buffer(&mut self, b: &[u8]) {
        self.int(b.len() as i32);
        self.buf.extend_from_slice(b);
    }

    pub fn string(&mut self, s: &str) {
        self.buffer(s.as_bytes());
    }

    pub fn strings(&mut self, v: &[String]) {
        self.int(v.len() as i32);
        for s in v {
            self.string(s);
        }
    }

    pub fn acl(&mut self, acl: &[Acl]) {
        self.int(acl.len() as i32);
        for a in acl {
            self.int(a.perms as i32);
            self.string(&a.id.scheme);
            self.string(&a.id.id);
        }
    }

    pub fn stat(&mut self, s: &Stat) {
        self.long(s.czxid);
        self.long(s.mzxid);
        self.long(s.ctime);
        self.long(s.mtime);
        self.int(s.version);
        self.int(s.cversion);
        self.int(s.aversion);
        self.long(s.ephemeral_owner);
        self.int(s.data_length);
        self.int(s.num_children);
        self.long(s.pzxid);
    }
}

/// Splits complete frames off the front of `buf`: returns the payloads'
/// ranges and how many bytes they used, or an error for a frame length
/// that is negative or over [`FRAME_BYTES_MAX`].
pub fn split_frames(buf: &[u8]) -> Result<(Vec<std::ops::Range<usize>>, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        let n = i32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        if n < 0 || n as usize > FRAME_BYTES_MAX {
            return Err(JuteError {
                offset: at,
                reason: format!("frame length {n} outside 0..={FRAME_BYTES_MAX}"),
            });
        }
        let n = n as usize;
        if buf.len() - at - 4 < n {
            break;
        }
        out.push(at + 4..at + 4 + n);
        at += 4 + n;
    }
    Ok((out, at))
}
