//! Workloads: what operations a campaign issues and which checkers judge
//! them (values follow the shapes of docs/ARCHITECTURE.md, "History": Jepsen's conventions).
//!
//! * `register` — a CAS register per key (znode /drift/register/<k>):
//!   read, write, cas [expected, new] via a versioned set.
//! * `unique-ids` — sequential creates; the id is the sequence number.
//! * `counter` — add n = a multi of n sequential creates; read = child count.
//! * `total-queue` — enqueue = create a child; dequeue = take the smallest
//!   (get then versioned delete); a final drain.
//! * `ephemeral` — each session creates ephemerals, reads the children
//!   (after a sync) and ends with `close` or `expire` (walks away and lets
//!   the session time out); a final read once every session had time to
//!   expire. No ephemeral may outlive its session.
//! * `insert-retry` — logical inserts into the replicated table, retried
//!   on indeterminate outcomes (see [`crate::table`]; its operations go
//!   over HTTP, not through [`Workload::next`]); the final phase syncs and
//!   reads every replica.
//! * `delete` — puts, overwrites and deletes on a few keys of the kv
//!   service, and reads at its R, through any server (over HTTP, see
//!   [`crate::kv`]); the final phase heals, repairs every range, reads
//!   every replica's content and Merkle roots, and repairs once more.

use crate::rng::Rng;
use drift_checkers::history::OpType;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::registry::CheckerKind;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Values a register takes: small, so reads often match writes and the
/// checker has real work.
const REGISTER_VALUES: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Register { keys: u32 },
    UniqueIds,
    Counter,
    TotalQueue,
    Ephemeral,
    InsertRetry,
    Delete { keys: u32 },
}

/// One operation to invoke.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSpec {
    pub f: &'static str,
    pub value: Value,
    pub key: Option<String>,
}

/// How an operation ended, as the history records it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok(Value),
    /// Definitely did not happen.
    Fail(String),
    /// May or may not have happened.
    Info(String),
    /// Happened in part: what it did (the completion's value), and why it
    /// did not finish — a drain that took some elements and stopped.
    Partial(Value, String),
}

impl Outcome {
    /// The history's completion of it: type, value, error. One that
    /// happened in part is `info`, carrying what it did.
    pub fn completion(&self) -> (OpType, Value, Option<String>) {
        match self {
            Outcome::Ok(v) => (OpType::Ok, v.clone(), None),
            Outcome::Fail(e) => (OpType::Fail, Value::Null, Some(e.clone())),
            Outcome::Info(e) => (OpType::Info, Value::Null, Some(e.clone())),
            Outcome::Partial(v, e) => (OpType::Info, v.clone(), Some(e.clone())),
        }
    }
}

/// The workloads by the names the CLI and run configs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum WorkloadKind {
    Register,
    UniqueIds,
    Counter,
    TotalQueue,
    Ephemeral,
    InsertRetry,
    Delete,
}

impl Workload {
    /// The workload `kind`; `keys` counts the register workload's keys
    /// (at least one).
    pub fn new(kind: WorkloadKind, keys: u32) -> Workload {
        match kind {
            WorkloadKind::Register => Workload::Register { keys: keys.max(1) },
            WorkloadKind::UniqueIds => Workload::UniqueIds,
            WorkloadKind::Counter => Workload::Counter,
            WorkloadKind::TotalQueue => Workload::TotalQueue,
            WorkloadKind::Ephemeral => Workload::Ephemeral,
            WorkloadKind::InsertRetry => Workload::InsertRetry,
            WorkloadKind::Delete => Workload::Delete { keys: keys.max(1) },
        }
    }

    /// Whether it runs against the replicated table (over HTTP) rather
    /// than the keeper's znodes.
    pub fn is_table(&self) -> bool {
        *self == Workload::InsertRetry
    }

    /// Whether it runs against the kv service (over HTTP).
    pub fn is_kv(&self) -> bool {
        matches!(self, Workload::Delete { .. })
    }

    pub fn kind(&self) -> WorkloadKind {
        match self {
            Workload::Register { .. } => WorkloadKind::Register,
            Workload::UniqueIds => WorkloadKind::UniqueIds,
            Workload::Counter => WorkloadKind::Counter,
            Workload::TotalQueue => WorkloadKind::TotalQueue,
            Workload::Ephemeral => WorkloadKind::Ephemeral,
            Workload::InsertRetry => WorkloadKind::InsertRetry,
            Workload::Delete { .. } => WorkloadKind::Delete,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Workload::Register { .. } => "register",
            Workload::UniqueIds => "unique-ids",
            Workload::Counter => "counter",
            Workload::TotalQueue => "total-queue",
            Workload::Ephemeral => "ephemeral",
            Workload::InsertRetry => "insert-retry",
            Workload::Delete { .. } => "delete",
        }
    }

    /// The znode the workload lives under (the table's workload keeps its
    /// rows in the table, under the table's own path).
    pub fn root(&self) -> &'static str {
        match self {
            Workload::Register { .. } => "/drift/register",
            Workload::UniqueIds => "/drift/ids",
            Workload::Counter => "/drift/counter",
            Workload::TotalQueue => "/drift/queue",
            Workload::Ephemeral => "/drift/ephemeral",
            Workload::InsertRetry => "/drift/inserts",
            Workload::Delete { .. } => "/drift/kv",
        }
    }

    /// The checkers that judge this workload's history.
    pub fn checkers(&self) -> Vec<CheckerKind> {
        let main = match self {
            Workload::Register { .. } => CheckerKind::Linearizable,
            Workload::UniqueIds => CheckerKind::UniqueIds,
            Workload::Counter => CheckerKind::Counter,
            Workload::TotalQueue => CheckerKind::TotalQueue,
            Workload::Ephemeral => CheckerKind::Ephemeral,
            Workload::InsertRetry => CheckerKind::Dedup,
            Workload::Delete { .. } => CheckerKind::Convergence,
        };
        vec![main, CheckerKind::Stats, CheckerKind::Perf]
    }

    /// The model its linearizability is judged by, where it is.
    pub fn model(&self) -> Option<ModelKind> {
        matches!(self, Workload::Register { .. }).then_some(ModelKind::CasRegister)
    }

    /// The next operation of a worker. `unique` is a per-worker counter
    /// for values that must not repeat (queue elements). Not for
    /// `insert-retry`, whose workers draw from [`crate::table::InsertGen`].
    pub fn next(&self, rng: &mut Rng, worker: u64, unique: &mut u64) -> OpSpec {
        match *self {
            Workload::InsertRetry => unreachable!("insert-retry workers draw from table::InsertGen"),
            Workload::Delete { keys } => crate::kv::next(rng, keys, worker, unique),
            Workload::Register { keys } => {
                let key = Some(format!("{}", rng.below(keys as u64)));
                match rng.weighted(&[2, 1, 1]) {
                    0 => OpSpec {
                        f: "read",
                        value: Value::Null,
                        key,
                    },
                    1 => OpSpec {
                        f: "write",
                        value: json!(rng.below(REGISTER_VALUES)),
                        key,
                    },
                    _ => OpSpec {
                        f: "cas",
                        value: json!([rng.below(REGISTER_VALUES), rng.below(REGISTER_VALUES)]),
                        key,
                    },
                }
            }
            Workload::UniqueIds => OpSpec {
                f: "generate",
                value: Value::Null,
                key: None,
            },
            Workload::Counter => match rng.weighted(&[3, 1]) {
                0 => OpSpec {
                    f: "add",
                    value: json!(1 + rng.below(3)),
                    key: None,
                },
                _ => OpSpec {
                    f: "read",
                    value: Value::Null,
                    key: None,
                },
            },
            Workload::TotalQueue => match rng.weighted(&[3, 2]) {
                0 => {
                    *unique += 1;
                    OpSpec {
                        f: "enqueue",
                        value: json!(worker * 1_000_000_000 + *unique),
                        key: None,
                    }
                }
                _ => OpSpec {
                    f: "dequeue",
                    value: Value::Null,
                    key: None,
                },
            },
            // a session lives about ten ops; `close` or `expire` is the
            // session's fate, which the worker picks when it connects
            Workload::Ephemeral => match rng.weighted(&[5, 4, 1]) {
                0 => {
                    *unique += 1;
                    OpSpec {
                        f: "create",
                        value: json!(format!("w{worker}-{}", *unique)),
                        key: None,
                    }
                }
                1 => OpSpec {
                    f: "read",
                    value: Value::Null,
                    key: None,
                },
                _ => OpSpec {
                    f: "close",
                    value: Value::Null,
                    key: None,
                },
            },
        }
    }

    /// Whether the final op `f` takes in chunks, to be repeated until it
    /// comes back empty.
    pub fn drains(&self, f: &str) -> bool {
        *self == Workload::TotalQueue && f == "drain"
    }

    /// Whether `f` ends the client's session (the worker then starts a
    /// new session under a new process).
    pub fn ends_session(&self, f: &str) -> bool {
        matches!(f, "close" | "expire")
    }

    /// How long the final phase waits after the cluster recovered: enough
    /// for every abandoned session to expire (twice the session timeout,
    /// as a new leader restarts session clocks), for `ephemeral`.
    pub fn settle_before_final(&self, session_timeout: std::time::Duration) -> std::time::Duration {
        match self {
            Workload::Ephemeral => session_timeout * 2 + std::time::Duration::from_secs(1),
            _ => std::time::Duration::ZERO,
        }
    }

    /// Operations of the final phase, after every fault is healed (the
    /// table's final reads are [`crate::table::sync_and_read`], per replica).
    pub fn final_ops(&self) -> Vec<OpSpec> {
        match *self {
            Workload::InsertRetry | Workload::Delete { .. } => vec![],
            Workload::Register { keys } => (0..keys)
                .map(|k| OpSpec {
                    f: "read",
                    value: Value::Null,
                    key: Some(k.to_string()),
                })
                .collect(),
            Workload::UniqueIds => vec![],
            Workload::Counter => vec![OpSpec {
                f: "read",
                value: Value::Null,
                key: None,
            }],
            Workload::TotalQueue => vec![OpSpec {
                f: "drain",
                value: Value::Null,
                key: None,
            }],
            Workload::Ephemeral => vec![OpSpec {
                f: "final-read",
                value: Value::Null,
                key: None,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_ops_have_the_cas_register_shapes() {
        let w = Workload::new(WorkloadKind::Register, 3);
        let mut rng = Rng::new(1);
        let mut u = 0;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let op = w.next(&mut rng, 0, &mut u);
            seen.insert(op.f);
            match op.f {
                "read" => assert!(op.value.is_null()),
                "write" => assert!(op.value.as_u64().unwrap() < REGISTER_VALUES),
                "cas" => assert_eq!(op.value.as_array().unwrap().len(), 2),
                other => panic!("{other}"),
            }
            assert!(op.key.unwrap().parse::<u32>().unwrap() < 3);
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(w.final_ops().len(), 3);
    }

    #[test]
    fn queue_elements_never_repeat_across_workers() {
        let w = Workload::TotalQueue;
        let mut rng = Rng::new(2);
        let mut all = std::collections::BTreeSet::new();
        for worker in 0..3 {
            let mut u = 0;
            for _ in 0..100 {
                let op = w.next(&mut rng, worker, &mut u);
                if op.f == "enqueue" {
                    assert!(all.insert(op.value.as_u64().unwrap()));
                }
            }
        }
    }

    #[test]
    fn ephemeral_names_are_unique_and_sessions_end() {
        let w = Workload::new(WorkloadKind::Ephemeral, 1);
        let mut names = std::collections::BTreeSet::new();
        let mut ends = 0;
        for worker in 0..4 {
            let mut rng = Rng::new(worker);
            let mut u = 0;
            for _ in 0..300 {
                let op = w.next(&mut rng, worker, &mut u);
                // only a close ends the session
                assert_eq!(w.ends_session(op.f), op.f == "close", "{}", op.f);
                match op.f {
                    "create" => assert!(names.insert(op.value.as_str().unwrap().to_string())),
                    "read" => assert!(op.value.is_null()),
                    "close" => ends += 1,
                    other => panic!("{other}"),
                }
            }
        }
        assert!(ends > 50, "sessions end now and then: {ends}");
        assert!(w.ends_session("expire"), "an expiry ends a session too");
        assert_eq!(w.final_ops()[0].f, "final-read");
        assert!(w.settle_before_final(std::time::Duration::from_secs(4)) >= std::time::Duration::from_secs(8));
        assert_eq!(
            Workload::UniqueIds.settle_before_final(std::time::Duration::from_secs(4)),
            std::time::Duration::ZERO
        );
    }
}
