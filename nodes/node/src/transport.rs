//! Peer transport: framed messages between nodes over TCP.
//!
//! Each node listens on its Raft address; for each peer it keeps one
//! outbound connection, bound to its own Raft IP (so a per-address-pair
//! firewall rule cuts exactly one link), reconnecting with backoff.
//! Messages to a peer that cannot be reached are dropped: Raft
//! retransmits, and forwarded client requests time out into `info`.
//!
//! A link's writer thread dials, reconnects and writes what cannot go at
//! once. While nothing is queued for it, the sender writes straight into
//! the connection's socket buffer without waiting ([`Links::send_frames`]):
//! on loopback or a healthy link that is every write, and no thread is
//! woken to pass it on. The sender should hand over batches (the keeper's
//! loop sends what one of the server's flushes made for a peer at once):
//! each write is a wake-up of the peer's reader, and the writer thread,
//! by taking everything queued while it woke, used to batch for free.
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
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
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
/// buffer (see [`coalesce`]), and how many frames it holds; `None` once
/// `rx` is closed.
pub fn next_batch(rx: &Receiver<Vec<u8>>) -> Option<(Vec<u8>, usize)> {
    let first = rx.recv().ok()?;
    let mut frames = 1;
    let batch = coalesce(first, || {
        let next = rx.try_recv().ok();
        frames += usize::from(next.is_some());
        next
    });
    Some((batch, frames))
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
    links: Vec<Link>,
}

/// One peer's outbound link, as the sender holds it.
struct Link {
    to: u64,
    /// Frames for the writer thread.
    tx: SyncSender<Vec<u8>>,
    direct: Arc<Mutex<Direct>>,
}

/// What the sender and a link's writer thread share. The writer holds the
/// lock only to update it, never across a write or a dial.
#[derive(Default)]
struct Direct {
    /// The writer's connection, while it has one that works.
    conn: Option<Socket>,
    /// Buffers handed to the writer and not yet written or dropped by it.
    /// The sender writes directly only while this is 0, so frames reach
    /// the socket in the order they were sent.
    queued: usize,
    /// Writes the sender made whole, without the writer.
    direct_sent: u64,
}

fn lock(direct: &Mutex<Direct>) -> MutexGuard<'_, Direct> {
    direct.lock().unwrap_or_else(|e| e.into_inner())
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
    /// Starts one writer thread per peer.
    pub fn start(me: &Identity, peers: &[(u64, SocketAddr)]) -> Links {
        let mut links = Vec::new();
        for &(id, addr) in peers.iter().filter(|(id, _)| *id != me.id) {
            let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(QUEUE_MAX);
            let direct = Arc::new(Mutex::new(Direct::default()));
            let (me, shared) = (me.clone(), direct.clone());
            thread::Builder::new()
                .name(format!("peer-{id}"))
                .spawn(move || sender_loop(&me, id, addr, rx, &shared))
                .expect("spawn peer sender");
            links.push(Link { to: id, tx, direct });
        }
        Links { links }
    }

    /// Sends a message to `to` without blocking (see [`Links::send_frames`]).
    pub fn send(&self, to: u64, msg: &PeerMsg) {
        self.send_frames(to, msg.encode());
    }

    /// Sends encoded messages (whole frames, one after another) to `to`
    /// without blocking: written into the connection's socket buffer at
    /// once when nothing is queued before them and the buffer has room,
    /// otherwise (the rest of them) queued for the link's writer; dropped
    /// if that queue is full.
    pub fn send_frames(&self, to: u64, mut frame: Vec<u8>) {
        let Some(link) = self.links.iter().find(|l| l.to == to) else {
            return;
        };
        let mut direct = lock(&link.direct);
        let mut torn = false;
        if direct.queued == 0 {
            if let Some(conn) = &direct.conn {
                match conn.send_with_flags(&frame, libc::MSG_DONTWAIT) {
                    Ok(n) if n == frame.len() => {
                        direct.direct_sent += 1;
                        return;
                    }
                    // the rest goes through the writer, ahead of anything
                    // sent after it
                    Ok(n) => {
                        torn = n > 0;
                        frame.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    // the writer finds it broken too, and reconnects
                    Err(_) => direct.conn = None,
                }
            }
        }
        if link.tx.try_send(frame).is_ok() {
            direct.queued += 1;
        } else if torn {
            // a frame cut short must not be followed by another on the
            // same stream: the peer drops the connection at the cut
            if let Some(conn) = direct.conn.take() {
                let _ = conn.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl Links {
    /// Writes to `to` that went straight into its socket.
    pub fn direct_sent(&self, to: u64) -> u64 {
        self.links
            .iter()
            .find(|l| l.to == to)
            .map_or(0, |l| lock(&l.direct).direct_sent)
    }

    /// Whether a send to `to` now goes straight into its socket: it has a
    /// connection and nothing queued for its writer.
    pub fn direct_ready(&self, to: u64) -> bool {
        self.links.iter().find(|l| l.to == to).is_some_and(|l| {
            let d = lock(&l.direct);
            d.queued == 0 && d.conn.is_some()
        })
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

/// A link's writer: writes what the sender queued (everything queued at
/// the moment in one write), dialling first when it has no connection,
/// and tells the sender when its queue is empty again. A frame it cannot
/// write is dropped.
fn sender_loop(me: &Identity, to: u64, addr: SocketAddr, rx: Receiver<Vec<u8>>, direct: &Mutex<Direct>) {
    let mut conn: Option<TcpStream> = None;
    let mut backoff = Duration::from_millis(20);
    while let Some((bytes, mut frames)) = next_batch(&rx) {
        if conn.is_none() {
            match dial(me, to, addr) {
                Ok(s) => {
                    backoff = Duration::from_millis(20);
                    let handle = s.try_clone().map(Socket::from).ok();
                    conn = Some(s);
                    lock(direct).conn = handle;
                }
                Err(_) => {
                    // drop this message and whatever queued meanwhile
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    while rx.try_recv().is_ok() {
                        frames += 1;
                    }
                    lock(direct).queued -= frames;
                    continue;
                }
            }
        }
        let written = conn.as_mut().is_some_and(|s| s.write_all(&bytes).is_ok());
        let mut shared = lock(direct);
        if !written {
            conn = None;
            shared.conn = None;
        }
        shared.queued -= frames;
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

    /// Messages go straight into the socket until its buffers are full (a
    /// peer that stops reading), the rest of the one that did not fit and
    /// everything after it through the writer; once the peer reads again,
    /// every message arrives whole and in order.
    #[test]
    fn direct_and_queued_sends_arrive_whole_and_in_order() {
        const BURST: u64 = 400;
        let secret = Arc::new(vec![9u8; 32]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // a rendezvous channel: the peer's reader waits for the test to
        // take each message, so it stops reading while the test does not
        let (tx, rx) = mpsc::sync_channel::<(u64, PeerMsg)>(0);
        let me = |id| Identity {
            id,
            ip: "127.0.0.1".parse().unwrap(),
            secret: secret.clone(),
        };
        listen(
            listener,
            me(2),
            vec![1, 2],
            move |from, msg| tx.send((from, msg)).is_ok(),
            |_, _| {},
        );
        let links = Links::start(&me(1), &[(1, addr), (2, addr)]);
        let msg = |i: u64| {
            let mut body = vec![(i % 251) as u8; 64 << 10];
            body[..8].copy_from_slice(&i.to_be_bytes());
            PeerMsg::Raft(body)
        };
        // the first goes through the writer, which dials
        links.send(2, &msg(0));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), (1, msg(0)));
        // and then hands its connection over once its queue is empty
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !links.direct_ready(2) {
            assert!(std::time::Instant::now() < deadline, "the writer kept its connection");
            thread::yield_now();
        }
        // 25 MiB while nobody reads: more than the socket buffers hold
        for i in 1..=BURST {
            links.send(2, &msg(i));
        }
        let direct = links.direct_sent(2);
        assert!(direct > 0, "no message went straight into the socket");
        assert!(
            direct < BURST,
            "every message fitted the socket buffers: the test proves nothing"
        );
        for i in 1..=BURST {
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)).unwrap(),
                (1, msg(i)),
                "message {i}"
            );
        }
    }
}
