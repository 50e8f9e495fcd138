//! `convergence`: leaderless last-write-wins replicas after heal and
//! repair, judged from the history of a delete workload
//! (docs/ARCHITECTURE.md, "History": the `put`, `delete`, `get`,
//! `kv-config`, `kv-repair`, `kv-gc` and `kv-replica` shapes).
//!
//! LWW order: the larger timestamp wins; at equal timestamps a tombstone
//! beats a value, and between two values the larger (bytewise) wins.
//! Timestamps are the system's (the coordinator's clock), so the checker
//! compares timestamps, never real time.
//!
//! Rules (findings and tests cite them by number):
//!
//! 1. **diverged** — after the final repair, the replicas of a range hold
//!    different versions, or different Merkle roots.
//! 2. A key's final version must be the LWW maximum of the writes that
//!    may have happened (every `ok` write, any subset of the `info` ones):
//!    **phantom** when no write could have produced it (a value no put
//!    carried, an `ok` write's value with another timestamp, a tombstone
//!    with no delete behind it); **lost-update** when it is older than an
//!    `ok` write. Two `ok` writes where the one that finished first in
//!    real time carries the larger timestamp are **skew-lost-update**: LWW
//!    keeps the earlier one by design (clock skew), reported, valid.
//! 3. A key whose newest `ok` write is a delete must not hold an older
//!    value at the end: **resurrected**, or **resurrected-expected** when
//!    a time-based GC pass could have purged the tombstone (its horizon
//!    passed the delete's timestamp) before repair covered the delete —
//!    the documented cost of time-based GC with a grace shorter than
//!    repair takes. One completed session over the key's range after the
//!    delete, between a replica that missed it (did not acknowledge it)
//!    and one that acknowledged it, covers that replica; every replica
//!    that missed it must be covered. (A history whose deletes do not name
//!    the servers that acknowledged them needs two full rounds of repair
//!    of the range instead.) A session's times are on its initiator's
//!    clock, the delete's on its coordinator's, the pass's on its own
//!    server's: a session covers only when it started after the delete
//!    and ended before the pass by more than the clock skew the
//!    `kv-config` event states (`clock_skew_ms`), so a finding never
//!    rests on an order the clocks cannot tell. A pass that purged nothing
//!    logs nothing, yet its horizon travels with repair sessions, which
//!    purge by it: under GC by time, a replica's final GC horizon past the
//!    tombstone counts as a purge as early as the grace after the delete.
//! 4. **repair-not-idempotent** — a session of the second final repair
//!    found a range differing, streamed entries, or failed (also when
//!    rule 1 finds the replicas diverged).
//! 5. **stale-read** (only with R + W > RF and no `wipe` fault): a read
//!    invoked after an `ok` write completed returns that version or a
//!    newer one; reads of keys with an indeterminate write in between, or
//!    an expected resurrection, are not judged, and an older value read
//!    after a delete once a time-based GC pass could purge its tombstone
//!    is **resurrected-expected**, not stale.
//! 6. Valid iff none of diverged, phantom, lost-update, resurrected,
//!    repair-not-idempotent, stale-read; skew-lost-update and
//!    resurrected-expected are reported and stay valid. Unknown when the
//!    final reads or the second repair are missing.
//!
//! What it does not verify: reads at R + W ≤ RF (any version may come
//! back), what a replica held before the final repair, or a GC pass's
//! own arithmetic (it trusts the horizon the server logged).

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use serde_json::{json, Value};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

pub const CONFIG_F: &str = "kv-config";
pub const REPAIR_F: &str = "kv-repair";
pub const GC_F: &str = "kv-gc";
pub const REPLICA_F: &str = "kv-replica";
/// Findings listed per kind (the counts are exact).
const FINDINGS_LISTED_MAX: usize = 20;
/// Full rounds of repair after a delete that bring its tombstone to
/// every replica of its range whatever the order of the sessions: the
/// first brings every replica's newest to the primary, the second from
/// it to the others.
const COVERING_ROUNDS: usize = 2;

pub struct Convergence;

/// A version: ts, and the value (`None`: a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    ts: u64,
    value: Option<String>,
}

impl Version {
    fn lww_cmp(&self, o: &Version) -> Ordering {
        self.ts.cmp(&o.ts).then_with(|| match (&self.value, &o.value) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(a), Some(b)) => a.as_bytes().cmp(b.as_bytes()),
        })
    }

    /// The version for a finding: its time as seconds since `base` (the
    /// run's start on the stamping server's clock), its raw timestamp
    /// beside, to find it in the servers' logs.
    fn describe(&self, base: u64) -> String {
        let at = since(self.ts, base);
        match &self.value {
            Some(v) => format!("{v:?} stamped at {at} (ts {})", self.ts),
            None => format!("a tombstone stamped at {at} (ts {})", self.ts),
        }
    }
}

#[derive(Debug, Clone)]
struct Write {
    /// Position of the invoke.
    at: usize,
    invoke: i64,
    /// Completion time (`i64::MAX` when indeterminate).
    complete: i64,
    outcome: Outcome,
    /// The value written (`None`: a delete).
    value: Option<String>,
    /// The system's timestamp, known for `ok` writes.
    ts: Option<u64>,
    /// The servers that acknowledged an `ok` write, where the history
    /// says (the others may have missed it).
    acked: Option<Vec<u64>>,
}

impl Write {
    fn version(&self) -> Option<Version> {
        Some(Version {
            ts: self.ts?,
            value: self.value.clone(),
        })
    }
}

#[derive(Debug, Clone)]
struct Read {
    at: usize,
    invoke: i64,
    complete: i64,
    got: Option<Version>,
}

/// A server timestamp (µs since the Unix epoch) as seconds since `base`.
fn since(ts: u64, base: u64) -> String {
    let d = ts as i128 - base as i128;
    format!("{}{:.3} s", if d < 0 { "-" } else { "" }, d.unsigned_abs() as f64 / 1e6)
}

#[derive(Debug, Default)]
struct Params {
    rf: u64,
    w: u64,
    r: u64,
    /// The run's start on the controller's clock, µs since the epoch (the
    /// `kv-config` event's `start_ts_us`), when the history says.
    start_ts_us: Option<u64>,
    /// How far apart two servers' clocks may be (µs; the `kv-config`
    /// event's `clock_skew_ms`, 0 when it does not say): rule 3 compares
    /// a session's times on its initiator's clock with a GC pass's on
    /// another server's.
    skew_us: u64,
    /// GC by time (`gc = "time"`), and its grace (µs).
    gc_time: bool,
    grace_us: u64,
}

#[derive(Debug, Clone)]
struct Session {
    range: u64,
    pair: (u64, u64),
    started_ts: u64,
    finished_ts: u64,
    ok: bool,
    streamed: u64,
    /// Ranges the session found differing.
    differing: u64,
    pass: Option<u64>,
}

#[derive(Debug, Clone)]
struct Gc {
    /// When the harness recorded it (history time).
    at_ns: i64,
    horizon_ts: u64,
    /// The pass's own clock: horizon + grace.
    at_ts: u64,
    time_based: bool,
}

/// One replica's final content of one range.
#[derive(Debug, Clone)]
struct RangeRead {
    server: u64,
    replicas: Vec<u64>,
    root: String,
    entries: BTreeMap<String, Version>,
    /// The replica's GC horizon at the end (0 when the read does not say).
    gc_horizon: u64,
}

struct Model {
    params: Params,
    writes: BTreeMap<String, Vec<Write>>,
    reads: BTreeMap<String, Vec<Read>>,
    sessions: Vec<Session>,
    gcs: Vec<Gc>,
    /// Final reads by range.
    finals: BTreeMap<u64, Vec<RangeRead>>,
    wiped: bool,
}

fn bad(h: &History, pos: usize, why: impl Into<String>) -> HistoryError {
    HistoryError {
        at: h.location(pos),
        reason: why.into(),
    }
}

fn version_of(h: &History, pos: usize, v: &Value) -> Result<Option<Version>, HistoryError> {
    match (&v["ts"], &v["value"], &v["tombstone"]) {
        (Value::Null, Value::Null, _) => Ok(None),
        (ts, value, tomb) => {
            let ts = ts
                .as_u64()
                .ok_or_else(|| bad(h, pos, "a version without an integer `ts`"))?;
            let value = match (value, tomb) {
                (_, Value::Bool(true)) | (Value::Null, _) => None,
                (Value::String(s), _) => Some(s.clone()),
                _ => return Err(bad(h, pos, "a version's `value` must be a string or null")),
            };
            Ok(Some(Version { ts, value }))
        }
    }
}

fn read_model(h: &History) -> Result<Model, HistoryError> {
    let mut m = Model {
        params: Params::default(),
        writes: BTreeMap::new(),
        reads: BTreeMap::new(),
        sessions: Vec::new(),
        gcs: Vec::new(),
        finals: BTreeMap::new(),
        wiped: false,
    };
    let mut configured = false;
    for &i in &h.nemesis {
        let op = &h.ops[i];
        let v = &op.value;
        match op.f.as_str() {
            CONFIG_F => {
                configured = true;
                m.params = Params {
                    rf: v["rf"].as_u64().unwrap_or(3),
                    w: v["w"].as_u64().unwrap_or(2),
                    r: v["r"].as_u64().unwrap_or(2),
                    start_ts_us: v["start_ts_us"].as_u64(),
                    skew_us: v["clock_skew_ms"].as_u64().unwrap_or(0).saturating_mul(1000),
                    gc_time: v["gc"].as_str() != Some("repair"),
                    grace_us: v["gc_grace_ms"].as_u64().unwrap_or(0).saturating_mul(1000),
                };
            }
            REPAIR_F => {
                let n = |k: &str| v[k].as_u64();
                let (Some(node), Some(peer), Some(range)) = (n("node"), n("peer"), n("range")) else {
                    return Err(bad(h, i, "a kv-repair without node, peer and range"));
                };
                m.sessions.push(Session {
                    range,
                    pair: (node.min(peer), node.max(peer)),
                    started_ts: n("started_ts").unwrap_or(0),
                    finished_ts: n("finished_ts").unwrap_or(u64::MAX),
                    ok: v["error"].is_null(),
                    streamed: n("entries_to_peer").unwrap_or(0) + n("entries_from_peer").unwrap_or(0),
                    differing: n("ranges_differing").unwrap_or(0),
                    pass: n("pass"),
                });
            }
            GC_F => {
                let horizon_ts = v["horizon_ts"]
                    .as_u64()
                    .ok_or_else(|| bad(h, i, "a kv-gc without horizon_ts"))?;
                let grace = v["grace_ms"].as_u64().unwrap_or(0).saturating_mul(1000);
                m.gcs.push(Gc {
                    at_ns: op.time,
                    horizon_ts,
                    at_ts: horizon_ts.saturating_add(grace),
                    time_based: v["mode"].as_str() != Some("repair") || v["forced"] == Value::Bool(true),
                });
            }
            REPLICA_F => {
                let server = v["server"]
                    .as_u64()
                    .ok_or_else(|| bad(h, i, "a kv-replica without server"))?;
                for r in v["ranges"].as_array().into_iter().flatten() {
                    let range = r["range"]
                        .as_u64()
                        .ok_or_else(|| bad(h, i, "a range without its number"))?;
                    let mut entries = BTreeMap::new();
                    for e in r["entries"].as_array().into_iter().flatten() {
                        let (Some(k), Some(ts)) = (e[0].as_str(), e[1].as_u64()) else {
                            return Err(bad(h, i, "an entry must be [key, ts, value or null]"));
                        };
                        entries.insert(
                            k.to_string(),
                            Version {
                                ts,
                                value: e[2].as_str().map(str::to_string),
                            },
                        );
                    }
                    m.finals.entry(range).or_default().push(RangeRead {
                        server,
                        replicas: r["replicas"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_u64)
                            .collect(),
                        root: r["root"].as_str().unwrap_or("").to_string(),
                        entries,
                        gc_horizon: r["gc_horizon"].as_u64().unwrap_or(0),
                    });
                }
            }
            f if f == "start-wipe" || f == "start-corrupt" => m.wiped = true,
            _ => {}
        }
    }
    if !configured {
        m.params = Params {
            rf: 3,
            w: 2,
            r: 2,
            start_ts_us: None,
            skew_us: 0,
            gc_time: false,
            grace_us: 0,
        };
    }
    for o in &h.operations {
        let inv = h.invoke_op(o);
        let Some(key) = inv.key.as_deref().map(str::to_string) else {
            continue;
        };
        let done = h.complete_op(o);
        let complete = if o.outcome == Outcome::Ok {
            done.map_or(i64::MAX, |d| d.time)
        } else {
            i64::MAX
        };
        match inv.f.as_str() {
            "put" | "delete" => {
                if o.outcome == Outcome::Fail {
                    continue;
                }
                let value = if inv.f == "put" {
                    Some(
                        inv.value["value"]
                            .as_str()
                            .or(inv.value.as_str())
                            .ok_or_else(|| bad(h, o.invoke, "a put's value must be a string"))?
                            .to_string(),
                    )
                } else {
                    None
                };
                let ts = match (o.outcome, done) {
                    (Outcome::Ok, Some(d)) => Some(
                        d.value["ts"]
                            .as_u64()
                            .ok_or_else(|| bad(h, o.complete.unwrap_or(o.invoke), "an ok write without its ts"))?,
                    ),
                    _ => None,
                };
                let acked = done
                    .filter(|_| o.outcome == Outcome::Ok)
                    .and_then(|d| d.value["replicas"].as_array())
                    .map(|a| a.iter().filter_map(Value::as_u64).collect());
                m.writes.entry(key).or_default().push(Write {
                    at: o.invoke,
                    invoke: inv.time,
                    complete,
                    outcome: o.outcome,
                    value,
                    ts,
                    acked,
                });
            }
            "get" if o.outcome == Outcome::Ok => {
                let d = done.expect("an ok op has a completion");
                let got = version_of(h, o.complete.unwrap_or(o.invoke), &d.value)?;
                m.reads.entry(key).or_default().push(Read {
                    at: o.invoke,
                    invoke: inv.time,
                    complete,
                    got,
                });
            }
            _ => {}
        }
    }
    Ok(m)
}

fn finding(kind: &str, key: Option<&str>, range: Option<u64>, ops: Vec<usize>, explanation: String) -> Value {
    json!({"kind": kind, "key": key, "range": range, "ops": ops, "explanation": explanation})
}

/// Rule 3: whether repair brought a delete's tombstone to every replica of
/// `range` that missed it, before `by_ts`. With the servers that
/// acknowledged the delete known, one completed session over the range,
/// started after the delete, between a replica that missed it and one
/// that acknowledged it covers that replica; a delete every replica
/// acknowledged needed no repair. Without them (a history from before
/// deletes named their servers), [`COVERING_ROUNDS`] full rounds.
fn delete_covered(m: &Model, range: u64, acked: Option<&[u64]>, after_ts: u64, by_ts: u64) -> bool {
    let Some(acked) = acked else {
        return covered(m, range, after_ts, by_ts);
    };
    let replicas: Vec<u64> = m
        .finals
        .get(&range)
        .and_then(|reads| reads.first())
        .map(|r| r.replicas.clone())
        .unwrap_or_default();
    replicas.iter().filter(|r| !acked.contains(r)).all(|&missed| {
        m.sessions.iter().any(|s| {
            let other = if s.pair.0 == missed {
                s.pair.1
            } else if s.pair.1 == missed {
                s.pair.0
            } else {
                return false;
            };
            s.range == range && s.ok && certainly_between(m, s, after_ts, by_ts) && acked.contains(&other)
        })
    })
}

/// Whether session `s` started after `after_ts` and finished by `by_ts`
/// whatever the servers' clocks: its times are its initiator's, the
/// others another server's, so each must hold by the skew the history
/// states.
fn certainly_between(m: &Model, s: &Session, after_ts: u64, by_ts: u64) -> bool {
    let skew = m.params.skew_us;
    s.started_ts >= after_ts.saturating_add(skew) && s.finished_ts.saturating_add(skew) <= by_ts
}

/// Whether `range` had [`COVERING_ROUNDS`] full rounds of repair that
/// started after `after_ts` and finished by `by_ts`: every pair of its
/// replicas that repairs it had that many completed sessions.
fn covered(m: &Model, range: u64, after_ts: u64, by_ts: u64) -> bool {
    let mut per_pair: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for s in m.sessions.iter().filter(|s| s.range == range) {
        per_pair.entry(s.pair).or_insert(0);
    }
    for s in &m.sessions {
        if s.range == range && s.ok && certainly_between(m, s, after_ts, by_ts) {
            *per_pair.get_mut(&s.pair).expect("counted above") += 1;
        }
    }
    !per_pair.is_empty() && per_pair.values().all(|&n| n >= COVERING_ROUNDS)
}

/// The findings of one check, by kind.
#[derive(Default)]
struct Found(BTreeMap<&'static str, Vec<Value>>);

impl Found {
    fn add(&mut self, kind: &'static str, f: Value) {
        self.0.entry(kind).or_default().push(f);
    }
}

/// Rule 1: every replica of a range alike after the final repair. Returns
/// each key's final version (and its range), as the first replica read
/// holds it; a replica never read is a reason for unknown.
fn rule_1_diverged(
    m: &Model,
    base: u64,
    f: &mut Found,
    unknown: &mut Vec<String>,
) -> BTreeMap<String, (u64, Option<Version>)> {
    let mut finals: BTreeMap<String, (u64, Option<Version>)> = BTreeMap::new();
    for (&range, reads) in &m.finals {
        let expected: BTreeSet<u64> = reads.iter().flat_map(|r| r.replicas.iter().copied()).collect();
        let read: BTreeSet<u64> = reads.iter().map(|r| r.server).collect();
        if let Some(missing) = expected.difference(&read).next() {
            unknown.push(format!("server {missing}'s replica of range {range} was not read"));
        }
        let first = &reads[0];
        for other in &reads[1..] {
            if other.root != first.root || other.entries != first.entries {
                let keys: Vec<&String> = first
                    .entries
                    .keys()
                    .chain(other.entries.keys())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .filter(|k| first.entries.get(*k) != other.entries.get(*k))
                    .take(5)
                    .collect();
                let diff: Vec<String> = keys
                    .iter()
                    .map(|k| {
                        let d = |r: &RangeRead| r.entries.get(*k).map_or("nothing".to_string(), |v| v.describe(base));
                        format!(
                            "{k}: server {} holds {}, server {} holds {}",
                            first.server,
                            d(first),
                            other.server,
                            d(other)
                        )
                    })
                    .collect();
                f.add(
                    "diverged",
                    finding(
                        "diverged",
                        keys.first().map(|k| k.as_str()),
                        Some(range),
                        vec![],
                        format!(
                            "after the final repair, servers {} and {} disagree on range {range} (roots {} and {}){}{}",
                            first.server,
                            other.server,
                            &first.root[..first.root.len().min(16)],
                            &other.root[..other.root.len().min(16)],
                            if diff.is_empty() { "" } else { ": " },
                            diff.join("; ")
                        ),
                    ),
                );
            }
        }
        for (k, v) in &first.entries {
            finals.insert(k.clone(), (range, Some(v.clone())));
        }
    }
    if m.finals.is_empty() {
        unknown.push("no final reads of the replicas".into());
    }

    finals
}

/// Rules 2 and 3: each key's final version against its writes (and rule
/// 2's expected case, LWW over skewed clocks). Returns the keys whose
/// resurrection was expected, which rule 5 leaves alone.
fn rule_2_3_final_versions<'m>(
    m: &'m Model,
    finals: &BTreeMap<String, (u64, Option<Version>)>,
    base: u64,
    out: &mut Found,
) -> BTreeSet<&'m str> {
    let mut expected_resurrection: BTreeSet<&str> = BTreeSet::new();
    for (key, writes) in &m.writes {
        let (range, fin) = finals.get(key).cloned().unwrap_or((u64::MAX, None));
        let ok: Vec<&Write> = writes.iter().filter(|w| w.outcome == Outcome::Ok).collect();
        let newest = ok
            .iter()
            .filter_map(|w| w.version().map(|v| (v, w.at)))
            .max_by(|a, b| a.0.lww_cmp(&b.0));
        let info = |value: &Option<String>| {
            writes
                .iter()
                .filter(|w| w.outcome.is_indeterminate() && &w.value == value)
                .map(|w| w.at)
                .next()
        };
        let any_info_delete = writes.iter().any(|w| w.outcome.is_indeterminate() && w.value.is_none());
        // rule 2's expected case: LWW over skewed clocks
        let mut by_complete: Vec<&&Write> = ok.iter().collect();
        by_complete.sort_by_key(|w| w.complete);
        let mut max_so_far: Option<&Write> = None;
        for w in by_complete {
            if let Some(prev) = max_so_far {
                if prev.complete < w.invoke && prev.ts > w.ts {
                    out.add(
                        "skew-lost-update",
                        finding(
                            "skew-lost-update",
                            Some(key),
                            None,
                            vec![prev.at, w.at],
                            format!(
                                "key {key}: a write finished before another began, yet carries the larger timestamp ({} > {}): the later write loses, as LWW over skewed clocks allows",
                                since(prev.ts.unwrap_or_default(), base),
                                since(w.ts.unwrap_or_default(), base)
                            ),
                        ),
                    );
                }
            }
            if max_so_far.is_none_or(|p| w.ts > p.ts) {
                max_so_far = Some(w);
            }
        }
        if m.finals.is_empty() {
            // nothing read at the end: no final version to judge
            continue;
        }
        match &fin {
            None => {
                // absent everywhere: never written, or a tombstone purged
                if let Some((v, at)) = &newest {
                    if v.value.is_some() && !any_info_delete {
                        out.add(
                            "lost-update",
                            finding(
                                "lost-update",
                                Some(key),
                                None,
                                vec![*at],
                                format!(
                                    "key {key}: no replica holds it at the end, but the newest acknowledged write put {}",
                                    v.describe(base)
                                ),
                            ),
                        );
                    }
                }
            }
            Some(f) => {
                // rule 2: some write produced it
                let producer = match ok.iter().find(|w| w.value == f.value && w.ts == Some(f.ts)) {
                    Some(w) => Some(w.at),
                    None => info(&f.value),
                };
                if producer.is_none() {
                    let why = match &f.value {
                        Some(v) if ok.iter().any(|w| w.value.as_deref() == Some(v)) => {
                            "the acknowledged put of that value got another timestamp"
                        }
                        Some(_) => "no put carried that value",
                        None => "no delete of the key could have written it",
                    };
                    out.add(
                        "phantom",
                        finding(
                            "phantom",
                            Some(key),
                            Some(range),
                            vec![],
                            format!("key {key} holds {} at the end: {why}", f.describe(base)),
                        ),
                    );
                    continue;
                }
                let Some((newest, newest_at)) = newest else { continue };
                if f.lww_cmp(&newest) != Ordering::Less {
                    continue;
                }
                if newest.value.is_none() && f.value.is_some() {
                    // rule 3: the delete came undone
                    let acked = writes
                        .iter()
                        .find(|w| w.at == newest_at)
                        .and_then(|w| w.acked.as_deref());
                    let logged = m.gcs.iter().any(|g| {
                        g.time_based && g.horizon_ts > newest.ts && !delete_covered(m, range, acked, newest.ts, g.at_ts)
                    });
                    // a pass that purged nothing here logs nothing, yet its
                    // horizon travels with repair sessions, which purge by
                    // it: a final horizon past the tombstone says a purge
                    // could come as early as its grace after it
                    let by_horizon = m.params.gc_time
                        && m.finals
                            .get(&range)
                            .into_iter()
                            .flatten()
                            .any(|r| r.gc_horizon > newest.ts)
                        && !delete_covered(m, range, acked, newest.ts, newest.ts.saturating_add(m.params.grace_us));
                    let expected = logged || by_horizon;
                    let kind = if expected {
                        "resurrected-expected"
                    } else {
                        "resurrected"
                    };
                    if expected {
                        expected_resurrection.insert(key.as_str());
                    }
                    out.add(
                        kind,
                        finding(
                            kind,
                            Some(key),
                            Some(range),
                            vec![newest_at],
                            format!(
                                "key {key} was deleted ({}, acknowledged) but holds {} at the end{}",
                                newest.describe(base),
                                f.describe(base),
                                if expected {
                                    ": a time-based GC pass could purge the tombstone before a repair session brought it to a replica that missed the delete"
                                } else {
                                    ": no GC pass could have purged the tombstone before repair brought it to every replica"
                                }
                            ),
                        ),
                    );
                } else {
                    out.add(
                        "lost-update",
                        finding(
                            "lost-update",
                            Some(key),
                            Some(range),
                            vec![newest_at],
                            format!(
                                "key {key} holds {} at the end, older than the acknowledged write of {}",
                                f.describe(base),
                                newest.describe(base)
                            ),
                        ),
                    );
                }
            }
        }
    }

    expected_resurrection
}

/// Rule 4: a session of the second final repair that found a range
/// differing, streamed entries or failed (whether or not rule 1 also
/// finds the replicas diverged); none recorded is a reason for unknown.
fn rule_4_repair_idempotent(m: &Model, f: &mut Found, unknown: &mut Vec<String>) {
    let second: Vec<&Session> = m.sessions.iter().filter(|s| s.pass == Some(2)).collect();
    if second.is_empty() {
        unknown.push("no second final repair recorded".into());
    }
    // a session of the second pass that differs at all, whether or not
    // rule 1 also finds the replicas diverged
    for s in second.iter().filter(|s| !s.ok || s.streamed > 0 || s.differing > 0) {
        f.add(
            "repair-not-idempotent",
            finding(
                "repair-not-idempotent",
                None,
                Some(s.range),
                vec![],
                if s.ok {
                    format!(
                        "the second final repair of range {} between servers {} and {} found {} ranges differing and streamed {} entries",
                        s.range, s.pair.0, s.pair.1, s.differing, s.streamed
                    )
                } else {
                    format!(
                        "the second final repair of range {} between servers {} and {} failed",
                        s.range, s.pair.0, s.pair.1
                    )
                },
            ),
        );
    }
}

/// Rule 5 (with R + W > RF and no wipe): a read sees every write
/// acknowledged before it was invoked. Returns whether reads were judged.
fn rule_5_stale_reads(m: &Model, expected_resurrection: &BTreeSet<&str>, base: u64, f: &mut Found) -> bool {
    let reads_judged = m.params.r + m.params.w > m.params.rf && !m.wiped;
    if reads_judged {
        for (key, reads) in &m.reads {
            if expected_resurrection.contains(key.as_str()) {
                continue;
            }
            let writes = m.writes.get(key).map(Vec::as_slice).unwrap_or(&[]);
            for rd in reads {
                let before = writes
                    .iter()
                    .filter(|w| w.outcome == Outcome::Ok && w.complete < rd.invoke)
                    .filter_map(|w| w.version().map(|v| (v, w)))
                    .max_by(|a, b| a.0.lww_cmp(&b.0));
                let Some((want, w)) = before else { continue };
                let unsettled = writes
                    .iter()
                    .any(|x| x.outcome != Outcome::Ok && x.invoke < rd.complete && x.invoke >= w.invoke);
                if unsettled {
                    continue;
                }
                let fresh = rd.got.as_ref().is_some_and(|g| g.lww_cmp(&want) != Ordering::Less);
                // a purged tombstone reads as nothing: as new as the delete
                let purged = rd.got.is_none() && want.value.is_none();
                // an older value back after a time-based GC pass could
                // purge the delete's tombstone: the replica that missed
                // the delete answered, as time-based GC allows
                let gc_outran = want.value.is_none()
                    && m.gcs
                        .iter()
                        .any(|g| g.time_based && g.horizon_ts > want.ts && g.at_ns < rd.complete);
                if !fresh && !purged && gc_outran {
                    f.add(
                        "resurrected-expected",
                        finding(
                            "resurrected-expected",
                            Some(key),
                            None,
                            vec![w.at, rd.at],
                            format!(
                                "key {key}: a read after the delete ({}) returned {}, after a time-based GC pass could purge the tombstone",
                                want.describe(base),
                                rd.got.as_ref().map_or("nothing".to_string(), |v| v.describe(base))
                            ),
                        ),
                    );
                } else if !fresh && !purged {
                    f.add(
                        "stale-read",
                        finding(
                            "stale-read",
                            Some(key),
                            None,
                            vec![w.at, rd.at],
                            format!(
                                "key {key}: a read (R = {}, W = {}, RF = {}) invoked after the write of {} was acknowledged returned {}",
                                m.params.r,
                                m.params.w,
                                m.params.rf,
                                want.describe(base),
                                rd.got.as_ref().map_or("nothing".to_string(), |v| v.describe(base))
                            ),
                        ),
                    );
                }
            }
        }
    }

    reads_judged
}

impl Checker for Convergence {
    fn name(&self) -> &str {
        "convergence"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let m = read_model(h)?;
        if m.writes.is_empty() {
            return Ok(CheckResult::unknown(
                self.name(),
                started,
                "no puts or deletes: nothing to judge",
                Value::Null,
            ));
        }
        // times in findings count from the run's start, else from the
        // first timestamp any write got
        let base = m
            .params
            .start_ts_us
            .unwrap_or_else(|| m.writes.values().flatten().filter_map(|w| w.ts).min().unwrap_or(0));
        let mut f = Found::default();
        let mut unknown: Vec<String> = Vec::new();
        let finals = rule_1_diverged(&m, base, &mut f, &mut unknown);
        let expected_resurrection = rule_2_3_final_versions(&m, &finals, base, &mut f);
        rule_4_repair_idempotent(&m, &mut f, &mut unknown);
        let reads_judged = rule_5_stale_reads(&m, &expected_resurrection, base, &mut f);
        // rule 6: the verdict
        let found = f.0;
        const BAD: [&str; 6] = [
            "diverged",
            "phantom",
            "lost-update",
            "resurrected",
            "repair-not-idempotent",
            "stale-read",
        ];
        let counts: BTreeMap<&str, usize> = found.iter().map(|(k, v)| (*k, v.len())).collect();
        let invalid = BAD.iter().any(|k| counts.contains_key(k));
        let findings: Vec<Value> = found
            .values()
            .flat_map(|v| v.iter().take(FINDINGS_LISTED_MAX).cloned())
            .collect();
        let details = json!({
            "keys": m.writes.len(),
            "writes": m.writes.values().map(Vec::len).sum::<usize>(),
            "reads": m.reads.values().map(Vec::len).sum::<usize>(),
            "reads_judged": reads_judged,
            "ranges_read": m.finals.len(),
            "repair_sessions": m.sessions.len(),
            "gc_passes": m.gcs.len(),
            "counts": counts,
            "findings": findings,
            "unknown": unknown,
        });
        let (verdict, reason) = if invalid {
            // the why: how many of each finding, and the first one's words
            let first = BAD
                .iter()
                .find_map(|k| found.get(k).and_then(|v| v.first()))
                .and_then(|f| f["explanation"].as_str())
                .unwrap_or_default();
            let tally: Vec<String> = BAD
                .iter()
                .filter_map(|k| counts.get(k).map(|n| format!("{k} {n}")))
                .collect();
            (Verdict::Invalid, Some(format!("{}: {first}", tally.join(", "))))
        } else if !unknown.is_empty() {
            (Verdict::Unknown, Some(unknown.join("; ")))
        } else {
            (Verdict::Valid, None)
        };
        Ok(CheckResult {
            checker: self.name().to_string(),
            verdict,
            reason,
            elapsed_ms: elapsed_ms(started),
            details,
        })
    }
}
