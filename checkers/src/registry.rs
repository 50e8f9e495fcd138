//! Checkers by the names the CLI and run configs use.

use crate::checker::Checker;
use crate::counter::Counter;
use crate::linear::model::ModelKind;
use crate::linear::Linearizable;
use crate::queue::TotalQueue;
use crate::set::SetChecker;
use crate::stats::Stats;
use crate::unique_ids::UniqueIds;
use serde::{Deserialize, Serialize};

/// Every checker, by the name the CLI, run configs and results use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum CheckerKind {
    Linearizable,
    UniqueIds,
    Set,
    Counter,
    TotalQueue,
    Ephemeral,
    Stats,
    Perf,
    Digest,
    Dedup,
    Convergence,
}

impl CheckerKind {
    /// Every checker, in the order help text lists them.
    pub const ALL: [CheckerKind; 11] = [
        CheckerKind::Linearizable,
        CheckerKind::UniqueIds,
        CheckerKind::Set,
        CheckerKind::Counter,
        CheckerKind::TotalQueue,
        CheckerKind::Ephemeral,
        CheckerKind::Stats,
        CheckerKind::Perf,
        CheckerKind::Digest,
        CheckerKind::Dedup,
        CheckerKind::Convergence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CheckerKind::Linearizable => "linearizable",
            CheckerKind::UniqueIds => "unique-ids",
            CheckerKind::Set => "set",
            CheckerKind::Counter => "counter",
            CheckerKind::TotalQueue => "total-queue",
            CheckerKind::Ephemeral => "ephemeral",
            CheckerKind::Stats => "stats",
            CheckerKind::Perf => "perf",
            CheckerKind::Digest => "digest",
            CheckerKind::Dedup => "dedup",
            CheckerKind::Convergence => "convergence",
        }
    }

    pub fn parse(name: &str) -> Option<CheckerKind> {
        CheckerKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Builds a checker. `model` is required by (and, with `init`, the value
/// every key starts at, only meaningful for) `linearizable`.
pub fn build(
    kind: CheckerKind,
    model: Option<ModelKind>,
    init: &serde_json::Value,
) -> Result<Box<dyn Checker>, String> {
    build_with(kind, model, init, true)
}

/// [`build`], with `explain` false for a verdict alone: `linearizable`
/// then skips shrinking a failure to its core (a seed sweep wants to know
/// which seeds fail, fast, and explains only those it stores).
pub fn build_with(
    kind: CheckerKind,
    model: Option<ModelKind>,
    init: &serde_json::Value,
    explain: bool,
) -> Result<Box<dyn Checker>, String> {
    Ok(match kind {
        CheckerKind::Linearizable => {
            let model = model.ok_or_else(|| "checker `linearizable` needs --model (cas-register or kv)".to_string())?;
            Box::new(Linearizable {
                model,
                explain,
                init: init.clone(),
                tuning: Default::default(),
            })
        }
        CheckerKind::UniqueIds => Box::new(UniqueIds),
        CheckerKind::Set => Box::new(SetChecker),
        CheckerKind::Counter => Box::new(Counter),
        CheckerKind::TotalQueue => Box::new(TotalQueue),
        CheckerKind::Ephemeral => Box::new(crate::ephemeral::Ephemeral),
        CheckerKind::Stats => Box::new(Stats),
        CheckerKind::Perf => Box::new(crate::perf::Perf),
        CheckerKind::Digest => Box::new(crate::digest::DigestChecker),
        CheckerKind::Dedup => Box::new(crate::dedup::Dedup),
        CheckerKind::Convergence => Box::new(crate::convergence::Convergence),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_checker_is_built_under_its_own_name() {
        for k in CheckerKind::ALL {
            assert_eq!(CheckerKind::parse(k.name()), Some(k));
            let c = build(k, Some(ModelKind::CasRegister), &serde_json::Value::Null).unwrap();
            assert_eq!(c.name(), k.name());
            assert_eq!(serde_json::to_value(k).unwrap(), k.name());
        }
    }
}
