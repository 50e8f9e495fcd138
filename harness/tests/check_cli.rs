//! `drift check`, `drift compare` and `drift serve` as a user runs
//! them: the real binary, real files, exit codes.

use std::path::{Path, PathBuf};
mod common;

use common::{drift, run, scratch, Reaped};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn etcd_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/histories/etcd");
    if dir.join("EXPECTED.tsv").is_file() {
        Some(dir)
    } else {
        // the histories live beside the clone, not in it: a fresh clone says
        // NOT RUN; CI (`CI=true`), which has them, fails without them
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{} is absent, and CI=true: CI must have the etcd histories beside the clone",
            dir.display()
        );
        eprintln!(
            "NOT RUN: {} is absent; the etcd histories are read in place from ../shared (present in CI and on development machines)",
            dir.display()
        );
        None
    }
}

#[test]
fn every_etcd_history_gets_its_expected_verdict() {
    let Some(dir) = etcd_dir() else { return };
    let out = scratch("etcd");
    let expected = std::fs::read_to_string(dir.join("EXPECTED.tsv")).unwrap();
    let mut checked = 0;
    for line in expected.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cells: Vec<&str> = line.split('\t').collect();
        let (file, want) = (cells[0], cells[1]);
        let want_code = match want {
            "linearizable" => 0,
            "not-linearizable" => 1,
            other => panic!("unknown expectation {other}"),
        };
        let run_out = out.join(file);
        let (code, stdout, stderr) = run(drift()
            .arg("check")
            .arg(dir.join(file))
            .args([
                "--checker",
                "linearizable",
                "--model",
                "cas-register",
                "--json",
                "--out",
            ])
            .arg(&run_out));
        assert_eq!(code, want_code, "{file}: expected {want}\n{stdout}\n{stderr}");
        let results: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let verdict = if want_code == 0 { "valid" } else { "invalid" };
        assert_eq!(results["verdict"], verdict, "{file}");
        let stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run_out.join("results.json")).unwrap()).unwrap();
        assert_eq!(stored["verdict"], verdict, "{file}: results.json");
        if want_code == 1 {
            let html = std::fs::read_to_string(run_out.join("linearizable-1.html")).unwrap();
            assert!(
                html.contains("<svg") && html.contains("longest linearizable prefix"),
                "{file}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 102);
    std::fs::remove_dir_all(&out).unwrap();
}

/// Writes `content` to a file and checks it; returns (code, stderr, path).
fn check_bad(tag: &str, content: &str, extra: &[&str]) -> (i32, String, String) {
    let dir = scratch(tag);
    let path = dir.join("history.jsonl");
    std::fs::write(&path, content).unwrap();
    let (code, _, stderr) = run(drift().arg("check").arg(&path).args(extra).arg("--out").arg(&dir));
    assert!(!stderr.contains("panicked"), "{tag}: panicked\n{stderr}");
    (code, stderr, path.display().to_string())
}

const INVOKE0: &str = r#"{"index":0,"time":0,"process":0,"type":"invoke","f":"read","value":null}"#;

#[test]
fn bad_input_exits_3_naming_file_line_and_reason() {
    let cases: [(&str, String, &str, &str); 8] = [
        (
            "truncated",
            format!("{INVOKE0}\n{{\"index\":1,\"time\":5,\"pro"),
            ":2:",
            "truncated line",
        ),
        ("not-json", "hello world\n".into(), ":1:", "not JSON"),
        (
            "unknown-type",
            r#"{"index":0,"time":0,"process":0,"type":"begin","f":"read","value":null}"#.to_string() + "\n",
            ":1:",
            "unknown type \"begin\"",
        ),
        (
            "no-invoke",
            r#"{"index":0,"time":0,"process":4,"type":"ok","f":"read","value":1}"#.to_string() + "\n",
            ":1:",
            "without an invoke",
        ),
        (
            "busy",
            format!(
                "{INVOKE0}\n{}\n",
                r#"{"index":1,"time":1,"process":0,"type":"invoke","f":"write","value":2}"#
            ),
            ":2:",
            "has not completed",
        ),
        (
            "not-dense",
            format!(
                "{INVOKE0}\n{}\n",
                r#"{"index":2,"time":1,"process":0,"type":"ok","f":"read","value":null}"#
            ),
            ":2:",
            "not dense",
        ),
        (
            "missing-field",
            r#"{"index":0,"time":0,"process":0,"type":"invoke","value":null}"#.to_string() + "\n",
            ":1:",
            "missing field `f`",
        ),
        (
            "wrong-shape",
            format!(
                "{}\n{}\n",
                r#"{"index":0,"time":0,"process":0,"type":"invoke","f":"cas","value":7}"#,
                r#"{"index":1,"time":1,"process":0,"type":"ok","f":"cas","value":7}"#
            ),
            ":2:",
            "[expected, new]",
        ),
    ];
    for (tag, content, line, reason) in cases {
        let (code, stderr, path) = check_bad(tag, &content, &[]);
        assert_eq!(code, 3, "{tag}: {stderr}");
        assert!(
            stderr.contains(&format!("{path}{line}")),
            "{tag}: no file:line in {stderr:?}"
        );
        assert!(stderr.contains(reason), "{tag}: no reason {reason:?} in {stderr:?}");
    }
}

/// A history whose client's time goes backwards is bad input, named by
/// its line; `--allow-unordered-time` takes it as written.
#[test]
fn time_going_backwards_exits_3_unless_allowed() {
    let content = format!(
        "{}\n{}\n",
        r#"{"index":0,"time":500,"process":0,"type":"invoke","f":"write","value":1}"#,
        r#"{"index":1,"time":100,"process":0,"type":"ok","f":"write","value":1}"#
    );
    let (code, stderr, path) = check_bad("backwards", &content, &[]);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains(&format!("{path}:2:")), "{stderr}");
    assert!(stderr.contains("time goes backwards for process 0"), "{stderr}");
    let (code, stderr, _) = check_bad("backwards-allowed", &content, &["--allow-unordered-time"]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn bad_arguments_exit_3() {
    let Some(dir) = etcd_dir() else { return };
    let file = dir.join("etcd_000.jsonl");
    let out = scratch("args");
    let cases: [(&[&str], &str); 6] = [
        (
            &["--checker", "bogus"],
            "invalid value 'bogus' for '--checker <CHECKERS>'",
        ),
        (&["--model", "queue"], "[possible values: cas-register, kv]"),
        (&["--budget-s=-1"], "--budget-s"),
        (&["--budget-s", "nan"], "--budget-s"),
        (&["--frobnicate"], "--frobnicate"),
        (&["--mem-mb", "0"], "--mem-mb"),
    ];
    for (args, said) in cases {
        let (code, _, stderr) = run(drift().arg("check").arg(&file).args(args).arg("--out").arg(&out));
        assert_eq!(code, 3, "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = run(drift().args(["check", "/nonexistent/history.jsonl"]));
    assert_eq!(code, 3);
    assert!(stderr.contains("/nonexistent/history.jsonl: no such file"), "{stderr}");
    let (code, _, _) = run(drift().arg("check"));
    assert_eq!(code, 3);
}

/// A history that takes an exhaustive search far longer than a second:
/// 16 concurrent writes of distinct values and 16 concurrent reads, each
/// read seeing one write, all ok — then, one after the other, a read of 1
/// and a read of 2: no write comes between them, so they cannot both
/// hold, but no one-pass proof sees that (both values were written
/// before). The search must try every interleaving of write/read pairs
/// (3^16 sets) before it may say "invalid".
fn hard_history() -> String {
    const PAIRS: usize = 16;
    let mut lines = Vec::new();
    let mut push = |p: usize, t: &str, f: &str, v: String| {
        let i = lines.len();
        lines.push(format!(
            r#"{{"index":{i},"time":{i},"process":{p},"type":"{t}","f":"{f}","value":{v}}}"#
        ));
    };
    for i in 0..PAIRS {
        push(i, "invoke", "write", (i + 1).to_string());
    }
    for i in 0..PAIRS {
        push(PAIRS + i, "invoke", "read", "null".into());
    }
    for i in 0..PAIRS {
        push(i, "ok", "write", (i + 1).to_string());
    }
    for i in 0..PAIRS {
        push(PAIRS + i, "ok", "read", (i + 1).to_string());
    }
    for seen in [1, 2] {
        push(2 * PAIRS, "invoke", "read", "null".into());
        push(2 * PAIRS, "ok", "read", seen.to_string());
    }
    lines.join("\n") + "\n"
}

#[test]
fn hard_history_with_1s_budget_is_unknown_within_about_1s() {
    let dir = scratch("budget");
    let path = dir.join("hard.jsonl");
    std::fs::write(&path, hard_history()).unwrap();
    let started = Instant::now();
    let (code, stdout, stderr) = run(drift()
        .arg("check")
        .arg(&path)
        .args(["--budget-s", "1", "--out"])
        .arg(&dir));
    let took = started.elapsed();
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(stdout.contains("time budget exhausted"), "{stdout}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    let results: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["verdict"], "unknown");
}

/// Peak resident memory of a running process, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn memory_cap_ends_in_unknown_and_memory_stays_bounded() {
    let dir = scratch("mem");
    let path = dir.join("hard.jsonl");
    std::fs::write(&path, hard_history()).unwrap();
    let cap_mib = 48;
    let mut child = drift()
        .arg("check")
        .arg(&path)
        .args(["--budget-s", "120", "--mem-mb", &cap_mib.to_string(), "--out"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(100);
    let status = loop {
        if let Some(kib) = peak_rss_kib(child.id()) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "memory cap never reached");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("memory cap"), "{stdout}");
    // The cap bounds the search's tables; allow the binary, its other
    // data and allocator slack on top.
    assert!(
        peak < (cap_mib + 40) * 1024,
        "peak RSS {peak} KiB with a {cap_mib} MiB cap"
    );
    assert!(peak > 8 * 1024, "peak RSS {peak} KiB: the search never used its memory");
}

#[test]
fn checking_into_the_store_makes_a_run_and_leaves_latest_to_campaigns() {
    let Some(dir) = etcd_dir() else { return };
    let root = scratch("store");
    let store = root.join("store");
    let (code, stdout, _) = run(drift()
        .arg("check")
        .arg(dir.join("etcd_001.jsonl"))
        .args(["--checker", "linearizable,stats", "--store"])
        .arg(&store));
    assert_eq!(code, 1, "{stdout}");
    // `latest` keeps meaning the newest campaign run: a check does not move it
    assert!(!store.join("latest").exists(), "a check moved latest");
    let runs: Vec<PathBuf> = std::fs::read_dir(store.join("check-etcd_001"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(runs.len(), 1);
    let latest = &runs[0];
    assert!(
        stdout.contains(&latest.join("results.json").display().to_string()),
        "{stdout}"
    );
    let run_json: serde_json::Value = serde_json::from_slice(&std::fs::read(latest.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["kind"], "check");
    assert_eq!(run_json["test"], "check-etcd_001");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(latest.join("results.json")).unwrap()).unwrap();
    let names: Vec<&str> = results["checkers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["checker"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["linearizable", "stats"]);
    assert_eq!(
        results["checkers"][1]["details"]["by_f"]["cas"]["ok"]
            .as_u64()
            .map(|n| n > 0),
        Some(true)
    );
    assert!(latest.join("linearizable-1.html").is_file());
    let report = std::fs::read_to_string(latest.join("report.html")).unwrap();
    assert!(
        report.contains(r#"class="invalid">INVALID"#) && report.matches("<svg").count() == 2,
        "the report gives the verdict and draws latency and throughput"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_run_directory_is_checked_in_place() {
    let Some(dir) = etcd_dir() else { return };
    let run_dir = scratch("rundir");
    std::fs::copy(dir.join("etcd_002.jsonl"), run_dir.join("history.jsonl")).unwrap();
    let (code, stdout, stderr) = run(drift().arg("check").arg(&run_dir));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("verdict  VALID"), "{stdout}");
    assert!(run_dir.join("results.json").is_file());
    // through a link that moves, as `store/latest` does: the results name
    // the run's own history, not the link's
    let link = run_dir.with_extension("latest");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&run_dir, &link).unwrap();
    let (code, stdout, stderr) = run(drift().arg("check").arg(&link));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("results.json")).unwrap()).unwrap();
    let real = run_dir.canonicalize().unwrap().join("history.jsonl");
    assert_eq!(results["history"], real.display().to_string());
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_dir_all(&run_dir).unwrap();
}

#[test]
fn a_run_directory_whose_run_json_is_damaged_exits_3_naming_it() {
    let Some(dir) = etcd_dir() else { return };
    let run_dir = scratch("bad-run-json");
    std::fs::copy(dir.join("etcd_002.jsonl"), run_dir.join("history.jsonl")).unwrap();
    for (content, says) in [
        ("{\"kind\": \"test\", \"config\": ", "run.json"),
        (
            "{\"test\":\"t\",\"kind\":\"test\",\"created_at\":\"x\",\"versions\":{\"drift\":\"0\"},\"config\":{\"workload\":\"juggling\"}}",
            "config",
        ),
    ] {
        std::fs::write(run_dir.join("run.json"), content).unwrap();
        let (code, stdout, stderr) = run(drift().arg("check").arg(&run_dir));
        assert_eq!(code, 3, "{content}: {stdout}{stderr}");
        assert!(stderr.contains("run.json") && stderr.contains(says), "{content}: {stderr}");
        assert!(!run_dir.join("results.json").exists(), "nothing judged");
    }
    std::fs::remove_dir_all(&run_dir).unwrap();
}

#[test]
fn a_reader_that_leaves_ends_drift_quietly_instead_of_a_panic() {
    let dir = scratch("closed-stdout");
    let path = dir.join("history.jsonl");
    let ok = r#"{"index":1,"time":3,"process":0,"type":"ok","f":"read","value":null}"#;
    std::fs::write(&path, format!("{INVOKE0}\n{ok}\n")).unwrap();
    let check = || {
        let mut c = drift();
        c.arg("check")
            .arg(&path)
            .args(["--checker", "stats", "--out"])
            .arg(&dir);
        c
    };
    // control: with a reader, the verdict is printed and the run is valid
    let (code, stdout, stderr) = run(&mut check());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(!stdout.is_empty());
    // the reader is gone before drift writes its first line
    let mut child = check().stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stored run made by hand: `reads` reads by 4 processes, one invoked
/// every `gap_ms`, each taking `latency_ms`; a partition over the middle
/// third; `run.json` with `config`, `results.json` with the given
/// linearizable verdict.
struct Made<'a> {
    reads: i64,
    gap_ms: i64,
    latency_ms: i64,
    linearizable: &'a str,
    config: serde_json::Value,
    /// How every read ends: ok, fail or info.
    outcome: &'a str,
}

fn make_run(dir: &Path, m: &Made) {
    std::fs::create_dir_all(dir).unwrap();
    let ms = 1_000_000i64;
    let mut lines = Vec::new();
    let mut line = |time: i64, process: serde_json::Value, kind: &str, f: &str| {
        let index = lines.len();
        lines.push(
            serde_json::json!({"index": index, "time": time, "process": process, "type": kind, "f": f, "value": null})
                .to_string(),
        );
    };
    let span = m.reads * m.gap_ms * ms;
    for k in 0..m.reads {
        let t = k * m.gap_ms * ms;
        if t == span / 3 {
            line(t, "nemesis".into(), "info", "start-partition");
        }
        if t == 2 * span / 3 {
            line(t, "nemesis".into(), "info", "stop-partition");
        }
        line(t, (k % 4).into(), "invoke", "read");
        line(t + m.latency_ms * ms, (k % 4).into(), m.outcome, "read");
    }
    std::fs::write(dir.join("history.jsonl"), lines.join("\n") + "\n").unwrap();
    let info = serde_json::json!({
        "test": "made", "kind": "test", "created_at": "2026-11-30T00:00:00.000Z", "seed": 1,
        "config": m.config, "versions": {"drift": "0.1.0", "git_sha": "0123456789abcdef"},
    });
    std::fs::write(dir.join("run.json"), info.to_string()).unwrap();
    let verdict = if m.linearizable == "valid" {
        "valid"
    } else {
        m.linearizable
    };
    let results = serde_json::json!({
        "verdict": verdict, "history": "history.jsonl", "ops": 0, "operations": 0, "keys": 1,
        "checked_at": "2026-11-30T00:00:00.000Z", "elapsed_ms": 1.0,
        "checkers": [
            {"checker": "linearizable", "verdict": m.linearizable, "elapsed_ms": 1.0, "details": {}},
            {"checker": "stats", "verdict": "valid", "elapsed_ms": 1.0, "details": {}},
        ],
    });
    std::fs::write(dir.join("results.json"), results.to_string()).unwrap();
}

fn made(linearizable: &str, gap_ms: i64, latency_ms: i64) -> Made<'_> {
    Made {
        reads: 240,
        gap_ms,
        latency_ms,
        linearizable,
        config: serde_json::json!({"rate": 100}),
        outcome: "ok",
    }
}

#[test]
fn compare_says_which_checker_turned_invalid_and_exits_1() {
    let root = scratch("compare-verdict");
    make_run(&root.join("a"), &made("valid", 10, 2));
    make_run(&root.join("b"), &made("invalid", 10, 2));
    let (code, stdout, _) = run(drift().arg("compare").arg(root.join("a")).arg(root.join("b")));
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("WORSE: checker linearizable: valid → invalid"),
        "{stdout}"
    );
    assert!(stdout.contains("config   same options"), "{stdout}");
    // the other way round it is better, which is not a regression
    let (code, stdout, _) = run(drift().arg("compare").arg(root.join("b")).arg(root.join("a")));
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("not worse than the baseline"), "{stdout}");
    // invalid outranks unknown, whatever else turned unknown
    let set_stats = |run: &str, verdict: &str| {
        let path = root.join(run).join("results.json");
        let mut r: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        r["checkers"][1]["verdict"] = verdict.into();
        std::fs::write(&path, r.to_string()).unwrap();
    };
    set_stats("b", "unknown");
    let (code, stdout, _) = run(drift().arg("compare").arg(root.join("a")).arg(root.join("b")));
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("checker stats: valid → unknown"), "{stdout}");
    // a checker turned unknown and nothing invalid: 2
    make_run(&root.join("c"), &made("valid", 10, 2));
    set_stats("c", "unknown");
    let (code, stdout, _) = run(drift().arg("compare").arg(root.join("a")).arg(root.join("c")));
    assert_eq!(code, 2, "{stdout}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn compare_gates_on_throughput_and_p99_only_when_asked_and_only_with_enough_ops() {
    let root = scratch("compare-perf");
    make_run(&root.join("a"), &made("valid", 10, 2));
    // half the rate, twice the latency
    make_run(&root.join("b"), &made("valid", 20, 4));
    let compare = |extra: &[&str]| {
        run(drift()
            .arg("compare")
            .arg(root.join("a"))
            .arg(root.join("b"))
            .args(extra))
    };
    let (code, stdout, _) = compare(&[]);
    assert_eq!(code, 0, "no limit given: {stdout}");
    let (code, stdout, _) = compare(&["--max-throughput-drop", "20"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("read: throughput") && stdout.contains("down 50."),
        "{stdout}"
    );
    let (code, stdout, _) = compare(&["--max-p99-rise", "50"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("read: p99 2.0 → 4.0 ms, up 100."), "{stdout}");
    let (code, stdout, _) = compare(&["--max-p99-rise", "150", "--max-throughput-drop", "60"]);
    assert_eq!(code, 0, "within both limits: {stdout}");
    let (code, stdout, _) = compare(&["--max-p99-rise", "1", "--min-ops", "1000"]);
    assert_eq!(code, 0, "240 reads are fewer than --min-ops: {stdout}");
    // a run where every read fails has lost all its throughput, however
    // few successes it has left to count
    let mut failing = made("valid", 10, 2);
    failing.outcome = "fail";
    make_run(&root.join("c"), &failing);
    let (code, stdout, _) = run(drift()
        .arg("compare")
        .arg(root.join("a"))
        .arg(root.join("c"))
        .args(["--max-throughput-drop", "10"]));
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("read: throughput 100.3 → 0.0 ok/s, down 100.0%"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn compare_of_a_test_directory_takes_its_two_newest_runs_and_reports_fault_windows() {
    let root = scratch("compare-dir");
    let test = root.join("made");
    make_run(&test.join("20261130T000000.000Z"), &made("invalid", 10, 2));
    make_run(&test.join("20261130T000001.000Z"), &made("valid", 10, 2));
    let mut newest = made("valid", 10, 3);
    newest.config = serde_json::json!({"rate": 200});
    make_run(&test.join("20261130T000002.000Z"), &newest);
    let (code, stdout, _) = run(drift().arg("compare").arg(&test).arg("--json"));
    assert_eq!(code, 0, "the invalid oldest run is not compared: {stdout}");
    let out: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(out["baseline"]["path"]
        .as_str()
        .unwrap()
        .ends_with("20261130T000001.000Z"));
    assert!(out["runs"][0]["path"]
        .as_str()
        .unwrap()
        .ends_with("20261130T000002.000Z"));
    let c = &out["comparisons"][0];
    assert_eq!(c["config_changes"][0]["option"], "rate");
    assert_eq!(c["config_changes"][0]["run"], 200);
    let windows: Vec<&str> = out["baseline"]["perf"]["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["window"].as_str().unwrap())
        .collect();
    assert_eq!(windows, ["none", "partition"]);
    let partition = c["perf"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["span"] == "partition" && r["f"] == "read")
        .unwrap();
    assert_eq!(
        partition["baseline"]["ok"], 80,
        "a third of the reads fall in the partition"
    );
    let p50 = partition["p50_ratio"].as_f64().unwrap();
    assert!((p50 - 1.5).abs() < 0.01, "3 ms against 2 ms: {p50}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn compare_bad_input_exits_3_naming_what_and_where() {
    let root = scratch("compare-bad");
    make_run(&root.join("a"), &made("valid", 10, 2));
    make_run(&root.join("b"), &made("valid", 10, 2));
    std::fs::write(root.join("b/results.json"), "{\"verdict\": \"valid\",\n  oops").unwrap();
    let (code, _, stderr) = run(drift().arg("compare").arg(root.join("a")).arg(root.join("b")));
    assert_eq!(code, 3);
    assert!(
        stderr.contains("b/results.json") && stderr.contains("line 2"),
        "{stderr}"
    );

    let (code, _, stderr) = run(drift().arg("compare").arg(root.join("a")));
    assert_eq!(code, 3);
    assert!(stderr.contains("nothing to compare"), "{stderr}");

    std::fs::create_dir_all(root.join("empty")).unwrap();
    let (code, _, stderr) = run(drift().arg("compare").arg(root.join("a")).arg(root.join("empty")));
    assert_eq!(code, 3);
    assert!(stderr.contains("empty: not a run"), "{stderr}");

    let (code, _, stderr) = run(drift()
        .arg("compare")
        .arg(root.join("a"))
        .arg(root.join("a"))
        .arg("--max-p99-rise=-5"));
    assert_eq!(code, 3);
    assert!(stderr.contains("--max-p99-rise"), "{stderr}");

    std::fs::write(root.join("a/history.jsonl"), "{\"index\": 0, \"time\": 0}\n").unwrap();
    let (code, _, stderr) = run(drift().arg("compare").arg(root.join("a")).arg(root.join("b")));
    assert_eq!(code, 3);
    assert!(stderr.contains("a/history.jsonl:1"), "{stderr}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// One HTTP exchange: the raw request, then (status, body).
fn http(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn get(addr: &str, target: &str) -> (u16, String) {
    http(addr, &format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n"))
}

#[test]
fn serve_lists_runs_serves_their_files_and_compares_them_and_nothing_outside_the_store() {
    use std::io::BufRead;
    let root = scratch("serve");
    let store = root.join("store");
    make_run(&store.join("made/20261130T000001.000Z"), &made("valid", 10, 2));
    make_run(&store.join("made/20261130T000002.000Z"), &made("invalid", 10, 2));
    std::fs::write(root.join("secret"), "not served").unwrap();
    // a `drift check` run of a file outside the store: results, no history
    let check = store.join("check-foreign/20261130T000003.000Z");
    std::fs::create_dir_all(&check).unwrap();
    std::fs::copy(
        store.join("made/20261130T000001.000Z/results.json"),
        check.join("results.json"),
    )
    .unwrap();
    // a run's cluster file holds the peers' secret
    std::fs::write(
        store.join("made/20261130T000001.000Z/cluster.toml"),
        "secret = \"peer-secret\"",
    )
    .unwrap();
    let mut child = Reaped(
        drift()
            .args(["serve", "--listen", "127.0.0.1:0", "--store"])
            .arg(&store)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();

    let (status, index) = get(&addr, "/");
    assert_eq!(status, 200);
    assert!(
        index.contains("<h2>made</h2>")
            && index.contains(r#"class="invalid">invalid"#)
            && index.contains(r#"class="valid">valid"#),
        "{index}"
    );
    assert!(
        index.contains("<h2>check-foreign</h2>"),
        "check runs are listed: {index}"
    );
    let (status, body) = get(&addr, "/made/20261130T000001.000Z/cluster.toml");
    assert_eq!(status, 403);
    assert!(!body.contains("peer-secret"), "{body}");
    let (_, listing) = get(&addr, "/made/20261130T000001.000Z/");
    assert!(!listing.contains("cluster.toml"), "{listing}");
    let (status, body) = get(&addr, "/made/20261130T000001.000Z/results.json");
    assert_eq!(status, 200);
    assert_eq!(
        body,
        std::fs::read_to_string(store.join("made/20261130T000001.000Z/results.json")).unwrap()
    );
    let (status, body) = get(
        &addr,
        "/compare?base=made/20261130T000001.000Z&run=made%2F20261130T000002.000Z",
    );
    assert_eq!(status, 200);
    // rendered as tables like the report's, runs named by their place in
    // the store and linked to their reports
    assert!(
        body.contains("Worse than the baseline:") && body.contains("<li>checker linearizable: valid → invalid</li>"),
        "{body}"
    );
    assert!(
        body.contains(r#"<a href="/made/20261130T000002.000Z/report.html">made/20261130T000002.000Z</a>"#),
        "{body}"
    );
    assert!(!body.contains(&store.display().to_string()), "no absolute path: {body}");

    for outside in [
        "/../secret",
        "/%2e%2e/secret",
        "/made/../../secret",
        "/compare?base=../secret&run=made",
    ] {
        let (status, body) = get(&addr, outside);
        assert!(status == 404 || status == 400, "{outside}: {status}");
        assert!(
            !body.contains("not served"),
            "{outside} served a file outside the store"
        );
    }
    assert_eq!(get(&addr, "/made/nope").0, 404);
    assert_eq!(http(&addr, "POST / HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http(&addr, "garbage\r\n\r\n").0, 400);
    assert_eq!(
        http(&addr, &format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000))).0,
        431
    );
    // a request head trickled in a byte a second is cut off at the
    // request deadline (10 s), not kept for as long as bytes keep coming
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let started = Instant::now();
    let mut reply = Vec::new();
    let cut = loop {
        use std::io::{Read, Write};
        if started.elapsed() > Duration::from_secs(20) {
            break false;
        }
        if slow.write_all(b"G").is_err() {
            break true;
        }
        let mut buf = [0u8; 512];
        match slow.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break true,
        }
        std::thread::sleep(Duration::from_millis(900));
    };
    assert!(cut, "the trickling client was never cut off");
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(8) && took < Duration::from_secs(15),
        "{took:?}"
    );
    // still serving after all that
    assert_eq!(get(&addr, "/").0, 200);
    drop(child);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn serve_refuses_a_store_that_does_not_exist() {
    let (code, _, stderr) = run(drift().args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "/nonexistent/drift-store",
    ]));
    assert_eq!(code, 3);
    assert!(stderr.contains("/nonexistent/drift-store"), "{stderr}");
}

/// A Jepsen-style history.edn written by hand, with what Jepsen files
/// hold: keyword `:type` and `:f`, a `:nemesis` process with `:info`
/// lines, `jepsen.independent` `[key value]` tuples, no `:time`, a cas
/// `[1 2]`, a `:fail` with a vector `:error`.
const JEPSEN_EDN: &str = r#"{:type :invoke, :f :write, :value [:a 1], :process 0}
{:type :info, :f :start, :value nil, :process :nemesis}
{:type :ok, :f :write, :value [:a 1], :process 0}
{:type :invoke, :f :cas, :value [:a [1 2]], :process 1}
{:type :info, :f :start, :value [:isolated {:n1 #{:n2}}], :process :nemesis}
{:type :ok, :f :cas, :value [:a [1 2]], :process 1}
{:type :invoke, :f :cas, :value [:b [7 8]], :process 2}
{:type :fail, :f :cas, :value [:b [7 8]], :process 2, :error [:precondition-failed "7 != nil"]}
{:type :invoke, :f :read, :value [:a nil], :process 0}
{:type :ok, :f :read, :value [:a 2], :process 0}
"#;

#[test]
fn jepsen_edn_histories_check_and_convert_as_they_are() {
    let dir = scratch("edn");
    let edn = dir.join("history.edn");
    std::fs::write(&edn, JEPSEN_EDN).unwrap();
    let (code, stdout, stderr) = run(drift()
        .arg("check")
        .arg(&edn)
        .args(["--checker", "linearizable", "--json", "--out"])
        .arg(dir.join("out")));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let results: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(results["keys"], 2, "independent keys :a and :b");
    // a stale read makes it invalid: the reader keeps values and keys
    let stale = JEPSEN_EDN.replace("[:a 2], :process 0}", "[:a 1], :process 0}");
    std::fs::write(&edn, &stale).unwrap();
    let (code, stdout, _) = run(drift().arg("check").arg(&edn).args(["--out"]).arg(dir.join("out2")));
    assert_eq!(code, 1, "{stdout}");
    // the read is named by its completion's line and its invoke's
    let line_of = |part: &str| stale.lines().position(|l| l.contains(part)).unwrap() + 1;
    let (invoked, returned) = (line_of(":invoke, :f :read"), line_of(":ok, :f :read"));
    assert!(
        stdout.contains(&format!("ok at line {returned}, invoked at line {invoked}")),
        "{stdout}"
    );
    // drift convert writes the JSON Lines, which check the same way
    std::fs::write(&edn, JEPSEN_EDN).unwrap();
    let jsonl = dir.join("history.jsonl");
    let (code, stdout, stderr) = run(drift().arg("convert").arg(&edn).arg(&jsonl));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    assert_eq!(lines[1]["process"], "nemesis");
    assert_eq!(
        (&lines[3]["key"], &lines[3]["value"]),
        (&serde_json::json!("a"), &serde_json::json!([1, 2]))
    );
    assert_eq!(lines[7]["error"], "[:precondition-failed \"7 != nil\"]");
    assert_eq!(lines[9]["time"], 9, "no :time: the index stands in");
    let (code, _, _) = run(drift().arg("check").arg(&jsonl).args(["--out"]).arg(dir.join("out3")));
    assert_eq!(code, 0);
    // converting onto an existing file needs --force
    let (code, _, stderr) = run(drift().arg("convert").arg(&edn).arg(&jsonl));
    assert_eq!(code, 3);
    assert!(stderr.contains("--force"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_checker_times_edn_and_json_lines_parsing_apart() {
    let dir = scratch("bench-edn");
    std::fs::write(dir.join("jepsen.edn"), JEPSEN_EDN).unwrap();
    let (code, _, stderr) = run(drift()
        .arg("convert")
        .arg(dir.join("jepsen.edn"))
        .arg(dir.join("jepsen.jsonl")));
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run(drift()
        .args(["bench", "checker"])
        .arg(&dir)
        .args(["--runs", "3", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let parse = v["parse_ms"].as_object().unwrap();
    assert!(
        parse["edn"].as_f64().unwrap() > 0.0 && parse["jsonl"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["verdict"] == "valid"), "{v}");
    let formats: Vec<&str> = rows.iter().map(|r| r["format"].as_str().unwrap()).collect();
    assert_eq!(formats, ["edn", "jsonl"]);
    // the table prints both lines
    let (_, stdout, _) = run(drift().args(["bench", "checker"]).arg(&dir).args(["--runs", "1"]));
    assert!(
        stdout.contains("parse    edn:") && stdout.contains("parse    jsonl:"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // no folder: no default outside the repository, an error saying so
    let (code, _, stderr) = run(drift().args(["bench", "checker", "--runs", "1"]));
    assert_ne!(code, 0);
    assert!(stderr.contains("name a folder of histories"), "{stderr}");
}

#[test]
fn bad_edn_exits_3_naming_file_and_line() {
    let dir = scratch("bad-edn");
    for (name, text, line, says) in [
        (
            "unbalanced.edn",
            "{:type :invoke, :f :read, :value nil, :process 0}\n{:type :ok, :f :read, :value [1 2, :process 0}\n",
            2,
            "not EDN",
        ),
        (
            "tag.edn",
            "{:type :invoke, :f :read, :value nil, :process 0}\n\n#my.app/Op {:type :ok}\n",
            3,
            "unknown tag #my.app/Op",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let (code, _, stderr) = run(drift().arg("check").arg(&path).arg("--out").arg(dir.join("o")));
        assert_eq!(code, 3, "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{}:{line}", path.display())) && stderr.contains(says),
            "{name}: {stderr}"
        );
        let (code, _, stderr) = run(drift().arg("convert").arg(&path).arg(dir.join("x.jsonl")));
        assert_eq!(code, 3, "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{}:{line}", path.display())),
            "{name}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn init_sets_what_every_key_holds_first() {
    let dir = scratch("init");
    let path = dir.join("kv.jsonl");
    std::fs::write(
        &path,
        concat!(
            "{\"index\":0,\"time\":0,\"process\":0,\"type\":\"invoke\",\"f\":\"get\",\"value\":null,\"key\":\"k\"}\n",
            "{\"index\":1,\"time\":1,\"process\":0,\"type\":\"ok\",\"f\":\"get\",\"value\":\"\",\"key\":\"k\"}\n"
        ),
    )
    .unwrap();
    let check = |extra: &[&str]| {
        let (code, _, stderr) = run(drift()
            .arg("check")
            .arg(&path)
            .args(["--model", "kv"])
            .args(extra)
            .arg("--out")
            .arg(dir.join("o")));
        (code, stderr)
    };
    assert_eq!(check(&["--init", "\"\""]).0, 0);
    assert_eq!(check(&[]).0, 1);
    let (code, stderr) = check(&["--init", "nope"]);
    assert_eq!(code, 3);
    assert!(stderr.contains("not JSON"), "{stderr}");
    let (code, stderr) = check(&["--init", "5"]);
    assert_eq!(code, 3);
    assert!(stderr.contains("a kv key starts at a string or null"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_empty_history_is_unknown_not_valid() {
    let dir = scratch("empty");
    let path = dir.join("empty.jsonl");
    std::fs::write(&path, "").unwrap();
    let (code, stdout, _) = run(drift().arg("check").arg(&path).arg("--out").arg(dir.join("o")));
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("nothing to judge"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `drift check --junit`: a test case per checker, the invalid one a
/// failure carrying its why, in the shape CI systems read (checked with
/// Python's own XML parser, not by matching strings).
#[test]
fn check_writes_junit_xml_a_ci_system_reads() {
    let root = scratch("junit");
    // write 1, then a read of 2 after it: not linearizable
    let history = root.join("bad.jsonl");
    std::fs::write(
        &history,
        [
            r#"{"index":0,"time":0,"process":0,"type":"invoke","f":"write","value":1}"#,
            r#"{"index":1,"time":10,"process":0,"type":"ok","f":"write","value":1}"#,
            r#"{"index":2,"time":20,"process":1,"type":"invoke","f":"read","value":null}"#,
            r#"{"index":3,"time":30,"process":1,"type":"ok","f":"read","value":2}"#,
        ]
        .join("\n")
            + "\n",
    )
    .unwrap();
    let xml = root.join("junit.xml");
    let (code, stdout, stderr) = run(drift()
        .arg("check")
        .arg(&history)
        .args(["--checker", "linearizable", "--checker", "stats", "--store"])
        .arg(root.join("store"))
        .arg("--junit")
        .arg(&xml));
    assert_eq!(code, 1, "{stdout}{stderr}");
    let script = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
suites = root.findall("testsuite")
assert len(suites) == 1
s = suites[0]
for el in (root, s):
    for a in ("tests", "failures", "errors", "time"):
        assert a in el.attrib, (el.tag, a)
cases = s.findall("testcase")
assert int(s.get("tests")) == len(cases) == 2, s.attrib
failed = [c for c in cases if c.find("failure") is not None]
assert int(s.get("failures")) == len(failed) == 1
f = failed[0]
assert f.get("name") == "linearizable" and f.get("classname"), f.attrib
print("why:", f.find("failure").get("message"))
print("text:", f.find("failure").text)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&xml)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("why: 1 of 1 keys not linearizable"), "{text}");
    assert!(text.contains("reproduce: drift check"), "{text}");
}

/// `ci/clickhouse_known.py`, which lets CI pass a ClickHouse smoke
/// campaign whose only findings are ClickHouse 18.16's own lost commit,
/// judged on what the dedup checker really reports. The history is a real
/// insert-retry run on ClickHouse 18.16 (on drift's keeper, no faults,
/// its coordinator's witness of block ids included), its first insert
/// then rewritten as a lost commit would leave it: answered 319 on its
/// replica, retried there and acknowledged, its rows twice in that
/// replica's final read. The script accepts that, and refuses the same
/// run where the 319 was not a lost connection or where the extra copy is
/// on a replica that never answered 319.
#[test]
fn ci_accepts_a_clickhouse_run_only_for_a_lost_commit_retried_on_its_writer() {
    use serde_json::{json, Value};
    let real = include_str!("data/clickhouse-insert-retry.jsonl");
    let lost = "Code: 319, e.displayText() = DB::Exception: Unknown status, client must retry. Reason: Connection loss, e.what() = DB::Exception";
    let timeout = "Code: 319, e.displayText() = DB::Exception: Unknown status, client must retry. Reason: Operation timeout, e.what() = DB::Exception";
    let dir = scratch("clickhouse-known");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/clickhouse_known.py");
    for (case, error, extra_copy_on, accepted) in [
        ("lost", lost, None, true),
        ("timeout", timeout, None, false),
        ("elsewhere", lost, Some("r3"), false),
    ] {
        let mut ops: Vec<Value> = real.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let inv = ops
            .iter()
            .position(|o| o["f"] == "insert" && o["type"] == "invoke")
            .unwrap();
        let (process, replica) = (ops[inv]["process"].clone(), ops[inv]["value"]["replica"].clone());
        let rows: Vec<Value> = ops[inv]["value"]["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|b| b["rows"].as_array().unwrap().clone())
            .collect();
        let done = inv + 1 + ops[inv + 1..].iter().position(|o| o["process"] == process).unwrap();
        ops[done]["type"] = json!("info");
        ops[done]["error"] = json!(error);
        let t = ops[done]["time"].as_i64().unwrap();
        let mut retry = ops[inv].clone();
        retry["value"]["attempt"] = json!(2);
        retry["time"] = json!(t + 1_000);
        let ok = json!({"index": 0, "time": t + 2_000, "process": process, "type": "ok", "f": "insert", "value": null, "node": replica});
        ops.splice(done + 1..done + 1, [retry, ok]);
        let holder = extra_copy_on.map_or(replica.clone(), |r| json!(r));
        let read = ops
            .iter_mut()
            .find(|o| o["f"] == "read" && o["type"] == "ok" && o["key"] == holder)
            .unwrap();
        let mut held = read["value"].as_array().unwrap().clone();
        held.extend(rows.iter().cloned());
        held.sort_by_key(|r| r[0].as_u64());
        read["value"] = json!(held);
        let run_dir = dir.join(case);
        std::fs::create_dir_all(&run_dir).unwrap();
        let text: String = ops
            .iter_mut()
            .enumerate()
            .map(|(k, o)| {
                o["index"] = json!(k);
                format!("{o}\n")
            })
            .collect();
        std::fs::write(run_dir.join("history.jsonl"), text).unwrap();
        let (code, stdout, stderr) = run(drift()
            .arg("check")
            .arg(run_dir.join("history.jsonl"))
            .args(["--checker", "dedup", "--out"])
            .arg(&run_dir));
        assert_eq!(
            code, 1,
            "{case}: the dedup checker finds the extra copy\n{stdout}{stderr}"
        );
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(&run_dir)
            .output()
            .expect("python3 runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.success(), accepted, "{case}: {said}");
        if accepted {
            let insert = ops[inv]["value"]["insert"].as_u64().unwrap();
            assert!(
                said.contains(&format!("insert {insert} on {}", replica.as_str().unwrap())),
                "{said}"
            );
        }
    }
}
