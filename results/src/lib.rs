//! drift-results: where runs live and how they are shown.
//!
//! # Layout
//! * [`store`] — the store of DESIGN.md: `<store>/<test>/<UTC timestamp>/`
//!   with `run.json`, `history.jsonl`, `results.json`, and `<store>/latest`
//! * [`files`] — the JSON files of a run (`run.json`, `results.json`)
//! * [`picture`] — the self-contained HTML/SVG picture of a
//!   linearizability violation
//! * [`time`] — UTC timestamps without a date library

pub mod files;
pub mod picture;
pub mod store;
pub mod time;

pub use store::{RunDir, Store};
