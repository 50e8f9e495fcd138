//! Partitions: which directed links a shape cuts, and the partitioner
//! that cuts them — iptables DROP rules in a chain of the run's own (as
//! root), the backend's per-link proxies, or the backend's own means in
//! the servers' network namespaces (containers). Started by a
//! `partition` step, stopped by its stop and by the heal.

use super::Shape;
use crate::backend::{Faults, Part};
use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

/// Directed links cut by a partition of `ids` (already shuffled).
pub(super) fn partition_links(shape: Shape, ids: &[u64]) -> Vec<(u64, u64)> {
    let n = ids.len();
    let both = |a: &[u64], b: &[u64]| -> Vec<(u64, u64)> {
        a.iter()
            .flat_map(|&x| b.iter().flat_map(move |&y| [(x, y), (y, x)]))
            .collect()
    };
    match shape {
        Shape::Halves => both(&ids[..n / 2], &ids[n / 2..]),
        Shape::One => both(&ids[..1], &ids[1..]),
        Shape::Bridge => {
            let mid = n / 2;
            both(&ids[..mid], &ids[mid + 1..])
        }
        Shape::MajoritiesRing => {
            // each server keeps its ring neighbours within reach: a
            // majority each, no majority in common
            let reach = n / 2;
            let mut cut = Vec::new();
            for (i, &a) in ids.iter().enumerate() {
                for (j, &b) in ids.iter().enumerate() {
                    let d = (i + n - j) % n;
                    if i != j && d.min(n - d) > reach / 2 + (reach % 2) && d.min(n - d) > 1 {
                        cut.push((a, b));
                    }
                }
            }
            if cut.is_empty() {
                both(&ids[..1], &ids[1..])
            } else {
                cut
            }
        }
        Shape::Asymmetric => ids[..n / 2]
            .iter()
            .flat_map(|&a| ids[n / 2..].iter().map(move |&b| (a, b)))
            .collect(),
    }
}

/// How a campaign asks partitions to be made (`--partitioner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionerMode {
    /// iptables when root and available, else per-link proxies.
    #[default]
    Auto,
    Iptables,
    Proxies,
}

/// How partitions are made.
pub enum Partitioner {
    /// iptables rules in a chain owned by this run; removed on teardown
    /// or drop, whichever comes first.
    Iptables { chain: String, torn: AtomicBool },
    /// The backend's per-link proxies.
    Proxies,
    /// The backend's own means, in the servers' own network namespaces
    /// (containers).
    Backend,
    /// The run has no partitions.
    Unused,
}

impl Partitioner {
    /// `auto`: iptables when root and available, else proxies. `iptables`
    /// or `proxies` insist (an error says why iptables cannot be had).
    pub fn choose(mode: PartitionerMode) -> Result<Partitioner, String> {
        if mode == PartitionerMode::Proxies {
            return Ok(Partitioner::Proxies);
        }
        let root = Command::new("id")
            .arg("-u")
            .output()
            .ok()
            .is_some_and(|o| o.stdout.starts_with(b"0"));
        let have = Command::new("iptables")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if root && have {
            remove_dead_chains();
            let chain = format!("{LOCAL_CHAIN_PREFIX}{}", std::process::id());
            let ok = ipt(&["-N", &chain]) && ipt(&["-I", "OUTPUT", "-j", &chain]);
            if ok {
                return Ok(Partitioner::Iptables {
                    chain,
                    torn: AtomicBool::new(false),
                });
            }
            let _ = ipt(&["-X", &chain]);
        }
        if mode == PartitionerMode::Iptables {
            return Err(format!(
                "--partitioner iptables: {}",
                if !root {
                    "needs root"
                } else if !have {
                    "iptables is not installed (apt install iptables)"
                } else {
                    "could not create a chain"
                }
            ));
        }
        Ok(Partitioner::Proxies)
    }

    /// Whether the backend must route peer links through its proxies.
    pub fn needs_proxies(&self) -> bool {
        matches!(self, Partitioner::Proxies)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Partitioner::Iptables { .. } => "iptables",
            Partitioner::Proxies => "per-link proxies",
            Partitioner::Backend => "iptables on each server's host or in its container",
            Partitioner::Unused => "nothing (no partitions)",
        }
    }

    /// Cuts `links`; returns what it did. A link a→b is every packet
    /// from a's peer address to b's that belongs to a Raft or kv
    /// connection — to b's Raft or kv port, or from a's — so the rules
    /// touch this run's peer traffic and nothing else on the machine.
    pub fn cut(&self, cluster: &dyn Faults, links: &[(u64, u64)], part: Part) -> String {
        match self {
            Partitioner::Iptables { chain, .. } => {
                let mut n = 0;
                let ports = |i: u64| {
                    let mut p = vec![cluster.peer_addr(i).port()];
                    p.extend(cluster.kv_http(i).map(|a| a.port()));
                    p
                };
                for (a, b) in links {
                    let (pa, pb) = (cluster.peer_addr(*a), cluster.peer_addr(*b));
                    let (sa, sb) = (pa.ip().to_string(), pb.ip().to_string());
                    let mut rules: Vec<[String; 2]> = Vec::new();
                    for port in ports(*b) {
                        rules.push(["--dport".into(), port.to_string()]);
                    }
                    for port in ports(*a) {
                        rules.push(["--sport".into(), port.to_string()]);
                    }
                    let ok = rules.iter().all(|port| {
                        ipt(&[
                            "-A", chain, "-s", &sa, "-d", &sb, "-p", "tcp", &port[0], &port[1], "-j", "DROP",
                        ])
                    });
                    if ok {
                        n += 1;
                    }
                }
                format!("iptables: {n} directed links dropped")
            }
            Partitioner::Proxies => match cluster.cut_links(links, part) {
                Some(n) => format!("proxies: {n} directed links cut"),
                None => "no proxies on this backend: nothing cut".to_string(),
            },
            Partitioner::Backend => match cluster.cut_links(links, part) {
                Some(n) => format!("{n} directed links cut at the servers"),
                None => "this backend cannot cut links: nothing cut".to_string(),
            },
            Partitioner::Unused => "no partitioner in this run: nothing cut".to_string(),
        }
    }

    pub fn heal(&self, cluster: &dyn Faults) {
        match self {
            Partitioner::Iptables { chain, .. } => {
                let _ = ipt(&["-F", chain]);
            }
            Partitioner::Proxies | Partitioner::Backend => cluster.heal_links(),
            Partitioner::Unused => {}
        }
    }

    /// Removes the chain (teardown), once. Returns an error text on failure.
    pub fn teardown(&self) -> Option<String> {
        match self {
            Partitioner::Iptables { chain, torn } if !torn.swap(true, Ordering::SeqCst) => {
                let ok = ipt(&["-F", chain]) & ipt(&["-D", "OUTPUT", "-j", chain]) & ipt(&["-X", chain]);
                (!ok).then(|| format!("could not remove iptables chain {chain}"))
            }
            _ => None,
        }
    }
}

impl Drop for Partitioner {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// The local partitioner's chains: this prefix and the PID of the drift
/// that made it, so a run can tell a killed drift's chain from a live one's.
const LOCAL_CHAIN_PREFIX: &str = "DRIFT-L";

/// Removes the chains of local partitioners whose drift is gone (killed
/// mid-run, it could not remove its own): the PID in the name runs no
/// drift any more.
fn remove_dead_chains() {
    let Ok(out) = Command::new("iptables").arg("-S").output() else {
        return;
    };
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    for chain in listing.lines().filter_map(|l| l.strip_prefix("-N ")) {
        let Some(pid) = chain
            .strip_prefix(LOCAL_CHAIN_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive =
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("drift"));
        if !alive {
            let _ = ipt(&["-F", chain]);
            let _ = ipt(&["-D", "OUTPUT", "-j", chain]);
            let _ = ipt(&["-X", chain]);
        }
    }
}

fn ipt(args: &[&str]) -> bool {
    Command::new("iptables")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
