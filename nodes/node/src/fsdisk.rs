//! The real disk: one flat data directory.
//!
//! Durability as the `Disk` contract states it: `sync` is `fdatasync` of
//! the file; creating, renaming and removing a file also sync the
//! directory, so the name survives a power loss with its contents.
//! Names are plain file names; anything with a path separator or a
//! leading dot-dot is refused, so a name can never escape the directory.
//!
//! The file last appended to stays open: the changelog appends to one
//! segment and syncs it at every write the server makes, and opening it
//! anew each time cost a lookup, an open and a close per call.
//!
//! [`Disk::reserve`] writes zeros past that file's end, so later appends
//! overwrite blocks the file already has: an `fdatasync` after an append
//! that grows a file must also write the file's new size and block map
//! (on this machine's ext4, a second write and wait per sync); one into
//! written zeros only the data. ZooKeeper pads its log files for the same
//! reason. The zeros are hidden from `read`, `read_at` and `len` while
//! the file is held, and cut off when it is let go; a crash can leave them
//! in the file, which the `Disk` contract allows.

use drift_keeper::disk::Disk;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct FsDisk {
    dir: PathBuf,
    /// The file last appended to, opened for writing.
    open: Option<Held>,
}

/// The file appended to: its handle, where the written bytes end, and
/// where the file ends (past `end` only the zeros of [`Disk::reserve`]).
struct Held {
    name: String,
    file: File,
    end: u64,
    reserved: u64,
}

/// Zeros are written in pieces of at most this size.
const ZEROS_PIECE: usize = 256 << 10;

impl FsDisk {
    /// Opens (creating if needed) a data directory.
    pub fn open(dir: &Path) -> io::Result<FsDisk> {
        fs::create_dir_all(dir)?;
        Ok(FsDisk {
            dir: dir.to_path_buf(),
            open: None,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> io::Result<PathBuf> {
        if name.is_empty() || name.contains('/') || name.contains('\\') || name == "." || name == ".." {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad file name {name:?}"),
            ));
        }
        Ok(self.dir.join(name))
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    /// The held file, if it is `name`.
    fn held(&self, name: &str) -> Option<&Held> {
        self.open.as_ref().filter(|h| h.name == name)
    }

    /// `name` as the held file: kept if it is, else opened (creating it,
    /// and syncing the directory for a new name) after letting the held
    /// one go.
    fn hold(&mut self, name: &str) -> io::Result<&mut Held> {
        if self.held(name).is_none() {
            let path = self.path(name)?;
            let existed = path.exists();
            // let go before the new one opens: a failed open holds nothing
            self.let_go()?;
            let file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&path)?;
            if !existed {
                self.sync_dir()?;
            }
            let end = file.metadata()?.len();
            self.open = Some(Held {
                name: name.to_string(),
                file,
                end,
                reserved: end,
            });
        }
        Ok(self.open.as_mut().expect("held above"))
    }

    /// Closes the held file, cutting off the zeros reserved past its end.
    fn let_go(&mut self) -> io::Result<()> {
        match self.open.take() {
            Some(h) if h.reserved > h.end => h.file.set_len(h.end),
            _ => Ok(()),
        }
    }

    /// [`FsDisk::let_go`] if `name` is the held file (the name is about to
    /// be replaced, removed, renamed or cut).
    fn release(&mut self, name: &str) -> io::Result<()> {
        if self.held(name).is_some() {
            return self.let_go();
        }
        Ok(())
    }
}

impl Disk for FsDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                if let Some(n) = e.file_name().to_str() {
                    names.push(n.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let mut bytes = fs::read(self.path(name)?)?;
        if let Some(h) = self.held(name) {
            bytes.truncate(h.end as usize);
        }
        Ok(bytes)
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        if self
            .held(name)
            .is_some_and(|h| offset.saturating_add(len as u64) > h.end)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{name}: {len} bytes at {offset} run past its end"),
            ));
        }
        let mut buf = vec![0u8; len];
        File::open(self.path(name)?)?.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn len(&self, name: &str) -> io::Result<u64> {
        if let Some(h) = self.held(name) {
            return Ok(h.end);
        }
        Ok(fs::metadata(self.path(name)?)?.len())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let h = self.hold(name)?;
        h.file.write_all_at(bytes, h.end)?;
        h.end += bytes.len() as u64;
        h.reserved = h.reserved.max(h.end);
        Ok(())
    }

    fn write(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.release(name)?;
        let path = self.path(name)?;
        let existed = path.exists();
        fs::write(&path, bytes)?;
        if !existed {
            self.sync_dir()?;
        }
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.release(name)?;
        OpenOptions::new().write(true).open(self.path(name)?)?.set_len(len)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        if let Some(h) = self.held(name) {
            return h.file.sync_data();
        }
        OpenOptions::new().write(true).open(self.path(name)?)?.sync_data()
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        if self.held(name).is_some() {
            // its zeros go with it
            self.open = None;
        }
        fs::remove_file(self.path(name)?)?;
        self.sync_dir()
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.release(from)?;
        self.release(to)?;
        fs::rename(self.path(from)?, self.path(to)?)?;
        self.sync_dir()
    }

    fn reserve(&mut self, name: &str, len: u64) -> io::Result<()> {
        let h = self.hold(name)?;
        if len <= h.reserved {
            return Ok(());
        }
        let mut at = h.reserved;
        // counted before it is written: a reserve that fails part way is
        // still cut off when the file is let go
        h.reserved = len;
        let zeros = vec![0u8; ZEROS_PIECE.min((len - at) as usize)];
        while at < len {
            let n = zeros.len().min((len - at) as usize);
            h.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_keeper::changelog::{Changelog, Config, LogRecord};

    /// An empty directory of this test process's own, named by `tag`.
    fn fresh_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("drift-fsdisk-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn changelog_round_trips_through_real_files() {
        let dir = fresh_dir("log");
        let mut disk = FsDisk::open(&dir).unwrap();
        let (mut log, _) = Changelog::open(&mut disk, Config::default()).unwrap();
        let recs: Vec<LogRecord> = (1..=5)
            .map(|i| LogRecord {
                index: i,
                term: 1,
                kind: 0,
                data: vec![i as u8; 10],
            })
            .collect();
        log.append(&mut disk, &recs).unwrap();
        // with only the newest record in memory, the others are read back
        // from the real file (pread at the record's offset)
        let cfg = Config {
            cache_bytes: 0,
            ..Config::default()
        };
        let (again, report) = Changelog::open(&mut disk, cfg).unwrap();
        assert_eq!(report.torn_tail, None);
        assert_eq!(again.read_range(&disk, 1, 6).unwrap(), recs);
        assert!(again
            .get(&disk, 5)
            .unwrap()
            .is_some_and(|r| matches!(r, std::borrow::Cow::Borrowed(_))));
        assert!(disk.path("../x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Reserved room is zeros in the file past what was written: hidden
    /// from `read`, `read_at` and `len` while the file is held, written
    /// over by the next appends, and cut off when the file is let go.
    #[test]
    fn reserved_room_is_hidden_written_over_and_cut_off_when_let_go() {
        let dir = fresh_dir("room");
        let mut disk = FsDisk::open(&dir).unwrap();
        let on_disk = |n: &str| fs::metadata(dir.join(n)).unwrap().len();
        disk.append("x", b"ab").unwrap();
        disk.reserve("x", 4096).unwrap();
        assert_eq!(on_disk("x"), 4096, "the room is in the file");
        assert_eq!((disk.len("x").unwrap(), disk.read("x").unwrap()), (2, b"ab".to_vec()));
        assert!(disk.read_at("x", 1, 2).is_err(), "read past the written end");
        disk.append("x", b"cd").unwrap();
        disk.sync("x").unwrap();
        assert_eq!(on_disk("x"), 4096, "an append into the room does not grow the file");
        assert_eq!(disk.read("x").unwrap(), b"abcd");
        assert_eq!(disk.read_at("x", 1, 3).unwrap(), b"bcd");
        // a reserve below what is there changes nothing
        disk.reserve("x", 100).unwrap();
        assert_eq!(on_disk("x"), 4096);
        // the next file appended to lets this one go
        disk.append("y", b"e").unwrap();
        assert_eq!(on_disk("x"), 4);
        assert_eq!(disk.read("x").unwrap(), b"abcd");
        // and so do a rename, a cut and a rewrite of the held file
        disk.reserve("y", 512).unwrap();
        disk.rename("y", "z").unwrap();
        assert_eq!(on_disk("z"), 1);
        disk.reserve("z", 512).unwrap();
        disk.truncate("z", 0).unwrap();
        assert_eq!(on_disk("z"), 0);
        disk.reserve("z", 512).unwrap();
        disk.write("z", b"fg").unwrap();
        assert_eq!(on_disk("z"), 2);
        disk.reserve("z", 512).unwrap();
        disk.remove("z").unwrap();
        assert_eq!(disk.list().unwrap(), vec!["x".to_string()]);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A changelog that reserves room: its last segment holds zeros past
    /// its records, the segments it moved on from hold none, and a process
    /// that ends without letting the file go (a crash after the syncs)
    /// leaves a log the next open reads whole, with nothing torn, cutting
    /// the zeros off.
    #[test]
    fn a_changelog_left_with_reserved_room_reopens_whole_with_nothing_torn() {
        let dir = fresh_dir("log-room");
        let cfg = Config {
            rotate_interval: 4,
            reserve_bytes: 1024,
            ..Config::default()
        };
        let recs: Vec<LogRecord> = (1..=10)
            .map(|i| LogRecord {
                index: i,
                term: 1,
                kind: 0,
                data: vec![i as u8; 40],
            })
            .collect();
        {
            let mut disk = FsDisk::open(&dir).unwrap();
            let (mut log, _) = Changelog::open(&mut disk, cfg).unwrap();
            for pair in recs.chunks(2) {
                log.append(&mut disk, pair).unwrap();
            }
            let on_disk = |n: &str| fs::metadata(dir.join(n)).unwrap().len();
            let names = log.segment_names();
            assert_eq!(names.len(), 3);
            for n in &names[..2] {
                assert_eq!(on_disk(n), disk.len(n).unwrap(), "{n} keeps room it moved on from");
            }
            assert_eq!(on_disk(&names[2]), 1024, "the last segment's room");
            assert!(disk.len(&names[2]).unwrap() < 1024);
            // dropped holding the file: the zeros stay
        }
        let mut disk = FsDisk::open(&dir).unwrap();
        let last = drift_keeper::changelog::segment_name(9);
        assert_eq!(fs::metadata(dir.join(&last)).unwrap().len(), 1024);
        let (log, report) = Changelog::open(&mut disk, cfg).unwrap();
        assert_eq!(report.torn_tail, None);
        assert_eq!(log.read_range(&disk, 1, 11).unwrap(), recs);
        assert!(fs::metadata(dir.join(&last)).unwrap().len() < 1024, "the zeros cut off");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The held handle of the file last appended to never writes to a
    /// file that was cut, replaced, renamed or removed since.
    #[test]
    fn appends_land_in_the_file_the_name_holds_now() {
        let dir = fresh_dir("held");
        let mut disk = FsDisk::open(&dir).unwrap();
        let read = |d: &FsDisk, n: &str| String::from_utf8(d.read(n).unwrap()).unwrap();
        disk.append("x", b"ab").unwrap();
        disk.append("x", b"cd").unwrap();
        disk.sync("x").unwrap();
        assert_eq!(read(&disk, "x"), "abcd");
        disk.truncate("x", 1).unwrap();
        disk.append("x", b"e").unwrap();
        assert_eq!(read(&disk, "x"), "ae");
        disk.rename("x", "y").unwrap();
        disk.append("x", b"f").unwrap();
        assert_eq!((read(&disk, "x"), read(&disk, "y")), ("f".into(), "ae".into()));
        disk.append("y", b"g").unwrap();
        disk.rename("y", "x").unwrap();
        disk.append("x", b"h").unwrap();
        assert_eq!(read(&disk, "x"), "aegh");
        disk.write("x", b"i").unwrap();
        disk.append("x", b"j").unwrap();
        assert_eq!(read(&disk, "x"), "ij");
        disk.remove("x").unwrap();
        disk.append("x", b"k").unwrap();
        disk.sync("x").unwrap();
        assert_eq!(read(&disk, "x"), "k");
        assert_eq!(disk.list().unwrap(), vec!["x".to_string()]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
