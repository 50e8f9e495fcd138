//! Peer authentication: a challenge–response handshake on every peer
//! connection, keyed by the cluster secret (the cluster file's `secret`).
//!
//! The dialing node (C) and the accepting node (A) each prove they hold
//! the secret over nonces the other chose, so neither a stranger nor a
//! replay of an old handshake gets a connection:
//!
//! ```text
//! C → A  hello:  "drftpeer" | version u8 | from u64 | to u64 | nonce_c [32]
//! A → C  nonce_a [32] | HMAC-SHA256(secret, "acceptor"  | hello | nonce_a)
//! C → A           HMAC-SHA256(secret, "connector" | hello | nonce_a)
//! ```
//!
//! A checks the hello (magic, version, `to` is itself, `from` a peer of
//! the cluster other than itself) before it answers, and the connector's
//! MAC before it reads a single frame; C checks A's MAC before it sends
//! its own. The whole handshake has a deadline ([`HANDSHAKE_TIMEOUT`]).
//! After it, the connection is bound to the peer id `from`: every message
//! on it is taken as that peer's (see `keeper_node`).
//!
//! What it does not do: encrypt, or authenticate each frame. It keeps
//! out whoever can reach the port without the secret; an attacker who can
//! rewrite an established TCP stream is outside its fault model.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"drftpeer";
const VERSION: u8 = 1;
const NONCE_BYTES: usize = 32;
const MAC_BYTES: usize = 32;
const HELLO_BYTES: usize = MAGIC.len() + 1 + 8 + 8 + NONCE_BYTES;
/// A handshake not done within this is abandoned (a silent or slow
/// stranger holds a connection slot no longer than this).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Fewest secret bytes accepted: 128 bits.
pub const SECRET_BYTES_MIN: usize = 16;
/// What a generated secret holds: 256 bits.
const SECRET_BYTES_NEW: usize = 32;

pub use crate::http_auth::hmac_sha256;
use crate::http_auth::verify_hmac;

/// Bytes from the kernel's random source.
fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// A new cluster secret, as the cluster file holds it (hex).
pub fn new_secret() -> std::io::Result<String> {
    Ok(hex(&random::<SECRET_BYTES_NEW>()?))
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The bytes of an even number of hex digits; `None` for anything else.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// The secret's bytes from its hex form, at least [`SECRET_BYTES_MIN`].
pub fn parse_secret(text: &str) -> Result<Vec<u8>, String> {
    let bytes = unhex(text.trim()).ok_or("secret must be hex digits (an even number of them)")?;
    if bytes.len() < SECRET_BYTES_MIN {
        return Err(format!(
            "secret of {} bytes is too short: at least {SECRET_BYTES_MIN} (32 hex digits)",
            bytes.len()
        ));
    }
    Ok(bytes)
}

fn refused(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.into())
}

/// Reads exactly `buf.len()` bytes by `deadline`: the timeout of each
/// read is what is left of the whole handshake's, so a peer trickling a
/// byte at a time is cut at the deadline, not after a timeout per byte.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("handshake not done within {HANDSHAKE_TIMEOUT:?}"),
            ));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(())
}

/// The dialing side: proves to peer `to` that node `me` holds `secret`,
/// and checks that `to` does. Leaves the stream's read timeout unset.
pub fn connect(s: &mut TcpStream, secret: &[u8], me: u64, to: u64) -> std::io::Result<()> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.extend_from_slice(&me.to_be_bytes());
    hello.extend_from_slice(&to.to_be_bytes());
    hello.extend_from_slice(&random::<NONCE_BYTES>()?);
    s.write_all(&hello)?;
    let mut answer = [0u8; NONCE_BYTES + MAC_BYTES];
    read_by(s, &mut answer, deadline)?;
    let (nonce_a, mac_a) = answer.split_at(NONCE_BYTES);
    if !verify_hmac(secret, &[b"acceptor", &hello, nonce_a], mac_a) {
        return Err(refused(format!("peer {to} does not hold the cluster secret")));
    }
    s.write_all(&hmac_sha256(secret, &[b"connector", &hello, nonce_a]))?;
    s.set_write_timeout(None)?;
    s.set_read_timeout(None)
}

/// The accepting side: the id of the peer that proved it holds `secret`,
/// or an error (the caller closes the connection; nothing was read past
/// the handshake). `peers` are the cluster's ids; `me` is this node.
pub fn accept(s: &mut TcpStream, secret: &[u8], me: u64, peers: &[u64]) -> std::io::Result<u64> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut hello = [0u8; HELLO_BYTES];
    read_by(s, &mut hello, deadline)?;
    let word = |at: usize| u64::from_be_bytes(hello[at..at + 8].try_into().expect("8 bytes"));
    let (from, to) = (word(9), word(17));
    if &hello[..8] != MAGIC || hello[8] != VERSION {
        return Err(refused("not a drift peer handshake"));
    }
    if to != me || from == me || !peers.contains(&from) {
        return Err(refused(format!("hello from {from} to {to}: not a link of this node")));
    }
    let nonce_a = random::<NONCE_BYTES>()?;
    let mut answer = nonce_a.to_vec();
    answer.extend_from_slice(&hmac_sha256(secret, &[b"acceptor", &hello, &nonce_a]));
    s.write_all(&answer)?;
    let mut mac_c = [0u8; MAC_BYTES];
    read_by(s, &mut mac_c, deadline)?;
    if !verify_hmac(secret, &[b"connector", &hello, &nonce_a], &mac_c) {
        return Err(refused(format!("peer {from} does not hold the cluster secret")));
    }
    s.set_write_timeout(None)?;
    s.set_read_timeout(None)?;
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn secrets_are_hex_of_at_least_128_bits() {
        assert_eq!(parse_secret(&"ab".repeat(16)).unwrap(), vec![0xab; 16]);
        assert!(parse_secret(&"ab".repeat(15)).unwrap_err().contains("too short"));
        assert!(parse_secret("xyz").unwrap_err().contains("hex"));
        assert_eq!(parse_secret(&new_secret().unwrap()).unwrap().len(), 32);
    }

    /// Runs `accept` on one end of a loopback connection and `dial` on the
    /// other; the acceptor's outcome.
    fn handshake(acceptor_secret: &[u8], dial: impl FnOnce(&mut TcpStream) + Send + 'static) -> std::io::Result<u64> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            dial(&mut s);
        });
        let (mut s, _) = l.accept().unwrap();
        let r = accept(&mut s, acceptor_secret, 1, &[1, 2, 3]);
        drop(s);
        t.join().unwrap();
        r
    }

    #[test]
    fn a_peer_with_the_secret_is_accepted_as_itself() {
        let r = handshake(&[7; 16], |s| connect(s, &[7; 16], 2, 1).unwrap());
        assert_eq!(r.unwrap(), 2);
    }

    #[test]
    fn a_wrong_secret_fails_on_both_sides() {
        let r = handshake(&[7; 16], |s| {
            let e = connect(s, &[8; 16], 2, 1).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        });
        // the connector gave up before sending its MAC
        assert!(r.is_err());
    }

    #[test]
    fn strangers_and_wrong_ids_are_refused() {
        // not a handshake at all: a peer frame sent straight away
        let r = handshake(&[7; 16], |s| {
            let _ = s.write_all(&[0, 0, 0, 9, 2, 0, 0, 0, 0, 0, 0, 0, 2]);
            let _ = s.write_all(&[0; 64]);
        });
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
        // claiming to be the acceptor itself, or a node not in the cluster
        for from in [1, 9] {
            let r = handshake(&[7; 16], move |s| {
                let _ = connect(s, &[7; 16], from, 1);
            });
            assert!(r.is_err(), "from {from}");
        }
    }

    #[test]
    fn a_replayed_connector_mac_does_not_pass() {
        // a recorded MAC for one nonce is useless under the next nonce_a
        let r = handshake(&[7; 16], |s| {
            let mut hello = MAGIC.to_vec();
            hello.push(VERSION);
            hello.extend_from_slice(&2u64.to_be_bytes());
            hello.extend_from_slice(&1u64.to_be_bytes());
            hello.extend_from_slice(&[0; NONCE_BYTES]);
            s.write_all(&hello).unwrap();
            let mut answer = [0u8; NONCE_BYTES + MAC_BYTES];
            s.read_exact(&mut answer).unwrap();
            let stale_nonce = [0u8; NONCE_BYTES];
            let _ = s.write_all(&hmac_sha256(&[7; 16], &[b"connector", &hello, &stale_nonce]));
        });
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn a_stranger_trickling_its_hello_is_cut_at_the_handshake_deadline() {
        // a byte every 250 ms would take 14 s for the hello; a timeout per
        // read would wait for all of it, the handshake's deadline does not
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = sent.clone();
        let r = handshake(&[7; 16], move |s| {
            let mut hello = MAGIC.to_vec();
            hello.push(VERSION);
            hello.extend_from_slice(&2u64.to_be_bytes());
            hello.extend_from_slice(&1u64.to_be_bytes());
            hello.extend_from_slice(&[0; NONCE_BYTES]);
            for b in hello {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let kind = r.unwrap_err().kind();
        assert!(
            matches!(kind, std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock),
            "{kind:?}"
        );
        let at_cut = sent.load(std::sync::atomic::Ordering::SeqCst);
        assert!(at_cut < HELLO_BYTES, "the whole hello ({at_cut} bytes) got through");
    }
}
