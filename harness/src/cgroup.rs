//! Partitions between processes that do not choose their source address.
//!
//! drift's own servers send from their own address, so a link a→b is a
//! pair of addresses (`nemesis::Partitioner::Iptables`). A ClickHouse
//! server or an Apache ZooKeeper server dials its peers from 127.0.0.1:
//! on loopback every connection it opens looks the same. So each process
//! of such a run lives in a cgroup (v2) of the run's own
//! (`<cgroup2>/drift-<pid>/<name>`), and a link is cut with nftables rules
//! that match the socket's cgroup (`socket cgroupv2`), in a table of the
//! run's own (`inet drift-<pid>`):
//!
//! * on connections X opened to Y: what X's sockets send to Y's address
//!   and listening ports (hook `output`);
//! * on connections Y opened to X: what reaches Y's sockets from X's
//!   address and listening ports (hook `input`), i.e. X's answers.
//!
//! Both sides' rules for a directed link X→Y stop everything X sends to Y
//! on any connection between them; the other direction is the link Y→X.
//! A process's listening ports are per kind of link (a replica's
//! interserver port, a coordinator's peer or client ports), so a cut
//! touches one kind of traffic and nothing else on the machine: the
//! controller's own connections to the servers are never matched.
//!
//! What it needs: root, `nft`, and the cgroup v2 hierarchy mounted under
//! `/sys/fs/cgroup` (itself or `/sys/fs/cgroup/unified`); [`RunCgroups::create`]
//! says which is missing. Healing flushes the table; teardown (or drop)
//! deletes it and the cgroups. A run removes the tables and cgroups of
//! drifts that were killed before they could.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

/// Where nftables resolves `socket cgroupv2` paths from.
const CGROUP_FS: &str = "/sys/fs/cgroup";
/// The prefix of a run's cgroup and nftables table: then its drift's PID.
const PREFIX: &str = "drift-";

/// The cgroups of one run: `<cgroup2>/drift-<pid>/<name>` per process.
pub struct RunCgroups {
    /// `<cgroup2>/drift-<pid>`.
    root: PathBuf,
    /// The same, as nftables names it (relative to `/sys/fs/cgroup`).
    nft_root: String,
    /// The level of a process's cgroup below the cgroup2 root.
    level: usize,
}

/// The cgroup2 mount point, from `/proc/self/mounts`.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, at, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(at))
        })
        .find(|p| p.starts_with(CGROUP_FS))
}

/// Whether `pid` runs a drift.
fn drift_alive(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("drift"))
}

fn run_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.parse().ok()
}

impl RunCgroups {
    /// This run's cgroup root, made fresh; the roots and nftables tables of
    /// dead drifts are removed first. The error says what is missing.
    pub fn create() -> Result<RunCgroups, String> {
        let root_uid = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        if !root_uid {
            return Err("partitions here need root (nftables rules and cgroups)".into());
        }
        if !nft(&["list", "tables"]).0 {
            return Err("partitions here need nftables (apt install nftables): `nft list tables` failed".into());
        }
        let mount = cgroup2_mount()
            .ok_or_else(|| format!("partitions here need the cgroup v2 hierarchy mounted under {CGROUP_FS}"))?;
        remove_dead(&mount);
        let root = mount.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let rel = root
            .strip_prefix(CGROUP_FS)
            .map_err(|_| format!("{} is not under {CGROUP_FS}", root.display()))?;
        let level = root.strip_prefix(&mount).map(|p| p.components().count()).unwrap_or(1) + 1;
        Ok(RunCgroups {
            nft_root: rel.display().to_string(),
            root,
            level,
        })
    }

    /// The `cgroup.procs` file of the process cgroup `name`, made if new.
    pub fn procs(&self, name: &str) -> Result<PathBuf, String> {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(dir.join("cgroup.procs"))
    }

    fn nft_path(&self, name: &str) -> String {
        format!("{}/{name}", self.nft_root)
    }
}

impl Drop for RunCgroups {
    fn drop(&mut self) {
        remove_tree(&self.root);
    }
}

/// Removes a run's cgroup directories (those of ended processes).
fn remove_tree(root: &Path) {
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(root);
}

/// Removes the cgroups and nftables tables of drifts that are gone.
fn remove_dead(mount: &Path) {
    if let Ok(rd) = std::fs::read_dir(mount) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if run_pid(&name).is_some_and(|p| !drift_alive(p)) {
                remove_tree(&e.path());
            }
        }
    }
    let (ok, listing) = nft(&["list", "tables"]);
    if ok {
        for t in listing.lines().filter_map(|l| l.strip_prefix("table inet ")) {
            if run_pid(t.trim()).is_some_and(|p| !drift_alive(p)) {
                let _ = nft(&["delete", "table", "inet", t.trim()]);
            }
        }
    }
}

/// `cmd` run inside the cgroup whose `cgroup.procs` is `procs`: a shell
/// moves itself there and execs the command, so every socket the process
/// ever opens belongs to it.
pub fn in_cgroup(cmd: &Command, procs: &Path) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(procs)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// One end of a link: a process's cgroup, its address, and the ports it
/// listens on for that kind of link.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub group: String,
    pub ip: IpAddr,
    pub ports: Vec<u16>,
}

/// An nftables table of the run's own holding the cut links.
pub struct NftCut {
    table: String,
    torn: AtomicBool,
}

fn nft(args: &[&str]) -> (bool, String) {
    match Command::new("nft").args(args).stdin(Stdio::null()).output() {
        Ok(o) => (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned()),
        Err(_) => (false, String::new()),
    }
}

/// Runs an nft script (atomically: all its rules or none).
fn nft_script(script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("nft: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn port_set(ports: &[u16]) -> String {
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!("{{ {} }}", list.join(", "))
}

impl NftCut {
    /// The run's table with its two chains, empty.
    pub fn create() -> Result<NftCut, String> {
        let table = format!("{PREFIX}{}", std::process::id());
        nft_script(&format!(
            "add table inet {table}\nadd chain inet {table} out {{ type filter hook output priority 0; }}\nadd chain inet {table} in {{ type filter hook input priority 0; }}\n"
        ))?;
        Ok(NftCut {
            table,
            torn: AtomicBool::new(false),
        })
    }

    /// The rules that stop everything `x` sends to `y` (module header).
    pub fn link_rules(&self, groups: &RunCgroups, x: &Endpoint, y: &Endpoint) -> Vec<String> {
        let level = groups.level;
        let mut rules = Vec::new();
        if !y.ports.is_empty() {
            rules.push(format!(
                "add rule inet {} out socket cgroupv2 level {level} \"{}\" ip daddr {} tcp dport {} drop",
                self.table,
                groups.nft_path(&x.group),
                y.ip,
                port_set(&y.ports)
            ));
        }
        if !x.ports.is_empty() {
            rules.push(format!(
                "add rule inet {} in socket cgroupv2 level {level} \"{}\" ip saddr {} tcp sport {} drop",
                self.table,
                groups.nft_path(&y.group),
                x.ip,
                port_set(&x.ports)
            ));
        }
        rules
    }

    /// Adds `rules` at once.
    pub fn apply(&self, rules: &[String]) -> Result<(), String> {
        if rules.is_empty() {
            return Ok(());
        }
        nft_script(&(rules.join("\n") + "\n"))
    }

    /// Removes every cut.
    pub fn heal(&self) {
        let _ = nft(&["flush", "table", "inet", &self.table]);
    }

    /// Deletes the table, once; an error text on failure.
    pub fn teardown(&self) -> Option<String> {
        if self.torn.swap(true, Ordering::SeqCst) {
            return None;
        }
        (!nft(&["delete", "table", "inet", &self.table]).0)
            .then(|| format!("could not delete nftables table inet {}", self.table))
    }
}

impl Drop for NftCut {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_in_a_cgroup_keeps_its_program_arguments_and_environment() {
        let mut cmd = Command::new("/usr/bin/prog");
        cmd.args(["--config-file=/x/config.xml", "two words"]).env("K", "v");
        let c = in_cgroup(&cmd, Path::new("/sys/fs/cgroup/drift-1/c1/cgroup.procs"));
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(c.get_program(), "sh");
        assert_eq!(
            args,
            [
                "-c",
                "echo $$ > \"$0\" && exec \"$@\"",
                "/sys/fs/cgroup/drift-1/c1/cgroup.procs",
                "/usr/bin/prog",
                "--config-file=/x/config.xml",
                "two words"
            ]
        );
        assert!(c.get_envs().any(|(k, v)| k == "K" && v.is_some_and(|v| v == "v")));
    }

    #[test]
    fn a_link_is_cut_on_both_kinds_of_connection() {
        let groups = RunCgroups {
            root: PathBuf::from("/nonexistent/drift-7"),
            nft_root: "unified/drift-7".into(),
            level: 2,
        };
        let cut = NftCut {
            table: "drift-7".into(),
            torn: AtomicBool::new(true),
        };
        let x = Endpoint {
            group: "c1".into(),
            ip: "127.0.3.11".parse().unwrap(),
            ports: vec![2286],
        };
        let y = Endpoint {
            group: "c2".into(),
            ip: "127.0.3.12".parse().unwrap(),
            ports: vec![2286],
        };
        let rules = cut.link_rules(&groups, &x, &y);
        assert_eq!(
            rules,
            [
                "add rule inet drift-7 out socket cgroupv2 level 2 \"unified/drift-7/c1\" ip daddr 127.0.3.12 tcp dport { 2286 } drop",
                "add rule inet drift-7 in socket cgroupv2 level 2 \"unified/drift-7/c2\" ip saddr 127.0.3.11 tcp sport { 2286 } drop",
            ]
        );
        // a replica has no port a coordinator dials: only its own sends go
        let client = Endpoint { ports: vec![], ..x };
        assert_eq!(cut.link_rules(&groups, &client, &y).len(), 1);
        std::mem::forget(groups);
    }
}
