//! Why text the coordinator holds does not parse: a log entry, a quorum
//! entry, a part name. Each names the record and what is wrong with it;
//! the driver reports it and skips, or refuses, the record.

/// A record of the coordinator that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {why}")]
pub struct ParseError {
    /// The record: `log entry`, `quorum entry`, `part name "…"`.
    pub what: String,
    pub why: String,
}

impl ParseError {
    pub fn new(what: impl Into<String>, why: impl Into<String>) -> ParseError {
        ParseError {
            what: what.into(),
            why: why.into(),
        }
    }
}
