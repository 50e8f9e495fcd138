//! The kv service across server processes, as a client and an operator
//! use it: `drift cluster up`, HTTP reads and writes through any server,
//! servers stopped and SIGKILLed, `drift repair`.
//!
//! Each test owns a 3-server cluster (RF 3, W 2, R 2) on its own address
//! block; faults are forced (a stopped server, a killed one, a hook), and
//! every wait is for a condition, never a fixed sleep.

mod common;

use common::cluster::{wait_for, Cluster};
use common::drift;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One HTTP request: its status and JSON body.
fn http(addr: SocketAddr, method: &str, target: &str, body: &str) -> (u16, serde_json::Value) {
    http_with(addr, method, target, "", body.as_bytes())
}

/// [`http`] with extra header lines (each ending in CRLF) and a raw body.
fn http_with(addr: SocketAddr, method: &str, target: &str, headers: &str, body: &[u8]) -> (u16, serde_json::Value) {
    let (code, raw) = raw_http(addr, method, target, headers, body);
    let body = String::from_utf8(raw).expect("a text answer");
    (
        code,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
    )
}

/// One HTTP/1.0 request; the answer's status and body as bytes (a
/// repair message is not text).
fn raw_http(addr: SocketAddr, method: &str, target: &str, headers: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.0\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, out[split + 4..].to_vec())
}

fn kv(c: &Cluster, i: u64) -> SocketAddr {
    c.config().peer(i).unwrap().kv.expect("a kv address")
}

/// A request between servers to server `i`, signed as server `from`
/// would sign it, with `secret`.
fn signed(
    c: &Cluster,
    i: u64,
    from: u64,
    secret: &[u8],
    method: &str,
    target: &str,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let h = drift_node::http_auth::Signer::new(secret.to_vec(), from).header(method, target, body);
    http_with(
        kv(c, i),
        method,
        target,
        &format!("{}: {h}\r\n", drift_node::http_auth::HEADER),
        body,
    )
}

/// What server `i` itself holds of `key`, asked as a peer would.
fn internal_get(c: &Cluster, i: u64, key: &str) -> (u16, serde_json::Value) {
    let from = i % 3 + 1;
    signed(
        c,
        i,
        from,
        &c.config().secret_bytes(),
        "GET",
        &format!("/internal/get/{key}"),
        b"",
    )
}

fn put(c: &Cluster, via: u64, key: &str, value: &str) -> u64 {
    let (code, v) = http(kv(c, via), "PUT", &format!("/kv/{key}"), value);
    assert_eq!(code, 200, "{v}");
    v["ts"].as_u64().unwrap()
}

fn get(c: &Cluster, via: u64, key: &str, r: u64) -> serde_json::Value {
    let (code, v) = http(kv(c, via), "GET", &format!("/kv/{key}?r={r}"), "");
    assert_eq!(code, 200, "{v}");
    v
}

/// Every range's (range, root, entry count) on server i.
fn roots(c: &Cluster, i: u64) -> Vec<(u64, String, u64)> {
    let (code, d) = http(kv(c, i), "GET", "/dump", "");
    assert_eq!(code, 200);
    d["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["range"].as_u64().unwrap(),
                r["root"].as_str().unwrap().to_string(),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Whether every replica of every range has one root.
fn converged(c: &Cluster) -> bool {
    let all: Vec<_> = (1..=3).flat_map(|i| roots(c, i)).collect();
    (0..3).all(|j| {
        let of: Vec<_> = all.iter().filter(|r| r.0 == j).map(|r| &r.1).collect();
        of.len() == 3 && of.iter().all(|r| *r == of[0])
    })
}

/// `drift repair --json` on the cluster: every session's report.
fn repair(c: &Cluster, rounds: u32) -> Vec<serde_json::Value> {
    let out = drift()
        .args(["repair", "--json", "--rounds", &rounds.to_string(), "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn streamed(reports: &[serde_json::Value]) -> u64 {
    reports
        .iter()
        .map(|s| s["entries_to_peer"].as_u64().unwrap() + s["entries_from_peer"].as_u64().unwrap())
        .sum()
}

const NO_SCHEDULE: &[&str] = &["--no-table", "--kv-setting", "repair_interval_ms = 0"];

#[test]
fn any_server_coordinates_and_a_read_returns_the_newest_write_or_delete() {
    let c = Cluster::up_raw("kv-basic", 24181, NO_SCHEDULE);
    let t1 = put(&c, 1, "a", "one");
    let t2 = put(&c, 2, "a", "two");
    assert!(t2 > t1, "one cluster's clocks move forward: {t1} then {t2}");
    let v = get(&c, 3, "a", 3);
    assert_eq!((v["value"].as_str(), v["ts"].as_u64()), (Some("two"), Some(t2)), "{v}");
    let (code, d) = http(kv(&c, 3), "DELETE", "/kv/a", "");
    assert_eq!(code, 200, "{d}");
    let v = get(&c, 1, "a", 2);
    assert_eq!(v["tombstone"], true, "{v}");
    assert!(v["value"].is_null() && v["ts"].as_u64() == d["ts"].as_u64(), "{v}");
    let v = get(&c, 2, "never-written", 2);
    assert!(
        v["value"].is_null() && v["ts"].is_null() && v["tombstone"] == false,
        "{v}"
    );
    // keys are percent-decoded; values are bodies as they are
    put(&c, 1, "key%20with%2Fslash", "x y");
    assert_eq!(get(&c, 2, "key%20with%2Fslash", 2)["key"], "key with/slash");
    // bad requests are refused, naming what is wrong
    for (method, target, body, what) in [
        ("PUT", "/kv/a?w=4", "v", "w=4"),
        ("GET", "/kv/a?r=0", "", "r=0"),
        ("GET", "/kv/%zz", "", "escape"),
        ("PUT", "/kv/", "v", "1..="),
        ("POST", "/kv/a", "v", "GET, PUT or DELETE"),
    ] {
        let (code, v) = http(kv(&c, 1), method, target, body);
        assert!((400..500).contains(&code), "{method} {target}: {code} {v}");
        assert!(v["error"].as_str().unwrap().contains(what), "{method} {target}: {v}");
    }
}

#[test]
fn an_acknowledged_write_survives_sigkill_of_every_replica() {
    let c = Cluster::up_raw("kv-durable", 24281, NO_SCHEDULE);
    let written: Vec<(String, u64)> = (0..30)
        .map(|i| {
            let k = format!("k{i}");
            let ts = put(&c, 1 + i % 3, &k, &format!("v{i}"));
            (k, ts)
        })
        .collect();
    for i in 1..=3 {
        c.kill(i);
    }
    for i in 1..=3 {
        c.start(i);
    }
    wait_for(Duration::from_secs(20), || {
        (1..=3)
            .all(|i| TcpStream::connect_timeout(&kv(&c, i), Duration::from_millis(200)).is_ok())
            .then_some(())
    })
    .expect("the servers serve again");
    for (i, (k, ts)) in written.iter().enumerate() {
        // W = 2 of 3 synced it: any two replicas answer at least one copy
        let v = get(&c, 1 + (i as u64 + 1) % 3, k, 2);
        assert_eq!(v["ts"].as_u64(), Some(*ts), "{k}: {v}");
        assert_eq!(v["value"], format!("v{i}"));
    }
}

#[test]
fn a_replica_that_missed_writes_converges_after_drift_repair_and_a_second_repair_streams_nothing() {
    let c = Cluster::up_raw("kv-repair", 24381, NO_SCHEDULE);
    for i in 0..10 {
        put(&c, 1, &format!("before{i}"), "v");
    }
    c.stop(2);
    let mut missed = Vec::new();
    for i in 0..25 {
        let k = format!("missed{i}");
        put(&c, 1 + 2 * (i % 2), &k, "v");
        missed.push(k);
    }
    http(kv(&c, 3), "DELETE", "/kv/before3", "");
    c.start(2);
    wait_for(Duration::from_secs(20), || {
        TcpStream::connect_timeout(&kv(&c, 2), Duration::from_millis(200)).ok()
    })
    .expect("server 2 serves again");
    assert!(!converged(&c), "server 2 missed 26 writes");
    let first = repair(&c, 2);
    assert_eq!(first.len(), 12, "3 ranges x 2 peers x 2 rounds: {first:?}");
    assert!(first.iter().all(|s| s["error"].is_null()), "{first:?}");
    assert!(streamed(&first) >= 26, "{}", streamed(&first));
    assert!(converged(&c), "{:?}", (1..=3).map(|i| roots(&c, i)).collect::<Vec<_>>());
    // server 2 alone answers what it missed
    for k in &missed {
        let (code, v) = internal_get(&c, 2, k);
        assert_eq!((code, &v["found"]), (200, &serde_json::Value::Bool(true)), "{k}: {v}");
    }
    let second = repair(&c, 1);
    assert_eq!(streamed(&second), 0, "{second:?}");
    assert!(second.iter().all(|s| s["ranges_differing"] == 0), "{second:?}");
}

#[test]
fn with_the_overwrite_defect_a_repair_loses_the_newer_write() {
    let c = Cluster::up_raw(
        "kv-defect",
        24481,
        &["--no-table", "--fault-hooks", "--kv-setting", "repair_interval_ms = 0"],
    );
    // a key whose range server 1 is the primary of, written while server
    // 2 holds only its older version
    let key = (0..)
        .map(|i| format!("d{i}"))
        .find(|k| {
            let ring = drift_repair::ring::Ring::new(vec![1, 2, 3], 3).unwrap();
            ring.range_of_key(k.as_bytes()) == 0
        })
        .unwrap();
    put(&c, 1, &key, "old");
    c.stop(2);
    let newer = put(&c, 1, &key, "new");
    c.start(2);
    wait_for(Duration::from_secs(20), || {
        TcpStream::connect_timeout(&kv(&c, 2), Duration::from_millis(200)).ok()
    })
    .expect("server 2 serves again");
    assert_eq!(c.admin(1, "kv defect-overwrite on").trim(), "ok");
    // one session, server 1 with server 2
    let (code, r) = http(kv(&c, 1), "POST", "/repair?range=0&peer=2", "");
    assert_eq!(code, 200, "{r}");
    assert!(r["sessions"][0]["error"].is_null(), "{r}");
    let (_, v) = internal_get(&c, 1, &key);
    assert_eq!(
        v["value"], "old",
        "server 1 took server 2's older version over its own {newer}: {v}"
    );
    assert_eq!(c.admin(1, "kv defect-overwrite off").trim(), "ok");
    // a bad hook says what the hooks are
    assert!(c.admin(1, "kv bogus").contains("defect-overwrite"));
}

#[test]
fn t5_a_replica_down_longer_than_the_grace_is_rebuilt_not_repaired() {
    // a delete server 2 missed, its tombstone then purged on the others:
    // repairing server 2's old copy would bring the value back
    let run = |absent_long: bool| {
        let tag = if absent_long { "kv-t5-long" } else { "kv-t5-short" };
        let port = if absent_long { 24581 } else { 24681 };
        let c = Cluster::up_raw(
            tag,
            port,
            &[
                "--no-table",
                "--fault-hooks",
                "--kv-setting",
                "repair_interval_ms = 0",
                "--kv-setting",
                "gc_grace_ms = 60000",
            ],
        );
        put(&c, 1, "k", "v");
        c.stop(2);
        let (code, _) = http(kv(&c, 1), "DELETE", "/kv/k", "");
        assert_eq!(code, 200);
        for i in [1, 3] {
            assert!(
                c.admin(i, "kv gc 0").starts_with("ok purged 1"),
                "server {i} purges the tombstone"
            );
        }
        let log = c.config().node_dir(2).join("kv").join("log");
        if absent_long {
            // server 2 was last up two minutes ago: past the 60 s grace
            let then = std::time::SystemTime::now() - Duration::from_secs(120);
            std::fs::File::options()
                .append(true)
                .open(&log)
                .unwrap()
                .set_modified(then)
                .unwrap();
        }
        c.start(2);
        wait_for(Duration::from_secs(20), || {
            TcpStream::connect_timeout(&kv(&c, 2), Duration::from_millis(200)).ok()
        })
        .expect("server 2 serves again");
        repair(&c, 2);
        let held: Vec<bool> = (1..=3).map(|i| internal_get(&c, i, "k").1["found"] == true).collect();
        (held, c.log(2).contains("\"kv_rebuild\""))
    };
    let (held, rebuilt) = run(true);
    assert!(rebuilt, "server 2 set its stale data aside");
    assert_eq!(held, vec![false; 3], "the key stays deleted everywhere");
    // back within the grace, it keeps its data and repair resurrects the
    // key: the cost time-based GC documents, which the rebuild avoids
    let (held, rebuilt) = run(false);
    assert!(!rebuilt);
    assert_eq!(held, vec![true; 3], "resurrected");
}

/// A merge forged by a process without the cluster's secret (or replayed,
/// or with another body than the one signed) is refused before its body
/// is read and changes nothing; the version a forged merge carried, with
/// the largest timestamp there is, would otherwise win for ever.
#[test]
fn forged_or_replayed_internal_requests_are_refused_and_change_nothing() {
    let c = Cluster::up_raw(
        "kv-forged",
        24581,
        &["--no-table", "--kv-setting", "repair_interval_ms = 0"],
    );
    put(&c, 1, "f", "mine");
    let mut record = Vec::new();
    let range = drift_repair::ring::Ring::new(vec![1, 2, 3], 3)
        .unwrap()
        .range_of_key(b"f") as u32;
    drift_repair::wal::encode(
        &drift_repair::wal::Record {
            range,
            change: drift_repair::replica::Change::Applied(drift_repair::Entry {
                key: b"f".to_vec(),
                ts: u64::MAX,
                value: Some(b"forged".to_vec()),
            }),
        },
        &mut record,
    );
    // no header at all
    let (code, v) = http_with(kv(&c, 2), "POST", "/internal/merge", "", &record);
    assert_eq!(code, 401, "{v}");
    // signed with another secret
    let (code, v) = signed(&c, 2, 1, &[9u8; 32], "POST", "/internal/merge", &record);
    assert_eq!(code, 401, "{v}");
    // a peer's signature over another body
    let secret = c.config().secret_bytes();
    let h = drift_node::http_auth::Signer::new(secret.clone(), 1).header("POST", "/internal/merge", b"something else");
    let (code, v) = http_with(
        kv(&c, 2),
        "POST",
        "/internal/merge",
        &format!("{}: {h}\r\n", drift_node::http_auth::HEADER),
        &record,
    );
    assert_eq!(code, 401, "{v}");
    // a repair session in another server's name
    let (code, v) = signed(
        &c,
        2,
        1,
        &secret,
        "POST",
        &format!("/internal/repair?range={range}&from=3&session=1"),
        b"",
    );
    assert_eq!(code, 403, "{v}");
    // a peer's merge is held to a client's limits, and to this server's
    // clock: the version stamped 2^64-1, a value over 64 KiB
    let merge = |value: Vec<u8>, ts: u64| {
        let mut record = Vec::new();
        drift_repair::wal::encode(
            &drift_repair::wal::Record {
                range,
                change: drift_repair::replica::Change::Applied(drift_repair::Entry {
                    key: b"f".to_vec(),
                    ts,
                    value: Some(value),
                }),
            },
            &mut record,
        );
        signed(&c, 2, 1, &secret, "POST", "/internal/merge", &record)
    };
    let (code, v) = merge(b"forged".to_vec(), u64::MAX);
    assert_eq!(code, 400, "{v}");
    assert!(v.to_string().contains("ahead of this server's clock"), "{v}");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let (code, v) = merge(vec![b'x'; 100 << 10], now_us);
    assert_eq!(code, 413, "{v}");
    // nothing changed, on any replica
    let v = get(&c, 3, "f", 3);
    assert_eq!(v["value"], "mine", "{v}");
    for i in 1..=3 {
        assert_eq!(internal_get(&c, i, "f").1["value"], "mine");
    }
    // with the secret, a repair hello proposing a GC horizon past this
    // server's clock is refused, and purges nothing
    let (code, v) = http(kv(&c, 1), "DELETE", "/kv/t?w=3", "");
    assert_eq!(code, 200, "{v}");
    let t_range = drift_repair::ring::Ring::new(vec![1, 2, 3], 3)
        .unwrap()
        .range_of_key(b"t");
    let (lo, hi) = {
        let r = drift_repair::ring::Ring::new(vec![1, 2, 3], 3).unwrap();
        let r = r.range(t_range);
        (r.lo, r.hi)
    };
    let hello_in = |from: u64, session: u64, gc_before: u64| {
        let msg = drift_repair::wire::Msg::Hello {
            seed: 1,
            lo,
            hi,
            depth: 4,
            gc_before,
            row_level: true,
            hash_bytes: 6,
        }
        .encode()
        .bytes;
        let target = format!("/internal/repair?range={t_range}&from={from}&session={session}");
        let h = drift_node::http_auth::Signer::new(secret.clone(), from).header("POST", &target, &msg);
        raw_http(
            kv(&c, 2),
            "POST",
            &target,
            &format!("{}: {h}\r\n", drift_node::http_auth::HEADER),
            &msg,
        )
    };
    let (code, reply) = hello_in(1, 7, u64::MAX);
    assert_eq!(code, 200);
    match drift_repair::wire::Msg::decode(&reply) {
        Ok(drift_repair::wire::Msg::Error { reason }) => assert!(reason.contains("GC horizon"), "{reason}"),
        other => panic!("a future horizon was taken: {other:?}"),
    }
    let (_, v) = internal_get(&c, 2, "t");
    assert_eq!(v["tombstone"], true, "the tombstone was purged: {v}");
    // 64 sessions opened by one peer do not keep another's out: server 3
    // repairs with server 2 while server 1 holds them
    for session in 100..164 {
        let (code, reply) = hello_in(1, session, 0);
        assert_eq!(code, 200);
        assert!(
            !matches!(
                drift_repair::wire::Msg::decode(&reply),
                Ok(drift_repair::wire::Msg::Error { .. })
            ),
            "session {session} refused"
        );
    }
    let (code, r) = http(kv(&c, 3), "POST", &format!("/repair?range={t_range}&peer=2"), "");
    assert_eq!(code, 200, "{r}");
    assert!(r["sessions"][0]["error"].is_null(), "{r}");
    // a real peer's request is taken once, and refused when replayed
    let h = drift_node::http_auth::Signer::new(secret, 1).header("GET", "/internal/get/f", b"");
    let hdr = format!("{}: {h}\r\n", drift_node::http_auth::HEADER);
    assert_eq!(http_with(kv(&c, 2), "GET", "/internal/get/f", &hdr, b"").0, 200);
    let (code, v) = http_with(kv(&c, 2), "GET", "/internal/get/f", &hdr, b"");
    assert_eq!(code, 401, "{v}");
    assert!(v.to_string().contains("replay"), "{v}");
}
