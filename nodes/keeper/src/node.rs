//! A znode: data, Stat, ACL, and the counter its sequential children are
//! numbered from.
//!
//! The node *kind* lives where ZooKeeper 3.5+ puts it, in the Stat's
//! `ephemeral_owner`: 0 for persistent, the owning session id for an
//! ephemeral, `i64::MIN` for a container, and `0xFF << 56 | ttl` for a TTL
//! node. Session ids are positive, so the encodings never collide.
//!
//! Invariants: `stat.data_length == data.len()`; `content` and `digest`
//! are the node's hashes at its path (see `digest`), computed when the
//! node value is made and never stale, because nodes are replaced, never
//! mutated in place.

use crate::acl::Acl;
use std::sync::Arc;

/// Most bytes of data in one node: ZooKeeper's default `jute.maxbuffer`
/// less one, so the same clients hit the same limit.
pub const DATA_BYTES_MAX: usize = 0xF_FFFF;
/// Longest TTL in milliseconds ZooKeeper can encode (40 bits).
pub const TTL_MS_MAX: i64 = 0xFF_FFFF_FFFF;

const CONTAINER_OWNER: i64 = i64::MIN;
const TTL_MARK: i64 = 0xFF << 56;

/// ZooKeeper's Stat, field for field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

/// What kind of node, decoded from `ephemeral_owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Persistent,
    Ephemeral { owner: i64 },
    Container,
    Ttl { ttl_ms: i64 },
}

impl Kind {
    /// The `ephemeral_owner` value that encodes this kind.
    pub fn owner_field(self) -> i64 {
        match self {
            Kind::Persistent => 0,
            Kind::Ephemeral { owner } => owner,
            Kind::Container => CONTAINER_OWNER,
            Kind::Ttl { ttl_ms } => TTL_MARK | ttl_ms,
        }
    }

    pub fn from_owner_field(owner: i64) -> Kind {
        if owner == 0 {
            Kind::Persistent
        } else if owner == CONTAINER_OWNER {
            Kind::Container
        } else if owner & TTL_MARK == TTL_MARK && owner < 0 {
            Kind::Ttl {
                ttl_ms: owner & TTL_MS_MAX,
            }
        } else {
            Kind::Ephemeral { owner }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub data: Arc<[u8]>,
    pub stat: Stat,
    pub acl: Arc<[Acl]>,
    /// The number the next sequential child gets.
    pub seq: i64,
    /// SipHash of path and data (0 when digests are off).
    pub content: u64,
    /// This node's digest at its path (0 when digests are off).
    pub digest: u64,
}

impl Node {
    pub fn kind(&self) -> Kind {
        Kind::from_owner_field(self.stat.ephemeral_owner)
    }

    /// The same path and data with new stat, ACL and counter: reuses the
    /// cached content hash.
    pub fn restat(&self, stat: Stat, acl: Arc<[Acl]>, seq: i64, digest_on: bool) -> Node {
        debug_assert_eq!(stat.data_length as usize, self.data.len());
        Node {
            data: self.data.clone(),
            stat,
            acl,
            seq,
            content: self.content,
            digest: if digest_on {
                crate::digest::digest_from_content(self.content, &stat, seq)
            } else {
                0
            },
        }
    }

    pub fn is_ephemeral(&self) -> bool {
        matches!(self.kind(), Kind::Ephemeral { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_the_owner_field() {
        for kind in [
            Kind::Persistent,
            Kind::Ephemeral { owner: 1 },
            Kind::Ephemeral { owner: i64::MAX },
            Kind::Container,
            Kind::Ttl { ttl_ms: 1 },
            Kind::Ttl { ttl_ms: TTL_MS_MAX },
        ] {
            assert_eq!(Kind::from_owner_field(kind.owner_field()), kind);
        }
    }
}
