//! The `linearizable` checker: is there a total order of the operations,
//! consistent with real time, that a single copy of the model explains?
//!
//! Keys are independent (P-compositionality: a history is linearizable iff
//! each key's sub-history is), so each key is searched on its own and the
//! verdicts compose. Per key the semantics are those of docs/ARCHITECTURE.md, "History": `fail` did not
//! happen; `info` or no completion may take effect any time after its
//! invoke, or never; the register starts at `null`.
//!
//! Per key, in order: the cheap proofs (one pass; a read or cas needing a
//! value no op could have left by then), then the search part by part
//! (cut where no ok op is open, carrying the possible states across), then
//! for a failure the shrink of a window around the failing return. Keys
//! run in parallel (`CheckContext::jobs`), each with a fair share of the
//! time budget, so one hard key never turns another `unknown`.
//!
//! # Layout
//! * `model` — sequential specifications (cas-register, kv)
//! * `problem` — a key's ops laid out for the search
//! * `search` — the memoised depth-first just-in-time search
//! * `segment` — cutting a key's history into parts, carrying frontiers
//! * `proofs` — violations one pass proves
//! * `explain` — shrinking a failure to the ops that cannot all hold
//! * `synth` — long generated histories with known verdicts (benchmarks)

mod explain;
mod memo;
pub mod model;
mod problem;
pub mod proofs;
mod search;
pub mod segment;
pub mod synth;

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::HistoryError;
use crate::pairing::{History, Outcome};
use model::{CasRegister, Kv, Model, ModelKind, Shape};
use problem::LinOp;
use proofs::{Proof, ProofPlant};
use search::{Limits, Outcome as SearchOutcome};
use segment::{CarryPlant, Entry, KeyOutcome, Plan};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// `f(i, items[i])` for every item, on up to `jobs` threads taking items
/// in order (on this thread when `jobs` is 1); results in item order.
fn in_parallel<T: Send, R: Send>(items: Vec<T>, jobs: usize, f: impl Fn(usize, T) -> R + Sync) -> Vec<R> {
    let jobs = jobs.clamp(1, items.len().max(1));
    if jobs == 1 {
        return items.into_iter().enumerate().map(|(i, t)| f(i, t)).collect();
    }
    let n = items.len();
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = slots.get(i) else {
            return;
        };
        let item = slot
            .lock()
            .expect("no worker panics holding a lock")
            .take()
            .expect("each item is taken once");
        let r = f(i, item);
        results.lock().expect("no worker panics holding a lock")[i] = Some(r);
    };
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(work);
        }
    });
    results
        .into_inner()
        .expect("no worker panicked holding a lock")
        .into_iter()
        .map(|r| r.expect("every item done"))
        .collect()
}

/// Longest one explanation may shrink for; past it the core is reported
/// as found so far (still valid, perhaps not minimal).
pub const EXPLAIN_TIME_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// Most failing keys explained in detail; the others are only listed.
/// Each explanation runs many small searches.
pub const EXPLAINED_KEYS_MAX: usize = 4;

/// Most ok ops a window judged from every state may hold; past it the
/// explanation keeps the window the search carried states into.
pub const ANY_STATE_WINDOW_OPS_MAX: usize = 4096;

/// Knobs the tests turn: part size, and planted faults that prove the
/// tests of each path can fail. The default is what users run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    /// Fewest ok ops per part ([`segment::PART_OPS_MIN`] when `None`).
    pub part_ops_min: Option<usize>,
    /// Skip the cheap proofs (the search must then find the same).
    pub no_proofs: bool,
    /// Skip the whole-key search that runs before the parts (so the parts
    /// judge every key).
    pub parts_only: bool,
    pub plant: Plant,
}

/// A fault planted in one path of the checker, for tests only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Plant {
    #[default]
    None,
    Proof(ProofPlant),
    Carry(CarryPlant),
    /// Windows judged "from every state" start from the initial state only.
    WindowFromInitOnly,
}

/// The checker, for one model.
pub struct Linearizable {
    pub model: ModelKind,
    /// Shrink failures to a minimal core and describe them.
    pub explain: bool,
    /// What every key holds before the first operation (`null`: nothing).
    /// A cas-register starts at any JSON value (Knossos's
    /// `(cas-register 0)` is `0`); a kv key at a string (Porcupine's
    /// key/value histories start every key at `""`) or `null`, absent.
    pub init: serde_json::Value,
    pub tuning: Tuning,
}

impl Linearizable {
    pub fn new(model: ModelKind, explain: bool, init: serde_json::Value) -> Self {
        Linearizable {
            model,
            explain,
            init,
            tuning: Tuning::default(),
        }
    }
}

/// One operation as a report shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRef {
    pub process: String,
    pub f: String,
    /// The op as the model reads it, e.g. `cas 1 → 2`.
    pub desc: String,
    pub outcome: String,
    pub invoke_index: u64,
    pub invoke_time: i64,
    #[serde(default)]
    pub complete_index: Option<u64>,
    #[serde(default)]
    pub complete_time: Option<i64>,
    /// The invoke's line in the history file.
    pub line: u64,
    /// The completion's line, if it has one.
    #[serde(default)]
    pub complete_line: Option<u64>,
}

/// Why one key is not linearizable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    pub key: Option<String>,
    /// The op whose return no linearization passes.
    pub failing: OpRef,
    /// Ok ops whose results cannot all hold (including `failing`).
    pub core: Vec<OpRef>,
    /// Whether the core is minimal: letting any one core op but `failing`
    /// be indeterminate makes the rest linearizable.
    pub minimal: bool,
    /// When not minimal: how many core ops (at most) could still go — the
    /// ones the shrink had not shown to be needed when it stopped.
    #[serde(default)]
    pub untried: usize,
    /// The one-pass proof that found it (`never-written`,
    /// `written-later`, `cas-never-current`), or `None` for the search.
    #[serde(default)]
    pub proof: Option<String>,
    /// The core was judged on the ops invoked after this history index
    /// (a point where no ok op of the key was open); `None`: from the
    /// history's start.
    #[serde(default)]
    pub after_index: Option<u64>,
    /// Whether that window fails from every state (the core stands on its
    /// own) rather than from the states the history before leaves
    /// (`window_states`).
    #[serde(default)]
    pub any_state: bool,
    /// The states the history before `after_index` can leave, when the
    /// core depends on them.
    #[serde(default)]
    pub window_states: Vec<String>,
    /// History index of the failing return: the longest linearizable
    /// prefix is everything before it.
    pub prefix_end_index: u64,
    pub prefix_end_time: i64,
    /// Model states some linearization of the prefix reaches there.
    pub states: Vec<String>,
    /// Every op of the key that overlaps the core's time window.
    pub window: Vec<OpRef>,
    pub explanation: String,
}

/// Details of a `linearizable` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearReport {
    pub model: String,
    pub keys: usize,
    pub keys_invalid: usize,
    pub keys_unknown: usize,
    pub configurations: u64,
    /// Keys a cheap proof decided (no search needed).
    #[serde(default)]
    pub keys_proved: usize,
    /// Parts the searched keys were cut into.
    #[serde(default)]
    pub parts: usize,
    /// Time spent explaining violations, in ms (part of the check's).
    #[serde(default)]
    pub explain_ms: f64,
    /// Unknown keys and why (every one).
    pub unknown: Vec<(Option<String>, String)>,
    /// Failing keys, not explained beyond [`EXPLAINED_KEYS_MAX`].
    pub invalid_keys: Vec<Option<String>>,
    pub violations: Vec<Violation>,
}

impl Checker for Linearizable {
    fn name(&self) -> &str {
        "linearizable"
    }

    fn check(&self, history: &History, ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        match self.model {
            ModelKind::CasRegister => self.check_with(history, ctx, &|| CasRegister::with_init(&self.init)),
            ModelKind::Kv => match Kv::with_init(&self.init) {
                Ok(_) => self.check_with(history, ctx, &|| Kv::with_init(&self.init).expect("checked above")),
                Err(e) => Ok(CheckResult::unknown(
                    self.name(),
                    Instant::now(),
                    e,
                    serde_json::Value::Null,
                )),
            },
        }
    }
}

/// A key's ops, prepared: the search's ops and, for each, the index of its
/// operation in the history.
struct KeyOps {
    ops: Vec<LinOp>,
    operation: Vec<usize>,
}

/// What one key came to.
enum KeyVerdict<M> {
    Valid,
    Unknown(String),
    /// Kept for the explanation: the model (its codes), the ops, and how
    /// the key failed.
    Invalid(Box<Failed<M>>),
}

struct Failed<M> {
    model: M,
    prepared: KeyOps,
    how: How,
}

enum How {
    Proof(Proof),
    Search {
        plan: Plan,
        failing: u32,
        part: usize,
        frontier: Vec<Entry>,
        states: Vec<u32>,
    },
}

struct KeyDone<M> {
    verdict: KeyVerdict<M>,
    configurations: u64,
    proved: bool,
    parts: usize,
}

impl Linearizable {
    fn check_with<M: Model + Send>(
        &self,
        history: &History,
        ctx: &CheckContext,
        new_model: &(dyn Fn() -> M + Sync),
    ) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let groups: Vec<(Option<String>, Vec<usize>)> = history.by_key().into_iter().collect();
        let jobs = ctx.jobs.max(1).min(groups.len().max(1));
        let mem_per_job = ctx.mem_bytes_max / jobs;
        // one pass in history order (memory-friendly on long histories),
        // each key's ops through its own model
        let mut keyed: Vec<(M, KeyOps)> = groups
            .iter()
            .map(|(_, members)| {
                (
                    new_model(),
                    KeyOps {
                        ops: Vec::with_capacity(members.len()),
                        operation: Vec::with_capacity(members.len()),
                    },
                )
            })
            .collect();
        let mut group_of = vec![0u32; history.operations.len()];
        for (g, (_, members)) in groups.iter().enumerate() {
            for &i in members {
                group_of[i] = g as u32;
            }
        }
        for (i, &g) in group_of.iter().enumerate() {
            let (model, ops) = &mut keyed[g as usize];
            prepare_one(history, i, model, ops)?;
        }
        let keys = groups.len();
        let done = in_parallel(keyed, jobs, |i, (model, prepared)| {
            // a fair share of the time left: the keys not yet started
            // split it, `jobs` at a time
            let now = Instant::now();
            let deadline = ctx.deadline.map(|d| {
                let left = d.saturating_duration_since(now);
                let rounds = (keys - i).div_ceil(jobs) as u32;
                (now + left / rounds.max(1)).min(d)
            });
            let limits = Limits {
                deadline,
                mem_bytes_max: mem_per_job,
                configs_max: u64::MAX,
            };
            self.judge_key(prepared, model, &limits)
        });

        let mut report = LinearReport {
            model: self.model.name().to_string(),
            keys: groups.len(),
            keys_invalid: 0,
            keys_unknown: 0,
            configurations: 0,
            keys_proved: 0,
            parts: 0,
            explain_ms: 0.0,
            unknown: Vec::new(),
            invalid_keys: Vec::new(),
            violations: Vec::new(),
        };
        let mut to_explain = Vec::new();
        for ((key, _), r) in groups.into_iter().zip(done) {
            report.configurations += r.configurations;
            report.keys_proved += r.proved as usize;
            report.parts += r.parts;
            match r.verdict {
                KeyVerdict::Valid => {}
                KeyVerdict::Unknown(reason) => {
                    report.keys_unknown += 1;
                    report.unknown.push((key, reason));
                }
                KeyVerdict::Invalid(failed) => {
                    report.keys_invalid += 1;
                    if self.explain && to_explain.len() < EXPLAINED_KEYS_MAX {
                        to_explain.push((key, failed));
                    } else {
                        report.invalid_keys.push(key);
                    }
                }
            }
        }
        let limits = Limits {
            deadline: ctx.deadline,
            mem_bytes_max: mem_per_job,
            configs_max: u64::MAX,
        };
        let explaining = Instant::now();
        report.violations = in_parallel(to_explain, jobs, |_, (key, failed)| {
            self.explain_key(history, key, *failed, &limits)
        });
        report.explain_ms = elapsed_ms(explaining);

        let (verdict, reason) = if report.keys_invalid > 0 {
            let first = match report.violations.first() {
                Some(v) => format!(
                    "; the first: key {}, {} {} ({} at line {}, invoked at line {}) returns what no order of the ops before it allows",
                    v.key.as_deref().unwrap_or("unkeyed"),
                    v.failing.process,
                    v.failing.desc,
                    v.failing.outcome,
                    v.failing.complete_line.unwrap_or(v.failing.line),
                    v.failing.line
                ),
                None => report
                    .invalid_keys
                    .first()
                    .map(|k| format!("; the first: key {}", k.as_deref().unwrap_or("unkeyed")))
                    .unwrap_or_default(),
            };
            (
                Verdict::Invalid,
                Some(format!(
                    "{} of {} keys not linearizable{first}",
                    report.keys_invalid, report.keys
                )),
            )
        } else if report.keys_unknown > 0 {
            let names: Vec<String> = report
                .unknown
                .iter()
                .take(UNKNOWN_LISTED_MAX)
                .map(|(k, _)| k.clone().unwrap_or_else(|| "unkeyed".into()))
                .collect();
            let first = report.unknown.first().map(|(_, r)| r.clone()).unwrap_or_default();
            (
                Verdict::Unknown,
                Some(format!(
                    "{} of {} keys unknown ({}{}): {first}",
                    report.keys_unknown,
                    report.keys,
                    names.join(", "),
                    if report.keys_unknown > names.len() { ", …" } else { "" }
                )),
            )
        } else if report.keys == 0 {
            (Verdict::Unknown, Some("no operations: nothing to judge".to_string()))
        } else {
            (Verdict::Valid, None)
        };
        Ok(CheckResult {
            checker: self.name().to_string(),
            verdict,
            reason,
            elapsed_ms: elapsed_ms(started),
            details: serde_json::to_value(&report).expect("report serializes"),
        })
    }

    /// Proofs, then the search part by part, for one key.
    fn judge_key<M: Model>(&self, prepared: KeyOps, mut model: M, limits: &Limits) -> KeyDone<M> {
        let mut out = KeyDone {
            verdict: KeyVerdict::Valid,
            configurations: 0,
            proved: false,
            parts: 0,
        };
        if limits.deadline.is_some_and(|d| Instant::now() >= d) {
            out.verdict = KeyVerdict::Unknown("time budget exhausted before this key".into());
            return out;
        }
        let proof_plant = match self.tuning.plant {
            Plant::Proof(p) => p,
            _ => ProofPlant::None,
        };
        let shapes: Vec<Shape> = prepared.ops.iter().map(|o| model.shape(o.code)).collect();
        if !self.tuning.no_proofs {
            if let Some(proof) = proofs::find(&prepared.ops, &shapes, model.init(), proof_plant) {
                out.proved = true;
                out.verdict = KeyVerdict::Invalid(Box::new(Failed {
                    model,
                    prepared,
                    how: How::Proof(proof),
                }));
                return out;
            }
        }
        let carry_plant = match self.tuning.plant {
            Plant::Carry(p) => p,
            _ => CarryPlant::None,
        };
        let plan = segment::plan(
            &prepared.ops,
            &shapes,
            self.tuning.part_ops_min.unwrap_or(segment::PART_OPS_MIN),
        );
        drop(shapes);
        out.parts = plan.parts.len();
        // Fast path: one search of the whole key, stopping at the first
        // linearization, with a budget a linearizable history rarely
        // needs more of; parts cost more per op but bound a failure's.
        let mut whole_failed: Option<(u32, Vec<u32>)> = None;
        if carry_plant == CarryPlant::None && !self.tuning.parts_only {
            let kept: Vec<LinOp> = prepared
                .ops
                .iter()
                .filter(|o| plan.matters_until[o.id as usize] > 0)
                .copied()
                .collect();
            let p = problem::Problem::new(&kept);
            let fast = Limits {
                configs_max: (kept.len() as u64).saturating_mul(FAST_CONFIGS_PER_OP) + FAST_CONFIGS_MIN,
                ..*limits
            };
            let starts = [search::Start {
                state: model.init(),
                used: Vec::new(),
            }];
            let s = search::search_from(&p, &mut model, &starts, &fast, false);
            out.configurations += s.configurations;
            match s.outcome {
                SearchOutcome::Linearizable => return out,
                SearchOutcome::NotLinearizable { deepest, states } => {
                    whole_failed = Some((kept[p.returns[deepest as usize].op as usize].id, states));
                }
                SearchOutcome::Unknown { .. } => {}
            }
        }
        let s = segment::search_key(&prepared.ops, &plan, &mut model, limits, carry_plant);
        out.configurations += s.configurations;
        let (failing, part, frontier, states) = match s.outcome {
            KeyOutcome::Linearizable => return out,
            KeyOutcome::NotLinearizable {
                failing,
                part,
                frontier,
                states,
            } => (failing, part, frontier, states),
            // the whole-key search proved it: explain from the start
            KeyOutcome::Unknown { reason } => match whole_failed {
                Some((failing, states)) => {
                    let part = plan.parts.iter().position(|p| p.contains(&failing)).unwrap_or(0);
                    (failing, part, Vec::new(), states)
                }
                None => {
                    out.verdict = KeyVerdict::Unknown(reason);
                    return out;
                }
            },
        };
        out.verdict = KeyVerdict::Invalid(Box::new(Failed {
            model,
            prepared,
            how: How::Search {
                plan,
                failing,
                part,
                frontier,
                states,
            },
        }));
        out
    }
}

/// The fast whole-key search's budget: this many configurations per op …
const FAST_CONFIGS_PER_OP: u64 = 2;
/// … and this many more.
const FAST_CONFIGS_MIN: u64 = 10_000;

/// Most unknown keys named in the verdict's reason (the report lists all).
const UNKNOWN_LISTED_MAX: usize = 16;

/// Encodes operation `i` for its key's search: drops `fail` ops and
/// indeterminate reads, and rejects ops the model cannot read.
fn prepare_one<M: Model>(history: &History, i: usize, model: &mut M, out: &mut KeyOps) -> Result<(), HistoryError> {
    let o = &history.operations[i];
    let f = history.f_of(o);
    let read_only = model.is_read_only(f);
    let ret = match o.outcome {
        Outcome::Fail => return Ok(()),
        Outcome::Info | Outcome::Pending if read_only => return Ok(()),
        Outcome::Info | Outcome::Pending => None,
        Outcome::Ok => o.complete.map(|c| c as u64),
    };
    let at = if o.outcome == Outcome::Ok {
        o.complete.unwrap_or(o.invoke)
    } else {
        o.invoke
    };
    let code = model.encode(f, history.value_of(o)).map_err(|reason| HistoryError {
        at: history.location(at),
        reason,
    })?;
    out.ops.push(LinOp {
        id: out.ops.len() as u32,
        invoke: o.invoke as u64,
        ret,
        code,
        read_only,
    });
    out.operation.push(i);
    Ok(())
}

fn op_ref(history: &History, operation: usize, desc: String) -> OpRef {
    let o = &history.operations[operation];
    let inv = history.invoke_op(o);
    let comp = history.complete_op(o);
    OpRef {
        process: o.process.to_string(),
        f: inv.f.to_string(),
        desc,
        outcome: o.outcome.as_str().to_string(),
        invoke_index: inv.index,
        invoke_time: inv.time,
        complete_index: comp.map(|c| c.index),
        complete_time: comp.map(|c| c.time),
        line: history.lines[o.invoke],
        complete_line: o.complete.map(|c| history.lines[c]),
    }
}

/// An op the search never saw (failed, or an indeterminate read).
fn describe_raw(history: &History, operation: usize) -> String {
    let o = &history.operations[operation];
    format!("{} {}", history.f_of(o), history.value_of(o))
}

impl Linearizable {
    /// Writes up why a key fails: a proof's one op, or the shrunk core of
    /// a window around the failing return.
    fn explain_key<M: Model>(
        &self,
        history: &History,
        key: Option<String>,
        failed: Failed<M>,
        limits: &Limits,
    ) -> Violation {
        let Failed {
            mut model,
            prepared,
            how,
        } = failed;
        let cap = Instant::now() + EXPLAIN_TIME_MAX;
        let limits = Limits {
            deadline: Some(limits.deadline.map_or(cap, |d| d.min(cap))),
            ..*limits
        };
        let (plan, failing, part, frontier, states) = match how {
            How::Proof(proof) => return proof_violation(history, key, &prepared, &proof, &model),
            How::Search {
                plan,
                failing,
                part,
                frontier,
                states,
            } => (plan, failing, part, frontier, states),
        };
        let chosen = self.any_state_window(&prepared.ops, &plan, failing, part, &mut model, &limits);
        let from_any_state = chosen.is_some();
        let (from, starts) = match chosen {
            Some(c) => c,
            // no frontier carried there: the whole prefix, from the start
            None if frontier.is_empty() => (
                0,
                vec![Entry {
                    state: model.init(),
                    used: Vec::new(),
                }],
            ),
            None => (part, frontier),
        };
        let window = window_ops(&prepared.ops, &plan, from, failing);
        let shrunk = explain::shrink(&window, failing, &starts, &mut model, &limits);

        let as_ref = |i: u32, model: &M| {
            op_ref(
                history,
                prepared.operation[i as usize],
                model.show_op(prepared.ops[i as usize].code),
            )
        };
        let core: Vec<OpRef> = shrunk.core.iter().map(|&i| as_ref(i, &model)).collect();
        let failing_ref = as_ref(failing, &model);
        let states: Vec<String> = states.iter().map(|&s| model.show_state(s)).collect();
        let cut = prepared.ops[failing as usize].ret.expect("failing op is ok");
        let prefix_end = &history.ops[cut as usize];
        let after_index = (from > 0).then(|| plan.cuts[from - 1]);
        // from the start, the window's one state is the initial one
        let any_state = from_any_state && from > 0;
        let mut window_states: Vec<String> = Vec::new();
        if !from_any_state && from > 0 {
            for e in &starts {
                let text = model.show_state(e.state);
                if !window_states.contains(&text) {
                    window_states.push(text);
                }
            }
        }
        let lo = core.iter().map(|o| o.invoke_index).min().unwrap_or(0);
        let window_refs = overlapping(history, &key, &prepared, &model, lo, cut);
        let explanation = write_explanation(&Writeup {
            key: &key,
            failing: &failing_ref,
            core: &core,
            states: &states,
            minimal: shrunk.minimal,
            untried: shrunk.untried,
            after_index,
            any_state,
            window_states: &window_states,
        });
        Violation {
            key,
            failing: failing_ref,
            core,
            minimal: shrunk.minimal,
            untried: shrunk.untried,
            proof: None,
            after_index,
            any_state,
            window_states,
            prefix_end_index: prefix_end.index,
            prefix_end_time: prefix_end.time,
            states,
            window: window_refs,
            explanation,
        }
    }

    /// The shortest window (ending at the failing return, starting at a
    /// cut, doubling back part by part) that fails from every state: its
    /// first part index and its starts. `None` when the model cannot stand
    /// for every state, or no window short enough fails.
    fn any_state_window<M: Model>(
        &self,
        ops: &[LinOp],
        plan: &Plan,
        failing: u32,
        part: usize,
        model: &mut M,
        limits: &Limits,
    ) -> Option<(usize, Vec<Entry>)> {
        if !plan.shapes_known {
            return None;
        }
        let fresh = model.fresh_state()?;
        let init = model.init();
        let mut span = 1usize;
        loop {
            let from = (part + 1).saturating_sub(span);
            let window = window_ops(ops, plan, from, failing);
            if window.iter().filter(|o| o.ret.is_some()).count() > ANY_STATE_WINDOW_OPS_MAX {
                return None;
            }
            let starts: Vec<Entry> = if from == 0 || self.tuning.plant == Plant::WindowFromInitOnly {
                vec![Entry {
                    state: init,
                    used: Vec::new(),
                }]
            } else {
                let mut named: Vec<u32> = window
                    .iter()
                    .flat_map(|o| {
                        let shape = model.shape(o.code);
                        [shape.needs(), shape.leaves()]
                    })
                    .flatten()
                    .chain([fresh])
                    .collect();
                named.sort_unstable();
                named.dedup();
                named
                    .into_iter()
                    .map(|state| Entry {
                        state,
                        used: Vec::new(),
                    })
                    .collect()
            };
            match explain::run(&window, &starts, model, limits).outcome {
                SearchOutcome::NotLinearizable { .. } => return Some((from, starts)),
                SearchOutcome::Linearizable if from > 0 => span *= 2,
                _ => return None,
            }
        }
    }
}

/// The ops a window holds, cut at the failing return: ok ops invoked
/// after the cut that ends part `from - 1` (all, for part 0) and before
/// the failing return — those still open at it made indeterminate (or
/// dropped, if read-only) — and every indeterminate op invoked before the
/// failing return. The failing return is the window's last: a search of
/// it fails there or passes.
///
/// Indeterminate ops are kept even where the whole history has no use for
/// them (`Plan::matters_until`): the shrink weakens ok ops, and a weakened
/// op (an ok cas made indeterminate, free of its return) can need a value
/// only such an op leaves. Each trial drops what is useless to it.
fn window_ops(ops: &[LinOp], plan: &Plan, from: usize, failing: u32) -> Vec<LinOp> {
    let after = if from == 0 { None } else { Some(plan.cuts[from - 1]) };
    let end = ops[failing as usize].ret.expect("failing op is ok");
    ops.iter()
        .filter(|o| o.invoke < end)
        .filter_map(|o| match o.ret {
            Some(_) if after.is_some_and(|a| o.invoke <= a) => None,
            Some(r) if r > end => (!o.read_only).then_some(LinOp { ret: None, ..*o }),
            Some(_) => Some(*o),
            None => Some(*o),
        })
        .collect()
}

/// Every op of `key` overlapping positions `lo..=hi`, as a report shows it.
fn overlapping<M: Model>(
    history: &History,
    key: &Option<String>,
    prepared: &KeyOps,
    model: &M,
    lo: u64,
    hi: u64,
) -> Vec<OpRef> {
    let searched: std::collections::HashMap<usize, usize> =
        prepared.operation.iter().enumerate().map(|(j, &i)| (i, j)).collect();
    let mut window = Vec::new();
    for (i, o) in history.operations.iter().enumerate() {
        if o.invoke as u64 > hi {
            break;
        }
        let end = o.complete.map(|c| c as u64).unwrap_or(u64::MAX);
        if end < lo || history.invoke_op(o).key.as_deref() != key.as_deref() {
            continue;
        }
        let desc = match searched.get(&i) {
            Some(&j) => model.show_op(prepared.ops[j].code),
            None => describe_raw(history, i),
        };
        window.push(op_ref(history, i, desc));
    }
    window
}

/// A cheap proof as a violation: its op is the core.
fn proof_violation<M: Model>(
    history: &History,
    key: Option<String>,
    prepared: &KeyOps,
    proof: &Proof,
    model: &M,
) -> Violation {
    let as_ref = |i: u32| {
        op_ref(
            history,
            prepared.operation[i as usize],
            model.show_op(prepared.ops[i as usize].code),
        )
    };
    let op = as_ref(proof.op);
    let writers: Vec<OpRef> = proof.writers.iter().map(|&w| as_ref(w)).collect();
    let ret = prepared.ops[proof.op as usize].ret.expect("proofs are about ok ops");
    let prefix_end = &history.ops[ret as usize];
    let key_text = key.as_ref().map(|k| format!("key {k}: ")).unwrap_or_default();
    let mut t = String::new();
    use std::fmt::Write;
    let _ = writeln!(
        t,
        "{key_text}`{}` by process {} (history index {}, line {}) cannot have taken effect as observed ({}):",
        op.desc,
        op.process,
        op.complete_index.unwrap_or(op.invoke_index),
        op.complete_line.unwrap_or(op.line),
        proof.kind.name(),
    );
    if writers.is_empty() {
        let _ = writeln!(
            t,
            "  no operation of this key leaves the value it needs, and it is not what the key starts with."
        );
    } else {
        let _ = writeln!(
            t,
            "  the value it needs is not what the key starts with, and every operation leaving it was invoked after it returned (at index {ret}); the first:"
        );
    }
    for w in &writers {
        let _ = writeln!(
            t,
            "  line {:>6}  process {:>4}  {:<24} invoked at index {}",
            w.line, w.process, w.desc, w.invoke_index
        );
    }
    let window = overlapping(history, &key, prepared, model, op.invoke_index, ret);
    Violation {
        key,
        failing: op.clone(),
        core: vec![op],
        minimal: true,
        untried: 0,
        proof: Some(proof.kind.name().to_string()),
        after_index: None,
        any_state: true,
        window_states: Vec::new(),
        prefix_end_index: prefix_end.index,
        prefix_end_time: prefix_end.time,
        states: Vec::new(),
        window,
        explanation: t,
    }
}

struct Writeup<'a> {
    key: &'a Option<String>,
    failing: &'a OpRef,
    core: &'a [OpRef],
    states: &'a [String],
    minimal: bool,
    untried: usize,
    after_index: Option<u64>,
    any_state: bool,
    window_states: &'a [String],
}

/// The text a user reads first.
fn write_explanation(w: &Writeup) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    let key_text = w.key.as_ref().map(|k| format!("key {k}: ")).unwrap_or_default();
    let _ = writeln!(
        t,
        "{key_text}no linearization gets past the return of `{}` by process {} (history index {}; invoked at line {}).",
        w.failing.desc,
        w.failing.process,
        w.failing.complete_index.unwrap_or(w.failing.invoke_index),
        w.failing.line,
    );
    let _ = writeln!(
        t,
        "Just before that return, the linearizations of the prefix leave the state at one of: {}.",
        if w.states.is_empty() {
            "(none)".to_string()
        } else {
            w.states.join(", ")
        }
    );
    let context = match (w.after_index, w.any_state) {
        (None, _) => String::new(),
        (Some(i), true) => format!(" after history index {i} (whatever the state there)"),
        (Some(i), false) => format!(
            " after history index {i}, where every linearization of the history before leaves the state at one of: {}",
            w.window_states.join(", ")
        ),
    };
    let minimal = if w.minimal {
        " (a minimal set: let any one of them be indeterminate and the rest can)".to_string()
    } else {
        format!(
            " (not shown minimal: the shrink stopped with {} of them not yet tried alone)",
            w.untried
        )
    };
    let _ = writeln!(
        t,
        "{} cannot all have taken effect as observed{minimal}, even letting every other \
         operation{context} take effect at any point after its invocation, or never:",
        if w.core.len() == 1 {
            "This operation".to_string()
        } else {
            format!("These {} operations", w.core.len())
        },
    );
    for o in w.core {
        let _ = writeln!(
            t,
            "  line {:>6}  process {:>4}  {:<24} invoked at index {}, returned at {}",
            o.line,
            o.process,
            o.desc,
            o.invoke_index,
            o.complete_index.map(|c| c.to_string()).unwrap_or_else(|| "-".into())
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::CheckContext;
    use crate::pairing::History;

    fn test_history(lines: &[(u64, &str, &str, Value)]) -> History {
        History::from_script(lines).expect("valid test history")
    }
    use serde_json::{json, Value};

    fn verdict(model: ModelKind, lines: &[(u64, &str, &str, Value)]) -> Verdict {
        let h = test_history(lines);
        let c = Linearizable {
            model,
            explain: true,
            init: serde_json::Value::Null,
            tuning: Default::default(),
        };
        c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap().verdict
    }

    fn reg(lines: &[(u64, &str, &str, Value)]) -> Verdict {
        verdict(ModelKind::CasRegister, lines)
    }

    const N: Value = Value::Null;

    #[test]
    fn read_after_completed_write_must_see_it() {
        assert_eq!(
            reg(&[
                (0, "invoke", "write", json!(1)),
                (0, "ok", "write", json!(1)),
                (1, "invoke", "read", N),
                (1, "ok", "read", N),
            ]),
            Verdict::Invalid
        );
    }

    #[test]
    fn concurrent_read_may_see_either_value() {
        for seen in [N, json!(1)] {
            assert_eq!(
                reg(&[
                    (0, "invoke", "write", json!(1)),
                    (1, "invoke", "read", N),
                    (1, "ok", "read", seen.clone()),
                    (0, "ok", "write", json!(1)),
                ]),
                Verdict::Valid,
                "read of {seen}"
            );
        }
    }

    #[test]
    fn failed_write_did_not_happen() {
        assert_eq!(
            reg(&[
                (0, "invoke", "write", json!(1)),
                (0, "fail", "write", json!(1)),
                (1, "invoke", "read", N),
                (1, "ok", "read", json!(1)),
            ]),
            Verdict::Invalid
        );
    }

    #[test]
    fn info_write_may_take_effect_long_after_its_invoke_or_never() {
        let base = [
            (0, "invoke", "write", json!(1)),
            (0, "info", "write", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
        ];
        for (seen, want) in [
            (json!(1), Verdict::Valid),
            (json!(2), Verdict::Valid),
            (N, Verdict::Invalid),
        ] {
            let mut lines = base.to_vec();
            lines.push((2, "invoke", "read", N));
            lines.push((2, "ok", "read", seen.clone()));
            assert_eq!(reg(&lines), want, "read of {seen}");
        }
    }

    #[test]
    fn info_write_takes_effect_at_most_once() {
        // w1 (info), then w2 ok, read 1, then w2' ok, read 1 again: the one
        // indeterminate write cannot explain both reads.
        let lines = [
            (0, "invoke", "write", json!(1)),
            (0, "info", "write", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
            (2, "invoke", "read", N),
            (2, "ok", "read", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
            (2, "invoke", "read", N),
            (2, "ok", "read", json!(1)),
        ];
        assert_eq!(reg(&lines), Verdict::Invalid);
    }

    #[test]
    fn pending_invoke_counts_as_indeterminate() {
        assert_eq!(
            reg(&[
                (0, "invoke", "cas", json!([N, 5])),
                (1, "invoke", "read", N),
                (1, "ok", "read", json!(5)),
            ]),
            Verdict::Valid
        );
    }

    #[test]
    fn kv_append_order_is_checked() {
        let lines = [
            (0, "invoke", "append", json!("a")),
            (0, "ok", "append", json!("a")),
            (1, "invoke", "append", json!("b")),
            (1, "ok", "append", json!("b")),
            (2, "invoke", "get", N),
            (2, "ok", "get", json!("ba")),
        ];
        assert_eq!(verdict(ModelKind::Kv, &lines), Verdict::Invalid);
        let mut ok = lines.to_vec();
        ok[5].3 = json!("ab");
        assert_eq!(verdict(ModelKind::Kv, &ok), Verdict::Valid);
    }

    #[test]
    fn wrong_shape_for_the_model_is_an_input_error_naming_the_line() {
        let h = test_history(&[(0, "invoke", "cas", json!(3)), (0, "ok", "cas", json!(3))]);
        let c = Linearizable {
            model: ModelKind::CasRegister,
            explain: true,
            init: serde_json::Value::Null,
            tuning: Default::default(),
        };
        let e = c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap_err();
        assert_eq!(e.at.line, 2);
        assert!(e.reason.contains("[expected, new]"), "{}", e.reason);
    }

    #[test]
    fn violation_core_is_the_stale_read_and_the_writes() {
        let h = test_history(&[
            (0, "invoke", "write", json!(1)),
            (0, "ok", "write", json!(1)),
            (3, "invoke", "read", N),
            (3, "ok", "read", json!(1)),
            (1, "invoke", "write", json!(2)),
            (1, "ok", "write", json!(2)),
            (2, "invoke", "read", N),
            (2, "ok", "read", json!(1)),
        ]);
        let c = Linearizable {
            model: ModelKind::CasRegister,
            explain: true,
            init: serde_json::Value::Null,
            tuning: Default::default(),
        };
        let r = c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap();
        let report: LinearReport = serde_json::from_value(r.details).unwrap();
        let v = &report.violations[0];
        assert_eq!(v.failing.desc, "read → 1");
        assert_eq!(v.failing.invoke_index, 6);
        let core: Vec<&str> = v.core.iter().map(|o| o.desc.as_str()).collect();
        // Two minimal cores exist: with `write 1` indeterminate, the first
        // read of 1 still pins it before `write 2`.
        assert!(
            core == ["write 1", "write 2", "read → 1"] || core == ["read → 1", "write 2", "read → 1"],
            "{core:?}"
        );
        assert!(v.minimal);
        assert_eq!(v.states, ["2"]);
        assert_eq!(v.prefix_end_index, 7);
    }
}
