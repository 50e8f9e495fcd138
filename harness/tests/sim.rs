//! The simulator as a user runs it: `drift test --backend sim`, `drift
//! sim` sweeps with and without planted bugs, `drift replay` of a
//! simulated run, and the arguments it refuses.

mod common;

use common::{drift, run, scratch};
use std::path::{Path, PathBuf};

/// The run directories under `store` (one workload-target folder deep;
/// not the `latest` link).
fn runs(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for group in std::fs::read_dir(store).unwrap().filter_map(Result::ok) {
        if group.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        if let Ok(rd) = std::fs::read_dir(group.path()) {
            out.extend(rd.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    out.sort();
    out
}

fn trace(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.split("trace ").nth(1))
        .unwrap_or_else(|| panic!("no trace hash in:\n{stdout}"))
        .trim()
        .to_string()
}

#[test]
fn a_simulated_campaign_is_checked_stored_and_replayed_byte_for_byte() {
    let store = scratch("sim-run");
    let (code, stdout, stderr) = run(drift()
        .args([
            "test",
            "--backend",
            "sim",
            "--workload",
            "unique-ids",
            "--time-limit",
            "10",
            "--nemesis",
            "kill,partition",
            "--seed",
            "5",
            "--store",
        ])
        .arg(&*store));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("VALID"), "{stdout}");
    let first = runs(&store);
    assert_eq!(first.len(), 1, "{first:?}");
    let (code, again, stderr) = run(drift().arg("replay").arg(&first[0]));
    assert_eq!(code, 0, "{again}\n{stderr}");
    assert_eq!(trace(&stdout), trace(&again), "the replay's trace hash");
    let both = runs(&store);
    assert_eq!(both.len(), 2);
    let read = |p: &Path, f: &str| std::fs::read(p.join(f)).unwrap_or_else(|e| panic!("{}: {e}", p.join(f).display()));
    assert!(
        read(&both[0], "history.jsonl") == read(&both[1], "history.jsonl"),
        "the replayed history differs"
    );
    for n in 1..=5 {
        let log = format!("nodes/n{n}.log");
        assert!(read(&both[0], &log) == read(&both[1], &log), "{log} differs");
    }
    let json: serde_json::Value = serde_json::from_slice(&read(&both[1], "run.json")).unwrap();
    assert_eq!(json["config"]["backend"], "sim");
}

#[test]
fn a_sweep_finds_a_planted_bug_stores_the_seed_and_prints_how_to_run_it_again() {
    let store = scratch("sim-sweep");
    let (code, stdout, stderr) = run(drift()
        .args([
            "sim",
            "--seeds",
            "3",
            "--from",
            "11",
            "--plant",
            "skip-digest-check",
            "--nemesis",
            "diverge",
            "--time-limit",
            "10",
            "--keep",
            "1",
            "--store",
        ])
        .arg(&*store));
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(stdout.contains("3 failing seeds of 3"), "{stdout}");
    assert!(stdout.contains("was never caught"), "{stdout}");
    let stored = runs(&store);
    assert_eq!(stored.len(), 1, "--keep 1 stores one run: {stored:?}");
    let again = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("again    drift "))
        .expect("a command to run the seed again")
        .to_string();
    assert!(again.contains("--from 11 --seeds 1"), "{again}");
    assert!(stdout.contains("built    "), "the build is named: {stdout}");
    // the printed command finds the bug again
    let (code, stdout, _) = run(drift().args(again.split(' ')));
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("1 failing seeds of 1"), "{stdout}");
}

#[test]
fn a_sweep_without_planted_bugs_finds_nothing_on_a_few_seeds() {
    let store = scratch("sim-clean");
    let (code, stdout, stderr) = run(drift()
        .args([
            "sim",
            "--seeds",
            "6",
            "--swarm",
            "--jobs",
            "2",
            "--time-limit",
            "10",
            "--store",
        ])
        .arg(&*store));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("no failing seed"), "{stdout}");
    assert!(runs(&store).is_empty());
}

#[test]
fn bad_simulator_arguments_are_refused_with_what_was_wrong() {
    let cases: [(&[&str], &str); 14] = [
        (&["sim", "--seeds", "0"], "--seeds"),
        (&["sim", "--jobs", "0"], "--jobs"),
        (&["sim", "--seed", "3"], "--from and --seeds, not --seed"),
        // one short seed each, so that a case the simulator came to accept
        // fails at once instead of sweeping a thousand seeds
        (
            &["sim", "--target", "clickhouse", "--seeds", "1", "--time-limit", "1"],
            "backend sim simulates drift's own servers, not target clickhouse",
        ),
        (
            &["sim", "--nemesis", "drop-reply", "--seeds", "1", "--time-limit", "1"],
            "nemesis drop-reply acts on the replicated table, which workload register does not run",
        ),
        (
            &[
                "sim",
                "--workload",
                "insert-retry",
                "--nemesis",
                "gc-tombstones",
                "--seeds",
                "1",
                "--time-limit",
                "1",
            ],
            "nemesis gc-tombstones acts on the kv service",
        ),
        (&["sim", "--plant", "bogus"], "invalid value 'bogus' for '--plant"),
        (
            &["test", "--plant", "skip-rollback", "--time-limit", "1"],
            "--plant plants bugs in simulated servers: it needs --backend sim",
        ),
        (
            &["test", "--sim-read-rounds", "per-read", "--time-limit", "1"],
            "--sim-read-rounds is for simulated servers: it needs --backend sim",
        ),
        (
            &[
                "sim",
                "--swarm",
                "--sim-read-rounds",
                "shared",
                "--seeds",
                "1",
                "--time-limit",
                "1",
            ],
            "--swarm draws --sim-batch-us, --sim-read-rounds and --sim-log-sync per seed",
        ),
        (
            &[
                "sim",
                "--swarm",
                "--sim-log-sync",
                "inline",
                "--seeds",
                "1",
                "--time-limit",
                "1",
            ],
            "--swarm draws --sim-batch-us, --sim-read-rounds and --sim-log-sync per seed",
        ),
        (
            &["test", "--sim-log-sync", "inline", "--time-limit", "1"],
            "--sim-log-sync is for simulated servers: it needs --backend sim",
        ),
        (
            &["sim", "--sim-log-sync", "later"],
            "invalid value 'later' for '--sim-log-sync",
        ),
        (&["bench", "sim", "--seeds", "0"], "--seeds"),
    ];
    for (args, said) in cases {
        let (code, _, stderr) = run(drift().args(args));
        assert_eq!(code, 3, "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
}

/// Ctrl-C during a long sweep (sent to the whole job, as a terminal
/// does) ends it after the seeds running: the failing seeds found so far
/// are printed and the lowest stored, and drift exits as the signal would
/// have, even with its stderr gone. Before, the signal ended the sweep at
/// once and what it had found was lost.
#[test]
fn an_interrupted_sweep_stores_what_it_found_and_exits_as_the_signal_would() {
    use std::time::Duration;
    let store = scratch("sim-interrupted");
    // every seed fails: the digest check is off and the logs diverge
    let mut child = common::spawn_as_a_job(
        drift()
            .args(["sim", "--seeds", "1000000", "--from", "11", "--jobs", "1"])
            .args(["--plant", "skip-digest-check", "--nemesis", "diverge"])
            .args(["--nemesis-interval", "1", "--time-limit", "3", "--keep", "2", "--store"])
            .arg(&*store)
            .stderr(std::process::Stdio::piped()),
    );
    // the progress line after the 50th seed
    let mut stderr = child.0.stderr.take().unwrap();
    common::read_until(&mut stderr, "50 of 1000000 seeds");
    // closed, as a `2>&1 | tee` the same Ctrl-C ends: the sweep's
    // progress lines then fail to write, which must not stop it storing
    drop(stderr);
    common::signal(child.0.id(), "INT");
    let (code, stdout) = common::ended_within(child, Duration::from_secs(60));
    assert_eq!(code, Some(130), "{stdout}");
    let ran: u64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("interrupted: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("how many seeds ran: {stdout}"));
    assert!((50..1000000).contains(&ran), "{stdout}");
    assert!(stdout.contains(&format!(" failing seeds of {ran}")), "{stdout}");
    assert_eq!(runs(&store).len(), 2, "--keep 2 stores two runs: {stdout}");
    assert!(stdout.contains("seed 11: INVALID"), "{stdout}");
}
