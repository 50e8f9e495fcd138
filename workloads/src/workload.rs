//! Workloads: what operations a campaign issues and which checkers judge
//! them (values follow DESIGN.md's shapes, Jepsen's conventions).
//!
//! * `register` — a CAS register per key (znode /drift/register/<k>):
//!   read, write, cas [expected, new] via a versioned set.
//! * `unique-ids` — sequential creates; the id is the sequence number.
//! * `counter` — add n = a multi of n sequential creates; read = child count.
//! * `total-queue` — enqueue = create a child; dequeue = take the smallest
//!   (get then versioned delete); a final drain.

use crate::rng::Rng;
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
}

pub const NAMES: [&str; 4] = ["register", "unique-ids", "counter", "total-queue"];

impl Workload {
    pub fn parse(name: &str, keys: u32) -> Option<Workload> {
        Some(match name {
            "register" => Workload::Register { keys: keys.max(1) },
            "unique-ids" => Workload::UniqueIds,
            "counter" => Workload::Counter,
            "total-queue" => Workload::TotalQueue,
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Workload::Register { .. } => "register",
            Workload::UniqueIds => "unique-ids",
            Workload::Counter => "counter",
            Workload::TotalQueue => "total-queue",
        }
    }

    /// The znode the workload lives under.
    pub fn root(&self) -> &'static str {
        match self {
            Workload::Register { .. } => "/drift/register",
            Workload::UniqueIds => "/drift/ids",
            Workload::Counter => "/drift/counter",
            Workload::TotalQueue => "/drift/queue",
        }
    }

    /// (checker, model) pairs that judge this workload's history.
    pub fn checkers(&self) -> Vec<(&'static str, Option<&'static str>)> {
        let main = match self {
            Workload::Register { .. } => ("linearizable", Some("cas-register")),
            Workload::UniqueIds => ("unique-ids", None),
            Workload::Counter => ("counter", None),
            Workload::TotalQueue => ("total-queue", None),
        };
        vec![main, ("stats", None), ("digest", None)]
    }

    /// The next operation of a worker. `unique` is a per-worker counter
    /// for values that must not repeat (queue elements).
    pub fn next(&self, rng: &mut Rng, worker: u64, unique: &mut u64) -> OpSpec {
        match *self {
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
        }
    }

    /// Operations of the final phase, after every fault is healed.
    pub fn final_ops(&self) -> Vec<OpSpec> {
        match *self {
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_ops_have_the_cas_register_shapes() {
        let w = Workload::parse("register", 3).unwrap();
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
}
