//! Explaining a violation: the smallest set of operations that cannot be
//! linearized.
//!
//! The shrink works on a *window* of the key's history: the ops invoked
//! after some cut (a point where no ok op was open) and before the failing
//! return, searched from a set of start states — either every state (the
//! window fails whatever came before it: its core stands on its own) or
//! the frontier the search carried to the cut (the core holds given the
//! history before the cut). The caller cuts the window at the failing
//! return: ops still open there are indeterminate, later ops gone. Its
//! cost is the window's, not the history's.
//!
//! Within the window it *weakens* ok ops — turns them into indeterminate
//! ones, or drops them if they are read-only — as long as the result stays
//! non-linearizable. Weakening only adds possible behaviours, so every
//! weakened window that fails proves the original fails too; the ok ops
//! that remain are the *core*: the operations whose observed results
//! cannot all hold, even letting every other operation of the window take
//! effect at any point after its invoke, or never. (Dropping an
//! indeterminate op would remove behaviours and prove nothing, so the
//! core's context keeps them.)
//!
//! The weakening runs ddmin-style over chunks, halving the chunk size, and
//! stops at `Limits` — an unfinished shrink leaves a larger, still valid
//! core and says how many of its ops were not yet tried alone.

use super::model::Model;
use super::problem::{LinOp, Problem};
use super::search::{search_from, Limits, Outcome, Search};
use super::segment::{starts_for, without_useless, Entry};

/// Most searches one explanation may run.
const SHRINK_SEARCHES_MAX: usize = 4000;
/// A trial may explore this many times the configurations of the search
/// on the unweakened prefix …
const TRIAL_CONFIGS_FACTOR: u64 = 32;
/// … and at least this many.
const TRIAL_CONFIGS_MIN: u64 = 100_000;

pub(crate) struct Shrunk {
    /// Ids (`LinOp::id`) of the ok ops that cannot all hold, ending with
    /// the op whose return the search could not pass.
    pub core: Vec<u32>,
    /// True when the shrink ran to the end: weakening any one core op
    /// (but the failing one) makes the rest linearizable.
    pub minimal: bool,
    /// Core ops (but the failing one) not yet shown to be needed when the
    /// shrink stopped: at most this many could still go. 0 when minimal.
    pub untried: usize,
}

/// Shrinks a failing window. `window` holds the ops, cut at the failing
/// return (which is its last); `failing` is the id of the ok op whose
/// return no linearization passes; `starts` the states (and indeterminate
/// ops already used, by id) the window may begin in. A window that does
/// not fail comes back whole and not minimal.
pub(crate) fn shrink<M: Model>(
    window: &[LinOp],
    failing: u32,
    starts: &[Entry],
    model: &mut M,
    limits: &Limits,
) -> Shrunk {
    let prefix = window;
    let mut candidates: Vec<usize> = prefix
        .iter()
        .enumerate()
        .filter(|&(_, op)| op.ret.is_some() && op.id != failing)
        .map(|(i, _)| i)
        .collect();
    let whole = |candidates: Vec<usize>| {
        let untried = candidates.len();
        let mut core: Vec<u32> = candidates.iter().map(|&c| prefix[c].id).collect();
        core.push(failing);
        Shrunk {
            core,
            minimal: false,
            untried,
        }
    };
    // Weakened ops add indeterminate ones, which can make a trial far
    // costlier than the original search: bound each trial, and count one
    // that runs out as "still linearizable" (the op stays in the core).
    let baseline = run(prefix, starts, model, limits);
    if !matches!(baseline.outcome, Outcome::NotLinearizable { .. }) {
        return whole(candidates);
    }
    let baseline = baseline.configurations;
    let trial = Limits {
        configs_max: baseline.saturating_mul(TRIAL_CONFIGS_FACTOR).max(TRIAL_CONFIGS_MIN),
        ..*limits
    };
    let mut cut_short = false;
    let mut searches = 0usize;
    let mut weakened = vec![false; prefix.len()];
    let mut chunk = (candidates.len() / 2).max(1);
    let mut minimal = false;
    // candidates shown needed by the current single-op pass
    let mut shown = 0usize;
    'outer: loop {
        let before = candidates.len();
        let mut i = 0;
        if chunk == 1 {
            shown = 0;
        }
        while i < candidates.len() {
            if searches >= SHRINK_SEARCHES_MAX || past(limits) {
                break 'outer;
            }
            let end = (i + chunk).min(candidates.len());
            for &c in &candidates[i..end] {
                weakened[c] = true;
            }
            searches += 1;
            let verdict = outcome(&weaken(prefix, &weakened), starts, model, &trial);
            cut_short |= verdict.is_none();
            if verdict == Some(true) {
                candidates.drain(i..end);
            } else {
                for &c in &candidates[i..end] {
                    weakened[c] = false;
                }
                if chunk == 1 && verdict.is_some() {
                    shown += 1;
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
    let untried = if minimal {
        0
    } else {
        candidates.len() - shown.min(candidates.len())
    };
    Shrunk {
        minimal,
        untried,
        ..whole(candidates)
    }
}

/// Searches `ops` from `starts`, stopping at the first linearization.
pub(crate) fn run<M: Model>(ops: &[LinOp], starts: &[Entry], model: &mut M, limits: &Limits) -> Search {
    let ops = without_useless(ops, model);
    let p = Problem::new(&ops);
    search_from(&p, model, &starts_for(&p, &ops, starts), limits, false)
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
fn outcome<M: Model>(ops: &[LinOp], starts: &[Entry], model: &mut M, limits: &Limits) -> Option<bool> {
    match run(ops, starts, model, limits).outcome {
        Outcome::NotLinearizable { .. } => Some(true),
        Outcome::Linearizable => Some(false),
        Outcome::Unknown { .. } => None,
    }
}

fn past(limits: &Limits) -> bool {
    limits.deadline.is_some_and(|d| std::time::Instant::now() >= d)
}
