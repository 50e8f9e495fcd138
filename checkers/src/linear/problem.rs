//! The search problem for one key: the history's operations laid out for a
//! just-in-time linearizability search.
//!
//! * `ok` ops must take effect between their invoke and their return. The
//!   search visits their returns in history order; an ok op that is invoked
//!   but not returned yet holds a *slot*, and ops that are pending at the
//!   same time never share one, so a slot bit names exactly one op.
//! * Indeterminate ops (`info`, or no completion) may take effect at any
//!   point after their invoke, or never. Those with the same encoded op are
//!   interchangeable but for their invoke position, so they form a *class*
//!   ordered by invoke, and a search only ever uses a prefix of a class:
//!   using an earlier member instead of a later one is always possible.
//! * `fail` ops did not happen and indeterminate read-only ops constrain
//!   nothing: the caller drops both before building a problem.
//!
//! Positions are history indices: the history's line order is its real-time
//! order.

/// One operation handed to the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinOp {
    /// The caller's id for the op (reported back in results).
    pub id: u32,
    pub invoke: u64,
    /// Return position for an `ok` op; `None` for an indeterminate one.
    pub ret: Option<u64>,
    /// The model's code for the op.
    pub code: u32,
    /// The op never changes the state (an indeterminate one is dropped).
    pub read_only: bool,
}

/// A return event of an ok op: the search's unit of progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Return {
    /// Index into the caller's op list.
    pub op: u32,
    pub code: u32,
    pub slot: u32,
    pub pos: u64,
    /// Range in [`Problem::pending`] of the ok ops open at this return.
    pub pending: (u32, u32),
    /// Number of classes (a prefix of [`Problem::classes`]) with a member
    /// invoked before this return.
    pub classes_active: u32,
}

/// An ok op open (invoked, not returned) at some return event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub code: u32,
    pub slot: u32,
}

/// A class of interchangeable indeterminate ops: bits `start..end` of the
/// indeterminate part of a configuration, in invoke order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Class {
    pub code: u32,
    pub start: u32,
    pub end: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub returns: Vec<Return>,
    pub pending: Vec<Pending>,
    pub n_slots: u32,
    /// Invoke position of each indeterminate op, in bit order.
    pub info_invoke: Vec<u64>,
    /// Caller's index of each indeterminate op, in bit order.
    pub info_op: Vec<u32>,
    pub classes: Vec<Class>,
}

impl Problem {
    /// Lays out `ops`. Requires `invoke < ret` for every ok op and distinct
    /// positions (true of any validated history).
    pub fn new(ops: &[LinOp]) -> Problem {
        let (returns, pending, n_slots) = layout_ok_ops(ops);
        let mut p = Problem {
            returns,
            pending,
            n_slots,
            info_invoke: Vec::new(),
            info_op: Vec::new(),
            classes: Vec::new(),
        };
        p.layout_classes(ops);
        p
    }

    /// Bits a configuration needs: one per slot and one per indeterminate op.
    pub fn bits(&self) -> usize {
        self.n_slots as usize + self.info_invoke.len()
    }

    fn layout_classes(&mut self, ops: &[LinOp]) {
        let mut by_code: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, op) in ops.iter().enumerate() {
            if op.ret.is_none() {
                by_code.entry(op.code).or_default().push(i);
            }
        }
        let mut groups: Vec<(u32, Vec<usize>)> = by_code.into_iter().collect();
        for (_, members) in groups.iter_mut() {
            members.sort_by_key(|&i| ops[i].invoke);
        }
        groups.sort_by_key(|(_, members)| ops[members[0]].invoke);
        for (code, members) in groups {
            let start = self.info_invoke.len() as u32;
            for i in members {
                self.info_invoke.push(ops[i].invoke);
                self.info_op.push(i as u32);
            }
            self.classes.push(Class {
                code,
                start,
                end: self.info_invoke.len() as u32,
            });
        }
        let mut active = 0usize;
        for r in self.returns.iter_mut() {
            while active < self.classes.len() && self.info_invoke[self.classes[active].start as usize] < r.pos {
                active += 1;
            }
            r.classes_active = active as u32;
        }
    }
}

/// Orders ok ops' returns, assigns slots (greedy interval colouring, lowest
/// free slot first) and records which ok ops are open at each return.
fn layout_ok_ops(ops: &[LinOp]) -> (Vec<Return>, Vec<Pending>, u32) {
    // (position, is_return, op)
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(ret) = op.ret {
            debug_assert!(op.invoke < ret, "ok op returns before it is invoked");
            events.push((op.invoke, false, i));
            events.push((ret, true, i));
        }
    }
    events.sort_unstable();
    let mut slot_of = vec![u32::MAX; ops.len()];
    let mut free: std::collections::BinaryHeap<std::cmp::Reverse<u32>> = Default::default();
    let mut n_slots = 0u32;
    let mut open: Vec<usize> = Vec::new();
    let mut returns = Vec::new();
    let mut pending = Vec::new();
    for (pos, is_return, i) in events {
        if !is_return {
            let slot = match free.pop() {
                Some(std::cmp::Reverse(s)) => s,
                None => {
                    n_slots += 1;
                    n_slots - 1
                }
            };
            slot_of[i] = slot;
            open.push(i);
            continue;
        }
        let at = open.iter().position(|&o| o == i).expect("returning op is open");
        open.swap_remove(at);
        let start = pending.len() as u32;
        for &o in &open {
            pending.push(Pending {
                code: ops[o].code,
                slot: slot_of[o],
            });
        }
        returns.push(Return {
            op: i as u32,
            code: ops[i].code,
            slot: slot_of[i],
            pos,
            pending: (start, pending.len() as u32),
            classes_active: 0,
        });
        free.push(std::cmp::Reverse(slot_of[i]));
    }
    (returns, pending, n_slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(id: u32, invoke: u64, ret: u64, code: u32) -> LinOp {
        LinOp {
            id,
            invoke,
            ret: Some(ret),
            code,
            read_only: false,
        }
    }

    fn info(id: u32, invoke: u64, code: u32) -> LinOp {
        LinOp {
            id,
            invoke,
            ret: None,
            code,
            read_only: false,
        }
    }

    #[test]
    fn concurrently_open_ops_never_share_a_slot() {
        // a [0,3], b [1,5], c [4,6]: a and c may share, b may not.
        let p = Problem::new(&[ok(0, 0, 3, 0), ok(1, 1, 5, 0), ok(2, 4, 6, 0)]);
        assert_eq!(p.n_slots, 2);
        let slot = |op: u32| p.returns.iter().find(|r| r.op == op).unwrap().slot;
        assert_ne!(slot(0), slot(1));
        assert_ne!(slot(1), slot(2));
        // at a's return, b is open
        let r0 = p.returns[0];
        assert_eq!(r0.op, 0);
        assert_eq!(&p.pending[r0.pending.0 as usize..r0.pending.1 as usize].len(), &1);
    }

    #[test]
    fn indeterminate_ops_form_classes_in_invoke_order() {
        let p = Problem::new(&[info(0, 5, 7), ok(1, 0, 9, 1), info(2, 2, 7), info(3, 3, 8)]);
        assert_eq!(p.classes.len(), 2);
        let c = p.classes[0];
        assert_eq!(c.code, 7);
        assert_eq!(&p.info_invoke[c.start as usize..c.end as usize], &[2, 5]);
        assert_eq!(p.returns[0].classes_active, 2);
        assert_eq!(p.bits(), 1 + 3);
    }
}
