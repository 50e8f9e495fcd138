//! The delete workload over the kv service's HTTP interface: what a
//! worker asks for, and how an answer becomes an outcome.
//!
//! Operations on a few keys (`k0`…), through whichever server the worker
//! picks: `put` (a value no other put carries, `w<worker>-<n>`), `delete`,
//! and `get` at the service's R. Shapes (docs/ARCHITECTURE.md, "History"):
//!
//! | f | invoke value | ok value |
//! |---|---|---|
//! | `put` | `{"value": v}` | `{"value": v, "ts": ts}` |
//! | `delete` | `null` | `{"ts": ts}` |
//! | `get` | `null` | `{"value": v or null, "ts": ts or null, "tombstone": bool}` |
//!
//! A write the coordinator could not get W acknowledgements for in time
//! may still have happened on some replica: `info`. A write refused before
//! it reached any replica (a connection refused, a 4xx) did not: `fail`.
//! A read that did not answer changed nothing: `fail`.

use crate::rng::Rng;
use crate::workload::{OpSpec, Outcome};
use serde_json::{json, Value};
use std::time::Duration;

/// Every this-many-th put of a worker goes to a fresh cold key.
const COLD_EVERY: u64 = 4;

/// The next operation of `worker`: puts, deletes and gets (2:1:2). Most
/// go to the hot keys `k0`…, where they overwrite and race each other.
/// Every [`COLD_EVERY`]-th put of a worker writes a fresh cold key of its
/// own, `c<w>-<n>`, and one delete or get in [`COLD_EVERY`] goes to one of
/// those: keys written once, and deleted once, are what only repair
/// brings to a replica that missed them.
pub fn next(rng: &mut Rng, keys: u32, worker: u64, unique: &mut u64) -> OpSpec {
    let hot = |rng: &mut Rng| format!("k{}", rng.below(keys as u64));
    match rng.weighted(&[2, 1, 2]) {
        0 => {
            *unique += 1;
            let key = if (*unique).is_multiple_of(COLD_EVERY) {
                format!("c{worker}-{unique}")
            } else {
                hot(rng)
            };
            OpSpec {
                f: "put",
                value: json!({"value": format!("w{worker}-{unique}")}),
                key: Some(key),
            }
        }
        f => {
            let written = *unique / COLD_EVERY;
            let key = if written > 0 && rng.below(COLD_EVERY) == 0 {
                format!("c{worker}-{}", COLD_EVERY * (1 + rng.below(written)))
            } else {
                hot(rng)
            };
            OpSpec {
                f: if f == 1 { "delete" } else { "get" },
                value: Value::Null,
                key: Some(key),
            }
        }
    }
}

/// Percent-encodes a key for the URL path.
fn path_key(key: &str) -> String {
    key.bytes()
        .map(|c| {
            if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

/// Runs `op` against the server at `base` (`http://addr`).
pub async fn execute(http: &reqwest::Client, base: &str, op: &OpSpec, timeout: Duration) -> Outcome {
    let key = op.key.as_deref().unwrap_or("");
    let url = format!("{base}/kv/{}", path_key(key));
    let req = match op.f {
        "put" => http
            .put(&url)
            .body(op.value["value"].as_str().unwrap_or("").to_string()),
        "delete" => http.delete(&url),
        "get" => http.get(&url),
        other => return Outcome::Fail(format!("the delete workload has no operation {other}")),
    };
    let resp = match req.timeout(timeout).send().await {
        Ok(r) => r,
        Err(e) => return unanswered(op, !e.is_connect(), &e.to_string()),
    };
    let status = resp.status().as_u16();
    let body = resp
        .bytes()
        .await
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("not JSON: {e}")));
    outcome(op, status, body)
}

/// What a server's answer to `op` means: its status and JSON body, or
/// why the body could not be read. Written once for the real client and
/// the simulated one.
pub fn outcome(op: &OpSpec, status: u16, body: Result<Value, String>) -> Outcome {
    let write = op.f != "get";
    let body = match body {
        Ok(v) => v,
        Err(e) if write => return Outcome::Info(format!("{status}: an answer that broke off: {e}")),
        Err(e) => return Outcome::Fail(format!("{status}: an answer that broke off: {e}")),
    };
    let why = || format!("{status}: {}", body["error"].as_str().unwrap_or("no reason given"));
    match (op.f, status) {
        ("put", 200) => Outcome::Ok(json!({"value": op.value["value"], "ts": body["ts"]})),
        // the servers that acknowledged: the others may have missed it
        ("delete", 200) => Outcome::Ok(json!({"ts": body["ts"], "replicas": body["replicas"]})),
        ("get", 200) => Outcome::Ok(json!({"value": body["value"], "ts": body["ts"], "tombstone": body["tombstone"]})),
        (_, 400..=499) => Outcome::Fail(why()),
        ("get", _) => Outcome::Fail(why()),
        _ => Outcome::Info(why()),
    }
}

/// What a request that got no answer means: refused before it reached
/// the server (`connected` false) did not happen; a write that may have
/// reached it is indeterminate; a read changed nothing.
pub fn unanswered(op: &OpSpec, connected: bool, why: &str) -> Outcome {
    if !connected {
        Outcome::Fail(format!("connection refused: {why}"))
    } else if op.f != "get" {
        Outcome::Info(format!("no answer: {why}"))
    } else {
        Outcome::Fail(format!("no answer: {why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_carry_values_no_other_put_carries() {
        let mut rng = Rng::new(7);
        let mut seen = std::collections::BTreeSet::new();
        let (mut unique_a, mut unique_b) = (0, 0);
        let mut kinds = std::collections::BTreeMap::new();
        for i in 0..600 {
            let (w, u) = if i % 2 == 0 {
                (1, &mut unique_a)
            } else {
                (2, &mut unique_b)
            };
            let op = next(&mut rng, 3, w, u);
            *kinds.entry(op.f).or_insert(0) += 1;
            let key = op.key.as_deref().unwrap();
            assert!(
                ["k0", "k1", "k2"].contains(&key) || key.starts_with(&format!("c{w}-")),
                "{key}"
            );
            if op.f == "put" {
                assert!(seen.insert(op.value["value"].as_str().unwrap().to_string()), "{op:?}");
            }
        }
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        assert!(seen.len() > 100, "puts carry fresh values");
    }

    #[test]
    fn keys_are_percent_encoded_for_the_path() {
        assert_eq!(path_key("k1"), "k1");
        assert_eq!(path_key("a b/c"), "a%20b%2Fc");
    }
}
