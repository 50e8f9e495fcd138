//! The JSON files of a run: `run.json` (what was run) and `results.json`
//! (what the checkers found).

use drift_checkers::{CheckResult, Verdict};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Versions that identify what produced a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    pub drift: String,
    #[serde(default)]
    pub git_sha: Option<String>,
}

/// `run.json`: what ran, with which seed and settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub test: String,
    /// `check` for a re-check of a recorded history, `test` for a campaign.
    pub kind: String,
    pub created_at: String,
    #[serde(default)]
    pub seed: Option<u64>,
    /// The command's options as given.
    pub config: Value,
    pub versions: Versions,
    /// For a check: the history that was checked.
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub hosts: Vec<Value>,
    #[serde(default)]
    pub nemesis_schedule: Vec<Value>,
}

/// `results.json`: the composed verdict and each checker's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultsFile {
    pub verdict: Verdict,
    pub history: String,
    /// History lines.
    pub ops: u64,
    /// Client operations (invoke + completion pairs).
    pub operations: u64,
    pub keys: usize,
    pub checked_at: String,
    pub elapsed_ms: f64,
    pub checkers: Vec<CheckResult>,
    /// Files written beside `results.json` (pictures of violations).
    #[serde(default)]
    pub artifacts: Vec<String>,
}

impl Versions {
    /// This build's versions.
    pub fn current(drift: &str, git_sha: Option<&str>) -> Versions {
        Versions {
            drift: drift.to_string(),
            git_sha: git_sha.map(str::to_string),
        }
    }
}
