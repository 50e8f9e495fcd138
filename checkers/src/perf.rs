//! `perf`: latency quantiles and throughput per `f`, over the whole run and
//! per fault window (Jepsen's perf checker, as numbers rather than plots).
//!
//! * Latency is completion time − invoke time of the operations that
//!   succeeded, in an hdrhistogram (1 µs to 1 h, 3 significant digits).
//! * Throughput is succeeded operations per second of the span they fall
//!   in: from the first invoke to the last completion for the whole run,
//!   the time spent in that window for a window.
//! * A window is the set of faults active when an operation was invoked:
//!   `none`, `partition`, `kill+partition`, … from the nemesis's
//!   `start-<fault>` / `stop-<fault>` events (Jepsen's plain `start` /
//!   `stop` count as fault `nemesis`), and `final` from the `healed` event
//!   on (the heal's reads, which no fault touches).
//!
//! The verdict is `valid` once any operation completed: the numbers are a
//! report, not a judgement. [`summarize`] is the same report as data, for
//! `drift compare`, which recomputes it from each run's history so runs of
//! older versions compare too.

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

pub struct Perf;

/// Latency range the histograms hold, in µs: 1 µs to one hour.
const LATENCY_US_MAX: u64 = 3_600_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latency quantiles in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

/// One `f`'s (or all operations') numbers over one span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FStats {
    pub ok: u64,
    pub fail: u64,
    /// Indeterminate: `info` or never completed.
    pub info: u64,
    /// Succeeded operations per second of the span.
    pub ok_per_s: f64,
    /// Latency of the succeeded operations (`None` when none succeeded).
    pub latency_ms: Option<Quantiles>,
}

/// The numbers of one span: every `f`, and all of them together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub seconds: f64,
    pub all: FStats,
    pub by_f: BTreeMap<String, FStats>,
}

/// One fault window: the faults active, how long they were, what ran
/// (a window with time but no operation invoked in it is kept: clients
/// stuck through a whole fault are worth seeing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub window: String,
    #[serde(flatten)]
    pub span: Span,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerfSummary {
    #[serde(flatten)]
    pub run: Span,
    /// In the order they first began.
    pub windows: Vec<Window>,
}

/// Window label of the time after the heal.
pub const FINAL_WINDOW: &str = "final";
/// Window label of the time with no fault active.
pub const NO_FAULT_WINDOW: &str = "none";

impl PerfSummary {
    /// The report the `perf` checker stored in `results`, if it ran.
    pub fn from_results(results: &[CheckResult]) -> Option<PerfSummary> {
        let r = results.iter().find(|r| r.checker == "perf")?;
        serde_json::from_value(r.details.clone()).ok()
    }
}

impl Checker for Perf {
    fn name(&self) -> &str {
        "perf"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let summary = summarize(h);
        let details = serde_json::to_value(&summary).expect("perf summary serializes");
        if summary.run.all.ok + summary.run.all.fail == 0 {
            return Ok(CheckResult::unknown(
                self.name(),
                started,
                "no operation completed: nothing to measure",
                details,
            ));
        }
        Ok(CheckResult {
            checker: self.name().into(),
            verdict: Verdict::Valid,
            reason: None,
            elapsed_ms: elapsed_ms(started),
            details,
        })
    }
}

/// A nemesis event that starts or stops a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEdge<'a> {
    Start(&'a str),
    Stop(&'a str),
}

/// The fault a nemesis event `f` starts or stops: `start-<kind>` /
/// `stop-<kind>`, and Jepsen's plain `start` / `stop` as kind `nemesis`.
pub fn fault_edge(f: &str) -> Option<FaultEdge<'_>> {
    match f {
        "start" => Some(FaultEdge::Start("nemesis")),
        "stop" => Some(FaultEdge::Stop("nemesis")),
        _ => f
            .strip_prefix("start-")
            .map(FaultEdge::Start)
            .or_else(|| f.strip_prefix("stop-").map(FaultEdge::Stop)),
    }
}

/// Where the window label changes: (from this time on, label), in time
/// order, starting with `none` at the first line's time.
fn window_changes(h: &History) -> Vec<(i64, String)> {
    let start = h.ops.first().map_or(0, |o| o.time);
    let mut changes = vec![(start, NO_FAULT_WINDOW.to_string())];
    let mut active: BTreeMap<&str, u32> = BTreeMap::new();
    let mut healed = false;
    for &i in &h.nemesis {
        let op = &h.ops[i];
        match fault_edge(&op.f) {
            _ if op.f == "healed" => healed = true,
            Some(FaultEdge::Start(kind)) => *active.entry(kind).or_default() += 1,
            Some(FaultEdge::Stop(kind)) => {
                if let Some(n) = active.get_mut(kind) {
                    *n -= 1;
                    if *n == 0 {
                        active.remove(kind);
                    }
                }
            }
            None => continue,
        }
        let label = if healed {
            FINAL_WINDOW.to_string()
        } else if active.is_empty() {
            NO_FAULT_WINDOW.to_string()
        } else {
            active.keys().copied().collect::<Vec<_>>().join("+")
        };
        // a change at the same instant as the one before replaces it
        if changes.last().is_some_and(|(t, _)| *t == op.time) {
            changes.pop();
        }
        if changes.last().is_none_or(|(_, l)| *l != label) {
            changes.push((op.time, label));
        }
        if healed {
            break;
        }
    }
    changes
}

/// Collects one span's operations.
#[derive(Clone)]
struct Acc {
    seconds: f64,
    all: Counts,
    by_f: BTreeMap<String, Counts>,
}

#[derive(Clone)]
struct Counts {
    ok: u64,
    fail: u64,
    info: u64,
    latency: Histogram<u64>,
}

impl Counts {
    fn new() -> Counts {
        Counts {
            ok: 0,
            fail: 0,
            info: 0,
            latency: Histogram::new_with_bounds(1, LATENCY_US_MAX, SIGNIFICANT_DIGITS).expect("valid histogram bounds"),
        }
    }

    fn add(&mut self, outcome: Outcome, latency_ns: Option<i64>) {
        match outcome {
            Outcome::Ok => {
                self.ok += 1;
                if let Some(ns) = latency_ns {
                    // a completion stamped before its invoke (clock skew in a
                    // foreign history) counts as the shortest latency
                    let us = (ns.max(0) as u64 / 1_000).clamp(1, LATENCY_US_MAX);
                    self.latency.saturating_record(us);
                }
            }
            Outcome::Fail => self.fail += 1,
            Outcome::Info | Outcome::Pending => self.info += 1,
        }
    }

    fn stats(&self, seconds: f64) -> FStats {
        let h = &self.latency;
        let ms = |us: u64| us as f64 / 1e3;
        FStats {
            ok: self.ok,
            fail: self.fail,
            info: self.info,
            ok_per_s: if seconds > 0.0 { self.ok as f64 / seconds } else { 0.0 },
            latency_ms: (!h.is_empty()).then(|| Quantiles {
                p50: ms(h.value_at_quantile(0.5)),
                p90: ms(h.value_at_quantile(0.9)),
                p99: ms(h.value_at_quantile(0.99)),
                p999: ms(h.value_at_quantile(0.999)),
                max: ms(h.max()),
                mean: h.mean() / 1e3,
            }),
        }
    }
}

impl Acc {
    fn new() -> Acc {
        Acc {
            seconds: 0.0,
            all: Counts::new(),
            by_f: BTreeMap::new(),
        }
    }

    fn add(&mut self, f: &str, outcome: Outcome, latency_ns: Option<i64>) {
        self.all.add(outcome, latency_ns);
        match self.by_f.get_mut(f) {
            Some(c) => c.add(outcome, latency_ns),
            None => {
                let mut c = Counts::new();
                c.add(outcome, latency_ns);
                self.by_f.insert(f.to_string(), c);
            }
        }
    }

    fn span(&self) -> Span {
        Span {
            seconds: self.seconds,
            all: self.all.stats(self.seconds),
            by_f: self
                .by_f
                .iter()
                .map(|(f, c)| (f.clone(), c.stats(self.seconds)))
                .collect(),
        }
    }
}

/// The perf report of a history.
pub fn summarize(h: &History) -> PerfSummary {
    let changes = window_changes(h);
    let mut run = Acc::new();
    // windows in the order they first began; each change's window
    let mut windows: Vec<(String, Acc)> = Vec::new();
    let slots: Vec<usize> = changes
        .iter()
        .map(|(_, label)| match windows.iter().position(|(l, _)| l == label) {
            Some(k) => k,
            None => {
                windows.push((label.clone(), Acc::new()));
                windows.len() - 1
            }
        })
        .collect();
    // one window (no fault ever began): it is the run's, counted once
    let single = changes.len() == 1;
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for o in &h.operations {
        let invoked = h.ops[o.invoke].time;
        let completed = o.complete.map(|c| h.ops[c].time);
        first = first.min(invoked);
        last = last.max(completed.unwrap_or(invoked));
        let f = h.f_of(o);
        let latency = completed.map(|c| c.saturating_sub(invoked));
        run.add(f, o.outcome, latency);
        if single {
            continue;
        }
        // the window in force at the invoke: the last change at or before it
        let at = changes.partition_point(|(t, _)| *t <= invoked);
        windows[slots[at.saturating_sub(1)]].1.add(f, o.outcome, latency);
    }
    if first < last {
        run.seconds = last.saturating_sub(first) as f64 / 1e9;
        // each window's time: its stretches between changes, clipped to
        // the span the operations cover
        for (n, (from, _)) in changes.iter().enumerate() {
            let to = changes.get(n + 1).map_or(last, |(t, _)| *t);
            let (from, to) = ((*from).max(first), to.min(last));
            if to > from {
                windows[slots[n]].1.seconds += to.saturating_sub(from) as f64 / 1e9;
            }
        }
    }
    if single {
        let seconds = windows[0].1.seconds;
        windows[0].1 = Acc { seconds, ..run.clone() };
    }
    PerfSummary {
        run: run.span(),
        windows: windows
            .iter()
            .filter(|(_, acc)| acc.seconds > 0.0 || acc.all.ok + acc.all.fail + acc.all.info > 0)
            .map(|(label, acc)| Window {
                window: label.clone(),
                span: acc.span(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A history from `(process, type, f, time in ms)`; nemesis lines have
    /// type `nemesis`.
    fn history(lines: &[(u64, &str, &str, i64)]) -> History {
        let script: Vec<(u64, &str, &str, Value)> = lines.iter().map(|&(p, t, f, _)| (p, t, f, Value::Null)).collect();
        let mut h = History::from_script(&script).unwrap();
        for (op, &(_, _, _, ms)) in h.ops.iter_mut().zip(lines) {
            op.time = ms * 1_000_000;
        }
        h
    }

    #[test]
    fn latency_is_completion_minus_invoke_of_succeeded_ops_only() {
        let h = history(&[
            (1, "invoke", "read", 0),
            (1, "ok", "read", 10),
            (2, "invoke", "read", 0),
            (2, "ok", "read", 30),
            (3, "invoke", "write", 5),
            (3, "fail", "write", 500),
            (1, "invoke", "read", 40),
            (1, "info", "read", 1000),
        ]);
        let s = summarize(&h);
        let read = &s.run.by_f["read"];
        assert_eq!((read.ok, read.fail, read.info), (2, 0, 1));
        let q = read.latency_ms.unwrap();
        assert!((q.p50 - 10.0).abs() < 0.02, "p50 {}", q.p50);
        assert!((q.max - 30.0).abs() < 0.05, "max {}", q.max);
        assert!((q.mean - 20.0).abs() < 0.05, "mean {}", q.mean);
        let write = &s.run.by_f["write"];
        assert_eq!((write.ok, write.fail), (0, 1));
        assert_eq!(write.latency_ms, None, "a failed op's latency is not a success's");
        // span: first invoke 0 ms to last completion 1000 ms
        assert!((s.run.seconds - 1.0).abs() < 1e-9);
        assert!((read.ok_per_s - 2.0).abs() < 1e-9);
        assert_eq!(s.run.all.ok, 2);
    }

    #[test]
    fn ops_land_in_the_window_of_the_faults_active_at_their_invoke() {
        let h = history(&[
            (1, "invoke", "read", 0),
            (1, "ok", "read", 100),
            (0, "nemesis", "start-partition", 1000),
            (1, "invoke", "read", 1100),
            (1, "ok", "read", 1900),
            (0, "nemesis", "start-kill", 2000),
            (1, "invoke", "read", 2100),
            (1, "ok", "read", 2200),
            (0, "nemesis", "stop-partition", 3000),
            (0, "nemesis", "stop-kill", 3500),
            (1, "invoke", "read", 3600),
            (1, "ok", "read", 3700),
            (0, "nemesis", "healed", 4000),
            (1, "invoke", "read", 4100),
            (1, "ok", "read", 5000),
        ]);
        let s = summarize(&h);
        let names: Vec<&str> = s.windows.iter().map(|w| w.window.as_str()).collect();
        assert_eq!(names, ["none", "partition", "kill+partition", "kill", "final"]);
        let w = |name: &str| s.windows.iter().find(|w| w.window == name).unwrap();
        // none: 0–1000 and 3500–4000 ms; partition 1000–2000; both 2000–3000;
        // kill alone 3000–3500; final 4000–5000
        assert!((w("none").span.seconds - 1.5).abs() < 1e-9);
        assert!((w("partition").span.seconds - 1.0).abs() < 1e-9);
        assert!((w("kill+partition").span.seconds - 1.0).abs() < 1e-9);
        assert!((w("kill").span.seconds - 0.5).abs() < 1e-9);
        assert!((w("final").span.seconds - 1.0).abs() < 1e-9);
        assert_eq!(
            w("none").span.all.ok,
            2,
            "the first read and the one after both faults stopped"
        );
        assert_eq!(w("kill").span.all.ok, 0, "no op was invoked while only kill was active");
        let p = w("partition").span.by_f["read"].latency_ms.unwrap();
        assert!(
            (p.max - 800.0).abs() < 1.0,
            "the read under partition took 800 ms: {}",
            p.max
        );
        assert!((w("none").span.all.ok_per_s - 2.0 / 1.5).abs() < 1e-9);
    }

    #[test]
    fn jepsen_style_start_and_stop_make_a_nemesis_window() {
        let h = history(&[
            (0, "nemesis", "start", 0),
            (1, "invoke", "add", 1),
            (1, "ok", "add", 2),
            (0, "nemesis", "stop", 3),
            (1, "invoke", "add", 4),
            (1, "ok", "add", 5),
        ]);
        let names: Vec<String> = summarize(&h).windows.into_iter().map(|w| w.window).collect();
        assert_eq!(names, ["nemesis", "none"]);
    }

    #[test]
    fn a_history_where_nothing_completed_measures_nothing() {
        let h = history(&[(1, "invoke", "read", 0), (2, "invoke", "read", 1)]);
        let r = Perf
            .check(&h, &CheckContext::new(None, crate::checker::MEM_BYTES_DEFAULT))
            .unwrap();
        assert_eq!(r.verdict, Verdict::Unknown);
        assert_eq!(r.details["all"]["info"], json!(2));
    }

    #[test]
    fn the_report_round_trips_through_json() {
        let h = history(&[(1, "invoke", "read", 0), (1, "ok", "read", 7)]);
        let s = summarize(&h);
        let back: PerfSummary = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
