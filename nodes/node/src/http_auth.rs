//! Requests between servers over HTTP — the kv service's `/internal/*`
//! (merges, replica reads, repair sessions) and the table's part fetches —
//! carry a MAC keyed by the cluster secret, in one header:
//!
//! ```text
//! x-drift-auth: v1 <from> <unix ms> <nonce, 32 hex> <SHA-256 of the body, hex> <MAC, hex>
//! MAC = HMAC-SHA256(secret, "drift-http-v1" \n method \n path?query \n from \n ms \n nonce \n body digest)
//! ```
//!
//! The receiver checks the header before it reads the body: the MAC, that
//! `from` is a peer of the cluster other than itself, that the time is
//! within [`SKEW_MAX`] of its own clock, and that the nonce was not seen
//! in that window (a replay is refused); then, once it has read the body
//! (within its limit), that the body has the digest the MAC covered. A
//! request without the header, or with any of these wrong, is refused
//! (401) and changes nothing.
//!
//! The clocks compared are the machines' own, not the kv service's
//! (which the `clock` fault skews). What it does not do: encrypt.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header's name.
pub const HEADER: &str = "x-drift-auth";
const VERSION: &str = "v1";
const CONTEXT: &[u8] = b"drift-http-v1";
/// How far a request's time may be from the receiver's clock.
pub const SKEW_MAX: Duration = Duration::from_secs(30);
/// Nonces remembered at most (past it, requests are refused until the
/// window moves on: only a peer can make valid ones).
const SEEN_MAX: usize = 1 << 20;

type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 of the concatenated `parts` under `key`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Whether `mac` is the HMAC-SHA256 of `parts` under `key`, compared in
/// time independent of where they differ.
pub fn verify_hmac(key: &[u8], parts: &[&[u8]], mac: &[u8]) -> bool {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(p);
    }
    m.verify_slice(mac).is_ok()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    crate::peer_auth::hex(bytes)
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    crate::peer_auth::unhex(text)
}

fn mac_parts(method: &str, target: &str, from: u64, ms: u64, nonce: &str, digest: &str) -> String {
    format!("\n{method}\n{target}\n{from}\n{ms}\n{nonce}\n{digest}")
}

/// Signs the requests one server sends another.
#[derive(Clone)]
pub struct Signer {
    secret: Vec<u8>,
    from: u64,
}

impl Signer {
    pub fn new(secret: Vec<u8>, from: u64) -> Signer {
        Signer { secret, from }
    }

    /// The header for `method` on `target` (path and query) with `body`.
    pub fn header(&self, method: &str, target: &str, body: &[u8]) -> String {
        let ms = now_ms();
        let nonce = hex(&random_nonce());
        let digest = hex(&Sha256::digest(body));
        let mac = hmac_sha256(
            &self.secret,
            &[
                CONTEXT,
                mac_parts(method, target, self.from, ms, &nonce, &digest).as_bytes(),
            ],
        );
        format!("{VERSION} {} {ms} {nonce} {digest} {}", self.from, hex(&mac))
    }
}

/// A nonce no other request of this sender carries: 64 random bits drawn
/// once per process (the time, without kernel randomness) and a counter.
/// A nonce only has to be unique for the receiver to refuse replays; one
/// read of /dev/urandom per request cost more than signing it.
fn random_nonce() -> [u8; 16] {
    use std::io::Read;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: std::sync::OnceLock<[u8; 8]> = std::sync::OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let mut p = [0u8; 8];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut p))
            .is_err()
        {
            p = (std::time::SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()))
            .to_le_bytes();
        }
        p
    });
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(prefix);
    b[8..].copy_from_slice(&N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    b
}

/// A request whose header checked out: who sent it, and the digest its
/// body must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub from: u64,
    digest: Vec<u8>,
}

impl Verified {
    /// Whether `body` is the body the sender signed.
    pub fn body_matches(&self, body: &[u8]) -> bool {
        Sha256::digest(body).as_slice() == self.digest.as_slice()
    }
}

/// Checks the requests other servers send this one.
pub struct Verifier {
    secret: Vec<u8>,
    me: u64,
    peers: BTreeSet<u64>,
    /// Nonces seen, with the time (ms) they may be forgotten.
    seen: Mutex<HashMap<[u8; 16], u64>>,
}

impl Verifier {
    pub fn new(secret: Vec<u8>, me: u64, peers: BTreeSet<u64>) -> Verifier {
        Verifier {
            secret,
            me,
            peers,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Checks `header` (the value of [`HEADER`], if sent) of a request
    /// for `method` on `target`, before its body is read.
    pub fn check(&self, method: &str, target: &str, header: Option<&str>) -> Result<Verified, String> {
        self.check_at(method, target, header, now_ms())
    }

    fn check_at(&self, method: &str, target: &str, header: Option<&str>, now: u64) -> Result<Verified, String> {
        let header = header.ok_or_else(|| format!("no {HEADER} header: requests between servers are signed"))?;
        let f: Vec<&str> = header.split(' ').collect();
        let [version, from, ms, nonce, digest, mac] = f.as_slice() else {
            return Err(format!("{HEADER}: expected 6 fields"));
        };
        if *version != VERSION {
            return Err(format!("{HEADER}: version {version:?}, not {VERSION}"));
        }
        let from: u64 = from.parse().map_err(|_| format!("{HEADER}: bad sender"))?;
        let ms: u64 = ms.parse().map_err(|_| format!("{HEADER}: bad time"))?;
        let nonce_bytes: [u8; 16] = unhex(nonce)
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| format!("{HEADER}: bad nonce"))?;
        let digest_bytes = unhex(digest)
            .filter(|d| d.len() == 32)
            .ok_or_else(|| format!("{HEADER}: bad body digest"))?;
        let mac = unhex(mac).ok_or_else(|| format!("{HEADER}: bad MAC"))?;
        let parts = mac_parts(method, target, from, ms, nonce, digest);
        if !verify_hmac(&self.secret, &[CONTEXT, parts.as_bytes()], &mac) {
            return Err("the request's MAC does not check out (not signed with the cluster's secret)".into());
        }
        if from == self.me || !self.peers.contains(&from) {
            return Err(format!("server {from} is not another peer of this cluster"));
        }
        let skew = SKEW_MAX.as_millis() as u64;
        if ms.abs_diff(now) > skew {
            return Err(format!(
                "the request was signed {} ms from this server's clock (at most {skew})",
                ms.abs_diff(now)
            ));
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= SEEN_MAX / 2 {
            seen.retain(|_, until| *until > now);
        }
        if seen.len() >= SEEN_MAX {
            return Err("too many requests in the replay window".into());
        }
        if seen.insert(nonce_bytes, ms + skew + 1).is_some() {
            return Err("a request seen before (a replay)".into());
        }
        Ok(Verified {
            from,
            digest: digest_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Signer, Verifier) {
        let secret = vec![7u8; 32];
        (
            Signer::new(secret.clone(), 2),
            Verifier::new(secret, 1, BTreeSet::from([1, 2, 3])),
        )
    }

    #[test]
    fn a_signed_request_checks_out_once_and_only_with_its_body() {
        let (s, v) = pair();
        let h = s.header("POST", "/internal/merge", b"body");
        let ok = v.check("POST", "/internal/merge", Some(&h)).unwrap();
        assert_eq!(ok.from, 2);
        assert!(ok.body_matches(b"body"));
        assert!(!ok.body_matches(b"bodx"));
        let again = v.check("POST", "/internal/merge", Some(&h)).unwrap_err();
        assert!(again.contains("replay"), "{again}");
    }

    #[test]
    fn anything_else_is_refused() {
        let (s, v) = pair();
        assert!(v
            .check("POST", "/internal/merge", None)
            .unwrap_err()
            .contains("no x-drift-auth"));
        // another path, method, or secret
        let h = s.header("POST", "/internal/merge", b"");
        assert!(v.check("POST", "/internal/repair", Some(&h)).is_err());
        assert!(v.check("GET", "/internal/merge", Some(&h)).is_err());
        let stranger = Signer::new(vec![8u8; 32], 2).header("POST", "/x", b"");
        assert!(v.check("POST", "/x", Some(&stranger)).unwrap_err().contains("MAC"));
        // a peer that is not one, or this server itself
        for from in [1, 9] {
            let h = Signer::new(vec![7u8; 32], from).header("POST", "/x", b"");
            assert!(v
                .check("POST", "/x", Some(&h))
                .unwrap_err()
                .contains("not another peer"));
        }
        // signed too long ago, or in the future
        let h = s.header("POST", "/y", b"");
        let now = now_ms();
        let e = v.check_at("POST", "/y", Some(&h), now + 31_000).unwrap_err();
        assert!(e.contains("from this server's clock"), "{e}");
        let e = v.check_at("POST", "/y", Some(&h), now - 31_000).unwrap_err();
        assert!(e.contains("from this server's clock"), "{e}");
        assert!(v.check("POST", "/y", Some("v1 2 1 zz 00 00")).is_err());
    }

    #[test]
    fn hmac_matches_rfc_4231_cases_2_and_6() {
        // RFC 4231, test case 2
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // a key longer than a block is hashed first (RFC 4231 case 6)
        let mac = hmac_sha256(
            &[0xaa; 131],
            &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
        );
        assert_eq!(
            hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
