//! The simulated disk: [`MemDisk`]'s durability model, plus a crash that
//! can strike in the middle of a server's write sequence.
//!
//! Armed with [`SimDisk::crash_after`], the disk fails every operation
//! from the n-th on: the server sees an I/O error, halts (it sends
//! nothing more), and the simulator treats it as dead at that point. What
//! it appended but did not sync then meets the kill mode of
//! [`SimDisk::reboot`]: dropped, kept, torn at a sector boundary, or cut
//! anywhere with its last sector ending in garbage — FoundationDB's kill modes,
//! for a disk that persists a file's appends in order (what reaches the
//! platter is a prefix of what was written). A disk that persists the
//! sectors of one unsynced write out of order — a damaged record with
//! intact ones after it — is not modelled: the changelog refuses to start
//! on that, as it must on a damaged synced record it cannot tell apart.

use super::rng::SimRng;
use crate::disk::{Disk, MemDisk, TailFate};
use std::io;

/// Bytes per sector: a torn write keeps whole sectors.
pub const SECTOR: usize = 512;

#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    pub mem: MemDisk,
    /// Operations left before the crash strikes (`None`: not armed).
    crash_in: Option<u64>,
    crashed: bool,
}

/// How a crash treats unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMode {
    /// Every unsynced byte lost (a clean power cut).
    Drop,
    /// Each file's unsynced tail kept, dropped, torn or corrupted, drawn
    /// per file.
    Mixed,
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Makes the `n`-th mutating operation from now (1: the next) and
    /// every one after it fail, as a process that died there.
    pub fn crash_after(&mut self, n: u64) {
        self.crash_in = Some(n.max(1));
    }

    /// Whether a crash is armed and has not struck yet.
    pub fn armed(&self) -> bool {
        self.crash_in.is_some()
    }

    /// Whether an armed crash struck.
    pub fn crashed(&self) -> bool {
        self.crashed
    }

    /// The disk as a restarted server finds it: durable bytes, and each
    /// unsynced tail as `mode` decides (drawn from `rng`).
    pub fn reboot(&mut self, mode: KillMode, rng: &mut SimRng) {
        self.crash_in = None;
        self.crashed = false;
        self.mem.crash_with(|_, n, holes| match mode {
            KillMode::Drop => TailFate::Drop,
            KillMode::Mixed => match rng.below(4) {
                0 => TailFate::Drop,
                // where the tail covers a block of its room, one keep in
                // two loses a block of it (drawn only then: a run whose
                // tails never cover one draws as it did)
                1 if holes > 0 && rng.below(2) == 0 => TailFate::Hole {
                    block: rng.below(holes as u64) as usize,
                },
                1 => TailFate::Keep,
                2 => TailFate::Torn((rng.below(n as u64 + 1) as usize / SECTOR) * SECTOR),
                _ => {
                    // cut anywhere, the last sector written ending in
                    // garbage
                    let keep = 1 + rng.below(n as u64) as usize;
                    let last_sector = keep.min(SECTOR);
                    TailFate::Corrupt {
                        keep,
                        offset: keep - 1 - rng.below(last_sector as u64) as usize,
                        mask: 1 << rng.below(8),
                    }
                }
            },
        });
    }

    /// A sync begun when the file was `len` bytes long ends (see
    /// [`MemDisk::sync_prefix`]); a disk operation like any other for an
    /// armed crash.
    pub fn sync_prefix(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.step("sync", name)?;
        self.mem.sync_prefix(name, len as usize)
    }

    fn step(&mut self, what: &str, name: &str) -> io::Result<()> {
        if let Some(left) = self.crash_in.as_mut() {
            *left -= 1;
            if *left == 0 {
                self.crash_in = None;
                self.crashed = true;
            }
        }
        if self.crashed {
            return Err(io::Error::other(format!("simulated crash before {what} {name}")));
        }
        Ok(())
    }
}

impl Disk for SimDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        self.mem.list()
    }
    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        self.mem.read(name)
    }
    fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.mem.read_at(name, offset, len)
    }
    fn len(&self, name: &str) -> io::Result<u64> {
        self.mem.len(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.step("append", name)?;
        self.mem.append(name, bytes)
    }
    fn write(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.step("write", name)?;
        self.mem.write(name, bytes)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.step("truncate", name)?;
        self.mem.truncate(name, len)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.step("sync", name)?;
        self.mem.sync(name)
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.step("remove", name)?;
        self.mem.remove(name)
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.step("rename", from)?;
        self.mem.rename(from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_crash_fails_that_op_and_every_later_one_and_reboot_applies_the_kill_mode() {
        let mut d = SimDisk::new();
        d.append("log", b"durable").unwrap();
        d.sync("log").unwrap();
        d.crash_after(2);
        d.append("log", &[7u8; 2000]).unwrap();
        assert!(d.sync("log").is_err(), "the second op from arming is the crash");
        assert!(d.append("log", b"x").is_err(), "nothing after it happens");
        assert!(d.crashed());
        let mut rng = SimRng::new(1);
        let (mut dropped, mut kept, mut torn, mut garbage) = (0, 0, 0, 0);
        for _ in 0..80 {
            let mut copy = d.clone();
            copy.reboot(KillMode::Mixed, &mut rng);
            let bytes = copy.read("log").unwrap();
            assert!(bytes.starts_with(b"durable"));
            let tail = &bytes[7..];
            // what was written, then (for the corrupt mode) garbage to the
            // end, within the last sector
            let good = tail.iter().take_while(|&&b| b == 7).count();
            assert!(tail[good..].iter().all(|&b| b != 7), "garbage runs to the end");
            assert!(tail.len() - good <= SECTOR, "garbage only in the last sector");
            match (tail.len(), good == tail.len()) {
                (0, _) => dropped += 1,
                (2000, true) => kept += 1,
                (n, true) => {
                    assert_eq!(n % SECTOR, 0, "a torn write keeps whole sectors");
                    torn += 1
                }
                (_, false) => garbage += 1,
            }
        }
        assert!(
            dropped > 0 && kept > 0 && torn > 0 && garbage > 0,
            "dropped {dropped}, kept {kept}, torn {torn}, garbage {garbage}"
        );
        d.reboot(KillMode::Drop, &mut rng);
        assert_eq!(d.read("log").unwrap(), b"durable");
        assert!(d.append("log", b"y").is_ok(), "a rebooted disk works");
    }
}
