//! The convergence checker's part of `report.html`: its findings as a
//! table (kind, key, range, why), the keys whose versions differ between
//! the servers at the end (one column per server), and the repair
//! timeline — one lane per server, a mark per repair session it started
//! (green: found nothing, orange: streamed entries, red: failed) and per
//! GC pass that purged something (grey), so a reader sees when repair ran
//! against when the faults did.
//!
//! It reads only the history and the checker's stored details; it judges
//! nothing.

use crate::picture::esc;
use drift_checkers::pairing::History;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Rows of the differing-versions table at most.
const KEYS_SHOWN_MAX: usize = 50;
const LANE_H: f64 = 16.0;
const LEFT: f64 = 110.0;
const WIDTH: f64 = 1100.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 34.0;

/// The nemesis events this section draws, which the report's node-event
/// table leaves out (a campaign records hundreds of them).
pub const EVENTS: [&str; 4] = ["kv-repair", "kv-gc", "kv-replica", "kv-config"];

fn findings_table(details: &Value) -> String {
    let Some(findings) = details["findings"].as_array().filter(|f| !f.is_empty()) else {
        return "<p>No findings.</p>".to_string();
    };
    let mut rows = String::new();
    for f in findings {
        let _ = write!(
            rows,
            r#"<tr><td>{}</td><td>{}</td><td>{}</td><td class="why">{}</td></tr>"#,
            esc(f["kind"].as_str().unwrap_or("")),
            esc(f["key"].as_str().unwrap_or("–")),
            f["range"].as_u64().map_or("–".to_string(), |r| r.to_string()),
            esc(f["explanation"].as_str().unwrap_or(""))
        );
    }
    format!(r#"<table><tr><th>finding</th><th>key</th><th>range</th><th class="why">why</th></tr>{rows}</table>"#)
}

/// A version as the table shows it.
fn version(e: &Value) -> String {
    match (e[1].as_u64(), &e[2]) {
        (Some(ts), Value::String(v)) => format!("{v:?} @{ts}"),
        (Some(ts), _) => format!("tombstone @{ts}"),
        _ => "?".to_string(),
    }
}

/// Keys whose final versions differ between the servers holding them.
fn differing_table(h: &History) -> String {
    // range -> server -> key -> version
    let mut ranges: BTreeMap<u64, BTreeMap<u64, BTreeMap<String, String>>> = BTreeMap::new();
    for &i in &h.nemesis {
        let op = &h.ops[i];
        if op.f != "kv-replica" {
            continue;
        }
        let Some(server) = op.value["server"].as_u64() else {
            continue;
        };
        for r in op.value["ranges"].as_array().into_iter().flatten() {
            let Some(range) = r["range"].as_u64() else { continue };
            let held = ranges.entry(range).or_default().entry(server).or_default();
            for e in r["entries"].as_array().into_iter().flatten() {
                if let Some(k) = e[0].as_str() {
                    held.insert(k.to_string(), version(e));
                }
            }
        }
    }
    let servers: BTreeSet<u64> = ranges.values().flat_map(|s| s.keys().copied()).collect();
    let mut rows = Vec::new();
    for (range, by_server) in &ranges {
        let keys: BTreeSet<&String> = by_server.values().flat_map(|m| m.keys()).collect();
        for k in keys {
            let versions: Vec<Option<&String>> = by_server.values().map(|m| m.get(k)).collect();
            if versions.iter().all(|v| *v == versions[0]) {
                continue;
            }
            let cells: String = servers
                .iter()
                .map(|s| match by_server.get(s) {
                    None => "<td>(no replica)</td>".to_string(),
                    Some(m) => format!("<td>{}</td>", esc(m.get(k).map_or("—", String::as_str))),
                })
                .collect();
            rows.push(format!("<tr><td>{}</td><td>{range}</td>{cells}</tr>", esc(k)));
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let shown = rows.len().min(KEYS_SHOWN_MAX);
    let head: String = servers.iter().map(|s| format!("<th>server {s}</th>")).collect();
    format!(
        "<p>{} keys differ between their replicas at the end{}:</p><table><tr><th>key</th><th>range</th>{head}</tr>{}</table>",
        rows.len(),
        if shown < rows.len() {
            format!(" (the first {shown} shown)")
        } else {
            String::new()
        },
        rows[..shown].concat()
    )
}

/// The repair timeline (see the module header).
fn timeline(h: &History, at: &dyn Fn(usize) -> i64, t0: i64, t1: i64, x_unit: f64) -> String {
    let mut marks: Vec<(u64, i64, &'static str, String)> = Vec::new();
    for &i in &h.nemesis {
        let op = &h.ops[i];
        let v = &op.value;
        let Some(node) = v["node"].as_u64() else { continue };
        match op.f.as_str() {
            "kv-repair" => {
                let streamed =
                    v["entries_to_peer"].as_u64().unwrap_or(0) + v["entries_from_peer"].as_u64().unwrap_or(0);
                let colour = if !v["error"].is_null() {
                    "#c62828"
                } else if streamed > 0 {
                    "#ef6c00"
                } else {
                    "#2e7d32"
                };
                let tip = format!(
                    "server {node} repaired range {} with {}{}: {streamed} entries, {} rounds{}",
                    v["range"],
                    v["peer"],
                    v["pass"]
                        .as_u64()
                        .map_or(String::new(), |p| format!(" (final pass {p})")),
                    v["rounds"],
                    v["error"].as_str().map_or(String::new(), |e| format!(", failed: {e}"))
                );
                marks.push((node, at(i), colour, tip));
            }
            "kv-gc" => {
                let tip = format!(
                    "server {node}: GC purged {} tombstones older than {} (grace {} ms{})",
                    v["purged"],
                    v["horizon_ts"],
                    v["grace_ms"],
                    if v["forced"] == true { ", forced" } else { "" }
                );
                marks.push((node, at(i), "#9e9e9e", tip));
            }
            _ => {}
        }
    }
    if marks.is_empty() {
        return String::new();
    }
    let nodes: BTreeSet<u64> = marks.iter().map(|m| m.0).collect();
    let lane: BTreeMap<u64, usize> = nodes.iter().enumerate().map(|(k, n)| (*n, k)).collect();
    let span = (t1 - t0).max(1) as f64;
    let x = |t: i64| LEFT + (t - t0) as f64 / span * WIDTH;
    let height = TOP + nodes.len() as f64 * LANE_H + BOTTOM;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height:.0}" font-family="monospace" font-size="11">"#,
        LEFT + WIDTH + 20.0
    );
    for (n, k) in &lane {
        let y = TOP + *k as f64 * LANE_H;
        let _ = write!(
            svg,
            r##"<text x="4" y="{:.1}">server {n}</text><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            y + LANE_H * 0.7,
            y + LANE_H / 2.0,
            LEFT + WIDTH,
            y + LANE_H / 2.0
        );
    }
    for (n, t, colour, tip) in &marks {
        let y = TOP + lane[n] as f64 * LANE_H;
        let _ = write!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="3" height="{:.1}" fill="{colour}"><title>{}</title></rect>"#,
            x(*t) - 1.5,
            y + 2.0,
            LANE_H - 4.0,
            esc(tip)
        );
    }
    let axis_y = TOP + nodes.len() as f64 * LANE_H + 14.0;
    for k in 0..=5 {
        let t = t0 + (span * k as f64 / 5.0) as i64;
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{axis_y:.1}" fill="#555" text-anchor="middle">{:.1}</text>"##,
            x(t),
            (t - t0) as f64 / x_unit
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" fill="#444" text-anchor="middle">{}</text></svg>"##,
        LEFT + WIDTH / 2.0,
        axis_y + 16.0,
        if x_unit == 1.0 {
            "position in the history"
        } else {
            "seconds since the start"
        }
    );
    format!(
        r##"<p class="legend"><span><i class="sw" style="background:#2e7d32"></i>repair found nothing</span><span><i class="sw" style="background:#ef6c00"></i>repair streamed entries</span><span><i class="sw" style="background:#c62828"></i>repair failed</span><span><i class="sw" style="background:#9e9e9e"></i>GC pass purged tombstones</span></p>{svg}"##
    )
}

/// The section, or nothing when the run has no convergence checker.
pub fn section(
    h: &History,
    results: &crate::files::ResultsFile,
    at: &dyn Fn(usize) -> i64,
    t0: i64,
    t1: i64,
    x_unit: f64,
) -> String {
    let Some(c) = results.checkers.iter().find(|c| c.checker == "convergence") else {
        return String::new();
    };
    format!(
        "<h2>Replicas, repair and GC (convergence)</h2>\n{}\n{}\n<h3>Repair sessions and GC passes</h3>\n{}",
        findings_table(&c.details),
        differing_table(h),
        timeline(h, at, t0, t1, x_unit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use drift_checkers::checker::{CheckContext, Checker};
    use serde_json::json;

    /// A put acknowledged at ts 5, servers 1 and 2 disagreeing on it at
    /// the end, a scheduled repair that streamed and a GC pass.
    fn judged() -> (History, crate::files::ResultsFile) {
        let entries =
            |v: &str| json!([{"range": 0, "replicas": [1, 2], "root": v, "count": 1, "entries": [["k", 5, v]]}]);
        let lines = vec![
            (
                0,
                "nemesis",
                "kv-config",
                json!({"rf": 2, "w": 1, "r": 1, "gc": "time"}),
            ),
            (1, "invoke", "put", json!({"value": "v"})),
            (1, "ok", "put", json!({"value": "v", "ts": 5})),
            (
                0,
                "nemesis",
                "kv-repair",
                json!({"node": 1, "peer": 2, "range": 0, "entries_to_peer": 1, "entries_from_peer": 0, "error": null, "rounds": 3}),
            ),
            (
                0,
                "nemesis",
                "kv-gc",
                json!({"node": 2, "purged": 3, "horizon_ts": 4, "grace_ms": 100, "forced": true}),
            ),
            (0, "nemesis", "kv-replica", json!({"server": 1, "ranges": entries("v")})),
            (
                0,
                "nemesis",
                "kv-replica",
                json!({"server": 2, "ranges": entries("<w>")}),
            ),
            (
                0,
                "nemesis",
                "kv-repair",
                json!({"node": 1, "peer": 2, "range": 0, "entries_to_peer": 0, "entries_from_peer": 0, "error": null, "pass": 2}),
            ),
        ];
        let mut h = History::from_script(&lines).unwrap();
        for op in &mut h.ops {
            op.key = matches!(op.f.as_str(), "put").then(|| "k".into());
        }
        let h = History::from_ops(&h.file, h.ops.clone(), h.lines.clone()).unwrap();
        let r = drift_checkers::convergence::Convergence
            .check(&h, &CheckContext::new(None, 1 << 30))
            .unwrap();
        let results = crate::files::ResultsFile {
            verdict: r.verdict,
            history: "h".into(),
            ops: h.ops.len() as u64,
            operations: h.operations.len() as u64,
            keys: 1,
            checked_at: String::new(),
            elapsed_ms: 0.0,
            checkers: vec![r],
            artifacts: vec![],
        };
        (h, results)
    }

    #[test]
    fn findings_differing_keys_and_the_repair_timeline_are_drawn() {
        let (h, results) = judged();
        let page = section(&h, &results, &|i| h.ops[i].time, 0, h.ops.last().unwrap().time, 1e9);
        assert!(page.contains("<td>diverged</td>"), "{page}");
        assert!(page.contains("1 keys differ between their replicas"), "{page}");
        assert!(page.contains("&quot;&lt;w&gt;&quot; @5"), "escaped versions: {page}");
        assert!(page.contains(r##"fill="#ef6c00""##), "the repair that streamed");
        assert!(page.contains(r##"fill="#9e9e9e""##), "the GC pass");
        assert!(page.contains("server 1 repaired range 0 with 2 (final pass 2)"));
    }
}
