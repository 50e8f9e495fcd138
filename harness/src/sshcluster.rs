//! The SSH backend: each server on a host of a hosts file
//! ([`crate::hosts`]), driven over SSH the way Jepsen drives its nodes.
//!
//! * The drift executable is uploaded over SFTP to `<dir>/drift` (skipped
//!   when the host's copy has the same SHA-256), with the cluster file and
//!   the fault token (mode 0600, never on a command line) in
//!   `<dir>/<run>/`, the servers' data under `<dir>/<run>/data`.
//! * A server starts detached: a shell on the host runs it in the
//!   background, records its PID and, when it ends, its exit status; the
//!   backend stops, kills, pauses and resumes it by that PID.
//! * Its log is copied back into the run directory as it grows, by a
//!   thread with SSH sessions of its own.
//! * Partitions: on each host, an iptables chain of the run's own hooked
//!   into OUTPUT, holding DROP rules for the cut links' addresses and
//!   peer ports only — so the controller's own traffic is never cut —
//!   flushed to heal and removed at the end.
//! * `corrupt` damages a stopped server's files on the host; `wipe` drops
//!   its data directory.
//! * At the end every server is stopped, the chains removed, the logs
//!   copied a last time and `<dir>/<run>` deleted.
//!
//! Every remote command's exit status and stderr are checked; a failure
//! is an error naming the host and the command.

use crate::backend::{
    Backend, BackendError, Corrupt, Damage, Db, Exit, FaultHooks, Faults, Kill, LinkCut, LogFiles, Pause, Probe,
    TableHttp,
};
use crate::hosts::Hosts;
use crate::local::LocalSpec;
use crate::ssh::Remote;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the servers' logs are copied back.
const TAIL_EVERY: Duration = Duration::from_millis(300);
/// How often the servers are asked whether they still run, at most.
const STATE_POLL: Duration = Duration::from_millis(500);

struct SshNode {
    id: u64,
    /// Index into the hosts.
    host: usize,
    client: SocketAddr,
    peer: SocketAddr,
    admin: SocketAddr,
    http: Option<SocketAddr>,
    kv: Option<SocketAddr>,
    log: PathBuf,
    pid: Option<u32>,
    started_before: bool,
    paused: bool,
}

pub struct SshCluster {
    remotes: Vec<Arc<Remote>>,
    nodes: Vec<SshNode>,
    /// `<dir>/<run>` on every host.
    run_dir: String,
    exe: String,
    chain: String,
    defect: Option<String>,
    token: String,
    tail_stop: Arc<AtomicBool>,
    tail: Option<std::thread::JoinHandle<()>>,
    last_poll: Option<Instant>,
}

fn spawn_err(node: u64, reason: String) -> BackendError {
    BackendError::Spawn {
        node,
        source: std::io::Error::other(reason),
    }
}

impl SshCluster {
    /// Uploads what the servers need, sets up the partition chains and
    /// starts the log copier; no server runs yet.
    pub fn new(run_dir: &Path, spec: LocalSpec<'_>, hosts: &Hosts) -> Result<SshCluster, String> {
        let LocalSpec {
            nodes: n,
            port,
            quorum_reads,
            digest,
            token,
            zookeeper,
            table,
            kv,
            extra,
            defect,
            ..
        } = spec;
        if zookeeper {
            return Err("the ssh backend runs drift servers only (not --target zookeeper)".into());
        }
        hosts.check_routes()?;
        if (hosts.hosts.len() as u64) < n {
            return Err(format!(
                "{n} servers but {h} hosts in the hosts file (pass --nodes {h} or list more hosts)",
                h = hosts.hosts.len()
            ));
        }
        let used = &hosts.hosts[..n as usize];
        let dir = used[0].dir.clone();
        if used.iter().any(|h| h.dir != dir) {
            return Err("every host of a run needs the same `dir` (the cluster file names one data directory)".into());
        }
        let tag = run_dir
            .file_name()
            .map(|f| f.to_string_lossy().replace([':', '.'], "-"))
            .unwrap_or_else(|| "run".into());
        let remote_run = format!("{dir}/run-{tag}");
        let remotes: Vec<Arc<Remote>> = used.iter().map(|h| Arc::new(Remote::new(h.clone()))).collect();
        // the executable, once per host and only if it changed
        let exe_path = std::env::current_exe().map_err(|e| e.to_string())?;
        let exe_bytes = std::fs::read(&exe_path).map_err(|e| format!("{}: {e}", exe_path.display()))?;
        let sha: String = Sha256::digest(&exe_bytes).iter().map(|b| format!("{b:02x}")).collect();
        let exe = format!("{dir}/drift");
        let lines = crate::servers::campaign_settings(digest, extra);
        let secret = drift_node::peer_auth::new_secret().map_err(|e| format!("a cluster secret: {e}"))?;
        let text = crate::servers::local_config(
            n,
            &|i| used[(i - 1) as usize].address,
            Path::new(&format!("{remote_run}/data")),
            port,
            quorum_reads,
            &secret,
            &lines,
            table,
            kv,
        );
        let local_config = run_dir.join("cluster.toml");
        let config = crate::servers::write_cluster_file(&local_config, &text)?;
        let owner = format!("{} {}", hosts.controller, std::process::id());
        let mut seen = std::collections::BTreeSet::new();
        for r in &remotes {
            if !seen.contains(&r.host.ssh_addr()) {
                let removed = remove_leftovers(r, &dir, &hosts.controller.to_string())?;
                if !removed.is_empty() {
                    noteln!(
                        "  removed what killed runs left on {}: {}",
                        r.host.address,
                        removed.join(", ")
                    );
                }
            }
            r.check(&format!("mkdir -p {remote_run}/data"))?;
            r.write_file(&format!("{remote_run}/owner"), owner.as_bytes(), 0o644)?;
            // hosts on one machine share the files: upload once per address
            if seen.insert(r.host.ssh_addr()) {
                let theirs = r.run(&format!("sha256sum {exe} 2>/dev/null"))?.stdout;
                if !theirs.starts_with(&sha) {
                    r.write_file(&exe, &exe_bytes, 0o755)?;
                }
            }
            r.write_file(&format!("{remote_run}/cluster.toml"), text.as_bytes(), 0o600)?;
            r.write_file(&format!("{remote_run}/fault-token"), token.as_bytes(), 0o600)?;
        }
        let base = run_dir.join("nodes");
        std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        let nodes: Vec<SshNode> = (1..=n)
            .map(|i| {
                let addr = used[(i - 1) as usize].address;
                SshNode {
                    id: i,
                    host: (i - 1) as usize,
                    client: SocketAddr::new(addr, port),
                    peer: SocketAddr::new(addr, port + 1),
                    admin: SocketAddr::new(addr, port + 2),
                    http: config.peer(i).and_then(|p| p.http),
                    kv: config.peer(i).and_then(|p| p.kv),
                    log: base.join(format!("n{i}.log")),
                    pid: None,
                    started_before: false,
                    paused: false,
                }
            })
            .collect();
        // a chain per host, named after the run (iptables allows 28 characters)
        let short: String = Sha256::digest(remote_run.as_bytes())
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect();
        let chain = format!("DRIFT-S{short}");
        let chains: String = (0..n as usize).map(|k| format!("{chain}-{k}\n")).collect();
        for r in &remotes {
            r.write_file(&format!("{remote_run}/chains"), chains.as_bytes(), 0o644)?;
        }
        let mut cluster = SshCluster {
            remotes,
            nodes,
            run_dir: remote_run,
            exe,
            chain,
            defect: defect.map(str::to_string),
            token: token.to_string(),
            tail_stop: Arc::new(AtomicBool::new(false)),
            tail: None,
            last_poll: None,
        };
        for (k, r) in cluster.remotes.iter().enumerate() {
            let c = cluster.chain_of(k);
            r.check(&r.privileged(&format!("iptables -N {c}")))?;
            r.check(&r.privileged(&format!("iptables -I OUTPUT -j {c}")))?;
        }
        cluster.start_tail();
        Ok(cluster)
    }

    fn chain_of(&self, host: usize) -> String {
        format!("{}-{host}", self.chain)
    }

    fn remote(&self, i: u64) -> &Remote {
        &self.remotes[self.nodes[(i - 1) as usize].host]
    }

    /// Copies the servers' logs back as they grow, over sessions of its own.
    fn start_tail(&mut self) {
        let stop = self.tail_stop.clone();
        let jobs: Vec<(Remote, String, PathBuf)> = self
            .nodes
            .iter()
            .map(|n| {
                (
                    Remote::new(self.remotes[n.host].host.clone()),
                    format!("{}/n{}.log", self.run_dir, n.id),
                    n.log.clone(),
                )
            })
            .collect();
        self.tail = Some(std::thread::spawn(move || {
            let mut offsets = vec![0u64; jobs.len()];
            loop {
                let last = stop.load(Ordering::Relaxed);
                for (k, (r, remote, local)) in jobs.iter().enumerate() {
                    if let Ok(bytes) = r.read_from(remote, offsets[k]) {
                        if !bytes.is_empty() {
                            offsets[k] += bytes.len() as u64;
                            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(local) {
                                let _ = std::io::Write::write_all(&mut f, &bytes);
                            }
                        }
                    }
                }
                if last {
                    return;
                }
                std::thread::sleep(TAIL_EVERY);
            }
        }));
    }

    fn signal(&self, i: u64, sig: &str) -> Result<(), String> {
        let Some(pid) = self.nodes[(i - 1) as usize].pid else {
            return Ok(());
        };
        let r = self.remote(i);
        r.run(&r.privileged(&format!("kill -{sig} {pid}"))).map(|_| ())
    }

    fn alive(&self, i: u64) -> bool {
        let Some(pid) = self.nodes[(i - 1) as usize].pid else {
            return false;
        };
        self.remote(i)
            .run(&format!("kill -0 {pid}"))
            .is_ok_and(|o| o.status == 0)
    }
}

/// Removes, on `r`'s host, the runs under `dir` whose drift (on this
/// controller) is gone: their servers killed, their chains removed, their
/// files deleted. What it removed.
fn remove_leftovers(r: &Remote, dir: &str, controller: &str) -> Result<Vec<String>, String> {
    let listing = r.check(&format!(
        "for d in {dir}/run-*; do [ -f $d/owner ] && echo \"$(cat $d/owner) $d\"; done; true"
    ))?;
    let mut removed = Vec::new();
    for line in listing.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [host, pid, run] = w.as_slice() else { continue };
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if *host != controller || alive || !run.starts_with(&format!("{dir}/run-")) {
            continue;
        }
        let kill = r.privileged("kill -9");
        let ipt = r.privileged("iptables");
        r.run(&format!(
            "for p in {run}/n*.pid; do [ -f $p ] && {kill} $(cat $p) 2>/dev/null; done; \
             for c in $(cat {run}/chains 2>/dev/null); do {ipt} -F $c; {ipt} -D OUTPUT -j $c; {ipt} -X $c; done 2>/dev/null; \
             rm -rf {run}"
        ))?;
        removed.push(run.to_string());
    }
    Ok(removed)
}

impl Db for SshCluster {
    fn dismantle(&mut self) {
        self.remove_all();
    }

    fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    fn client_addr(&self, i: u64) -> SocketAddr {
        self.nodes[(i - 1) as usize].client
    }

    fn peer_addr(&self, i: u64) -> SocketAddr {
        self.nodes[(i - 1) as usize].peer
    }

    /// Starts the server detached; its PID and, once it ends, its exit
    /// status land in `<dir>/<run>/n<i>.pid` and `.exit`.
    fn start(&mut self, i: u64) -> Result<(), BackendError> {
        if self.nodes[(i - 1) as usize].pid.is_some() {
            return Ok(());
        }
        let n = &self.nodes[(i - 1) as usize];
        let run = &self.run_dir;
        let mut node = format!(
            "{exe} node --config {run}/cluster.toml --id {i} --admin {admin} --fault-token-file {run}/fault-token",
            exe = self.exe,
            admin = n.admin
        );
        if !n.started_before {
            node.push_str(" --bootstrap");
        }
        let env = self
            .defect
            .as_ref()
            .map(|d| format!("{}={d} ", drift_node::table::hooks::DEFECT_ENV))
            .unwrap_or_default();
        let script = format!(
            "{env}{node} >> {run}/n{i}.log 2>&1 < /dev/null & echo $! > {run}/n{i}.pid; wait $!; echo $? > {run}/n{i}.exit"
        );
        let cmd = format!(
            "rm -f {run}/n{i}.pid {run}/n{i}.exit; nohup sh -c '{script}' > /dev/null 2>&1 < /dev/null & for _ in $(seq 50); do [ -s {run}/n{i}.pid ] && break; sleep 0.1; done; cat {run}/n{i}.pid"
        );
        let out = self.remote(i).check(&cmd).map_err(|e| spawn_err(i, e))?;
        let pid: u32 = out
            .trim()
            .parse()
            .map_err(|_| spawn_err(i, format!("no PID from the host: {out:?}")))?;
        let n = &mut self.nodes[(i - 1) as usize];
        n.pid = Some(pid);
        n.started_before = true;
        n.paused = false;
        Ok(())
    }

    /// SIGTERM, then SIGKILL once `grace` passed.
    fn stop(&mut self, i: u64, grace: Duration) {
        if self.nodes[(i - 1) as usize].pid.is_none() {
            return;
        }
        if self.nodes[(i - 1) as usize].paused {
            let _ = self.signal(i, "CONT");
        }
        let _ = self.signal(i, "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && self.alive(i) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.alive(i) {
            let _ = self.signal(i, "KILL");
        }
        let n = &mut self.nodes[(i - 1) as usize];
        n.pid = None;
        n.paused = false;
    }

    fn is_up(&self, i: u64) -> bool {
        self.nodes[(i - 1) as usize].pid.is_some()
    }

    fn exits(&mut self) -> Vec<Exit> {
        if self.last_poll.is_some_and(|t| t.elapsed() < STATE_POLL) {
            return Vec::new();
        }
        self.last_poll = Some(Instant::now());
        let mut out = Vec::new();
        for k in 0..self.nodes.len() {
            let id = self.nodes[k].id;
            if self.nodes[k].pid.is_none() || self.alive(id) {
                continue;
            }
            let code = self
                .remote(id)
                .run(&format!("cat {}/n{id}.exit 2>/dev/null", self.run_dir))
                .ok()
                .and_then(|o| o.stdout.trim().parse::<i32>().ok())
                // the shell reports a signal's death as 128 + the signal
                .filter(|c| *c < 128);
            self.nodes[k].pid = None;
            self.nodes[k].paused = false;
            out.push(Exit {
                node: id,
                code,
                part: crate::backend::Part::Node,
            });
        }
        out
    }

    fn wipe(&mut self, i: u64) -> Result<(), BackendError> {
        if self.nodes[(i - 1) as usize].pid.is_some() {
            return Err(BackendError::Running { node: i, what: "wipe" });
        }
        self.remote(i)
            .check(&format!("rm -rf {}/data/node-{i}", self.run_dir))
            .map(|_| ())
            .map_err(|e| BackendError::Hooks { node: i, reason: e })
    }
}

impl Kill for SshCluster {
    fn kill(&mut self, i: u64) {
        let _ = self.signal(i, "KILL");
        // The server's ports are free only once it is gone; a restart
        // right after must not race its exit.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.alive(i) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let n = &mut self.nodes[(i - 1) as usize];
        n.pid = None;
        n.paused = false;
    }
}

impl Pause for SshCluster {
    fn pause(&mut self, i: u64) {
        if self.signal(i, "STOP").is_ok() && self.nodes[(i - 1) as usize].pid.is_some() {
            self.nodes[(i - 1) as usize].paused = true;
        }
    }

    fn resume(&mut self, i: u64) {
        if self.nodes[(i - 1) as usize].paused {
            let _ = self.signal(i, "CONT");
        }
        self.nodes[(i - 1) as usize].paused = false;
    }
}

impl Corrupt for SshCluster {
    /// Damages one of a stopped server's log or snapshot files on its host.
    fn corrupt(&mut self, i: u64, how: Damage, pick: u64) -> Result<String, BackendError> {
        if self.nodes[(i - 1) as usize].pid.is_some() {
            return Err(BackendError::Running {
                node: i,
                what: "corrupt",
            });
        }
        let hooks = |reason: String| BackendError::Hooks { node: i, reason };
        let dir = format!("{}/data/node-{i}", self.run_dir);
        let r = self.remote(i);
        let listing = r.check(&format!("ls -1 {dir} 2>/dev/null || true")).map_err(hooks)?;
        let mut files: Vec<&str> = listing.lines().filter(|f| crate::servers::damageable(f)).collect();
        files.sort_unstable();
        let Some(name) = files.get((pick as usize) % files.len().max(1)) else {
            return Ok("nothing to corrupt".into());
        };
        let path = format!("{dir}/{name}");
        let mut bytes = r.read_from(&path, 0).map_err(hooks)?;
        let Some(what) = crate::servers::damage(&mut bytes, how, pick / files.len() as u64) else {
            return Ok(format!("{path} is empty"));
        };
        r.write_file(&path, &bytes, 0o644).map_err(hooks)?;
        Ok(format!("{what} of {path} on {}", r.host.address))
    }
}

impl LogFiles for SshCluster {
    fn log_files(&self) -> Vec<(u64, PathBuf)> {
        self.nodes.iter().map(|n| (n.id, n.log.clone())).collect()
    }
}

impl Probe for SshCluster {
    fn four(&self, i: u64, word: &str) -> Option<String> {
        crate::servers::four_letter(self.nodes[(i - 1) as usize].client, word)
    }

    fn answering(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| n.pid.is_some() && !n.paused)
            .map(|n| n.id)
            .collect()
    }
}

impl FaultHooks for SshCluster {
    fn hooks_of(&self, i: u64) -> Result<(SocketAddr, &str), BackendError> {
        Ok((self.nodes[(i - 1) as usize].admin, &self.token))
    }
}

impl LinkCut for SshCluster {
    /// Cuts a→b on a's host: its packets from a's address to b's peer and
    /// kv ports, and from a's peer and kv ports to b's address, dropped.
    fn cut_links(&self, links: &[(u64, u64)], _part: crate::backend::Part) -> Option<usize> {
        let mut done = 0;
        for &(a, b) in links {
            let (na, nb) = (&self.nodes[(a - 1) as usize], &self.nodes[(b - 1) as usize]);
            let ports = |n: &SshNode| {
                let mut p = vec![n.peer.port()];
                p.extend(n.kv.map(|k| k.port()));
                p
            };
            let chain = self.chain_of(na.host);
            let (sa, sb) = (na.peer.ip(), nb.peer.ip());
            let mut rules = Vec::new();
            for p in ports(nb) {
                rules.push(format!(
                    "iptables -A {chain} -s {sa} -d {sb} -p tcp --dport {p} -j DROP"
                ));
            }
            for p in ports(na) {
                rules.push(format!(
                    "iptables -A {chain} -s {sa} -d {sb} -p tcp --sport {p} -j DROP"
                ));
            }
            let r = &self.remotes[na.host];
            if rules.iter().all(|c| r.check(&r.privileged(c)).is_ok()) {
                done += 1;
            }
        }
        Some(done)
    }

    fn heal_links(&self) {
        for (k, r) in self.remotes.iter().enumerate() {
            let _ = r.check(&r.privileged(&format!("iptables -F {}", self.chain_of(k))));
        }
    }
}

impl TableHttp for SshCluster {
    fn table_http(&self, i: u64) -> Option<SocketAddr> {
        self.nodes[(i - 1) as usize].http
    }

    fn kv_http(&self, i: u64) -> Option<SocketAddr> {
        self.nodes[(i - 1) as usize].kv
    }
}

impl Faults for SshCluster {}

impl Backend for SshCluster {
    fn name(&self) -> &'static str {
        "ssh hosts"
    }
}

impl SshCluster {
    /// Every server stopped, the chains removed, the logs copied a last
    /// time and the run's files on the hosts deleted.
    fn remove_all(&mut self) {
        for i in self.ids() {
            if self.nodes[(i - 1) as usize].pid.is_some() {
                let _ = self.signal(i, "CONT");
                let _ = self.signal(i, "KILL");
                // a second call must not signal a PID the host reused
                self.nodes[(i - 1) as usize].pid = None;
            }
        }
        for (k, r) in self.remotes.iter().enumerate() {
            let c = self.chain_of(k);
            let _ = r.run(&r.privileged(&format!("iptables -F {c}")));
            let _ = r.run(&r.privileged(&format!("iptables -D OUTPUT -j {c}")));
            let _ = r.run(&r.privileged(&format!("iptables -X {c}")));
        }
        self.tail_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.tail.take() {
            let _ = t.join();
        }
        let mut done = std::collections::BTreeSet::new();
        for r in &self.remotes {
            if done.insert(r.host.ssh_addr()) {
                let _ = r.run(&format!("rm -rf {}", self.run_dir));
            }
        }
    }
}

impl Drop for SshCluster {
    fn drop(&mut self) {
        self.remove_all();
    }
}
