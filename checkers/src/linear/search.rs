//! The linearizability search: depth-first, just-in-time, memoised.
//!
//! A *configuration* is (r, s, bits): the search has passed the first `r`
//! returns of ok ops, the model is in state `s`, and `bits` says which open
//! ok ops (by slot) and which indeterminate ops (by class prefix) are
//! already linearized. Every op returned before return `r` is linearized and
//! no op invoked after it is, so a configuration determines the set of
//! linearized ops: memoising configurations is WGL's memoisation of
//! (linearized set, state), and keeps it to the ops that can differ.
//!
//! From a configuration at return `r` (of op X, not yet linearized) the
//! search either linearizes X — moving to return r+1 — or first linearizes
//! another op that is open or indeterminate and already invoked (Lowe's
//! just-in-time linearization: an op is only placed when a return forces a
//! choice). X is tried first, so a linearizable history usually runs
//! straight through.
//!
//! Limits: the explicit stack and the memo table are the only growth; the
//! memo table's bytes are checked against `Limits::mem_bytes_max` and the
//! clock against `Limits::deadline`, and running out of either ends in
//! [`Outcome::Unknown`] with the reason, never an out-of-memory kill.
//!
//! What it does *not* verify: that the history is well formed (pairing and
//! shapes are checked before a problem is built), or anything across keys.

use super::memo::{Config, Insert, Memo};
use super::model::Model;
use super::problem::Problem;
use std::time::Instant;

/// Most configuration bits (open-op slots + indeterminate ops on one key)
/// a search handles. Each configuration stores them, so this bounds a memo
/// entry at 512 bytes; past it the answer is `unknown`, with this reason.
pub const CONFIG_BITS_MAX: usize = 4096;

/// How often (in configurations) the search looks at the clock.
const CLOCK_CHECK_EVERY: u64 = 1 << 10;

/// Most distinct model states remembered for the explanation of a failure.
const STATES_AT_FAILURE_MAX: usize = 32;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub deadline: Option<Instant>,
    pub mem_bytes_max: usize,
    /// Most configurations to explore (`u64::MAX`: no limit).
    pub configs_max: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Linearizable,
    /// No linearization passes return `deepest`; `states` are model states
    /// of configurations that reached it.
    NotLinearizable {
        deepest: u32,
        states: Vec<u32>,
    },
    Unknown {
        reason: String,
        deepest: u32,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Search {
    pub outcome: Outcome,
    pub configurations: u64,
    /// With `all_ends`, every distinct way the search passed every return.
    pub ends: Vec<Start>,
}

/// Where a search starts: a model state and the indeterminate ops (bit
/// indices into [`Problem::info_invoke`]) already used before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    pub state: u32,
    pub used: Vec<u32>,
}

/// Runs the search on `p` from each of `starts` (sharing one memo). With
/// `all_ends` it does not stop at the first linearization: it explores
/// every configuration and returns, in [`Search::ends`], each distinct way
/// to pass every return — the end state and the indeterminate ops used —
/// so a caller can carry them into the next part of the history.
pub(crate) fn search_from<M: Model>(
    p: &Problem,
    m: &mut M,
    starts: &[Start],
    limits: &Limits,
    all_ends: bool,
) -> Search {
    let words = p.bits().div_ceil(64);
    match words {
        0 | 1 => run::<M, 1>(p, m, starts, limits, all_ends),
        2 => run::<M, 2>(p, m, starts, limits, all_ends),
        3 | 4 => run::<M, 4>(p, m, starts, limits, all_ends),
        5..=8 => run::<M, 8>(p, m, starts, limits, all_ends),
        9..=16 => run::<M, 16>(p, m, starts, limits, all_ends),
        17..=32 => run::<M, 32>(p, m, starts, limits, all_ends),
        33..=64 => run::<M, 64>(p, m, starts, limits, all_ends),
        _ => Search {
            outcome: Outcome::Unknown {
                reason: format!(
                    "{} open and indeterminate operations on one key exceed the search's limit of {CONFIG_BITS_MAX} (CONFIG_BITS_MAX)",
                    p.bits()
                ),
                deepest: 0,
            },
            configurations: 0,
            ends: Vec::new(),
        },
    }
}

struct Frame<const W: usize> {
    config: Config<W>,
    /// Next candidate to try: 0 is the returning op, then the open ops,
    /// then the active classes.
    next: u32,
}

/// The deepest return configurations reached, and (some of) the states
/// they reached it in.
struct Deepest {
    r: u32,
    states: Vec<u32>,
}

impl Deepest {
    fn note(&mut self, r: u32, s: u32) {
        if r > self.r {
            self.r = r;
            self.states.clear();
        }
        if r == self.r && self.states.len() < STATES_AT_FAILURE_MAX && !self.states.contains(&s) {
            self.states.push(s);
        }
    }
}

fn run<M: Model, const W: usize>(p: &Problem, m: &mut M, starts: &[Start], limits: &Limits, all_ends: bool) -> Search {
    let n = p.returns.len() as u32;
    let mut memo: Memo<W> = Memo::new(p.n_slots);
    let frame_bytes = std::mem::size_of::<Frame<W>>();
    let mut stack: Vec<Frame<W>> = Vec::new();
    let mut configurations = 0u64;
    let mut deepest = Deepest {
        r: 0,
        states: Vec::new(),
    };
    let mut ends: Vec<Start> = Vec::new();
    let mut end_seen: std::collections::HashSet<(u32, [u64; W]), rustc_hash::FxBuildHasher> = Default::default();
    let info_bits = p.info_invoke.len() as u32;
    let unknown = |reason: String, deepest: &Deepest, configurations: u64| Search {
        outcome: Outcome::Unknown {
            reason,
            deepest: deepest.r,
        },
        configurations,
        ends: Vec::new(),
    };
    let mut starts = starts.iter();

    loop {
        // the next configuration: a start when the stack is empty, else
        // the top's next candidate
        let child = match stack.last_mut() {
            None => {
                let Some(start) = starts.next() else {
                    break;
                };
                let mut c = Config {
                    r: 0,
                    s: start.state,
                    bits: [0; W],
                };
                for &j in &start.used {
                    c = c.with(p.n_slots + j);
                }
                advance(p, c)
            }
            Some(top) => {
                let c = top.config;
                let ret = &p.returns[c.r as usize];
                let open = ret.pending.1 - ret.pending.0;
                let total = 1 + open + ret.classes_active;
                if top.next >= total {
                    stack.pop();
                    continue;
                }
                let k = top.next;
                top.next += 1;
                if k == 0 {
                    match m.step(c.s, ret.code) {
                        Some(s) => advance(p, Config { r: c.r + 1, s, ..c }),
                        None => continue,
                    }
                } else if k <= open {
                    let o = p.pending[(ret.pending.0 + k - 1) as usize];
                    if c.has(o.slot) {
                        continue;
                    }
                    match m.step(c.s, o.code) {
                        Some(s) => Config { s, ..c }.with(o.slot),
                        None => continue,
                    }
                } else {
                    let class = p.classes[(k - 1 - open) as usize];
                    let Some(j) = first_unused(&c, p.n_slots, class.start, class.end) else {
                        continue;
                    };
                    if p.info_invoke[j as usize] > ret.pos {
                        continue;
                    }
                    match m.step(c.s, class.code) {
                        Some(s) => Config { s, ..c }.with(p.n_slots + j),
                        None => continue,
                    }
                }
            }
        };

        deepest.note(child.r, child.s);
        if child.r == n {
            if !all_ends {
                return Search {
                    outcome: Outcome::Linearizable,
                    configurations,
                    ends,
                };
            }
            if end_seen.insert((child.s, child.bits)) {
                ends.push(Start {
                    state: child.s,
                    used: (0..info_bits).filter(|&j| child.has(p.n_slots + j)).collect(),
                });
            }
            continue;
        }
        match memo.insert(
            child,
            limits.mem_bytes_max.saturating_sub(stack.capacity() * frame_bytes),
        ) {
            Insert::New => {}
            Insert::Dominated => continue,
            Insert::Full => {
                return unknown(
                    format!(
                        "memory cap of {} MiB reached after {} configurations",
                        limits.mem_bytes_max >> 20,
                        memo.len()
                    ),
                    &deepest,
                    configurations,
                );
            }
        }
        configurations += 1;
        if configurations > limits.configs_max {
            return unknown(
                format!("configuration budget of {} exhausted", limits.configs_max),
                &deepest,
                configurations,
            );
        }
        if configurations.is_multiple_of(CLOCK_CHECK_EVERY) && past_deadline(limits) {
            return unknown("time budget exhausted".to_string(), &deepest, configurations);
        }
        stack.push(Frame { config: child, next: 0 });
    }
    if !ends.is_empty() {
        return Search {
            outcome: Outcome::Linearizable,
            configurations,
            ends,
        };
    }
    let mut states = deepest.states;
    states.sort_unstable();
    Search {
        outcome: Outcome::NotLinearizable {
            deepest: deepest.r,
            states,
        },
        configurations,
        ends,
    }
}

/// Moves past returns of ops that are already linearized, freeing their
/// slots, so every configuration in the memo sits at a return it must act on.
#[inline]
fn advance<const W: usize>(p: &Problem, mut c: Config<W>) -> Config<W> {
    while let Some(ret) = p.returns.get(c.r as usize) {
        if !c.has(ret.slot) {
            break;
        }
        c = c.without(ret.slot);
        c.r += 1;
    }
    c
}

/// The first member of a class not yet linearized (classes are used as
/// prefixes), as an index into the indeterminate ops.
#[inline]
fn first_unused<const W: usize>(c: &Config<W>, base: u32, start: u32, end: u32) -> Option<u32> {
    (start..end).find(|&j| !c.has(base + j))
}

fn past_deadline(limits: &Limits) -> bool {
    limits.deadline.is_some_and(|d| Instant::now() >= d)
}
