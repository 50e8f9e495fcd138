//! Cheap proofs: violations one pass over a key's ops can prove, before
//! any search, each with a core of one operation.
//!
//! An op that needs the state to be v (a read of v, a cas expecting v)
//! takes effect before it returns. The state is v then only if v is where
//! every key starts, or an op leaving v (a write of v, a cas to v — `ok`
//! or indeterminate; `fail` ops are gone by now) took effect before, hence
//! was invoked before. So when v is not the initial state and
//! * no op leaves v: the op can never hold (`never-written`, or
//!   `cas-never-current` for a cas);
//! * every op leaving v was invoked after the op returned: it cannot hold
//!   either (`written-later`, or `cas-never-current`).
//!
//! Either way the op alone is a minimal core: letting it be indeterminate
//! removes the only claim that fails, and nothing else is needed to show
//! it. The ops that do leave v are named, as context, up to
//! [`WRITERS_SHOWN_MAX`].

use super::model::Shape;
use super::problem::LinOp;
use rustc_hash::FxBuildHasher as FxBuild;
use std::collections::HashMap;

/// Most ops leaving the value a proof lists beside it.
pub const WRITERS_SHOWN_MAX: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofKind {
    NeverWritten,
    WrittenLater,
    CasNeverCurrent,
}

impl ProofKind {
    pub fn name(self) -> &'static str {
        match self {
            ProofKind::NeverWritten => "never-written",
            ProofKind::WrittenLater => "written-later",
            ProofKind::CasNeverCurrent => "cas-never-current",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proof {
    pub kind: ProofKind,
    /// The op (an index into the key's ops) that cannot hold.
    pub op: u32,
    /// The first ops leaving the value it needs, by invoke.
    pub writers: Vec<u32>,
}

/// Planted faults for the tests that prove the tests can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProofPlant {
    #[default]
    None,
    /// Counts a writer invoked after the op was *invoked* (not returned)
    /// as too late.
    LaterThanInvoke,
    /// Forgets that every key starts at the initial state.
    IgnoreInit,
}

/// The proof with the earliest return among a key's ops (`shapes[i]` the
/// shape of `ops[i]`, every key starting at `init`), if one exists.
/// Needs every op's [`Shape`]; returns `None` for a key with opaque ops.
pub(crate) fn find(ops: &[LinOp], shapes: &[Shape], init: u32, plant: ProofPlant) -> Option<Proof> {
    if shapes.contains(&Shape::Opaque) {
        return None;
    }
    // per value: its first writers, by invoke
    let mut writers: HashMap<u32, Vec<u32>, FxBuild> = HashMap::default();
    let mut order: Vec<u32> = (0..ops.len() as u32).collect();
    order.sort_by_key(|&i| ops[i as usize].invoke);
    for &i in &order {
        if let Some(v) = shapes[i as usize].leaves() {
            let w = writers.entry(v).or_default();
            if w.len() < WRITERS_SHOWN_MAX {
                w.push(i);
            }
        }
    }
    let mut best: Option<(u64, Proof)> = None;
    for (i, (op, shape)) in ops.iter().zip(shapes).enumerate() {
        let (Some(ret), Some(v)) = (op.ret, shape.needs()) else {
            continue;
        };
        if v == init && plant != ProofPlant::IgnoreInit {
            continue;
        }
        let first = writers.get(&v);
        let bound = if plant == ProofPlant::LaterThanInvoke {
            op.invoke
        } else {
            ret
        };
        let kind = match first.and_then(|w| w.first()) {
            None => match shape {
                Shape::Cas(..) => ProofKind::CasNeverCurrent,
                _ => ProofKind::NeverWritten,
            },
            Some(&w) if ops[w as usize].invoke > bound => match shape {
                Shape::Cas(..) => ProofKind::CasNeverCurrent,
                _ => ProofKind::WrittenLater,
            },
            Some(_) => continue,
        };
        if best.as_ref().is_none_or(|(at, _)| ret < *at) {
            best = Some((
                ret,
                Proof {
                    kind,
                    op: i as u32,
                    writers: first.cloned().unwrap_or_default(),
                },
            ));
        }
    }
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::model::{CasRegister, Model};
    use serde_json::{json, Value};

    /// (f, value, invoke, return or None for indeterminate)
    fn ops(m: &mut CasRegister, spec: &[(&str, Value, u64, Option<u64>)]) -> Vec<LinOp> {
        spec.iter()
            .enumerate()
            .map(|(i, (f, v, invoke, ret))| LinOp {
                id: i as u32,
                invoke: *invoke,
                ret: *ret,
                code: m.encode(f, v).unwrap(),
                read_only: *f == "read",
            })
            .collect()
    }

    fn proof(spec: &[(&str, Value, u64, Option<u64>)]) -> Option<(ProofKind, u32, Vec<u32>)> {
        let mut m = CasRegister::new();
        let ops = ops(&mut m, spec);
        let shapes: Vec<Shape> = ops.iter().map(|o| m.shape(o.code)).collect();
        find(&ops, &shapes, m.init(), ProofPlant::None).map(|p| (p.kind, p.op, p.writers))
    }

    #[test]
    fn a_read_of_a_value_nothing_leaves() {
        let got = proof(&[("write", json!(1), 0, Some(1)), ("read", json!(2), 2, Some(3))]);
        assert_eq!(got, Some((ProofKind::NeverWritten, 1, vec![])));
    }

    #[test]
    fn a_read_whose_writers_all_start_after_it_returns() {
        let spec = [
            ("read", json!(5), 0, Some(1)),
            ("write", json!(5), 2, None),
            ("cas", json!([1, 5]), 3, Some(4)),
        ];
        assert_eq!(proof(&spec), Some((ProofKind::WrittenLater, 0, vec![1, 2])));
        // a writer invoked before the read returned could have come first
        let spec = [("read", json!(5), 0, Some(2)), ("write", json!(5), 1, Some(3))];
        assert_eq!(proof(&spec), None);
    }

    #[test]
    fn a_cas_expecting_a_value_never_current() {
        let spec = [("cas", json!([9, 1]), 0, Some(1)), ("read", json!(1), 2, Some(3))];
        assert_eq!(proof(&spec).map(|p| p.0), Some(ProofKind::CasNeverCurrent));
    }

    #[test]
    fn the_initial_state_needs_no_writer_and_the_earliest_return_wins() {
        let spec = [
            ("read", Value::Null, 0, Some(1)),
            ("read", json!(4), 5, Some(9)),
            ("read", json!(3), 6, Some(7)),
        ];
        assert_eq!(proof(&spec).map(|p| (p.0, p.1)), Some((ProofKind::NeverWritten, 2)));
    }
}
