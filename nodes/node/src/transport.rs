//! Peer transport: framed messages between nodes over TCP.
//!
//! Each node listens on its Raft address; for each peer it keeps one
//! outbound connection, bound to its own Raft IP (so a per-address-pair
//! firewall rule cuts exactly one link), reconnecting with backoff.
//! Messages to a peer that cannot be reached are dropped: Raft
//! retransmits, and forwarded client requests time out into `info`.
//!
//! Frame: u32 length, then a tag and the body. Bounded: a frame over
//! [`FRAME_BYTES_MAX`] closes that connection.

use socket2::{Domain, Socket, Type};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread;
use std::time::Duration;

/// Largest peer frame: a snapshot chunk of a large tree.
pub const FRAME_BYTES_MAX: usize = 512 << 20;
/// Messages queued per peer before new ones are dropped.
pub const QUEUE_MAX: usize = 4096;
/// A write to a peer blocked this long gives the connection up.
const PEER_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// An inbound peer connection silent this long is closed.
const PEER_IDLE_MAX: Duration = Duration::from_secs(30);
/// Frames queued behind the one a writer woke for go out in the same
/// write, up to this many bytes (one syscall and, with TCP_NODELAY, one
/// segment train instead of one per frame).
pub const COALESCE_BYTES: usize = 256 << 10;
/// Read buffer of a connection: a batch of frames costs one read.
pub const READ_BUFFER_BYTES: usize = 64 << 10;

/// The next frame on `rx` and whatever else is queued right now, as one
/// buffer (see [`coalesce`]); `None` once `rx` is closed.
pub fn next_batch(rx: &Receiver<Vec<u8>>) -> Option<Vec<u8>> {
    Some(coalesce(rx.recv().ok()?, || rx.try_recv().ok()))
}

/// `first` followed by the frames `queued` yields without waiting, up to
/// [`COALESCE_BYTES`]: what a writer sends in one write.
pub fn coalesce(mut first: Vec<u8>, mut queued: impl FnMut() -> Option<Vec<u8>>) -> Vec<u8> {
    while first.len() < COALESCE_BYTES {
        match queued() {
            Some(frame) => first.extend_from_slice(&frame),
            None => break,
        }
    }
    first
}

/// What travels between nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerMsg {
    /// A Raft message (protobuf bytes).
    Raft(Vec<u8>),
    /// A client write for the leader to propose: origin node, its request
    /// id, the session, and the encoded request.
    Forward {
        origin: u64,
        req: u64,
        session: i64,
        write: Vec<u8>,
    },
    /// The leader could not propose a forwarded request.
    Refused { req: u64 },
    /// Sessions alive on the sender since its last touch.
    Touch { sessions: Vec<i64> },
}

impl PeerMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        match self {
            PeerMsg::Raft(m) => {
                b.push(1);
                b.extend_from_slice(m);
            }
            PeerMsg::Forward {
                origin,
                req,
                session,
                write,
            } => {
                b.push(2);
                b.extend_from_slice(&origin.to_be_bytes());
                b.extend_from_slice(&req.to_be_bytes());
                b.extend_from_slice(&session.to_be_bytes());
                b.extend_from_slice(write);
            }
            PeerMsg::Refused { req } => {
                b.push(3);
                b.extend_from_slice(&req.to_be_bytes());
            }
            PeerMsg::Touch { sessions } => {
                b.push(4);
                for s in sessions {
                    b.extend_from_slice(&s.to_be_bytes());
                }
            }
        }
        let n = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&n.to_be_bytes());
        b
    }

    pub fn decode(p: &[u8]) -> Result<PeerMsg, String> {
        let (&tag, body) = p.split_first().ok_or("empty peer frame")?;
        let word = |i: usize| -> Result<[u8; 8], String> {
            body.get(i..i + 8)
                .map(|s| s.try_into().expect("8 bytes"))
                .ok_or_else(|| "peer frame too short".to_string())
        };
        Ok(match tag {
            1 => PeerMsg::Raft(body.to_vec()),
            2 => PeerMsg::Forward {
                origin: u64::from_be_bytes(word(0)?),
                req: u64::from_be_bytes(word(8)?),
                session: i64::from_be_bytes(word(16)?),
                write: body.get(24..).unwrap_or_default().to_vec(),
            },
            3 => PeerMsg::Refused {
                req: u64::from_be_bytes(word(0)?),
            },
            4 => {
                if body.len() % 8 != 0 {
                    return Err("touch frame not a multiple of 8".into());
                }
                PeerMsg::Touch {
                    sessions: body
                        .chunks(8)
                        .map(|c| i64::from_be_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                }
            }
            t => return Err(format!("unknown peer message tag {t}")),
        })
    }
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub fn read_frame(s: &mut impl Read, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    read_body(s, u32::from_be_bytes(len), max).map(Some)
}

/// Reads the body of a frame whose header said `len` bytes (at most `max`).
pub fn read_body(s: &mut impl Read, len: u32, max: usize) -> std::io::Result<Vec<u8>> {
    let mut body = Body::new(len, max)?;
    s.take(body.len as u64).read_to_end(&mut body.buf)?;
    body.complete()
}

/// A frame body being read: checked against the most a frame may hold
/// before anything is read, and a buffer that grows with what arrives,
/// not with what the header claims. Serves blocking and async readers.
pub struct Body {
    pub len: usize,
    pub buf: Vec<u8>,
}

impl Body {
    pub fn new(len: u32, max: usize) -> std::io::Result<Body> {
        let len = len as usize;
        if len > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("frame of {len} bytes"),
            ));
        }
        Ok(Body {
            len,
            buf: Vec::with_capacity(len.min(READ_BUFFER_BYTES)),
        })
    }

    /// The body, once all of it arrived.
    pub fn complete(self) -> std::io::Result<Vec<u8>> {
        if self.buf.len() < self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("frame of {} bytes cut at {}", self.len, self.buf.len()),
            ));
        }
        Ok(self.buf)
    }
}

/// Connects from `local_ip` (port chosen by the OS) to `to`.
pub fn connect_from(local_ip: std::net::IpAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(local_ip, 0).into())?;
    socket.connect_timeout(&to.into(), timeout)?;
    let s: TcpStream = socket.into();
    s.set_nodelay(true)?;
    Ok(s)
}

/// Outbound links to every peer.
pub struct Links {
    senders: Vec<(u64, SyncSender<Vec<u8>>)>,
}

impl Links {
    /// Starts one sender thread per peer.
    pub fn start(me: u64, local_ip: std::net::IpAddr, peers: &[(u64, SocketAddr)]) -> Links {
        let mut senders = Vec::new();
        for &(id, addr) in peers.iter().filter(|(id, _)| *id != me) {
            let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(QUEUE_MAX);
            thread::Builder::new()
                .name(format!("peer-{id}"))
                .spawn(move || sender_loop(local_ip, addr, rx))
                .expect("spawn peer sender");
            senders.push((id, tx));
        }
        Links { senders }
    }

    /// Queues a message for `to`; drops it if the queue is full.
    pub fn send(&self, to: u64, msg: &PeerMsg) {
        if let Some((_, tx)) = self.senders.iter().find(|(id, _)| *id == to) {
            match tx.try_send(msg.encode()) {
                Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }
}

fn sender_loop(local_ip: std::net::IpAddr, addr: SocketAddr, rx: Receiver<Vec<u8>>) {
    let mut conn: Option<TcpStream> = None;
    let mut backoff = Duration::from_millis(20);
    while let Some(frames) = next_batch(&rx) {
        if conn.is_none() {
            match connect_from(local_ip, addr, Duration::from_millis(500)) {
                Ok(s) => {
                    backoff = Duration::from_millis(20);
                    // a write stuck behind a cut link gives up, and the
                    // next message reconnects
                    let _ = s.set_write_timeout(Some(PEER_WRITE_TIMEOUT));
                    conn = Some(s);
                }
                Err(_) => {
                    // drop this message and whatever queued meanwhile
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    while rx.try_recv().is_ok() {}
                    continue;
                }
            }
        }
        if let Some(s) = conn.as_mut() {
            if s.write_all(&frames).is_err() {
                conn = None;
            }
        }
    }
}

/// Accepts peer connections and hands every decoded message to `deliver`.
pub fn listen(listener: TcpListener, deliver: impl Fn(PeerMsg) -> bool + Send + Clone + 'static) {
    thread::Builder::new()
        .name("peer-listener".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(s) = stream else { continue };
                let deliver = deliver.clone();
                let _ = thread::Builder::new().name("peer-in".into()).spawn(move || {
                    let _ = s.set_nodelay(true);
                    // a link silent this long is dead (its sender reconnects)
                    let _ = s.set_read_timeout(Some(PEER_IDLE_MAX));
                    let mut s = BufReader::with_capacity(READ_BUFFER_BYTES, s);
                    while let Ok(Some(frame)) = read_frame(&mut s, FRAME_BYTES_MAX) {
                        match PeerMsg::decode(&frame) {
                            Ok(m) => {
                                if !deliver(m) {
                                    return;
                                }
                            }
                            Err(_) => return,
                        }
                    }
                });
            }
        })
        .expect("spawn peer listener");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_messages_round_trip() {
        for m in [
            PeerMsg::Raft(vec![1, 2, 3]),
            PeerMsg::Forward {
                origin: 2,
                req: 9,
                session: -1,
                write: vec![7; 5],
            },
            PeerMsg::Refused { req: 4 },
            PeerMsg::Touch { sessions: vec![1, 5] },
        ] {
            let bytes = m.encode();
            assert_eq!(PeerMsg::decode(&bytes[4..]).unwrap(), m);
        }
        assert!(PeerMsg::decode(&[9]).is_err());
        assert!(PeerMsg::decode(&[2, 1]).is_err());
    }
}
