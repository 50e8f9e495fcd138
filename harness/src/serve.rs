//! `drift serve`: the result store over HTTP, read-only — an index of
//! every test's runs with their verdicts, each run's files (report.html,
//! results.json, history.jsonl, pictures, node logs), and `drift compare`
//! of any two runs as a page.
//!
//! hyper's HTTP/1.1 server on a tokio runtime of its own: GET and HEAD
//! only, at most [`CONNECTIONS_MAX`] connections at once (past it a new one
//! gets 503), a request head of at most [`HEAD_BYTES_MAX`] that must arrive
//! within [`IDLE`] (hyper answers 431 and 400 to what it cannot read),
//! every response closing its connection. Pages are built and files opened
//! on tokio's blocking pool; a file is streamed as it is read. Paths are
//! resolved inside the store and refused when they lead out of it (`..`, a
//! symlink pointing elsewhere). It binds where `--listen` says, loopback
//! by default, and runs until it is stopped.

use crate::cli::ServeArgs;
use crate::compare::{self, Limits};
use crate::fail::Failure;
use bytes::Bytes;
use drift_results::files::{ResultsFile, RunInfo};
use drift_results::picture::esc;
use drift_results::store;
use hyper::body::{Body as HttpBody, Frame, Incoming};
use hyper::{Request, Response as HttpResponse};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncRead;

/// Connections served at once; past it a new one gets 503.
const CONNECTIONS_MAX: usize = 64;
/// Longest request head accepted (request line + headers).
const HEAD_BYTES_MAX: usize = 16 << 10;
/// The whole request head must arrive within this.
const IDLE: Duration = Duration::from_secs(10);
/// Connections being served now, against [`CONNECTIONS_MAX`].
static CONNECTIONS: AtomicUsize = AtomicUsize::new(0);
/// Comparisons running now, against [`COMPARES_MAX`].
static COMPARES: AtomicUsize = AtomicUsize::new(0);
/// Runs listed per test on the index, newest first.
const RUNS_LISTED_MAX: usize = 100;

pub fn serve(args: ServeArgs) -> Result<i32, Failure> {
    let root =
        std::fs::canonicalize(&args.store).map_err(|e| Failure::new(format!("{}: {e}", args.store.display())))?;
    if !root.is_dir() {
        return Err(Failure::new(format!("{}: not a directory", args.store.display())));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("serve")
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("the server's runtime: {e}")))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| Failure::new(format!("--listen {}: {e}", args.listen)))?;
        let addr = listener.local_addr().map_err(|e| Failure::new(e.to_string()))?;
        out!("serving {} at http://{addr}/", root.display());
        let root = Arc::new(root);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let slot = Slot::take(&CONNECTIONS, CONNECTIONS_MAX);
            let root = root.clone();
            tokio::spawn(async move {
                // the slot goes back when the connection ends, however
                let full = slot.is_none();
                let _slot = slot;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let root = root.clone();
                    async move {
                        let r = if full {
                            Response::text(503, "too many connections")
                        } else {
                            answer(root, req.method().clone(), req.uri().clone()).await
                        };
                        Ok::<_, std::convert::Infallible>(r.into_http())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(IDLE)
                    .max_buf_size(HEAD_BYTES_MAX)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// One request's response: the page or file, built on the blocking pool.
async fn answer(root: Arc<PathBuf>, method: hyper::Method, uri: hyper::Uri) -> Response {
    let head_only = method == hyper::Method::HEAD;
    if method != hyper::Method::GET && !head_only {
        return Response::text(405, &format!("{method}: only GET and HEAD are served"));
    }
    let target = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut r = tokio::task::spawn_blocking(move || route(&root, &target))
        .await
        .unwrap_or_else(|e| Response::text(500, &format!("the request's task: {e}")));
    r.head_only = head_only;
    r
}

/// One of a bounded number of places, given back when dropped.
struct Slot(&'static AtomicUsize);

impl Slot {
    fn take(count: &'static AtomicUsize, max: usize) -> Option<Slot> {
        if count.fetch_add(1, Ordering::SeqCst) >= max {
            count.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(count))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Comparisons running at once: each loads two whole histories.
const COMPARES_MAX: usize = 2;

struct Response {
    status: u16,
    content_type: &'static str,
    body: Body,
    /// A HEAD request's: the length of the body, and no body.
    head_only: bool,
}

enum Body {
    Bytes(Vec<u8>),
    /// A file streamed as it is read, with its length.
    File(std::fs::File, u64),
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Body::Bytes(format!("{body}\n").into_bytes()),
            head_only: false,
        }
    }

    fn html(body: String) -> Response {
        Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: Body::Bytes(body.into_bytes()),
            head_only: false,
        }
    }

    fn into_http(self) -> HttpResponse<Streamed> {
        let len = match &self.body {
            Body::Bytes(b) => b.len() as u64,
            Body::File(_, len) => *len,
        };
        let body = match self.body {
            _ if self.head_only => Streamed::Empty,
            Body::Bytes(b) => Streamed::Bytes(Some(Bytes::from(b))),
            Body::File(f, len) => Streamed::File {
                file: tokio::fs::File::from_std(f),
                left: len,
            },
        };
        HttpResponse::builder()
            .status(self.status)
            .header("Content-Type", self.content_type)
            .header("Content-Length", len)
            .header("Cache-Control", "no-store")
            .body(body)
            .expect("a valid response")
    }
}

/// A response body: bytes, or a file read 64 KiB at a time as the client
/// takes it, up to the length the head announced.
enum Streamed {
    Empty,
    Bytes(Option<Bytes>),
    File { file: tokio::fs::File, left: u64 },
}

impl HttpBody for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Streamed::Empty => Poll::Ready(None),
            Streamed::Bytes(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Streamed::File { file, left } => {
                if *left == 0 {
                    return Poll::Ready(None);
                }
                let mut buf = vec![0u8; (*left).min(64 << 10) as usize];
                let mut rb = tokio::io::ReadBuf::new(&mut buf);
                match Pin::new(file).poll_read(cx, &mut rb) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        if n == 0 {
                            // the file is shorter than it was when opened
                            return Poll::Ready(Some(Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "the file shrank while it was sent",
                            ))));
                        }
                        *left -= n as u64;
                        buf.truncate(n);
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Streamed::Empty => true,
            Streamed::Bytes(b) => b.is_none(),
            Streamed::File { left, .. } => *left == 0,
        }
    }
}

fn route(root: &Path, target: &str) -> Response {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Some(path) = percent_decode(path, false) else {
        return Response::text(400, "bad percent-encoding in the path");
    };
    if path == "/" {
        return Response::html(index(root));
    }
    if path == "/compare" {
        return compare_page(root, query);
    }
    match inside(root, &path) {
        Some(p) if holds_secret(&p) => Response::text(403, &format!("{path}: holds a secret, not served")),
        Some(p) if p.is_dir() => Response::html(listing(root, &p)),
        Some(p) if p.is_file() => match std::fs::File::open(&p).and_then(|f| Ok((f.metadata()?.len(), f))) {
            Ok((len, f)) => Response {
                status: 200,
                content_type: content_type(&p),
                body: Body::File(f, len),
                head_only: false,
            },
            Err(e) => Response::text(500, &format!("{path}: {e}")),
        },
        _ => Response::text(404, &format!("{path}: not in the store")),
    }
}

/// `%XX` decoding (and `+` as a space in a query, `plus_is_space`);
/// `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(if plus_is_space && b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The store path a URL path names, if it stays inside the store once
/// every symlink is resolved.
fn inside(root: &Path, url_path: &str) -> Option<PathBuf> {
    let rel = Path::new(url_path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let real = std::fs::canonicalize(root.join(rel)).ok()?;
    real.starts_with(root).then_some(real)
}

/// Files a run keeps that hold the cluster's peer secret or its fault
/// token: the cluster files and token files by name, and anything drift
/// wrote readable by its owner alone (`write_private`). Never served nor
/// listed.
fn holds_secret(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    const SECRET_NAMES: [&str; 2] = ["cluster.toml", "fault-token"];
    let named = p
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| SECRET_NAMES.contains(&n));
    named || std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o077 == 0)
}

fn content_type(p: &Path) -> &'static str {
    match p.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("jsonl") | Some("log") | Some("toml") | Some("txt") => "text/plain; charset=utf-8",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

/// The store path of `p` as a URL path.
fn url(root: &Path, p: &Path) -> String {
    let rel = p.strip_prefix(root).unwrap_or(p);
    let mut out = String::new();
    for part in rel.components() {
        out.push('/');
        for b in part.as_os_str().to_string_lossy().bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                out.push(b as char);
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

const STYLE: &str = "<style>body { font-family: sans-serif; margin: 24px; color: #222; } \
table { border-collapse: collapse; font-family: monospace; margin-bottom: 20px; } \
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; } \
pre { background: #fafafa; border: 1px solid #ddd; padding: 8px; } \
.valid { color: #2e7d32; font-weight: bold; } .invalid { color: #c62828; font-weight: bold; } \
.unknown { color: #ef6c00; font-weight: bold; } \
.note { background: #fff8e1; border: 1px solid #ffe082; padding: 6px 10px; }</style>";

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>{STYLE}</head><body>{body}</body></html>\n",
        esc(title)
    )
}

/// A run's JSON file for the index: absent or unreadable is shown as
/// absent (the run's own page serves the file as it is).
fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Option<T> {
    compare::read_json(p).ok().flatten()
}

/// Every test directory and its runs, newest first, with verdicts and a
/// link comparing each run with the one before it.
fn index(root: &Path) -> String {
    let mut tests = store::entries(root).unwrap_or_default();
    tests.retain(|p| p.is_dir() && !p.is_symlink());
    let mut body = format!("<h1>drift runs</h1><p>store {}</p>", esc(&root.display().to_string()));
    if root.join(store::LATEST).is_dir() {
        let _ = write!(body, r#"<p><a href="/{0}/">latest run</a></p>"#, store::LATEST);
    }
    let mut any = false;
    for test in tests {
        // campaign runs hold their history; `drift check` runs of a file
        // outside the store hold its results only
        let mut runs = store::entries(&test).unwrap_or_default();
        runs.retain(|p| store::is_run(p) || p.join(store::RESULTS_JSON).is_file());
        if runs.is_empty() {
            continue;
        }
        any = true;
        runs.reverse();
        let name = test
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = write!(
            body,
            "<h2>{}</h2><table><tr><th>run</th><th>verdict</th><th>operations</th><th>seed</th><th>drift</th><th></th><th></th></tr>",
            esc(&name)
        );
        for (k, run) in runs.iter().take(RUNS_LISTED_MAX).enumerate() {
            let results: Option<ResultsFile> = read_json(&run.join(store::RESULTS_JSON));
            let info: Option<RunInfo> = read_json(&run.join(store::RUN_JSON));
            let verdict = results.as_ref().map_or("not checked", |r| r.verdict.as_str());
            let stamp = run
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let report = if run.join(store::REPORT_HTML).is_file() {
                format!(r#"<a href="{}">report</a>"#, url(root, &run.join(store::REPORT_HTML)))
            } else {
                String::new()
            };
            let previous = runs
                .get(k + 1)
                .filter(|p| store::is_run(p) && store::is_run(run))
                .map_or(String::new(), |prev| {
                    format!(
                        r#"<a href="/compare?base={}&amp;run={}">compare with the run before</a>"#,
                        url(root, prev).trim_start_matches('/'),
                        url(root, run).trim_start_matches('/')
                    )
                });
            let _ = write!(
                body,
                r#"<tr><td><a href="{}/">{}</a></td><td class="{verdict}">{verdict}</td><td>{}</td><td>{}</td><td>{}</td><td>{report}</td><td>{previous}</td></tr>"#,
                url(root, run),
                esc(&stamp),
                results.as_ref().map_or(String::new(), |r| r.operations.to_string()),
                info.as_ref()
                    .and_then(|i| i.seed)
                    .map_or(String::new(), |s| s.to_string()),
                info.as_ref().map_or(String::new(), |i| esc(&i.versions.short())),
            );
        }
        body.push_str("</table>");
        if runs.len() > RUNS_LISTED_MAX {
            let _ = write!(body, "<p>{} older runs not listed</p>", runs.len() - RUNS_LISTED_MAX);
        }
    }
    if !any {
        body.push_str("<p>no runs yet: <code>drift test</code> stores its runs here</p>");
    }
    page("drift runs", &body)
}

/// A directory of the store: its entries as links.
fn listing(root: &Path, dir: &Path) -> String {
    let entries = store::entries(dir).unwrap_or_default();
    let mut body = format!(
        r#"<h1>{}</h1><p><a href="/">all runs</a></p><table><tr><th>name</th><th>bytes</th></tr>"#,
        esc(&url(root, dir))
    );
    for e in entries.into_iter().filter(|e| !holds_secret(e)) {
        let name = e
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (slash, size) = if e.is_dir() {
            ("/", String::new())
        } else {
            ("", e.metadata().map(|m| m.len().to_string()).unwrap_or_default())
        };
        let _ = write!(
            body,
            r#"<tr><td><a href="{}{slash}">{}{slash}</a></td><td>{size}</td></tr>"#,
            url(root, &e),
            esc(&name)
        );
    }
    body.push_str("</table>");
    page(&url(root, dir), &body)
}

/// `/compare?base=<test>/<stamp>&run=<test>/<stamp>[&json=1]`.
fn compare_page(root: &Path, query: &str) -> Response {
    let mut base = None;
    let mut run = None;
    let mut json = false;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(v) = percent_decode(v, true) else {
            return Response::text(400, "bad percent-encoding in the query");
        };
        match k {
            "base" => base = Some(v),
            "run" => run = Some(v),
            "json" => json = v == "1",
            _ => {}
        }
    }
    let (Some(base), Some(run)) = (base, run) else {
        return Response::text(400, "compare needs ?base=<test>/<run>&run=<test>/<run>");
    };
    let (Some(b), Some(r)) = (inside(root, &base), inside(root, &run)) else {
        return Response::text(404, "base or run is not in the store");
    };
    if !(store::is_run(&b) && store::is_run(&r)) {
        return Response::text(404, "base or run is not a run (no history.jsonl)");
    }
    let Some(_comparing) = Slot::take(&COMPARES, COMPARES_MAX) else {
        return Response::text(503, "busy comparing other runs: try again");
    };
    let limits = Limits {
        max_throughput_drop: None,
        max_p99_rise: None,
        min_ops: 0,
    };
    let link = |p: &Path| format!("{}/report.html", url(root, p));
    let shown = if json {
        compare::render(&[b, r], &limits, true).map(|(text, _)| text)
    } else {
        compare::render_html(&[b, r], &limits, root, &link)
    };
    match shown {
        Ok(text) if json => Response {
            status: 200,
            content_type: "application/json",
            body: Body::Bytes(text.into_bytes()),
            head_only: false,
        },
        Ok(body) => Response::html(page(
            "drift compare",
            &format!(
                r#"<h1>compare</h1><p><a href="/">all runs</a> · <a href="/compare?{}&amp;json=1">as JSON</a></p>{body}"#,
                esc(query)
            ),
        )),
        // both are runs: what fails is a file in one of them
        Err(f) => Response::text(500, &f.message.replace(&root.display().to_string(), "<store>")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_takes_escapes_and_refuses_broken_ones() {
        assert_eq!(percent_decode("/a%20b/c+d", false).as_deref(), Some("/a b/c+d"));
        assert_eq!(
            percent_decode("c+d", true).as_deref(),
            Some("c d"),
            "a query's + is a space"
        );
        assert_eq!(percent_decode("%2e%2e/x", false).as_deref(), Some("../x"));
        assert_eq!(percent_decode("%zz", false), None);
        assert_eq!(percent_decode("%4", false), None);
        assert_eq!(percent_decode("%ff", false), None, "not UTF-8");
    }

    #[test]
    fn paths_that_leave_the_store_are_refused() {
        let root = std::env::temp_dir().join(format!("drift-serve-inside-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("t/r")).unwrap();
        std::fs::write(root.join("t/r/run.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        assert_eq!(inside(&root, "/t/r/run.json"), Some(root.join("t/r/run.json")));
        assert_eq!(inside(&root, "/t/../t/r/run.json"), None);
        assert_eq!(inside(&root, "/../etc/passwd"), None);
        assert_eq!(inside(&root, "/out/passwd"), None, "a symlink out of the store");
        assert_eq!(inside(&root, "//etc/passwd"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn files_holding_a_secret_are_neither_served_nor_listed() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("drift-serve-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("t/r/nodes")).unwrap();
        std::fs::write(root.join("t/r/run.json"), "{}").unwrap();
        crate::servers::write_private(&root.join("t/r/cluster.toml"), "secret = \"s3cr3t\"").unwrap();
        // by name even where the mode was widened
        std::fs::write(root.join("t/r/nodes/fault-token"), "t0k3n").unwrap();
        std::fs::set_permissions(
            root.join("t/r/nodes/fault-token"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        crate::servers::write_private(&root.join("t/r/nodes/other.key"), "k3y").unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        for path in ["/t/r/cluster.toml", "/t/r/nodes/fault-token", "/t/r/nodes/other.key"] {
            let r = route(&root, path);
            assert_eq!(r.status, 403, "{path}");
            let Body::Bytes(body) = r.body else {
                panic!("{path}: a file was served")
            };
            let body = String::from_utf8(body).unwrap();
            assert!(!body.contains("s3cr3t") && !body.contains("t0k3n"), "{body}");
        }
        assert_eq!(route(&root, "/t/r/run.json").status, 200);
        for dir in ["t/r", "t/r/nodes"] {
            let page = listing(&root, &root.join(dir));
            for name in ["cluster.toml", "fault-token", "other.key"] {
                assert!(!page.contains(name), "{dir} lists {name}: {page}");
            }
        }
        assert!(listing(&root, &root.join("t/r")).contains("run.json"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn urls_escape_what_is_not_plain() {
        let root = Path::new("/s");
        assert_eq!(url(root, Path::new("/s/t/a b")), "/t/a%20b");
        assert_eq!(url(root, Path::new("/s")), "/");
    }
}
