//! What every `drift` end-to-end test file needs: the binary, a scratch
//! directory, a run with its outputs, a child that cannot outlive a
//! failed assert. Each test binary uses part of it.
#![allow(dead_code)]

pub mod cluster;

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn drift() -> Command {
    Command::new(env!("CARGO_BIN_EXE_drift"))
}

/// A path for one test (`tag`) that does not exist yet: whatever an
/// earlier run left there is removed.
pub fn fresh_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("drift-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// A fresh, empty directory for one test (`tag`).
pub fn scratch(tag: &str) -> PathBuf {
    let p = fresh_path(tag);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Runs `cmd` to its end: (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output { status, stdout, stderr } = cmd.output().expect("drift runs");
    (
        status.code().expect("drift exits, not killed"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A child process killed and reaped when dropped, so a failed assert
/// never leaves it (and whatever it started) running.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
