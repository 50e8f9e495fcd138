//! The file seam. The keeper core reaches files only through [`Disk`]; the
//! real implementation (a data directory, fsync) lives in `nodes/node`,
//! and [`MemDisk`] here serves tests, with crashes and corruption on
//! demand.
//!
//! Contract every implementation keeps: bytes written by `append` or
//! `write` are durable only after `sync` of that file returns; `rename`
//! and `remove` are durable when they return (the real disk syncs the
//! directory). A crash loses exactly what was not durable.

use std::collections::BTreeMap;
use std::io;

pub trait Disk {
    /// Names of all files, sorted.
    fn list(&self) -> io::Result<Vec<String>>;
    fn read(&self, name: &str) -> io::Result<Vec<u8>>;
    fn len(&self, name: &str) -> io::Result<u64>;
    /// Appends to `name`, creating it if needed.
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// Creates or replaces `name` with `bytes`.
    fn write(&mut self, name: &str, bytes: &[u8]) -> io::Result<()>;
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Makes `name`'s bytes durable.
    fn sync(&mut self, name: &str) -> io::Result<()>;
    fn remove(&mut self, name: &str) -> io::Result<()>;
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
}

#[derive(Debug, Clone, Default)]
struct MemFile {
    current: Vec<u8>,
    /// What survives a crash; `None` for a file never synced.
    durable: Option<Vec<u8>>,
    /// Whether `current` is `durable` with appends after it (nothing
    /// rewritten or cut since the last sync): a sync then copies only the
    /// appended tail, not the whole file.
    appended_only: bool,
}

/// Operations a fault can be armed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskOp {
    Append,
    Write,
    Sync,
    Truncate,
    Remove,
    Rename,
}

/// What a crash does to a file's appended bytes that were not synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailFate {
    /// Lost.
    Drop,
    /// Kept whole (the kernel wrote them back before the power went).
    Keep,
    /// The first this many bytes kept.
    Torn(usize),
    /// The first `keep` bytes kept (at least one), every byte from
    /// `offset` (within what is kept, modulo its length) to the end
    /// flipped by `mask`: a write cut short whose last sector ends in
    /// garbage.
    Corrupt { keep: usize, offset: usize, mask: u8 },
}

/// An in-memory disk that models durability: a crash drops what was not
/// synced (optionally keeping a torn prefix of it), and faults can be
/// injected: an I/O error on the next op of a kind, or flipped bytes.
#[derive(Debug, Clone, Default)]
pub struct MemDisk {
    files: BTreeMap<String, MemFile>,
    /// Armed faults: the op, and the file it is limited to (None: any).
    fail_next: Vec<(DiskOp, Option<String>)>,
    pub syncs: u64,
}

impl MemDisk {
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// Makes the next `op` fail with an I/O error.
    pub fn fail_next(&mut self, op: DiskOp) {
        self.fail_next.push((op, None));
    }

    /// Makes the next `op` on the file `name` fail with an I/O error.
    pub fn fail_next_on(&mut self, op: DiskOp, name: &str) {
        self.fail_next.push((op, Some(name.to_string())));
    }

    fn check(&mut self, op: DiskOp, name: &str) -> io::Result<()> {
        let hit = self
            .fail_next
            .iter()
            .position(|(o, n)| *o == op && n.as_deref().is_none_or(|n| n == name));
        if let Some(i) = hit {
            self.fail_next.remove(i);
            return Err(io::Error::other(format!("injected {op:?} failure on {name}")));
        }
        Ok(())
    }

    /// A crash: every file reverts to its durable bytes; never-synced
    /// files vanish.
    pub fn crash(&mut self) {
        self.crash_keeping(|_, _| 0);
    }

    /// A crash where each file keeps `keep(name, unsynced_len)` bytes of
    /// its unsynced appended tail (a torn write). Only appends past the
    /// durable length can be torn; other changes revert.
    pub fn crash_keeping(&mut self, mut keep: impl FnMut(&str, usize) -> usize) {
        self.crash_with(|name, n| TailFate::Torn(keep(name, n)));
    }

    /// A crash where `fate(name, unsynced_len)` decides what becomes of
    /// each file's unsynced appended tail: lost, kept, torn, or kept with a
    /// flipped byte (as the kill modes of a simulated disk do). Only
    /// appends past the durable length survive in any form; other
    /// changes revert.
    pub fn crash_with(&mut self, mut fate: impl FnMut(&str, usize) -> TailFate) {
        let mut files = BTreeMap::new();
        for (name, f) in std::mem::take(&mut self.files) {
            let Some(durable) = f.durable else { continue };
            let mut data = durable.clone();
            if f.current.len() > durable.len() && f.current.starts_with(&durable) {
                let tail = &f.current[durable.len()..];
                match fate(&name, tail.len()) {
                    TailFate::Drop => {}
                    TailFate::Keep => data.extend_from_slice(tail),
                    TailFate::Torn(k) => data.extend_from_slice(&tail[..k.min(tail.len())]),
                    TailFate::Corrupt { keep, offset, mask } => {
                        let kept = &tail[..keep.clamp(1, tail.len())];
                        let at = data.len() + offset % kept.len();
                        data.extend_from_slice(kept);
                        for b in &mut data[at..] {
                            *b ^= mask.max(1);
                        }
                    }
                }
            }
            files.insert(
                name,
                MemFile {
                    current: data.clone(),
                    durable: Some(data),
                    appended_only: true,
                },
            );
        }
        self.files = files;
    }

    /// Flips bits of one byte (both the current and the durable copy:
    /// corruption at rest).
    pub fn flip(&mut self, name: &str, offset: usize, mask: u8) {
        let f = self.files.get_mut(name).expect("flip: no such file");
        f.current[offset] ^= mask;
        if let Some(d) = f.durable.as_mut() {
            if offset < d.len() {
                d[offset] ^= mask;
            }
        }
    }

    fn file(&self, name: &str) -> io::Result<&MemFile> {
        self.files
            .get(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such file")))
    }
}

impl Disk for MemDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.files.keys().cloned().collect())
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        Ok(self.file(name)?.current.clone())
    }

    fn len(&self, name: &str) -> io::Result<u64> {
        Ok(self.file(name)?.current.len() as u64)
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.check(DiskOp::Append, name)?;
        self.files
            .entry(name.to_string())
            .or_default()
            .current
            .extend_from_slice(bytes);
        Ok(())
    }

    fn write(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.check(DiskOp::Write, name)?;
        let f = self.files.entry(name.to_string()).or_default();
        f.current = bytes.to_vec();
        f.appended_only = false;
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.check(DiskOp::Truncate, name)?;
        let f = self
            .files
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))?;
        f.current.truncate(len as usize);
        f.appended_only = false;
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.check(DiskOp::Sync, name)?;
        let f = self
            .files
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))?;
        match f.durable.as_mut() {
            Some(d) if f.appended_only && d.len() <= f.current.len() => {
                let synced = d.len();
                d.extend_from_slice(&f.current[synced..]);
            }
            _ => f.durable = Some(f.current.clone()),
        }
        f.appended_only = true;
        self.syncs += 1;
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.check(DiskOp::Remove, name)?;
        self.files
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.check(DiskOp::Rename, from)?;
        let f = self
            .files
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_string()))?;
        self.files.insert(to.to_string(), f);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_only_synced_bytes_and_synced_files() {
        let mut d = MemDisk::new();
        d.append("a", b"12").unwrap();
        d.sync("a").unwrap();
        d.append("a", b"34").unwrap();
        d.append("b", b"x").unwrap();
        d.crash();
        assert_eq!(d.read("a").unwrap(), b"12");
        assert!(d.read("b").is_err());
    }

    #[test]
    fn a_sync_after_appends_or_after_a_rewrite_makes_exactly_the_current_bytes_durable() {
        let mut d = MemDisk::new();
        d.append("a", b"12").unwrap();
        d.sync("a").unwrap();
        d.append("a", b"34").unwrap();
        d.sync("a").unwrap();
        d.append("a", b"5").unwrap();
        d.crash();
        assert_eq!(d.read("a").unwrap(), b"1234", "appends synced twice");
        // a cut and a rewrite are not appends: the next sync copies all
        d.truncate("a", 1).unwrap();
        d.append("a", b"9").unwrap();
        d.sync("a").unwrap();
        d.crash();
        assert_eq!(d.read("a").unwrap(), b"19");
        d.write("a", b"xyz").unwrap();
        d.sync("a").unwrap();
        d.append("a", b"!").unwrap();
        d.sync("a").unwrap();
        d.crash();
        assert_eq!(d.read("a").unwrap(), b"xyz!");
    }

    #[test]
    fn torn_crash_keeps_a_prefix_of_the_unsynced_tail() {
        let mut d = MemDisk::new();
        d.append("a", b"12").unwrap();
        d.sync("a").unwrap();
        d.append("a", b"3456").unwrap();
        d.crash_keeping(|_, n| n / 2);
        assert_eq!(d.read("a").unwrap(), b"1234");
    }

    #[test]
    fn injected_failures_fire_once() {
        let mut d = MemDisk::new();
        d.fail_next(DiskOp::Append);
        assert!(d.append("a", b"1").is_err());
        assert!(d.append("a", b"1").is_ok());
    }
}
