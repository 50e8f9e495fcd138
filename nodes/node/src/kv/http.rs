//! The kv service's HTTP interface: one port per server for clients,
//! replicas and repair.
//!
//! Clients (any server coordinates):
//! * `PUT /kv/<key>` with the value as the body, `DELETE /kv/<key>`
//!   (`?w=N` overrides W): `200 {"key","ts","acks","replicas","w"}` (the
//!   servers that acknowledged) once W replicas
//!   synced it; `503 {"error","ts","acks","w"}` when fewer did in time —
//!   the write may still have happened (an indeterminate outcome);
//!   `400` for a request that was never applied anywhere.
//! * `GET /kv/<key>` (`?r=N`): `200 {"key","value","ts","tombstone","replies"}`
//!   — `value` null for a key deleted or never written (`ts` null then
//!   too) — or `503 {"error"}`.
//! * `POST /repair[?range=J][&peer=N][&rounds=R]`: repairs now the ranges
//!   this server is the primary of (or J) with their other replicas (or
//!   N), R times over; answers the sessions' reports.
//! * `GET /dump`: every range's Merkle root and entries; `GET /ping`.
//!
//! Replicas (each request signed with the cluster's secret, checked
//! before its body is read: `crate::http_auth`): `POST /internal/merge`
//! (a log record as the body), `GET
//! /internal/get/<key>`, `POST /internal/repair?range=&from=&session=`
//! (a repair session's message).
//!
//! Keys are UTF-8 in the path, percent-encoded where needed; values are
//! UTF-8 bodies. Limits: [`KEY_BYTES_MAX`], [`VALUE_BYTES_MAX`].

use super::{KvNode, Refusal, KEY_BYTES_MAX, VALUE_BYTES_MAX};
use bytes::Bytes;
use drift_repair::replica::Change;
use drift_repair::Entry;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use std::collections::BTreeMap;
use std::sync::Arc;

type Resp = Response<Full<Bytes>>;

/// Largest body of a repair message (one that streams entries).
const REPAIR_BODY_BYTES_MAX: usize = 64 << 20;
/// Largest body of a merge: one log record of a key and its value.
const MERGE_BODY_BYTES_MAX: usize = VALUE_BYTES_MAX + KEY_BYTES_MAX + 256;
/// The memory the bodies of clients' requests may hold together, and
/// the memory the bodies of other servers' requests may (separate, so
/// that neither kind can starve the other).
pub const CLIENT_BODIES_BYTES_MAX: usize = 64 << 20;
pub const PEER_BODIES_BYTES_MAX: usize = 192 << 20;

fn reply(status: u16, content_type: &str, body: impl Into<Bytes>) -> Resp {
    Response::builder()
        .status(status)
        .header("Content-Type", content_type)
        .body(Full::new(body.into()))
        .expect("a valid response")
}

fn json(status: u16, v: serde_json::Value) -> Resp {
    reply(status, "application/json", format!("{v}\n"))
}

/// A request refused: its status and why, answered as `{"error": why}`.
struct Refused(u16, String);

fn error(status: u16, msg: impl Into<String>) -> Refused {
    Refused(status, msg.into())
}

impl Refused {
    fn response(self) -> Resp {
        json(self.0, serde_json::json!({"error": self.1}))
    }
}

impl From<Refusal> for Refused {
    fn from(r: Refusal) -> Refused {
        Refused(r.status, r.why)
    }
}

/// Percent-encodes every byte outside `A-Za-z0-9-._~`.
pub fn percent_encode(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
            s.push(c as char);
        } else {
            s.push_str(&format!("%{c:02X}"));
        }
    }
    s
}

/// Decodes `%XX` escapes; `None` for a bad escape.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A replica's answer to `/internal/get`, as JSON.
fn version_json(v: Option<&Entry>) -> serde_json::Value {
    match v {
        None => serde_json::json!({"found": false}),
        Some(e) => serde_json::json!({
            "found": true, "ts": e.ts, "tombstone": e.value.is_none(),
            "value": e.value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned()),
        }),
    }
}

/// Reads [`version_json`] back as the version of `key`.
pub fn version_from_json(key: &[u8], body: &[u8]) -> Result<Option<Entry>, String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("a reply that is not JSON: {e}"))?;
    if v["found"] == serde_json::Value::Bool(false) {
        return Ok(None);
    }
    let ts = v["ts"].as_u64().ok_or("a version without a ts")?;
    let value = match (&v["tombstone"], &v["value"]) {
        (serde_json::Value::Bool(true), _) => None,
        (_, serde_json::Value::String(s)) => Some(s.as_bytes().to_vec()),
        _ => return Err("a version with neither a value nor a tombstone".into()),
    };
    Ok(Some(Entry {
        key: key.to_vec(),
        ts,
        value,
    }))
}

fn params(query: Option<&str>) -> BTreeMap<String, String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn param<T: std::str::FromStr>(p: &BTreeMap<String, String>, name: &str) -> Result<Option<T>, Refused> {
    match p.get(name) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| error(400, format!("?{name}={v}: not a valid number"))),
    }
}

/// A request's body, within `limit` and `budget` (crate::body): over
/// the limit is 413 (before a byte is read when its length says so), no
/// room in the budget 503, too slow 408.
async fn body(
    req: Request<Incoming>,
    limit: usize,
    budget: &crate::body::Budget,
) -> Result<crate::body::Held, Refused> {
    use crate::body::Refusal;
    crate::body::read(req.into_body(), limit, budget, crate::table::http::BODY_READ_TIMEOUT)
        .await
        .map_err(|r| {
            let status = match r {
                Refusal::TooLarge { .. } => 413,
                Refusal::Busy { .. } => 503,
                Refusal::Timeout(_) => 408,
                Refusal::Read(_) => 400,
            };
            error(status, r.to_string())
        })
}

/// Serves one request.
pub async fn handle(node: Arc<KvNode>, req: Request<Incoming>) -> Result<Resp, std::io::Error> {
    let path = req.uri().path().to_string();
    let p = params(req.uri().query());
    let method = req.method().clone();
    // what one server asks of another is signed: checked before the body
    // is read (see crate::http_auth)
    let peer = if path.starts_with("/internal/") {
        let target = req.uri().path_and_query().map_or(path.as_str(), |t| t.as_str());
        let header = req
            .headers()
            .get(crate::http_auth::HEADER)
            .and_then(|v| v.to_str().ok());
        match node.verifier.check(method.as_str(), target, header) {
            Ok(v) => Some(v),
            Err(why) => return Ok(error(401, why).response()),
        }
    } else {
        None
    };
    let r = match (&method, path.as_str()) {
        (&Method::GET, "/ping") => Ok(reply(200, "text/plain", "Ok.\n")),
        (&Method::GET, "/dump") => Ok(json(200, node.dump())),
        (&Method::POST, "/repair") => repair(&node, &p).await,
        (&Method::POST, "/internal/merge") => internal_merge(&node, peer, req).await,
        (&Method::POST, "/internal/repair") => internal_repair(&node, &p, peer, req).await,
        (&Method::GET, _) if path.starts_with("/internal/get/") => key_of(&path["/internal/get/".len()..])
            .and_then(|key| Ok(json(200, version_json(node.get_local(&key)?.as_ref())))),
        (_, _) if path.starts_with("/kv/") => client(&node, &method, &path["/kv/".len()..], &p, req).await,
        _ => Err(error(404, format!("{method} {path}: no such endpoint"))),
    };
    Ok(r.unwrap_or_else(Refused::response))
}

fn key_of(raw: &str) -> Result<Vec<u8>, Refused> {
    let key = percent_decode(raw).ok_or_else(|| error(400, format!("key {raw:?}: a bad %-escape")))?;
    super::KvServer::check_key(&key)?;
    Ok(key)
}

async fn client(
    node: &Arc<KvNode>,
    method: &Method,
    raw_key: &str,
    p: &BTreeMap<String, String>,
    req: Request<Incoming>,
) -> Result<Resp, Refused> {
    let key = key_of(raw_key)?;
    match *method {
        Method::GET => {
            let r = param::<usize>(p, "r")?;
            let res = node.read(key.clone(), r).await?;
            let (status, v) = drift_repair::server::read_answer(&key, &res);
            Ok(json(status, v))
        }
        Method::PUT | Method::DELETE => {
            let w = param::<usize>(p, "w")?;
            let value = if *method == Method::PUT {
                let b = body(req, VALUE_BYTES_MAX, &node.client_bodies)
                    .await
                    .map_err(|r| match r.0 {
                        413 => error(413, format!("a value has at most {VALUE_BYTES_MAX} bytes: {}", r.1)),
                        _ => r,
                    })?;
                Some(b.bytes.to_vec())
            } else {
                None
            };
            let res = node.write(key.clone(), value, w).await?;
            let (status, v) = drift_repair::server::write_answer(&key, &res);
            Ok(json(status, v))
        }
        _ => Err(error(405, format!("{method} /kv/…: use GET, PUT or DELETE"))),
    }
}

/// The body of a signed request, checked against the digest its sender
/// signed.
async fn signed_body(
    node: &KvNode,
    peer: Option<crate::http_auth::Verified>,
    req: Request<Incoming>,
    limit: usize,
) -> Result<crate::body::Held, Refused> {
    let peer = peer.ok_or_else(|| error(401, "an unsigned request between servers"))?;
    let b = body(req, limit, &node.peer_bodies).await?;
    if !peer.body_matches(&b.bytes) {
        return Err(error(401, "the body is not the one its sender signed"));
    }
    Ok(b)
}

async fn internal_merge(
    node: &Arc<KvNode>,
    peer: Option<crate::http_auth::Verified>,
    req: Request<Incoming>,
) -> Result<Resp, Refused> {
    let b = signed_body(node, peer, req, MERGE_BODY_BYTES_MAX).await?;
    let d = drift_repair::wal::decode(&b.bytes);
    let entry = match (d.torn, d.records.as_slice()) {
        (None, [r]) => match &r.change {
            Change::Applied(e) => e.clone(),
            other => return Err(error(400, format!("a merge carries a version, not {other:?}"))),
        },
        (torn, records) => {
            return Err(error(
                400,
                format!("a merge carries one record, not {} ({torn:?})", records.len()),
            ))
        }
    };
    let me = node.clone();
    match tokio::task::spawn_blocking(move || me.apply_local(entry)).await {
        Ok(Ok(_)) => Ok(reply(200, "text/plain", "ok\n")),
        Ok(Err(r)) => Err(r.into()),
        Err(e) => Err(error(500, e.to_string())),
    }
}

async fn internal_repair(
    node: &Arc<KvNode>,
    p: &BTreeMap<String, String>,
    peer: Option<crate::http_auth::Verified>,
    req: Request<Incoming>,
) -> Result<Resp, Refused> {
    let (Some(j), Some(from), Some(session)) = (
        param::<usize>(p, "range")?,
        param::<u64>(p, "from")?,
        param::<u64>(p, "session")?,
    ) else {
        return Err(error(400, "a repair message needs ?range=&from=&session="));
    };
    // a session is the signing peer's own
    if peer.as_ref().is_some_and(|v| v.from != from) {
        return Err(error(
            403,
            format!("a repair session from server {from} signed by another"),
        ));
    }
    // the body stays counted against the budget until it is answered
    let held = signed_body(node, peer, req, REPAIR_BODY_BYTES_MAX).await?;
    let me = node.clone();
    match tokio::task::spawn_blocking(move || me.on_repair_message(j, from, session, &held.bytes)).await {
        Ok(Ok(bytes)) => Ok(reply(200, "application/octet-stream", bytes)),
        Ok(Err(r)) => Err(r.into()),
        Err(e) => Err(error(500, e.to_string())),
    }
}

async fn repair(node: &Arc<KvNode>, p: &BTreeMap<String, String>) -> Result<Resp, Refused> {
    let range = param::<usize>(p, "range")?;
    let peer = param::<u64>(p, "peer")?.map(|x| vec![x]);
    let rounds = param::<usize>(p, "rounds")?.unwrap_or(1);
    let plan = node.lock().server.repair_plan(range, peer.as_deref(), rounds)?;
    let reports = node.repair_now(plan, false).await;
    Ok(json(200, serde_json::json!({"server": node.id, "sessions": reports})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_percent_coding() {
        for k in ["a", "key 1/2?&%", "ключ", "a+b"] {
            assert_eq!(percent_decode(&percent_encode(k.as_bytes())).unwrap(), k.as_bytes());
        }
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
    }

    #[test]
    fn versions_round_trip_through_json() {
        for v in [None, Some(Entry::put(b"k", 5, b"v")), Some(Entry::tombstone(b"k", 9))] {
            let j = version_json(v.as_ref()).to_string();
            assert_eq!(version_from_json(b"k", j.as_bytes()).unwrap(), v);
        }
        assert!(version_from_json(b"k", b"{\"found\":true}").is_err());
    }
}
