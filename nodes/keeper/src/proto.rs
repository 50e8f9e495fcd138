//! The ZooKeeper client protocol (3.5+), mapped onto the keeper core's
//! requests and responses (`zookeeper.jute`).
//!
//! A connection starts with a ConnectRequest (no header), or with a
//! four-letter word (`ruok`, `mntr`, …: four raw bytes, no frame). After
//! the handshake every frame is a RequestHeader (xid, opcode) and a body;
//! every reply a ReplyHeader (xid, zxid, err) and a body. Watch events
//! use xid −1, pings −2.
//!
//! What is not supported answers an error for that request (the
//! connection stays up): reconfig `ReconfigDisabled`, SASL `Unimplemented`.

use crate::acl::Acl;
use crate::error::ZkError;
use crate::jute::{In, JuteError, Out, Result};
use crate::node::Stat;
use crate::request::{Create, CreateMode, Op, OpResult, Read, Response, Write};
use crate::watch::{WatchEvent, WatchType};

pub mod opcode {
    pub const NOTIFICATION: i32 = 0;
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const CREATE_CONTAINER: i32 = 19;
    pub const CREATE_TTL: i32 = 21;
    pub const CHECK_WATCHES: i32 = 17;
    pub const REMOVE_WATCHES: i32 = 18;
    pub const RECONFIG: i32 = 16;
    pub const MULTI_READ: i32 = 22;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const GET_EPHEMERALS: i32 = 103;
    pub const GET_ALL_CHILDREN_NUMBER: i32 = 104;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const WHO_AM_I: i32 = 107;
    pub const CLOSE_SESSION: i32 = -11;
    pub const ERROR: i32 = -1;
}

/// Special xids.
pub const XID_WATCH_EVENT: i32 = -1;
pub const XID_PING: i32 = -2;
pub const XID_AUTH: i32 = -4;
pub const XID_SET_WATCHES: i32 = -8;

/// The four-letter words a server answers.
pub const FOUR_LETTER_WORDS: [&[u8; 4]; 9] = [
    b"ruok", b"isro", b"envi", b"mntr", b"srvr", b"stat", b"conf", b"dgst", b"lgif",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub protocol_version: i32,
    pub last_zxid_seen: i64,
    pub timeout_ms: i32,
    pub session_id: i64,
    pub passwd: Vec<u8>,
    /// `None`: the client sent no readOnly flag (clients before 3.4, and
    /// ClickHouse's own, whose handshake is exactly 44 bytes). ZooKeeper
    /// then answers without the flag too: such a client reads a 36-byte
    /// answer and refuses any other length.
    pub read_only: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectResponse {
    pub protocol_version: i32,
    pub timeout_ms: i32,
    pub session_id: i64,
    pub passwd: Vec<u8>,
    /// Sent only to a client that sent its own (see [`ConnectRequest`]).
    pub read_only: Option<bool>,
}

/// One read with its watch flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedRead {
    pub read: Read,
    pub watch: bool,
}

/// A decoded client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientRequest {
    /// Goes through the log. `opcode` says how to shape the reply.
    Write(Write),
    Read(WatchedRead),
    /// multiRead: getData / getChildren ops answered together.
    MultiRead(Vec<Read>),
    Ping,
    SetWatches {
        relative_zxid: i64,
        data: Vec<String>,
        exist: Vec<String>,
        child: Vec<String>,
        /// SetWatches2 only: persistent watches, re-registered as they are.
        persistent: Vec<String>,
        persistent_recursive: Vec<String>,
    },
    /// The session's ephemeral znodes whose paths start with `prefix`.
    GetEphemerals {
        prefix: String,
    },
    /// How many nodes are below `path`, at any depth.
    GetAllChildrenNumber {
        path: String,
    },
    /// A persistent watch on `path` (with `recursive`, on its subtree).
    AddWatch {
        path: String,
        recursive: bool,
    },
    /// Who the session is authenticated as.
    WhoAmI,
    /// removeWatches (or, with `check_only`, checkWatches): the session's
    /// watches of `kind` on `path` (`None`: a watcher type ZooKeeper does
    /// not know, answered MarshallingError as ZooKeeper answers it).
    RemoveWatches {
        path: String,
        kind: Option<WatchType>,
        check_only: bool,
    },
    /// A request this server does not serve, answered with `code`:
    /// `ReconfigDisabled` for reconfig (membership comes from the cluster
    /// file, as on a ZooKeeper whose `reconfigEnabled` is false, its
    /// default), `Unimplemented` for any other.
    Unsupported {
        code: ZkError,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub xid: i32,
    pub opcode: i32,
    pub body: ClientRequest,
    /// For a multi: each op's opcode, which shapes its result (a `create`
    /// answers with the path, a `create2` with path and stat).
    pub multi_opcodes: Vec<i32>,
}

impl ConnectRequest {
    pub fn decode(payload: &[u8]) -> Result<ConnectRequest> {
        let mut r = In::new(payload);
        let c = ConnectRequest {
            protocol_version: r.int()?,
            last_zxid_seen: r.long()?,
            timeout_ms: r.int()?,
            session_id: r.long()?,
            passwd: r.buffer()?.to_vec(),
            // 3.4+ clients send it; older ones and ClickHouse's do not
            read_only: if r.remaining() > 0 { Some(r.bool()?) } else { None },
        };
        Ok(c)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::frame();
        o.int(self.protocol_version);
        o.long(self.last_zxid_seen);
        o.int(self.timeout_ms);
        o.long(self.session_id);
        o.buffer(&self.passwd);
        if let Some(r) = self.read_only {
            o.bool(r);
        }
        o.finish()
    }
}

impl ConnectResponse {
    /// The answer that establishes (or re-establishes) `session_id`, to a
    /// client that sent a readOnly flag (`with_flag`) or none.
    pub fn accepted(timeout_ms: i32, session_id: i64, passwd: Vec<u8>, with_flag: bool) -> ConnectResponse {
        ConnectResponse {
            protocol_version: 0,
            timeout_ms,
            session_id,
            passwd,
            read_only: with_flag.then_some(false),
        }
    }

    /// The answer ZooKeeper gives a reconnect to an expired or unknown
    /// session: timeout 0, session 0, a zero password.
    pub fn expired(with_flag: bool) -> ConnectResponse {
        ConnectResponse::accepted(0, 0, vec![0; 16], with_flag)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::frame();
        o.int(self.protocol_version);
        o.int(self.timeout_ms);
        o.long(self.session_id);
        o.buffer(&self.passwd);
        if let Some(r) = self.read_only {
            o.bool(r);
        }
        o.finish()
    }
}

fn create_mode(flags: i32, r: &In<'_>) -> Result<CreateMode> {
    match CreateMode::from_flags(flags) {
        Some(m) => Ok(m),
        None => r.fail(format!("unknown create flags {flags}")),
    }
}

fn decode_create(r: &mut In<'_>, opcode: i32) -> Result<Create> {
    let path = r.string()?;
    let data = r.buffer()?.to_vec();
    let acl = r.acl()?;
    let flags = r.int()?;
    let mode = create_mode(flags, r)?;
    let ttl_ms = if opcode == opcode::CREATE_TTL { r.long()? } else { 0 };
    Ok(Create {
        path,
        data,
        acl,
        mode,
        ttl_ms,
    })
}

fn decode_op(r: &mut In<'_>, op: i32) -> Result<Option<Op>> {
    Ok(Some(match op {
        opcode::CREATE | opcode::CREATE2 | opcode::CREATE_CONTAINER | opcode::CREATE_TTL => {
            Op::Create(decode_create(r, op)?)
        }
        opcode::DELETE => Op::Delete {
            path: r.string()?,
            version: r.int()?,
        },
        opcode::SET_DATA => Op::SetData {
            path: r.string()?,
            data: r.buffer()?.to_vec(),
            version: r.int()?,
        },
        opcode::CHECK => Op::Check {
            path: r.string()?,
            version: r.int()?,
        },
        _ => return Ok(None),
    }))
}

/// A multi's op sequence: (header, op)* then a done header.
fn decode_multi(r: &mut In<'_>) -> Result<Vec<(i32, Op)>> {
    let mut ops = Vec::new();
    loop {
        let t = r.int()?;
        let done = r.bool()?;
        let _err = r.int()?;
        if done {
            return Ok(ops);
        }
        if ops.len() >= crate::request::MULTI_OPS_MAX {
            return r.fail("too many ops in a multi");
        }
        match decode_op(r, t)? {
            Some(op) => ops.push((t, op)),
            None => return r.fail(format!("opcode {t} cannot be part of a multi")),
        }
    }
}

fn decode_multi_read(r: &mut In<'_>) -> Result<Vec<Read>> {
    let mut reads = Vec::new();
    loop {
        let t = r.int()?;
        let done = r.bool()?;
        let _err = r.int()?;
        if done {
            return Ok(reads);
        }
        if reads.len() >= crate::request::MULTI_OPS_MAX {
            return r.fail("too many ops in a multiRead");
        }
        let path = r.string()?;
        let _watch = r.bool()?;
        reads.push(match t {
            opcode::GET_DATA => Read::GetData { path },
            opcode::GET_CHILDREN => Read::GetChildren { path },
            _ => return r.fail(format!("opcode {t} cannot be part of a multiRead")),
        });
    }
}

impl Request {
    /// Decodes a request frame's payload (after the handshake).
    pub fn decode(payload: &[u8]) -> Result<Request> {
        let mut r = In::new(payload);
        let xid = r.int()?;
        let op = r.int()?;
        let mut multi_opcodes = Vec::new();
        let body = match op {
            opcode::PING => ClientRequest::Ping,
            opcode::CLOSE_SESSION => ClientRequest::Write(Write::CloseSession),
            opcode::CREATE | opcode::CREATE2 | opcode::CREATE_CONTAINER | opcode::CREATE_TTL => {
                ClientRequest::Write(Write::Op(Op::Create(decode_create(&mut r, op)?)))
            }
            opcode::DELETE | opcode::SET_DATA | opcode::CHECK => {
                ClientRequest::Write(Write::Op(decode_op(&mut r, op)?.expect("write opcode")))
            }
            opcode::SET_ACL => ClientRequest::Write(Write::SetAcl {
                path: r.string()?,
                acl: r.acl()?,
                version: r.int()?,
            }),
            opcode::SYNC => ClientRequest::Write(Write::Sync { path: r.string()? }),
            opcode::MULTI => {
                let ops = decode_multi(&mut r)?;
                multi_opcodes = ops.iter().map(|(t, _)| *t).collect();
                ClientRequest::Write(Write::Multi(ops.into_iter().map(|(_, o)| o).collect()))
            }
            opcode::MULTI_READ => ClientRequest::MultiRead(decode_multi_read(&mut r)?),
            opcode::AUTH => {
                let _type = r.int()?;
                ClientRequest::Write(Write::AddAuth {
                    scheme: r.string()?,
                    auth: r.buffer()?.to_vec(),
                })
            }
            opcode::EXISTS | opcode::GET_DATA | opcode::GET_CHILDREN | opcode::GET_CHILDREN2 => {
                let path = r.string()?;
                let watch = r.bool()?;
                let read = match op {
                    opcode::EXISTS => Read::Exists { path },
                    opcode::GET_DATA => Read::GetData { path },
                    _ => Read::GetChildren { path },
                };
                ClientRequest::Read(WatchedRead { read, watch })
            }
            opcode::GET_ACL => ClientRequest::Read(WatchedRead {
                read: Read::GetAcl { path: r.string()? },
                watch: false,
            }),
            opcode::SET_WATCHES | opcode::SET_WATCHES2 => {
                let relative_zxid = r.long()?;
                let data = r.strings()?;
                let exist = r.strings()?;
                let child = r.strings()?;
                let (persistent, persistent_recursive) = if op == opcode::SET_WATCHES2 {
                    (r.strings()?, r.strings()?)
                } else {
                    (Vec::new(), Vec::new())
                };
                ClientRequest::SetWatches {
                    relative_zxid,
                    data,
                    exist,
                    child,
                    persistent,
                    persistent_recursive,
                }
            }
            opcode::GET_EPHEMERALS => ClientRequest::GetEphemerals { prefix: r.string()? },
            opcode::GET_ALL_CHILDREN_NUMBER => ClientRequest::GetAllChildrenNumber { path: r.string()? },
            opcode::ADD_WATCH => {
                let path = r.string()?;
                let recursive = match r.int()? {
                    0 => false,
                    1 => true,
                    m => return r.fail(format!("addWatch mode {m}: 0 (persistent) or 1 (persistent recursive)")),
                };
                ClientRequest::AddWatch { path, recursive }
            }
            opcode::WHO_AM_I => ClientRequest::WhoAmI,
            opcode::REMOVE_WATCHES | opcode::CHECK_WATCHES => {
                let path = r.string()?;
                let kind = match r.int()? {
                    1 => Some(WatchType::Child),
                    2 => Some(WatchType::Data),
                    3 => Some(WatchType::Any),
                    4 => Some(WatchType::Persistent),
                    5 => Some(WatchType::PersistentRecursive),
                    _ => None,
                };
                ClientRequest::RemoveWatches {
                    path,
                    kind,
                    check_only: op == opcode::CHECK_WATCHES,
                }
            }
            _ => {
                // unknown or unsupported: the body is skipped whole
                let code = if op == opcode::RECONFIG {
                    ZkError::ReconfigDisabled
                } else {
                    ZkError::Unimplemented
                };
                return Ok(Request {
                    xid,
                    opcode: op,
                    body: ClientRequest::Unsupported { code },
                    multi_opcodes: Vec::new(),
                });
            }
        };
        if r.remaining() != 0 {
            return r.fail(format!("{} trailing bytes after opcode {op}", r.remaining()));
        }
        Ok(Request {
            xid,
            opcode: op,
            body,
            multi_opcodes,
        })
    }
}

/// Encodes a reply: header, and the body shaped by the request's opcode.
pub fn encode_reply(xid: i32, zxid: i64, opcode: i32, resp: &Response) -> Vec<u8> {
    encode_reply_shaped(xid, zxid, opcode, &[], resp)
}

/// [`encode_reply`] with the opcodes of a multi's ops (a `create` op
/// answers with its path only, `create2` and the others with a stat too).
pub fn encode_reply_shaped(xid: i32, zxid: i64, opcode: i32, multi_opcodes: &[i32], resp: &Response) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    let err = resp.error();
    let multi = matches!(resp, Response::Multi { .. });
    // a failed multi reports its errors per op; the header says ok (as
    // ZooKeeper does, and as clients expect to read the results)
    o.int(if multi { 0 } else { err.code() });
    if err != ZkError::Ok && !multi {
        return o.finish();
    }
    match resp {
        Response::Create { path, stat } => {
            o.string(path);
            if opcode != opcode::CREATE {
                o.stat(stat);
            }
        }
        Response::SetData { stat } | Response::SetAcl { stat } | Response::Exists { stat } => o.stat(stat),
        Response::GetData { data, stat } => {
            o.buffer(data);
            o.stat(stat);
        }
        Response::GetChildren { children, stat } => {
            o.strings(children);
            if opcode == opcode::GET_CHILDREN2 {
                o.stat(stat);
            }
        }
        Response::GetAcl { acl, stat } => {
            o.acl(acl);
            o.stat(stat);
        }
        Response::Sync { path } => o.string(path),
        Response::Multi { results, .. } => encode_multi_results(&mut o, results, multi_opcodes),
        Response::Delete
        | Response::Check
        | Response::CloseSession
        | Response::AddAuth
        | Response::CreateSession { .. }
        | Response::Reap { .. }
        | Response::Error(_) => {}
    }
    o.finish()
}

fn encode_multi_results(o: &mut Out, results: &[OpResult], opcodes: &[i32]) {
    for (k, r) in results.iter().enumerate() {
        let plain_create = opcodes.get(k) == Some(&opcode::CREATE);
        let (t, err) = match r {
            OpResult::Create { .. } if plain_create => (opcode::CREATE, 0),
            OpResult::Create { .. } => (opcode::CREATE2, 0),
            OpResult::Delete => (opcode::DELETE, 0),
            OpResult::SetData { .. } => (opcode::SET_DATA, 0),
            OpResult::Check => (opcode::CHECK, 0),
            OpResult::Error(e) => (opcode::ERROR, e.code()),
        };
        o.int(t);
        o.bool(false);
        o.int(err);
        match r {
            OpResult::Create { path, stat } => {
                o.string(path);
                if !plain_create {
                    o.stat(stat);
                }
            }
            OpResult::SetData { stat } => o.stat(stat),
            OpResult::Error(e) => o.int(e.code()),
            OpResult::Delete | OpResult::Check => {}
        }
    }
    o.int(-1);
    o.bool(true);
    o.int(-1);
}

/// Encodes a multiRead reply: per op a header and either its response or
/// an error.
pub fn encode_multi_read(xid: i32, zxid: i64, reads: &[(Read, Response)]) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    o.int(0);
    for (read, resp) in reads {
        let err = resp.error();
        let t = if err != ZkError::Ok {
            opcode::ERROR
        } else if matches!(read, Read::GetData { .. }) {
            opcode::GET_DATA
        } else {
            opcode::GET_CHILDREN
        };
        o.int(t);
        o.bool(false);
        o.int(err.code());
        match resp {
            Response::GetData { data, stat } => {
                o.buffer(data);
                o.stat(stat);
            }
            Response::GetChildren { children, .. } => o.strings(children),
            _ => o.int(err.code()),
        }
    }
    o.int(-1);
    o.bool(true);
    o.int(-1);
    o.finish()
}

/// A watch notification frame (state 3 = SyncConnected).
pub fn encode_watch_event(zxid: i64, e: &WatchEvent) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(XID_WATCH_EVENT);
    o.long(zxid);
    o.int(0);
    o.int(e.kind as i32);
    o.int(3);
    o.string(&e.path);
    o.finish()
}

/// A reply whose body is a vector of strings (getEphemerals).
pub fn encode_strings_reply(xid: i32, zxid: i64, items: &[String]) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    o.int(0);
    o.strings(items);
    o.finish()
}

/// getAllChildrenNumber's reply.
pub fn encode_count_reply(xid: i32, zxid: i64, count: i32) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    o.int(0);
    o.int(count);
    o.finish()
}

/// whoAmI's reply: (scheme, user) of each identity the session holds.
pub fn encode_who_am_i(xid: i32, zxid: i64, users: &[(String, String)]) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    o.int(0);
    o.int(users.len() as i32);
    for (scheme, user) in users {
        o.string(scheme);
        o.string(user);
    }
    o.finish()
}

/// A reply whose body is an ErrorResponse (addWatch answers so).
pub fn encode_error_response(xid: i32, zxid: i64, err: ZkError) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    o.int(err.code());
    o.int(err.code());
    o.finish()
}

/// A reply carrying only an error code (also used for pings with Ok).
pub fn encode_error(xid: i32, zxid: i64, err: ZkError) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(xid);
    o.long(zxid);
    o.int(err.code());
    o.finish()
}

/// The stat a client gets back, for tests and tools.
pub fn decode_stat(payload: &[u8]) -> std::result::Result<Stat, JuteError> {
    In::new(payload).stat()
}

/// The ACL a client sent, for tests and tools.
pub fn decode_acl(payload: &[u8]) -> std::result::Result<Vec<Acl>, JuteError> {
    In::new(payload).acl()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_payload(f: &[u8]) -> &[u8] {
        let n = i32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(n + 4, f.len());
        &f[4..]
    }

    #[test]
    fn connect_request_round_trips_with_and_without_read_only() {
        let c = ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: 7,
            timeout_ms: 30_000,
            session_id: 0,
            passwd: vec![0; 16],
            read_only: Some(true),
        };
        let bytes = c.encode();
        assert_eq!(ConnectRequest::decode(frame_payload(&bytes)).unwrap(), c);
        let old = &frame_payload(&bytes)[..frame_payload(&bytes).len() - 1];
        assert_eq!(ConnectRequest::decode(old).unwrap().read_only, None);
    }

    #[test]
    fn a_client_without_the_read_only_flag_gets_the_36_byte_answer() {
        // ClickHouse's client sends 44 bytes and refuses any answer but 36
        let old = ConnectResponse::accepted(30_000, 7, vec![1; 16], false).encode();
        assert_eq!(frame_payload(&old).len(), 36);
        let new = ConnectResponse::accepted(30_000, 7, vec![1; 16], true).encode();
        assert_eq!(frame_payload(&new).len(), 37);
        assert_eq!(frame_payload(&ConnectResponse::expired(false).encode()).len(), 36);
    }

    #[test]
    fn create_request_decodes_like_zookeeper_sends_it() {
        let mut o = Out::default();
        o.int(5);
        o.int(opcode::CREATE2);
        o.string("/a");
        o.buffer(b"x");
        o.acl(&Acl::open());
        o.int(CreateMode::EphemeralSequential as i32);
        let r = Request::decode(&o.buf).unwrap();
        assert_eq!(r.xid, 5);
        let ClientRequest::Write(Write::Op(Op::Create(c))) = r.body else {
            panic!()
        };
        assert_eq!((c.path.as_str(), c.mode), ("/a", CreateMode::EphemeralSequential));
    }

    #[test]
    fn remove_watches_reads_its_type_and_keeps_an_unknown_one_to_answer() {
        for (opcode, check_only) in [(opcode::REMOVE_WATCHES, false), (opcode::CHECK_WATCHES, true)] {
            for (t, kind) in [
                (1, Some(WatchType::Child)),
                (5, Some(WatchType::PersistentRecursive)),
                (9, None),
            ] {
                let mut o = Out::default();
                o.int(3);
                o.int(opcode);
                o.string("/w");
                o.int(t);
                assert_eq!(
                    Request::decode(&o.buf).unwrap().body,
                    ClientRequest::RemoveWatches {
                        path: "/w".into(),
                        kind,
                        check_only
                    }
                );
            }
        }
    }

    #[test]
    fn unknown_opcodes_are_unsupported_not_errors() {
        let mut o = Out::default();
        o.int(9);
        o.int(opcode::RECONFIG);
        o.string("whatever");
        assert_eq!(
            Request::decode(&o.buf).unwrap().body,
            ClientRequest::Unsupported {
                code: ZkError::ReconfigDisabled
            }
        );
        let mut o = Out::default();
        o.int(9);
        o.int(102); // sasl
        o.buffer(b"token");
        assert_eq!(
            Request::decode(&o.buf).unwrap().body,
            ClientRequest::Unsupported {
                code: ZkError::Unimplemented
            }
        );
    }

    #[test]
    fn truncated_and_trailing_bytes_are_errors() {
        let mut o = Out::default();
        o.int(1);
        o.int(opcode::GET_DATA);
        o.string("/a");
        o.bool(true);
        assert!(Request::decode(&o.buf).is_ok());
        assert!(Request::decode(&o.buf[..o.buf.len() - 1]).is_err());
        let mut extra = o.buf.clone();
        extra.push(0);
        assert!(Request::decode(&extra).is_err());
    }

    #[test]
    fn multi_reply_has_zookeepers_shape() {
        let resp = Response::Multi {
            error: ZkError::NoNode,
            results: vec![OpResult::Error(ZkError::Ok), OpResult::Error(ZkError::NoNode)],
        };
        let f = encode_reply(3, 9, opcode::MULTI, &resp);
        let mut r = In::new(frame_payload(&f));
        assert_eq!((r.int().unwrap(), r.long().unwrap(), r.int().unwrap()), (3, 9, 0));
        for code in [0, -101] {
            assert_eq!(
                (r.int().unwrap(), r.bool().unwrap(), r.int().unwrap()),
                (-1, false, code)
            );
            assert_eq!(r.int().unwrap(), code);
        }
        assert_eq!((r.int().unwrap(), r.bool().unwrap(), r.int().unwrap()), (-1, true, -1));
        assert_eq!(r.remaining(), 0);
    }
}
