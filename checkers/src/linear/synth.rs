//! Long cas-register histories with a known verdict, for benchmarks.
//!
//! Processes act on registers (one per key) with real linearization
//! points: each op is invoked, takes effect at a point strictly inside its
//! span — reads see the register there, a cas succeeds there or fails —
//! and returns later. The history is therefore linearizable by
//! construction. Every write and cas leaves a value no other op leaves,
//! so one changed result makes a violation whose reason is known:
//!
//! * `stale-read`: a read returns the value an ok write had overwritten
//!   before the read was invoked (the overwritten value's writer returned
//!   before the overwriting one was invoked, so their order is fixed);
//! * `never-written`: a read returns a value no op leaves;
//! * `written-later`: a read returns the value of a write invoked only
//!   after the read returned;
//! * `impossible-cas`: a cas succeeds expecting a value no op leaves.
//!
//! Indeterminate ops are writes and cases that end `info`: they take
//! effect or not (half each), and their process is replaced, as a crashed
//! client's is. The generator is a pure function of its spec.

use crate::history::{Op, OpType, Process};
use crate::rng::Rng;
use serde_json::{json, Value};
use std::collections::{BinaryHeap, VecDeque};

/// Which violation to put into a generated history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Inject {
    /// None: the history is linearizable.
    None,
    StaleRead,
    NeverWritten,
    WrittenLater,
    ImpossibleCas,
}

impl Inject {
    pub fn name(self) -> &'static str {
        match self {
            Inject::None => "none",
            Inject::StaleRead => "stale-read",
            Inject::NeverWritten => "never-written",
            Inject::WrittenLater => "written-later",
            Inject::ImpossibleCas => "impossible-cas",
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Operations (invoke + completion pairs) in all.
    pub ops: usize,
    pub keys: u32,
    /// Processes acting at once.
    pub processes: u32,
    /// Fraction of ops that end `info` (writes and cases only).
    pub info: f64,
    pub inject: Inject,
    /// Where the violation goes, as a fraction of the ops.
    pub at: f64,
    pub seed: u64,
}

/// A generated history and where its violation is.
pub struct Generated {
    pub ops: Vec<Op>,
    /// History index of the injected op's completion, if one was injected.
    pub injected: Option<u64>,
    /// Its key.
    pub injected_key: Option<String>,
}

/// Uniform in 0..n by remainder — not [`Rng::below`], so that every
/// seed's history stays the one BENCHMARKS.md measured.
fn below(rng: &mut Rng, n: u64) -> u64 {
    rng.next_u64() % n.max(1)
}

/// True with probability `p`.
fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.unit() > 1.0 - p
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write(u64),
    Cas(u64, u64),
}

/// One op in flight.
struct Flight {
    process: u64,
    key: u32,
    kind: Kind,
    invoke_time: i64,
    /// Ends `info`.
    info: bool,
    /// Set at the linearization point: what a read saw, whether a cas
    /// succeeded (an info op: whether it took effect).
    seen: u64,
    ok: bool,
}

/// A change of one register: the value, its writer's invoke and return
/// times and whether the writer is ok.
#[derive(Clone, Copy)]
struct Change {
    value: u64,
    invoked: i64,
    returned: Option<i64>,
}

/// Value 0 stands for `null`, what every register starts with.
const NULL: u64 = 0;

fn json_value(v: u64) -> Value {
    if v == NULL {
        Value::Null
    } else {
        json!(v)
    }
}

/// Generates the history `spec` describes.
pub fn generate(spec: &Spec) -> Generated {
    let mut rng = Rng::new(spec.seed ^ 0x05ee_d0fd_21f7);
    let keys = spec.keys.max(1);
    let procs = spec.processes.max(1);
    // events: (Reverse(time), Reverse(seq), slot, phase) — phase 0 invoke,
    // 1 linearization point, 2 completion
    let mut heap: BinaryHeap<(std::cmp::Reverse<i64>, std::cmp::Reverse<u64>, u32, u8)> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut slots: Vec<Option<Flight>> = (0..procs).map(|_| None).collect();
    let mut process_of: Vec<u64> = (0..procs as u64).collect();
    let mut next_process = procs as u64;
    for slot in 0..procs {
        heap.push((
            std::cmp::Reverse(below(&mut rng, 20) as i64),
            std::cmp::Reverse(seq),
            slot,
            0,
        ));
        seq += 1;
    }
    let mut state = vec![NULL; keys as usize];
    let mut next_value = vec![1u64; keys as usize];
    // recent changes per key, oldest first
    let mut changes: Vec<VecDeque<Change>> = (0..keys).map(|_| VecDeque::new()).collect();
    let mut out: Vec<Op> = Vec::with_capacity(spec.ops * 2);
    let mut invoked = 0usize;
    let inject_from = (spec.ops as f64 * spec.at) as usize;
    let mut injected: Option<u64> = None;
    let mut injected_key = None;
    let mut completed = 0usize;
    while let Some((std::cmp::Reverse(time), _, slot, phase)) = heap.pop() {
        let push = |out: &mut Vec<Op>, p: u64, kind: OpType, f: &str, value: Value, key: u32| {
            out.push(Op {
                index: out.len() as u64,
                time,
                process: Process::Client(p),
                kind,
                f: f.into(),
                value,
                key: Some(key.to_string().into()),
                node: None,
                error: None,
            });
        };
        match phase {
            0 => {
                if invoked >= spec.ops {
                    continue;
                }
                invoked += 1;
                let key = below(&mut rng, keys as u64) as u32;
                let k = key as usize;
                let roll = below(&mut rng, 100);
                let take = |next_value: &mut Vec<u64>| {
                    let v = next_value[k];
                    next_value[k] += 1;
                    v
                };
                let kind = if roll < 50 {
                    Kind::Read
                } else if roll < 75 {
                    Kind::Write(take(&mut next_value))
                } else {
                    // mostly the value the register holds now
                    let expected = if chance(&mut rng, 0.8) {
                        state[k]
                    } else {
                        changes[k].back().map(|c| c.value).unwrap_or(NULL)
                    };
                    Kind::Cas(expected, take(&mut next_value))
                };
                // writes and cases are half the ops: twice the rate among them
                let info = kind != Kind::Read && chance(&mut rng, spec.info * 2.0);
                let p = process_of[slot as usize];
                let (f, value) = match kind {
                    Kind::Read => ("read", Value::Null),
                    Kind::Write(v) => ("write", json!(v)),
                    Kind::Cas(e, n) => ("cas", json!([json_value(e), n])),
                };
                push(&mut out, p, OpType::Invoke, f, value, key);
                slots[slot as usize] = Some(Flight {
                    process: p,
                    key,
                    kind,
                    invoke_time: time,
                    info,
                    seen: NULL,
                    ok: true,
                });
                let at = time + 1 + below(&mut rng, 100) as i64;
                heap.push((std::cmp::Reverse(at), std::cmp::Reverse(seq), slot, 1));
                seq += 1;
            }
            1 => {
                let fl = slots[slot as usize].as_mut().expect("in flight");
                let k = fl.key as usize;
                let takes_effect = !fl.info || chance(&mut rng, 0.5);
                let changed = match fl.kind {
                    Kind::Read => {
                        fl.seen = state[k];
                        false
                    }
                    Kind::Write(_) => takes_effect,
                    Kind::Cas(e, _) => {
                        fl.ok = state[k] == e;
                        fl.ok && takes_effect
                    }
                };
                if let (true, Kind::Write(v) | Kind::Cas(_, v)) = (changed, fl.kind) {
                    state[k] = v;
                    changes[k].push_back(Change {
                        value: v,
                        invoked: fl.invoke_time,
                        returned: None,
                    });
                    if changes[k].len() > 64 {
                        changes[k].pop_front();
                    }
                }
                let at = time + 1 + below(&mut rng, 100) as i64;
                heap.push((std::cmp::Reverse(at), std::cmp::Reverse(seq), slot, 2));
                seq += 1;
            }
            _ => {
                let fl = slots[slot as usize].take().expect("in flight");
                let k = fl.key as usize;
                let p = fl.process;
                completed += 1;
                let outcome = if fl.info {
                    OpType::Info
                } else if fl.ok {
                    OpType::Ok
                } else {
                    OpType::Fail
                };
                let mut kind = fl.kind;
                let mut seen = fl.seen;
                let mut rewrite_invoke = false;
                if injected.is_none() && completed >= inject_from && outcome == OpType::Ok {
                    match (spec.inject, kind) {
                        (Inject::StaleRead, Kind::Read) => {
                            if let Some(v) = stale_value(&changes[k], fl.invoke_time, seen) {
                                seen = v;
                                injected = Some(out.len() as u64);
                            }
                        }
                        (Inject::NeverWritten, Kind::Read) => {
                            seen = u64::MAX / 2;
                            injected = Some(out.len() as u64);
                        }
                        (Inject::WrittenLater, Kind::Read) => {
                            // the next value this key hands out goes to an
                            // op invoked after now
                            seen = next_value[k];
                            injected = Some(out.len() as u64);
                        }
                        (Inject::ImpossibleCas, Kind::Cas(_, n)) => {
                            kind = Kind::Cas(u64::MAX / 2 + 1, n);
                            rewrite_invoke = true;
                            injected = Some(out.len() as u64);
                        }
                        _ => {}
                    }
                    if injected.is_some() {
                        injected_key = Some(fl.key.to_string());
                    }
                }
                let (f, value) = match kind {
                    Kind::Read => ("read", json_value(seen)),
                    Kind::Write(v) => ("write", json!(v)),
                    Kind::Cas(e, n) => ("cas", json!([json_value(e), n])),
                };
                // an injected cas shows its changed expectation at the
                // invoke too
                if rewrite_invoke {
                    let inv = out
                        .iter()
                        .rposition(|o| o.process == Process::Client(p) && o.kind == OpType::Invoke)
                        .expect("its invoke");
                    out[inv].value = value.clone();
                }
                push(&mut out, p, outcome, f, value, fl.key);
                // record the change this op made, if it made one
                if let Kind::Write(v) | Kind::Cas(_, v) = fl.kind {
                    if fl.ok {
                        let c = &mut changes[k];
                        if let Some(ch) = c.iter_mut().rev().find(|ch| ch.value == v) {
                            ch.returned = (!fl.info).then_some(time);
                        }
                    }
                }
                if fl.info {
                    process_of[slot as usize] = next_process;
                    next_process += 1;
                }
                let at = time + below(&mut rng, 20) as i64;
                heap.push((std::cmp::Reverse(at), std::cmp::Reverse(seq), slot, 0));
                seq += 1;
            }
        }
    }
    Generated {
        ops: out,
        injected,
        injected_key,
    }
}

/// A value the register held before an ok write overwrote it, both
/// writers having returned in order before `read_invoked`: a read invoked
/// then cannot see it. Not `current`.
fn stale_value(changes: &VecDeque<Change>, read_invoked: i64, current: u64) -> Option<u64> {
    let v: Vec<&Change> = changes.iter().collect();
    for w in v.windows(2).rev() {
        let (old, new) = (w[0], w[1]);
        let (Some(old_ret), Some(new_ret)) = (old.returned, new.returned) else {
            continue;
        };
        if new_ret < read_invoked && old_ret < new.invoked && old.value != current {
            return Some(old.value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(inject: Inject) -> Spec {
        Spec {
            ops: 5_000,
            keys: 4,
            processes: 8,
            info: 0.01,
            inject,
            at: 0.5,
            seed: 7,
        }
    }

    #[test]
    fn same_spec_same_history() {
        let a = generate(&spec(Inject::StaleRead));
        let b = generate(&spec(Inject::StaleRead));
        assert_eq!(a.ops, b.ops);
        assert!(a.injected.is_some());
        let c = generate(&Spec {
            seed: 8,
            ..spec(Inject::StaleRead)
        });
        assert_ne!(a.ops, c.ops);
    }

    #[test]
    fn histories_pair_and_hold_what_was_asked() {
        let g = generate(&spec(Inject::None));
        assert!(g.injected.is_none());
        let h = crate::pairing::History::from_ops(
            std::path::Path::new("synth"),
            g.ops.clone(),
            (1..=g.ops.len() as u64).collect(),
        )
        .expect("pairs");
        assert_eq!(h.operations.len(), 5_000);
        let info = h.operations.iter().filter(|o| o.outcome.is_indeterminate()).count();
        assert!((10..=120).contains(&info), "{info} info ops");
    }
}
