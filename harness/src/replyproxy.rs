//! The clickhouse target's `drop-reply` fault: a proxy of drift's own in
//! front of each ClickHouse server's HTTP port. The workload talks to the
//! proxy; it forwards every request as it came and every answer as it
//! went, except while dropping: then an insert the server acknowledged
//! (200) is answered with nothing, the connection closed — the insert
//! committed and the client cannot know, which is why it retries.
//!
//! What it keeps of a request is its method, path and query, body and
//! content type; of an answer, its status, headers (bar the hop-by-hop
//! ones) and body. A server that refuses the connection is answered 502
//! with `X-Drift-Proxy: connect-refused` (the client then knows nothing
//! reached the server, as it would without the proxy); any other failure
//! on the way to the server closes the client's connection unanswered.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The header of a proxy's own answer.
pub const PROXY_HEADER: &str = "x-drift-proxy";
/// Its value when the server refused the connection.
pub const CONNECT_REFUSED: &str = "connect-refused";
/// Largest request body forwarded (the workload's inserts are small).
const BODY_BYTES_MAX: usize = 64 << 20;
/// Headers that belong to one hop, not to the answer.
const HOP_BY_HOP: [&str; 5] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "upgrade",
];

/// One proxy's state: where it forwards to, whether it drops.
struct Proxy {
    upstream: SocketAddr,
    dropping: AtomicBool,
    dropped: AtomicU64,
    http: reqwest::Client,
}

/// Why an answer is not sent: hyper then closes the connection.
#[derive(Debug)]
struct Unanswered(String);

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unanswered {}

/// The proxies of a run, one per server, on a runtime of their own.
pub struct ReplyProxies {
    proxies: Vec<Arc<Proxy>>,
    listen: Vec<SocketAddr>,
    rt: Option<tokio::runtime::Runtime>,
}

/// Whether a request is an INSERT (in the `query` parameter or the body).
fn is_insert(query: Option<&str>, body: &[u8]) -> bool {
    let starts = |s: &str| {
        s.trim_start()
            .get(..6)
            .is_some_and(|w| w.eq_ignore_ascii_case("insert"))
    };
    let in_query = query.is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "query" && starts(&v)));
    in_query || starts(&String::from_utf8_lossy(&body[..body.len().min(64)]))
}

async fn forward(p: Arc<Proxy>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Unanswered> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, BODY_BYTES_MAX)
        .collect()
        .await
        .map_err(|e| Unanswered(format!("request body: {e}")))?
        .to_bytes();
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let insert = is_insert(parts.uri.query(), &body);
    let method =
        reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).map_err(|e| Unanswered(e.to_string()))?;
    let mut out = p
        .http
        .request(method, format!("http://{}{target}", p.upstream))
        .body(body);
    if let Some(ct) = parts.headers.get("content-type").and_then(|v| v.to_str().ok()) {
        out = out.header("content-type", ct);
    }
    let resp = match out.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .header(PROXY_HEADER, CONNECT_REFUSED)
                .body(Full::new(Bytes::from(format!("drift proxy: {}: {e}", p.upstream))))
                .map_err(|e| Unanswered(e.to_string()));
        }
        Err(e) => return Err(Unanswered(format!("upstream: {e}"))),
    };
    let status = resp.status().as_u16();
    let headers: Vec<(String, Vec<u8>)> = resp
        .headers()
        .iter()
        .filter(|(k, _)| !HOP_BY_HOP.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| Unanswered(format!("upstream body: {e}")))?;
    if insert && status == 200 && p.dropping.load(Ordering::SeqCst) {
        p.dropped.fetch_add(1, Ordering::Relaxed);
        return Err(Unanswered("drop-reply: an acknowledged insert goes unanswered".into()));
    }
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(k, v);
    }
    b.body(Full::new(bytes)).map_err(|e| Unanswered(e.to_string()))
}

async fn serve(listener: tokio::net::TcpListener, p: Arc<Proxy>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let p = p.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| forward(p.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

impl ReplyProxies {
    /// A proxy on each `listen` address forwarding to its `upstream`.
    pub fn start(pairs: &[(SocketAddr, SocketAddr)]) -> Result<ReplyProxies, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("drift-reply-proxy")
            .enable_all()
            .build()
            .map_err(|e| format!("the reply proxies' runtime: {e}"))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| format!("the reply proxies' client: {e}"))?;
        let mut proxies = Vec::new();
        for &(listen, upstream) in pairs {
            let listener = rt
                .block_on(tokio::net::TcpListener::bind(listen))
                .map_err(|e| format!("reply proxy on {listen}: {e}"))?;
            let p = Arc::new(Proxy {
                upstream,
                dropping: AtomicBool::new(false),
                dropped: AtomicU64::new(0),
                http: http.clone(),
            });
            rt.spawn(serve(listener, p.clone()));
            proxies.push(p);
        }
        Ok(ReplyProxies {
            proxies,
            listen: pairs.iter().map(|(l, _)| *l).collect(),
            rt: Some(rt),
        })
    }

    /// Where proxy `k` (0-based) listens.
    pub fn addr(&self, k: usize) -> SocketAddr {
        self.listen[k]
    }

    /// Turns dropping on or off for proxy `k`; how many answers it dropped.
    pub fn set_dropping(&self, k: usize, on: bool) -> u64 {
        let p = &self.proxies[k];
        p.dropping.store(on, Ordering::SeqCst);
        p.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for ReplyProxies {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_are_told_from_other_queries_in_the_url_or_the_body() {
        assert!(is_insert(Some("query=INSERT%20INTO%20t%20FORMAT%20JSONEachRow"), b"{}"));
        assert!(is_insert(Some("query=%20insert+into+t"), b""));
        assert!(is_insert(None, b"  INSERT INTO t VALUES (1)"));
        assert!(!is_insert(Some("query=SELECT%201"), b""));
        assert!(!is_insert(None, b"SYSTEM SYNC REPLICA t"));
        assert!(!is_insert(Some("insert_quorum=2"), b"SELECT 1"));
    }
}
