//! Cut and carry: one key's history judged a part at a time.
//!
//! A *cut* is a point where no `ok` op of the key is open. Every ok op
//! invoked before it has returned, so every linearization of the history
//! before the cut has placed all of them; what it leaves for the rest is
//! only the model state and which indeterminate ops it has used. The
//! search of one part therefore starts from the *frontier* the part before
//! left — the distinct (state, used indeterminate ops) it can end in —
//! explores the part exhaustively, and hands on the frontier it can end
//! in. An empty frontier means no linearization passes the part: its
//! deepest return is the failing one. Memory is one part's memo, and a
//! failure never backtracks into the parts before it.
//!
//! Indeterminate ops would make the frontier grow with every `info` op the
//! history has accumulated (each used or not). Where the model says what
//! ops need and leave ([`Shape`]), two facts keep it small:
//!
//! * an indeterminate op that leaves value v only matters if some op
//!   needing v (a read of v, a cas expecting v) can come after it: the op
//!   placed right after it must accept v, so if none does, it is a blind
//!   write, the state is the same as if the indeterminate op had never
//!   been placed, and a linearization without it exists. An indeterminate
//!   op whose value no later op needs is dropped before the search.
//! * at a cut, the same holds looking forward: an indeterminate op whose
//!   value is needed by no op returning after the cut is *forgotten* —
//!   taken out of the live ops and of every frontier entry — so entries
//!   that differed only in it merge. (An indeterminate op needing a value
//!   keeps that value needed for good: a conservative choice that only
//!   forgets less.)
//!
//! Where the model cannot say (an append), nothing is dropped or
//! forgotten: the search is still exact, only larger.

use super::model::{Model, Shape};
use super::problem::{LinOp, Problem};
use super::search::{search_from, Limits, Outcome, Start};
use rustc_hash::FxBuildHasher as FxBuild;
use std::collections::HashMap;

/// Fewest ok ops a part holds before a cut ends it: small parts cost a
/// problem and a frontier each, large ones a larger exhaustive search.
pub const PART_OPS_MIN: usize = 64;

/// Most entries a frontier may hold; past it the key is `unknown`.
pub const FRONTIER_MAX: usize = 1 << 16;

/// A frontier entry: a state some linearization of the history before a
/// cut leaves, and the indeterminate ops (ids: indices into the key's ops)
/// it used. Sorted ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Entry {
    pub state: u32,
    pub used: Vec<u32>,
}

/// What the search of a key knows before it starts: parts, and when each
/// indeterminate op stops mattering.
pub(crate) struct Plan {
    /// Whether every op has a known [`Shape`] (then the dropping and
    /// forgetting above apply, and proofs and any-state windows may run).
    pub shapes_known: bool,
    /// Per op: for an indeterminate op, the position after which no op
    /// needing its value returns (`u64::MAX`: it matters for good;
    /// `0`: it never matters and is dropped). Unused for ok ops.
    pub matters_until: Vec<u64>,
    /// Ok ops (ids) of each part, in invoke order.
    pub parts: Vec<Vec<u32>>,
    /// The cut ending each part (its last return).
    pub cuts: Vec<u64>,
    /// Indeterminate ops that matter, in invoke order.
    pub info: Vec<u32>,
}

/// Lays out a key's ops (`ops[i].id == i`, `shapes[i]` the shape of
/// `ops[i]`) for the search.
pub(crate) fn plan(ops: &[LinOp], shapes: &[Shape], part_ops_min: usize) -> Plan {
    let shapes_known = !shapes.contains(&Shape::Opaque);
    let matters_until = if shapes_known {
        matters_until(ops, shapes)
    } else {
        vec![u64::MAX; ops.len()]
    };
    let mut info: Vec<u32> = (0..ops.len() as u32)
        .filter(|&i| ops[i as usize].ret.is_none() && matters_until[i as usize] > 0)
        .collect();
    info.sort_by_key(|&i| ops[i as usize].invoke);

    // parts: cut where no ok op is open, once a part holds enough ops
    let mut ok: Vec<u32> = (0..ops.len() as u32)
        .filter(|&i| ops[i as usize].ret.is_some())
        .collect();
    ok.sort_by_key(|&i| ops[i as usize].invoke);
    let mut parts = Vec::new();
    let mut cuts = Vec::new();
    let mut part: Vec<u32> = Vec::new();
    let mut last_return = 0u64;
    for (n, &i) in ok.iter().enumerate() {
        let op = &ops[i as usize];
        part.push(i);
        last_return = last_return.max(op.ret.expect("ok op"));
        let next_invoke = ok.get(n + 1).map(|&j| ops[j as usize].invoke);
        let quiet = next_invoke.is_none_or(|next| next > last_return);
        if quiet && (part.len() >= part_ops_min || next_invoke.is_none()) {
            parts.push(std::mem::take(&mut part));
            cuts.push(last_return);
        }
    }
    Plan {
        shapes_known,
        matters_until,
        parts,
        cuts,
        info,
    }
}

/// Per op: for an indeterminate op, the position after which no op
/// needing its value returns (`u64::MAX`: for good; `0`: never after its
/// invoke — it is useless); `u64::MAX` for ok ops. Needs every op's shape.
pub(crate) fn matters_until(ops: &[LinOp], shapes: &[Shape]) -> Vec<u64> {
    let mut out = vec![u64::MAX; ops.len()];
    // last return of an ok op needing each value
    let mut needed: HashMap<u32, u64, FxBuild> = HashMap::default();
    for (op, shape) in ops.iter().zip(shapes) {
        if let (Some(ret), Some(v)) = (op.ret, shape.needs()) {
            let e = needed.entry(v).or_insert(0);
            *e = (*e).max(ret);
        }
    }
    // indeterminate ops that matter keep what they need needed for good;
    // repeat until nothing changes (chains of indeterminate cas)
    loop {
        let mut changed = false;
        for (op, shape) in ops.iter().zip(shapes) {
            if op.ret.is_some() {
                continue;
            }
            let until = shape.leaves().and_then(|v| needed.get(&v).copied()).unwrap_or(0);
            if until > op.invoke {
                if let Some(v) = shape.needs() {
                    if needed.insert(v, u64::MAX) != Some(u64::MAX) {
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (i, (op, shape)) in ops.iter().zip(shapes).enumerate() {
        if op.ret.is_none() {
            let until = shape.leaves().and_then(|v| needed.get(&v).copied()).unwrap_or(0);
            out[i] = if until > op.invoke { until } else { 0 };
        }
    }
    out
}

/// `ops` without the indeterminate ops no op can need (see the module's
/// notes): the same verdict, a smaller search. Unchanged when an op's
/// shape is unknown.
pub(crate) fn without_useless<M: Model>(ops: &[LinOp], model: &M) -> Vec<LinOp> {
    let shapes: Vec<Shape> = ops.iter().map(|o| model.shape(o.code)).collect();
    if shapes.contains(&Shape::Opaque) {
        return ops.to_vec();
    }
    let until = matters_until(ops, &shapes);
    ops.iter().zip(until).filter(|(_, u)| *u > 0).map(|(o, _)| *o).collect()
}

/// The search of one key, part by part.
pub(crate) enum KeyOutcome {
    Linearizable,
    /// No linearization passes the return of `failing` (an op id), in
    /// part `part`; `frontier` is what the parts before it left, `states`
    /// the states linearizations reach just before the failing return.
    NotLinearizable {
        failing: u32,
        part: usize,
        frontier: Vec<Entry>,
        states: Vec<u32>,
    },
    Unknown {
        reason: String,
    },
}

pub(crate) struct KeySearch {
    pub outcome: KeyOutcome,
    pub configurations: u64,
}

/// Planted faults for the tests that prove the tests can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CarryPlant {
    #[default]
    None,
    /// Carry only the first way out of each part.
    FirstEndOnly,
    /// Forget indeterminate ops one part too early.
    ForgetEarly,
}

/// Searches a key part by part from the model's initial state.
pub(crate) fn search_key<M: Model>(
    ops: &[LinOp],
    plan: &Plan,
    model: &mut M,
    limits: &Limits,
    plant: CarryPlant,
) -> KeySearch {
    let mut frontier = vec![Entry {
        state: model.init(),
        used: Vec::new(),
    }];
    let mut live: Vec<u32> = Vec::new();
    let mut next_info = 0usize;
    let mut configurations = 0u64;
    for (k, part) in plan.parts.iter().enumerate() {
        let cut = plan.cuts[k];
        while next_info < plan.info.len() && ops[plan.info[next_info] as usize].invoke < cut {
            live.push(plan.info[next_info]);
            next_info += 1;
        }
        let local: Vec<LinOp> = part.iter().chain(&live).map(|&i| ops[i as usize]).collect();
        let p = Problem::new(&local);
        let starts = starts_for(&p, &local, &frontier);
        let s = search_from(&p, model, &starts, limits, true);
        configurations += s.configurations;
        match s.outcome {
            Outcome::Linearizable => {}
            Outcome::NotLinearizable { deepest, states } => {
                let failing = local[p.returns[deepest as usize].op as usize].id;
                return KeySearch {
                    outcome: KeyOutcome::NotLinearizable {
                        failing,
                        part: k,
                        frontier,
                        states,
                    },
                    configurations,
                };
            }
            Outcome::Unknown { reason, .. } => {
                return KeySearch {
                    outcome: KeyOutcome::Unknown { reason },
                    configurations,
                }
            }
        }
        // carry: forget what no later op can need, merge what is equal
        let forget_at = match plant {
            CarryPlant::ForgetEarly => plan.cuts.get(k + 1).copied().unwrap_or(u64::MAX),
            _ => cut,
        };
        live.retain(|&i| plan.matters_until[i as usize] > forget_at);
        let mut ends: Vec<Entry> = s
            .ends
            .iter()
            .map(|e| {
                let mut used: Vec<u32> = e
                    .used
                    .iter()
                    .map(|&j| local[p.info_op[j as usize] as usize].id)
                    .filter(|&i| plan.matters_until[i as usize] > forget_at)
                    .collect();
                used.sort_unstable();
                Entry { state: e.state, used }
            })
            .collect();
        if plant == CarryPlant::FirstEndOnly {
            ends.truncate(1);
        }
        frontier = minimal_entries(ends);
        if frontier.len() > FRONTIER_MAX {
            return KeySearch {
                outcome: KeyOutcome::Unknown {
                    reason: format!(
                        "{} ways to be at the cut at history index {cut} exceed the frontier's limit of {FRONTIER_MAX}",
                        frontier.len()
                    ),
                },
                configurations,
            };
        }
    }
    KeySearch {
        outcome: KeyOutcome::Linearizable,
        configurations,
    }
}

/// Frontier entries as search starts of problem `p`, built from `ops`.
/// Used ops that are not in the problem are gone for good.
pub(crate) fn starts_for(p: &Problem, ops: &[LinOp], entries: &[Entry]) -> Vec<Start> {
    if entries.iter().all(|e| e.used.is_empty()) {
        return entries
            .iter()
            .map(|e| Start {
                state: e.state,
                used: Vec::new(),
            })
            .collect();
    }
    let mut bit_of: HashMap<u32, u32, FxBuild> = HashMap::with_capacity_and_hasher(p.info_op.len(), FxBuild);
    for (j, &local) in p.info_op.iter().enumerate() {
        bit_of.insert(ops[local as usize].id, j as u32);
    }
    entries
        .iter()
        .map(|e| Start {
            state: e.state,
            used: e.used.iter().filter_map(|i| bit_of.get(i).copied()).collect(),
        })
        .collect()
}

/// Keeps, per state, only the entries no other entry dominates (one with
/// a subset of its used ops leaves every option it has).
fn minimal_entries(mut ends: Vec<Entry>) -> Vec<Entry> {
    ends.sort_by(|a, b| {
        a.state
            .cmp(&b.state)
            .then(a.used.len().cmp(&b.used.len()))
            .then(a.used.cmp(&b.used))
    });
    ends.dedup();
    let mut out: Vec<Entry> = Vec::with_capacity(ends.len());
    let mut group_start = 0usize;
    for e in ends {
        if out.last().is_some_and(|l| l.state != e.state) {
            group_start = out.len();
        }
        let dominated = out[group_start..].iter().any(|o| is_subset(&o.used, &e.used));
        if !dominated {
            out.push(e);
        }
    }
    out
}

fn is_subset(small: &[u32], big: &[u32]) -> bool {
    let mut it = big.iter();
    small.iter().all(|x| it.by_ref().any(|y| y == x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dominated_entries_go() {
        let e = |state, used: &[u32]| Entry {
            state,
            used: used.to_vec(),
        };
        let got = minimal_entries(vec![e(1, &[2, 3]), e(1, &[3]), e(2, &[2, 3]), e(1, &[4]), e(1, &[3])]);
        assert_eq!(got, vec![e(1, &[3]), e(1, &[4]), e(2, &[2, 3])]);
        assert!(is_subset(&[], &[1]));
        assert!(!is_subset(&[2], &[1, 3]));
    }
}
