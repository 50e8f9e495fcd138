//! drift-results: where runs live and how they are shown.
//!
//! # Layout
//! * [`store`] — the store of docs/ARCHITECTURE.md: `<store>/<test>/<UTC timestamp>/`
//!   with `run.json`, `history.jsonl`, `results.json`, and `<store>/latest`
//! * [`files`] — the JSON files of a run (`run.json`, `results.json`)
//! * [`picture`] — the self-contained HTML/SVG picture of a
//!   linearizability violation
//! * [`report`] — `report.html`: the run's verdicts, latency and throughput
//!   plots with fault windows shaded, perf per window
//! * [`dedup_report`] — the report's dedup findings and insert timeline
//! * [`kv_report`] — the report's convergence findings, differing keys and repair timeline
//! * [`time`] — UTC timestamps without a date library

pub mod dedup_report;
pub mod files;
pub mod kv_report;
pub mod picture;
pub mod report;
pub mod store;
pub mod time;

pub use store::{RunDir, Store};
