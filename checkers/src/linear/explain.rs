//! Explaining a violation: the smallest set of operations that cannot be
//! linearized.
//!
//! Start from the shortest failing prefix: the history cut at the return
//! the search could not pass (ops still open at the cut become
//! indeterminate, later ops vanish). Then *weaken* ok ops — turn them into
//! indeterminate ones, or drop them if they are read-only — as long as the
//! result stays non-linearizable. Weakening only adds possible behaviours,
//! so every weakened history that fails proves the original fails too; the
//! ok ops that remain are the *core*: the operations whose observed results
//! cannot all hold, even letting every other operation take effect at any
//! point after its invoke, or never. (Dropping an indeterminate op would
//! remove behaviours and prove nothing, so the core's context keeps them.)
//!
//! The weakening runs ddmin-style over chunks, halving the chunk size, and
//! stops at `Limits` — an unfinished shrink leaves a larger, still valid
//! core.

use super::model::Model;
use super::problem::{LinOp, Problem};
use super::search::{search, Limits, Outcome};

/// Most searches one explanation may run.
const SHRINK_SEARCHES_MAX: usize = 4000;
/// A trial may explore this many times the configurations of the search
/// on the unweakened prefix …
const TRIAL_CONFIGS_FACTOR: u64 = 32;
/// … and at least this many.
const TRIAL_CONFIGS_MIN: u64 = 100_000;

pub(crate) struct Shrunk {
    /// Indices into the caller's ops: the ok ops that cannot all hold,
    /// ending with the op whose return the search could not pass.
    pub core: Vec<usize>,
    /// Position (history index) of the failing return: the longest
    /// linearizable prefix ends just before it.
    pub cut: u64,
    /// True when the shrink ran to the end: weakening any one core op
    /// (but the failing one) makes the rest linearizable.
    pub minimal: bool,
}

/// Shrinks a failing history. `failing` is the index in `ops` of the ok op
/// whose return no linearization passes. Requires `ops[i].id == i`.
pub(crate) fn shrink<M: Model>(ops: &[LinOp], failing: usize, model: &mut M, limits: &Limits) -> Shrunk {
    debug_assert!(ops.iter().enumerate().all(|(i, op)| op.id as usize == i));
    let cut = ops[failing].ret.expect("the failing op is an ok op");
    let prefix = cut_at(ops, cut);
    let mut candidates: Vec<usize> = prefix
        .iter()
        .enumerate()
        .filter(|&(_, op)| op.ret.is_some() && op.id as usize != failing)
        .map(|(i, _)| i)
        .collect();
    let failing_in_prefix = prefix
        .iter()
        .position(|op| op.id == ops[failing].id)
        .expect("the failing op is in its own prefix");
    // Weakened ops add indeterminate ones, which can make a trial far
    // costlier than the original search: bound each trial, and count one
    // that runs out as "still linearizable" (the op stays in the core).
    let baseline = search(&Problem::new(&prefix), model, limits).configurations;
    let trial = Limits {
        configs_max: baseline.saturating_mul(TRIAL_CONFIGS_FACTOR).max(TRIAL_CONFIGS_MIN),
        ..*limits
    };
    let mut cut_short = false;
    let mut searches = 0usize;
    let mut weakened = vec![false; prefix.len()];
    let mut chunk = (candidates.len() / 2).max(1);
    let mut minimal = false;
    'outer: loop {
        let before = candidates.len();
        let mut i = 0;
        while i < candidates.len() {
            if searches >= SHRINK_SEARCHES_MAX || past(limits) {
                break 'outer;
            }
            let end = (i + chunk).min(candidates.len());
            for &c in &candidates[i..end] {
                weakened[c] = true;
            }
            searches += 1;
            let verdict = trial_outcome(&weaken(&prefix, &weakened), model, &trial);
            cut_short |= verdict.is_none();
            if verdict == Some(true) {
                candidates.drain(i..end);
            } else {
                for &c in &candidates[i..end] {
                    weakened[c] = false;
                }
                i = end;
            }
        }
        // At chunk size one, repeat until a pass removes nothing: then
        // weakening any single remaining op makes the rest linearizable.
        if chunk == 1 && candidates.len() == before {
            minimal = !cut_short;
            break;
        }
        chunk = (chunk / 2).max(1);
    }
    let mut core: Vec<usize> = candidates.iter().map(|&c| prefix[c].id as usize).collect();
    core.push(prefix[failing_in_prefix].id as usize);
    Shrunk { core, cut, minimal }
}

/// The history up to `cut`: ops invoked before it, those still open at it
/// made indeterminate (read-only ones dropped).
fn cut_at(ops: &[LinOp], cut: u64) -> Vec<LinOp> {
    ops.iter()
        .filter(|op| op.invoke < cut)
        .filter_map(|op| match op.ret {
            Some(r) if r > cut => (!op.read_only).then_some(LinOp { ret: None, ..*op }),
            _ => Some(*op),
        })
        .collect()
}

fn weaken(prefix: &[LinOp], weakened: &[bool]) -> Vec<LinOp> {
    prefix
        .iter()
        .zip(weakened)
        .filter_map(|(op, &w)| match (w, op.read_only) {
            (false, _) => Some(*op),
            (true, true) => None,
            (true, false) => Some(LinOp { ret: None, ..*op }),
        })
        .collect()
}

/// Some(true): still fails; Some(false): linearizable; None: ran out.
fn trial_outcome<M: Model>(ops: &[LinOp], model: &mut M, limits: &Limits) -> Option<bool> {
    match search(&Problem::new(ops), model, limits).outcome {
        Outcome::NotLinearizable { .. } => Some(true),
        Outcome::Linearizable => Some(false),
        Outcome::Unknown { .. } => None,
    }
}

fn past(limits: &Limits) -> bool {
    limits.deadline.is_some_and(|d| std::time::Instant::now() >= d)
}
