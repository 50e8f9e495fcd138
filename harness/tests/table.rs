//! The replicated table in `drift cluster up`: 3 replicas on a 3-keeper
//! cluster (5 keepers where two replicas must be down while the keeper
//! keeps its majority), driven over ClickHouse's HTTP interface. Every
//! failure is forced through a fault hook, a stopped process or a held
//! lock; waits poll for the state they need. Each scenario ends by
//! reading the rows of every replica.

mod common;

use common::cluster::{connect, wait_for, Cluster};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use zookeeper_client as zk;

const TABLE_PATH: &str = "/clickhouse/tables/events";

struct Http {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// One HTTP/1.1 request with `Connection: close`; `Err` when the server
/// closed without an answer.
fn http(addr: SocketAddr, method: &str, target: &str, body: &str) -> Result<Http, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no answer: {raw:?}"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("no status line")?;
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    Ok(Http {
        status,
        headers,
        body: body.to_string(),
    })
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Table {
    c: Cluster,
}

impl Table {
    fn up(tag: &str, port: u16, extra: &[&str]) -> Table {
        let mut args = vec!["--fault-hooks"];
        args.extend_from_slice(extra);
        Table {
            c: Cluster::up_raw(tag, port, &args),
        }
    }

    /// A table whose leader cleans up every 200 ms, with `settings`.
    fn up_cleaning(tag: &str, port: u16, settings: &[&str]) -> Table {
        let mut args = Vec::new();
        for s in settings
            .iter()
            .chain(&["cleanup_delay_period_ms = 200", "merge_selecting_period_ms = 100"])
        {
            args.push("--table-setting");
            args.push(s);
        }
        Table::up(tag, port, &args)
    }

    fn up5(tag: &str, port: u16) -> Table {
        Table {
            c: Cluster::up_nodes(tag, port, 5, &["--fault-hooks", "--table-replicas", "3"]),
        }
    }

    fn http_addr(&self, i: u64) -> SocketAddr {
        self.c.config().peer(i).unwrap().http.unwrap()
    }

    /// Runs `sql` on replica i; panics unless it answers 200.
    fn query(&self, i: u64, sql: &str) -> String {
        let r = http(self.http_addr(i), "POST", "/", sql).unwrap();
        assert_eq!(r.status, 200, "{sql} on r{i}: {}", r.body);
        r.body
    }

    /// An insert of `rows` (JSONEachRow) on replica i with URL settings.
    fn insert(&self, i: u64, rows: &str, settings: &str) -> Result<Http, String> {
        let q = enc("INSERT INTO events FORMAT JSONEachRow");
        let target = if settings.is_empty() {
            format!("/?query={q}")
        } else {
            format!("/?query={q}&{settings}")
        };
        http(self.http_addr(i), "POST", &target, rows)
    }

    fn insert_ok(&self, i: u64, rows: &str, settings: &str) -> serde_json::Value {
        let r = self.insert(i, rows, settings).unwrap();
        assert_eq!(r.status, 200, "insert on r{i}: {}", r.body);
        serde_json::from_str(&r.headers["x-drift-insert"]).unwrap()
    }

    fn sync(&self, i: u64) {
        self.query(i, "SYSTEM SYNC REPLICA events");
    }

    /// Replica i's rows as `id:key:value`, sorted.
    fn rows(&self, i: u64) -> Vec<String> {
        let body = self.query(
            i,
            "SELECT id, key, value FROM events ORDER BY id, key, value FORMAT TabSeparated",
        );
        body.lines().map(|l| l.replace('\t', ":")).collect()
    }

    /// Syncs every replica and checks each holds exactly `want`.
    fn assert_rows_everywhere(&self, replicas: &[u64], want: &[&str]) {
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        for &i in replicas {
            self.sync(i);
            let mut got = self.rows(i);
            got.sort();
            assert_eq!(got, want, "rows on r{i}");
        }
    }

    fn hook(&self, i: u64, hook: &str) {
        let answer = self.c.admin(i, &format!("table {hook}"));
        assert_eq!(answer.trim(), "ok", "hook {hook} on node {i}");
    }

    fn event(&self, i: u64, name: &str) -> u64 {
        self.query(i, &format!("SELECT value FROM system.events WHERE event = '{name}'"))
            .trim()
            .parse()
            .unwrap_or(0)
    }

    /// Active parts of replica i (`name` sorted).
    fn parts(&self, i: u64) -> Vec<String> {
        self.query(i, "SELECT name FROM system.parts WHERE active = 1 ORDER BY name")
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn wait(&self, what: &str, mut f: impl FnMut() -> bool) {
        wait_for(Duration::from_secs(30), || f().then_some(()))
            .unwrap_or_else(|| panic!("timed out waiting for {what}"));
    }
}

fn row(id: u64, key: &str, value: i64) -> String {
    format!("{{\"id\":{id},\"key\":\"{key}\",\"value\":{value}}}\n")
}

#[test]
fn inserts_replicate_to_every_replica_and_a_resent_insert_is_kept_once() {
    let t = Table::up("tbl-repl", 22100, &[]);
    let data = format!("{}{}{}", row(1, "a", 10), row(2, "b", -5), row(1500, "c", 7));
    let first = t.insert_ok(1, &data, "");
    assert_eq!(
        (first["written_blocks"].as_u64(), first["deduplicated_blocks"].as_u64()),
        (Some(2), Some(0))
    );
    // the same insert sent to another replica: both blocks are duplicates
    let again = t.insert_ok(2, &data, "");
    assert_eq!(
        (again["written_blocks"].as_u64(), again["deduplicated_blocks"].as_u64()),
        (Some(0), Some(2))
    );
    t.assert_rows_everywhere(&[1, 2, 3], &["1:a:10", "2:b:-5", "1500:c:7"]);
    // two round trips per committed block (plus one per partition's first block)
    assert_eq!(t.event(1, "InsertedBlocks"), 2);
    assert_eq!(t.event(1, "InsertKeeperRoundTrips"), 2 * 2 + 2);
    assert_eq!(
        t.event(2, "InsertKeeperRoundTrips"),
        2,
        "a duplicate costs one round trip"
    );
    // the replicas fetched it
    assert_eq!(
        t.event(2, "ReplicatedPartFetches") + t.event(3, "ReplicatedPartFetches"),
        4
    );
}

#[test]
fn dedup_by_content_by_token_and_per_partition() {
    let t = Table::up("tbl-dedup", 22110, &[]);
    // a 2-partition insert whose partition-0 block is a duplicate inserts the other
    t.insert_ok(1, &row(1, "a", 1), "");
    let s = t.insert_ok(2, &format!("{}{}", row(1, "a", 1), row(1001, "b", 1)), "");
    assert_eq!(
        (s["written_blocks"].as_u64(), s["deduplicated_blocks"].as_u64()),
        (Some(1), Some(1))
    );
    // the same token with different data keeps the first
    t.insert_ok(1, &row(5, "tok", 1), "insert_deduplication_token=t1");
    let s = t.insert_ok(3, &row(6, "tok", 2), "insert_deduplication_token=t1");
    assert_eq!(s["deduplicated_blocks"].as_u64(), Some(1));
    // distinct tokens over equal content are two inserts
    t.insert_ok(1, &row(7, "same", 1), "insert_deduplication_token=u1");
    t.insert_ok(1, &row(7, "same", 1), "insert_deduplication_token=u2");
    // insert_deduplicate=0 keeps both
    t.insert_ok(2, &row(9, "nodedup", 1), "insert_deduplicate=0");
    t.insert_ok(2, &row(9, "nodedup", 1), "insert_deduplicate=0");
    t.assert_rows_everywhere(
        &[1, 2, 3],
        &[
            "1:a:1",
            "1001:b:1",
            "5:tok:1",
            "7:same:1",
            "7:same:1",
            "9:nodedup:1",
            "9:nodedup:1",
        ],
    );
}

#[test]
fn the_window_by_count_keeps_the_newest_ids_only() {
    let t = Table::up_cleaning("tbl-wcount", 22120, &["replicated_deduplication_window = 3"]);
    let x = row(1, "x", 1);
    t.insert_ok(1, &x, "");
    t.insert_ok(1, &row(2, "y", 1), "");
    t.insert_ok(1, &row(3, "y", 1), "");
    // inside the window (3 newest ids): deduplicated, whatever cleanup did
    let s = t.insert_ok(2, &x, "");
    assert_eq!(s["deduplicated_blocks"].as_u64(), Some(1));
    for id in 4..=6 {
        t.insert_ok(1, &row(id, "y", 1), "");
    }
    // 6 ids, 3 kept: the leader removes x's and the next two
    t.wait("the leader to remove 3 block ids", || {
        (1..=3).map(|i| t.event(i, "CleanedBlockIds")).sum::<u64>() >= 3
    });
    let s = t.insert_ok(3, &x, "");
    assert_eq!(
        s["written_blocks"].as_u64(),
        Some(1),
        "outside the window x is inserted anew"
    );
    t.assert_rows_everywhere(
        &[1, 2, 3],
        &["1:x:1", "1:x:1", "2:y:1", "3:y:1", "4:y:1", "5:y:1", "6:y:1"],
    );
}

#[test]
fn the_window_by_age_counts_from_the_newest_id_so_an_idle_table_keeps_it() {
    let t = Table::up_cleaning("tbl-wage", 22130, &["replicated_deduplication_window_seconds = 1"]);
    let x = row(1, "x", 1);
    t.insert_ok(1, &x, "");
    // the window's length passes with nothing newer, and cleanups run
    let after = Instant::now() + Duration::from_millis(1500);
    let runs = |t: &Table| (1..=3).map(|i| t.event(i, "CleanupRuns")).sum::<u64>();
    wait_for(Duration::from_secs(5), || (Instant::now() >= after).then_some(()));
    let base = runs(&t);
    t.wait("two more cleanup passes", || runs(&t) >= base + 2);
    let s = t.insert_ok(2, &x, "");
    assert_eq!(
        s["deduplicated_blocks"].as_u64(),
        Some(1),
        "the newest id never expires by time alone"
    );
    // a newer id makes x older than the window
    t.insert_ok(1, &row(2, "y", 1), "");
    t.wait("x's id to be removed", || {
        (1..=3).map(|i| t.event(i, "CleanedBlockIds")).sum::<u64>() >= 1
    });
    let s = t.insert_ok(3, &x, "");
    assert_eq!(s["written_blocks"].as_u64(), Some(1));
    t.assert_rows_everywhere(&[1, 2, 3], &["1:x:1", "1:x:1", "2:y:1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_inserts_succeed_wait_time_out_and_refuse_as_clickhouse_does() {
    let t = Table::up5("tbl-quorum", 22140);
    // 2 of 3: acknowledged once two replicas hold the part
    let s = t.insert_ok(1, &row(1, "q2", 1), "insert_quorum=2");
    let part = s["parts"][0].as_str().unwrap().to_string();
    let holders = (1..=3).filter(|&i| t.parts(i).contains(&part)).count();
    assert!(holders >= 2, "part {part} on {holders} replicas at ack time");

    // 3 of 3 with r3's fetches stopped: 319 after the timeout, reached later
    t.hook(3, "stop-fetches");
    let r = t
        .insert(1, &row(2, "q3", 1), "insert_quorum=3&insert_quorum_timeout=1000")
        .unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(r.headers["x-clickhouse-exception-code"], "319", "{}", r.body);
    let zk = connect(&t.c.connect).await;
    let pending = zk
        .list_children(&format!("{TABLE_PATH}/quorum/parallel"))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "the quorum still waits: {pending:?}");
    t.hook(3, "resume-fetches");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !zk
        .list_children(&format!("{TABLE_PATH}/quorum/parallel"))
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the quorum was never reached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (last, _) = zk.get_data(&format!("{TABLE_PATH}/quorum/last_part")).await.unwrap();
    assert_eq!(String::from_utf8(last).unwrap(), pending[0]);

    // non-parallel: a second quorum insert while the first waits gets 286
    t.hook(3, "stop-fetches");
    let addr = t.http_addr(1);
    let waiting = std::thread::spawn(move || {
        let q = enc("INSERT INTO events FORMAT JSONEachRow");
        http(
            addr,
            "POST",
            &format!("/?query={q}&insert_quorum=3&insert_quorum_parallel=0&insert_quorum_timeout=60000"),
            &row(3, "np1", 1),
        )
        .map(|r| r.status)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while zk
        .check_stat(&format!("{TABLE_PATH}/quorum/status"))
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the first non-parallel quorum insert never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = t
        .insert(2, &row(4, "np2", 1), "insert_quorum=2&insert_quorum_parallel=0")
        .unwrap();
    assert_eq!(
        r.headers.get("x-clickhouse-exception-code").map(String::as_str),
        Some("286"),
        "{}",
        r.body
    );
    t.hook(3, "resume-fetches");
    assert_eq!(
        waiting.join().unwrap(),
        Ok(200),
        "the first one completes once r3 fetches"
    );

    // two replicas down (the keeper keeps 3 of 5): too few live replicas
    t.c.stop(2);
    t.c.stop(3);
    t.wait("r1 to see one active replica", || {
        t.query(1, "SELECT active_replicas FROM system.replicas").trim() == "1"
    });
    let r = t.insert(1, &row(5, "q285", 1), "insert_quorum=2").unwrap();
    assert_eq!(
        r.headers.get("x-clickhouse-exception-code").map(String::as_str),
        Some("285"),
        "{}",
        r.body
    );
    t.c.start(2);
    t.c.start(3);
    t.wait("r2 and r3 to be writable again", || {
        [2, 3]
            .iter()
            .all(|&i| http(t.http_addr(i), "GET", "/replicas_status", "").is_ok_and(|r| r.status == 200))
    });
    t.assert_rows_everywhere(&[1, 2, 3], &["1:q2:1", "2:q3:1", "3:np1:1"]);
}

#[test]
fn a_lost_commit_reply_and_a_dropped_insert_reply_leave_one_copy() {
    let t = Table::up("tbl-lost", 22150, &[]);
    // the commit multi succeeds, its reply is treated as lost: the replica
    // settles it through the block number lock and answers ok
    t.hook(1, "fail-commit-reply");
    let s = t.insert_ok(1, &row(1, "commit", 1), "");
    assert_eq!(s["written_blocks"].as_u64(), Some(1));
    assert!(t.c.log(1).contains("\"event\":\"commit_resolved\""), "{}", t.c.log(1));
    // the insert commits, its HTTP reply never comes: the client retries
    // elsewhere and the retry is deduplicated
    t.hook(2, "drop-insert-reply");
    assert!(
        t.insert(2, &row(2, "reply", 1), "").is_err(),
        "the connection closes without an answer"
    );
    let s = t.insert_ok(3, &row(2, "reply", 1), "");
    assert_eq!(s["deduplicated_blocks"].as_u64(), Some(1));
    t.assert_rows_everywhere(&[1, 2, 3], &["1:commit:1", "2:reply:1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_keep_every_row_once_and_never_span_a_held_block_number() {
    let t = Table::up("tbl-merge", 22160, &["--table-setting", "parts_to_merge_min = 1000"]);
    for id in 1..=3 {
        t.insert_ok(1, &row(id, "m", 1), "");
    }
    // a writer holds the next block number of partition 0, as an insert
    // between its two round trips does
    let zk = common::cluster::connect_as_replica(&t.c).await;
    let lock = zk
        .create(
            &format!("{TABLE_PATH}/block_numbers/0/block-"),
            b"held by the test",
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let held = lock.1.into_i64() as u64;
    for id in 4..=5 {
        t.insert_ok(2, &row(id, "m", 1), "");
    }
    // OPTIMIZE merges what the replica holds: let r3 hold everything first
    t.sync(3);
    t.query(3, "OPTIMIZE TABLE events FINAL");
    let parts = t.parts(3);
    assert_eq!(parts.len(), 2, "two merged runs around the held number: {parts:?}");
    for p in &parts {
        let f: Vec<u64> = p.split('_').skip(1).take(2).map(|x| x.parse().unwrap()).collect();
        assert!(
            !(f[0]..=f[1]).contains(&held),
            "part {p} spans held block number {held}"
        );
    }
    // the writer dies: its lock goes, the gap may be spanned
    drop(zk);
    let zk = connect(&t.c.connect).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !zk
        .list_children(&format!("{TABLE_PATH}/block_numbers/0"))
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the dead writer's lock stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.sync(1);
    t.query(1, "OPTIMIZE TABLE events FINAL");
    let parts = t.parts(1);
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert!(
        parts[0].ends_with("_2") || parts[0].ends_with("_3"),
        "a merged part: {parts:?}"
    );
    t.assert_rows_everywhere(&[1, 2, 3], &["1:m:1", "2:m:1", "3:m:1", "4:m:1", "5:m:1"]);
    for i in 1..=3 {
        assert_eq!(t.parts(i), parts, "r{i} holds the merged part");
    }
}

#[test]
fn a_corrupt_or_truncated_part_transfer_is_refused_and_fetched_again() {
    let t = Table::up("tbl-corrupt", 22170, &[]);
    t.hook(3, "stop-fetches");
    t.hook(1, "corrupt-next-part");
    t.insert_ok(1, &row(1, "c", 1), "");
    t.sync(2);
    assert_eq!(
        t.event(2, "ReplicatedPartChecksFailed"),
        1,
        "r2 refused the corrupt transfer"
    );
    assert_eq!(t.rows(2), ["1:c:1"]);
    t.hook(1, "truncate-next-part");
    t.hook(2, "truncate-next-part");
    t.hook(3, "resume-fetches");
    t.sync(3);
    assert!(
        t.event(3, "ReplicatedPartFailedFetches") >= 1,
        "r3 refused the truncated transfer"
    );
    t.assert_rows_everywhere(&[1, 2, 3], &["1:c:1"]);
}

/// A transfer whose files match their own `checksums.txt` but not the
/// checksums the writer listed in the coordinator is refused: nothing of
/// it is installed, and the part is fetched again.
#[test]
fn a_part_that_is_not_the_one_the_coordinator_lists_is_refused() {
    let t = Table::up("tbl-forged-part", 22590, &[]);
    t.hook(3, "stop-fetches");
    t.hook(1, "forge-next-part");
    t.insert_ok(1, &row(1, "f", 1), "");
    t.sync(2);
    assert_eq!(
        t.event(2, "ReplicatedPartChecksFailed"),
        1,
        "r2 refused the forged transfer"
    );
    t.hook(3, "resume-fetches");
    t.sync(3);
    t.assert_rows_everywhere(&[1, 2, 3], &["1:f:1"]);
}

#[test]
fn a_restarted_replica_recovers_its_queue() {
    let t = Table::up("tbl-restart", 22180, &[]);
    t.hook(3, "stop-fetches");
    for id in 1..=3 {
        t.insert_ok(1, &row(id, "r", 1), "");
    }
    t.wait("r3 to queue the three parts", || {
        t.query(3, "SELECT count() FROM system.replication_queue").trim() == "3"
    });
    assert!(t.rows(3).is_empty());
    t.c.stop(3);
    t.c.start(3);
    t.wait("r3 to be writable", || {
        http(t.http_addr(3), "GET", "/replicas_status", "").is_ok_and(|r| r.status == 200)
    });
    t.assert_rows_everywhere(&[1, 2, 3], &["1:r:1", "2:r:1", "3:r:1"]);
    assert!(
        !t.c.log(3).contains("\"event\":\"cloned\",\"new\":false"),
        "a restart reloads, not clones"
    );
}

#[test]
fn a_wiped_replica_clones_a_healthy_one() {
    let t = Table::up("tbl-wipe", 22190, &[]);
    for id in 1..=3 {
        t.insert_ok(1, &row(id, "w", 1), "");
    }
    t.assert_rows_everywhere(&[1, 2, 3], &["1:w:1", "2:w:1", "3:w:1"]);
    t.c.stop(3);
    let tables = t.c.config().node_dir(3).join("tables");
    std::fs::remove_dir_all(&tables).unwrap();
    t.c.start(3);
    t.wait("r3 to be writable", || {
        http(t.http_addr(3), "GET", "/replicas_status", "").is_ok_and(|r| r.status == 200)
    });
    assert_eq!(t.event(3, "ReplicaClones"), 1);
    t.assert_rows_everywhere(&[1, 2, 3], &["1:w:1", "2:w:1", "3:w:1"]);
}

#[test]
fn bad_queries_get_clickhouse_errors() {
    let t = Table::up("tbl-errors", 22200, &[]);
    let a = t.http_addr(1);
    let check = |method: &str, target: &str, body: &str, status: u16, code: &str, says: &str| {
        let r = http(a, method, target, body).unwrap();
        assert_eq!(r.status, status, "{target} {body}: {}", r.body);
        assert_eq!(
            r.headers.get("x-clickhouse-exception-code").map(String::as_str),
            Some(code),
            "{}",
            r.body
        );
        assert!(
            r.body.starts_with(&format!("Code: {code}. DB::Exception: ")) && r.body.contains(says),
            "{}",
            r.body
        );
    };
    check("POST", "/", "SELEC 1", 400, "62", "SYNTAX_ERROR");
    // a method that is neither GET nor POST runs nothing, a write least
    // of all; the interserver port serves parts to GET alone
    let put = http(
        a,
        "PUT",
        &format!("/?query={}", enc("INSERT INTO events FORMAT JSONEachRow")),
        &row(99, "put", 1),
    )
    .unwrap();
    assert_eq!(put.status, 405, "{}", put.body);
    let inter = t.c.config().peer(1).unwrap().interserver.unwrap();
    assert_eq!(
        http(inter, "POST", "/part?table=events&part=x", "").unwrap().status,
        405
    );
    check("POST", "/", "SELECT * FROM nope", 404, "60", "UNKNOWN_TABLE");
    check(
        "GET",
        &format!("/?query={}", enc("INSERT INTO events FORMAT JSONEachRow")),
        "",
        403,
        "164",
        "READONLY",
    );
    check(
        "POST",
        "/?query=SELECT%201&bogus_setting=1",
        "",
        404,
        "115",
        "bogus_setting",
    );
    check(
        "POST",
        &format!("/?query={}", enc("INSERT INTO events FORMAT JSONEachRow")),
        &format!("{}{{\"id\":\"x\"}}\n", row(1, "a", 1)),
        400,
        "27",
        "row 2: column id",
    );
    check(
        "POST",
        &format!("/?query={}", enc("INSERT INTO events FORMAT JSONEachRow")),
        "{\"id\":1,\"nope\":2}",
        400,
        "117",
        "Unknown field",
    );
    // a row naming a column twice, as ClickHouse refuses it
    check(
        "POST",
        &format!("/?query={}", enc("INSERT INTO events FORMAT JSONEachRow")),
        &format!("{}{{\"id\":5,\"id\":6}}\n", row(4, "a", 1)),
        400,
        "117",
        "Duplicate field found while parsing JSONEachRow format: id: (at row 2)",
    );
    // a SETTINGS clause is the query's settings: an unknown one is
    // refused, a known one applies
    check(
        "POST",
        "/",
        "SELECT count() FROM events SETTINGS bogus_setting = 1",
        404,
        "115",
        "bogus_setting",
    );
    check(
        "POST",
        "/",
        "SELECT count() FROM events SETTINGS default_format = 'Nope'",
        404,
        "73",
        "Nope",
    );
    assert_eq!(
        t.query(1, "SELECT count() FROM events SETTINGS default_format = 'JSONEachRow'")
            .trim(),
        "{\"count()\":\"0\"}"
    );
    // a body declared over the limit is refused before it is sent: the
    // answer comes with nothing of the body written
    let mut s = TcpStream::connect_timeout(&a, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /?query={} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        enc("INSERT INTO events FORMAT TabSeparated"),
        240u64 << 20
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    assert!(raw.contains("Code: 241") && raw.contains("over the limit"), "{raw}");
    assert_eq!(http(a, "GET", "/ping", "").unwrap().body, "Ok.\n");
    // VALUES and TabSeparated inserts, and nothing of the failed ones
    t.query(1, "INSERT INTO events VALUES (7, 'v', -1)");
    t.query(1, "INSERT INTO events FORMAT TabSeparated\n8\tt\t2\n");
    t.assert_rows_everywhere(&[1, 2, 3], &["7:v:-1", "8:t:2"]);
}

/// clickhouse-connect, ClickHouse's own Python client, with its defaults:
/// it connects, reads the settings, describes the table, inserts in
/// Native (lz4, zstd and plain bodies), and reads in Native, JSON,
/// RowBinary and TabSeparated (`ci/clickhouse_connect_check.py`).
#[test]
fn clickhouse_connect_connects_inserts_and_queries_unchanged() {
    if !common::cluster::have_python_module("clickhouse_connect") {
        return;
    }
    let t = Table::up("tbl-chconnect", 22290, &[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/clickhouse_connect_check.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(t.http_addr(1).to_string())
        .arg(t.http_addr(2).to_string())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "clickhouse-connect checks failed:\n{text}");
    assert_eq!(text.matches("ok: ").count(), 16, "every check ran:\n{text}");
    // what the client sent was stored as written: read it back by hand
    t.assert_rows_everywhere(
        &[1, 2, 3],
        &["1:a:-1", "2:b\\tc:2", &format!("3::{}", i64::MIN), "10:z:10", "11:p:11"],
    );
}

#[test]
fn the_table_runs_the_same_on_apache_zookeeper() {
    if !common::have_zookeeper() {
        return;
    }
    let t = Table::up("tbl-zk", 22210, &["--coordinator", "zookeeper"]);
    assert!(std::fs::read_to_string(t.c.dir.join("zookeeper-1.log")).is_ok_and(|l| l.contains("QuorumPeer")));
    let data = format!("{}{}", row(1, "z", 1), row(2000, "z", 2));
    t.insert_ok(1, &data, "");
    let again = t.insert_ok(3, &data, "");
    assert_eq!(again["deduplicated_blocks"].as_u64(), Some(2));
    // the fetch and quorum paths run against ZooKeeper too
    t.insert_ok(2, &row(3, "q", 1), "insert_quorum=3");
    t.assert_rows_everywhere(&[1, 2, 3], &["1:z:1", "2000:z:2", "3:q:1"]);
    assert_eq!(t.event(1, "InsertKeeperRoundTrips"), 2 * 2 + 2);
}

/// Whether replica i answers `/replicas_status` with 200 (registered,
/// with a session).
fn writable(t: &Table, i: u64) -> bool {
    http(t.http_addr(i), "GET", "/replicas_status", "").is_ok_and(|r| r.status == 200)
}

#[test]
fn a_quorum_part_no_replica_holds_is_failed_and_its_retry_inserts_once() {
    let t = Table::up("tbl-qfail", 22220, &[]);
    t.hook(2, "stop-fetches");
    t.hook(3, "stop-fetches");
    let r = t
        .insert(1, &row(1, "lost", 1), "insert_quorum=2&insert_quorum_timeout=500")
        .unwrap();
    assert_eq!(
        r.headers.get("x-clickhouse-exception-code").map(String::as_str),
        Some("319"),
        "{}",
        r.body
    );
    // the writer loses its disk before any replica fetched the part
    t.c.stop(1);
    std::fs::remove_dir_all(t.c.config().node_dir(1).join("tables")).unwrap();
    t.c.start(1);
    t.wait("r1 to be writable", || writable(&t, 1));
    t.hook(2, "resume-fetches");
    t.hook(3, "resume-fetches");
    // no replica lists the part: its quorum is marked failed, its id freed
    t.wait("the quorum to be marked failed", || {
        (1..=3).map(|i| t.event(i, "ReplicatedDataLoss")).sum::<u64>() >= 1
    });
    let s = t.insert_ok(2, &row(1, "lost", 1), "insert_quorum=2");
    assert_eq!(s["written_blocks"].as_u64(), Some(1), "the retry inserts anew");
    t.assert_rows_everywhere(&[1, 2, 3], &["1:lost:1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_left_behind_past_the_log_it_needs_is_marked_lost_and_clones() {
    let t = Table::up_cleaning(
        "tbl-lostrep",
        22230,
        &["max_replicated_logs_to_keep = 4", "min_replicated_logs_to_keep = 1"],
    );
    t.insert_ok(1, &row(1, "l", 1), "");
    t.assert_rows_everywhere(&[1, 2, 3], &["1:l:1"]);
    t.c.stop(3);
    t.wait("r3's session to expire", || {
        t.query(1, "SELECT active_replicas FROM system.replicas").trim() == "2"
    });
    for id in 2..=9 {
        t.insert_ok(1 + id % 2, &row(id, "l", 1), "");
    }
    let zk = connect(&t.c.connect_to(&[1, 2])).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lost = zk
            .get_data(&format!("{TABLE_PATH}/replicas/r3/is_lost"))
            .await
            .unwrap()
            .0;
        if lost == b"1" {
            break;
        }
        assert!(Instant::now() < deadline, "r3 was never marked lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.wait("the log to be trimmed past r3", || {
        (1..=2).map(|i| t.event(i, "CleanedLogEntries")).sum::<u64>() >= 1
    });
    t.c.start(3);
    t.wait("r3 to be writable", || writable(&t, 3));
    assert_eq!(t.event(3, "ReplicaClones"), 1, "r3 came back lost and cloned");
    let want: Vec<String> = (1..=9).map(|id| format!("{id}:l:1")).collect();
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    t.assert_rows_everywhere(&[1, 2, 3], &want);
}

#[test]
fn a_restarted_replica_detaches_parts_nobody_committed_and_fetches_missing_ones() {
    let t = Table::up("tbl-reconcile", 22240, &[]);
    t.insert_ok(1, &row(1, "p", 1), "");
    t.insert_ok(1, &row(2, "p", 1), "");
    t.assert_rows_everywhere(&[1, 2, 3], &["1:p:1", "2:p:1"]);
    let parts = t.parts(3);
    assert_eq!(parts.len(), 2, "{parts:?}");
    t.c.stop(3);
    let dir = t.c.config().node_dir(3).join("tables/events/parts");
    // one part lost from disk, and one nobody committed (a copy under a new name)
    std::fs::remove_dir_all(dir.join(&parts[0])).unwrap();
    let stray = dir.join("0_70_70_0");
    std::fs::create_dir(&stray).unwrap();
    for f in std::fs::read_dir(dir.join(&parts[1])).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), stray.join(f.file_name())).unwrap();
    }
    t.c.start(3);
    t.wait("r3 to be writable", || writable(&t, 3));
    t.assert_rows_everywhere(&[1, 2, 3], &["1:p:1", "2:p:1"]);
    assert_eq!(t.parts(3), parts);
    let detached = t.query(3, "SELECT name FROM system.detached_parts");
    assert_eq!(detached.trim(), "unexpected_0_70_70_0");
}

#[test]
fn dropping_a_partition_removes_its_rows_everywhere_and_frees_its_block_ids() {
    let t = Table::up("tbl-drop", 22250, &[]);
    let data = format!("{}{}{}", row(1, "d", 1), row(2, "d", 1), row(1001, "keep", 1));
    t.insert_ok(1, &data, "");
    t.insert_ok(2, &row(3, "d", 1), "");
    t.query(3, "ALTER TABLE events DROP PARTITION 0");
    t.assert_rows_everywhere(&[1, 2, 3], &["1001:keep:1"]);
    // the partition's ids went with it: the same rows insert anew
    let s = t.insert_ok(1, &data, "");
    assert_eq!(
        (s["written_blocks"].as_u64(), s["deduplicated_blocks"].as_u64()),
        (Some(1), Some(1))
    );
    t.assert_rows_everywhere(&[1, 2, 3], &["1:d:1", "2:d:1", "1001:keep:1"]);
}

#[test]
fn a_replica_cut_from_its_keeper_is_read_only_and_says_so_until_healed() {
    let t = Table::up("tbl-cut", 22260, &[]);
    t.insert_ok(1, &row(1, "before", 1), "");
    t.hook(1, "keeper-cut");
    t.wait("r1 to lose its session", || !writable(&t, 1));
    // a definite failure: ClickHouse's code 242, and the reason
    let r = t.insert(1, &row(2, "cut", 1), "").unwrap();
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(r.headers["x-clickhouse-exception-code"], "242", "{}", r.body);
    assert!(
        r.body.contains("(TABLE_IS_READ_ONLY)") && r.body.contains("readonly mode"),
        "{}",
        r.body
    );
    let status = t.query(
        1,
        "SELECT is_readonly, is_session_expired FROM system.replicas FORMAT TabSeparated",
    );
    assert_eq!(status.trim(), "1\t1", "system.replicas says so");
    // the other replicas go on, and reads on the cut one still answer
    t.insert_ok(2, &row(3, "others", 1), "");
    t.hook(1, "keeper-heal");
    t.wait("r1 to be writable again", || writable(&t, 1));
    t.insert_ok(1, &row(4, "after", 1), "");
    t.assert_rows_everywhere(&[1, 2, 3], &["1:before:1", "3:others:1", "4:after:1"]);
}

/// A replica whose queue holds fetches of parts merged away everywhere,
/// and no merge entry (a clone that read its source's parts before the
/// source merged them and its log pointer after): as ClickHouse does, it
/// fetches a part that covers them. Found by an insert-retry campaign
/// (seed 2) whose final `SYSTEM SYNC REPLICA` never returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_fetch_of_a_part_merged_away_everywhere_takes_the_covering_part() {
    // merges only when asked, so the merged part is the one OPTIMIZE makes
    let t = Table::up("tbl-cover", 22270, &["--table-setting", "parts_to_merge_min = 1000"]);
    t.c.stop(3);
    for id in 1..=3 {
        t.insert_ok(1, &row(id, "c", 1), "");
    }
    t.query(1, "OPTIMIZE TABLE events FINAL");
    t.sync(2);
    let merged = t.parts(1);
    assert_eq!(merged.len(), 1, "{merged:?}");
    assert_eq!(t.parts(2), merged);
    // r3's queue: the three GET_PARTs, its log pointer past the merge
    let zk = common::cluster::connect_as_replica(&t.c).await;
    let log = format!("{TABLE_PATH}/log");
    let mut entries = zk.list_children(&log).await.unwrap();
    entries.sort();
    let mut gets = 0;
    for e in &entries {
        let (data, _) = zk.get_data(&format!("{log}/{e}")).await.unwrap();
        if String::from_utf8_lossy(&data).contains("get") {
            zk.create(
                &format!("{TABLE_PATH}/replicas/r3/queue/queue-"),
                &data,
                &zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .unwrap();
            gets += 1;
        }
    }
    assert_eq!(gets, 3, "{entries:?}");
    let last: u64 = entries.last().unwrap().trim_start_matches("log-").parse().unwrap();
    zk.set_data(
        &format!("{TABLE_PATH}/replicas/r3/log_pointer"),
        (last + 1).to_string().as_bytes(),
        None,
    )
    .await
    .unwrap();
    t.c.start(3);
    t.wait("r3 to be writable", || writable(&t, 3));
    t.assert_rows_everywhere(&[1, 2, 3], &["1:c:1", "2:c:1", "3:c:1"]);
    assert_eq!(t.parts(3), merged, "r3 holds the covering part");
    assert!(t.c.log(3).contains("\"event\":\"fetch_covering\""), "{}", t.c.log(3));
}

/// A fetch whose commit reply is lost runs again and finds its part
/// listed already: it is done, not stuck retrying the entry's removal
/// (found by an insert-retry campaign whose final SYNC REPLICA hung on
/// fetches failing with "no node").
#[test]
fn a_fetch_whose_commit_reply_was_lost_completes_when_run_again() {
    let t = Table::up("tbl-fetch-reply", 22280, &[]);
    t.hook(2, "fail-entry-commit-reply");
    t.insert_ok(1, &row(1, "f", 1), "");
    t.wait("r2's lost reply", || {
        t.c.log(2)
            .contains("\"event\":\"fault_hook\",\"hook\":\"fail-entry-commit-reply\"")
    });
    t.assert_rows_everywhere(&[1, 2, 3], &["1:f:1"]);
    let queue = t.query(2, "SELECT count() FROM system.replication_queue");
    assert_eq!(queue.trim(), "0", "nothing left queued on r2");
}

/// A part is served only to another replica of the cluster: a fetch
/// without the cluster's secret, or signed with another, gets nothing.
#[test]
fn a_part_fetch_without_the_clusters_secret_is_refused() {
    let t = Table::up("tbl-fetch-auth", 22390, &[]);
    let summary = t.insert_ok(1, "{\"id\":1,\"key\":\"a\",\"value\":1}\n", "");
    let part = summary["parts"][0].as_str().unwrap().to_string();
    let inter = t.c.config().peer(1).unwrap().interserver.unwrap();
    let target = format!("/part?table=events&part={part}");
    let fetch = |header: &str| -> (u16, String) {
        let mut s = TcpStream::connect_timeout(&inter, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET {target} HTTP/1.0\r\nHost: {inter}\r\n{header}\r\n").unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8_lossy(&raw).to_string();
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, raw)
    };
    let sign = |secret: Vec<u8>| {
        let h = drift_node::http_auth::Signer::new(secret, 2).header("GET", &target, b"");
        format!("{}: {h}\r\n", drift_node::http_auth::HEADER)
    };
    let (status, raw) = fetch("");
    assert_eq!(status, 401, "{raw}");
    let (status, raw) = fetch(&sign(vec![5u8; 32]));
    assert_eq!(status, 401, "{raw}");
    assert!(!raw.contains("drift-part"), "nothing of the part: {raw}");
    // the same request signed with the secret is served
    let (status, raw) = fetch(&sign(t.c.config().secret_bytes()));
    assert_eq!(status, 200, "{raw}");
    assert!(raw.contains("drift-part 1"), "{raw}");
}

/// A thousand slow clients on the query port (a head that never ends),
/// a thousand on the interserver port and a thousand idle ones on the kv
/// port do not keep a normal client out: its query, insert and kv PUT
/// are answered within 2 s, and the other replicas fetch the insert's
/// part through the crowded interserver port.
#[test]
fn slow_and_idle_clients_do_not_keep_a_normal_one_out() {
    let t = Table::up("tbl-slow-clients", 22490, &[]);
    let a = t.http_addr(1);
    let kv = t.c.config().peer(1).unwrap().kv.expect("a kv address");
    let inter =
        t.c.config()
            .peer(1)
            .unwrap()
            .interserver
            .expect("an interserver address");
    let mut held = Vec::new();
    for _ in 0..1000 {
        let mut s = TcpStream::connect_timeout(&a, Duration::from_secs(2)).unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Le").unwrap();
        held.push(s);
        let mut s = TcpStream::connect_timeout(&inter, Duration::from_secs(2)).unwrap();
        s.write_all(b"GET /part?table=events HTTP/1.1\r\nHo").unwrap();
        held.push(s);
        held.push(TcpStream::connect_timeout(&kv, Duration::from_secs(2)).unwrap());
    }
    let started = Instant::now();
    t.insert_ok(1, &row(1, "normal", 1), "");
    assert_eq!(t.query(1, "SELECT count() FROM events").trim(), "1");
    let mut s = TcpStream::connect_timeout(&kv, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "PUT /kv/normal HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nv").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "answered in {took:?} beside 3,000 held connections"
    );
    // only r1 holds the part: r2 and r3 fetch it from r1's interserver port
    t.assert_rows_everywhere(&[1, 2, 3], &["1:normal:1"]);
    // one source address holds a quarter of a port's connections at most:
    // past that its next connection is closed at once, and another
    // address is still served
    for _ in 0..24 {
        held.push(TcpStream::connect_timeout(&kv, Duration::from_secs(2)).unwrap());
    }
    let mut s = TcpStream::connect_timeout(&kv, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = write!(s, "PUT /kv/over HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nv");
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => assert!(out.is_empty(), "the 1,025th connection was served"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut s = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        sock.connect(kv).await.unwrap().into_std().unwrap()
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "PUT /kv/other HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nv").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    drop(held);
}

/// The table's tree in the coordinator is the replicas' alone: a client
/// without the cluster's credentials reads it but cannot register a
/// replica, list a part or append to the log (the way a forged part
/// would be brought in); with them, it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_clusters_credentials_cannot_write_the_tables_tree() {
    let t = Table::up("tbl-acl", 22690, &[]);
    t.insert_ok(1, &row(1, "a", 1), "");
    let stranger = connect(&t.c.connect).await;
    let log = format!("{TABLE_PATH}/log");
    assert!(
        !stranger.list_children(&log).await.unwrap().is_empty(),
        "reading is allowed"
    );
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for path in [
        format!("{TABLE_PATH}/replicas/fake"),
        format!("{TABLE_PATH}/replicas/r1/parts/0_9_9_0"),
        format!("{log}/log-9999999999"),
    ] {
        let e = stranger.create(&path, b"forged", &open).await.unwrap_err();
        assert_eq!(e, zk::Error::NoAuth, "{path}");
    }
    let e = stranger
        .delete(&format!("{TABLE_PATH}/replicas/r1/is_active"), None)
        .await
        .unwrap_err();
    assert_eq!(e, zk::Error::NoAuth);
    // a replica's credentials may
    let replica = common::cluster::connect_as_replica(&t.c).await;
    let path = format!("{TABLE_PATH}/acl-probe");
    replica.create(&path, b"", &open).await.unwrap();
    replica.delete(&path, None).await.unwrap();
    t.insert_ok(2, &row(2, "b", 1), "");
    t.assert_rows_everywhere(&[1, 2, 3], &["1:a:1", "2:b:1"]);
}
