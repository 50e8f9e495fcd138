//! `drift test --backend docker`: campaigns whose servers run in
//! containers on a network of the run's own, faults applied from the host.
//!
//! The image holds a statically linked drift, which `ci/test` builds and
//! names in `DRIFT_STATIC_EXE`. Without it (or without a Docker engine)
//! these tests say so and pass only outside CI: under `DRIFT_REQUIRE_DEPS`
//! they fail, as every test whose dependency is missing does.

mod common;

use common::fresh_path;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One docker test at a time: each counts every container drift made.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The static drift, or why the tests cannot run.
fn static_drift() -> Option<PathBuf> {
    let missing = |why: &str| {
        assert!(
            std::env::var_os("DRIFT_REQUIRE_DEPS").is_none(),
            "the docker tests need {why} (ci/test provides it)"
        );
        eprintln!("NOT RUN: the docker tests need {why}");
        None
    };
    let Some(p) = std::env::var_os("DRIFT_STATIC_EXE").map(PathBuf::from) else {
        return missing("a static drift in DRIFT_STATIC_EXE");
    };
    if !p.exists() {
        return missing(&format!("{} (DRIFT_STATIC_EXE)", p.display()));
    }
    let engine = Command::new("docker").args(["version"]).stdout(Stdio::null()).status();
    if !engine.is_ok_and(|s| s.success()) {
        return missing("a running Docker engine");
    }
    Some(p)
}

/// Names of the containers and networks drift runs left behind.
fn leftovers() -> (Vec<String>, Vec<String>) {
    let list = |args: &[&str]| -> Vec<String> {
        let out = Command::new("docker").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    (
        list(&["ps", "-a", "--filter", "label=io.drift.owner", "--format", "{{.Names}}"]),
        list(&[
            "network",
            "ls",
            "--filter",
            "label=io.drift.owner",
            "--format",
            "{{.Name}}",
        ]),
    )
}

#[test]
fn a_campaign_in_containers_is_valid_and_leaves_no_container_or_network() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(drift) = static_drift() else { return };
    let store = fresh_path("docker");
    // the store as the README's example gives it: relative (a bind mount
    // needs an absolute path; drift makes it one)
    let parent = store.parent().unwrap().to_path_buf();
    let relative = store.file_name().unwrap().to_os_string();
    let child = Command::new(&drift)
        .current_dir(&parent)
        .args(["test", "--backend", "docker", "--workload", "register"])
        // seed 2's schedule: a kill, a partition, a pause
        .args([
            "--nemesis",
            "partition,kill,pause",
            "--nemesis-interval",
            "4",
            "--seed",
            "2",
        ])
        .args(["--time-limit", "16", "--nodes", "3", "--rate", "40", "--store"])
        .arg(&relative)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = common::Reaped(child);
    // while it runs: no secret in any container's arguments or environment
    let owner = format!("label=io.drift.owner={}", child.0.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let inspected = loop {
        let ps = Command::new("docker")
            .args(["ps", "-q", "--filter", &owner])
            .output()
            .unwrap();
        let ids: Vec<String> = String::from_utf8_lossy(&ps.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if let Some(id) = ids.first() {
            let out = Command::new("docker")
                .args([
                    "inspect",
                    "-f",
                    "{{json .Config.Env}} {{json .Args}} {{json .Mounts}}",
                    id,
                ])
                .output()
                .unwrap();
            if out.status.success() {
                break String::from_utf8_lossy(&out.stdout).to_string();
            }
        }
        assert!(std::time::Instant::now() < deadline, "no container of the run came up");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(!inspected.contains("DRIFT_FAULT_TOKEN"), "{inspected}");
    assert!(inspected.contains("--fault-token-file"), "{inspected}");
    let token_file = std::fs::read_dir(store.join("register-drift"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("nodes/fault-token"))
        .find(|p| p.exists())
        .expect("the token's file in the run's nodes directory");
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(token.len() >= 16 && !inspected.contains(token.trim()), "{inspected}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the token's file is its owner's alone");
    }
    let mut stdout_pipe = child.0.stdout.take().unwrap();
    let mut stderr_pipe = child.0.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr_pipe, &mut s);
        s
    });
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut stdout_pipe, &mut stdout).unwrap();
    let status = child.0.wait().unwrap();
    let stderr = stderr.join().unwrap();
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("docker containers"), "{stdout}");
    // the partition really cut: some faults' windows saw failures
    let history = std::fs::read_dir(store.join("register-drift"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("history.jsonl"))
        .next()
        .unwrap();
    let text = std::fs::read_to_string(&history).unwrap();
    assert!(
        text.contains("directed links cut at the servers"),
        "partitions went through the containers"
    );
    // the servers' logs are in the run directory
    let run = history.parent().unwrap();
    let log = std::fs::read_to_string(run.join("nodes/n1.log")).unwrap();
    assert!(log.contains("\"started\""), "{log}");
    assert_eq!(leftovers(), (vec![], vec![]), "every container and network removed");
    // a replay runs in containers again, with the stored schedule
    let again = common::assert_replays_on_same_backend(&drift, run);
    assert!(again.join("nodes/n1.log").exists());
    assert_eq!(leftovers(), (vec![], vec![]), "the replay removed its containers too");
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn containers_of_a_killed_run_are_removed_by_the_next() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(drift) = static_drift() else { return };
    let store = fresh_path("docker-killed");
    let mut victim = Command::new(&drift)
        .args([
            "test",
            "--backend",
            "docker",
            "--workload",
            "register",
            "--nemesis",
            "none",
        ])
        .args(["--time-limit", "60", "--nodes", "3", "--store"])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // wait until its containers run, then kill it without a goodbye
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while leftovers().0.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the victim's containers never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert_eq!(leftovers().0.len(), 3, "a killed drift leaves its containers");
    // the next run proves they are orphans (their drift is gone) and removes them
    let out = Command::new(&drift).args(["build-image"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(&drift)
        .args([
            "test",
            "--backend",
            "docker",
            "--workload",
            "register",
            "--nemesis",
            "none",
        ])
        .args(["--time-limit", "3", "--nodes", "3", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(leftovers(), (vec![], vec![]));
    let _ = std::fs::remove_dir_all(&store);
}

/// A campaign in containers interrupted as a terminal does (the signal
/// to the whole job). Once (Ctrl-C): the main phase ends, the verdict is
/// judged and stored, and the teardown removes the containers and the
/// network. Twice (Ctrl-C, then SIGTERM during the heal): drift exits at
/// once, no destructor runs, and still no container or network is left
/// for the next run to find (before, the second signal stopped the
/// containers and left them and the network behind).
#[test]
fn an_interrupted_campaign_in_containers_leaves_no_container_or_network() {
    use std::time::Duration;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(drift) = static_drift() else { return };
    for (signals, code) in [(&["INT"][..], 130), (&["INT", "TERM"][..], 143)] {
        let store = fresh_path("docker-interrupted");
        let child = common::spawn_as_a_job(
            Command::new(&drift)
                .args(["test", "--backend", "docker", "--workload", "register"])
                .args(["--nemesis", "kill,partition", "--nemesis-interval", "2"])
                .args(["--time-limit", "120", "--nodes", "3", "--rate", "40", "--store"])
                .arg(&store)
                .stderr(Stdio::null()),
        );
        let history = common::history_once_recorded(&store.join("register-drift"), Duration::from_secs(120));
        // (one may be between its removal and its restart by the nemesis)
        assert!(!leftovers().0.is_empty(), "the run's containers are up");
        let limit = Duration::from_secs(100);
        let (exit, stdout) = if signals.len() == 1 {
            common::signal(child.0.id(), "INT");
            common::ended_within(child, limit)
        } else {
            // the second lands in the heal: its restarted servers are
            // waited for
            common::interrupted_twice(child, limit)
        };
        assert_eq!(exit, Some(code), "{signals:?}: {stdout}");
        let results = history.with_file_name("results.json");
        if signals.len() == 1 {
            let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
            assert_eq!(r["verdict"], "valid", "{stdout}");
        } else {
            assert!(stdout.contains("without a verdict"), "{stdout}");
            assert!(!results.exists(), "no verdict");
        }
        assert_eq!(
            leftovers(),
            (vec![], vec![]),
            "{signals:?}: every container and network removed"
        );
        let _ = std::fs::remove_dir_all(&store);
    }
}
