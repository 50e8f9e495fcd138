//! The JSON files of a run: `run.json` (what was run) and `results.json`
//! (what the checkers found).

use drift_checkers::{CheckResult, Verdict};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Versions that identify what produced a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    pub drift: String,
    /// The commit the binary was built from (absent when it was built
    /// outside a git checkout).
    #[serde(default)]
    pub git_sha: Option<String>,
    /// SHA-256 of the executable that ran: tells two builds of one commit
    /// (a dirty tree, other flags) apart. Absent in runs of older drifts
    /// and when the executable could not be read.
    #[serde(default)]
    pub binary_sha256: Option<String>,
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
    /// What the system under test turned out to be, where drift asks it at
    /// setup (a ClickHouse server's version, settings, and the workload's
    /// mixes it cannot take).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Value>,
    /// A campaign a signal ended early: when its main phase ended, in
    /// seconds after it began (the history and the verdict cover that
    /// much of the plan's time limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted_after_s: Option<f64>,
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
    /// This build's versions: `drift` and `git_sha` as the build stamped
    /// them, and the hash of the running executable.
    pub fn current(drift: &str, git_sha: Option<&str>) -> Versions {
        Versions {
            drift: drift.to_string(),
            git_sha: git_sha.map(str::to_string),
            binary_sha256: std::env::current_exe().ok().and_then(|exe| file_sha256(&exe).ok()),
        }
    }

    /// The version as one short line: `0.1.0 3f2a9c1d (bin 77aa01be)`.
    pub fn short(&self) -> String {
        let cut = |s: &Option<String>| s.as_deref().map(|s| s.chars().take(8).collect::<String>());
        let mut line = self.drift.clone();
        if let Some(sha) = cut(&self.git_sha) {
            line.push_str(&format!(" {sha}"));
        }
        if let Some(bin) = cut(&self.binary_sha256) {
            line.push_str(&format!(" (bin {bin})"));
        }
        line
    }
}

/// Lowercase hex SHA-256 of a file's contents, read in 1 MiB pieces.
pub fn file_sha256(path: &std::path::Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_hash_is_sha256_of_its_bytes() {
        let path = std::env::temp_dir().join(format!("drift-sha-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            file_sha256(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn run_json_of_an_older_drift_without_a_binary_hash_still_reads() {
        let v: Versions = serde_json::from_str(r#"{"drift": "0.1.0", "git_sha": null}"#).unwrap();
        assert_eq!(v.binary_sha256, None);
        assert_eq!(v.short(), "0.1.0");
    }
}
