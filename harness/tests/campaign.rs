//! `drift test` end to end, as the README's main job runs it (briefly).

use std::path::{Path, PathBuf};
mod common;

use common::{drift, fresh_path, Reaped};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn only_run(store: &Path) -> PathBuf {
    let test_dir = std::fs::read_dir(store)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir() && !p.ends_with("latest"))
        .expect("a test directory");
    std::fs::read_dir(test_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .next()
        .expect("a run")
}

/// Runs `drift test ARGS --store <fresh>` (ARGS split at spaces) and
/// asserts it ends valid (exit 0); returns its stdout, the run directory
/// and the store.
fn valid_campaign(tag: &str, args: &str) -> (String, PathBuf, PathBuf) {
    let store = fresh_path(tag);
    let out = drift()
        .arg("test")
        .args(args.split_whitespace())
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = only_run(&store);
    (stdout, run, store)
}

fn json_file(path: PathBuf) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The results of checker `name` in a run's results.json.
fn checker_results(run: &Path, name: &str) -> Option<serde_json::Value> {
    let results = json_file(run.join("results.json"));
    results["checkers"]
        .as_array()?
        .iter()
        .find(|c| c["checker"] == name)
        .cloned()
}

#[test]
fn a_short_campaign_stores_a_checked_run_and_replays_it() {
    let (stdout, run, store) = valid_campaign(
        "short",
        "--workload unique-ids --nemesis kill --nemesis-interval 4 --time-limit 8 --nodes 3 --rate 40 --port 22281 --seed 5",
    );
    assert!(
        stdout.starts_with("drift test  seed 5"),
        "the seed comes first: {stdout}"
    );
    let info = json_file(run.join("run.json"));
    assert_eq!(info["seed"], 5);
    let schedule = info["nemesis_schedule"].as_array().unwrap();
    assert!(
        !schedule.is_empty()
            && schedule
                .iter()
                .all(|s| s["fault"] == "kill" && !s["applied"].as_str().unwrap().is_empty())
    );
    let results = json_file(run.join("results.json"));
    assert_eq!(results["verdict"], "valid");
    let names: Vec<&str> = results["checkers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["checker"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["unique-ids", "stats", "perf", "digest"]);
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("checker perf") && l.contains(" ok/s p50 ") && l.contains("; kill: ")),
        "the campaign prints perf's headline with its kill window: {stdout}"
    );
    let perf = checker_results(&run, "perf").unwrap();
    let stats = checker_results(&run, "stats").unwrap();
    assert_eq!(perf["details"]["all"]["ok"], stats["details"]["ok"]);
    let kill = perf["details"]["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["window"] == "kill")
        .unwrap_or_else(|| panic!("a kill window: {}", perf["details"]));
    assert!(kill["seconds"].as_f64().unwrap() > 1.0, "{kill}");
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(
        report.contains("<title>kill [") && report.contains("<td>kill</td>"),
        "the report shades the kills and has their window's figures"
    );
    let version = &info["versions"];
    assert_eq!(version["binary_sha256"].as_str().map(str::len), Some(64), "{version}");
    let history = std::fs::read_to_string(run.join("history.jsonl")).unwrap();
    assert!(history.contains("\"start-kill\"") && history.contains("\"final-digests\""));
    // re-check the stored run
    let check = drift().arg("check").arg(&run).output().unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // replay, through the store's `latest` as the README shows it: a new
    // run with the same seed and the stored schedule. The first kill is
    // moved to another node first, so a replay that drew its schedule
    // from the seed again would differ
    let mut edited = info.clone();
    let first = edited["nemesis_schedule"][0]["nodes"][0].as_u64().unwrap();
    edited["nemesis_schedule"][0]["nodes"][0] = (first % 3 + 1).into();
    std::fs::write(run.join("run.json"), serde_json::to_string_pretty(&edited).unwrap()).unwrap();
    let replay = drift().arg("replay").arg(store.join("latest")).output().unwrap();
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replay.stdout)
    );
    let runs: Vec<PathBuf> = std::fs::read_dir(run.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(runs.len(), 2);
    let again = runs.iter().find(|p| **p != run).unwrap();
    let info2 = json_file(again.join("run.json"));
    assert_eq!(info2["seed"], 5);
    let plan = |v: &serde_json::Value| -> Vec<(u64, u64, String)> {
        v["nemesis_schedule"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["start_ms"].as_u64().unwrap(),
                    s["nodes"][0].as_u64().unwrap(),
                    s["fault"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_ne!(plan(&edited), plan(&info));
    assert_eq!(plan(&info2), plan(&edited), "the replay applied the stored schedule");
    // the test's directory alone compares its two runs: same options,
    // both valid
    let compare = drift().arg("compare").arg(run.parent().unwrap()).output().unwrap();
    let stdout = String::from_utf8_lossy(&compare.stdout);
    assert_eq!(compare.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("config   same options") && stdout.contains("window kill"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_campaign_killed_mid_run_leaves_a_checkable_history_and_no_nodes() {
    let store = fresh_path("killed");
    let child = Reaped(
        drift()
            .args([
                "test",
                "--nemesis",
                "none",
                "--time-limit",
                "60",
                "--nodes",
                "3",
                "--port",
                "22381",
                "--store",
            ])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // wait until ops are being recorded
    let deadline = Instant::now() + Duration::from_secs(30);
    let history = loop {
        let h = std::fs::read_dir(&store).ok().and_then(|_| {
            let run = only_run(&store);
            let h = run.join("history.jsonl");
            (std::fs::metadata(&h).map(|m| m.len()).unwrap_or(0) > 2000).then_some(h)
        });
        if let Some(h) = h {
            break h;
        }
        assert!(Instant::now() < deadline, "the campaign never recorded ops");
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(child);
    let run = history.parent().unwrap().to_path_buf();
    let check = drift().arg("check").arg(&run).output().unwrap();
    let code = check.status.code();
    assert!(
        matches!(code, Some(0) | Some(2)),
        "drift check refused the history: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // the nodes noticed their parent died and exited
    let node_logs: Vec<PathBuf> = (1..=3).map(|i| run.join("nodes").join(format!("n{i}.log"))).collect();
    let gone = || {
        node_logs
            .iter()
            .all(|l| std::fs::read_to_string(l).unwrap_or_default().contains("parent_gone"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone() {
        assert!(Instant::now() < deadline, "nodes outlived their campaign");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn bad_campaign_arguments_exit_3_and_say_what_is_wrong() {
    // each refused for its own reason: were a check to regress, the run
    // it would start is short, on a port of its own, in a scratch store
    let store = fresh_path("bad-args");
    let bounds = "--concurrency must be in 1..=1000, --rate in 0.01..=1000000";
    for (args, says) in [
        (&["--workload", "bogus"][..], "unknown --workload `bogus`"),
        (&["--nemesis", "meteor"], "unknown --nemesis `meteor`"),
        (&["--target", "etcd"], "unknown --target `etcd`"),
        (
            &["--target", "zookeeper", "--nemesis", "partition"],
            "--nemesis partition is not available on the zookeeper target",
        ),
        (
            &["--digest", "maybe"],
            "--digest maybe: expected off, incremental or full",
        ),
        (
            &["--partitioner", "carrier-pigeon"],
            "--partitioner carrier-pigeon: expected",
        ),
        (&["--nemesis-interval", "0"], bounds),
        (&["--port", "65530"], "--port must be in 1024..="),
        (&["--nodes", "12"], "--nodes must be in 1..=9"),
        (&["--rate", "0.000001"], bounds),
        (&["--concurrency", "0"], bounds),
    ] {
        let mut cmd = drift();
        cmd.arg("test")
            .args(args)
            .arg("--store")
            .arg(&store)
            .args(["--time-limit", "1"]);
        if !args.contains(&"--port") {
            cmd.args(["--port", "22981"]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // the local cluster command checks its port range too (P..=P+2)
    let out = drift()
        .args(["cluster", "up", "--port", "65535", "--dir"])
        .arg(&store)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--port must be in 1024..=65533"));
    assert!(!store.exists(), "nothing started, nothing written");
}

#[test]
fn the_zookeeper_target_runs_the_same_workload_against_apache_zookeeper() {
    if !Path::new("/usr/share/java/zookeeper.jar").exists() {
        let why = "Apache ZooKeeper is missing (ci/test installs the `zookeeper` package)";
        assert!(
            std::env::var_os("DRIFT_REQUIRE_DEPS").is_none(),
            "{why}, and DRIFT_REQUIRE_DEPS is set"
        );
        eprintln!("NOT RUN: {why}");
        return;
    }
    let (_, run, store) = valid_campaign(
        "zookeeper",
        "--target zookeeper --workload register --nemesis kill --nemesis-interval 4 --time-limit 10 --nodes 3 --rate 40 --port 22681 --quorum-reads --seed 11",
    );
    assert!(
        run.parent().unwrap().ends_with("register-zookeeper"),
        "{}",
        run.display()
    );
    // no tree digest on ZooKeeper, so no digest checker; the rest as on drift
    assert!(checker_results(&run, "linearizable").is_some(), "{}", run.display());
    assert!(checker_results(&run, "digest").is_none(), "{}", run.display());
    let history = std::fs::read_to_string(run.join("history.jsonl")).unwrap();
    let ok_ops = history
        .lines()
        .filter(|l| l.contains("\"type\":\"ok\"") && !l.contains("nemesis"))
        .count();
    assert!(ok_ops > 50, "ZooKeeper answered {ok_ops} operations");
    assert!(history.contains("\"start-kill\""), "the kill nemesis ran");
    // ZooKeeper's own server log is in the node directory
    let log = std::fs::read_to_string(run.join("nodes/n1.log")).unwrap_or_default();
    assert!(
        log.contains("QuorumPeer") || log.contains("zookeeper"),
        "node log: {}",
        &log[..log.len().min(500)]
    );
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn the_ephemeral_workload_ends_sessions_both_ways_and_checks_none_outlives_them() {
    let (_, run, store) = valid_campaign(
        "ephemeral",
        "--workload ephemeral --nemesis kill --nemesis-interval 3 --time-limit 8 --nodes 3 --rate 60 --port 22481 --seed 9",
    );
    let eph = checker_results(&run, "ephemeral").expect("the ephemeral checker ran")["details"].clone();
    assert!(eph["closed"].as_u64().unwrap() > 0, "{eph}");
    assert!(eph["expired"].as_u64().unwrap() > 0, "{eph}");
    assert!(eph["created_ok"].as_u64().unwrap() > 20, "{eph}");
    // the final read came after every session had time to expire
    assert_eq!(eph["final_read_sizes"], serde_json::json!([0]), "{eph}");
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn without_iptables_partitions_go_through_per_link_proxies() {
    let (stdout, run, store) = valid_campaign(
        "proxies",
        "--workload register --nemesis partition --partitioner proxies --quorum-reads --nemesis-interval 3 --time-limit 8 --nodes 3 --rate 60 --port 22581 --seed 13",
    );
    assert!(stdout.contains("partitions via per-link proxies"), "{stdout}");
    let history = std::fs::read_to_string(run.join("history.jsonl")).unwrap();
    let cuts: Vec<&str> = history.lines().filter(|l| l.contains("\"start-partition\"")).collect();
    assert!(!cuts.is_empty(), "a partition ran");
    for c in &cuts {
        assert!(c.contains("directed links cut") && !c.contains("proxies: 0 "), "{c}");
    }
    let run_json = std::fs::read_to_string(run.join("run.json")).unwrap();
    assert!(
        run_json.contains("\"partitioner\": \"proxies\""),
        "replay keeps the partitioner"
    );
    let _ = std::fs::remove_dir_all(&store);
}
