//! What a write may hold to enter the log.
//!
//! Every replica decodes every log entry with the bounded decoder of
//! [`crate::request`]; an entry that a replica cannot decode would stop it
//! from applying the log. So a write is checked against the same limits
//! before it is proposed, on every path that proposes: a client's request
//! on the server it reached, a request forwarded to the leader, and the
//! leader's own proposal. Invariant: `check(w)` is `Ok` ⇒ the entry
//! carrying `w` decodes on every replica (tested in `tests/props.rs`).
//!
//! A client's request over a limit is answered with ZooKeeper's
//! `MarshallingError`, the connection kept; nothing is proposed. (Apache
//! ZooKeeper bounds the whole frame by `jute.maxbuffer` instead and
//! closes the connection unanswered.)

use crate::acl::{Acl, ACL_ENTRIES_MAX, ACL_ID_BYTES_MAX};
use crate::node::DATA_BYTES_MAX;
use crate::path::PATH_BYTES_MAX;
use crate::request::{Op, Write, MULTI_OPS_MAX};

/// Most bytes one write's log encoding may take: twice the largest client
/// frame, so nothing a client can send comes near it, and well inside a
/// changelog record ([`crate::changelog::ENTRY_DATA_BYTES_MAX`]) with the
/// entry header and Raft's envelope around it.
pub const WRITE_BYTES_MAX: usize = 2 * crate::jute::FRAME_BYTES_MAX;

/// A field of a write over its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} of {len} exceeds the limit of {max}")]
pub struct OverLimit {
    /// What is too large: `path`, `data`, `acl entries`, `acl id`, …
    pub field: &'static str,
    pub len: usize,
    pub max: usize,
}

fn within(field: &'static str, len: usize, max: usize) -> Result<(), OverLimit> {
    if len > max {
        return Err(OverLimit { field, len, max });
    }
    Ok(())
}

fn acl(entries: &[Acl]) -> Result<(), OverLimit> {
    within("acl entries", entries.len(), ACL_ENTRIES_MAX)?;
    for a in entries {
        within("acl scheme bytes", a.id.scheme.len(), ACL_ID_BYTES_MAX)?;
        within("acl id bytes", a.id.id.len(), ACL_ID_BYTES_MAX)?;
    }
    Ok(())
}

fn op(o: &Op) -> Result<(), OverLimit> {
    match o {
        Op::Create(c) => {
            within("path bytes", c.path.len(), PATH_BYTES_MAX)?;
            within("data bytes", c.data.len(), DATA_BYTES_MAX)?;
            acl(&c.acl)
        }
        Op::SetData { path, data, .. } => {
            within("path bytes", path.len(), PATH_BYTES_MAX)?;
            within("data bytes", data.len(), DATA_BYTES_MAX)
        }
        Op::Delete { path, .. } | Op::Check { path, .. } => within("path bytes", path.len(), PATH_BYTES_MAX),
    }
}

/// Checks `w` against every limit the log decoder enforces, and its
/// encoded size against [`WRITE_BYTES_MAX`].
pub fn check(w: &Write) -> Result<(), OverLimit> {
    match w {
        Write::Op(o) => op(o)?,
        Write::SetAcl { path, acl: a, .. } => {
            within("path bytes", path.len(), PATH_BYTES_MAX)?;
            acl(a)?;
        }
        Write::Multi(ops) => {
            within("multi ops", ops.len(), MULTI_OPS_MAX)?;
            ops.iter().try_for_each(op)?;
        }
        Write::AddAuth { scheme, auth } => {
            within("auth scheme bytes", scheme.len(), ACL_ID_BYTES_MAX)?;
            within("auth bytes", auth.len(), ACL_ID_BYTES_MAX)?;
        }
        Write::Reap { path } | Write::Sync { path } => within("path bytes", path.len(), PATH_BYTES_MAX)?,
        Write::CreateSession { .. } | Write::CloseSession => {}
    }
    within("request bytes", w.encoded_len(), WRITE_BYTES_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::Id;
    use crate::request::{Create, CreateMode};

    fn create(path: &str, data: usize, acl: Vec<Acl>) -> Write {
        Write::Op(Op::Create(Create {
            path: path.into(),
            data: vec![7; data],
            acl,
            mode: CreateMode::Persistent,
            ttl_ms: 0,
        }))
    }

    fn world(id_bytes: usize) -> Acl {
        Acl {
            perms: 31,
            id: Id {
                scheme: "world".into(),
                id: "a".repeat(id_bytes),
            },
        }
    }

    #[test]
    fn each_field_is_held_to_its_decoder_limit() {
        assert_eq!(check(&create("/x", DATA_BYTES_MAX, vec![world(3)])), Ok(()));
        let cases = [
            (create("/x", DATA_BYTES_MAX + 1, vec![]), "data bytes"),
            (
                create(&format!("/{}", "p".repeat(PATH_BYTES_MAX)), 0, vec![]),
                "path bytes",
            ),
            (create("/x", 0, vec![world(1); ACL_ENTRIES_MAX + 1]), "acl entries"),
            (create("/x", 0, vec![world(ACL_ID_BYTES_MAX + 1)]), "acl id bytes"),
            (
                Write::SetAcl {
                    path: "/x".into(),
                    acl: vec![world(1); ACL_ENTRIES_MAX + 1],
                    version: -1,
                },
                "acl entries",
            ),
            (
                Write::AddAuth {
                    scheme: "digest".into(),
                    auth: vec![b'a'; ACL_ID_BYTES_MAX + 1],
                },
                "auth bytes",
            ),
            (
                Write::Multi(vec![
                    Op::Check {
                        path: "/".into(),
                        version: 0
                    };
                    MULTI_OPS_MAX + 1
                ]),
                "multi ops",
            ),
        ];
        for (w, field) in cases {
            assert_eq!(check(&w).map_err(|e| e.field), Err(field), "{}", w.describe());
        }
    }

    #[test]
    fn a_multi_of_legal_ops_is_held_to_the_write_size() {
        let big = Op::SetData {
            path: "/x".into(),
            data: vec![0; DATA_BYTES_MAX],
            version: -1,
        };
        assert_eq!(check(&Write::Multi(vec![big.clone(); 2])), Ok(()));
        assert_eq!(
            check(&Write::Multi(vec![big; 3])).map_err(|e| e.field),
            Err("request bytes")
        );
    }
}
