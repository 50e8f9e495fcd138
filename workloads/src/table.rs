//! The insert-retry workload: an application inserting into the
//! replicated table over ClickHouse's HTTP interface (reqwest), retrying
//! what it cannot know the fate of.
//!
//! A *logical insert* is uniquely tagged rows (`[id, p, tag]`, tag
//! `L<logical id>`), with, by weight: equal content to an earlier insert
//! (no token), a token, a token reused with other data, rows over several
//! partitions, several blocks (`max_insert_block_size`), a quorum (parallel
//! or not), or a retry delayed past the dedup window. Each attempt is one
//! history operation `insert` whose value carries the exact blocks the
//! server will make (the client splits the rows the way the server does,
//! through `drift_table`), so the `dedup` checker can judge every block.
//! An attempt answered with a definite error is `fail`; anything else
//! unanswered or erroring is `info`, and the insert is retried — same
//! data, same token, same split — on the same replica or another, until
//! `ok`, a definite failure, or its attempts run out.
//!
//! The same client drives drift's table and real ClickHouse servers: a
//! [`Dialect`] says what the server has (found at setup, never assumed),
//! and the mixes it cannot take are left out of the generator; errors are
//! read from `X-ClickHouse-Exception-Code` or, where a server sends no
//! such header (ClickHouse 18.16), from the body's `Code: N` in either
//! wording (`Code: N. DB::Exception: …` and `Code: N, e.displayText() =
//! DB::Exception: …`).

use crate::rng::Rng;
use drift_checkers::history::OpType;
use drift_table::block::{split_insert, Block};
use drift_table::schema::{ColumnType, PartitionKey, Schema, Value as Cell};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::time::Duration;

/// The workload's table, as the cluster file declares it.
pub const TABLE: &str = "inserts";
pub const TABLE_DECLARATION: &str =
    "name = \"inserts\"\ncolumns = \"id UInt64, p UInt64, tag String\"\npartition_by = \"p\"\norder_by = \"id\"\n";
/// Partitions the rows spread over.
pub const PARTITIONS: u64 = 8;
/// Most rows in one logical insert.
const ROWS_MAX: u64 = 5;
/// Recent inserts a worker remembers for equal content and token reuse.
const RECENT_MAX: usize = 16;

/// The table's schema, the same as the declaration's.
pub fn schema() -> Schema {
    Schema::new(
        TABLE,
        &[
            ("id", ColumnType::UInt64),
            ("p", ColumnType::UInt64),
            ("tag", ColumnType::String),
        ],
        PartitionKey::Column(1),
        vec![0],
    )
}

/// One row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub id: u64,
    pub p: u64,
    pub tag: String,
}

impl Row {
    pub fn json(&self) -> Value {
        json!([self.id, self.p, self.tag])
    }
}

/// What a table server takes beyond the plain insert, as its settings
/// say (drift's own table has everything).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dialect {
    /// `insert_deduplication_token`.
    pub token: bool,
    /// `insert_quorum_parallel`; without it every quorum insert waits for
    /// the previous one's quorum (ClickHouse before 20.10).
    pub quorum_parallel: bool,
    /// `min_insert_block_size_rows` / `_bytes`: without them set to 0, a
    /// server squashes small blocks back together, so a client cannot make
    /// `max_insert_block_size` split an insert (drift's table never
    /// squashes).
    pub squash_off: bool,
}

impl Dialect {
    /// drift's own table.
    pub const DRIFT: Dialect = Dialect {
        token: true,
        quorum_parallel: true,
        squash_off: false,
    };

    /// The mixes a server of this dialect cannot take, each with why.
    pub fn left_out(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if !self.token {
            out.push(("token", "no insert_deduplication_token setting"));
            out.push(("token-reuse", "no insert_deduplication_token setting"));
        }
        if !self.quorum_parallel {
            out.push((
                "quorum",
                "no insert_quorum_parallel setting: every quorum insert is sequential (quorum-non-parallel stays)",
            ));
        }
        out
    }

    fn allows(&self, k: Kind) -> bool {
        !self.left_out().iter().any(|(name, _)| *name == k.name())
    }
}

/// What the workload mixes in, by name (`kind` in the history).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    EqualContent,
    Token,
    TokenReuse,
    MultiPartition,
    MultiBlock,
    Quorum,
    QuorumNonParallel,
    DelayedRetry,
}

impl Kind {
    const WEIGHTED: [(Kind, u32); 9] = [
        (Kind::Plain, 45),
        (Kind::EqualContent, 5),
        (Kind::Token, 10),
        (Kind::TokenReuse, 3),
        (Kind::MultiPartition, 10),
        (Kind::MultiBlock, 7),
        (Kind::Quorum, 6),
        (Kind::QuorumNonParallel, 3),
        (Kind::DelayedRetry, 5),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::EqualContent => "equal-content",
            Kind::Token => "token",
            Kind::TokenReuse => "token-reuse",
            Kind::MultiPartition => "multi-partition",
            Kind::MultiBlock => "multi-block",
            Kind::Quorum => "quorum",
            Kind::QuorumNonParallel => "quorum-non-parallel",
            Kind::DelayedRetry => "delayed-retry",
        }
    }
}

/// One logical insert: what every attempt of it sends.
#[derive(Clone, Debug)]
pub struct LogicalInsert {
    pub id: u64,
    pub kind: Kind,
    pub rows: Vec<Row>,
    pub token: Option<String>,
    pub quorum: u32,
    pub quorum_parallel: bool,
    pub max_block_rows: Option<usize>,
}

impl LogicalInsert {
    /// The blocks the server makes of these rows: (partition, rows).
    pub fn blocks(&self) -> Vec<(String, Vec<Row>)> {
        let s = schema();
        let rows: Vec<Vec<Cell>> = self
            .rows
            .iter()
            .map(|r| vec![Cell::UInt64(r.id), Cell::UInt64(r.p), Cell::String(r.tag.clone())])
            .collect();
        let block = Block::from_rows(&s, rows).expect("rows of the schema's types");
        split_insert(
            &s,
            &block,
            self.max_block_rows
                .unwrap_or(drift_table::block::MAX_INSERT_BLOCK_SIZE_DEFAULT),
        )
        .into_iter()
        .map(|(p, b)| {
            let rows = (0..b.rows())
                .map(|i| {
                    let r = b.row(i);
                    match (&r[0], &r[1], &r[2]) {
                        (Cell::UInt64(id), Cell::UInt64(p), Cell::String(tag)) => Row {
                            id: *id,
                            p: *p,
                            tag: tag.clone(),
                        },
                        _ => unreachable!("the schema's types"),
                    }
                })
                .collect();
            (p, rows)
        })
        .collect()
    }

    /// The history value of attempt `n` sent to `replica`.
    pub fn invoke_value(&self, n: u32, replica: &str) -> Value {
        let blocks: Vec<Value> = self
            .blocks()
            .into_iter()
            .map(|(p, rows)| json!({"partition": p, "rows": rows.iter().map(Row::json).collect::<Vec<_>>()}))
            .collect();
        json!({
            "insert": self.id, "attempt": n, "query_id": self.query_id(n), "replica": replica, "kind": self.kind.name(),
            "token": self.token, "quorum": self.quorum, "quorum_parallel": self.quorum_parallel,
            "blocks": blocks,
        })
    }

    /// The `query_id` attempt `n` is sent with: the server logs each
    /// block's id under it, which ties the attempt to the ids it made.
    pub fn query_id(&self, n: u32) -> String {
        format!("drift-{}-{n}", self.id)
    }

    /// The request of attempt `n` to a server of `dialect`: URL parameters
    /// and the JSONEachRow body. A quorum insert waits at most
    /// `quorum_timeout` for its quorum (then 319).
    pub fn request(&self, n: u32, quorum_timeout: Duration, dialect: &Dialect) -> (String, String) {
        let mut params = String::from("query=INSERT%20INTO%20inserts%20FORMAT%20JSONEachRow");
        params.push_str(&format!("&query_id={}", self.query_id(n)));
        if let Some(t) = &self.token {
            params.push_str(&format!("&insert_deduplication_token={t}"));
        }
        if self.quorum > 1 {
            params.push_str(&format!(
                "&insert_quorum={}&insert_quorum_timeout={}",
                self.quorum,
                quorum_timeout.as_millis().max(1)
            ));
            if dialect.quorum_parallel {
                params.push_str(&format!("&insert_quorum_parallel={}", u8::from(self.quorum_parallel)));
            }
        }
        if let Some(n) = self.max_block_rows {
            params.push_str(&format!("&max_insert_block_size={n}"));
            if dialect.squash_off {
                params.push_str("&min_insert_block_size_rows=0&min_insert_block_size_bytes=0");
            }
        }
        let body: String = self
            .rows
            .iter()
            .map(|r| format!("{{\"id\":{},\"p\":{},\"tag\":\"{}\"}}\n", r.id, r.p, r.tag))
            .collect();
        (params, body)
    }

    /// Whether a retry waits past the dedup window.
    pub fn delayed(&self) -> bool {
        self.kind == Kind::DelayedRetry
    }
}

/// A worker's source of logical inserts.
pub struct InsertGen {
    worker: u64,
    seq: u64,
    recent: VecDeque<LogicalInsert>,
    dialect: Dialect,
}

impl InsertGen {
    /// Inserts for drift's own table (every mix).
    pub fn new(worker: u64) -> InsertGen {
        InsertGen::for_dialect(worker, Dialect::DRIFT)
    }

    /// Inserts for a server of `dialect`: the mixes it cannot take are
    /// never drawn.
    pub fn for_dialect(worker: u64, dialect: Dialect) -> InsertGen {
        InsertGen {
            worker,
            seq: 0,
            recent: VecDeque::new(),
            dialect,
        }
    }

    fn fresh_rows(&mut self, rng: &mut Rng, logical: u64, n: u64, partitions: u64) -> Vec<Row> {
        let first_p = rng.below(PARTITIONS);
        (0..n)
            .map(|i| Row {
                id: logical * 16 + i,
                p: (first_p + i % partitions) % PARTITIONS,
                tag: format!("L{logical}"),
            })
            .collect()
    }

    pub fn next(&mut self, rng: &mut Rng) -> LogicalInsert {
        self.seq += 1;
        // logical ids never repeat across workers
        let id = (self.worker + 1) * 1_000_000_000 + self.seq;
        let weights: Vec<u32> = Kind::WEIGHTED
            .iter()
            .map(|(k, w)| if self.dialect.allows(*k) { *w } else { 0 })
            .collect();
        let mut kind = Kind::WEIGHTED[rng.weighted(&weights)].0;
        let pick = |recent: &VecDeque<LogicalInsert>, rng: &mut Rng, token: bool| {
            let c: Vec<&LogicalInsert> = recent
                .iter()
                .filter(|l| l.token.is_some() == token && l.max_block_rows.is_none())
                .collect();
            (!c.is_empty()).then(|| c[rng.below(c.len() as u64) as usize].clone())
        };
        let n = 1 + rng.below(ROWS_MAX);
        let mut l = LogicalInsert {
            id,
            kind,
            rows: Vec::new(),
            token: None,
            quorum: 0,
            quorum_parallel: true,
            max_block_rows: None,
        };
        match kind {
            Kind::EqualContent => match pick(&self.recent, rng, false) {
                Some(old) => l.rows = old.rows,
                None => kind = Kind::Plain,
            },
            Kind::TokenReuse => match pick(&self.recent, rng, true) {
                Some(old) => {
                    l.token = old.token;
                    l.rows = self.fresh_rows(rng, id, old.rows.len() as u64, 1);
                }
                None => kind = Kind::Plain,
            },
            _ => {}
        }
        l.kind = kind;
        match kind {
            Kind::Plain | Kind::DelayedRetry => l.rows = self.fresh_rows(rng, id, n, 1),
            Kind::Token => {
                l.rows = self.fresh_rows(rng, id, n, 1);
                l.token = Some(format!("t{id}"));
            }
            Kind::MultiPartition => {
                let partitions = 1 + rng.below(3);
                l.rows = self.fresh_rows(rng, id, n.max(2), partitions);
            }
            Kind::MultiBlock => {
                let rows = 3 + rng.below(3);
                l.rows = self.fresh_rows(rng, id, rows, 1);
                l.max_block_rows = Some(2);
            }
            Kind::Quorum | Kind::QuorumNonParallel => {
                l.rows = self.fresh_rows(rng, id, n, 1);
                l.quorum = 2;
                l.quorum_parallel = kind == Kind::Quorum;
            }
            Kind::EqualContent | Kind::TokenReuse => {}
        }
        self.recent.push_back(l.clone());
        if self.recent.len() > RECENT_MAX {
            self.recent.pop_front();
        }
        l
    }
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub enum AttemptOutcome {
    /// The server's `X-Drift-Insert` summary (null from a server that
    /// sends none).
    Ok(Value),
    /// Definitely not applied: the code, if the server answered.
    Fail(Option<u64>, String),
    /// May have been applied.
    Info(Option<u64>, String),
}

impl AttemptOutcome {
    /// The history's completion of it: type, value (the summary, or the
    /// server's code), error.
    pub fn completion(&self) -> (OpType, Value, Option<String>) {
        match self {
            AttemptOutcome::Ok(summary) => (OpType::Ok, summary.clone(), None),
            AttemptOutcome::Fail(code, why) => (OpType::Fail, json!({"code": code}), Some(why.clone())),
            AttemptOutcome::Info(code, why) => (OpType::Info, json!({"code": code}), Some(why.clone())),
        }
    }
}

/// Attempt `n` of `l` against the replica at `url` (`http://host:port/`),
/// answered within `timeout` (else `info`); a quorum waits three quarters
/// of it, so a quorum not reached is the server's 319 rather than the
/// client's timeout.
pub async fn attempt(
    http: &reqwest::Client,
    url: &str,
    l: &LogicalInsert,
    n: u32,
    timeout: Duration,
    dialect: &Dialect,
) -> AttemptOutcome {
    let (params, body) = l.request(n, timeout.mul_f64(0.75), dialect);
    let sent = http
        .post(format!("{url}?{params}"))
        .body(body)
        .timeout(timeout)
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        // nothing reached the server
        Err(e) if e.is_connect() => return AttemptOutcome::Fail(None, format!("connection refused: {e}")),
        Err(e) => return AttemptOutcome::Info(None, format!("no answer: {e}")),
    };
    let status = resp.status();
    if resp
        .headers()
        .get("x-drift-proxy")
        .is_some_and(|v| v == "connect-refused")
    {
        // drift's reply proxy could not reach the server: nothing did
        let why = resp.text().await.unwrap_or_default();
        return AttemptOutcome::Fail(
            None,
            format!("connection refused (through drift's proxy): {}", why.trim()),
        );
    }
    let header_code = resp
        .headers()
        .get("x-clickhouse-exception-code")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let summary = resp
        .headers()
        .get("x-drift-insert")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| serde_json::from_str::<Value>(v).ok());
    let text = match resp.text().await {
        Ok(t) => t,
        Err(e) => return AttemptOutcome::Info(header_code, format!("the answer broke off: {e}")),
    };
    if status.is_success() {
        return AttemptOutcome::Ok(summary.unwrap_or(Value::Null));
    }
    let msg = text.trim().chars().take(300).collect::<String>();
    match header_code.or_else(|| error_code(&text)) {
        Some(c) if drift_checkers::dedup::definite_failure(c, l.blocks().len()) => AttemptOutcome::Fail(Some(c), msg),
        c => AttemptOutcome::Info(c, msg),
    }
}

/// The error code a ClickHouse error body starts with, in either wording:
/// `Code: 319. DB::Exception: …` (drift's table, ClickHouse since 21.x)
/// or `Code: 319, e.displayText() = DB::Exception: …` (before).
pub fn error_code(body: &str) -> Option<u64> {
    let rest = body.trim_start().strip_prefix("Code: ")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() || !rest[digits.len()..].starts_with(['.', ',']) {
        return None;
    }
    digits.parse().ok()
}

/// One statement on the replica at `url`: the body of a success; what the
/// server said, under `what`, otherwise.
async fn query(
    http: &reqwest::Client,
    url: &str,
    sql: &'static str,
    what: &str,
    timeout: Duration,
) -> Result<String, String> {
    let r = http
        .post(url)
        .body(sql)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let ok = r.status().is_success();
    let text = r.text().await.map_err(|e| e.to_string())?;
    if !ok {
        return Err(format!("{what}: {}", text.trim()));
    }
    Ok(text)
}

/// `SYSTEM SYNC REPLICA` on the replica at `url`, then all its rows. The
/// sync counts only on a replica that is not readonly before it and after
/// the read: ClickHouse 18.16 answers it at once on a replica whose
/// coordinator session is not up yet after a restart (its queue is loaded
/// only then), with parts still to fetch (seen in CI: a replica restarted
/// by a kill read 12 rows short, its queue loaded 5 s after the sync).
pub async fn sync_and_read(http: &reqwest::Client, url: &str, timeout: Duration) -> Result<Vec<Value>, String> {
    let writable = || async {
        let text = query(
            http,
            url,
            "SELECT is_readonly FROM system.replicas FORMAT TabSeparated",
            "system.replicas",
            timeout,
        )
        .await?;
        if text.lines().any(|l| l.trim() == "1") {
            return Err(
                "the replica is readonly (no coordinator session yet): SYNC REPLICA would not wait for its queue"
                    .to_string(),
            );
        }
        Ok(())
    };
    writable().await?;
    query(http, url, "SYSTEM SYNC REPLICA inserts", "SYNC REPLICA", timeout).await?;
    // JSONEachRow: every ClickHouse has it (JSONCompactEachRow came in 19.x)
    let text = query(
        http,
        &format!("{url}?output_format_json_quote_64bit_integers=0"),
        "SELECT id, p, tag FROM inserts ORDER BY id FORMAT JSONEachRow",
        "SELECT",
        timeout,
    )
    .await?;
    writable().await?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let o = serde_json::from_str::<Value>(l).map_err(|e| format!("a row {l:?}: {e}"))?;
            match (&o["id"], &o["p"], &o["tag"]) {
                (Value::Number(id), Value::Number(p), Value::String(tag)) => Ok(json!([id, p, tag])),
                _ => Err(format!("a row {l:?}: not {{id, p, tag}} of numbers and a string")),
            }
        })
        .collect()
}

/// Most queue entries [`replica_state`] describes.
const STATE_QUEUE_ENTRIES_MAX: usize = 5;

/// What a replica says of itself (`system.replicas`, the first entries of
/// `system.replication_queue`), for a failed final read's record; its
/// system tables answer without the coordinator.
pub async fn replica_state(http: &reqwest::Client, url: &str) -> String {
    let q = |sql: String| async move {
        match http.post(url).body(sql).timeout(Duration::from_secs(5)).send().await {
            Ok(r) => r
                .text()
                .await
                .unwrap_or_default()
                .trim()
                .replace('\t', " ")
                .replace('\n', " | "),
            Err(e) => format!("no answer ({e})"),
        }
    };
    let mut replica = q("SELECT is_readonly, readonly_reason, is_session_expired, queue_size, log_pointer FROM system.replicas FORMAT TabSeparated".into()).await;
    if error_code(&replica).is_some() {
        // a server without readonly_reason (ClickHouse before 21.x)
        replica = q("SELECT is_readonly, 'n/a', is_session_expired, queue_size, log_pointer FROM system.replicas FORMAT TabSeparated".into()).await;
    }
    let queue = q(format!(
        "SELECT type, new_part_name, num_tries, last_exception, postpone_reason FROM system.replication_queue LIMIT {STATE_QUEUE_ENTRIES_MAX} FORMAT TabSeparated"
    ))
    .await;
    format!("readonly/reason/expired/queue/pointer: {replica}; queue: {queue}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica's HTTP interface reduced to what a final read asks:
    /// `is_readonly` answers from `states` in turn, the sync succeeds, the
    /// table holds one row.
    fn fake_replica(states: &'static [&'static str]) -> String {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", l.local_addr().unwrap());
        std::thread::spawn(move || {
            let mut next = states.iter();
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                // the request ends with its body, whose length the header gives
                let body = loop {
                    let n = s.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break String::new();
                    }
                    req.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&req).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break body.to_string();
                        }
                    }
                };
                let answer = if body.contains("system.replicas") {
                    format!("{}\n", next.next().unwrap_or(&"0"))
                } else if body.starts_with("SELECT id") {
                    "{\"id\":1,\"p\":0,\"tag\":\"L1\"}\n".to_string()
                } else {
                    String::new()
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        url
    }

    /// A sync on a readonly replica, or one that turned readonly by the
    /// end of the read, does not count; on a writable one it does.
    #[test]
    fn a_final_read_counts_only_on_a_replica_that_is_not_readonly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let http = reqwest::Client::new();
        let t = Duration::from_secs(10);
        for (states, ok) in [(&["1"][..], false), (&["0", "1"][..], false), (&["0", "0"][..], true)] {
            let url = fake_replica(states);
            let got = rt.block_on(sync_and_read(&http, &url, t));
            match (ok, got) {
                (true, Ok(rows)) => assert_eq!(rows, vec![json!([1, 0, "L1"])]),
                (false, Err(e)) => assert!(e.contains("readonly"), "{e}"),
                (_, other) => panic!("{states:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn error_codes_are_read_in_both_wordings_and_nothing_else() {
        assert_eq!(
            error_code("Code: 319. DB::Exception: Unknown status (UNKNOWN_STATUS_OF_INSERT)"),
            Some(319)
        );
        assert_eq!(
            error_code(
                "Code: 242, e.displayText() = DB::Exception: Table is in readonly mode, e.what() = DB::Exception\n"
            ),
            Some(242)
        );
        assert_eq!(error_code("  Code: 286, e.displayText() = x"), Some(286));
        for bad in ["", "Code: ", "Code: x1.", "Code: 12", "Error 500", "Code 242, nope"] {
            assert_eq!(error_code(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_dialect_without_tokens_or_parallel_quorums_never_draws_them() {
        let d = Dialect {
            token: false,
            quorum_parallel: false,
            squash_off: true,
        };
        let mut g = InsertGen::for_dialect(1, d);
        let mut rng = Rng::new(9);
        let mut kinds = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let l = g.next(&mut rng);
            assert!(l.token.is_none(), "{l:?}");
            kinds.insert(l.kind.name());
            let (params, _) = l.request(1, Duration::from_secs(1), &d);
            assert!(!params.contains("insert_quorum_parallel"), "{params}");
            assert!(!params.contains("insert_deduplication_token"), "{params}");
            if l.max_block_rows.is_some() {
                assert!(params.contains("min_insert_block_size_rows=0"), "{params}");
            }
        }
        assert!(
            kinds.contains("quorum-non-parallel") && kinds.contains("multi-block"),
            "{kinds:?}"
        );
        for (left, _) in d.left_out() {
            assert!(!kinds.contains(left), "{left} drawn: {kinds:?}");
        }
        let (params, _) = g.next(&mut rng).request(1, Duration::from_secs(1), &Dialect::DRIFT);
        assert!(!params.contains("min_insert_block_size"), "{params}");
    }

    #[test]
    fn inserts_mix_their_kinds_and_split_as_the_server_does() {
        let mut g = InsertGen::new(3);
        let mut rng = Rng::new(5);
        let mut kinds = std::collections::BTreeSet::new();
        let mut ids = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let l = g.next(&mut rng);
            kinds.insert(l.kind.name());
            assert!(ids.insert(l.id), "logical ids are unique");
            let blocks = l.blocks();
            let rows: usize = blocks.iter().map(|(_, r)| r.len()).sum();
            assert_eq!(rows, l.rows.len());
            if let Some(n) = l.max_block_rows {
                assert!(blocks.iter().all(|(_, r)| r.len() <= n));
                assert!(blocks.len() >= 2, "{l:?}");
            }
            for (p, rows) in &blocks {
                assert!(rows.iter().all(|r| &r.p.to_string() == p));
                assert!(
                    rows.windows(2).all(|w| w[0].id <= w[1].id),
                    "sorted by id as the server sorts"
                );
            }
            let v = l.invoke_value(1, "r1");
            assert_eq!(v["blocks"].as_array().unwrap().len(), blocks.len());
        }
        assert_eq!(kinds.len(), Kind::WEIGHTED.len(), "{kinds:?}");
    }
}
