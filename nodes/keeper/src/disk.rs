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
    /// `len` bytes of `name` from `offset` (an error if the file is shorter).
    fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>>;
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
    /// Makes room for `name` to grow to `len` bytes (nothing if it has
    /// that room already) by appends that then allocate nothing (on a real file system, each append into new
    /// blocks is metadata its next sync must write too). What this
    /// handle's `read`, `read_at` and `len` return does not change; but
    /// other handles on the directory, and what a crash leaves, may show
    /// the room as zero bytes after what was written (after a power loss,
    /// also zeros between unsynced bytes that reached the disk): a reader
    /// of the files must take them for the end. After an error, reads and
    /// appends see what they saw before; the room may be partly written.
    /// A memory disk ([`MemDisk`]) only remembers how far the room
    /// reaches, for what a crash leaves.
    fn reserve(&mut self, name: &str, len: u64) -> io::Result<()> {
        let _ = (name, len);
        Ok(())
    }
}

#[derive(Debug, Clone, Default)]
struct MemFile {
    current: Vec<u8>,
    /// What survives a crash.
    durable: Durable,
    /// How far [`Disk::reserve`]'s room of zeros reaches (0: none): a
    /// crash leaves the file at least this long, the room's zeros after
    /// what survives of its bytes. A truncate or rewrite cuts it off.
    room_end: usize,
}

/// A file's durable bytes, kept without a second copy while only appends
/// follow the last sync (the changelog's whole life): a sync is then a
/// length, not a copy of the file.
#[derive(Debug, Clone, Default)]
enum Durable {
    /// Never synced: the file vanishes in a crash.
    #[default]
    Never,
    /// The first `n` bytes of `current`: nothing below `n` has changed
    /// since the sync.
    Prefix(usize),
    /// Bytes of their own, taken when a truncate or rewrite changed
    /// `current` below the synced length.
    Copy(Vec<u8>),
}

impl MemFile {
    /// Before `current` changes below byte `from`: keeps the synced bytes
    /// it would lose as a copy of their own.
    fn detach_below(&mut self, from: usize) {
        if let Durable::Prefix(n) = self.durable {
            if from < n {
                self.durable = Durable::Copy(self.current[..n].to_vec());
            }
        }
    }
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
    /// Kept whole but for the unsynced part of one aligned block of
    /// [`HOLE_BYTES`] inside the room reserved for it (the `block`-th
    /// such block, modulo their number; the first may hold synced bytes
    /// too, which it keeps), which reads as the room's zeros: a power
    /// loss that wrote a later page of the tail and not an earlier one.
    /// Kept whole where no such block lies within both the tail and the
    /// room.
    Hole { block: usize },
}

/// The block a [`TailFate::Hole`] loses: a page of the page cache.
pub const HOLE_BYTES: usize = 4096;

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
        self.crash_with(|name, n, _| TailFate::Torn(keep(name, n)));
    }

    /// A crash where `fate(name, unsynced_len, holes)` decides what
    /// becomes of each file's unsynced appended tail: lost, kept, torn,
    /// kept with a flipped byte, or kept with one of the `holes` blocks it
    /// could lose within its room (as the kill modes of a simulated disk
    /// do). Only appends past the durable length survive in any form;
    /// other changes revert. Room reserved for a file is left as zeros
    /// after what survives.
    pub fn crash_with(&mut self, mut fate: impl FnMut(&str, usize, usize) -> TailFate) {
        let mut files = BTreeMap::new();
        for (name, f) in std::mem::take(&mut self.files) {
            // the durable bytes, and the appended tail past them if any
            let (mut data, synced) = match f.durable {
                Durable::Never => continue,
                Durable::Prefix(n) => (f.current, n),
                Durable::Copy(d) if f.current.len() > d.len() && f.current.starts_with(&d) => {
                    let n = d.len();
                    (f.current, n)
                }
                Durable::Copy(d) => {
                    let n = d.len();
                    (d, n)
                }
            };
            let tail = data.len() - synced;
            // the blocks the tail reaches into (the first may begin with
            // synced bytes) that end inside both the tail and the room
            let first_hole = synced / HOLE_BYTES;
            let holes = (data.len().min(f.room_end) / HOLE_BYTES).saturating_sub(first_hole);
            let kept = if tail == 0 {
                0
            } else {
                match fate(&name, tail, holes) {
                    TailFate::Drop => 0,
                    TailFate::Keep => tail,
                    TailFate::Hole { block } => {
                        if holes > 0 {
                            let at = (first_hole + block % holes) * HOLE_BYTES;
                            data[at.max(synced)..at + HOLE_BYTES].fill(0);
                        }
                        tail
                    }
                    TailFate::Torn(k) => k.min(tail),
                    TailFate::Corrupt { keep, offset, mask } => {
                        let kept = keep.clamp(1, tail);
                        for b in &mut data[synced + offset % kept..synced + kept] {
                            *b ^= mask.max(1);
                        }
                        kept
                    }
                }
            };
            data.truncate(synced + kept);
            // the room's zeros after what is left
            if data.len() < f.room_end {
                data.resize(f.room_end, 0);
            }
            let len = data.len();
            files.insert(
                name,
                MemFile {
                    current: data,
                    durable: Durable::Prefix(len),
                    room_end: 0,
                },
            );
        }
        self.files = files;
    }

    /// A sync that began when the file was `len` bytes long ends: those
    /// bytes are durable; what was written after it began is not made so
    /// (it may be, on a real disk, but nothing may count on it).
    pub fn sync_prefix(&mut self, name: &str, len: usize) -> io::Result<()> {
        self.check(DiskOp::Sync, name)?;
        let f = self
            .files
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))?;
        let len = len.min(f.current.len());
        if !matches!(f.durable, Durable::Prefix(n) if n >= len) {
            f.durable = Durable::Prefix(len);
        }
        self.syncs += 1;
        Ok(())
    }

    /// Flips bits of one byte (both the current and the durable copy:
    /// corruption at rest).
    pub fn flip(&mut self, name: &str, offset: usize, mask: u8) {
        let f = self.files.get_mut(name).expect("flip: no such file");
        f.current[offset] ^= mask;
        if let Durable::Copy(d) = &mut f.durable {
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

    fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let f = &self.file(name)?.current;
        usize::try_from(offset)
            .ok()
            .and_then(|o| f.get(o..o.checked_add(len)?))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{name}: {len} bytes at {offset} past its end ({})", f.len()),
                )
            })
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
        f.detach_below(0);
        f.current = bytes.to_vec();
        f.room_end = 0;
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.check(DiskOp::Truncate, name)?;
        let f = self
            .files
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))?;
        f.detach_below(len as usize);
        f.current.truncate(len as usize);
        f.room_end = 0;
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.check(DiskOp::Sync, name)?;
        let f = self
            .files
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_string()))?;
        f.durable = Durable::Prefix(f.current.len());
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

    fn reserve(&mut self, name: &str, len: u64) -> io::Result<()> {
        let f = self.files.entry(name.to_string()).or_default();
        f.room_end = f.room_end.max(usize::try_from(len).unwrap_or(usize::MAX));
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
    fn an_unsynced_cut_or_rewrite_reverts_in_a_crash_and_keeps_no_tail() {
        let mut d = MemDisk::new();
        d.append("a", b"1234").unwrap();
        d.sync("a").unwrap();
        d.truncate("a", 2).unwrap();
        d.append("a", b"xyz").unwrap();
        d.flip("a", 0, 0xff);
        d.crash_with(|_, _, _| TailFate::Keep);
        assert_eq!(
            d.read("a").unwrap(),
            [!b'1', b'2', b'3', b'4'],
            "the synced bytes, flipped at rest"
        );
        d.write("a", b"12345678").unwrap();
        d.crash_with(|_, _, _| TailFate::Keep);
        assert_eq!(d.read("a").unwrap(), [!b'1', b'2', b'3', b'4']);
        // a cut above the synced length leaves the rest an appended tail
        d.append("a", b"56").unwrap();
        d.truncate("a", 5).unwrap();
        d.append("a", b"7").unwrap();
        d.crash_with(|_, n, _| {
            assert_eq!(n, 2);
            TailFate::Corrupt {
                keep: 2,
                offset: 1,
                mask: 1,
            }
        });
        assert_eq!(d.read("a").unwrap(), [!b'1', b'2', b'3', b'4', b'5', b'7' ^ 1]);
    }

    #[test]
    fn reserved_room_is_zeros_after_what_a_crash_leaves_and_a_hole_only_falls_inside_it() {
        let mut d = MemDisk::new();
        d.append("log", &[1u8; 100]).unwrap();
        d.reserve("log", 3 * HOLE_BYTES as u64).unwrap();
        d.sync("log").unwrap();
        d.append("log", &[2u8; 2 * HOLE_BYTES]).unwrap();
        assert_eq!(
            d.len("log").unwrap(),
            100 + 2 * HOLE_BYTES as u64,
            "the room is not seen"
        );
        let mut lost = d.clone();
        lost.crash_with(|_, _, _| TailFate::Drop);
        let bytes = lost.read("log").unwrap();
        assert_eq!(bytes.len(), 3 * HOLE_BYTES, "the room stays, as zeros");
        assert!(bytes[..100].iter().all(|&b| b == 1) && bytes[100..].iter().all(|&b| b == 0));
        // the tail runs from 100 to 8,292: it ends two blocks inside the
        // room, the first (0..4,096) holding the synced 100 bytes too
        let mut partial = d.clone();
        partial.crash_with(|_, n, holes| {
            assert_eq!((n, holes), (2 * HOLE_BYTES, 2));
            TailFate::Hole { block: 0 }
        });
        let bytes = partial.read("log").unwrap();
        assert!(bytes[..100].iter().all(|&b| b == 1), "the synced bytes stay");
        assert!(
            bytes[100..HOLE_BYTES].iter().all(|&b| b == 0),
            "the rest of the page lost"
        );
        assert!(
            bytes[HOLE_BYTES..100 + 2 * HOLE_BYTES].iter().all(|&b| b == 2),
            "the later page kept"
        );
        let mut holed = d.clone();
        holed.crash_with(|_, _, _| TailFate::Hole { block: 7 });
        let bytes = holed.read("log").unwrap();
        assert_eq!(bytes.len(), 3 * HOLE_BYTES);
        assert!(bytes[100..HOLE_BYTES].iter().all(|&b| b == 2), "before the hole: kept");
        assert!(bytes[HOLE_BYTES..2 * HOLE_BYTES].iter().all(|&b| b == 0), "the hole");
        assert!(
            bytes[2 * HOLE_BYTES..100 + 2 * HOLE_BYTES].iter().all(|&b| b == 2),
            "after it: kept"
        );
        assert!(bytes[100 + 2 * HOLE_BYTES..].iter().all(|&b| b == 0), "then the room");
        // a cut takes the room away: no zeros, and no block to lose
        d.truncate("log", 100).unwrap();
        d.append("log", &[3u8; 2 * HOLE_BYTES]).unwrap();
        d.crash_with(|_, _, holes| {
            assert_eq!(holes, 0);
            TailFate::Hole { block: 0 }
        });
        assert_eq!(d.read("log").unwrap().len(), 100 + 2 * HOLE_BYTES);
        assert!(d.read("log").unwrap()[100..].iter().all(|&b| b == 3));
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
    fn a_sync_prefix_makes_durable_what_the_file_held_when_the_sync_began_and_no_more() {
        let mut d = MemDisk::new();
        d.append("log", b"one").unwrap();
        d.append("log", b"two").unwrap();
        // the sync began after "one"; "two" came while it ran
        d.sync_prefix("log", 3).unwrap();
        let mut crashed = d.clone();
        crashed.crash();
        assert_eq!(crashed.read("log").unwrap(), b"one");
        // an older sync ending late takes nothing back
        d.sync("log").unwrap();
        d.sync_prefix("log", 3).unwrap();
        d.crash();
        assert_eq!(d.read("log").unwrap(), b"onetwo");
        assert_eq!(d.sync_prefix("gone", 1).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn injected_failures_fire_once() {
        let mut d = MemDisk::new();
        d.fail_next(DiskOp::Append);
        assert!(d.append("a", b"1").is_err());
        assert!(d.append("a", b"1").is_ok());
    }
}
