//! Pairing: turns the line-by-line history into operations, each an invoke
//! and the completion that follows it on the same process.
//!
//! Rules (docs/ARCHITECTURE.md, "History"): a completion pairs with the previous invoke of the same
//! process; a process is single-threaded, so a second invoke while its op is
//! still open is an error, and so is a completion with no open invoke. An
//! invoke with no completion by the end is indeterminate ([`Outcome::Pending`],
//! treated like `info` by every checker). The nemesis is exempt from the
//! single-thread rule: its events may be lone `info` lines.

use crate::history::{HistoryError, HistoryReader, Location, Op, OpType, Process};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Ok,
    /// Definitely did not happen.
    Fail,
    /// May or may not have happened.
    Info,
    /// No completion in the history: same meaning as `Info`.
    Pending,
}

impl Outcome {
    /// `info` or no completion: the op may take effect any time after its
    /// invoke, or never.
    pub fn is_indeterminate(self) -> bool {
        matches!(self, Outcome::Info | Outcome::Pending)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "pending",
        }
    }
}

/// One client operation: an invoke and its completion, by position in
/// [`History::ops`].
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub process: Process,
    pub invoke: usize,
    pub complete: Option<usize>,
    pub outcome: Outcome,
}

/// Whether a client process's time may go backwards in a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeOrder {
    /// Never: a completion before its invocation, or a process's next
    /// operation before its last, is an input error.
    #[default]
    Strict,
    /// Taken as written (imported histories whose clocks need it).
    Unordered,
}

/// A whole history, read and paired.
#[derive(Debug, Clone)]
pub struct History {
    pub file: PathBuf,
    /// Every line, in order (`ops[i].index == i`).
    pub ops: Vec<Op>,
    /// The 1-based line of each op in the file.
    pub lines: Vec<u64>,
    /// Client operations, in invoke order.
    pub operations: Vec<Operation>,
    /// Positions of nemesis lines (faults and node-side events).
    pub nemesis: Vec<usize>,
}

/// The first bytes of a file (none if it cannot be read: the reader then
/// says why).
fn head(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut buf))
        .unwrap_or(0);
    buf.truncate(n);
    buf
}

impl History {
    /// Reads, validates and pairs a history file.
    /// Reads and pairs the history at `path`: JSON Lines, or Jepsen's
    /// EDN ([`crate::edn`]) by the file's name or first characters.
    pub fn load(path: &Path) -> Result<History, HistoryError> {
        History::load_with(path, TimeOrder::Strict)
    }

    /// [`History::load`], with `order` saying whether a process's time may
    /// go backwards (imported histories that need it).
    pub fn load_with(path: &Path, order: TimeOrder) -> Result<History, HistoryError> {
        if crate::edn::is_edn(path, &head(path)) {
            let (ops, lines) = crate::edn::read(path)?;
            return History::from_ops_with(path, ops, lines, order);
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        if let Some((ops, lines)) = crate::history::read_parallel(path, threads) {
            return History::from_ops_with(path, ops, lines, order);
        }
        let mut reader = HistoryReader::open(path)?;
        // about a line per 80 bytes: room for them all up front, rather
        // than copying a growing list of a million ops again and again
        let guess = std::fs::metadata(path)
            .map_or(0, |m| (m.len() / 80) as usize)
            .min(1 << 26);
        let mut ops = Vec::with_capacity(guess);
        let mut lines = Vec::with_capacity(guess);
        while let Some(op) = reader.next() {
            ops.push(op?);
            lines.push(reader.location().line);
        }
        History::from_ops_with(path, ops, lines, order)
    }

    /// Pairs already-parsed ops; `lines` gives each op's line for errors.
    /// A client process's time must not go backwards (so no completion
    /// comes before its invocation).
    pub fn from_ops(path: &Path, ops: Vec<Op>, lines: Vec<u64>) -> Result<History, HistoryError> {
        History::from_ops_with(path, ops, lines, TimeOrder::Strict)
    }

    /// [`History::from_ops`] with the time order it demands.
    pub fn from_ops_with(
        path: &Path,
        ops: Vec<Op>,
        lines: Vec<u64>,
        order: TimeOrder,
    ) -> Result<History, HistoryError> {
        let err = |i: usize, reason: String| HistoryError {
            at: Location {
                file: path.to_path_buf(),
                line: lines[i],
            },
            reason,
        };
        let mut operations: Vec<Operation> = Vec::with_capacity(ops.len() / 2 + 1);
        let mut nemesis = Vec::new();
        // process -> index into `operations` of its open op
        let mut open: HashMap<u64, usize, rustc_hash::FxBuildHasher> = HashMap::default();
        // each client process's last line
        let mut last_time: HashMap<u64, usize, rustc_hash::FxBuildHasher> = HashMap::default();
        for (i, op) in ops.iter().enumerate() {
            let Process::Client(p) = op.process else {
                nemesis.push(i);
                continue;
            };
            if order == TimeOrder::Strict {
                if let Some(&prev) = last_time.get(&p) {
                    if op.time < ops[prev].time {
                        return Err(err(
                            i,
                            format!(
                                "time goes backwards for process {p}: {} ns here, {} ns at line {} (its {} `{}`); a history whose clock does that is refused unless told (drift check --allow-unordered-time)",
                                op.time,
                                ops[prev].time,
                                lines[prev],
                                ops[prev].kind.as_str(),
                                ops[prev].f
                            ),
                        ));
                    }
                }
                last_time.insert(p, i);
            }
            match op.kind {
                OpType::Invoke => {
                    if let Some(&o) = open.get(&p) {
                        let prev = operations[o].invoke;
                        return Err(err(
                            i,
                            format!(
                                "process {p} invoked `{}` while its `{}` from line {} has not completed",
                                op.f, ops[prev].f, lines[prev]
                            ),
                        ));
                    }
                    open.insert(p, operations.len());
                    operations.push(Operation {
                        process: op.process,
                        invoke: i,
                        complete: None,
                        outcome: Outcome::Pending,
                    });
                }
                kind => {
                    let Some(o) = open.remove(&p) else {
                        return Err(err(
                            i,
                            format!(
                                "completion ({}) of `{}` for process {p} without an invoke",
                                kind.as_str(),
                                op.f
                            ),
                        ));
                    };
                    let inv = &ops[operations[o].invoke];
                    if inv.f != op.f {
                        return Err(err(
                            i,
                            format!(
                                "completion `{}` of process {p} does not match its invoke `{}` (line {})",
                                op.f, inv.f, lines[operations[o].invoke]
                            ),
                        ));
                    }
                    if op.key.is_some() && op.key != inv.key {
                        return Err(err(
                            i,
                            format!(
                                "completion key {:?} of process {p} differs from its invoke key {:?}",
                                op.key, inv.key
                            ),
                        ));
                    }
                    operations[o].complete = Some(i);
                    operations[o].outcome = match kind {
                        OpType::Ok => Outcome::Ok,
                        OpType::Fail => Outcome::Fail,
                        _ => Outcome::Info,
                    };
                }
            }
        }
        Ok(History {
            file: path.to_path_buf(),
            ops,
            lines,
            operations,
            nemesis,
        })
    }

    /// Builds a history in code, one `(process, type, f, value)` per line;
    /// index and time (index × 1000 ns) are filled in. The type `nemesis`
    /// makes a nemesis `info` line (its process number is ignored). For
    /// tests and tools that generate histories.
    pub fn from_script(lines: &[(u64, &str, &str, Value)]) -> Result<History, HistoryError> {
        let path = Path::new("(script)");
        let mut ops = Vec::with_capacity(lines.len());
        for (i, (p, t, f, v)) in lines.iter().enumerate() {
            let (process, kind) = match (*t, OpType::parse(t)) {
                ("nemesis", _) => (Process::Nemesis, OpType::Info),
                (_, Some(kind)) => (Process::Client(*p), kind),
                (other, None) => {
                    return Err(HistoryError {
                        at: Location {
                            file: path.to_path_buf(),
                            line: i as u64 + 1,
                        },
                        reason: format!("unknown type \"{other}\""),
                    })
                }
            };
            ops.push(Op {
                index: i as u64,
                time: i as i64 * 1000,
                process,
                kind,
                f: (*f).into(),
                value: v.clone(),
                key: None,
                node: None,
                error: None,
            });
        }
        let n = ops.len() as u64;
        History::from_ops(path, ops, (1..=n).collect())
    }

    /// The invoke line of an operation.
    pub fn invoke_op(&self, o: &Operation) -> &Op {
        &self.ops[o.invoke]
    }

    /// The completion line of an operation, if any.
    pub fn complete_op(&self, o: &Operation) -> Option<&Op> {
        o.complete.map(|c| &self.ops[c])
    }

    /// The value an operation is judged by: the completion's value when the
    /// op completed `ok` (reads carry their result there), else the invoke's.
    pub fn value_of(&self, o: &Operation) -> &Value {
        match (o.outcome, self.complete_op(o)) {
            (Outcome::Ok, Some(c)) if !c.value.is_null() => &c.value,
            _ => &self.invoke_op(o).value,
        }
    }

    /// The value of `o` as an array; a history error naming the op
    /// otherwise.
    pub fn array_of(&self, o: &Operation) -> Result<&[Value], HistoryError> {
        let v = self.value_of(o);
        v.as_array().map(Vec::as_slice).ok_or_else(|| HistoryError {
            at: self.location(o.complete.unwrap_or(o.invoke)),
            reason: format!("{} must return an array, got {v}", self.f_of(o)),
        })
    }

    pub fn f_of(&self, o: &Operation) -> &str {
        &self.invoke_op(o).f
    }

    /// The location of an op, for messages.
    pub fn location(&self, pos: usize) -> Location {
        Location {
            file: self.file.clone(),
            line: self.lines[pos],
        }
    }

    /// Client operations grouped by `key` (ops without a key under `None`),
    /// as indices into [`History::operations`], each group in invoke order.
    pub fn by_key(&self) -> BTreeMap<Option<String>, Vec<usize>> {
        // group by borrowed key first: cloning a key per op costs more
        // than the grouping
        let mut index: HashMap<Option<&str>, usize, rustc_hash::FxBuildHasher> = HashMap::default();
        let mut groups: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
        for (i, o) in self.operations.iter().enumerate() {
            let key = self.ops[o.invoke].key.as_deref();
            let g = *index.entry(key).or_insert_with(|| {
                groups.push((key, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        groups.into_iter().map(|(k, v)| (k.map(str::to_string), v)).collect()
    }

    /// Number of distinct keys among client operations (at least 1).
    pub fn key_count(&self) -> usize {
        if self.operations.is_empty() {
            return 0;
        }
        let keys: std::collections::HashSet<Option<&str>, rustc_hash::FxBuildHasher> = self
            .operations
            .iter()
            .map(|o| self.ops[o.invoke].key.as_deref())
            .collect();
        keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(index: u64, process: u64, kind: OpType, f: &str) -> Op {
        Op {
            index,
            time: index as i64,
            process: Process::Client(process),
            kind,
            f: f.into(),
            value: Value::Null,
            key: None,
            node: None,
            error: None,
        }
    }

    fn pair(ops: Vec<Op>) -> Result<History, HistoryError> {
        let lines = (1..=ops.len() as u64).collect();
        History::from_ops(Path::new("h"), ops, lines)
    }

    #[test]
    fn completion_pairs_with_previous_invoke_of_same_process() {
        let h = pair(vec![
            op(0, 1, OpType::Invoke, "read"),
            op(1, 2, OpType::Invoke, "write"),
            op(2, 1, OpType::Ok, "read"),
        ])
        .unwrap();
        assert_eq!(h.operations.len(), 2);
        assert_eq!(h.operations[0].complete, Some(2));
        assert_eq!(h.operations[1].outcome, Outcome::Pending);
    }

    #[test]
    fn completion_without_invoke_is_an_error() {
        let e = pair(vec![op(0, 1, OpType::Ok, "read")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "h:1: completion (ok) of `read` for process 1 without an invoke"
        );
    }

    #[test]
    fn second_invoke_on_busy_process_is_an_error() {
        let e = pair(vec![
            op(0, 1, OpType::Invoke, "read"),
            op(1, 1, OpType::Invoke, "write"),
        ])
        .unwrap_err();
        assert_eq!(e.at.line, 2);
        assert!(e.reason.contains("has not completed"));
    }

    #[test]
    fn a_completion_before_its_invocation_is_an_error_unless_allowed() {
        let mut ops = vec![
            op(0, 1, OpType::Invoke, "read"),
            op(1, 2, OpType::Invoke, "write"),
            op(2, 1, OpType::Ok, "read"),
        ];
        // process 1 completes at 0 ns after invoking at 5 ns; another
        // process's time does not count
        ops[0].time = 5;
        ops[1].time = 9;
        ops[2].time = 0;
        let e = pair(ops.clone()).unwrap_err();
        assert_eq!(e.at.line, 3);
        assert!(e.reason.contains("time goes backwards for process 1"), "{}", e.reason);
        assert!(e.reason.contains("at line 1"), "{}", e.reason);
        assert!(e.reason.contains("--allow-unordered-time"), "{}", e.reason);
        let h = History::from_ops_with(Path::new("h"), ops, vec![1, 2, 3], TimeOrder::Unordered).unwrap();
        assert_eq!(h.operations[0].complete, Some(2));
    }

    #[test]
    fn a_process_whose_next_operation_starts_before_its_last_ended_is_an_error() {
        let mut ops = vec![
            op(0, 1, OpType::Invoke, "read"),
            op(1, 1, OpType::Ok, "read"),
            op(2, 1, OpType::Invoke, "write"),
        ];
        ops[2].time = 0;
        assert_eq!(pair(ops).unwrap_err().at.line, 3);
    }

    #[test]
    fn an_empty_history_pairs_to_nothing_to_judge() {
        let h = pair(vec![]).unwrap();
        assert!(h.operations.is_empty());
        assert_eq!(h.key_count(), 0);
    }

    #[test]
    fn mismatched_completion_f_is_an_error() {
        let e = pair(vec![op(0, 1, OpType::Invoke, "read"), op(1, 1, OpType::Ok, "write")]).unwrap_err();
        assert!(e.reason.contains("does not match"));
    }
}
