//! The kv server's data and its log on disk: every change is written to
//! the log in the order it was applied (under the same lock), and synced
//! before the write that caused it is acknowledged.
//!
//! Group commit: a writer appends under the lock, leaves it, and waits for
//! a sync that covers its bytes; one `fdatasync` covers every writer that
//! appended before it started.
//!
//! Invariants: a change is in memory only if its record was appended
//! before the lock was released; an acknowledged write's record was
//! synced (`sync_to` returned). At start the log is read up to its first
//! torn record, cut there, and replayed. Past [`LOG_COMPACT_BYTES`] the log
//! is rewritten as an image of the state (written aside, synced, renamed
//! over, directory synced), so a crash leaves the old log or the new one.

use drift_repair::server::KvServer;
use drift_repair::wal;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The log is compacted once it is this long: replay at start reads it
/// whole, so its length bounds the restart time.
pub const LOG_COMPACT_BYTES: u64 = 64 << 20;

pub struct Durable {
    /// The server's state and decisions (drift_repair::server).
    pub server: KvServer,
    dir: PathBuf,
    file: Arc<File>,
    /// Bytes in the current log file.
    bytes: u64,
    /// Bumped by each compaction: a position is only comparable within one.
    generation: u64,
    fsync: bool,
}

/// Where the log ended after an append: what [`Syncer::sync_to`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub generation: u64,
    pub bytes: u64,
}

/// What opening found.
#[derive(Debug, Default)]
pub struct Opened {
    pub records: usize,
    /// Where a torn tail began and why, when there was one (it was cut).
    pub torn: Option<String>,
    /// Records of ranges this server no longer holds.
    pub skipped: usize,
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("log")
}

/// How long ago the server whose data lives in `dir` was last known up:
/// the log's modification time, which every append and every GC pass's
/// heartbeat ([`Durable::heartbeat`]) moves. `None` without a log.
pub fn absent_for(dir: &Path, now: std::time::SystemTime) -> Option<std::time::Duration> {
    let modified = std::fs::metadata(log_path(dir)).ok()?.modified().ok()?;
    Some(now.duration_since(modified).unwrap_or_default())
}

/// Sets a log that outlived its usefulness aside (`log.stale-<secs>`):
/// the server then starts empty and repair rebuilds it from its peers.
/// Returns where the log went.
pub fn set_aside(dir: &Path, now_secs: u64) -> std::io::Result<PathBuf> {
    let to = dir.join(format!("log.stale-{now_secs}"));
    std::fs::rename(log_path(dir), &to)?;
    sync_dir(dir)?;
    Ok(to)
}

impl Durable {
    /// Opens (or creates) the log under `dir` and replays it into `server`.
    pub fn open(dir: &Path, mut server: KvServer, fsync: bool) -> std::io::Result<(Durable, Opened)> {
        std::fs::create_dir_all(dir)?;
        let path = log_path(dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let decoded = wal::decode(&bytes);
        let opened = Opened {
            records: decoded.records.len(),
            torn: decoded.torn.clone(),
            skipped: server.replay(decoded.records),
        };
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        if decoded.valid_bytes as u64 != bytes.len() as u64 {
            // the torn tail never made it: cut it, so appends follow the
            // last whole record
            file.set_len(decoded.valid_bytes as u64)?;
            file.sync_all()?;
        }
        sync_dir(dir)?;
        let d = Durable {
            server,
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            bytes: decoded.valid_bytes as u64,
            generation: 0,
            fsync,
        };
        Ok((d, opened))
    }

    /// Appends every change since the last call; returns where the log
    /// ends now. Compacts when the log has grown past its limit.
    pub fn persist(&mut self) -> std::io::Result<Position> {
        let records = self.server.take_records();
        if !records.is_empty() {
            let mut buf = Vec::new();
            for r in &records {
                wal::encode(r, &mut buf);
            }
            (&*self.file).write_all(&buf)?;
            self.bytes += buf.len() as u64;
        }
        if self.bytes > LOG_COMPACT_BYTES {
            self.compact()?;
        }
        Ok(self.position())
    }

    /// Marks the server as up now (the log's modification time), for
    /// [`absent_for`] after a restart.
    pub fn heartbeat(&self) -> std::io::Result<()> {
        self.file.set_modified(std::time::SystemTime::now())
    }

    pub fn position(&self) -> Position {
        Position {
            generation: self.generation,
            bytes: self.bytes,
        }
    }

    fn compact(&mut self) -> std::io::Result<()> {
        let mut buf = Vec::new();
        for r in self.server.image() {
            wal::encode(&r, &mut buf);
        }
        let aside = self.dir.join("log.new");
        {
            let mut f = File::create(&aside)?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        std::fs::rename(&aside, log_path(&self.dir))?;
        sync_dir(&self.dir)?;
        self.file = Arc::new(OpenOptions::new().append(true).open(log_path(&self.dir))?);
        self.bytes = buf.len() as u64;
        self.generation += 1;
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Syncs the log for writers waiting on it, one sync for many.
#[derive(Default)]
pub struct Syncer {
    synced: Mutex<Option<Position>>,
}

impl Syncer {
    /// Returns once everything up to `pos` is on disk.
    pub fn sync_to(&self, durable: &Mutex<Durable>, pos: Position) -> std::io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        if synced.is_some_and(|s| s >= pos) {
            return Ok(());
        }
        let (file, upto, fsync) = {
            let d = durable.lock().unwrap_or_else(|p| p.into_inner());
            (d.file.clone(), d.position(), d.fsync)
        };
        if upto.generation > pos.generation {
            // a compaction since: it synced an image holding those bytes
            *synced = Some(upto.max(synced.unwrap_or(upto)));
            return Ok(());
        }
        if fsync {
            file.sync_data()?;
        }
        *synced = Some(upto);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_repair::ring::Ring;
    use drift_repair::Entry;

    fn server() -> KvServer {
        let ring = Ring::new(vec![1], 1).unwrap();
        let cfg = drift_repair::server::ServerConfig {
            id: 1,
            ring: ring.clone(),
            tree_depth: 4,
            w: 1,
            r: 1,
            gc: drift_repair::kv::GcMode::Time,
            gc_grace_ms: 10_000,
            gc_interval_ms: 1_000,
            repair_interval_ms: 0,
            request_timeout_ms: 1_000,
            seed: 1,
        };
        KvServer::new(cfg, drift_repair::kv::KvStore::new(1, ring, 4))
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("drift-kv-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn what_was_synced_is_there_after_a_reopen_and_a_torn_tail_is_cut() {
        let dir = tempdir("reopen");
        let (d, opened) = Durable::open(&dir, server(), true).unwrap();
        assert_eq!(opened.records, 0);
        let d = Mutex::new(d);
        let syncer = Syncer::default();
        for i in 0..10u64 {
            let pos = {
                let mut g = d.lock().unwrap();
                g.server
                    .merge(0, Entry::put(format!("k{i}").as_bytes(), i + 1, b"v"))
                    .unwrap();
                g.persist().unwrap()
            };
            syncer.sync_to(&d, pos).unwrap();
        }
        let want = d.lock().unwrap().server.store().dump();
        drop(d);
        // a crash mid-append: half a record at the end
        let mut f = OpenOptions::new().append(true).open(log_path(&dir)).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let (d, opened) = Durable::open(&dir, server(), true).unwrap();
        assert_eq!(opened.records, 10);
        assert!(opened.torn.is_some());
        assert_eq!(d.server.store().dump(), want);
        let (d2, opened) = Durable::open(&dir, server(), true).unwrap();
        assert!(opened.torn.is_none(), "the tail was cut at the first open");
        assert_eq!(d2.server.store().dump(), want);
        drop(d);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_compacted_log_replays_to_the_same_state() {
        let dir = tempdir("compact");
        let (mut d, _) = Durable::open(&dir, server(), false).unwrap();
        for i in 0..50u64 {
            d.server
                .merge(0, Entry::put(b"same", i + 1, format!("v{i}").as_bytes()))
                .unwrap();
        }
        d.persist().unwrap();
        let long = d.position().bytes;
        d.compact().unwrap();
        assert!(d.position().bytes < long / 10, "one entry left of fifty");
        assert_eq!(d.position().generation, 1);
        d.server.merge(0, Entry::tombstone(b"other", 3)).unwrap();
        d.persist().unwrap();
        let want = d.server.store().dump();
        drop(d);
        let (d, opened) = Durable::open(&dir, server(), false).unwrap();
        assert_eq!(d.server.store().dump(), want);
        assert!(opened.torn.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
