//! `drift repair`: runs kv repair sessions on a running cluster now, and
//! prints what each cost and streamed.
//!
//! Each server asked repairs the ranges it is the primary of (or the one
//! `--range` names, if it holds it) with every other replica, through its
//! `POST /repair` endpoint; the server runs the sessions and answers their
//! reports.

use crate::cli::RepairArgs;
use crate::fail::Failure;
use drift_node::config::ClusterConfig;
use std::time::Duration;

/// How long one server's sessions may take in all.
const REPAIR_TIMEOUT: Duration = Duration::from_secs(300);

pub fn run(args: RepairArgs) -> Result<i32, Failure> {
    let config = ClusterConfig::load(&args.dir.join("cluster.toml"))?;
    let Some(kv) = &config.kv else {
        return Err(Failure::new(format!(
            "{}: the cluster declares no kv service",
            args.dir.join("cluster.toml").display()
        )));
    };
    let servers: Vec<(u64, std::net::SocketAddr)> = config
        .peers
        .iter()
        .filter_map(|p| Some((p.id, p.kv?)))
        .filter(|(id, _)| args.nodes.is_empty() || args.nodes.contains(id))
        .collect();
    if let Some(n) = args.nodes.iter().find(|n| !servers.iter().any(|(id, _)| id == *n)) {
        return Err(Failure::new(format!("--nodes {n}: no kv server {n} in the cluster")));
    }
    let ring = drift_repair::ring::Ring::new(
        config.peers.iter().filter(|p| p.kv.is_some()).map(|p| p.id).collect(),
        kv.rf,
    )
    .map_err(|e| Failure::new(format!("{}: {e}", args.dir.join("cluster.toml").display())))?;
    if let Some(j) = args.range.filter(|&j| j >= ring.ranges()) {
        return Err(Failure::new(format!(
            "--range {j}: the ring has ranges 0..{}",
            ring.ranges()
        )));
    }
    let mut failed = 0;
    let mut all = Vec::new();
    for (id, addr) in servers {
        let mut target = format!("/repair?rounds={}", args.rounds);
        if let Some(j) = args.range {
            // the range's primary starts its sessions, or each listed
            // server that holds it
            let holders = ring.replicas(j);
            let asked = if args.nodes.is_empty() {
                holders[0] == id
            } else {
                holders.contains(&id)
            };
            if !asked {
                continue;
            }
            target.push_str(&format!("&range={j}"));
        }
        let (code, body) = crate::servers::http_request(addr, "POST", &target, b"", REPAIR_TIMEOUT)
            .ok_or_else(|| Failure::new(format!("server {id} ({addr}): no answer to POST {target}")))?;
        let v: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| Failure::new(format!("server {id}: an answer that is not JSON ({code}): {e}")))?;
        if code != 200 {
            return Err(Failure::new(format!("server {id}: {code}: {}", v["error"])));
        }
        for s in v["sessions"].as_array().into_iter().flatten() {
            if !s["error"].is_null() {
                failed += 1;
            }
            if !args.json {
                out!("{}", line(id, s));
            }
            all.push(s.clone());
        }
    }
    if args.json {
        out!("{}", serde_json::Value::Array(all));
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// One session as a line: who, which range, what it cost and streamed.
fn line(id: u64, s: &serde_json::Value) -> String {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let head = format!("server {id} range {} with {}:", n("range"), n("peer"));
    if let Some(e) = s["error"].as_str() {
        return format!("{head} FAILED {e}");
    }
    format!(
        "{head} {}, {} rounds, {} B to / {} B from the peer ({} B reconciliation), entries {} to / {} from, {} differing ranges, {:.1} ms",
        s["path"].as_str().unwrap_or("?"),
        n("rounds"),
        n("bytes_to_peer"),
        n("bytes_from_peer"),
        n("reconciliation_bytes"),
        n("entries_to_peer"),
        n("entries_from_peer"),
        n("ranges_differing"),
        s["duration_ms"].as_f64().unwrap_or(0.0)
    )
}
