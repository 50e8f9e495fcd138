//! Stamps the build with the commit it was built from, as
//! `DRIFT_GIT_SHA`, so a run's `run.json` says which version produced it
//! and `drift compare` can tell versions apart. An explicit
//! `DRIFT_GIT_SHA` in the build's environment wins; outside a git
//! checkout (or without git) nothing is stamped and runs say so.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").current_dir(root).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DRIFT_GIT_SHA");
    if std::env::var_os("DRIFT_GIT_SHA").is_some() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().unwrap_or(&manifest);
    // only drift's own checkout: a source tree unpacked inside some other
    // repository must not take that repository's commit
    let top = git(root, &["rev-parse", "--show-toplevel"]).map(PathBuf::from);
    let same = |a: &Path, b: &Path| std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok();
    if !top.is_some_and(|t| same(&t, root)) {
        return;
    }
    let Some(sha) = git(root, &["rev-parse", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=DRIFT_GIT_SHA={sha}");
    // a new commit or a checkout moves HEAD or a ref: stamp again then
    // (a worktree keeps its HEAD in its own git dir, the refs in the
    // common one)
    let mut watched = Vec::new();
    if let Some(dir) = git(root, &["rev-parse", "--absolute-git-dir"]) {
        watched.push(PathBuf::from(dir).join("HEAD"));
    }
    if let Some(common) = git(root, &["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        let common = PathBuf::from(common);
        watched.extend([common.join("refs").join("heads"), common.join("packed-refs")]);
    }
    for w in watched.into_iter().filter(|w| w.exists()) {
        println!("cargo:rerun-if-changed={}", w.display());
    }
}
