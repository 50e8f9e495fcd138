//! Nemeses: faults with a start and a stop, one vocabulary (DESIGN.md).
//!
//! * `partition` — halves, one node, bridge, majorities ring, asymmetric:
//!   a set of directed links cut. As root, iptables DROP rules on the
//!   address pairs in a chain of this run's own (so traffic really stops,
//!   and teardown removes exactly those rules); otherwise the backend's
//!   per-link proxies close and refuse the cut links.
//! * `kill` / restart, `pause` / resume (SIGSTOP/SIGCONT) of a minority.
//! * `corrupt` — kill a node, truncate or flip one of its changelog or
//!   snapshot files, or drop its data dir; restart it at the heal.
//! * `diverge` — make one follower apply its next entry differently (the
//!   digest must catch it); `clock` — offset a node's entry times.
//!
//! The schedule is derived from the run's seed and stored as applied, so a
//! replay applies the same faults at the same times.

use crate::backend::Backend;
use drift_workloads::Rng;
use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

pub const KINDS: [&str; 6] = ["partition", "kill", "pause", "corrupt", "diverge", "clock"];
const PARTITIONS: [&str; 5] = ["halves", "one", "bridge", "majorities-ring", "asymmetric"];

/// One fault as scheduled and applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// When it starts and stops, ms since the run started.
    pub start_ms: u64,
    pub stop_ms: u64,
    pub fault: String,
    /// Partition kind, corrupt mode, clock offset…
    #[serde(default)]
    pub variant: String,
    pub nodes: Vec<u64>,
    /// Cut links (from, to) for partitions.
    #[serde(default)]
    pub links: Vec<(u64, u64)>,
    /// What applying it did (filled in as it runs).
    #[serde(default)]
    pub applied: String,
}

/// A seeded schedule: a fault every `interval_ms`, active for half of it,
/// up to `limit_ms`.
pub fn schedule(kinds: &[String], nodes: u64, interval_ms: u64, limit_ms: u64, seed: u64) -> Vec<Step> {
    let mut rng = Rng::new(Rng::derive(seed, "nemesis"));
    let mut out = Vec::new();
    if kinds.is_empty() || nodes < 2 {
        return out;
    }
    let mut t = interval_ms;
    while t + interval_ms / 2 < limit_ms {
        let fault = kinds[rng.below(kinds.len() as u64) as usize].clone();
        let mut ids: Vec<u64> = (1..=nodes).collect();
        shuffle(&mut rng, &mut ids);
        let minority = (1 + rng.below(((nodes - 1) / 2).max(1))) as usize;
        let (variant, chosen, links) = match fault.as_str() {
            "partition" => {
                let kind = PARTITIONS[rng.below(PARTITIONS.len() as u64) as usize];
                let links = partition_links(kind, &ids);
                (kind.to_string(), ids.clone(), links)
            }
            "kill" | "pause" => (String::new(), ids[..minority].to_vec(), vec![]),
            "corrupt" => {
                let mode = ["truncate", "flip", "wipe"][rng.below(3) as usize];
                (format!("{mode}:{}", rng.below(1 << 20)), ids[..1].to_vec(), vec![])
            }
            "clock" => {
                let offset = (rng.below(20_001) as i64 - 10_000).to_string();
                (offset, ids[..1].to_vec(), vec![])
            }
            _ => (String::new(), ids[..1].to_vec(), vec![]),
        };
        out.push(Step {
            start_ms: t,
            stop_ms: t + interval_ms / 2,
            fault,
            variant,
            nodes: chosen,
            links,
            applied: String::new(),
        });
        t += interval_ms;
    }
    out
}

fn shuffle(rng: &mut Rng, v: &mut [u64]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// Directed links cut by a partition of `ids` (already shuffled).
fn partition_links(kind: &str, ids: &[u64]) -> Vec<(u64, u64)> {
    let n = ids.len();
    let both = |a: &[u64], b: &[u64]| -> Vec<(u64, u64)> {
        a.iter()
            .flat_map(|&x| b.iter().flat_map(move |&y| [(x, y), (y, x)]))
            .collect()
    };
    match kind {
        "halves" => both(&ids[..n / 2], &ids[n / 2..]),
        "one" => both(&ids[..1], &ids[1..]),
        "bridge" => {
            // two sides cut apart; the middle node still sees both
            let mid = n / 2;
            both(&ids[..mid], &ids[mid + 1..])
        }
        "majorities-ring" => {
            // each node keeps its ring neighbours within reach: a majority
            // each, no majority in common
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
        _ => {
            // asymmetric: the first half cannot reach the rest; replies flow
            ids[..n / 2]
                .iter()
                .flat_map(|&a| ids[n / 2..].iter().map(move |&b| (a, b)))
                .collect()
        }
    }
}

/// How partitions are made.
pub enum Partitioner {
    /// iptables rules in a chain owned by this run; removed on teardown
    /// or drop, whichever comes first.
    Iptables { chain: String, torn: AtomicBool },
    /// The backend's per-link proxies.
    Proxies,
    /// The run has no partitions.
    Unused,
}

impl Partitioner {
    /// `auto`: iptables when root and available, else proxies. `iptables`
    /// or `proxies` insist (an error says why iptables cannot be had).
    pub fn choose(run_tag: &str, mode: &str) -> Result<Partitioner, String> {
        match mode {
            "proxies" => return Ok(Partitioner::Proxies),
            "auto" | "iptables" => {}
            other => return Err(format!("--partitioner {other}: expected auto, iptables or proxies")),
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
            let chain = format!("DRIFT-{}", &run_tag[..run_tag.len().min(20)]);
            let ok = ipt(&["-N", &chain]) && ipt(&["-I", "OUTPUT", "-j", &chain]);
            if ok {
                return Ok(Partitioner::Iptables {
                    chain,
                    torn: AtomicBool::new(false),
                });
            }
            let _ = ipt(&["-X", &chain]);
        }
        if mode == "iptables" {
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
            Partitioner::Unused => "nothing (no partitions)",
        }
    }

    /// Cuts `links`; returns what it did.
    pub fn cut(&self, cluster: &dyn Backend, links: &[(u64, u64)]) -> String {
        match self {
            Partitioner::Iptables { chain, .. } => {
                let mut n = 0;
                for (a, b) in links {
                    let (sa, sb) = (cluster.peer_ip(*a).to_string(), cluster.peer_ip(*b).to_string());
                    if ipt(&["-A", chain, "-s", &sa, "-d", &sb, "-j", "DROP"]) {
                        n += 1;
                    }
                }
                format!("iptables: {n} directed links dropped")
            }
            Partitioner::Proxies => match cluster.cut_links(links) {
                Some(n) => format!("proxies: {n} directed links cut"),
                None => "no proxies on this backend: nothing cut".to_string(),
            },
            Partitioner::Unused => "no partitioner in this run: nothing cut".to_string(),
        }
    }

    pub fn heal(&self, cluster: &dyn Backend) {
        match self {
            Partitioner::Iptables { chain, .. } => {
                let _ = ipt(&["-F", chain]);
            }
            Partitioner::Proxies => cluster.heal_links(),
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

fn ipt(args: &[&str]) -> bool {
    Command::new("iptables")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_replay_from_the_seed_and_stay_in_time() {
        let kinds: Vec<String> = KINDS.iter().map(|s| s.to_string()).collect();
        let a = schedule(&kinds, 5, 4000, 60_000, 9);
        assert_eq!(a, schedule(&kinds, 5, 4000, 60_000, 9));
        assert_ne!(a, schedule(&kinds, 5, 4000, 60_000, 10));
        assert!(a.iter().all(|s| s.start_ms < s.stop_ms && s.stop_ms <= 60_000));
        for s in &a {
            if s.fault == "kill" || s.fault == "pause" {
                assert!(s.nodes.len() <= 2, "a minority only: {s:?}");
            }
        }
    }

    #[test]
    fn partitions_cut_what_they_say() {
        let ids = [1, 2, 3, 4, 5];
        let halves = partition_links("halves", &ids);
        assert!(halves.contains(&(1, 3)) && halves.contains(&(3, 1)) && !halves.contains(&(1, 2)));
        let one = partition_links("one", &ids);
        assert_eq!(one.len(), 8);
        let bridge = partition_links("bridge", &ids);
        assert!(
            !bridge.iter().any(|&(a, b)| a == 3 || b == 3),
            "the bridge node keeps every link"
        );
        let asym = partition_links("asymmetric", &ids);
        assert!(asym.contains(&(1, 3)) && !asym.contains(&(3, 1)));
        let ring = partition_links("majorities-ring", &ids);
        for &n in &ids {
            let reachable = ids.iter().filter(|&&m| m != n && !ring.contains(&(n, m))).count() + 1;
            assert!(reachable >= 3, "node {n} sees a majority");
        }
    }
}
