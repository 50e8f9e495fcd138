//! Checkers by the names the CLI and run configs use.

use crate::checker::Checker;
use crate::counter::Counter;
use crate::linear::model::ModelKind;
use crate::linear::Linearizable;
use crate::queue::TotalQueue;
use crate::set::SetChecker;
use crate::stats::Stats;
use crate::unique_ids::UniqueIds;

/// Every checker name, in the order help text lists them.
pub const NAMES: [&str; 9] = [
    "linearizable",
    "unique-ids",
    "set",
    "counter",
    "total-queue",
    "ephemeral",
    "stats",
    "perf",
    "digest",
];

/// Builds the checker called `name`. `model` is required by (and only
/// meaningful for) `linearizable`.
pub fn build(name: &str, model: Option<ModelKind>) -> Result<Box<dyn Checker>, String> {
    Ok(match name {
        "linearizable" => {
            let model = model.ok_or_else(|| "checker `linearizable` needs --model (cas-register or kv)".to_string())?;
            Box::new(Linearizable { model, explain: true })
        }
        "unique-ids" => Box::new(UniqueIds),
        "set" => Box::new(SetChecker),
        "counter" => Box::new(Counter),
        "total-queue" => Box::new(TotalQueue),
        "ephemeral" => Box::new(crate::ephemeral::Ephemeral),
        "stats" => Box::new(Stats),
        "perf" => Box::new(crate::perf::Perf),
        "digest" => Box::new(crate::digest::DigestChecker),
        other => return Err(format!("unknown checker `{other}` (known: {})", NAMES.join(", "))),
    })
}
