//! Requests and responses of the keeper core.
//!
//! Writes ([`Write`]) go through the log and are applied by every replica;
//! their binary encoding here is part of the log entry format (bump
//! `entry::FORMAT_VERSION` when it changes). Reads ([`Read`]) are served
//! by one replica from its committed tree and never logged.

use crate::acl::{Acl, Id, ACL_ENTRIES_MAX, ACL_ID_BYTES_MAX};
use crate::codec::{DecodeError, Reader, Writer};
use crate::error::ZkError;
use crate::node::{Stat, DATA_BYTES_MAX};
use crate::path::PATH_BYTES_MAX;

/// Most operations in one multi.
pub const MULTI_OPS_MAX: usize = 1024;

/// ZooKeeper's create modes, numbered as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CreateMode {
    Persistent = 0,
    Ephemeral = 1,
    PersistentSequential = 2,
    EphemeralSequential = 3,
    Container = 4,
    PersistentWithTtl = 5,
    PersistentSequentialWithTtl = 6,
}

impl CreateMode {
    pub fn from_flags(flags: i32) -> Option<CreateMode> {
        use CreateMode::*;
        [
            Persistent,
            Ephemeral,
            PersistentSequential,
            EphemeralSequential,
            Container,
            PersistentWithTtl,
            PersistentSequentialWithTtl,
        ]
        .into_iter()
        .find(|m| *m as i32 == flags)
    }

    pub fn is_sequential(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentSequential
                | CreateMode::EphemeralSequential
                | CreateMode::PersistentSequentialWithTtl
        )
    }

    pub fn is_ephemeral(self) -> bool {
        matches!(self, CreateMode::Ephemeral | CreateMode::EphemeralSequential)
    }

    pub fn is_ttl(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentWithTtl | CreateMode::PersistentSequentialWithTtl
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Create {
    pub path: String,
    pub data: Vec<u8>,
    pub acl: Vec<Acl>,
    pub mode: CreateMode,
    /// TTL in ms for the TTL modes, else 0.
    pub ttl_ms: i64,
}

/// An operation that may appear inside a multi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Create(Create),
    Delete { path: String, version: i32 },
    SetData { path: String, data: Vec<u8>, version: i32 },
    Check { path: String, version: i32 },
}

/// A request that changes replicated state: it is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Op(Op),
    SetAcl {
        path: String,
        acl: Vec<Acl>,
        version: i32,
    },
    Multi(Vec<Op>),
    /// Open a session; the id comes from the replicated counter.
    CreateSession {
        timeout_ms: i32,
    },
    /// Close (or expire) the entry's session and delete its ephemerals.
    CloseSession,
    AddAuth {
        scheme: String,
        auth: Vec<u8>,
    },
    /// Delete `path` if it is still an empty container, or a TTL node
    /// unmodified for its TTL, at the entry's time. Proposed by the leader.
    Reap {
        path: String,
    },
    /// Linearizable sync: a no-op that orders the caller after every
    /// earlier write.
    Sync {
        path: String,
    },
}

/// A request served from one replica's committed tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    GetData { path: String },
    Exists { path: String },
    GetChildren { path: String },
    GetAcl { path: String },
}

/// The result of one op of a multi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Create { path: String, stat: Stat },
    Delete,
    SetData { stat: Stat },
    Check,
    Error(ZkError),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Create {
        path: String,
        stat: Stat,
    },
    Delete,
    SetData {
        stat: Stat,
    },
    Check,
    SetAcl {
        stat: Stat,
    },
    /// `Ok` with every op's result, or the first failing op's error (and
    /// per-op results in ZooKeeper's shape: ok before it, the error at it,
    /// `RuntimeInconsistency` after it).
    Multi {
        error: ZkError,
        results: Vec<OpResult>,
    },
    CreateSession {
        session_id: i64,
    },
    CloseSession,
    AddAuth,
    Reap {
        deleted: bool,
    },
    Sync {
        path: String,
    },
    GetData {
        data: Vec<u8>,
        stat: Stat,
    },
    Exists {
        stat: Stat,
    },
    GetChildren {
        children: Vec<String>,
        stat: Stat,
    },
    GetAcl {
        acl: Vec<Acl>,
        stat: Stat,
    },
    Error(ZkError),
}

impl Response {
    /// The result code a client sees.
    pub fn error(&self) -> ZkError {
        match self {
            Response::Error(e) => *e,
            Response::Multi { error, .. } => *error,
            _ => ZkError::Ok,
        }
    }
}

// ---- log encoding ----

const TAG_CREATE: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_SET_DATA: u8 = 3;
const TAG_CHECK: u8 = 4;
const TAG_SET_ACL: u8 = 5;
const TAG_MULTI: u8 = 6;
const TAG_CREATE_SESSION: u8 = 7;
const TAG_CLOSE_SESSION: u8 = 8;
const TAG_ADD_AUTH: u8 = 9;
const TAG_REAP: u8 = 10;
const TAG_SYNC: u8 = 11;

fn encode_acl(w: &mut Writer, acl: &[Acl]) {
    w.u32(acl.len() as u32);
    for a in acl {
        w.u32(a.perms);
        w.str(&a.id.scheme);
        w.str(&a.id.id);
    }
}

pub(crate) fn decode_acl(r: &mut Reader<'_>) -> Result<Vec<Acl>, DecodeError> {
    let n = r.count(ACL_ENTRIES_MAX, 12)?;
    let mut acl = Vec::with_capacity(n);
    for _ in 0..n {
        let perms = r.u32()?;
        let scheme = r.str(ACL_ID_BYTES_MAX)?.to_string();
        let id = r.str(ACL_ID_BYTES_MAX)?.to_string();
        acl.push(Acl {
            perms,
            id: Id { scheme, id },
        });
    }
    Ok(acl)
}

fn encode_op(w: &mut Writer, op: &Op) {
    match op {
        Op::Create(c) => {
            w.u8(TAG_CREATE);
            w.str(&c.path);
            w.bytes(&c.data);
            encode_acl(w, &c.acl);
            w.i32(c.mode as i32);
            w.i64(c.ttl_ms);
        }
        Op::Delete { path, version } => {
            w.u8(TAG_DELETE);
            w.str(path);
            w.i32(*version);
        }
        Op::SetData { path, data, version } => {
            w.u8(TAG_SET_DATA);
            w.str(path);
            w.bytes(data);
            w.i32(*version);
        }
        Op::Check { path, version } => {
            w.u8(TAG_CHECK);
            w.str(path);
            w.i32(*version);
        }
    }
}

fn decode_op_body(tag: u8, r: &mut Reader<'_>) -> Result<Op, DecodeError> {
    Ok(match tag {
        TAG_CREATE => {
            let path = r.str(PATH_BYTES_MAX)?.to_string();
            let data = r.bytes(DATA_BYTES_MAX)?.to_vec();
            let acl = decode_acl(r)?;
            let flags = r.i32()?;
            let Some(mode) = CreateMode::from_flags(flags) else {
                return r.error(format!("unknown create mode {flags}"));
            };
            let ttl_ms = r.i64()?;
            Op::Create(Create {
                path,
                data,
                acl,
                mode,
                ttl_ms,
            })
        }
        TAG_DELETE => Op::Delete {
            path: r.str(PATH_BYTES_MAX)?.to_string(),
            version: r.i32()?,
        },
        TAG_SET_DATA => Op::SetData {
            path: r.str(PATH_BYTES_MAX)?.to_string(),
            data: r.bytes(DATA_BYTES_MAX)?.to_vec(),
            version: r.i32()?,
        },
        TAG_CHECK => Op::Check {
            path: r.str(PATH_BYTES_MAX)?.to_string(),
            version: r.i32()?,
        },
        other => return r.error(format!("unknown op tag {other}")),
    })
}

/// Bytes [`encode_acl`] writes for `acl`.
fn acl_len(acl: &[Acl]) -> usize {
    4 + acl
        .iter()
        .map(|a| 4 + 4 + a.id.scheme.len() + 4 + a.id.id.len())
        .sum::<usize>()
}

/// Bytes [`encode_op`] writes for `op`.
fn op_len(op: &Op) -> usize {
    1 + match op {
        Op::Create(c) => 4 + c.path.len() + 4 + c.data.len() + acl_len(&c.acl) + 4 + 8,
        Op::Delete { path, .. } | Op::Check { path, .. } => 4 + path.len() + 4,
        Op::SetData { path, data, .. } => 4 + path.len() + 4 + data.len() + 4,
    }
}

impl Write {
    /// The length of [`Write::encode`]'s output, without encoding.
    pub fn encoded_len(&self) -> usize {
        match self {
            Write::Op(op) => op_len(op),
            Write::SetAcl { path, acl, .. } => 1 + 4 + path.len() + acl_len(acl) + 4,
            Write::Multi(ops) => 1 + 4 + ops.iter().map(op_len).sum::<usize>(),
            Write::CreateSession { .. } => 1 + 4,
            Write::CloseSession => 1,
            Write::AddAuth { scheme, auth } => 1 + 4 + scheme.len() + 4 + auth.len(),
            Write::Reap { path } | Write::Sync { path } => 1 + 4 + path.len(),
        }
    }

    pub fn encode(&self, w: &mut Writer) {
        match self {
            Write::Op(op) => encode_op(w, op),
            Write::SetAcl { path, acl, version } => {
                w.u8(TAG_SET_ACL);
                w.str(path);
                encode_acl(w, acl);
                w.i32(*version);
            }
            Write::Multi(ops) => {
                w.u8(TAG_MULTI);
                w.u32(ops.len() as u32);
                for op in ops {
                    encode_op(w, op);
                }
            }
            Write::CreateSession { timeout_ms } => {
                w.u8(TAG_CREATE_SESSION);
                w.i32(*timeout_ms);
            }
            Write::CloseSession => w.u8(TAG_CLOSE_SESSION),
            Write::AddAuth { scheme, auth } => {
                w.u8(TAG_ADD_AUTH);
                w.str(scheme);
                w.bytes(auth);
            }
            Write::Reap { path } => {
                w.u8(TAG_REAP);
                w.str(path);
            }
            Write::Sync { path } => {
                w.u8(TAG_SYNC);
                w.str(path);
            }
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Write, DecodeError> {
        let tag = r.u8()?;
        Ok(match tag {
            TAG_CREATE | TAG_DELETE | TAG_SET_DATA | TAG_CHECK => Write::Op(decode_op_body(tag, r)?),
            TAG_SET_ACL => Write::SetAcl {
                path: r.str(PATH_BYTES_MAX)?.to_string(),
                acl: decode_acl(r)?,
                version: r.i32()?,
            },
            TAG_MULTI => {
                let n = r.count(MULTI_OPS_MAX, 5)?;
                let mut ops = Vec::with_capacity(n);
                for _ in 0..n {
                    let tag = r.u8()?;
                    ops.push(decode_op_body(tag, r)?);
                }
                Write::Multi(ops)
            }
            TAG_CREATE_SESSION => Write::CreateSession { timeout_ms: r.i32()? },
            TAG_CLOSE_SESSION => Write::CloseSession,
            TAG_ADD_AUTH => Write::AddAuth {
                scheme: r.str(ACL_ID_BYTES_MAX)?.to_string(),
                auth: r.bytes(ACL_ID_BYTES_MAX)?.to_vec(),
            },
            TAG_REAP => Write::Reap {
                path: r.str(PATH_BYTES_MAX)?.to_string(),
            },
            TAG_SYNC => Write::Sync {
                path: r.str(PATH_BYTES_MAX)?.to_string(),
            },
            other => return r.error(format!("unknown request tag {other}")),
        })
    }

    /// One line for logs and FATAL lines: the request with its paths and
    /// versions, data by size.
    pub fn describe(&self) -> String {
        fn op(o: &Op) -> String {
            match o {
                Op::Create(c) => format!("create {} {:?} ({} bytes)", c.path, c.mode, c.data.len()),
                Op::Delete { path, version } => format!("delete {path} version {version}"),
                Op::SetData { path, data, version } => {
                    format!("setData {path} version {version} ({} bytes)", data.len())
                }
                Op::Check { path, version } => format!("check {path} version {version}"),
            }
        }
        match self {
            Write::Op(o) => op(o),
            Write::SetAcl { path, version, .. } => format!("setACL {path} version {version}"),
            Write::Multi(ops) => format!("multi [{}]", ops.iter().map(op).collect::<Vec<_>>().join(", ")),
            Write::CreateSession { timeout_ms } => format!("createSession timeout {timeout_ms} ms"),
            Write::CloseSession => "closeSession".into(),
            Write::AddAuth { scheme, .. } => format!("addAuth {scheme}"),
            Write::Reap { path } => format!("reap {path}"),
            Write::Sync { path } => format!("sync {path}"),
        }
    }

    /// A short name for logs and FATAL lines.
    pub fn name(&self) -> &'static str {
        match self {
            Write::Op(Op::Create(_)) => "create",
            Write::Op(Op::Delete { .. }) => "delete",
            Write::Op(Op::SetData { .. }) => "setData",
            Write::Op(Op::Check { .. }) => "check",
            Write::SetAcl { .. } => "setACL",
            Write::Multi(_) => "multi",
            Write::CreateSession { .. } => "createSession",
            Write::CloseSession => "closeSession",
            Write::AddAuth { .. } => "addAuth",
            Write::Reap { .. } => "reap",
            Write::Sync { .. } => "sync",
        }
    }
}
