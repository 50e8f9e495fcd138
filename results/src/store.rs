//! The result store (docs/ARCHITECTURE.md, "Store"):
//!
//! ```text
//! <store>/<test-name>/<UTC timestamp>/
//!   run.json  history.jsonl  results.json  report.html  nodes/<node>/
//! <store>/latest -> <test-name>/<UTC timestamp>
//! ```
//!
//! Invariants: a run directory is never reused (a timestamp collision gets
//! a suffix); JSON files are replaced atomically (write to a temporary
//! file, sync, rename), so a reader sees the old file or the new one, never
//! a torn one; `latest` is swapped atomically the same way.

use serde::Serialize;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub const RUN_JSON: &str = "run.json";
pub const HISTORY: &str = "history.jsonl";
pub const RESULTS_JSON: &str = "results.json";
pub const REPORT_HTML: &str = "report.html";
pub const LATEST: &str = "latest";

/// Most suffixes tried when two runs start in the same millisecond.
const COLLISIONS_MAX: u32 = 1000;

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates a fresh run directory for `test_name`.
    pub fn create_run(&self, test_name: &str) -> io::Result<RunDir> {
        validate_name(test_name)?;
        let parent = self.root.join(test_name);
        fs::create_dir_all(&parent)?;
        let stamp = crate::time::dir_stamp(SystemTime::now());
        for n in 0..COLLISIONS_MAX {
            let name = if n == 0 { stamp.clone() } else { format!("{stamp}-{n}") };
            let path = parent.join(&name);
            match fs::create_dir(&path) {
                Ok(()) => return Ok(RunDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!(
            "{}: {COLLISIONS_MAX} runs with the same timestamp",
            parent.display()
        )))
    }

    /// Points `<store>/latest` at `run` (a relative link, so the store can
    /// be moved), replacing the old link atomically.
    pub fn set_latest(&self, run: &RunDir) -> io::Result<()> {
        let target = run
            .path
            .strip_prefix(&self.root)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| run.path.clone());
        let tmp = self.root.join(format!(".latest.{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        fs::rename(&tmp, self.root.join(LATEST))
    }

    /// The run `latest` points at, if any.
    pub fn latest(&self) -> Option<RunDir> {
        let path = fs::canonicalize(self.root.join(LATEST)).ok()?;
        Some(RunDir { path })
    }
}

fn validate_name(name: &str) -> io::Result<()> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name != LATEST
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("test name {name:?} must be non-empty and use only letters, digits, '-', '_' and '.'"),
        ))
    }
}

/// A directory's entries, sorted by name.
pub fn entries(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    out.sort();
    Ok(out)
}

/// Whether `dir` is a run: it holds a history.
pub fn is_run(dir: &Path) -> bool {
    dir.join(HISTORY).is_file()
}

/// The runs of a test directory, oldest first: their names are UTC
/// timestamps, so name order is time order.
pub fn runs_of(test_dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut runs = entries(test_dir)?;
    runs.retain(|p| is_run(p));
    Ok(runs)
}

/// One run's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Opens an existing run directory: it must hold a history.
    pub fn open(path: &Path) -> Result<RunDir, String> {
        if !path.is_dir() {
            return Err(format!("{}: not a directory", path.display()));
        }
        if !is_run(path) {
            return Err(format!("{}: not a run directory (no {HISTORY})", path.display()));
        }
        Ok(RunDir {
            path: path.to_path_buf(),
        })
    }

    pub fn run_json(&self) -> PathBuf {
        self.path.join(RUN_JSON)
    }

    pub fn history(&self) -> PathBuf {
        self.path.join(HISTORY)
    }

    pub fn results_json(&self) -> PathBuf {
        self.path.join(RESULTS_JSON)
    }

    pub fn report_html(&self) -> PathBuf {
        self.path.join(REPORT_HTML)
    }

    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.path.join("nodes").join(node)
    }

    /// Writes `value` as pretty JSON to `name` in this run, atomically.
    pub fn write_json<T: Serialize>(&self, name: &str, value: &T) -> io::Result<PathBuf> {
        let mut bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.write_file(name, &bytes)
    }

    /// Writes `bytes` to `name` in this run, atomically.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> io::Result<PathBuf> {
        write_atomic(&self.path.join(name), bytes)
    }
}

/// Replaces `path` with `bytes`: temporary file, sync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
    }
    fs::rename(&tmp, path)?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("drift-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn runs_in_the_same_millisecond_get_distinct_dirs_and_latest_follows() {
        let root = scratch("distinct");
        let store = Store::new(&root);
        let a = store.create_run("t").unwrap();
        let b = store.create_run("t").unwrap();
        assert_ne!(a, b);
        store.set_latest(&a).unwrap();
        store.set_latest(&b).unwrap();
        let latest = store.latest().unwrap();
        assert_eq!(latest.path, fs::canonicalize(&b.path).unwrap());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn bad_test_names_are_refused() {
        let store = Store::new(scratch("names"));
        for bad in ["", "..", "a/b", "latest", "x y"] {
            assert!(store.create_run(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn open_requires_a_history() {
        let root = scratch("open");
        fs::create_dir_all(&root).unwrap();
        assert!(RunDir::open(&root).unwrap_err().contains("no history.jsonl"));
        fs::write(root.join(HISTORY), b"").unwrap();
        assert!(RunDir::open(&root).is_ok());
        fs::remove_dir_all(&root).unwrap();
    }
}
