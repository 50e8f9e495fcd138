//! Peer transport: framed messages between nodes over TCP.
//!
//! Each node listens on its Raft address; for each peer it keeps one
//! outbound connection, bound to its own Raft IP (so a per-address-pair
//! firewall rule cuts exactly one link), reconnecting with backoff.
//! Messages to a peer that cannot be reached are dropped: Raft
//! retransmits, and forwarded client requests time out into `info`.
//!
//! Every connection starts with the handshake of [`crate::peer_auth`]; an
//! inbound connection that fails it is closed before a frame is read, and
//! every message on one that passes is delivered as the authenticated
//! peer's. At most [`INBOUND_CONNS_MAX`] inbound connections at a time.
//!
//! Frame: u32 length, then a tag and the body. Bounded by the tag: a
//! snapshot may be up to [`SNAPSHOT_FRAME_BYTES_MAX`], anything else up to
//! [`FRAME_BYTES_MAX`]; a frame over its bound closes the connection
//! before its body is read, and a body's buffer grows with the bytes that
//! arrive, not with what the header claims.

pub use drift_keeper::peer::{frame_bytes_max, PeerMsg, FRAME_BYTES_MAX, SNAPSHOT_FRAME_BYTES_MAX};
use socket2::{Domain, Socket, Type};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Inbound peer connections at a time (each holds a thread); more are
/// closed at once. A cluster has at most 14 other peers, each with one
/// link and the odd reconnect.
pub const INBOUND_CONNS_MAX: usize = 64;
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

/// Reads one peer frame (tag and body), held to its tag's bound
/// ([`frame_bytes_max`]) before the body is read; `Ok(None)` at a clean
/// end of stream.
pub fn read_frame(s: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = [0u8; 5];
    match s.read_exact(&mut head[..4]) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(head[..4].try_into().expect("4 bytes"));
    if len == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "empty peer frame"));
    }
    s.read_exact(&mut head[4..])?;
    let tag = head[4];
    let mut body = Body::new(len - 1, frame_bytes_max(tag) - 1)?;
    body.buf.push(tag);
    body.len += 1;
    s.take(body.len as u64 - 1).read_to_end(&mut body.buf)?;
    body.complete().map(Some)
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

/// Who this node is to its peers: its id, the address it dials from, and
/// the cluster secret it proves itself with.
#[derive(Clone)]
pub struct Identity {
    pub id: u64,
    pub ip: std::net::IpAddr,
    pub secret: Arc<Vec<u8>>,
}

impl Links {
    /// Starts one sender thread per peer.
    pub fn start(me: &Identity, peers: &[(u64, SocketAddr)]) -> Links {
        let mut senders = Vec::new();
        for &(id, addr) in peers.iter().filter(|(id, _)| *id != me.id) {
            let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(QUEUE_MAX);
            let me = me.clone();
            thread::Builder::new()
                .name(format!("peer-{id}"))
                .spawn(move || sender_loop(&me, id, addr, rx))
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

/// Dials peer `to` at `addr` and authenticates both ways.
fn dial(me: &Identity, to: u64, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut s = connect_from(me.ip, addr, Duration::from_millis(500))?;
    crate::peer_auth::connect(&mut s, &me.secret, me.id, to)?;
    // a write stuck behind a cut link gives up, and the next message
    // reconnects
    s.set_write_timeout(Some(PEER_WRITE_TIMEOUT))?;
    Ok(s)
}

fn sender_loop(me: &Identity, to: u64, addr: SocketAddr, rx: Receiver<Vec<u8>>) {
    let mut conn: Option<TcpStream> = None;
    let mut backoff = Duration::from_millis(20);
    while let Some(frames) = next_batch(&rx) {
        if conn.is_none() {
            match dial(me, to, addr) {
                Ok(s) => {
                    backoff = Duration::from_millis(20);
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

/// Accepts peer connections; each that authenticates as one of `peers`
/// hands its decoded messages to `deliver` with that peer's id, until
/// `deliver` returns false, a frame is malformed or over its bound, or
/// the link is idle for [`PEER_IDLE_MAX`]. `log` hears why a connection
/// was refused or closed.
pub fn listen(
    listener: TcpListener,
    me: Identity,
    peers: Vec<u64>,
    deliver: impl Fn(u64, PeerMsg) -> bool + Send + Clone + 'static,
    log: impl Fn(&str, String) + Send + Clone + 'static,
) {
    let open = Arc::new(AtomicUsize::new(0));
    thread::Builder::new()
        .name("peer-listener".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let Some(slot) = Slot::take(&open, INBOUND_CONNS_MAX) else {
                    log(
                        "peer_refused",
                        format!("more than {INBOUND_CONNS_MAX} inbound peer connections"),
                    );
                    continue;
                };
                let (deliver, log, me, peers) = (deliver.clone(), log.clone(), me.clone(), peers.clone());
                let _ = thread::Builder::new().name("peer-in".into()).spawn(move || {
                    let _slot = slot;
                    let from = match crate::peer_auth::accept(&mut s, &me.secret, me.id, &peers) {
                        Ok(from) => from,
                        Err(e) => {
                            let who = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                            log("peer_refused", format!("{who}: {e}"));
                            return;
                        }
                    };
                    let _ = s.set_nodelay(true);
                    // a link silent this long is dead (its sender reconnects)
                    let _ = s.set_read_timeout(Some(PEER_IDLE_MAX));
                    let mut s = BufReader::with_capacity(READ_BUFFER_BYTES, s);
                    loop {
                        let frame = match read_frame(&mut s) {
                            Ok(Some(f)) => f,
                            Ok(None) => return,
                            Err(e) => {
                                if e.kind() != std::io::ErrorKind::WouldBlock
                                    && e.kind() != std::io::ErrorKind::TimedOut
                                {
                                    log("peer_closed", format!("peer {from}: {e}"));
                                }
                                return;
                            }
                        };
                        match PeerMsg::decode(&frame) {
                            Ok(m) => {
                                if !deliver(from, m) {
                                    return;
                                }
                            }
                            Err(e) => {
                                log("peer_closed", format!("peer {from}: {e}"));
                                return;
                            }
                        }
                    }
                });
            }
        })
        .expect("spawn peer listener");
}

/// A connection's place in a bounded count, given back when dropped
/// (also when the thread holding it panics, or was never started).
pub struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A place in `count` if fewer than `max` are taken.
    pub fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        if count.fetch_add(1, Ordering::SeqCst) >= max {
            count.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_held_to_their_tags_bound_before_the_body_is_read() {
        let frame = |len: u32, tag: u8| {
            let mut b = len.to_be_bytes().to_vec();
            b.push(tag);
            b
        };
        // a Raft frame declaring more than FRAME_BYTES_MAX: refused on its
        // header, with no body sent at all
        let over = (FRAME_BYTES_MAX + 1) as u32;
        let e = read_frame(&mut &frame(over, drift_keeper::peer::TAG_RAFT)[..]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        // the same length is within a snapshot's bound: it waits for bytes
        let e = read_frame(&mut &frame(over, drift_keeper::peer::TAG_SNAPSHOT)[..]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        let e = read_frame(&mut &frame((SNAPSHOT_FRAME_BYTES_MAX + 1) as u32, drift_keeper::peer::TAG_SNAPSHOT)[..])
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(read_frame(&mut &[0u8, 0, 0, 0][..]).is_err());
        let m = PeerMsg::Touch { sessions: vec![3] };
        assert_eq!(
            read_frame(&mut &m.encode()[..])
                .unwrap()
                .map(|f| PeerMsg::decode(&f).unwrap()),
            Some(m)
        );
        assert_eq!(read_frame(&mut &[][..]).unwrap(), None);
    }
}
