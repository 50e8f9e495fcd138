//! The local-process backend: N servers as child processes of `drift`,
//! server i on its own loopback address 127.0.B.(10+i) of the run's
//! address block B (client port P, Raft P+1, admin P+2; with proxies,
//! link i→j on 127.0.B.(10+j):P+10+i), data and logs under the run
//! directory.
//!
//! It implements every capability of [`crate::backend`]: start, stop
//! (SIGTERM), kill (SIGKILL), pause/resume (SIGSTOP/SIGCONT), wipe and
//! corrupt the data dir (only while the node is down), fault hooks through
//! the node's token-guarded admin endpoint, and its log file. Every signal
//! goes to a PID this backend started and still owns; nothing else is
//! touched. With `zookeeper` it runs Apache ZooKeeper 3.8 the same way.

use crate::backend::{
    Backend, BackendError, Corrupt, Damage, Db, Exit, FaultHooks, Faults, Kill, LinkCut, LogFiles, Pause, Probe,
    TableHttp,
};
use crate::claim::Block;
use crate::plan::DigestMode;
use crate::proxy::ProxyMesh;
use crate::servers::{damage_files, signal, watch_parent, write_zookeeper_configs, zookeeper_command};
use std::net::SocketAddr;
// servers in process groups of their own: a terminal's Ctrl-C reaches
// drift, which stops them itself (`crate::interrupt`)
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LocalNode {
    pub id: u64,
    pub client: SocketAddr,
    pub peer: SocketAddr,
    pub admin: SocketAddr,
    /// The table's HTTP interface, where the node holds a replica.
    pub http: Option<SocketAddr>,
    /// The kv service's HTTP interface, where the node runs it.
    pub kv: Option<SocketAddr>,
    pub dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    /// For a ZooKeeper node: the watcher that ends it if drift dies.
    watcher: Option<Child>,
    /// Whether it was started before: only its first start bootstraps
    /// (after that, a node without Raft state lost it).
    started_before: bool,
    paused: bool,
    /// The `cgroup.procs` of the cgroup it runs in, if the run cuts links
    /// by cgroup (see [`crate::cgroup`]).
    cgroup: Option<PathBuf>,
}

/// What [`LocalCluster::new`] builds.
pub struct LocalSpec<'a> {
    pub nodes: u64,
    /// The run's address block: server i binds 127.0.B.(10+i).
    pub block: Block,
    /// Client port P (Raft P+1, admin P+2, proxies P+11..=P+19).
    pub port: u16,
    pub quorum_reads: bool,
    pub digest: DigestMode,
    /// The fault hooks' token.
    pub token: &'a str,
    /// Apache ZooKeeper instead of the drift keeper.
    pub zookeeper: bool,
    /// Route every peer link through a proxy this backend owns, so that
    /// partitions can cut links without iptables.
    pub proxies: bool,
    /// A replicated table on the first `replicas` nodes.
    pub table: Option<&'a crate::servers::LocalTable>,
    /// The kv service on every node.
    pub kv: Option<&'a crate::servers::LocalKv>,
    /// Cluster-file lines beside the campaign's own (`key = value`).
    pub extra: Vec<String>,
    /// A test-only table defect every node arms at start (through its
    /// fault hooks; `drift_node::table::hooks::DEFECT_ENV`).
    pub defect: Option<&'a str>,
}

pub struct LocalCluster {
    /// Apache ZooKeeper instead of the drift keeper (a baseline).
    pub zookeeper: bool,
    mesh: Option<ProxyMesh>,
    pub nodes: Vec<LocalNode>,
    pub config_path: PathBuf,
    token: String,
    defect: Option<String>,
    exe: PathBuf,
}

impl Db for LocalCluster {
    /// What the drop does: every node killed and every watcher reaped.
    fn dismantle(&mut self) {
        self.end_all();
    }

    fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    fn start(&mut self, i: u64) -> Result<(), BackendError> {
        let (exe, config, token) = (self.exe.clone(), self.config_path.clone(), self.token.clone());
        let defect = self.defect.clone();
        let zookeeper = self.zookeeper;
        let via: Vec<String> = match &self.mesh {
            Some(m) => self
                .ids()
                .into_iter()
                .filter_map(|j| Some(format!("--peer-via={j}={}", m.listen_addr(i, j)?)))
                .collect(),
            None => Vec::new(),
        };
        let n = self.node(i);
        if n.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .map_err(|e| BackendError::io(&n.log, e))?;
        let placed = |c: Command| match &n.cgroup {
            Some(procs) => crate::cgroup::in_cgroup(&c, procs),
            None => c,
        };
        if zookeeper {
            let child = placed(zookeeper_command(&n.dir, None))
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| BackendError::io(&n.log, e))?)
                .stderr(log)
                .spawn()
                .map_err(|source| BackendError::Spawn { node: i, source })?;
            // the drift node exits with its parent by itself; a JVM does
            // not, so a watcher ends it once drift is gone (or quits with it)
            if let Some(mut old) = n.watcher.take() {
                // its JVM is gone, so it ends within half a second
                let _ = old.wait();
            }
            n.watcher = watch_parent(child.id());
            n.child = Some(child);
            n.paused = false;
            return Ok(());
        }
        let mut cmd = Command::new(exe);
        cmd.args(["node", "--config"])
            .arg(config)
            .args([
                "--id",
                &i.to_string(),
                "--exit-with-parent",
                &std::process::id().to_string(),
                "--admin",
            ])
            .arg(n.admin.to_string())
            // the token through the environment: a command line is public
            .env(crate::servers::FAULT_TOKEN_ENV, &token)
            .envs(defect.iter().map(|d| (drift_node::table::hooks::DEFECT_ENV, d)))
            .args(&via)
            .args((!n.started_before).then_some("--bootstrap"));
        let child = placed(cmd)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| BackendError::io(&n.log, e))?)
            .stderr(log)
            .spawn()
            .map_err(|source| BackendError::Spawn { node: i, source })?;
        n.child = Some(child);
        n.started_before = true;
        n.paused = false;
        Ok(())
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    fn stop(&mut self, i: u64, grace: Duration) {
        let n = self.node(i);
        if let Some(mut c) = n.child.take() {
            if n.paused {
                signal(c.id(), "CONT");
            }
            signal(c.id(), "TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    n.paused = false;
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        n.paused = false;
    }

    fn is_up(&self, i: u64) -> bool {
        self.nodes[(i - 1) as usize].child.is_some()
    }

    /// Nodes that exited on their own since the last call (reaped).
    fn exits(&mut self) -> Vec<Exit> {
        let mut out = Vec::new();
        for n in &mut self.nodes {
            if let Some(c) = &mut n.child {
                if let Ok(Some(status)) = c.try_wait() {
                    out.push(Exit {
                        node: n.id,
                        code: status.code(),
                        part: crate::backend::Part::Node,
                    });
                    n.child = None;
                    n.paused = false;
                }
            }
        }
        out
    }

    /// Removes a stopped node's data dir.
    fn wipe(&mut self, i: u64) -> Result<(), BackendError> {
        let zookeeper = self.zookeeper;
        let n = self.node(i);
        if n.child.is_some() {
            return Err(BackendError::Running { node: i, what: "wipe" });
        }
        // a ZooKeeper node keeps its zoo.cfg and myid: only its state goes
        let dir = if zookeeper {
            n.dir.join("data/version-2")
        } else {
            n.dir.clone()
        };
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BackendError::io(&dir, e)),
        }
    }

    fn client_addr(&self, i: u64) -> SocketAddr {
        self.nodes[(i - 1) as usize].client
    }

    fn peer_addr(&self, i: u64) -> SocketAddr {
        self.nodes[(i - 1) as usize].peer
    }
}

impl Kill for LocalCluster {
    /// SIGKILL and reap.
    fn kill(&mut self, i: u64) {
        let n = self.node(i);
        if let Some(mut c) = n.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        n.paused = false;
    }
}

impl Pause for LocalCluster {
    fn pause(&mut self, i: u64) {
        let n = self.node(i);
        if let Some(c) = &n.child {
            signal(c.id(), "STOP");
            n.paused = true;
        }
    }

    fn resume(&mut self, i: u64) {
        let n = self.node(i);
        if let Some(c) = &n.child {
            if n.paused {
                signal(c.id(), "CONT");
            }
        }
        n.paused = false;
    }
}

impl Corrupt for LocalCluster {
    /// Damages the newest changelog segment or snapshot of a stopped node:
    /// truncates it, or flips one byte. Returns what was done.
    fn corrupt(&mut self, i: u64, how: Damage, pick: u64) -> Result<String, BackendError> {
        let n = self.node(i);
        if n.child.is_some() {
            return Err(BackendError::Running {
                node: i,
                what: "corrupt",
            });
        }
        damage_files(&n.dir, how, pick)
    }
}

impl LogFiles for LocalCluster {
    fn log_files(&self) -> Vec<(u64, PathBuf)> {
        self.nodes.iter().map(|n| (n.id, n.log.clone())).collect()
    }
}

impl Probe for LocalCluster {
    /// Sends a four-letter word to node i's client port.
    fn four(&self, i: u64, word: &str) -> Option<String> {
        crate::servers::four_letter(self.nodes[(i - 1) as usize].client, word)
    }

    fn answering(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && !n.paused)
            .map(|n| n.id)
            .collect()
    }

    /// The drift keeper's `dgst` index, or ZooKeeper's last zxid.
    fn applied_index(&self, i: u64) -> Option<String> {
        if self.zookeeper {
            self.field(i, "srvr", "Zxid:")
        } else {
            self.field(i, "dgst", "applied_index")
        }
    }

    fn digest(&self, i: u64) -> Option<(String, String)> {
        if self.zookeeper {
            return None;
        }
        crate::backend::keeper_digest(self, i)
    }
}

impl FaultHooks for LocalCluster {
    fn hooks_of(&self, i: u64) -> Result<(SocketAddr, &str), BackendError> {
        if self.zookeeper {
            return Err(BackendError::Unsupported("ZooKeeper servers have no fault hooks"));
        }
        Ok((self.nodes[(i - 1) as usize].admin, &self.token))
    }
}

impl LinkCut for LocalCluster {
    fn cut_links(&self, links: &[(u64, u64)], _part: crate::backend::Part) -> Option<usize> {
        self.mesh.as_ref().map(|m| m.cut(links))
    }

    fn heal_links(&self) {
        if let Some(m) = &self.mesh {
            m.heal();
        }
    }
}

impl TableHttp for LocalCluster {
    fn table_http(&self, i: u64) -> Option<SocketAddr> {
        self.nodes[(i - 1) as usize].http
    }

    fn kv_http(&self, i: u64) -> Option<SocketAddr> {
        self.nodes[(i - 1) as usize].kv
    }
}

impl LocalCluster {
    /// Writes the cluster file under `run_dir/nodes` (not started yet).
    pub fn new(run_dir: &Path, spec: LocalSpec<'_>) -> Result<LocalCluster, String> {
        let LocalSpec {
            nodes: n,
            block,
            port,
            quorum_reads,
            digest,
            token,
            zookeeper,
            proxies,
            table,
            kv,
            extra,
            defect,
        } = spec;
        let base = run_dir.join("nodes");
        std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        let campaign = crate::servers::campaign_settings(digest, extra);
        let secret = drift_node::peer_auth::new_secret().map_err(|e| format!("a cluster secret: {e}"))?;
        let text = crate::servers::local_config(
            n,
            &|i| block.ip(i),
            &base,
            port,
            quorum_reads,
            &secret,
            &campaign,
            table,
            kv,
        );
        let config_path = run_dir.join("cluster.toml");
        let config = crate::servers::write_cluster_file(&config_path, &text)?;
        let nodes = (1..=n)
            .map(|i| LocalNode {
                id: i,
                client: SocketAddr::new(block.ip(i), port),
                peer: SocketAddr::new(block.ip(i), port + 1),
                admin: SocketAddr::new(block.ip(i), port + 2),
                http: config.peer(i).and_then(|p| p.http),
                kv: config.peer(i).and_then(|p| p.kv),
                dir: config.node_dir(i),
                log: base.join(format!("n{i}.log")),
                child: None,
                watcher: None,
                started_before: false,
                paused: false,
                cgroup: None,
            })
            .collect();
        if zookeeper {
            write_zookeeper_configs(&config, block, n, port)?;
        }
        // link i→j: server i dials 127.0.B.(10+j):P+10+i, the proxy dials
        // j's Raft address from i's
        let mesh = if proxies && !zookeeper {
            let links: Vec<_> = (1..=n)
                .flat_map(|i| (1..=n).filter(move |&j| j != i).map(move |j| (i, j)))
                .map(|(i, j)| {
                    let listen = SocketAddr::new(block.ip(j), port + 10 + i as u16);
                    let target = SocketAddr::new(block.ip(j), port + 1);
                    (i, j, listen, target, block.ip(i))
                })
                .collect();
            Some(ProxyMesh::start(&links)?)
        } else {
            None
        };
        Ok(LocalCluster {
            zookeeper,
            mesh,
            nodes,
            config_path,
            token: token.to_string(),
            defect: defect.map(str::to_string),
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
        })
    }

    fn node(&mut self, i: u64) -> &mut LocalNode {
        &mut self.nodes[(i - 1) as usize]
    }

    /// Runs node `i` in the cgroup whose `cgroup.procs` is `procs` from its
    /// next start on.
    pub fn place_in_cgroup(&mut self, i: u64, procs: PathBuf) {
        self.node(i).cgroup = Some(procs);
    }
}

impl Faults for LocalCluster {}

impl Backend for LocalCluster {
    fn name(&self) -> &'static str {
        if self.zookeeper {
            "local processes (Apache ZooKeeper)"
        } else {
            "local processes"
        }
    }
}

impl LocalCluster {
    /// Every node ended and every watcher reaped.
    fn end_all(&mut self) {
        for n in &mut self.nodes {
            crate::servers::end_watched(&mut n.child, &mut n.watcher);
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.end_all();
    }
}
