//! The log entry: what the leader proposes and every replica applies.
//!
//! Layout (big-endian), format version [`FORMAT_VERSION`]:
//! `format u8 | zxid i64 | time_ms i64 | session i64 | digest_version u8 |
//! digest u64 (present unless version is 0) | request`.
//!
//! The leader fills zxid, time and the digest after preprocess (as ClickHouse Keeper does:
//! under one lock, in log order); a follower checks its own digest against
//! the carried one after preprocess and after commit.

use crate::codec::{DecodeError, Reader, Writer};
use crate::digest::{Digest, NO_DIGEST};
use crate::request::Write;
use std::fmt;

pub const FORMAT_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub zxid: i64,
    pub time_ms: i64,
    pub session: i64,
    pub digest: Digest,
    pub request: Write,
}

impl Entry {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FORMAT_VERSION);
        w.i64(self.zxid);
        w.i64(self.time_ms);
        w.i64(self.session);
        w.u8(self.digest.version);
        if self.digest.version != NO_DIGEST {
            w.u64(self.digest.value);
        }
        self.request.encode(&mut w);
        w.buf
    }

    pub fn decode(bytes: &[u8]) -> Result<Entry, DecodeError> {
        let mut r = Reader::new(bytes);
        let format = r.u8()?;
        if format == 0 || format > FORMAT_VERSION {
            return r.error(format!(
                "log entry format {format} is not supported (this build reads 1..={FORMAT_VERSION})"
            ));
        }
        let zxid = r.i64()?;
        let time_ms = r.i64()?;
        let session = r.i64()?;
        let version = r.u8()?;
        let value = if version != NO_DIGEST { r.u64()? } else { 0 };
        let request = Write::decode(&mut r)?;
        r.finish()?;
        Ok(Entry {
            zxid,
            time_ms,
            session,
            digest: Digest { version, value },
            request,
        })
    }
}

/// Where a digest check ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Preprocess,
    Commit,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Preprocess => "preprocess",
            Phase::Commit => "commit",
        })
    }
}

/// A replica's tree disagrees with the leader's: fatal by design. The
/// driver prints it as one FATAL line and aborts the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestMismatch {
    pub log_index: u64,
    pub phase: Phase,
    pub request: String,
    /// The leader's digest, whose version is the one both were computed by.
    pub expected: Digest,
    pub actual: Digest,
}

impl DigestMismatch {
    /// Its fields as its log line carries them, on a node and in the
    /// simulator alike.
    pub fn log_fields(&self) -> serde_json::Value {
        serde_json::json!({
            "log_index": self.log_index, "phase": self.phase.to_string(), "request": self.request,
            "expected": format!("{:#018x}", self.expected.value), "actual": format!("{:#018x}", self.actual.value),
            "digest_version": self.expected.version,
        })
    }
}

impl fmt::Display for DigestMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "digest mismatch at log index {} after {}: expected {:#018x}, actual {:#018x} (digest version {}); request {}",
            self.log_index, self.phase, self.expected.value, self.actual.value, self.expected.version, self.request
        )
    }
}

/// Compares a carried digest with the local one.
pub fn check_digest(log_index: u64, phase: Phase, entry: &Entry, actual: Digest) -> Result<(), DigestMismatch> {
    if entry.digest.mismatches(actual) {
        return Err(DigestMismatch {
            log_index,
            phase,
            request: entry.request.describe(),
            expected: entry.digest,
            actual,
        });
    }
    Ok(())
}
