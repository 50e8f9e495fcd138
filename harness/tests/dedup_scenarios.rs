//! The insert-dedup scenarios, one test each, named after the scenario:
//! a 3-replica table on a 3-keeper cluster (5 keepers where two replicas
//! must be down while the keeper keeps its majority), driven by the
//! insert-retry workload's own client, every attempt and the final reads
//! recorded as a history and judged by the `dedup` checker. Each test
//! asserts the verdict and the finding its scenario expects.
//!
//! Failures are forced through the table's fault hooks, stopped or
//! killed processes and wiped directories; waits poll for the state they
//! need. Where a scenario is about time (the window by seconds), it
//! waits that time on purpose and then checks the state it produced.

mod common;

use common::cluster::{wait_for, Cluster};
use drift_checkers::checker::{CheckContext, Checker};
use drift_checkers::dedup::Dedup;
use drift_checkers::pairing::History;
use drift_checkers::Verdict;
use drift_workloads::table::{self, AttemptOutcome, Kind, LogicalInsert, Row};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zookeeper_client as zk;

const TABLE_PATH: &str = "/clickhouse/tables/inserts";
/// An attempt's answer within this, or it is `info`.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);

/// A history as the campaign records it, in memory.
#[derive(Default)]
struct Recorded {
    lines: Vec<Value>,
    next_process: u64,
}

struct Scn {
    c: Cluster,
    replicas: Vec<u64>,
    http: reqwest::Client,
    started: Instant,
    h: Arc<Mutex<Recorded>>,
}

impl Scn {
    /// The cluster, its table `inserts` with `settings`, on `nodes` nodes
    /// (replicas on the first three).
    fn up(tag: &str, port: u16, nodes: u64, settings: &[&str], window: (u64, u64)) -> Scn {
        let mut args = vec!["--fault-hooks", "--table", "inserts", "--table-replicas", "3"];
        let mut all: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        all.push(format!("replicated_deduplication_window = {}", window.0));
        all.push(format!("replicated_deduplication_window_seconds = {}", window.1));
        for s in &all {
            args.push("--table-setting");
            args.push(s);
        }
        let c = Cluster::up_nodes(tag, port, nodes, &args);
        let s = Scn {
            c,
            replicas: vec![1, 2, 3],
            http: reqwest::Client::builder().build().unwrap(),
            started: Instant::now(),
            h: Arc::new(Mutex::new(Recorded::default())),
        };
        s.record(
            "nemesis",
            "info",
            "dedup-window",
            json!({"window": window.0, "window_seconds": window.1, "epsilon_ms": 200, "replicas": ["r1", "r2", "r3"]}),
            None,
            None,
        );
        s
    }

    fn up3(tag: &str, port: u16, settings: &[&str]) -> Scn {
        Scn::up(tag, port, 3, settings, (1000, 3600))
    }

    fn url(&self, i: u64) -> String {
        format!("http://{}/", self.c.config().peer(i).unwrap().http.unwrap())
    }

    fn record(&self, process: &str, kind: &str, f: &str, value: Value, node: Option<&str>, error: Option<String>) {
        let time = self.started.elapsed().as_nanos() as i64;
        let mut h = self.h.lock().unwrap();
        let index = h.lines.len();
        let process: Value = process.parse::<u64>().map_or(json!(process), |p| json!(p));
        let mut line = json!({"index": index, "time": time, "process": process, "type": kind, "f": f, "value": value});
        if let Some(n) = node {
            line["node"] = json!(n);
            // a final read is keyed by its replica, as campaigns record it
            if f == "read" {
                line["key"] = json!(n);
            }
        }
        if let Some(e) = error {
            line["error"] = json!(e);
        }
        h.lines.push(line);
    }

    fn process(&self) -> u64 {
        let mut h = self.h.lock().unwrap();
        h.next_process += 1;
        h.next_process
    }

    /// Attempt `n` of `l` on replica `i`, recorded as the campaign records it.
    async fn attempt(&self, l: &LogicalInsert, n: u32, i: u64) -> AttemptOutcome {
        let p = self.process().to_string();
        let name = format!("r{i}");
        self.record(&p, "invoke", "insert", l.invoke_value(n, &name), Some(&name), None);
        let o = table::attempt(&self.http, &self.url(i), l, n, ATTEMPT_TIMEOUT, &table::Dialect::DRIFT).await;
        let (kind, value, error) = match &o {
            AttemptOutcome::Ok(s) => ("ok", s.clone(), None),
            AttemptOutcome::Fail(code, why) => ("fail", json!({"code": code}), Some(why.clone())),
            AttemptOutcome::Info(code, why) => ("info", json!({"code": code}), Some(why.clone())),
        };
        self.record(&p, kind, "insert", value, Some(&name), error);
        o
    }

    /// An attempt that must come back `ok`; its server summary.
    async fn ok(&self, l: &LogicalInsert, n: u32, i: u64) -> Value {
        match self.attempt(l, n, i).await {
            AttemptOutcome::Ok(s) => s,
            other => panic!("insert {} attempt {n} on r{i}: {other:?}", l.id),
        }
    }

    /// Retries `l` on `replicas` in turn until `ok` (at most `max` tries).
    async fn until_ok(&self, l: &LogicalInsert, first_n: u32, replicas: &[u64], max: u32) -> Value {
        for k in 0..max {
            let i = replicas[k as usize % replicas.len()];
            if let AttemptOutcome::Ok(s) = self.attempt(l, first_n + k, i).await {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("insert {} never came back ok", l.id);
    }

    /// `SYSTEM SYNC REPLICA` and a read of every replica, recorded.
    async fn final_reads(&self) {
        for &i in &self.replicas {
            let name = format!("r{i}");
            let p = self.process().to_string();
            self.record(&p, "invoke", "read", Value::Null, Some(&name), None);
            let rows = table::sync_and_read(&self.http, &self.url(i), Duration::from_secs(60))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            self.record(&p, "ok", "read", Value::Array(rows), Some(&name), None);
        }
    }

    /// Final reads, then the dedup checker's verdict and details.
    async fn judge(&self) -> (Verdict, Value) {
        self.final_reads().await;
        let path = std::env::temp_dir().join(format!("drift-dedup-{}-{}.jsonl", self.c.port, std::process::id()));
        let text: String = self.h.lock().unwrap().lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let h = History::load(&path).unwrap();
        let r = Dedup.check(&h, &CheckContext::new(None, 1 << 30)).unwrap();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&path);
        }
        (r.verdict, r.details)
    }

    fn hook(&self, i: u64, hook: &str) {
        let answer = self.c.admin(i, &format!("table {hook}"));
        assert_eq!(answer.trim(), "ok", "hook {hook} on node {i}");
    }

    fn writable(&self, i: u64) -> bool {
        let addr = self.c.config().peer(i).unwrap().http.unwrap();
        replicas_status_ok(addr)
    }

    fn wait(&self, what: &str, mut f: impl FnMut() -> bool) {
        wait_for(Duration::from_secs(60), || f().then_some(()))
            .unwrap_or_else(|| panic!("timed out waiting for {what}"));
    }

    /// Removes replica i's table data (its keeper keeps its own).
    fn wipe_table(&self, i: u64) {
        std::fs::remove_dir_all(self.c.config().node_dir(i).join("tables")).unwrap();
    }

    /// Server i killed (SIGKILL), its table data gone, started again and
    /// writable (its replica cloned a healthy one).
    fn lose_disk(&self, i: u64) {
        tokio::task::block_in_place(|| {
            self.c.kill(i);
            self.wipe_table(i);
            self.c.start(i);
        });
        self.wait("the wiped replica back", || self.writable(i));
    }

    /// Fetches on `replicas` resumed (`on`) or stopped.
    fn fetches(&self, replicas: &[u64], on: bool) {
        for &i in replicas {
            self.hook(i, if on { "resume-fetches" } else { "stop-fetches" });
        }
    }
}

/// `GET /replicas_status` answers 200 (the replica is writable).
fn replicas_status_ok(addr: std::net::SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /replicas_status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn count(details: &Value, kind: &str) -> u64 {
    details["counts"][kind].as_u64().unwrap_or(0)
}

/// A logical insert of `rows` rows tagged `L<id>` in partition `p`.
fn plain(id: u64, p: u64, rows: u64) -> LogicalInsert {
    LogicalInsert {
        id,
        kind: Kind::Plain,
        rows: (0..rows)
            .map(|k| Row {
                id: id * 16 + k,
                p,
                tag: format!("L{id}"),
            })
            .collect(),
        token: None,
        quorum: 0,
        quorum_parallel: true,
        max_block_rows: None,
    }
}

fn with_quorum(mut l: LogicalInsert, q: u32, parallel: bool) -> LogicalInsert {
    l.quorum = q;
    l.quorum_parallel = parallel;
    l.kind = if parallel {
        Kind::Quorum
    } else {
        Kind::QuorumNonParallel
    };
    l
}

fn with_token(mut l: LogicalInsert, t: &str) -> LogicalInsert {
    l.token = Some(t.to_string());
    l.kind = Kind::Token;
    l
}

fn assert_valid(v: Verdict, d: &Value) {
    assert_eq!(v, Verdict::Valid, "{d:#}");
}

/// Copies of every acknowledged block exactly once on all three replicas.
fn assert_each_once(d: &Value, blocks: u64) {
    assert_eq!(d["exactly_once_per_replica"].as_u64(), Some(3 * blocks), "{d:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_01_unique_single_block_inserts_appear_once_each() {
    let s = Scn::up3("dd01", 23010, &[]);
    for id in 1..=12 {
        s.ok(&plain(id, id % 4, 2), 1, 1 + id % 3).await;
    }
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 12);
}

/// Scenarios 2 and 3: the insert commits, its reply is dropped, the
/// client retries the same rows on replica `retry_on`.
async fn a_dropped_reply_retried_on(tag: &str, port: u16, retry_on: u64) {
    let s = Scn::up3(tag, port, &[]);
    let l = plain(1, 0, 3);
    s.hook(1, "drop-insert-reply");
    assert!(matches!(s.attempt(&l, 1, 1).await, AttemptOutcome::Info(..)));
    let summary = s.ok(&l, 2, retry_on).await;
    assert_eq!(
        summary["deduplicated_blocks"], 1,
        "the retry was deduplicated (cluster-wide)"
    );
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_02_a_dropped_reply_retried_on_the_same_replica_is_kept_once() {
    a_dropped_reply_retried_on("dd02", 23020, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_03_a_dropped_reply_retried_on_another_replica_is_kept_once() {
    a_dropped_reply_retried_on("dd03", 23030, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_04_a_writer_cut_from_the_keeper_during_its_commit_answers_ok_or_319_and_nothing_is_lost() {
    let s = Scn::up3("dd04", 23040, &[]);
    // the commit's reply lost: the writer settles it through the lock, ok
    let a = plain(1, 0, 2);
    s.hook(1, "fail-commit-reply");
    s.ok(&a, 1, 1).await;
    // the commit applied, the reply lost and the writer cut off at that
    // moment: it cannot settle it in time, 319, and the client retries
    let b = plain(2, 1, 2);
    s.hook(1, "cut-after-commit");
    match s.attempt(&b, 1, 1).await {
        AttemptOutcome::Info(Some(319), _) => {}
        other => panic!("expected 319: {other:?}"),
    }
    s.hook(1, "keeper-heal");
    s.wait("r1 back", || s.writable(1));
    let summary = s.until_ok(&b, 2, &[2, 1], 5).await;
    assert_eq!(summary["deduplicated_blocks"], 1, "the 319'd insert had committed");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_05_inserts_retried_while_the_keeper_ensemble_restarts_in_a_loop_stay_valid() {
    let s = Arc::new(Scn::up3("dd05", 23050, &[]));
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            for id in 1..=30u64 {
                let l = plain(id, id % 3, 2);
                for n in 1..=20u32 {
                    // a definite failure (a replica restarting) is tried again too
                    match s.attempt(&l, n, 1 + (id + n as u64) % 3).await {
                        AttemptOutcome::Ok(_) => break,
                        _ => tokio::time::sleep(Duration::from_millis(150)).await,
                    }
                }
            }
        })
    };
    // every keeper restarted in turn, twice, while the writer goes on
    for _ in 0..2 {
        for i in 1..=3 {
            tokio::task::block_in_place(|| {
                s.c.stop(i);
                s.c.start(i);
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    writer.await.unwrap();
    for i in 1..=3 {
        s.wait("every replica back", || s.writable(i));
    }
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert!(d["ok"].as_u64().unwrap() >= 25, "inserts got through: {d:#}");
    assert!(
        d["fail"].as_u64().unwrap() + d["info"].as_u64().unwrap() > 0,
        "the restarts bit: {d:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_06_a_writer_killed_after_its_commit_before_any_fetch_keeps_its_part() {
    let s = Scn::up3("dd06", 23060, &[]);
    s.fetches(&[2, 3], false);
    s.ok(&plain(1, 0, 3), 1, 1).await;
    tokio::task::block_in_place(|| {
        s.c.kill(1);
        s.c.start(1);
    });
    s.wait("r1 back", || s.writable(1));
    s.fetches(&[2, 3], true);
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
}

/// The writer loses its disk before any replica fetched the part, and the
/// application, which never heard back, re-sends: the block id survived
/// at the keeper, so the retry is deduplicated and answered ok, but the
/// rows are nowhere. ClickHouse's #55109 pattern; the checker must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_07_a_writer_wiped_before_any_fetch_and_a_resent_insert_is_lost_after_dedup() {
    let s = Scn::up3("dd07", 23070, &[]);
    s.fetches(&[2, 3], false);
    let l = plain(1, 0, 3);
    s.hook(1, "drop-insert-reply");
    assert!(matches!(s.attempt(&l, 1, 1).await, AttemptOutcome::Info(..)));
    s.lose_disk(1);
    let summary = s.ok(&l, 2, 2).await;
    assert_eq!(
        summary["deduplicated_blocks"], 1,
        "the surviving id swallowed the retry"
    );
    s.fetches(&[2, 3], true);
    let (v, d) = s.judge().await;
    assert_eq!(v, Verdict::Invalid, "{d:#}");
    assert_eq!(count(&d, "lost-after-dedup"), 3, "missing on every replica: {d:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_08_quorum_2_of_3_with_one_replica_not_fetching_is_once_everywhere_after_heal() {
    let s = Scn::up3("dd08", 23080, &[]);
    s.hook(3, "stop-fetches");
    for id in 1..=4 {
        s.ok(&with_quorum(plain(id, id % 2, 2), 2, true), 1, 1 + id % 2).await;
    }
    s.hook(3, "resume-fetches");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_09_quorum_3_of_3_with_fetches_stopped_gives_319s_retried_until_ok_without_a_duplicate() {
    let s = Scn::up3("dd09", 23090, &[]);
    s.hook(3, "stop-fetches");
    let l = with_quorum(plain(1, 0, 2), 3, true);
    let mut n = 1;
    // the quorum cannot be reached: 319 (or a timeout) every time
    for _ in 0..2 {
        let o = s.attempt(&l, n, 1).await;
        assert!(matches!(o, AttemptOutcome::Info(..)), "{o:?}");
        n += 1;
    }
    s.hook(3, "resume-fetches");
    s.until_ok(&l, n, &[1, 2], 10).await;
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_10_non_parallel_quorum_writers_get_286_and_a_286_attempt_is_absent() {
    let s = Arc::new(Scn::up3("dd10", 23100, &[]));
    s.fetches(&[2, 3], false);
    // the first quorum insert commits and waits for its quorum
    let first = with_quorum(plain(1, 0, 1), 2, false);
    let waiting = {
        let (s, l) = (s.clone(), first.clone());
        tokio::spawn(async move { s.attempt(&l, 1, 1).await })
    };
    let zk = common::cluster::connect(&s.c.connect).await;
    let status = format!("{TABLE_PATH}/quorum/status");
    let deadline = Instant::now() + Duration::from_secs(30);
    while zk.check_stat(&status).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the first quorum never became pending");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // a second writer, non-parallel: the previous quorum is unsatisfied
    let second = with_quorum(plain(2, 1, 1), 2, false);
    let o = s.attempt(&second, 1, 2).await;
    assert!(matches!(o, AttemptOutcome::Fail(Some(286), _)), "{o:?}");
    s.fetches(&[2, 3], true);
    if !matches!(waiting.await.unwrap(), AttemptOutcome::Ok(_)) {
        s.until_ok(&first, 2, &[1, 2], 5).await;
    }
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
    assert_eq!(d["fail"].as_u64(), Some(1), "the 286 counted as failed: {d:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_11_a_319_writer_wiped_before_any_fetch_frees_its_id_and_the_retry_inserts_once() {
    let s = Scn::up3("dd11", 23110, &[]);
    s.fetches(&[2, 3], false);
    let l = with_quorum(plain(1, 0, 2), 2, true);
    // the quorum times out (319); the writer then loses its disk
    let o = s.attempt(&l, 1, 1).await;
    assert!(matches!(o, AttemptOutcome::Info(..)), "{o:?}");
    tokio::task::block_in_place(|| {
        s.c.stop(1);
        s.wipe_table(1);
        s.c.start(1);
    });
    s.wait("r1 back", || s.writable(1));
    s.fetches(&[2, 3], true);
    // no replica holds the part: a replica that tries to fetch it marks its
    // quorum failed and frees its id in one multi. Until then a retry is
    // deduplicated against the lost part, so the retry waits for that mark
    let zk = common::cluster::connect(&s.c.connect).await;
    let failed = format!("{TABLE_PATH}/quorum/failed_parts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while zk.list_children(&failed).await.map_or(true, |kids| kids.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "no replica marked the lost part's quorum failed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let summary = s.until_ok(&l, 2, &[2, 3], 20).await;
    assert_eq!(summary["written_blocks"], 1, "a fresh insert: {summary}");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_12_quorum_2_with_two_of_three_replicas_killed_gets_285_and_failed_attempts_are_absent() {
    let s = Scn::up("dd12", 23120, 5, &[], (1000, 3600));
    s.ok(&plain(1, 0, 1), 1, 1).await;
    tokio::task::block_in_place(|| {
        s.c.kill(2);
        s.c.kill(3);
    });
    // the dead replicas' is_active go with their sessions
    let deadline = Instant::now() + Duration::from_secs(60);
    let l = with_quorum(plain(2, 1, 2), 2, true);
    let mut n = 1;
    loop {
        match s.attempt(&l, n, 1).await {
            AttemptOutcome::Fail(Some(285), _) => break,
            other => {
                assert!(Instant::now() < deadline, "never 285: {other:?}");
                assert!(!matches!(other, AttemptOutcome::Ok(_)), "a quorum of one");
            }
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::task::block_in_place(|| {
        s.c.start(2);
        s.c.start(3);
    });
    for i in [2, 3] {
        s.wait("the replicas back", || s.writable(i));
    }
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert!(d["fail"].as_u64().unwrap() >= 1, "{d:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_13_equal_rows_in_two_untokened_inserts_are_kept_once() {
    let s = Scn::up3("dd13", 23130, &[]);
    let a = plain(1, 0, 3);
    let mut b = a.clone();
    b.id = 2;
    b.kind = Kind::EqualContent;
    s.ok(&a, 1, 1).await;
    let summary = s.ok(&b, 1, 2).await;
    assert_eq!(summary["deduplicated_blocks"], 1);
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_14_equal_rows_under_distinct_tokens_are_kept_twice() {
    let s = Scn::up3("dd14", 23140, &[]);
    let a = with_token(plain(1, 0, 3), "ta");
    let mut b = with_token(a.clone(), "tb");
    b.id = 2;
    s.ok(&a, 1, 1).await;
    let summary = s.ok(&b, 1, 2).await;
    assert_eq!(summary["written_blocks"], 1, "another token, another block");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    for i in 1..=3 {
        let n = s
            .http
            .post(s.url(i))
            .body("SELECT count() FROM inserts")
            .send()
            .await
            .unwrap();
        assert_eq!(n.text().await.unwrap().trim(), "6", "r{i}: both copies");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_15_a_token_reused_with_other_rows_keeps_only_the_first_rows() {
    let s = Scn::up3("dd15", 23150, &[]);
    let a = with_token(plain(1, 0, 2), "t");
    let mut b = with_token(plain(2, 0, 2), "t");
    b.kind = Kind::TokenReuse;
    s.ok(&a, 1, 1).await;
    let summary = s.ok(&b, 1, 2).await;
    assert_eq!(summary["deduplicated_blocks"], 1, "the token's block exists");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);
}

/// The block ids the keeper holds for the table.
async fn block_ids(zk: &zk::Client) -> Vec<String> {
    zk.list_children(&format!("{TABLE_PATH}/blocks")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_16_a_window_of_5_ids_dedups_a_retry_after_2_others_and_may_not_after_20() {
    let s = Scn::up("dd16", 23160, 3, &["cleanup_delay_period_ms = 200"], (5, 3600));
    let zk = common::cluster::connect(&s.c.connect).await;
    // A: X, two others, retry X: inside the window, exactly once
    let x = plain(1, 0, 1);
    s.ok(&x, 1, 1).await;
    for id in 2..=3 {
        s.ok(&plain(id, 1, 1), 1, 2).await;
    }
    s.ok(&x, 2, 3).await;
    // B: Y, twenty others, the cleanup drops Y's id, retry Y: 1 or 2 copies
    let y = plain(10, 2, 1);
    s.ok(&y, 1, 1).await;
    for id in 11..=30 {
        s.ok(&plain(id, 3, 1), 1, 2).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while block_ids(&zk).await.len() > 5 {
        assert!(Instant::now() < deadline, "the leader never cleaned up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let summary = s.ok(&y, 2, 3).await;
    assert_eq!(summary["written_blocks"], 1, "Y's id was gone: a second copy");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_eq!(
        count(&d, "unknown-window"),
        3,
        "Y twice on each replica, reported: {d:#}"
    );
    assert_eq!(count(&d, "duplicate-in-window") + count(&d, "duplicate"), 0, "{d:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_17_a_window_of_2_seconds_never_expires_an_idle_tables_id_but_does_after_a_newer_block() {
    let s = Scn::up("dd17", 23170, 3, &["cleanup_delay_period_ms = 200"], (1000, 2));
    let zk = common::cluster::connect(&s.c.connect).await;
    // A: X, 5 s of nothing, retry X: the newest id never expires, once
    let x = plain(1, 0, 1);
    s.ok(&x, 1, 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(block_ids(&zk).await.len(), 1, "an idle table keeps its newest id");
    let summary = s.ok(&x, 2, 2).await;
    assert_eq!(summary["deduplicated_blocks"], 1);
    // B: Y, 5 s, Z (newer by more than the window), Y's id goes, retry Y
    let y = plain(2, 1, 1);
    s.ok(&y, 1, 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    s.ok(&plain(3, 2, 1), 1, 2).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while block_ids(&zk).await.len() > 1 {
        assert!(Instant::now() < deadline, "the old ids were never cleaned up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let summary = s.ok(&y, 2, 3).await;
    assert_eq!(summary["written_blocks"], 1, "Y's id aged out: a second copy");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_eq!(
        count(&d, "unknown-window"),
        3,
        "Y twice on each replica, reported: {d:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_18_a_tokened_multi_block_retry_with_its_split_is_valid_and_with_another_is_flagged() {
    let s = Scn::up3("dd18", 23180, &[]);
    let mut l = with_token(plain(1, 0, 4), "t18");
    l.max_block_rows = Some(1);
    s.hook(1, "drop-insert-reply");
    assert!(matches!(s.attempt(&l, 1, 1).await, AttemptOutcome::Info(..)));
    let summary = s.ok(&l, 2, 2).await;
    assert_eq!(
        summary["deduplicated_blocks"], 4,
        "the same split: every block deduplicated"
    );
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 4);

    let s = Scn::up3("dd18b", 23185, &[]);
    s.hook(1, "drop-insert-reply");
    assert!(matches!(s.attempt(&l, 1, 1).await, AttemptOutcome::Info(..)));
    let mut resplit = l.clone();
    resplit.max_block_rows = Some(2);
    s.ok(&resplit, 2, 2).await;
    let (v, d) = s.judge().await;
    assert_eq!(v, Verdict::Invalid, "{d:#}");
    assert_eq!(count(&d, "nonidempotent-retry"), 1, "{d:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_19_a_duplicate_partition_block_is_dropped_and_a_new_partition_block_inserted() {
    let s = Scn::up3("dd19", 23190, &[]);
    let mut a = plain(1, 0, 2);
    a.rows.extend((0..2).map(|k| Row {
        id: 1000 + k,
        p: 1,
        tag: "L1".into(),
    }));
    s.ok(&a, 1, 1).await;
    // the partition-0 rows again, and a new partition-2 row
    let mut b = plain(2, 2, 1);
    b.rows.extend(a.rows.iter().filter(|r| r.p == 0).cloned());
    b.kind = Kind::MultiPartition;
    let summary = s.ok(&b, 1, 2).await;
    assert_eq!(
        (
            summary["written_blocks"].as_u64(),
            summary["deduplicated_blocks"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_20_a_replica_cut_off_until_marked_lost_clones_and_converges() {
    let s = Scn::up3(
        "dd20",
        23200,
        &[
            "cleanup_delay_period_ms = 200",
            "min_replicated_logs_to_keep = 2",
            "max_replicated_logs_to_keep = 4",
        ],
    );
    let zk = common::cluster::connect(&s.c.connect).await;
    s.hook(3, "keeper-cut");
    for id in 1..=12 {
        s.ok(&plain(id, id % 3, 1), 1, 1 + id % 2).await;
    }
    let lost = format!("{TABLE_PATH}/replicas/r3/is_lost");
    let deadline = Instant::now() + Duration::from_secs(60);
    while zk.get_data(&lost).await.unwrap().0 != b"1" {
        assert!(Instant::now() < deadline, "r3 was never marked lost");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.hook(3, "keeper-heal");
    s.wait("r3 back", || s.writable(3));
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_21_a_writer_stopped_past_its_session_during_a_commit_leaves_a_gap_merges_cross() {
    let s = Arc::new(Scn::up3("dd21", 23210, &["parts_to_merge_min = 1000"]));
    // through the servers that stay up: r1's will be stopped
    let zk = common::cluster::connect(&s.c.connect_to(&[2, 3])).await;
    s.ok(&plain(1, 0, 1), 1, 1).await;
    // r1's next insert takes its block number and holds at its commit
    s.hook(1, "hold-commits");
    let l = plain(2, 0, 1);
    let held = {
        let (s, l) = (s.clone(), l.clone());
        tokio::spawn(async move { s.attempt(&l, 1, 1).await })
    };
    s.wait("the commit to hold", || {
        s.c.log(1).contains("\"event\":\"commit_held\"")
    });
    // SIGSTOP past the session timeout: the lock, an ephemeral, vanishes
    let pid = s.c.pid(1).to_string();
    std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    let numbers = format!("{TABLE_PATH}/block_numbers/0");
    let deadline = Instant::now() + Duration::from_secs(60);
    // a linearizable read fails while the stopped server's keeper was the
    // leader and the others elect a new one: asked again
    while !zk.list_children(&numbers).await.is_ok_and(|c| c.is_empty()) {
        assert!(Instant::now() < deadline, "the held lock never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap();
    s.hook(1, "release-commits");
    // the held commit cannot happen under the number it held: the replica
    // found it not committed and inserted under a fresh number, or gave
    // up and the client retries elsewhere
    match held.await.unwrap() {
        AttemptOutcome::Ok(summary) => {
            assert_ne!(summary["parts"][0], "0_1_1_0", "not under the dead number: {summary}")
        }
        _ => {
            s.until_ok(&l, 2, &[2, 3], 10).await;
        }
    }
    s.ok(&plain(3, 0, 1), 1, 2).await;
    s.wait("r1 back", || s.writable(1));
    // the dead number is a gap a merge may cross
    let mut parts = String::new();
    for _ in 0..50 {
        let r = s
            .http
            .post(s.url(2))
            .body("OPTIMIZE TABLE inserts FINAL")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
        parts = s
            .http
            .post(s.url(2))
            .body("SELECT name FROM system.parts WHERE active AND partition = '0' FORMAT TabSeparated")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if parts.trim().lines().count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(parts.trim().lines().count(), 1, "merged across the gap: {parts}");
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_22_a_transfer_cut_mid_fetch_is_refused_and_fetched_again_without_a_torn_block() {
    let s = Scn::up3("dd22", 23220, &[]);
    s.hook(1, "truncate-next-part");
    s.hook(2, "corrupt-next-part");
    for id in 1..=4 {
        s.ok(&plain(id, 0, 3), 1, 1 + id % 2).await;
    }
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 4);
    assert_eq!(count(&d, "torn-block"), 0);
}

/// The commit's reply is lost and the client gives up during the
/// recovery: the retry is answered ok by dedup. Valid when the rows are
/// there (the table kept them); when the writer's disk went with them
/// before anyone fetched, the retry was swallowed and the checker must
/// say lost-after-dedup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_23_a_lost_commit_reply_recovered_in_the_background_is_valid_iff_its_rows_survive() {
    // the rows survive: valid
    let s = Scn::up3("dd23", 23230, &[]);
    let l = plain(1, 0, 2);
    s.hook(1, "fail-commit-reply");
    s.hook(1, "drop-insert-reply");
    assert!(matches!(s.attempt(&l, 1, 1).await, AttemptOutcome::Info(..)));
    let summary = s.ok(&l, 2, 2).await;
    assert_eq!(summary["deduplicated_blocks"], 1);
    let (v, d) = s.judge().await;
    assert_valid(v, &d);
    assert_each_once(&d, 1);

    // the rows gone with the writer's disk: lost-after-dedup
    let s = Scn::up3("dd23b", 23235, &[]);
    s.fetches(&[2, 3], false);
    s.hook(1, "fail-commit-reply");
    s.hook(1, "drop-insert-reply");
    assert!(matches!(s.attempt(&l, 1, 1).await, AttemptOutcome::Info(..)));
    s.lose_disk(1);
    let summary = s.ok(&l, 2, 2).await;
    assert_eq!(summary["deduplicated_blocks"], 1, "swallowed by the surviving id");
    s.fetches(&[2, 3], true);
    let (v, d) = s.judge().await;
    assert_eq!(v, Verdict::Invalid, "{d:#}");
    assert_eq!(count(&d, "lost-after-dedup"), 3, "{d:#}");
}
