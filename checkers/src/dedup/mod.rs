//! `dedup`: insert deduplication of a ReplicatedMergeTree-style table,
//! judged from the history of an insert-retry workload (docs/ARCHITECTURE.md,
//! "History": the `insert`, `read`, `drop-partition` and `dedup-window` shapes).
//!
//! Every acknowledged insert must be present exactly once on every replica,
//! failed inserts absent, indeterminate ones at most once; a retry inside
//! the deduplication window must never duplicate; a duplicate of a retry
//! that could have fallen outside it is reported (`unknown-window`) and
//! stays valid. The unit is a block's *key*: `(partition, its rows in
//! written order)`, or `(partition, token_n)` with a token.
//!
//! Rules (numbered 1–18; findings and tests cite them by number):
//!
//! 1. `fail` only for definite errors; a multi-block attempt counts as
//!    failed only for errors raised before any block (a 286 may come after
//!    the first block, so a multi-block 286 is indeterminate).
//! 2. **phantom** — a row no non-failed attempt carried.
//! 3. **torn-block** — a block whose rows appear different numbers of times
//!    on one replica.
//! 4. **diverged** — replicas disagree after sync.
//! 5. **lost** — a key with an `ok` attempt missing on a replica;
//!    **lost-after-dedup** when every `ok` attempt was a retry after an
//!    `info` one.
//! 6. For two attempts of a key, in either order — X committing first, Y
//!    passing its block-id check after X's id was removed — removal was
//!    possible only if at least `window` other keys could have been
//!    created between X's invoke and the latest moment Y could commit (its
//!    completion when `ok`, unbounded when indeterminate), or another
//!    key's block could have been created after `X.invoke + window_seconds
//!    − ε` and before that moment (an empty interval allows nothing, and
//!    only an attempt invoked before the moment counts). An attempt deduplicated against the id does
//!    not renew it, so the pairs need not be consecutive: a key may appear
//!    at most 1 + (removals) times, the removals counted along the longest
//!    chain of attempts each allowing removal of the previous one's id
//!    (taking, from each, the earliest later attempt that allows it).
//!    More is **duplicate**, **duplicate-in-window** when no pair of its
//!    attempts allowed removal.
//! 7. A key with an `ok` attempt and no pair allowing removal appears
//!    exactly once.
//! 8. Otherwise up to the number of non-failed attempts, reported as
//!    **unknown-window** when more than once.
//! 9. Time alone never expires an id (rule 6's second clause needs another
//!    block).
//! 10. Keys come from content or token, so equal content shares a key,
//!     and (11) distinct tokens do not.
//! 12. A token reused with different data: only the data of one attempt
//!     invoked before the key's earliest `ok` completion may be visible;
//!     anything else of that key is phantom — except, per removal rule 6
//!     allows, the data of one attempt that committed after it. Where a
//!     removal fell is known only as a range, so every placement is
//!     tried: the visible data must be, in chain order, the first commit
//!     and then commits each possible after a removal of the id the one
//!     before stored.
//! 13. **nonidempotent-retry** — a retry whose block split differs from its
//!     first attempt's; its blocks count as keys of their own and its
//!     logical insert is left out of rules 6–7.
//! 14. Keys are judged one by one, so partial dedup across partitions
//!     and (15) partial commits of multi-block attempts are fine.
//! 16. 319 is `info`: zero or one copy, never two inside the window.
//! 17. An `ok` partition drop resets that partition's keys: attempts
//!     before it are expected gone, attempts overlapping it are excused
//!     from rules 5–7.
//! 18. Valid iff none of phantom, torn-block, diverged, lost(-after-dedup),
//!     duplicate(-in-window), nonidempotent-retry.
//!
//! What it does not verify: that rows read are the rows of the right
//! *table* or columns beyond the recorded values; sequentially consistent
//! reads of quorum inserts; anything about parts and merges except that
//! they lose and add no rows.

mod witness;

pub use witness::{Witness, BLOCK_OF_F, WITNESS_F};

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use rustc_hash::FxBuildHasher as FxBuild;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// The nemesis `info` line that carries the table's window.
pub const PARAMS_F: &str = "dedup-window";
/// Findings listed per kind in a report (the counts are exact).
const FINDINGS_LISTED_MAX: usize = 20;
/// Rows listed per replica in a divergence.
const DIFF_ROWS_MAX: usize = 10;
/// ClickHouse's default window when a history does not say.
const DEFAULT_WINDOW: u64 = 1000;
const DEFAULT_WINDOW_S: f64 = 7.0 * 24.0 * 3600.0;
const DEFAULT_EPSILON_MS: f64 = 1000.0;

/// Error codes raised before any block of an insert is written: the
/// attempt definitely did nothing (read-only, too few replicas, bad input).
const BEFORE_ANY_BLOCK: [u64; 12] = [27, 36, 47, 60, 62, 73, 81, 115, 117, 164, 242, 285];
/// 286 (previous quorum unsatisfied) may come at a later block's commit.
const SINGLE_BLOCK_DEFINITE: u64 = 286;

pub struct Dedup;

/// The window a history was recorded under.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub window: u64,
    pub window_ns: i64,
    pub epsilon_ns: i64,
    /// Replicas that must be read at the end.
    pub replicas: Vec<String>,
    /// The run recorded the coordinator's witness (rule 6a).
    pub witness: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Ok,
    Fail,
    Info,
}

struct Attempt {
    /// Position of the invoke in the history.
    at: usize,
    logical: u64,
    n: u64,
    start: i64,
    /// When the attempt's blocks could no longer be created: its completion
    /// when `ok`, never (`i64::MAX`) when indeterminate.
    end: i64,
    class: Class,
    code: Option<u64>,
    replica: String,
    /// The `query_id` it was sent with, if the history says.
    query_id: Option<String>,
    /// Key of each block, in the attempt's block order.
    keys: Vec<u32>,
}

struct Variant {
    rows: Vec<u32>,
    /// Attempts (indexes) that carried exactly these rows under this key.
    attempts: Vec<u32>,
}

struct Key {
    label: String,
    partition: String,
    variants: Vec<Variant>,
    /// Non-failed attempts, in invoke order.
    chain: Vec<u32>,
    /// A logical insert of the chain retried with another split.
    nonidempotent: bool,
    /// Excused from rules 5–7 by a partition drop it overlaps.
    excused: bool,
    /// Attempts before a drop of its partition: gone, not counted.
    dropped_before: i64,
}

#[derive(Default)]
struct Model {
    attempts: Vec<Attempt>,
    keys: Vec<Key>,
    key_ids: HashMap<String, u32, FxBuild>,
    rows: HashMap<String, u32, FxBuild>,
    row_text: Vec<String>,
    /// Keys (and variant) each row belongs to.
    row_keys: Vec<Vec<(u32, u16)>>,
    /// replica → (row → count), from its last `ok` read.
    reads: BTreeMap<String, HashMap<u32, u64, FxBuild>>,
    /// Rows read that no attempt carried, per replica.
    unknown_rows: BTreeMap<String, Vec<String>>,
    /// `ok` drops: (partition, invoke, completion).
    drops: Vec<(String, i64, i64)>,
    /// Blocks the server said it deduplicated, over `ok` attempts.
    deduplicated_blocks: u64,
}

fn bad(h: &History, at: usize, why: impl Into<String>) -> HistoryError {
    HistoryError {
        at: h.location(at),
        reason: why.into(),
    }
}

/// The window parameters from the history's `dedup-window` line.
pub fn params(h: &History) -> Result<(Params, bool), HistoryError> {
    for &i in &h.nemesis {
        let op = &h.ops[i];
        if op.f != PARAMS_F {
            continue;
        }
        let v = &op.value;
        let num = |k: &str| v.get(k).and_then(Value::as_f64);
        let replicas = v
            .get("replicas")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|r| r.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        return Ok((
            Params {
                window: num("window").map_or(DEFAULT_WINDOW, |w| w as u64),
                window_ns: (num("window_seconds").unwrap_or(DEFAULT_WINDOW_S) * 1e9) as i64,
                epsilon_ns: (num("epsilon_ms").unwrap_or(DEFAULT_EPSILON_MS) * 1e6) as i64,
                replicas,
                witness: v.get("witness").and_then(Value::as_bool).unwrap_or(false),
            },
            true,
        ));
    }
    Ok((
        Params {
            window: DEFAULT_WINDOW,
            window_ns: (DEFAULT_WINDOW_S * 1e9) as i64,
            epsilon_ns: (DEFAULT_EPSILON_MS * 1e6) as i64,
            replicas: Vec::new(),
            witness: false,
        },
        false,
    ))
}

/// Whether error `code` on an attempt of `blocks` blocks proves the
/// attempt did nothing (rule 1).
pub fn definite_failure(code: u64, blocks: usize) -> bool {
    BEFORE_ANY_BLOCK.contains(&code) || (code == SINGLE_BLOCK_DEFINITE && blocks == 1)
}

impl Model {
    fn row_id(&mut self, row: &Value) -> u32 {
        let text = row.to_string();
        if let Some(&id) = self.rows.get(&text) {
            return id;
        }
        let id = self.row_text.len() as u32;
        self.rows.insert(text.clone(), id);
        self.row_text.push(text);
        self.row_keys.push(Vec::new());
        id
    }

    /// The key of a block and its variant, created on first sight.
    fn key_of(&mut self, label: String, partition: &str, rows: &[u32], attempt: u32) -> u32 {
        let k = match self.key_ids.get(&label) {
            Some(&k) => k,
            None => {
                let k = self.keys.len() as u32;
                self.keys.push(Key {
                    label: label.clone(),
                    partition: partition.to_string(),
                    variants: Vec::new(),
                    chain: Vec::new(),
                    nonidempotent: false,
                    excused: false,
                    dropped_before: i64::MIN,
                });
                self.key_ids.insert(label, k);
                k
            }
        };
        let key = &mut self.keys[k as usize];
        let v = match key.variants.iter().position(|v| v.rows == rows) {
            Some(v) => v,
            None => {
                key.variants.push(Variant {
                    rows: rows.to_vec(),
                    attempts: Vec::new(),
                });
                let v = key.variants.len() - 1;
                for &r in rows {
                    self.row_keys[r as usize].push((k, v as u16));
                }
                v
            }
        };
        self.keys[k as usize].variants[v].attempts.push(attempt);
        k
    }
}

fn code_of(h: &History, o: &crate::pairing::Operation) -> Option<u64> {
    let c = h.complete_op(o)?;
    c.value.get("code").and_then(Value::as_u64).or_else(|| {
        // "Code: 285. …" in the error text
        c.error
            .as_deref()
            .and_then(|e| e.strip_prefix("Code: "))
            .and_then(|e| e.split(|ch: char| !ch.is_ascii_digit()).next())
            .and_then(|d| d.parse().ok())
    })
}

fn read_model(h: &History) -> Result<Model, HistoryError> {
    let mut m = Model::default();
    let mut reads: BTreeMap<String, &Value> = BTreeMap::new();
    for o in &h.operations {
        let inv = h.invoke_op(o);
        match inv.f.as_str() {
            "insert" => {
                let v = &inv.value;
                let logical = v
                    .get("insert")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| bad(h, o.invoke, "insert without a numeric \"insert\" (its logical id)"))?;
                let n = v.get("attempt").and_then(Value::as_u64).unwrap_or(1);
                let token = v.get("token").and_then(Value::as_str).map(str::to_string);
                let blocks = v
                    .get("blocks")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(h, o.invoke, "insert without \"blocks\""))?;
                let code = code_of(h, o);
                let class = match o.outcome {
                    Outcome::Ok => Class::Ok,
                    Outcome::Info | Outcome::Pending => Class::Info,
                    // rule 1
                    Outcome::Fail => {
                        let definite = code.is_none_or(|c| definite_failure(c, blocks.len()));
                        if definite {
                            Class::Fail
                        } else {
                            Class::Info
                        }
                    }
                };
                if class == Class::Ok {
                    m.deduplicated_blocks += h
                        .value_of(o)
                        .get("deduplicated_blocks")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                }
                let start = inv.time;
                let end = match (class, h.complete_op(o)) {
                    (Class::Ok, Some(c)) | (Class::Fail, Some(c)) => c.time,
                    _ => i64::MAX,
                };
                let idx = m.attempts.len() as u32;
                let mut keys = Vec::with_capacity(blocks.len());
                for (ordinal, b) in blocks.iter().enumerate() {
                    let partition = b
                        .get("partition")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(h, o.invoke, format!("block {ordinal} without a partition")))?
                        .to_string();
                    let rows = b
                        .get("rows")
                        .and_then(Value::as_array)
                        .ok_or_else(|| bad(h, o.invoke, format!("block {ordinal} without rows")))?;
                    let row_ids: Vec<u32> = rows.iter().map(|r| m.row_id(r)).collect();
                    let label = match &token {
                        Some(t) => format!("{partition}:{t}_{ordinal}"),
                        None => format!(
                            "{partition}:{}",
                            row_ids
                                .iter()
                                .map(|r| m.row_text[*r as usize].as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        ),
                    };
                    keys.push(m.key_of(label, &partition, &row_ids, idx));
                }
                m.attempts.push(Attempt {
                    at: o.invoke,
                    logical,
                    n,
                    start,
                    end,
                    class,
                    code,
                    replica: inv
                        .node
                        .as_deref()
                        .map(str::to_string)
                        .or_else(|| v.get("replica").and_then(Value::as_str).map(str::to_string))
                        .unwrap_or_default(),
                    query_id: v.get("query_id").and_then(Value::as_str).map(str::to_string),
                    keys,
                });
            }
            "read" if o.outcome == Outcome::Ok => {
                let replica = inv
                    .key
                    .as_deref()
                    .map(str::to_string)
                    .ok_or_else(|| bad(h, o.invoke, "a final read without the replica as its key"))?;
                let rows = h.value_of(o);
                if !rows.is_array() {
                    return Err(bad(
                        h,
                        o.complete.unwrap_or(o.invoke),
                        "a read's value must be an array of rows",
                    ));
                }
                reads.insert(replica, rows);
            }
            "drop-partition" if o.outcome == Outcome::Ok => {
                let p = inv
                    .value
                    .get("partition")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(h, o.invoke, "drop-partition without a partition"))?;
                let end = h.complete_op(o).map_or(i64::MAX, |c| c.time);
                m.drops.push((p.to_string(), inv.time, end));
            }
            _ => {}
        }
    }
    for (replica, rows) in reads {
        let mut counts: HashMap<u32, u64, FxBuild> = HashMap::default();
        let mut unknown = Vec::new();
        for r in rows.as_array().expect("checked") {
            match m.rows.get(&r.to_string()) {
                Some(&id) => *counts.entry(id).or_default() += 1,
                None => unknown.push(r.to_string()),
            }
        }
        if !unknown.is_empty() {
            m.unknown_rows.insert(replica.clone(), unknown);
        }
        m.reads.insert(replica, counts);
    }
    Ok(m)
}

/// One finding, as the report lists it.
fn finding(kind: &str, key: Option<&Key>, replicas: &[&str], attempts: Vec<Value>, explanation: String) -> Value {
    json!({
        "kind": kind,
        "key": key.map(|k| k.label.clone()),
        "partition": key.map(|k| k.partition.clone()),
        "replicas": replicas,
        "attempts": attempts,
        "explanation": explanation,
    })
}

/// Rule 6 for one order of a pair: X's id committed first, and Y's
/// commit came after its removal. Removal was possible if (i) at least
/// `window` other keys could have been created between X's invoke and
/// Y's latest commit, or (ii) some other key's block could have been
/// created after `X.invoke + window_seconds − ε` and before Y's latest
/// commit (an empty interval allows nothing; a block "could have been
/// created" at t only by an attempt invoked before t).
fn removal_possible(timeline: &Timeline, params: &Params, key: u32, x: &Attempt, y: &Attempt) -> bool {
    if y.end <= x.start {
        // Y was acknowledged before X was sent: not this order
        return false;
    }
    let by_count = timeline.keys_in(x.start, y.end).saturating_sub(1) >= params.window;
    let by_age = timeline.other_block_after(key, x.start.saturating_add(params.window_ns - params.epsilon_ns), y.end);
    by_count || by_age
}

/// Answers "how many other keys could have been created in [a, b]" and
/// "could another key's block have been created in (t, b)" in O(log n).
struct Timeline {
    /// Keys' earliest possible creation, sorted.
    starts: Vec<i64>,
    /// Keys' latest possible creation, sorted.
    ends: Vec<i64>,
    /// Attempts by invoke: (invoke, running top two (end, key) maxima).
    by_invoke: Vec<(i64, [(i64, u32); 2])>,
}

impl Timeline {
    fn new(m: &Model) -> Timeline {
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        for k in &m.keys {
            let live: Vec<&Attempt> = k.chain.iter().map(|&a| &m.attempts[a as usize]).collect();
            if let (Some(s), Some(e)) = (live.iter().map(|a| a.start).min(), live.iter().map(|a| a.end).max()) {
                starts.push(s);
                ends.push(e);
            }
        }
        starts.sort_unstable();
        ends.sort_unstable();
        let mut attempts: Vec<(i64, i64, u32)> = Vec::new();
        for (ki, k) in m.keys.iter().enumerate() {
            for &a in &k.chain {
                let a = &m.attempts[a as usize];
                attempts.push((a.start, a.end, ki as u32));
            }
        }
        attempts.sort_unstable();
        let mut top: [(i64, u32); 2] = [(i64::MIN, u32::MAX); 2];
        let mut by_invoke = Vec::with_capacity(attempts.len());
        for (start, end, key) in attempts {
            if key == top[0].1 {
                top[0].0 = top[0].0.max(end);
            } else if end > top[0].0 {
                top = [(end, key), top[0]];
            } else if key == top[1].1 {
                top[1].0 = top[1].0.max(end);
            } else if end > top[1].0 {
                top[1] = (end, key);
            }
            if top[1].0 > top[0].0 {
                top.swap(0, 1);
            }
            by_invoke.push((start, top));
        }
        Timeline {
            starts,
            ends,
            by_invoke,
        }
    }

    /// Keys whose creation could fall in [a, b] (the caller's own included).
    fn keys_in(&self, a: i64, b: i64) -> u64 {
        let ended_before = self.ends.partition_point(|&e| e < a);
        let started_after = self.starts.len() - self.starts.partition_point(|&s| s <= b);
        (self.starts.len() - ended_before - started_after) as u64
    }

    /// Whether a key other than `key` could have had a block created after
    /// `t` by an attempt invoked before `b`.
    fn other_block_after(&self, key: u32, t: i64, b: i64) -> bool {
        if t >= b {
            return false;
        }
        let n = self.by_invoke.partition_point(|(s, _)| *s < b);
        if n == 0 {
            return false;
        }
        let top = self.by_invoke[n - 1].1;
        top.iter().any(|(end, k)| *k != key && *k != u32::MAX && *end > t)
    }
}

/// The partition a block id `<partition>_<hi>_<lo>` names.
fn partition_of_id(id: &str) -> Option<&str> {
    let mut it = id.rsplitn(3, '_');
    let (_, _, p) = (it.next()?, it.next()?, it.next()?);
    Some(p)
}

/// Rule 6a: each key's block ids, as the servers computed them for its
/// attempts (logged under each attempt's query id): an attempt's ids are
/// matched to its blocks by partition, in order, else by position.
fn key_ids(m: &Model, w: &Witness) -> Vec<BTreeSet<String>> {
    let mut out = vec![BTreeSet::new(); m.keys.len()];
    for a in &m.attempts {
        let Some(q) = &a.query_id else { continue };
        let mut used = vec![false; a.keys.len()];
        for (pos, id) in w.ids_of(q).iter().enumerate() {
            let part = partition_of_id(id);
            let slot = (0..a.keys.len())
                .find(|&i| !used[i] && part == Some(m.keys[a.keys[i] as usize].partition.as_str()))
                .or_else(|| (pos < a.keys.len() && !used[pos]).then_some(pos));
            if let Some(i) = slot {
                used[i] = true;
                out[a.keys[i] as usize].insert(id.clone());
            }
        }
    }
    out
}

fn attempt_json(m: &Model, h: &History, a: u32) -> Value {
    let a = &m.attempts[a as usize];
    json!({
        "insert": a.logical,
        "attempt": a.n,
        "replica": a.replica,
        "outcome": match a.class { Class::Ok => "ok", Class::Fail => "fail", Class::Info => "info" },
        "code": a.code,
        "index": h.ops[a.at].index,
        "invoke_s": a.start as f64 / 1e9,
    })
}

/// What the checker found, by kind: every finding counted, the first
/// [`FINDINGS_LISTED_MAX`] of each kind listed.
#[derive(Default)]
struct Findings {
    listed: BTreeMap<&'static str, Vec<Value>>,
    counts: BTreeMap<&'static str, u64>,
}

impl Findings {
    fn add(&mut self, kind: &'static str, f: Value) {
        *self.counts.entry(kind).or_default() += 1;
        let list = self.listed.entry(kind).or_default();
        if list.len() < FINDINGS_LISTED_MAX {
            list.push(f);
        }
    }

    fn count(&self, kind: &str) -> u64 {
        self.counts.get(kind).copied().unwrap_or(0)
    }
}

/// Counts for the summary.
#[derive(Default)]
struct Tally {
    /// (key, replica) pairs holding an acknowledged key exactly once.
    exact: u64,
    /// (key, replica) pairs with more than one copy the window allows.
    unknown_window: u64,
    /// Attempts beyond the first of each key.
    retries_on_same_key: u64,
    /// Retried keys judged by the witness (rule 6a) and from the client.
    by_witness: u64,
    by_client: u64,
}

/// Rule 6 along a key's chain of attempts.
struct Removals {
    /// Removals of the key's id possible along its chain.
    pairs: u64,
    /// Per attempt of the chain, the stretch (epoch) it falls in: a run no
    /// removal could split. Kept only where rule 12 needs it.
    epoch_of: Vec<u32>,
}

/// Everything judged per key on every replica.
struct KeyJudgement<'k> {
    key: &'k Key,
    removals: Removals,
    /// Rule 12: per variant, whether it may be visible by the epochs
    /// alone (a chain too long to search), and the search's facts.
    allowed_variants: Vec<bool>,
    rule_12: Option<Rule12>,
    /// Rule 6a's allowance, when the witness knows the key's ids.
    allowance: Option<witness::Allowance>,
    live: u64,
    has_ok: bool,
}

/// Rule 1: a key's chain is its non-failed attempts in invoke order (a
/// definitely failed attempt contributes nothing).
fn rule_1_chains(m: &mut Model) {
    for (i, a) in m.attempts.iter().enumerate() {
        if a.class != Class::Fail {
            for &k in &a.keys {
                let chain = &mut m.keys[k as usize].chain;
                if chain.last() != Some(&(i as u32)) {
                    chain.push(i as u32);
                }
            }
        }
    }
    for k in &mut m.keys {
        let attempts = &m.attempts;
        k.chain.sort_by_key(|&a| (attempts[a as usize].start, a));
    }
}

/// Rule 13: the logical inserts whose attempts split their rows
/// differently; their keys are marked. Returns (logical inserts, those).
fn rule_13_nonidempotent_retries(m: &mut Model) -> (usize, BTreeSet<u64>) {
    let mut splits: BTreeMap<u64, &[u32]> = BTreeMap::new();
    let mut nonidempotent: BTreeSet<u64> = BTreeSet::new();
    for a in &m.attempts {
        match splits.get(&a.logical) {
            None => {
                splits.insert(a.logical, &a.keys);
            }
            Some(first) if *first != a.keys.as_slice() => {
                nonidempotent.insert(a.logical);
            }
            _ => {}
        }
    }
    let logical = splits.len();
    for a in &m.attempts {
        if nonidempotent.contains(&a.logical) {
            for &k in &a.keys {
                m.keys[k as usize].nonidempotent = true;
            }
        }
    }
    (logical, nonidempotent)
}

/// Rule 17: an `ok` drop of a partition resets its keys: attempts that
/// ended before it are gone, keys with attempts overlapping it excused.
fn rule_17_partition_drops(m: &mut Model) {
    for (p, d_start, d_end) in m.drops.clone() {
        for k in m.keys.iter_mut().filter(|k| k.partition == p) {
            let attempts = &m.attempts;
            let overlaps = k.chain.iter().any(|&a| {
                let a = &attempts[a as usize];
                a.start < d_end && a.end >= d_start
            });
            if overlaps {
                k.excused = true;
            }
            k.dropped_before = k.dropped_before.max(d_start);
        }
    }
    for k in &mut m.keys {
        if k.dropped_before > i64::MIN {
            let attempts = &m.attempts;
            let cut = k.dropped_before;
            k.chain.retain(|&a| attempts[a as usize].end >= cut);
        }
    }
}

/// Rule 18's precondition: the replicas to judge, each read at the end;
/// else why the verdict is unknown.
fn replicas_to_judge(params: &Params, m: &Model) -> Result<Vec<String>, String> {
    let mut replicas: Vec<String> = params.replicas.clone();
    for r in m.reads.keys() {
        if !replicas.contains(r) {
            replicas.push(r.clone());
        }
    }
    let unread: Vec<&String> = replicas.iter().filter(|r| !m.reads.contains_key(*r)).collect();
    if m.reads.is_empty() {
        return Err("no replica was read at the end".to_string());
    }
    if !unread.is_empty() {
        return Err(format!("replicas never read at the end: {unread:?}"));
    }
    Ok(replicas)
}

/// Rule 2: rows nobody inserted, or that only failed attempts carried.
fn rule_2_phantoms(m: &Model, h: &History, f: &mut Findings) {
    for (r, rows) in &m.unknown_rows {
        for row in rows.iter().take(FINDINGS_LISTED_MAX) {
            f.add(
                "phantom",
                finding(
                    "phantom",
                    None,
                    &[r],
                    vec![],
                    format!("row {row} on {r} was carried by no insert attempt"),
                ),
            );
        }
    }
    for (r, counts_r) in &m.reads {
        for (&row, &n) in counts_r {
            let keys = &m.row_keys[row as usize];
            let carried = keys.iter().any(|&(k, v)| {
                m.keys[k as usize].variants[v as usize]
                    .attempts
                    .iter()
                    .any(|&a| m.attempts[a as usize].class != Class::Fail)
            });
            if !carried {
                let attempts = keys
                    .iter()
                    .flat_map(|&(k, v)| m.keys[k as usize].variants[v as usize].attempts.clone())
                    .map(|a| attempt_json(m, h, a))
                    .collect();
                f.add(
                    "phantom",
                    finding(
                        "phantom",
                        None,
                        &[r],
                        attempts,
                        format!(
                            "row {} appears {n}× on {r}, but every attempt that carried it failed definitely",
                            m.row_text[row as usize]
                        ),
                    ),
                );
            }
        }
    }
}

/// Rule 4: replicas that disagree after sync, each against the first.
fn rule_4_diverged(m: &Model, replicas: &[String], f: &mut Findings) {
    let reference = &replicas[0];
    for r in replicas.iter().skip(1) {
        let (a, b) = (&m.reads[reference], &m.reads[r]);
        let mut diff: Vec<String> = Vec::new();
        let all: BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
        for row in all {
            let (x, y) = (a.get(&row).copied().unwrap_or(0), b.get(&row).copied().unwrap_or(0));
            if x != y {
                diff.push(format!("{} {reference}:{x} {r}:{y}", m.row_text[row as usize]));
            }
        }
        let ua = m.unknown_rows.get(reference).map_or(0, Vec::len);
        let ub = m.unknown_rows.get(r).map_or(0, Vec::len);
        if !diff.is_empty() || ua != ub {
            let n = diff.len();
            diff.truncate(DIFF_ROWS_MAX);
            f.add(
                "diverged",
                json!({
                    "kind": "diverged", "replicas": [reference, r], "rows_differing": n, "diff": diff,
                    "explanation": format!("after SYNC REPLICA, {reference} and {r} hold different rows ({n} rows differ in count)"),
                }),
            );
        }
    }
}

/// Keys sharing their rows: (the rows, the keys).
type SharedRows = Vec<(Vec<u32>, Vec<u32>)>;

/// Rules 10–11: keys over the same rows (equal content under distinct
/// tokens) can only be counted together, since a row's copies may belong
/// to either. The groups, and whether each key is in one.
fn rule_10_11_shared_rows(m: &Model) -> (SharedRows, Vec<bool>) {
    let mut by_rows: BTreeMap<&[u32], Vec<u32>> = BTreeMap::new();
    for (ki, k) in m.keys.iter().enumerate() {
        if let [v] = k.variants.as_slice() {
            by_rows.entry(v.rows.as_slice()).or_default().push(ki as u32);
        }
    }
    let groups: SharedRows = by_rows
        .into_iter()
        .filter(|(_, keys)| keys.len() > 1)
        .map(|(rows, keys)| (rows.to_vec(), keys))
        .collect();
    let mut grouped = vec![false; m.keys.len()];
    for (_, keys) in &groups {
        for &k in keys {
            grouped[k as usize] = true;
        }
    }
    (groups, grouped)
}

/// Rule 6 along a key's chain: from the attempt that may have created
/// the id, the earliest later attempt that could find it removed may
/// create it again (a deduplicated attempt in between renews nothing), in
/// either commit order; `track` keeps each attempt's epoch for rule 12.
fn rule_6_removals(timeline: &Timeline, params: &Params, ki: u32, chain: &[&Attempt], track: bool) -> Removals {
    let mut pairs = 0u64;
    let mut epoch_of = if track { vec![0u32; chain.len()] } else { Vec::new() };
    let mut creator = 0usize;
    for i in 1..chain.len() {
        let (a, b) = (chain[creator], chain[i]);
        // X commits first, Y passes its check after X's id was removed,
        // by Y's latest commit (its completion when ok, the end of the
        // history when indeterminate)
        if removal_possible(timeline, params, ki, a, b) || removal_possible(timeline, params, ki, b, a) {
            pairs += 1;
            creator = i;
        }
        if track {
            epoch_of[i] = pairs as u32;
        }
    }
    Removals { pairs, epoch_of }
}

/// Rule 12 for a token key with several data (variants): which of its
/// attempts may have stored its data first, and after which others a
/// removal of the id was possible. Where the removals fell is not known,
/// only where they could have: the variants a replica shows are judged
/// against every placement (see [`Rule12::allows`]).
struct Rule12 {
    /// Per attempt of the chain, the variant its rows are.
    variant_at: Vec<Option<usize>>,
    /// Per attempt: not failed, and invoked before the key's first
    /// acknowledgement (it could have committed first of all).
    first: Vec<bool>,
    /// `after[p][q]` (p before q in the chain): q could have committed
    /// after a removal of the id p stored (rule 6, either order).
    after: Vec<Vec<bool>>,
}

/// Chains longer than this are judged by the epochs alone (the search
/// below is over subsets of the chain).
const RULE_12_CHAIN_MAX: usize = 64;

impl Rule12 {
    fn new(timeline: &Timeline, params: &Params, ki: u32, k: &Key, chain: &[&Attempt]) -> Option<Rule12> {
        if k.variants.len() <= 1 || chain.len() > RULE_12_CHAIN_MAX {
            return None;
        }
        let first_ok = chain
            .iter()
            .filter(|a| a.class == Class::Ok)
            .map(|a| a.end)
            .min()
            .unwrap_or(i64::MAX);
        let variant_at = k
            .chain
            .iter()
            .map(|&a| k.variants.iter().position(|v| v.attempts.contains(&a)))
            .collect();
        let live = |a: &Attempt| a.class != Class::Fail;
        let first = chain.iter().map(|a| live(a) && a.start < first_ok).collect();
        let after = (0..chain.len())
            .map(|p| {
                (0..chain.len())
                    .map(|q| {
                        q > p
                            && live(chain[q])
                            && (removal_possible(timeline, params, ki, chain[p], chain[q])
                                || removal_possible(timeline, params, ki, chain[q], chain[p]))
                    })
                    .collect()
            })
            .collect();
        Some(Rule12 {
            variant_at,
            first,
            after,
        })
    }

    /// Whether the `visible` variants can each be the data of the first
    /// commit of one stretch between removals: some attempts c0 < c1 < …
    /// of the chain, one per visible variant, c0 able to commit first of
    /// all and each next one after a removal of the id the one before it
    /// stored (the removal placed just before its commit: whatever was
    /// acknowledged before that deduplicated against the earlier id).
    fn allows(&self, visible: &[usize]) -> bool {
        let mut left: Vec<usize> = visible.to_vec();
        self.search(None, &mut left)
    }

    fn search(&self, prev: Option<usize>, left: &mut Vec<usize>) -> bool {
        if left.is_empty() {
            return true;
        }
        let from = prev.map_or(0, |p| p + 1);
        for q in from..self.variant_at.len() {
            let Some(v) = self.variant_at[q] else { continue };
            let Some(i) = left.iter().position(|&x| x == v) else {
                continue;
            };
            let can = match prev {
                None => self.first[q],
                Some(p) => self.after[p][q],
            };
            if can {
                left.swap_remove(i);
                if self.search(Some(q), left) {
                    return true;
                }
                left.push(v);
                let last = left.len() - 1;
                left.swap(i, last);
            }
        }
        false
    }
}

/// Rule 12 by the epochs of rule 6 alone, for a chain too long to search:
/// per variant, whether an attempt of it could have committed before its
/// epoch's first acknowledgement.
fn rule_12_allowed_variants(m: &Model, k: &Key, chain: &[&Attempt], removals: &Removals) -> Vec<bool> {
    if k.variants.len() <= 1 {
        return Vec::new();
    }
    let epochs = removals.pairs as usize + 1;
    let mut first_ok = vec![i64::MAX; epochs];
    for (a, &e) in chain.iter().zip(&removals.epoch_of) {
        if a.class == Class::Ok {
            first_ok[e as usize] = first_ok[e as usize].min(a.end);
        }
    }
    k.variants
        .iter()
        .map(|v| {
            v.attempts.iter().any(|&a| {
                let at = &m.attempts[a as usize];
                let epoch = k
                    .chain
                    .iter()
                    .position(|&c| c == a)
                    .map_or(0, |p| removals.epoch_of[p] as usize);
                at.class != Class::Fail && at.start < first_ok[epoch]
            })
        })
        .collect()
}

/// The judge of one history: the model, the parameters, the replicas,
/// and what it found so far.
struct Judge<'a> {
    h: &'a History,
    m: &'a Model,
    params: &'a Params,
    replicas: &'a [String],
    f: Findings,
    tally: Tally,
}

impl Judge<'_> {
    fn attempts_json(&self, k: &Key) -> Vec<Value> {
        k.chain.iter().map(|&a| attempt_json(self.m, self.h, a)).collect()
    }

    /// Rule 3 per variant, and the key's copies on `r`: the variants
    /// visible there and their total.
    fn rule_3_torn_blocks(&mut self, k: &Key, r: &str) -> (u64, Vec<usize>) {
        let (m, h) = (self.m, self.h);
        let reads = &m.reads[r];
        let mut count = 0u64;
        let mut visible = Vec::new();
        for (vi, v) in k.variants.iter().enumerate() {
            let seen: Vec<u64> = v.rows.iter().map(|row| reads.get(row).copied().unwrap_or(0)).collect();
            let lo = seen.iter().copied().min().unwrap_or(0);
            // a row shared with another key (equal rows in two blocks) is
            // judged through that key's count too: only rows owned by
            // this key alone decide tearing
            let own: Vec<u64> = v
                .rows
                .iter()
                .zip(&seen)
                .filter(|(row, _)| m.row_keys[**row as usize].len() == 1)
                .map(|(_, n)| *n)
                .collect();
            if own.iter().min() != own.iter().max() {
                self.f.add(
                    "torn-block",
                    finding(
                        "torn-block",
                        Some(k),
                        &[r],
                        v.attempts.iter().map(|&a| attempt_json(m, h, a)).collect(),
                        format!(
                            "block {} is torn on {r}: its rows appear between {} and {} times",
                            k.label,
                            own.iter().min().unwrap_or(&0),
                            own.iter().max().unwrap_or(&0)
                        ),
                    ),
                );
            }
            let c = own.iter().min().copied().unwrap_or(lo);
            if c > 0 {
                visible.push(vi);
                count += c;
            }
        }
        (count, visible)
    }

    /// Rule 12 on `r`: one variant per epoch, each of an attempt that
    /// could have committed before its epoch's first acknowledgement.
    fn rule_12_reused_token(&mut self, j: &KeyJudgement, r: &str, visible: &[usize]) {
        if j.allowed_variants.is_empty() {
            return;
        }
        let epochs = j.removals.pairs as usize + 1;
        let allowed = match &j.rule_12 {
            Some(r) => r.allows(visible),
            None => visible.len() <= epochs && visible.iter().all(|&vi| j.allowed_variants[vi]),
        };
        if !allowed {
            let k = j.key;
            self.f.add(
                "phantom",
                finding(
                    "phantom",
                    Some(k),
                    &[r],
                    self.attempts_json(k),
                    format!(
                        "token key {} shows {} different data on {r}: only the data of one attempt invoked before the key's first acknowledgement may be visible{}",
                        k.label,
                        visible.len(),
                        if epochs > 1 {
                            format!(" in each of the {epochs} stretches between which the window could have freed its id")
                        } else {
                            String::new()
                        }
                    ),
                ),
            );
        }
    }

    /// Rule 5: an acknowledged key missing on `r` (lost-after-dedup when
    /// every acknowledgement went to a retry of an indeterminate attempt).
    fn rule_5_lost(&mut self, j: &KeyJudgement, r: &str) {
        let m = self.m;
        let k = j.key;
        let after_info = k
            .chain
            .iter()
            .map(|&a| &m.attempts[a as usize])
            .filter(|a| a.class == Class::Ok)
            .all(|ok| {
                ok.n > 1
                    && m.attempts
                        .iter()
                        .any(|x| x.logical == ok.logical && x.n < ok.n && x.class == Class::Info)
            });
        let kind = if after_info { "lost-after-dedup" } else { "lost" };
        let why = if after_info {
            format!(
                "key {} was acknowledged only to retries after an indeterminate attempt, yet {r} does not hold it: the id survived, the data did not, and the retry was swallowed",
                k.label
            )
        } else {
            format!("key {} was acknowledged but {r} does not hold it", k.label)
        };
        self.f
            .add(kind, finding(kind, Some(k), &[r], self.attempts_json(k), why));
    }

    /// Rule 6a on `r`: the witness allows what the coordinator did.
    fn rule_6a_witness(&mut self, j: &KeyJudgement, a: &witness::Allowance, r: &str, count: u64) {
        let k = j.key;
        if count > a.copies {
            self.f.add(
                "duplicate-in-window",
                finding(
                    "duplicate-in-window",
                    Some(k),
                    &[r],
                    self.attempts_json(k),
                    format!(
                        "key {} appears {count}× on {r}; {}, so at most {} (the coordinator's witness)",
                        k.label,
                        a.why,
                        match a.copies {
                            1 => "1 copy is allowed".to_string(),
                            n => format!("{n} copies are allowed"),
                        }
                    ),
                ),
            );
        } else if count == 1 && j.has_ok {
            self.tally.exact += 1;
        }
    }

    /// Rules 6–8 on `r` from the client's side: at most one copy plus
    /// the removals the chain allows (rule 7: exactly one when none);
    /// more copies a removal could explain are unknown-window (rule 8).
    fn rule_6_8_window(&mut self, j: &KeyJudgement, r: &str, count: u64) {
        let (k, pairs) = (j.key, j.removals.pairs);
        if count > 1 + pairs {
            let kind = if pairs == 0 { "duplicate-in-window" } else { "duplicate" };
            self.f.add(
                kind,
                finding(
                    kind,
                    Some(k),
                    &[r],
                    self.attempts_json(k),
                    format!(
                        "key {} appears {count}× on {r}; its {} attempts allow at most {pairs} removals of its id between them (window {} ids, {} s, ε {} ms), so at most {}",
                        k.label,
                        j.live,
                        self.params.window,
                        self.params.window_ns as f64 / 1e9,
                        self.params.epsilon_ns as f64 / 1e6,
                        match 1 + pairs {
                            1 => "1 copy is allowed".to_string(),
                            n => format!("{n} copies are allowed"),
                        }
                    ),
                ),
            );
        } else if count > 1 {
            self.tally.unknown_window += 1;
            self.f.add(
                "unknown-window",
                finding(
                    "unknown-window",
                    Some(k),
                    &[r],
                    self.attempts_json(k),
                    format!(
                        "key {} appears {count}× on {r}: its retries could have fallen outside the window, so this is allowed",
                        k.label
                    ),
                ),
            );
        } else if count == 1 && j.has_ok {
            self.tally.exact += 1;
        }
    }

    /// One key (not in a group of shared rows) on every replica.
    fn key(&mut self, j: &KeyJudgement) {
        let k = j.key;
        for r in self.replicas {
            let (count, visible) = self.rule_3_torn_blocks(k, r);
            self.rule_12_reused_token(j, r, &visible);
            if count == 0 && j.has_ok && !k.excused {
                self.rule_5_lost(j, r);
                continue;
            }
            if count > j.live {
                self.f.add(
                    "duplicate",
                    finding(
                        "duplicate",
                        Some(k),
                        &[r],
                        self.attempts_json(k),
                        format!(
                            "key {} appears {count}× on {r} but only {} attempt(s) could have inserted it",
                            k.label, j.live
                        ),
                    ),
                );
                continue;
            }
            if k.nonidempotent || k.excused {
                continue;
            }
            match &j.allowance {
                Some(a) => self.rule_6a_witness(j, a, r, count),
                None => self.rule_6_8_window(j, r, count),
            }
        }
    }

    /// Rules 10–11 for a group of keys over the same rows: counted
    /// together against what their keys allow between them. `judged`
    /// holds each key's (removals, non-failed attempts, acknowledged).
    fn shared_rows(&mut self, rows: &[u32], keys: &[u32], judged: &[(u64, u64, bool)]) {
        let (m, h) = (self.m, self.h);
        let (mut need, mut allow, mut window_bound) = (0u64, 0u64, true);
        for &k in keys {
            let key = &m.keys[k as usize];
            let (pairs, live, has_ok) = judged[k as usize];
            if has_ok && !key.excused && !key.nonidempotent {
                need += 1;
            }
            allow += if key.excused || key.nonidempotent {
                live
            } else {
                live.min(1 + pairs)
            };
            window_bound &= pairs == 0;
        }
        let label = keys
            .iter()
            .map(|&k| m.keys[k as usize].label.clone())
            .collect::<Vec<_>>()
            .join(" + ");
        let attempts = || -> Vec<Value> {
            keys.iter()
                .flat_map(|&k| {
                    m.keys[k as usize]
                        .chain
                        .iter()
                        .map(|&a| attempt_json(m, h, a))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        for r in self.replicas {
            let reads = &m.reads[r];
            let seen: Vec<u64> = rows.iter().map(|row| reads.get(row).copied().unwrap_or(0)).collect();
            let total = seen.iter().copied().min().unwrap_or(0);
            let first = Some(&m.keys[keys[0] as usize]);
            if seen.iter().copied().max() != Some(total) {
                self.f.add(
                    "torn-block",
                    finding(
                        "torn-block",
                        first,
                        &[r],
                        attempts(),
                        format!("the block of keys {label} is torn on {r}"),
                    ),
                );
            } else if total < need {
                self.f.add(
                    "lost",
                    finding(
                        "lost",
                        first,
                        &[r],
                        attempts(),
                        format!("keys {label} share their rows: {need} were acknowledged but {r} holds {total} copies"),
                    ),
                );
            } else if total > allow {
                let kind = if window_bound {
                    "duplicate-in-window"
                } else {
                    "duplicate"
                };
                self.f.add(
                    kind,
                    finding(
                        kind,
                        first,
                        &[r],
                        attempts(),
                        format!("keys {label} share their rows: at most {allow} copies are allowed, {r} holds {total}"),
                    ),
                );
            } else if total > need.max(1) {
                self.tally.unknown_window += 1;
            } else if total >= 1 {
                self.tally.exact += 1;
            }
        }
    }

    /// Rule 13's findings: one per logical insert retried with another split.
    fn rule_13_findings(&mut self, nonidempotent: &BTreeSet<u64>) {
        for logical in nonidempotent {
            let attempts: Vec<Value> = self
                .m
                .attempts
                .iter()
                .enumerate()
                .filter(|(_, a)| a.logical == *logical)
                .map(|(i, _)| attempt_json(self.m, self.h, i as u32))
                .collect();
            self.f.add(
                "nonidempotent-retry",
                json!({
                    "kind": "nonidempotent-retry", "insert": logical, "attempts": attempts,
                    "explanation": format!("insert {logical} was retried with another block split: its retries are new keys, not retries"),
                }),
            );
        }
    }
}

/// Rule 18: the findings that make a history invalid.
const INVALID: [&str; 8] = [
    "phantom",
    "torn-block",
    "diverged",
    "lost",
    "lost-after-dedup",
    "duplicate",
    "duplicate-in-window",
    "nonidempotent-retry",
];

impl Checker for Dedup {
    fn name(&self) -> &str {
        "dedup"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let (params, stated) = params(h)?;
        let mut m = read_model(h)?;
        if m.attempts.is_empty() {
            return Ok(CheckResult::unknown(
                self.name(),
                started,
                "no insert attempts: nothing to judge",
                Value::Null,
            ));
        }
        rule_1_chains(&mut m);
        let (logical_inserts, nonidempotent) = rule_13_nonidempotent_retries(&mut m);
        rule_17_partition_drops(&mut m);
        let replicas = match replicas_to_judge(&params, &m) {
            Ok(r) => r,
            Err(why) => {
                return Ok(CheckResult::unknown(
                    self.name(),
                    started,
                    why,
                    json!({"attempts": m.attempts.len(), "keys": m.keys.len()}),
                ))
            }
        };
        let timeline = Timeline::new(&m);
        // rule 6a: with the coordinator's witness, dedup is judged exactly
        // (an empty witness is a witness: the coordinator created no id)
        let witness = if params.witness && params.window > 0 {
            Some(Witness::read(h, params.window, params.window_ns / 1_000_000)?)
        } else {
            None
        };
        let ids = witness.as_ref().map(|w| key_ids(&m, w)).unwrap_or_default();
        let mut judge = Judge {
            h,
            m: &m,
            params: &params,
            replicas: &replicas,
            f: Findings::default(),
            tally: Tally::default(),
        };
        rule_2_phantoms(&m, h, &mut judge.f);
        rule_4_diverged(&m, &replicas, &mut judge.f);
        let (groups, grouped) = rule_10_11_shared_rows(&m);
        // per key: (removals possible, non-failed attempts, acknowledged)
        let mut judged: Vec<(u64, u64, bool)> = Vec::with_capacity(m.keys.len());
        for (ki, k) in m.keys.iter().enumerate() {
            let ki = ki as u32;
            let chain: Vec<&Attempt> = k.chain.iter().map(|&a| &m.attempts[a as usize]).collect();
            let removals = rule_6_removals(&timeline, &params, ki, &chain, k.variants.len() > 1);
            let has_ok = chain.iter().any(|a| a.class == Class::Ok);
            let live = chain.len() as u64;
            judge.tally.retries_on_same_key += live.saturating_sub(1);
            judged.push((removals.pairs, live, has_ok));
            if grouped[ki as usize] {
                continue;
            }
            let allowance = match (&witness, ids.get(ki as usize)) {
                (Some(w), Some(ids)) if !ids.is_empty() => Some(w.allowance(ids)),
                _ => None,
            };
            if live > 1 && !k.nonidempotent && !k.excused {
                if allowance.is_some() {
                    judge.tally.by_witness += 1;
                } else {
                    judge.tally.by_client += 1;
                }
            }
            let allowed_variants = rule_12_allowed_variants(&m, k, &chain, &removals);
            let rule_12 = Rule12::new(&timeline, &params, ki, k, &chain);
            judge.key(&KeyJudgement {
                key: k,
                removals,
                allowed_variants,
                rule_12,
                allowance,
                live,
                has_ok,
            });
        }
        for (rows, keys) in &groups {
            judge.shared_rows(rows, keys, &judged);
        }
        judge.rule_13_findings(&nonidempotent);
        let Judge { f, tally, .. } = judge;
        let verdict = Verdict::valid_if(!INVALID.iter().any(|k| f.count(k) > 0));
        let classes = |c: Class| m.attempts.iter().filter(|a| a.class == c).count();
        let mut summary = json!({});
        summary["attempts"] = json!(m.attempts.len());
        summary["logical_inserts"] = json!(logical_inserts);
        summary["ok"] = json!(classes(Class::Ok));
        summary["fail"] = json!(classes(Class::Fail));
        summary["info"] = json!(classes(Class::Info));
        summary["keys"] = json!(m.keys.len());
        summary["replicas"] = json!(replicas);
        summary["exactly_once_per_replica"] = json!(tally.exact);
        summary["unknown_window"] = json!(tally.unknown_window);
        summary["retries_on_same_key"] = json!(tally.retries_on_same_key);
        summary["deduplicated_blocks"] = json!(m.deduplicated_blocks);
        summary["window"] = json!({"ids": params.window, "seconds": params.window_ns as f64 / 1e9, "epsilon_ms": params.epsilon_ns as f64 / 1e6, "stated": stated});
        // which bound rule 6 used, and for how many retried keys
        summary["bound"] = match &witness {
            Some(w) => json!({
                "kind": "witness",
                "keys_judged_by_witness": tally.by_witness,
                "keys_judged_from_the_client": tally.by_client,
                "witness_events": w.events,
                "block_ids": w.ids.len(),
                "removals_inside_the_window": w.premature,
            }),
            None => json!({
                "kind": "client",
                "why": if params.window == 0 { "no dedup window" } else { "no witness recorded (a coordinator other than drift's keeper, or a history from elsewhere)" },
                "keys_judged_from_the_client": tally.by_client,
                "info_ends": "the end of the history",
            }),
        };
        let first = INVALID
            .iter()
            .find_map(|k| f.listed.get(k).and_then(|l| l.first()))
            .and_then(|x| x.get("explanation").and_then(Value::as_str))
            .map(str::to_string);
        summary["counts"] = json!(f.counts);
        summary["findings"] = json!(f.listed);
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason: first,
            elapsed_ms: elapsed_ms(started),
            details: summary,
        })
    }
}
