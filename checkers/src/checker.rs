//! The checker seam: a checker reads a whole history and returns a verdict
//! with details. Checkers compose; the composed verdict is the worst one
//! (invalid > unknown > valid), and a checker that panics yields `unknown`
//! with the panic message — a bug in one checker never loses the others'
//! verdicts.
//!
//! A checker must not write files or print: it returns data, and the
//! caller (harness, results) decides what to store and show.

use crate::history::HistoryError;
use crate::pairing::History;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The outcome of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Ordered by severity: the composition of verdicts is their maximum.
    Valid,
    Unknown,
    Invalid,
}

impl Verdict {
    /// Composes two verdicts: invalid > unknown > valid.
    pub fn and(self, other: Verdict) -> Verdict {
        self.max(other)
    }

    /// The process exit code docs/ARCHITECTURE.md assigns: 0 valid, 1 invalid, 2 unknown.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }

    /// `Valid` when `ok`, else `Invalid`.
    pub fn valid_if(ok: bool) -> Verdict {
        if ok {
            Verdict::Valid
        } else {
            Verdict::Invalid
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Valid => "valid",
            Verdict::Invalid => "invalid",
            Verdict::Unknown => "unknown",
        }
    }
}

/// One checker's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub checker: String,
    pub verdict: Verdict,
    /// Why the verdict is `unknown` (budget, panic, missing data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub elapsed_ms: f64,
    /// Checker-specific findings.
    pub details: Value,
}

impl CheckResult {
    /// `unknown`, with why: the history holds nothing this checker can
    /// judge (a run that tested nothing must not pass as valid).
    pub fn unknown(checker: &str, started: Instant, reason: impl Into<String>, details: Value) -> CheckResult {
        CheckResult {
            checker: checker.to_string(),
            verdict: Verdict::Unknown,
            reason: Some(reason.into()),
            elapsed_ms: elapsed_ms(started),
            details,
        }
    }
}

/// Limits every checker of one composed check shares.
#[derive(Debug, Clone, Copy)]
pub struct CheckContext {
    /// When the whole check must end (`None`: no time limit).
    pub deadline: Option<Instant>,
    /// Cap on the memory a checker's search may hold (all its threads).
    pub mem_bytes_max: usize,
    /// Threads a checker may use (keys judged in parallel); at least 1.
    pub jobs: usize,
}

/// Default memory cap for a search: well under this machine kind's RAM,
/// so a hard history ends `unknown` rather than swapping or being killed.
pub const MEM_BYTES_DEFAULT: usize = 2 << 30;

impl CheckContext {
    pub fn new(budget: Option<Duration>, mem_bytes_max: usize) -> Self {
        CheckContext {
            deadline: budget.map(|b| Instant::now() + b),
            mem_bytes_max,
            jobs: 1,
        }
    }

    /// The same limits, with `jobs` threads (at least 1).
    pub fn with_jobs(mut self, jobs: usize) -> Self {
        self.jobs = jobs.max(1);
        self
    }

    /// Every core this machine offers.
    pub fn all_cores() -> usize {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}

pub trait Checker {
    fn name(&self) -> &str;
    /// Checks `history`. Returns `Err` only for input the checker cannot
    /// interpret (an op of the wrong shape for its model), naming the line.
    fn check(&self, history: &History, ctx: &CheckContext) -> Result<CheckResult, HistoryError>;
}

/// All checkers' results and their composed verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Composed {
    pub verdict: Verdict,
    pub results: Vec<CheckResult>,
}

/// Runs every checker; a panicking checker becomes `unknown`.
pub fn check_all(
    checkers: &[Box<dyn Checker>],
    history: &History,
    ctx: &CheckContext,
) -> Result<Composed, HistoryError> {
    let mut results = Vec::with_capacity(checkers.len());
    for checker in checkers {
        let started = Instant::now();
        let result = match catch_unwind(AssertUnwindSafe(|| checker.check(history, ctx))) {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(e),
            Err(panic) => CheckResult {
                checker: checker.name().to_string(),
                verdict: Verdict::Unknown,
                reason: Some(format!("checker panicked: {}", panic_message(&panic))),
                elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
                details: Value::Null,
            },
        };
        results.push(result);
    }
    let verdict = results.iter().fold(Verdict::Valid, |v, r| v.and(r.verdict));
    Ok(Composed { verdict, results })
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Milliseconds since `started`, for `CheckResult::elapsed_ms`.
pub fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composition_orders_invalid_over_unknown_over_valid() {
        use Verdict::*;
        assert_eq!(Valid.and(Unknown), Unknown);
        assert_eq!(Unknown.and(Invalid), Invalid);
        assert_eq!(Invalid.and(Valid), Invalid);
        assert_eq!(Valid.and(Valid), Valid);
    }
}
