//! The Docker backend: one container per server, on a bridge network the
//! run creates, with fixed addresses, every fault applied from the host.
//!
//! * The image holds only the static `drift` executable
//!   ([`crate::image`]). Each server's data directory and the cluster
//!   file are bind-mounted from the run directory, so `corrupt`, `wipe`
//!   and the logs work as on local processes.
//! * A server is (re)started by creating its container anew (`--bootstrap`
//!   only on its first start, as a local server's), with `--init` so a
//!   stop is a graceful SIGTERM; no capability is added and nothing is
//!   published on the host.
//! * Faults: SIGKILL and start for crash and restart, `docker pause` and
//!   `unpause`, the data directory dropped for wipe; partitions are
//!   iptables rules in a chain of each container's own network namespace,
//!   entered from the host (`nsenter -t <pid> -n`), so a heal flushes one
//!   chain per server and nothing touches the host's tables. Cuts outlive
//!   restarts: they are applied again to a restarted container.
//! * Network safety: before the harness sends anything to a container it
//!   checks with `ip route get` that the route goes over the bridge this
//!   run created, and refuses otherwise.
//! * Teardown removes every container and the network, also those a
//!   killed drift left behind: each carries the label of the drift process
//!   that made it, and a run removes those whose process is gone.

use crate::backend::{
    Backend, BackendError, Corrupt, Damage, Db, Exit, FaultHooks, Faults, Kill, LinkCut, LogFiles, Pause, Probe,
    TableHttp,
};
use crate::container::{ContainerEngine, RunSpec};
use crate::local::LocalSpec;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The label every container and network of a run carries: the PID of
/// the drift process that made it.
pub const OWNER_LABEL: &str = "io.drift.owner";
/// The label naming the run.
pub const RUN_LABEL: &str = "io.drift.run";
/// Subnets the backend takes a /24 from: 10.213.k.0/24.
const SUBNET_PREFIX: [u8; 2] = [10, 213];
/// The chain of a container's own iptables that holds its cuts.
const CHAIN: &str = "DRIFT-CUT";
/// How often the containers' states are read for exits, at most.
const STATE_POLL: Duration = Duration::from_millis(500);

struct DockerNode {
    id: u64,
    name: String,
    ip: Ipv4Addr,
    client: SocketAddr,
    peer: SocketAddr,
    admin: SocketAddr,
    http: Option<SocketAddr>,
    kv: Option<SocketAddr>,
    dir: PathBuf,
    log: PathBuf,
    started_before: bool,
    up: bool,
    paused: bool,
    logs: Option<Child>,
}

pub struct DockerCluster {
    engine: Box<dyn ContainerEngine>,
    image: String,
    network: String,
    run: String,
    nodes: Vec<DockerNode>,
    token: String,
    defect: Option<String>,
    /// Directed links cut now (applied again after a restart).
    cuts: Mutex<Vec<(u64, u64)>>,
    last_poll: Option<Instant>,
}

fn owner_alive(value: &str) -> bool {
    value
        .parse::<u32>()
        .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes containers and networks of drift runs whose process is gone;
/// what it removed.
pub fn remove_leftovers(engine: &dyn ContainerEngine) -> Result<Vec<String>, String> {
    let mut removed = Vec::new();
    for (name, owner) in engine.containers_labelled(OWNER_LABEL, OWNER_LABEL)? {
        if !owner_alive(&owner) {
            engine.rm(&name)?;
            removed.push(name);
        }
    }
    for (name, owner) in engine.networks_labelled(OWNER_LABEL, OWNER_LABEL)? {
        if !owner_alive(&owner) {
            engine.network_rm(&name)?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// Whether the route to `ip` goes over `bridge` (the interface the run's
/// network created); the route as `ip route get` says it otherwise.
pub fn route_check(ip: Ipv4Addr, bridge: &str) -> Result<(), String> {
    let out = Command::new("ip")
        .args(["route", "get", &ip.to_string()])
        .output()
        .map_err(|e| format!("ip route get {ip}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let dev = text.split_whitespace().skip_while(|w| *w != "dev").nth(1);
    if out.status.success() && dev == Some(bridge) {
        Ok(())
    } else {
        Err(format!(
            "refusing to talk to {ip}: its route ({}) does not go over this run's bridge {bridge}",
            text.trim()
        ))
    }
}

fn nsenter(pid: u32, args: &[&str]) -> Result<(), String> {
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("nsenter -t {pid} -n {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nsenter -t {pid} -n {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The fault token's file in the nodes' directory (`/data` inside).
const FAULT_TOKEN_FILE: &str = "fault-token";

impl DockerCluster {
    /// Writes the cluster file, builds (or finds) the image and creates
    /// the network; no server runs yet.
    pub fn new(run_dir: &Path, spec: LocalSpec<'_>, engine: Box<dyn ContainerEngine>) -> Result<DockerCluster, String> {
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
            return Err("the docker backend runs drift servers only (not --target zookeeper)".into());
        }
        if let Ok(removed) = remove_leftovers(engine.as_ref()) {
            if !removed.is_empty() {
                noteln!("  removed what killed runs left: {}", removed.join(", "));
            }
        }
        let image = crate::image::ensure(engine.as_ref(), &run_dir.join("image")).map_err(|f| f.message)?;
        let run = run_dir
            .file_name()
            .map(|f| f.to_string_lossy().replace([':', '.'], "-").to_lowercase())
            .unwrap_or_else(|| "run".into());
        let run = format!("drift-{}-{}", std::process::id(), run);
        let owner = std::process::id().to_string();
        let labels = vec![
            (OWNER_LABEL.to_string(), owner.clone()),
            (RUN_LABEL.to_string(), run.clone()),
        ];
        // a /24 no other network holds
        let mut created = None;
        let mut last_err = String::new();
        for k in 1..=250u8 {
            let subnet = format!("{}.{}.{k}.0/24", SUBNET_PREFIX[0], SUBNET_PREFIX[1]);
            match engine.network_create(&run, &subnet, &labels) {
                Ok(id) => {
                    created = Some((id, k));
                    break;
                }
                Err(e) => last_err = e,
            }
        }
        let (network_id, k) =
            created.ok_or_else(|| format!("no free 10.213.k.0/24 for the run's network: {last_err}"))?;
        let ip = |i: u64| Ipv4Addr::new(SUBNET_PREFIX[0], SUBNET_PREFIX[1], k, 10 + i as u8);
        // a bind mount takes an absolute host path (a relative one is read
        // as the name of a volume)
        let base = std::path::absolute(run_dir.join("nodes")).map_err(|e| format!("{}: {e}", run_dir.display()))?;
        std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        // the fault token goes in as a file of the mounted directory, never
        // as an argument or environment variable of `docker run` (both show
        // in `ps` and `docker inspect`)
        crate::servers::write_private(&base.join(FAULT_TOKEN_FILE), token)?;
        let lines = crate::servers::campaign_settings(digest, extra);
        let secret = drift_node::peer_auth::new_secret().map_err(|e| format!("a cluster secret: {e}"))?;
        // the servers see their data under /data
        let text = crate::servers::local_config(
            n,
            &|i| IpAddr::V4(ip(i)),
            Path::new("/data"),
            port,
            quorum_reads,
            &secret,
            &lines,
            table,
            kv,
        );
        let config_path = run_dir.join("cluster.toml");
        let config = crate::servers::write_cluster_file(&config_path, &text)?;
        let bridge = format!("br-{}", &network_id[..network_id.len().min(12)]);
        let mut nodes = Vec::new();
        for i in 1..=n {
            route_check(ip(i), &bridge)?;
            let dir = base.join(format!("node-{i}"));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            nodes.push(DockerNode {
                id: i,
                name: format!("{run}-n{i}"),
                ip: ip(i),
                client: SocketAddr::new(IpAddr::V4(ip(i)), port),
                peer: SocketAddr::new(IpAddr::V4(ip(i)), port + 1),
                admin: SocketAddr::new(IpAddr::V4(ip(i)), port + 2),
                http: config.peer(i).and_then(|p| p.http),
                kv: config.peer(i).and_then(|p| p.kv),
                dir,
                log: base.join(format!("n{i}.log")),
                started_before: false,
                up: false,
                paused: false,
                logs: None,
            });
        }
        let cluster = DockerCluster {
            engine,
            image,
            network: run.clone(),
            run,
            nodes,
            token: token.to_string(),
            defect: defect.map(str::to_string),
            cuts: Mutex::new(Vec::new()),
            last_poll: None,
        };
        // the cluster file goes in read-only, beside the data
        std::fs::copy(&config_path, base.join("cluster.toml")).map_err(|e| format!("{}: {e}", base.display()))?;
        Ok(cluster)
    }

    fn node(&mut self, i: u64) -> &mut DockerNode {
        &mut self.nodes[(i - 1) as usize]
    }

    /// The host PID of node `i`'s first process, if it runs.
    fn pid(&self, i: u64) -> Option<u32> {
        let s = self.engine.state(&self.nodes[(i - 1) as usize].name).ok()?;
        (s.running && s.pid > 0).then_some(s.pid)
    }

    /// The node's cut chain, and every cut from it that is in force.
    fn apply_cuts(&self, i: u64) -> Result<(), String> {
        let pid = self.pid(i).ok_or_else(|| format!("node {i} is not running"))?;
        // the chain may exist from a cut before a restart of the
        // container's namespace: create, or flush
        if nsenter(pid, &["iptables", "-N", CHAIN]).is_err() {
            nsenter(pid, &["iptables", "-F", CHAIN])?;
        } else {
            nsenter(pid, &["iptables", "-I", "OUTPUT", "-j", CHAIN])?;
        }
        let cuts = self.cuts.lock().map(|c| c.clone()).unwrap_or_default();
        for (_, b) in cuts.into_iter().filter(|(a, _)| *a == i) {
            let to = self.nodes[(b - 1) as usize].ip.to_string();
            nsenter(pid, &["iptables", "-A", CHAIN, "-d", &to, "-j", "DROP"])?;
        }
        Ok(())
    }
}

impl Db for DockerCluster {
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

    /// Creates the node's container anew and follows its output into the
    /// node's log file.
    fn start(&mut self, i: u64) -> Result<(), BackendError> {
        if self.nodes[(i - 1) as usize].up {
            return Ok(());
        }
        let base = self.nodes[0].dir.parent().expect("the nodes dir").to_path_buf();
        let n = &self.nodes[(i - 1) as usize];
        let spawn = |reason: String| BackendError::Spawn {
            node: i,
            source: std::io::Error::other(reason),
        };
        // a container of an earlier start, stopped: replaced
        let _ = self.engine.rm(&n.name);
        let mut args = vec![
            "node".to_string(),
            "--config".into(),
            "/data/cluster.toml".into(),
            "--id".into(),
            i.to_string(),
            "--admin".into(),
            n.admin.to_string(),
            "--fault-token-file".into(),
            format!("/data/{FAULT_TOKEN_FILE}"),
        ];
        if !n.started_before {
            args.push("--bootstrap".into());
        }
        let mut env = Vec::new();
        if let Some(d) = &self.defect {
            env.push((drift_node::table::hooks::DEFECT_ENV.to_string(), d.clone()));
        }
        let spec = RunSpec {
            name: n.name.clone(),
            image: self.image.clone(),
            network: self.network.clone(),
            ip: n.ip,
            mounts: vec![(base, "/data".into(), false)],
            env,
            labels: vec![
                (OWNER_LABEL.to_string(), std::process::id().to_string()),
                (RUN_LABEL.to_string(), self.run.clone()),
            ],
            args,
        };
        let since = since_now();
        self.engine.run(&spec).map_err(spawn)?;
        let logs = self.engine.follow_logs(&n.name, &since, &n.log).map_err(spawn)?;
        let n = self.node(i);
        if let Some(mut old) = n.logs.replace(logs) {
            let _ = old.kill();
            let _ = old.wait();
        }
        n.up = true;
        n.paused = false;
        n.started_before = true;
        self.apply_cuts(i).map_err(spawn)
    }

    fn stop(&mut self, i: u64, grace: Duration) {
        let name = self.nodes[(i - 1) as usize].name.clone();
        if self.nodes[(i - 1) as usize].paused {
            let _ = self.engine.unpause(&name);
        }
        let _ = self.engine.stop(&name, grace.as_secs().max(1));
        let n = self.node(i);
        n.up = false;
        n.paused = false;
    }

    fn is_up(&self, i: u64) -> bool {
        self.nodes[(i - 1) as usize].up
    }

    /// Nodes whose container stopped without the harness asking.
    fn exits(&mut self) -> Vec<Exit> {
        if self.last_poll.is_some_and(|t| t.elapsed() < STATE_POLL) {
            return Vec::new();
        }
        self.last_poll = Some(Instant::now());
        let mut out = Vec::new();
        for k in 0..self.nodes.len() {
            if !self.nodes[k].up {
                continue;
            }
            if let Ok(s) = self.engine.state(&self.nodes[k].name) {
                if !s.running {
                    self.nodes[k].up = false;
                    self.nodes[k].paused = false;
                    out.push(Exit {
                        node: self.nodes[k].id,
                        code: Some(s.exit_code),
                        part: crate::backend::Part::Node,
                    });
                }
            }
        }
        out
    }

    /// Drops a stopped node's data directory (it rejoins empty).
    fn wipe(&mut self, i: u64) -> Result<(), BackendError> {
        let n = self.node(i);
        if n.up {
            return Err(BackendError::Running { node: i, what: "wipe" });
        }
        if let Err(e) = std::fs::remove_dir_all(&n.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(BackendError::io(&n.dir, e));
            }
        }
        std::fs::create_dir_all(&n.dir).map_err(|e| BackendError::io(&n.dir, e))
    }
}

impl Kill for DockerCluster {
    fn kill(&mut self, i: u64) {
        let name = self.nodes[(i - 1) as usize].name.clone();
        let _ = self.engine.kill(&name);
        let n = self.node(i);
        n.up = false;
        n.paused = false;
    }
}

impl Pause for DockerCluster {
    fn pause(&mut self, i: u64) {
        let name = self.nodes[(i - 1) as usize].name.clone();
        if self.nodes[(i - 1) as usize].up && self.engine.pause(&name).is_ok() {
            self.node(i).paused = true;
        }
    }

    fn resume(&mut self, i: u64) {
        let name = self.nodes[(i - 1) as usize].name.clone();
        if self.nodes[(i - 1) as usize].paused {
            let _ = self.engine.unpause(&name);
        }
        self.node(i).paused = false;
    }
}

impl Corrupt for DockerCluster {
    fn corrupt(&mut self, i: u64, how: Damage, pick: u64) -> Result<String, BackendError> {
        let n = &self.nodes[(i - 1) as usize];
        if n.up {
            return Err(BackendError::Running {
                node: i,
                what: "corrupt",
            });
        }
        crate::servers::damage_files(&n.dir, how, pick)
    }
}

impl LogFiles for DockerCluster {
    fn log_files(&self) -> Vec<(u64, PathBuf)> {
        self.nodes.iter().map(|n| (n.id, n.log.clone())).collect()
    }
}

impl Probe for DockerCluster {
    fn four(&self, i: u64, word: &str) -> Option<String> {
        crate::servers::four_letter(self.nodes[(i - 1) as usize].client, word)
    }

    fn answering(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.up && !n.paused).map(|n| n.id).collect()
    }
}

impl FaultHooks for DockerCluster {
    fn hooks_of(&self, i: u64) -> Result<(SocketAddr, &str), BackendError> {
        Ok((self.nodes[(i - 1) as usize].admin, &self.token))
    }
}

impl LinkCut for DockerCluster {
    /// Cuts a→b by dropping, in a's own namespace, everything a sends to b.
    fn cut_links(&self, links: &[(u64, u64)], _part: crate::backend::Part) -> Option<usize> {
        let mut done = 0;
        for &(a, b) in links {
            if let Ok(mut c) = self.cuts.lock() {
                if !c.contains(&(a, b)) {
                    c.push((a, b));
                }
            }
            let Some(pid) = self.pid(a) else { continue };
            let to = self.nodes[(b - 1) as usize].ip.to_string();
            if nsenter(pid, &["iptables", "-A", CHAIN, "-d", &to, "-j", "DROP"]).is_ok() {
                done += 1;
            }
        }
        Some(done)
    }

    fn heal_links(&self) {
        if let Ok(mut c) = self.cuts.lock() {
            c.clear();
        }
        for n in &self.nodes {
            if let Some(pid) = self.pid(n.id) {
                let _ = nsenter(pid, &["iptables", "-F", CHAIN]);
            }
        }
    }
}

impl TableHttp for DockerCluster {
    fn table_http(&self, i: u64) -> Option<SocketAddr> {
        self.nodes[(i - 1) as usize].http
    }

    fn kv_http(&self, i: u64) -> Option<SocketAddr> {
        self.nodes[(i - 1) as usize].kv
    }
}

impl Faults for DockerCluster {}

impl Backend for DockerCluster {
    fn name(&self) -> &'static str {
        "docker containers"
    }
}

impl DockerCluster {
    /// Every container and the network go, with the log followers.
    fn remove_all(&mut self) {
        for n in &mut self.nodes {
            let _ = self.engine.rm(&n.name);
            if let Some(mut c) = n.logs.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = self.engine.network_rm(&self.network);
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// `now` as RFC 3339 seconds, for `docker logs --since`.
fn since_now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    secs.to_string()
}
