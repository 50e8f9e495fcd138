//! The client's side of ZooKeeper's wire protocol: requests encoded as a
//! client sends them, replies decoded as a client reads them. The
//! simulator's clients speak to servers with these, so a simulated run
//! exercises the same frames a real client's do.

use crate::jute::{In, JuteError, Out};
use crate::node::Stat;
use crate::proto::{opcode, ConnectRequest, XID_PING, XID_WATCH_EVENT};
use crate::{CreateMode, ZkError};

/// One request a client can send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    Create {
        path: String,
        data: Vec<u8>,
        mode: CreateMode,
    },
    Delete {
        path: String,
        version: i32,
    },
    Exists {
        path: String,
    },
    GetData {
        path: String,
    },
    SetData {
        path: String,
        data: Vec<u8>,
        version: i32,
    },
    GetChildren {
        path: String,
    },
    Sync {
        path: String,
    },
    /// A multi: all of its ops or none.
    Multi(Vec<MultiOp>),
    Close,
    Ping,
}

/// One op of a [`ClientOp::Multi`] (`version` -1: any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MultiOp {
    Create {
        path: String,
        data: Vec<u8>,
        mode: CreateMode,
    },
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: Vec<u8>,
        version: i32,
    },
    Check {
        path: String,
        version: i32,
    },
}

impl MultiOp {
    pub fn opcode(&self) -> i32 {
        match self {
            MultiOp::Create { .. } => opcode::CREATE,
            MultiOp::Delete { .. } => opcode::DELETE,
            MultiOp::SetData { .. } => opcode::SET_DATA,
            MultiOp::Check { .. } => opcode::CHECK,
        }
    }
}

impl ClientOp {
    pub fn opcode(&self) -> i32 {
        match self {
            ClientOp::Create { .. } => opcode::CREATE,
            ClientOp::Delete { .. } => opcode::DELETE,
            ClientOp::Exists { .. } => opcode::EXISTS,
            ClientOp::GetData { .. } => opcode::GET_DATA,
            ClientOp::SetData { .. } => opcode::SET_DATA,
            ClientOp::GetChildren { .. } => opcode::GET_CHILDREN,
            ClientOp::Sync { .. } => opcode::SYNC,
            ClientOp::Multi(_) => opcode::MULTI,
            ClientOp::Close => opcode::CLOSE_SESSION,
            ClientOp::Ping => opcode::PING,
        }
    }
}

/// The frame that opens (or, with a session id and password, resumes) a
/// session.
pub fn encode_connect(timeout_ms: i32, session_id: i64, passwd: &[u8], last_zxid_seen: i64) -> Vec<u8> {
    ConnectRequest {
        protocol_version: 0,
        last_zxid_seen,
        timeout_ms,
        session_id,
        passwd: passwd.to_vec(),
        read_only: Some(false),
    }
    .encode()
}

fn open_acl(o: &mut Out) {
    o.acl(&crate::acl::Acl::open());
}

/// The frame of request `op` under `xid` (a ping's xid is the protocol's).
pub fn encode_request(xid: i32, op: &ClientOp) -> Vec<u8> {
    let mut o = Out::frame();
    o.int(if *op == ClientOp::Ping { XID_PING } else { xid });
    o.int(op.opcode());
    match op {
        ClientOp::Create { path, data, mode } => {
            o.string(path);
            o.buffer(data);
            open_acl(&mut o);
            o.int(*mode as i32);
        }
        ClientOp::Delete { path, version } => {
            o.string(path);
            o.int(*version);
        }
        ClientOp::Exists { path } | ClientOp::GetData { path } | ClientOp::GetChildren { path } => {
            o.string(path);
            o.bool(false);
        }
        ClientOp::SetData { path, data, version } => {
            o.string(path);
            o.buffer(data);
            o.int(*version);
        }
        ClientOp::Sync { path } => o.string(path),
        ClientOp::Multi(ops) => {
            for op in ops {
                o.int(op.opcode());
                o.bool(false);
                o.int(-1);
                match op {
                    MultiOp::Create { path, data, mode } => {
                        o.string(path);
                        o.buffer(data);
                        open_acl(&mut o);
                        o.int(*mode as i32);
                    }
                    MultiOp::Delete { path, version } | MultiOp::Check { path, version } => {
                        o.string(path);
                        o.int(*version);
                    }
                    MultiOp::SetData { path, data, version } => {
                        o.string(path);
                        o.buffer(data);
                        o.int(*version);
                    }
                }
            }
            o.int(-1);
            o.bool(true);
            o.int(-1);
        }
        ClientOp::Close | ClientOp::Ping => {}
    }
    o.finish()
}

/// What a server answered a connect with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    pub timeout_ms: i32,
    /// 0: the session expired (or is unknown).
    pub session_id: i64,
    pub passwd: Vec<u8>,
}

/// Decodes a connect answer (the payload after the frame's length).
pub fn decode_connected(payload: &[u8]) -> Result<Connected, JuteError> {
    let mut r = In::new(payload);
    let _protocol = r.int()?;
    let timeout_ms = r.int()?;
    let session_id = r.long()?;
    let passwd = r.buffer()?.to_vec();
    Ok(Connected {
        timeout_ms,
        session_id,
        passwd,
    })
}

/// A reply's body, as the request it answers shapes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyBody {
    None,
    Path(String),
    Stat(Stat),
    Data(Vec<u8>, Stat),
    Children(Vec<String>),
    /// Per op of a multi: the created path (empty for an op that creates
    /// nothing), or the op's error.
    Multi(Vec<Result<String, ZkError>>),
}

/// One decoded reply (or notification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub xid: i32,
    pub zxid: i64,
    pub err: ZkError,
    pub body: ReplyBody,
}

impl Reply {
    /// Whether it is a watch notification rather than an answer.
    pub fn is_notification(&self) -> bool {
        self.xid == XID_WATCH_EVENT
    }
}

/// The xid a reply frame answers, read before its body (whose shape
/// depends on the request the xid names).
pub fn reply_xid(payload: &[u8]) -> Result<i32, JuteError> {
    In::new(payload).int()
}

/// Decodes a reply to a request of `opcode` (the payload after the
/// frame's length).
pub fn decode_reply(payload: &[u8], op: i32) -> Result<Reply, JuteError> {
    let mut r = In::new(payload);
    let xid = r.int()?;
    let zxid = r.long()?;
    let code = r.int()?;
    let err = match ZkError::from_code(code) {
        Some(e) => e,
        None => return r.fail(format!("unknown error code {code}")),
    };
    if xid == XID_WATCH_EVENT || xid == XID_PING || err != ZkError::Ok {
        return Ok(Reply {
            xid,
            zxid,
            err,
            body: ReplyBody::None,
        });
    }
    let body = match op {
        opcode::CREATE | opcode::SYNC => ReplyBody::Path(r.string()?),
        opcode::SET_DATA | opcode::EXISTS => ReplyBody::Stat(r.stat()?),
        opcode::GET_DATA => {
            let data = r.buffer()?.to_vec();
            ReplyBody::Data(data, r.stat()?)
        }
        opcode::GET_CHILDREN => ReplyBody::Children(r.strings()?),
        opcode::MULTI => {
            let mut results = Vec::new();
            loop {
                let t = r.int()?;
                let done = r.bool()?;
                let code = r.int()?;
                if done {
                    break;
                }
                results.push(match t {
                    opcode::CREATE => Ok(r.string()?),
                    opcode::CREATE2 => {
                        let p = r.string()?;
                        r.stat()?;
                        Ok(p)
                    }
                    opcode::DELETE | opcode::CHECK => Ok(String::new()),
                    opcode::SET_DATA => {
                        r.stat()?;
                        Ok(String::new())
                    }
                    opcode::ERROR => {
                        let e = r.int()?;
                        Err(ZkError::from_code(e)
                            .or(ZkError::from_code(code))
                            .unwrap_or(ZkError::SystemError))
                    }
                    t => return r.fail(format!("a multi answered with opcode {t}")),
                });
            }
            ReplyBody::Multi(results)
        }
        _ => ReplyBody::None,
    };
    Ok(Reply { xid, zxid, err, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{ClientRequest, Request};
    use crate::request::{Op, Write};

    fn payload(frame: &[u8]) -> &[u8] {
        let n = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(n, frame.len() - 4, "the length covers the payload");
        &frame[4..]
    }

    #[test]
    fn requests_decode_on_the_server_as_what_was_meant() {
        let set = encode_request(
            7,
            &ClientOp::SetData {
                path: "/a".into(),
                data: b"1".to_vec(),
                version: 3,
            },
        );
        let r = Request::decode(payload(&set)).unwrap();
        assert_eq!(r.xid, 7);
        match r.body {
            ClientRequest::Write(Write::Op(Op::SetData { path, data, version })) => {
                assert_eq!((path.as_str(), data.as_slice(), version), ("/a", &b"1"[..], 3))
            }
            other => panic!("{other:?}"),
        }
        let multi = encode_request(
            8,
            &ClientOp::Multi(vec![
                MultiOp::Create {
                    path: "/c/x-".into(),
                    data: vec![],
                    mode: CreateMode::PersistentSequential,
                },
                MultiOp::Delete {
                    path: "/c/y".into(),
                    version: 3,
                },
                MultiOp::SetData {
                    path: "/c/z".into(),
                    data: b"1".to_vec(),
                    version: -1,
                },
                MultiOp::Check {
                    path: "/c".into(),
                    version: 0,
                },
            ]),
        );
        match Request::decode(payload(&multi)).unwrap().body {
            ClientRequest::Write(Write::Multi(ops)) => assert_eq!(ops.len(), 4),
            other => panic!("{other:?}"),
        }
        let ping = encode_request(9, &ClientOp::Ping);
        assert_eq!(Request::decode(payload(&ping)).unwrap().xid, XID_PING);
    }

    #[test]
    fn replies_the_server_encodes_decode_as_the_client_reads_them() {
        let stat = Stat {
            version: 4,
            ..Default::default()
        };
        let get = crate::proto::encode_reply(
            5,
            9,
            opcode::GET_DATA,
            &crate::Response::GetData {
                data: b"3".to_vec(),
                stat,
            },
        );
        let r = decode_reply(payload(&get), opcode::GET_DATA).unwrap();
        assert_eq!((r.xid, r.zxid, r.err), (5, 9, ZkError::Ok));
        assert_eq!(r.body, ReplyBody::Data(b"3".to_vec(), stat));
        let err = crate::proto::encode_error(6, 9, ZkError::NoNode);
        assert_eq!(
            decode_reply(payload(&err), opcode::GET_DATA).unwrap().err,
            ZkError::NoNode
        );
        assert!(
            decode_reply(&[1, 2], opcode::GET_DATA).is_err(),
            "a short frame is an error"
        );
    }
}
