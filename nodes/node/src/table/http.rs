//! The table's HTTP interfaces (hyper, HTTP/1.1, on the table runtime).
//!
//! The query interface follows ClickHouse's: the query in `?query=` (GET
//! for reads, POST for anything) and/or the POST body (an insert's data
//! follows its `FORMAT <name>`), settings as URL parameters, `/ping`, and
//! errors as ClickHouse sends them (see `error.rs`). The interserver
//! interface serves parts to fetching replicas (`interserver.rs`).

use super::error::{
    TResult, TableError, BAD_ARGUMENTS, CANNOT_DECOMPRESS, INCORRECT_DATA, READONLY, TABLE_IS_READ_ONLY,
    TIMEOUT_EXCEEDED, UNKNOWN_SETTING, UNKNOWN_TABLE,
};
use super::formats::{insert_columns, parse_rows_within, write_rows, Format, OutputOptions, RowsBound};
use super::hooks::Hooks;
use super::insert::{parse_quorum, InsertSettings};
use super::query::{self, bool_setting, Command, InsertData, SelectQuery, Source};
use super::replica::Replica;
use super::select::{self, Relation};
use super::TableNode;
use bytes::Bytes;
use drift_table::block::Block;
use drift_table::schema::{ColumnType, Value};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body (an insert's data, as sent: compressed, if it
/// is).
pub const BODY_BYTES_MAX: usize = 64 << 20;
/// Largest request body once decoded (lz4, zstd).
pub const DECODED_BYTES_MAX: usize = 64 << 20;
/// The memory the query port's request bodies, as sent and decoded, and
/// the rows parsed from them may hold together (crate::body,
/// [`super::formats::RowsBound`]): what a node's inserts hold at once is
/// bounded by this, not by what clients send or how many send at once.
pub const BODIES_BYTES_MAX: usize = 160 << 20;
/// Connections served at a time per interface; more wait in the backlog.
/// Room for many idle or slow clients: each is cut at
/// [`HEADER_READ_TIMEOUT`] or [`BODY_READ_TIMEOUT`], so they cannot hold
/// every slot for long.
pub const CONNECTIONS_MAX: usize = 4096;
/// A request's head must arrive within this (also between the requests
/// of a kept-alive connection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's body must arrive within this.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `SYSTEM SYNC REPLICA` waits (ClickHouse's receive_timeout).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(300);

type Resp = Response<Full<Bytes>>;

/// URL parameters that are not settings a query changes its result by,
/// accepted and ignored as ClickHouse clients send them.
const HARMLESS_PARAMS: &[&str] = &[
    "user",
    "password",
    "session_id",
    "session_timeout",
    "compress",
    "decompress",
    // accepted; results are sent uncompressed, which a client that asked
    // for compression reads by the absent Content-Encoding
    "enable_http_compression",
    "wait_end_of_query",
    "send_progress_in_http_headers",
    "http_headers_progress_interval_ms",
    "max_result_rows",
    "max_execution_time",
    "select_sequential_consistency",
    "async_insert",
    "wait_for_async_insert",
    "input_format_skip_unknown_fields",
    "date_time_input_format",
    "output_format_json_named_tuples_as_objects",
];

fn text(status: u16, body: String) -> Resp {
    Response::builder()
        .status(status)
        .header("Content-Type", "text/plain; charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

fn error_response(e: &TableError) -> Resp {
    Response::builder()
        .status(e.http_status())
        .header("Content-Type", "text/plain; charset=UTF-8")
        .header("X-ClickHouse-Exception-Code", e.code.0.to_string())
        .body(Full::new(Bytes::from(e.body())))
        .expect("a valid response")
}

/// Connections one source address may hold on a port at once: a quarter
/// of [`CONNECTIONS_MAX`], so that one client (or one peer) that holds
/// connections open cannot take every slot from the others.
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = CONNECTIONS_MAX / 4;

/// The connections each source address holds on one port.
#[derive(Default)]
struct PerAddress(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

impl PerAddress {
    /// Counts one more connection from `ip`, unless it holds its share.
    fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<AddressSlot> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= CONNECTIONS_PER_ADDRESS_MAX {
            return None;
        }
        *n += 1;
        Some(AddressSlot(self.clone(), ip))
    }
}

/// One connection counted against its address; uncounted when dropped.
struct AddressSlot(Arc<PerAddress>, std::net::IpAddr);

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut m = (self.0).0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// Accepts connections and serves each with `handle` until the listener
/// fails: [`CONNECTIONS_MAX`] at a time, [`CONNECTIONS_PER_ADDRESS_MAX`]
/// of them from one source address (a connection past that is closed at
/// once).
pub async fn serve<F, Fut>(listener: tokio::net::TcpListener, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Resp, std::io::Error>> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let per_address = Arc::new(PerAddress::default());
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, from)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(slot) = per_address.take(from.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let h = handle.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _slot = slot;
            let service = hyper::service::service_fn(&h);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The query interface.
pub async fn handle_query(node: Arc<TableNode>, req: Request<Incoming>) -> Result<Resp, std::io::Error> {
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/ping" => return Ok(text(200, "Ok.\n".into())),
        "/replicas_status" => {
            let bad: Vec<String> = node
                .replicas
                .values()
                .filter_map(|r| r.readonly().map(|why| format!("{}: {why}", r.schema.name)))
                .collect();
            return Ok(if bad.is_empty() {
                text(200, "Ok.\n".into())
            } else {
                text(503, format!("{}\n", bad.join("\n")))
            });
        }
        "/" => {}
        _ => return Ok(text(404, format!("There is no handle {path}\n"))),
    }
    let method = req.method().clone();
    // queries come as GET (reads) or POST; nothing else runs one
    if method != Method::GET && method != Method::POST {
        return Ok(text(
            405,
            format!("HTTP method {method} is not supported: use GET or POST\n"),
        ));
    }
    let encoding = match req.headers().get(hyper::header::CONTENT_ENCODING).map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v.trim().to_ascii_lowercase()),
        Some(Err(_)) => {
            return Ok(error_response(&TableError::new(
                BAD_ARGUMENTS,
                "the Content-Encoding header is not text",
            )))
        }
    };
    let params: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let held = match crate::body::read(req.into_body(), BODY_BYTES_MAX, &node.bodies, BODY_READ_TIMEOUT).await {
        Ok(h) => h,
        Err(r) => return Ok(error_response(&body_refused(r))),
    };
    // the body's memory (and the decoded one's) stays counted until the
    // query is done
    let (body, _held, _decoded) = match decode_body(encoding.as_deref(), held, &node.bodies) {
        Ok(b) => b,
        Err(e) => return Ok(error_response(&e)),
    };
    match run(&node, &method, &params, &body).await {
        Ok(Answer::Reply(r)) => Ok(r),
        Ok(Answer::Drop) => Err(std::io::Error::other("reply dropped (fault hook)")),
        Err(e) => Ok(error_response(&e)),
    }
}

/// A body the port would not read, as ClickHouse says it: too large is
/// its 241 (memory limit), as is a port with no memory left for it.
fn body_refused(r: crate::body::Refusal) -> TableError {
    use crate::body::Refusal;
    let code = match r {
        Refusal::TooLarge { .. } | Refusal::Busy { .. } => super::error::MEMORY_LIMIT_EXCEEDED,
        Refusal::Timeout(_) | Refusal::Read(_) => INCORRECT_DATA,
    };
    TableError::new(code, r.to_string())
}

/// The request body with its `Content-Encoding` undone: `lz4` (the LZ4
/// frame format) and `zstd`, the encodings ClickHouse's clients compress
/// inserts with, bounded to [`DECODED_BYTES_MAX`] decoded and counted
/// against the port's budget as it grows. Returns the body to run, the
/// body as read, and the decoded body's hold (empty when not encoded).
fn decode_body(
    encoding: Option<&str>,
    held: crate::body::Held,
    budget: &crate::body::Budget,
) -> TResult<(Bytes, crate::body::Held, crate::body::Hold)> {
    use std::io::Read;
    let mut input: Box<dyn Read + '_> = match encoding {
        None | Some("") | Some("identity") => {
            let body = held.bytes.clone();
            return Ok((body, held, crate::body::Hold::default()));
        }
        Some("lz4") => Box::new(lz4_flex::frame::FrameDecoder::new(&held.bytes[..])),
        Some("zstd") => match zstd::stream::read::Decoder::new(&held.bytes[..]) {
            Ok(d) => Box::new(d),
            Err(e) => {
                return Err(TableError::new(
                    CANNOT_DECOMPRESS,
                    format!("the zstd request body: {e}"),
                ))
            }
        },
        Some(other) => {
            return Err(TableError::new(
                super::error::UNKNOWN_COMPRESSION_METHOD,
                format!("Unknown Content-Encoding {other:?} (drift reads lz4 and zstd)"),
            ))
        }
    };
    let name = encoding.unwrap_or_default();
    let mut decoded = Vec::new();
    let mut hold = crate::body::Hold::default();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = input.read(&mut chunk).map_err(|e| {
            TableError::new(
                CANNOT_DECOMPRESS,
                format!("the {name} request body does not decode: {e}"),
            )
        })?;
        if n == 0 {
            break;
        }
        if decoded.len() + n > DECODED_BYTES_MAX {
            return Err(TableError::new(
                super::error::MEMORY_LIMIT_EXCEEDED,
                format!("the {name} request body decodes to more than {DECODED_BYTES_MAX} bytes"),
            ));
        }
        // the room the buffer keeps is counted, not only what it holds
        if decoded.len() + n > decoded.capacity() {
            let room = (decoded.capacity() * 2).max(decoded.len() + n).min(DECODED_BYTES_MAX);
            hold.grow(budget, room - decoded.capacity()).map_err(body_refused)?;
            decoded.reserve_exact(room - decoded.len());
        }
        decoded.extend_from_slice(&chunk[..n]);
    }
    drop(input);
    Ok((Bytes::from(decoded), held, hold))
}

/// Splits a request body that holds the query into the query's text and
/// the insert's data after it. A body that is all UTF-8 is all query (an
/// insert's data follows its `FORMAT <name>` inside it); otherwise the
/// query is the UTF-8 text up to an insert's `FORMAT <name>` and one
/// whitespace, and the rest is binary data.
fn split_body(body: &[u8]) -> TResult<(String, &[u8])> {
    let upto = match std::str::from_utf8(body) {
        Ok(text) => return Ok((text.to_string(), &[])),
        Err(e) => e.valid_up_to(),
    };
    let text = std::str::from_utf8(&body[..upto]).expect("valid up to here");
    let Some((end, _)) = query::insert_format_end(text) else {
        return Err(TableError::new(
            INCORRECT_DATA,
            format!("the request body is not UTF-8 (at byte {upto}) and holds no INSERT … FORMAT <name> before that"),
        ));
    };
    let rest = &body[end..];
    let rest = rest
        .strip_prefix(b"\r\n")
        .or_else(|| rest.strip_prefix(b"\n"))
        .or_else(|| rest.strip_prefix(b" "))
        .or_else(|| rest.strip_prefix(b"\t"))
        .unwrap_or(rest);
    Ok((text[..end].to_string(), rest))
}

enum Answer {
    Reply(Resp),
    /// Close the connection without answering (the drop-insert-reply hook).
    Drop,
}

/// The longest `query_id` kept (longer ones are cut: it is only logged).
const QUERY_ID_MAX: usize = 128;

/// A query's settings from its URL parameters.
struct Settings {
    insert: InsertSettings,
    quote_64bit: bool,
    default_format: Option<Format>,
    revision: u64,
}

fn settings(params: &[(String, String)]) -> TResult<Settings> {
    let mut s = Settings {
        insert: InsertSettings::default(),
        quote_64bit: true,
        default_format: None,
        revision: 0,
    };
    let number = |k: &str, v: &str| -> TResult<u64> {
        v.parse()
            .map_err(|_| TableError::new(BAD_ARGUMENTS, format!("setting {k}={v}: expected a number")))
    };
    for (k, v) in params {
        match k.as_str() {
            "query" => {}
            "database" if v == "default" => {}
            "database" => {
                return Err(TableError::new(
                    super::error::UNKNOWN_DATABASE,
                    format!("Database {v} does not exist"),
                ))
            }
            "default_format" => s.default_format = Some(Format::parse(v)?),
            "insert_deduplicate" => s.insert.deduplicate = bool_setting(k, v)?,
            "insert_deduplication_token" => s.insert.token = (!v.is_empty()).then(|| v.clone()),
            "insert_quorum" => s.insert.quorum = parse_quorum(v)?,
            "insert_quorum_timeout" => s.insert.quorum_timeout = Duration::from_millis(number(k, v)?),
            "insert_quorum_parallel" => s.insert.quorum_parallel = bool_setting(k, v)?,
            "max_insert_block_size" => {
                let n = number(k, v)?;
                if n == 0 {
                    return Err(TableError::new(BAD_ARGUMENTS, "max_insert_block_size must be positive"));
                }
                s.insert.max_block_rows = n.min(usize::MAX as u64) as usize;
            }
            "output_format_json_quote_64bit_integers" => s.quote_64bit = bool_setting(k, v)?,
            "client_protocol_version" => s.revision = number(k, v)?,
            "query_id" => s.insert.query_id = (!v.is_empty()).then(|| v.chars().take(QUERY_ID_MAX).collect()),
            // ClickHouse's own compressed framing of a body or a result,
            // which drift does not write or read
            "compress" | "decompress" if v != "0" => {
                return Err(TableError::new(
                    super::error::NOT_IMPLEMENTED,
                    format!(
                        "{k}={v}: ClickHouse's compressed framing is not supported (use Content-Encoding lz4 or zstd)"
                    ),
                ))
            }
            k if HARMLESS_PARAMS.contains(&k) => {}
            other => {
                return Err(TableError::new(
                    UNKNOWN_SETTING,
                    format!("Setting {other} is neither a builtin setting nor started with the prefix 'custom_'"),
                ))
            }
        }
    }
    Ok(s)
}

fn replica<'a>(node: &'a TableNode, table: &str) -> TResult<&'a Arc<Replica>> {
    node.replicas.get(table).ok_or_else(|| {
        TableError::new(
            UNKNOWN_TABLE,
            format!(
                "Table default.{table} does not exist (tables: {})",
                node.replicas.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })
}

async fn run(node: &TableNode, method: &Method, params: &[(String, String)], body: &Bytes) -> TResult<Answer> {
    let param_query = params.iter().find(|(k, _)| k == "query").map(|(_, v)| v.as_str());
    // the query is the parameter, else the body; with both, the body
    // continues the query (an insert's data)
    let (query_text, rest): (String, &[u8]) = match param_query {
        Some(q) => (q.to_string(), &body[..]),
        None => split_body(body)?,
    };
    if query_text.trim().is_empty() {
        return Err(TableError::new(BAD_ARGUMENTS, "Empty query"));
    }
    let (command, query_settings) = query::parse_with_settings(&query_text)?;
    // the query's SETTINGS clause over the URL's, as ClickHouse applies them
    let s = if query_settings.is_empty() {
        settings(params)?
    } else {
        settings(&[params, &query_settings[..]].concat())?
    };
    let writes = !matches!(command, Command::Select(_));
    if writes && *method == Method::GET {
        return Err(TableError::new(
            READONLY,
            "Cannot execute query in readonly mode: a GET request can only read (use POST)",
        ));
    }
    match command {
        Command::Insert(ins) => {
            let r = replica(node, &ins.table)?;
            let columns = insert_columns(&r.schema, &ins.columns)?;
            // the rows take their memory from the port's budget until the
            // insert is done
            let mut bound = RowsBound::within(&node.bodies);
            let rows = match ins.data {
                InsertData::Formatted { format, inline } => {
                    let data: std::borrow::Cow<[u8]> = if inline.is_empty() {
                        rest.into()
                    } else {
                        [inline.as_bytes(), rest].concat().into()
                    };
                    parse_rows_within(&r.schema, format, &columns, &data, &mut bound)?
                }
                InsertData::Values(v) => values_rows(&r.schema, &columns, &v)?,
            };
            let n = rows.len();
            let block = Block::from_rows(&r.schema, rows).map_err(|e| TableError::new(INCORRECT_DATA, e))?;
            // its own task: a client that goes away does not cut an insert
            // off between its commit and the replica taking the part (the
            // coordinator would list a part the replica does not show)
            let (writer, settings) = (r.clone(), s.insert.clone());
            let summary = tokio::spawn(async move { writer.insert(block, &settings).await })
                .await
                .map_err(|e| TableError::new(super::error::KEEPER_EXCEPTION, format!("the insert's task: {e}")))??;
            if Hooks::take(&r.hooks.drop_insert_reply) || r.hooks.drop_replies.load(Ordering::SeqCst) {
                r.log(
                    "fault_hook",
                    serde_json::json!({"hook": "drop-insert-reply", "parts": summary.parts}),
                );
                return Ok(Answer::Drop);
            }
            let ch = serde_json::json!({
                "read_rows": "0", "read_bytes": "0", "written_rows": summary.written_rows.to_string(),
                "written_bytes": "0", "total_rows_to_read": "0", "result_rows": n.to_string(), "result_bytes": "0",
            });
            let drift = serde_json::json!({
                "written_blocks": summary.written_blocks, "deduplicated_blocks": summary.deduplicated_blocks,
                "parts": summary.parts,
            });
            Ok(Answer::Reply(
                Response::builder()
                    .status(StatusCode::OK)
                    .header("X-ClickHouse-Summary", ch.to_string())
                    .header("X-Drift-Insert", drift.to_string())
                    .body(Full::new(Bytes::new()))
                    .expect("a valid response"),
            ))
        }
        Command::Select(q) => {
            let format = q.format.or(s.default_format).unwrap_or(Format::TabSeparated);
            let rel = relation(node, &q).await?;
            let out = select::run(&q, rel)?;
            let bytes = write_rows(
                format,
                &out.names,
                &out.types,
                &out.rows,
                OutputOptions {
                    quote_64bit: s.quote_64bit,
                    revision: s.revision,
                },
            )?;
            Ok(Answer::Reply(
                Response::builder()
                    .status(StatusCode::OK)
                    .header("Content-Type", format.content_type())
                    .header("X-ClickHouse-Format", format.name())
                    .header("X-ClickHouse-Timezone", select::SERVER_TIMEZONE)
                    .body(Full::new(Bytes::from(bytes)))
                    .expect("a valid response"),
            ))
        }
        Command::SyncReplica(t) => {
            let r = replica(node, &t)?;
            r.sync_replica(SYNC_TIMEOUT).await?;
            Ok(Answer::Reply(text(200, String::new())))
        }
        Command::Fetches(t, on) => {
            let r = replica(node, &t)?;
            r.hooks.fetches_stopped.store(!on, Ordering::SeqCst);
            r.wake.notify_one();
            Ok(Answer::Reply(text(200, String::new())))
        }
        Command::Merges(t, on) => {
            let r = replica(node, &t)?;
            r.st().merges_stopped = !on;
            r.wake.notify_one();
            Ok(Answer::Reply(text(200, String::new())))
        }
        Command::DropPartition { table, partition } => {
            let r = replica(node, &table)?;
            if let Some(why) = r.readonly() {
                return Err(TableError::new(
                    TABLE_IS_READ_ONLY,
                    format!("Table is in readonly mode: {why}"),
                ));
            }
            r.drop_partition(&partition, SYNC_TIMEOUT)
                .await
                .map_err(|e| TableError::new(TIMEOUT_EXCEEDED, e))?;
            Ok(Answer::Reply(text(200, String::new())))
        }
        Command::Optimize { table, final_ } => {
            let r = replica(node, &table)?;
            if let Some(why) = r.readonly() {
                return Err(TableError::new(
                    TABLE_IS_READ_ONLY,
                    format!("Table is in readonly mode: {why}"),
                ));
            }
            r.optimize(final_, SYNC_TIMEOUT)
                .await
                .map_err(|e| TableError::new(TIMEOUT_EXCEEDED, e))?;
            Ok(Answer::Reply(text(200, String::new())))
        }
    }
}

/// `VALUES` rows, evaluated as constant expressions.
fn values_rows(
    schema: &drift_table::Schema,
    columns: &[usize],
    rows: &[Vec<sqlparser::ast::Expr>],
) -> TResult<Vec<Vec<Value>>> {
    let mut out = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        if r.len() != columns.len() {
            return Err(TableError::new(
                INCORRECT_DATA,
                format!("VALUES row {}: {} values for {} columns", i + 1, r.len(), columns.len()),
            ));
        }
        let mut row: Vec<Value> = schema
            .columns
            .iter()
            .map(|c| super::formats::default_of(c.ty))
            .collect();
        for (&c, e) in columns.iter().zip(r) {
            let text = select::constant_text(e)
                .map_err(|why| TableError::new(INCORRECT_DATA, format!("VALUES row {}: {why}", i + 1)))?;
            row[c] = super::formats::parse_text(schema.columns[c].ty, &text).map_err(|why| {
                TableError::new(
                    INCORRECT_DATA,
                    format!("VALUES row {}: column {}: {why}", i + 1, schema.columns[c].name),
                )
            })?;
        }
        out.push(row);
    }
    Ok(out)
}

/// The rows a SELECT reads.
async fn relation(node: &TableNode, q: &SelectQuery) -> TResult<Relation> {
    match &q.from {
        Source::None => Ok(Relation::new(
            &[("dummy", ColumnType::UInt64)],
            vec![vec![Value::UInt64(0)]],
        )),
        Source::Table(t) => {
            let r = replica(node, t)?;
            r.table_rows()
                .map_err(|e| TableError::new(super::error::LOGICAL_ERROR, e))
        }
        Source::System(name) => super::system::table(node, name).await,
        Source::Describe(t) => super::system::describe(node, t).await,
        Source::Exists(t) => Ok(super::system::exists(node, t)),
        Source::Tables(db) => super::system::show_tables(node, db),
        Source::Databases => Ok(super::system::show_databases()),
    }
}

/// The interserver interface: `GET /part?table=T&part=P`.
pub async fn handle_interserver(node: Arc<TableNode>, req: Request<Incoming>) -> Result<Resp, std::io::Error> {
    if req.uri().path() != "/part" {
        return Ok(text(404, "no such endpoint\n".into()));
    }
    if req.method() != Method::GET {
        return Ok(text(
            405,
            format!("{} /part: parts are fetched with GET\n", req.method()),
        ));
    }
    let params: BTreeMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let (Some(table), Some(part)) = (params.get("table"), params.get("part")) else {
        return Ok(text(400, "needs table and part\n".into()));
    };
    let Some(r) = node.replicas.get(table) else {
        return Ok(text(404, format!("no table {table}\n")));
    };
    // only another replica of the cluster may fetch
    let target = req.uri().path_and_query().map_or("/part", |t| t.as_str());
    let header = req
        .headers()
        .get(crate::http_auth::HEADER)
        .and_then(|v| v.to_str().ok());
    if let Err(why) = r.verifier.check(req.method().as_str(), target, header) {
        return Ok(text(401, format!("{why}\n")));
    }
    if drift_table::PartInfo::parse(part).is_err() {
        return Ok(text(400, format!("bad part name {part:?}\n")));
    }
    let store = r.store.clone();
    let schema = r.schema.clone();
    let name = part.clone();
    let files = tokio::task::spawn_blocking(move || store.read_checked(&schema, &name))
        .await
        .map_err(std::io::Error::other)?;
    match files {
        Ok(mut files) => {
            if Hooks::take(&r.hooks.forge_next_part) {
                // the rows twice, with checksums that match them
                if let Ok(b) = drift_table::format::decode_part(&r.schema, &files) {
                    files = drift_table::format::encode_part(&r.schema, &Block::merge(&r.schema, &[b.clone(), b]));
                    r.log(
                        "fault_hook",
                        serde_json::json!({"hook": "forge-next-part", "part": part}),
                    );
                }
            }
            let corrupt = Hooks::take(&r.hooks.corrupt_next_part);
            let truncate = Hooks::take(&r.hooks.truncate_next_part);
            if corrupt || truncate {
                r.log("fault_hook", serde_json::json!({"hook": if corrupt { "corrupt-next-part" } else { "truncate-next-part" }, "part": part}));
            }
            Ok(Response::builder()
                .status(200)
                .header("Content-Type", "application/octet-stream")
                .body(Full::new(Bytes::from(super::interserver::encode(
                    &files, corrupt, truncate,
                ))))
                .expect("a valid response"))
        }
        Err(e) => Ok(text(404, format!("part {part}: {e}\n"))),
    }
}

impl Replica {
    /// Every row of the replica's active parts.
    pub fn table_rows(&self) -> Result<Relation, String> {
        let parts: Vec<String> = self.st().queue.current().iter().map(|p| p.name()).collect();
        let mut rows = Vec::new();
        for p in parts {
            let b = self.load_part(&p)?;
            rows.extend((0..b.rows()).map(|i| b.row(i)));
        }
        Ok(Relation {
            names: self.schema.columns.iter().map(|c| c.name.clone()).collect(),
            types: self.schema.columns.iter().map(|c| c.ty).collect(),
            rows,
        })
    }

    /// `SYSTEM SYNC REPLICA`: pulls the log, then waits until every entry
    /// queued at that moment is done.
    pub async fn sync_replica(&self, timeout: Duration) -> TResult<()> {
        if let Some(why) = self.readonly() {
            return Err(TableError::new(
                TABLE_IS_READ_ONLY,
                format!("Table is in readonly mode: {why}"),
            ));
        }
        // the log as the coordinator's leader has it now, not as this
        // session's server last heard: a server that reads locally may
        // lag an entry another replica already committed
        self.coord
            .sync(&self.paths.log())
            .await
            .map_err(|e| TableError::new(super::error::KEEPER_EXCEPTION, format!("syncing the log: {e}")))?;
        self.pull_log()
            .await
            .map_err(|e| TableError::new(super::error::KEEPER_EXCEPTION, format!("pulling the log: {e}")))?;
        let want: Vec<String> = self.st().queue.entries().map(|e| e.znode.clone()).collect();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left: Vec<String> = {
                let st = self.st();
                want.iter().filter(|z| st.queue.contains(z)).cloned().collect()
            };
            if left.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let detail: Vec<String> = {
                    let st = self.st();
                    st.queue
                        .entries()
                        .filter(|e| left.contains(&e.znode))
                        .take(5)
                        .map(|e| {
                            format!(
                                "{} {} ({})",
                                e.entry.type_name(),
                                e.entry.new_part(),
                                if e.last_exception.is_empty() {
                                    &e.postpone_reason
                                } else {
                                    &e.last_exception
                                }
                            )
                        })
                        .collect()
                };
                return Err(TableError::new(
                    TIMEOUT_EXCEEDED,
                    format!(
                        "SYNC REPLICA {}: Timeout exceeded ({} s) with {} entries left: {}",
                        self.schema.name,
                        timeout.as_secs(),
                        left.len(),
                        detail.join("; ")
                    ),
                ));
            }
            self.wake.notify_one();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
