//! Access control: ZooKeeper's ACL model with the `world`, `auth` and
//! `digest` schemes.
//!
//! * `world:anyone` — everyone.
//! * `digest:user:hash` — a session that ran `addAuth digest user:password`
//!   where hash = base64(sha1("user:password")).
//! * `auth` in a create or setACL stands for "every id this session has
//!   authenticated as"; it is expanded at the request and never stored.
//!
//! Not supported: `ip`, `sasl`, `x509`, super users — an ACL naming them
//! is `InvalidAcl`, never silently accepted.

use crate::error::ZkError;
use base64::Engine;
use sha1::{Digest, Sha1};
use std::sync::Arc;

pub const PERM_READ: u32 = 1;
pub const PERM_WRITE: u32 = 2;
pub const PERM_CREATE: u32 = 4;
pub const PERM_DELETE: u32 = 8;
pub const PERM_ADMIN: u32 = 16;
pub const PERM_ALL: u32 = 31;

/// Most entries in one ACL: a bound on what a node carries and the log and
/// snapshots store.
pub const ACL_ENTRIES_MAX: usize = 64;
/// Longest scheme or id string.
pub const ACL_ID_BYTES_MAX: usize = 1024;

/// An authenticated identity, e.g. `digest` / `alice:XJ…=`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id {
    pub scheme: String,
    pub id: String,
}

/// One ACL entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Acl {
    pub perms: u32,
    pub id: Id,
}

impl Acl {
    pub fn world(perms: u32) -> Acl {
        Acl {
            perms,
            id: Id {
                scheme: "world".into(),
                id: "anyone".into(),
            },
        }
    }

    /// `world:anyone` with every permission: ZooKeeper's OPEN_ACL_UNSAFE.
    pub fn open() -> Vec<Acl> {
        vec![Acl::world(PERM_ALL)]
    }
}

/// The id `addAuth digest user:password` authenticates as.
pub fn digest_id(credentials: &str) -> Result<Id, ZkError> {
    let Some((user, _)) = credentials.split_once(':') else {
        return Err(ZkError::AuthFailed);
    };
    if user.is_empty() || credentials.len() > ACL_ID_BYTES_MAX {
        return Err(ZkError::AuthFailed);
    }
    let hash = Sha1::digest(credentials.as_bytes());
    Ok(Id {
        scheme: "digest".into(),
        id: format!("{user}:{}", base64::engine::general_purpose::STANDARD.encode(hash)),
    })
}

/// Validates an ACL from a request and expands `auth` entries into the
/// session's ids. The result is sorted and without duplicates, so equal
/// ACLs are stored identically on every replica.
pub fn resolve(acl: &[Acl], session_ids: &[Id]) -> Result<Vec<Acl>, ZkError> {
    if acl.is_empty() || acl.len() > ACL_ENTRIES_MAX {
        return Err(ZkError::InvalidAcl);
    }
    let mut out = Vec::with_capacity(acl.len());
    for a in acl {
        if a.perms & !PERM_ALL != 0 || a.id.scheme.len() > ACL_ID_BYTES_MAX || a.id.id.len() > ACL_ID_BYTES_MAX {
            return Err(ZkError::InvalidAcl);
        }
        match a.id.scheme.as_str() {
            "world" if a.id.id == "anyone" => out.push(a.clone()),
            "auth" => {
                let mine: Vec<&Id> = session_ids.iter().filter(|i| i.scheme == "digest").collect();
                if mine.is_empty() {
                    return Err(ZkError::InvalidAcl);
                }
                for id in mine {
                    out.push(Acl {
                        perms: a.perms,
                        id: id.clone(),
                    });
                }
            }
            "digest" if valid_digest_id(&a.id.id) => out.push(a.clone()),
            _ => return Err(ZkError::InvalidAcl),
        }
    }
    out.sort();
    out.dedup();
    if out.len() > ACL_ENTRIES_MAX {
        return Err(ZkError::InvalidAcl);
    }
    Ok(out)
}

/// `acl` as a list: `like` itself when it holds the same entries, else a
/// new one. A create passes its parent's: nodes almost always carry their
/// parent's ACL (every ClickHouse znode, for one), and sharing its list
/// keeps a node's ACL at a pointer rather than a list and two strings of
/// its own (83 bytes asked of the allocator a node, measured by
/// `tests/tree_memory.rs`). A snapshot's ACL table shares equal lists on
/// load.
pub fn shared(acl: Vec<Acl>, like: &Arc<[Acl]>) -> Arc<[Acl]> {
    if like[..] == acl[..] {
        Arc::clone(like)
    } else {
        acl.into()
    }
}

fn valid_digest_id(id: &str) -> bool {
    matches!(id.split_once(':'), Some((user, hash)) if !user.is_empty() && !hash.is_empty() && !hash.contains(':'))
}

/// Whether a session with `ids` may do `perm` on a node with `acl`.
pub fn allowed(acl: &[Acl], perm: u32, ids: &[Id]) -> bool {
    acl.iter()
        .any(|a| a.perms & perm != 0 && ((a.id.scheme == "world" && a.id.id == "anyone") || ids.contains(&a.id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_id_is_base64_sha1_of_user_and_password() {
        // The value ZooKeeper's DigestAuthenticationProvider.generateDigest
        // gives for "super:test".
        assert_eq!(
            digest_id("super:test").unwrap().id,
            "super:D/InIHSb7yEEbrWz8b9l71RjZJU="
        );
        assert_eq!(digest_id("nocolon"), Err(ZkError::AuthFailed));
    }

    #[test]
    fn auth_scheme_expands_to_session_ids_and_needs_one() {
        let alice = digest_id("alice:pw").unwrap();
        let acl = [Acl {
            perms: PERM_ALL,
            id: Id {
                scheme: "auth".into(),
                id: "".into(),
            },
        }];
        assert_eq!(resolve(&acl, &[]), Err(ZkError::InvalidAcl));
        let r = resolve(&acl, std::slice::from_ref(&alice)).unwrap();
        assert_eq!(
            r,
            [Acl {
                perms: PERM_ALL,
                id: alice.clone()
            }]
        );
        assert!(allowed(&r, PERM_READ, &[alice]));
        assert!(!allowed(&r, PERM_READ, &[]));
    }

    #[test]
    fn unknown_schemes_and_bad_entries_are_invalid() {
        let bad = [
            vec![],
            vec![Acl {
                perms: 1,
                id: Id {
                    scheme: "ip".into(),
                    id: "10.0.0.1".into(),
                },
            }],
            vec![Acl {
                perms: 64,
                id: Id {
                    scheme: "world".into(),
                    id: "anyone".into(),
                },
            }],
            vec![Acl {
                perms: 1,
                id: Id {
                    scheme: "world".into(),
                    id: "someone".into(),
                },
            }],
            vec![Acl {
                perms: 1,
                id: Id {
                    scheme: "digest".into(),
                    id: "nohash".into(),
                },
            }],
        ];
        for acl in bad {
            assert_eq!(resolve(&acl, &[]), Err(ZkError::InvalidAcl), "{acl:?}");
        }
    }
}
