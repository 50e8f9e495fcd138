//! drift-checkers: the history model and the checkers that judge it.
//!
//! Users run these on their own recorded histories (`drift check`), and
//! `drift test` runs them on the histories it records.
//!
//! # Layout
//! * [`history`] — the JSONL format: streaming reader, appending writer,
//!   per-line validation with file:line errors
//! * [`edn`] — Jepsen's `history.edn`, read as the same ops
//! * [`pairing`] — invokes paired with completions; split by key
//! * [`checker`] — the `Checker` trait, verdicts and their composition
//! * [`linear`] — linearizability (cas-register, kv)
//! * [`unique_ids`], [`set`], [`counter`], [`queue`], [`stats`] — Jepsen's
//!   other classic checkers
//! * [`perf`] — latency quantiles and throughput per `f` and fault window
//! * [`digest`] — the keeper's divergence detector, from nemesis events
//! * [`dedup`] — insert deduplication of the replicated table
//! * [`convergence`] — LWW kv replicas after heal and repair
//! * [`registry`] — checkers by name, as the CLI names them

pub mod checker;
pub mod convergence;
pub mod counter;
pub mod dedup;
pub mod digest;
pub mod edn;
pub mod ephemeral;
pub mod history;
pub mod linear;
pub mod name;
pub mod pairing;
pub mod perf;
pub mod queue;
pub mod registry;
pub mod rng;
pub mod set;
pub mod stats;
pub mod unique_ids;

pub use checker::{check_all, CheckContext, CheckResult, Checker, Composed, Verdict};
pub use history::{HistoryError, HistoryReader, HistoryWriter, Op, OpType, Process};
pub use name::Name;
pub use pairing::{History, Operation, Outcome, TimeOrder};
