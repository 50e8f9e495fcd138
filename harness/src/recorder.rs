//! The history recorder: every thread hands its ops to one writer thread
//! through a channel; the writer appends them in channel order (dense
//! indices) and flushes whenever nothing is queued, so a killed controller
//! leaves every op written so far on disk.
//!
//! Why channel order is a sound real-time order: an op's completion is
//! sent after its response arrived and the next op's invoke is sent
//! before its request leaves, so "completion before invoke" in the
//! history implies it in reality; the converse may be lost (more
//! concurrency than there was), which only makes the checkers lenient.

use drift_checkers::history::{HistoryWriter, Op, OpType, Process};
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

#[derive(Default)]
pub struct Counts {
    pub invoked: AtomicU64,
    pub ok: AtomicU64,
    pub fail: AtomicU64,
    pub info: AtomicU64,
    /// What the run waits for past its main phase (the progress line
    /// shows it): healing, a replica's sync, a repair pass, final reads.
    pub phase: std::sync::Mutex<Option<String>>,
}

#[derive(Clone)]
pub struct Recorder {
    tx: Sender<Op>,
    start: Instant,
    pub counts: Arc<Counts>,
}

pub struct RecorderHandle {
    join: JoinHandle<std::io::Result<u64>>,
}

impl RecorderHandle {
    /// Waits for the writer to drain (all senders must be gone); the
    /// number of ops written.
    pub fn finish(self) -> std::io::Result<u64> {
        self.join
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("history writer panicked")))
    }
}

impl Recorder {
    /// Says what the run waits for now, for the progress line.
    pub fn set_phase(&self, what: impl Into<String>) {
        if let Ok(mut p) = self.counts.phase.lock() {
            *p = Some(what.into());
        }
    }

    pub fn start(path: &Path, start: Instant) -> std::io::Result<(Recorder, RecorderHandle)> {
        let mut w = HistoryWriter::create(path)?;
        let (tx, rx) = mpsc::channel::<Op>();
        let join = std::thread::Builder::new().name("history".into()).spawn(move || {
            let mut n = 0u64;
            while let Ok(op) = rx.recv() {
                w.append_buffered(&op)?;
                n += 1;
                while let Ok(op) = rx.try_recv() {
                    w.append_buffered(&op)?;
                    n += 1;
                }
                w.flush()?;
            }
            w.flush()?;
            Ok(n)
        })?;
        Ok((
            Recorder {
                tx,
                start,
                counts: Arc::default(),
            },
            RecorderHandle { join },
        ))
    }

    pub fn elapsed_ns(&self) -> i64 {
        self.start.elapsed().as_nanos() as i64
    }

    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        process: Process,
        kind: OpType,
        f: &str,
        value: Value,
        key: Option<String>,
        node: Option<String>,
        error: Option<String>,
    ) {
        let c = &self.counts;
        match (process, kind) {
            (Process::Nemesis, _) => {}
            (_, OpType::Invoke) => {
                c.invoked.fetch_add(1, Ordering::Relaxed);
            }
            (_, OpType::Ok) => {
                c.ok.fetch_add(1, Ordering::Relaxed);
            }
            (_, OpType::Fail) => {
                c.fail.fetch_add(1, Ordering::Relaxed);
            }
            (_, OpType::Info) => {
                c.info.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = self.tx.send(Op {
            index: 0,
            time: self.elapsed_ns(),
            process,
            kind,
            f: f.into(),
            value,
            key: key.map(Into::into),
            node: node.map(Into::into),
            error,
        });
    }

    /// A nemesis event on the timeline.
    pub fn event(&self, f: &str, value: Value) {
        self.record(Process::Nemesis, OpType::Info, f, value, None, None, None);
    }
}
