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

use drift_keeper::disk::Disk;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub struct FsDisk {
    dir: PathBuf,
    /// The file last appended to, by name, opened for appending.
    open: Option<(String, File)>,
}

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

    /// The open handle of `name`, if it is the one held.
    fn held(&mut self, name: &str) -> Option<&mut File> {
        self.open.as_mut().filter(|(n, _)| n == name).map(|(_, f)| f)
    }

    /// Closes the held handle if it is `name`'s (the name is about to be
    /// replaced, removed, renamed or cut).
    fn release(&mut self, name: &str) {
        if self.open.as_ref().is_some_and(|(n, _)| n == name) {
            self.open = None;
        }
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
        fs::read(self.path(name)?)
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; len];
        File::open(self.path(name)?)?.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn len(&self, name: &str) -> io::Result<u64> {
        Ok(fs::metadata(self.path(name)?)?.len())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        if let Some(f) = self.held(name) {
            return f.write_all(bytes);
        }
        let path = self.path(name)?;
        let existed = path.exists();
        // closed before the new one opens: a failed open holds nothing
        self.open = None;
        let mut f = OpenOptions::new().create(true).append(true).open(&path)?;
        f.write_all(bytes)?;
        if !existed {
            self.sync_dir()?;
        }
        self.open = Some((name.to_string(), f));
        Ok(())
    }

    fn write(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.release(name);
        let path = self.path(name)?;
        let existed = path.exists();
        fs::write(&path, bytes)?;
        if !existed {
            self.sync_dir()?;
        }
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.release(name);
        OpenOptions::new().write(true).open(self.path(name)?)?.set_len(len)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        if let Some(f) = self.held(name) {
            return f.sync_data();
        }
        OpenOptions::new().write(true).open(self.path(name)?)?.sync_data()
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.release(name);
        fs::remove_file(self.path(name)?)?;
        self.sync_dir()
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.release(from);
        self.release(to);
        fs::rename(self.path(from)?, self.path(to)?)?;
        self.sync_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_keeper::changelog::{Changelog, Config, LogRecord};

    #[test]
    fn changelog_round_trips_through_real_files() {
        let dir = std::env::temp_dir().join(format!("drift-fsdisk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
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

    /// The held handle of the file last appended to never writes to a
    /// file that was cut, replaced, renamed or removed since.
    #[test]
    fn appends_land_in_the_file_the_name_holds_now() {
        let dir = std::env::temp_dir().join(format!("drift-fsdisk-held-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
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
