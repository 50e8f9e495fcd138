//! Address blocks: which loopback addresses a cluster's servers bind, and
//! the claim that keeps two clusters on one machine apart.
//!
//! Block B gives server i the address 127.0.B.(10+i) (block 0: the
//! 127.0.0.11.. of a single run). A campaign or `drift cluster up` claims
//! a block before any server starts: it holds an exclusive `flock` on the
//! block's lock file in [`lock_dir`] for as long as the cluster lives —
//! a campaign in its own process (its servers exit with it), a cluster
//! that outlives `drift cluster up` in its servers, each of which gets
//! the locked file as its standard input, so the lock goes with the last
//! of them. The lock is the kernel's: a claimant that dies, however it
//! dies, leaves nothing to clean up. Beside it, `block-B.owner` says who
//! holds it, for the message of the next claimant.
//!
//! A free lock is not enough: a server started by hand, or one restarted
//! after its siblings stopped, may hold the block's addresses without the
//! lock. So a claim also binds every client and peer address the cluster
//! will use, and passes over a block where one is taken.
//!
//! Invariant: two live claims never name the same block.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

/// Blocks tried by an automatic claim, lowest first.
pub const BLOCKS: std::ops::RangeInclusive<u8> = 0..=254;

/// An address block: server i binds 127.0.B.(10+i).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block(pub u8);

impl Block {
    /// Server `i`'s address.
    pub fn ip(self, i: u64) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, self.0, 10 + i as u8))
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "127.0.{}.0/24", self.0)
    }
}

/// Why no block could be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("address block {block} is held by {holder}")]
    Held { block: Block, holder: String },
    #[error("address block {block}: {addr} is in use by a process that holds no claim")]
    InUse { block: Block, addr: SocketAddr },
    #[error("every address block is taken (127.0.0.0–127.0.254.0)")]
    NoneFree,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the lock files live: one directory for every user of the
/// machine (sticky, writable by all), as the addresses are shared.
pub fn lock_dir() -> PathBuf {
    std::env::var_os("DRIFT_LOCK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("drift-blocks"))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ClaimError + '_ {
    move |source| ClaimError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A held block. Dropping it ends the claim (unless a server still holds
/// the lock file as its standard input).
#[derive(Debug)]
pub struct Claim {
    pub block: Block,
    lock: File,
    dir: PathBuf,
}

/// The addresses a claim must find free: each server's client port and
/// Raft port (`port` and `port + 1`).
fn probe(block: Block, nodes: u64, port: u16) -> Result<(), SocketAddr> {
    let mut held = Vec::new();
    for i in 1..=nodes {
        for p in [port, port + 1] {
            let addr = SocketAddr::new(block.ip(i), p);
            match TcpListener::bind(addr) {
                Ok(l) => held.push(l),
                Err(_) => return Err(addr),
            }
        }
    }
    Ok(())
}

impl Claim {
    /// Claims block `want`, or with `None` the lowest free one, for a
    /// cluster of `nodes` servers on `port` (client) and `port + 1`
    /// (Raft). `holder` describes the claimant to whoever finds it held.
    pub fn acquire(want: Option<u8>, nodes: u64, port: u16, holder: &str) -> Result<Claim, ClaimError> {
        Claim::acquire_in(&lock_dir(), want, nodes, port, holder)
    }

    /// [`Claim::acquire`] with the lock files in `dir`.
    pub fn acquire_in(dir: &Path, want: Option<u8>, nodes: u64, port: u16, holder: &str) -> Result<Claim, ClaimError> {
        if !dir.is_dir() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
        }
        let candidates: Vec<u8> = match want {
            Some(b) => vec![b],
            None => BLOCKS.collect(),
        };
        for b in candidates {
            let block = Block(b);
            let (path, lock) = open_lock(dir, b)?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    if want.is_some() {
                        return Err(ClaimError::Held {
                            block,
                            holder: holder_in(dir, b),
                        });
                    }
                    continue;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
            }
            if let Err(addr) = probe(block, nodes, port) {
                if want.is_some() {
                    return Err(ClaimError::InUse { block, addr });
                }
                continue;
            }
            let owner = dir.join(format!("block-{b}.owner"));
            let _ = std::fs::write(&owner, format!("{holder} (pid {})\n", std::process::id()));
            return Ok(Claim {
                block,
                lock,
                dir: dir.to_path_buf(),
            });
        }
        Err(ClaimError::NoneFree)
    }

    /// Rejoins the claim on block `b` of an existing cluster whose claim
    /// names `holder`: the claim itself when no server holds it any more
    /// (so the server about to start carries it on), `None` when the
    /// cluster's running servers still do; an error when another cluster
    /// holds the block.
    pub fn rejoin(b: u8, holder: &str) -> Result<Option<Claim>, ClaimError> {
        let dir = lock_dir();
        let (path, lock) = open_lock(&dir, b)?;
        match lock.try_lock() {
            Ok(()) => {
                let claim = Claim {
                    block: Block(b),
                    lock,
                    dir,
                };
                claim.describe(holder);
                Ok(Some(claim))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let current = holder_in(&dir, b);
                if current.starts_with(holder) {
                    Ok(None)
                } else {
                    Err(ClaimError::Held {
                        block: Block(b),
                        holder: current,
                    })
                }
            }
            Err(std::fs::TryLockError::Error(e)) => Err(io(&path)(e)),
        }
    }

    /// A handle on the locked file for a server to hold as its standard
    /// input: the claim lives as long as any holder of it.
    pub fn share(&self) -> std::io::Result<File> {
        self.lock.try_clone()
    }

    /// Re-records who holds the claim (a cluster that outlives its
    /// claimant names its directory).
    pub fn describe(&self, holder: &str) {
        let owner = self.dir.join(format!("block-{}.owner", self.block.0));
        if let Ok(mut f) = File::create(owner) {
            let _ = writeln!(f, "{holder}");
        }
    }
}

/// Block `b`'s lock file in `dir` (made when missing), not locked yet.
fn open_lock(dir: &Path, b: u8) -> Result<(PathBuf, File), ClaimError> {
    let path = dir.join(format!("block-{b}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    Ok((path, lock))
}

/// Who holds block `b`, as its claimant described itself.
fn holder_in(dir: &Path, b: u8) -> String {
    std::fs::read_to_string(dir.join(format!("block-{b}.owner")))
        .map(|t| t.trim().to_string())
        .unwrap_or_else(|_| "another drift".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock directory of this test's own (tests run in parallel).
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("drift-claim-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn two_claims_get_two_blocks_and_a_forced_one_names_its_holder() {
        let dir = scratch("two");
        let port = 29_411;
        let a = Claim::acquire_in(&dir, None, 3, port, "first").unwrap();
        let b = Claim::acquire_in(&dir, None, 3, port, "second").unwrap();
        assert_ne!(a.block, b.block);
        let e = Claim::acquire_in(&dir, Some(a.block.0), 3, port, "third").unwrap_err();
        assert!(e.to_string().contains("held by first"), "{e}");
        // a handle given to a server keeps the block claimed after the
        // claimant lets go
        let held = a.share().unwrap();
        let block = a.block;
        drop(a);
        assert!(Claim::acquire_in(&dir, Some(block.0), 3, port, "fourth").is_err());
        drop(held);
        assert_eq!(
            Claim::acquire_in(&dir, Some(block.0), 3, port, "fifth").unwrap().block,
            block
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_block_whose_addresses_are_bound_is_passed_over() {
        let dir = scratch("bound");
        let port = 29_421;
        let squatter = TcpListener::bind(SocketAddr::new(Block(0).ip(2), port + 1)).unwrap();
        let c = Claim::acquire_in(&dir, None, 3, port, "claimant").unwrap();
        assert_ne!(c.block, Block(0));
        let e = Claim::acquire_in(&dir, Some(0), 3, port, "forced").unwrap_err();
        assert!(e.to_string().contains(&format!("127.0.0.12:{}", port + 1)), "{e}");
        drop(squatter);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
