//! A replica's parts on disk.
//!
//! ```text
//! <dir>/replica.txt          which replica of which table lives here
//! <dir>/parts/<part>/…       installed parts (files of drift_table::format)
//! <dir>/detached/<why>_<part>/  parts the replica will not use: unknown to
//!                            the coordinator, or failing their checksums
//! <dir>/tmp/                 parts being written; emptied at start
//! ```
//!
//! A part is written under `tmp/`, every file and the directory fsynced,
//! then renamed into `parts/` and `parts/` fsynced: a part in `parts/` is
//! whole, and after a crash there is no half part anywhere but `tmp/`.
//! A part is read back whole and checked against its checksums before it
//! is decoded or served.

use drift_table::format;
use drift_table::schema::Schema;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct PartStore {
    dir: PathBuf,
    tmp_seq: AtomicU64,
}

fn fsync_dir(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

fn err_at(p: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// Longest part directory name accepted from disk.
const NAME_BYTES_MAX: usize = 200;

impl PartStore {
    /// Opens (creating) the store and empties `tmp/`.
    pub fn open(dir: &Path) -> io::Result<PartStore> {
        for sub in ["parts", "detached", "tmp"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| err_at(&dir.join(sub), e))?;
        }
        let tmp = dir.join("tmp");
        for e in fs::read_dir(&tmp).map_err(|e| err_at(&tmp, e))? {
            let p = e?.path();
            fs::remove_dir_all(&p)
                .or_else(|_| fs::remove_file(&p))
                .map_err(|e| err_at(&p, e))?;
        }
        Ok(PartStore {
            dir: dir.to_path_buf(),
            tmp_seq: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What `replica.txt` says, if it exists: absent means this replica's
    /// disk is new (or was wiped).
    pub fn identity(&self) -> io::Result<Option<String>> {
        match fs::read_to_string(self.dir.join("replica.txt")) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err_at(&self.dir.join("replica.txt"), e)),
        }
    }

    pub fn set_identity(&self, text: &str) -> io::Result<()> {
        let tmp = self.dir.join("tmp").join("replica.txt");
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join("replica.txt"))?;
        fsync_dir(&self.dir)
    }

    /// Installs a part durably (see the module header).
    pub fn write_part(&self, name: &str, files: &BTreeMap<String, Vec<u8>>) -> io::Result<()> {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join("tmp").join(format!("{name}.{n}"));
        fs::create_dir(&tmp).map_err(|e| err_at(&tmp, e))?;
        for (f, bytes) in files {
            let p = tmp.join(f);
            let mut file = File::create(&p).map_err(|e| err_at(&p, e))?;
            file.write_all(bytes).map_err(|e| err_at(&p, e))?;
            file.sync_all().map_err(|e| err_at(&p, e))?;
        }
        fsync_dir(&tmp)?;
        let dest = self.dir.join("parts").join(name);
        if dest.exists() {
            fs::remove_dir_all(&tmp)?;
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("part {name} is already installed"),
            ));
        }
        fs::rename(&tmp, &dest).map_err(|e| err_at(&dest, e))?;
        fsync_dir(&self.dir.join("parts"))
    }

    /// A part's files, as they are on disk (not yet checked).
    pub fn read_files(&self, name: &str) -> io::Result<BTreeMap<String, Vec<u8>>> {
        let dir = self.dir.join("parts").join(name);
        let mut files = BTreeMap::new();
        for e in fs::read_dir(&dir).map_err(|e| err_at(&dir, e))? {
            let e = e?;
            let f = e.file_name().to_string_lossy().to_string();
            files.insert(f, fs::read(e.path()).map_err(|err| err_at(&e.path(), err))?);
        }
        Ok(files)
    }

    /// A part's files, checked against its checksums.
    pub fn read_checked(&self, schema: &Schema, name: &str) -> Result<BTreeMap<String, Vec<u8>>, String> {
        let files = self.read_files(name).map_err(|e| e.to_string())?;
        format::verify(schema, &files).map_err(|e| format!("part {name}: {e}"))?;
        Ok(files)
    }

    /// Names of installed parts.
    pub fn list(&self) -> io::Result<Vec<String>> {
        let dir = self.dir.join("parts");
        let mut v = Vec::new();
        for e in fs::read_dir(&dir).map_err(|e| err_at(&dir, e))? {
            let n = e?.file_name().to_string_lossy().to_string();
            if n.len() <= NAME_BYTES_MAX {
                v.push(n);
            }
        }
        v.sort();
        Ok(v)
    }

    /// Moves a part to `detached/<why>_<part>` (a later detach of the same
    /// name gets a numeric suffix).
    pub fn detach(&self, name: &str, why: &str) -> io::Result<()> {
        let from = self.dir.join("parts").join(name);
        let mut to = self.dir.join("detached").join(format!("{why}_{name}"));
        let mut n = 1;
        while to.exists() {
            to = self.dir.join("detached").join(format!("{why}_{name}_try{n}"));
            n += 1;
        }
        fs::rename(&from, &to).map_err(|e| err_at(&from, e))?;
        fsync_dir(&self.dir.join("parts"))
    }

    /// Names in `detached/`.
    pub fn detached(&self) -> io::Result<Vec<String>> {
        let dir = self.dir.join("detached");
        let mut v: Vec<String> = fs::read_dir(&dir)
            .map_err(|e| err_at(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().to_string()))
            .collect();
        v.sort();
        Ok(v)
    }

    /// Removes a part for good (renamed away first, so a crash midway
    /// leaves no half part under `parts/`).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let from = self.dir.join("parts").join(name);
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let to = self.dir.join("tmp").join(format!("delete_{name}.{n}"));
        fs::rename(&from, &to).map_err(|e| err_at(&from, e))?;
        fsync_dir(&self.dir.join("parts"))?;
        fs::remove_dir_all(&to)
    }

    /// Bytes of a part on disk.
    pub fn size_of(&self, name: &str) -> u64 {
        let dir = self.dir.join("parts").join(name);
        fs::read_dir(dir)
            .map(|it| it.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_installed_whole_detached_and_removed() {
        let dir = std::env::temp_dir().join(format!("drift-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = PartStore::open(&dir).unwrap();
        fs::write(dir.join("tmp").join("leftover"), b"x").unwrap();
        let s2 = PartStore::open(&dir).unwrap();
        assert!(
            fs::read_dir(dir.join("tmp")).unwrap().next().is_none(),
            "tmp emptied at open"
        );
        drop(s2);
        let files = BTreeMap::from([("a.bin".to_string(), b"123".to_vec())]);
        s.write_part("all_1_1_0", &files).unwrap();
        assert_eq!(s.read_files("all_1_1_0").unwrap(), files);
        assert_eq!(
            s.write_part("all_1_1_0", &files).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        s.write_part("all_2_2_0", &files).unwrap();
        assert_eq!(s.list().unwrap(), ["all_1_1_0", "all_2_2_0"]);
        s.detach("all_1_1_0", "unexpected").unwrap();
        s.remove("all_2_2_0").unwrap();
        assert!(s.list().unwrap().is_empty());
        assert_eq!(s.detached().unwrap(), ["unexpected_all_1_1_0"]);
        assert_eq!(s.identity().unwrap(), None);
        s.set_identity("r1").unwrap();
        assert_eq!(s.identity().unwrap().as_deref(), Some("r1"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
