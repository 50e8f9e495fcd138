//! A keeper cluster for one test: `drift cluster up` on its own ports
//! (nodes on 127.0.B.11..13 of whichever address block it claimed: tests
//! run in parallel), driven as an operator would, ended by
//! `drift cluster down` when dropped; and the client helpers the cluster
//! tests share.

use super::drift;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
    pub nodes: u64,
    pub connect: String,
    pub fault_token: Option<String>,
}

impl Cluster {
    /// A keeper cluster without tables.
    pub fn up(tag: &str, port: u16, extra: &[&str]) -> Cluster {
        let mut args = vec!["--no-table"];
        args.extend_from_slice(extra);
        Cluster::up_raw(tag, port, &args)
    }

    /// `drift cluster up` with exactly `extra` (the default table included
    /// unless `--no-table` is among them).
    pub fn up_raw(tag: &str, port: u16, extra: &[&str]) -> Cluster {
        Cluster::up_nodes(tag, port, 3, extra)
    }

    /// `drift cluster up --nodes N` with exactly `extra`.
    pub fn up_nodes(tag: &str, port: u16, nodes: u64, extra: &[&str]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("drift-cluster-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = drift()
            .args([
                "cluster",
                "up",
                "--nodes",
                &nodes.to_string(),
                "--port",
                &port.to_string(),
                "--dir",
            ])
            .arg(&dir)
            .args(extra)
            .output()
            .expect("drift cluster up runs");
        let connect = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fault_token = extra
            .contains(&"--fault-hooks")
            .then(|| std::fs::read_to_string(dir.join("fault-token")).expect("cluster up wrote the fault token"));
        Cluster {
            dir,
            port,
            nodes,
            connect,
            fault_token,
        }
    }

    /// The cluster file `drift cluster up` wrote.
    pub fn config(&self) -> drift_node::config::ClusterConfig {
        drift_node::config::ClusterConfig::load(&self.dir.join("cluster.toml")).unwrap()
    }

    pub fn client_addr(&self, i: u64) -> SocketAddr {
        self.config().peer(i).unwrap().client
    }

    pub fn raft_addr(&self, i: u64) -> SocketAddr {
        self.config().peer(i).unwrap().raft
    }

    /// Node i's admin endpoint (its fault hooks): client port + 2.
    pub fn admin_addr(&self, i: u64) -> SocketAddr {
        let client = self.client_addr(i);
        SocketAddr::new(client.ip(), client.port() + 2)
    }

    pub fn four(&self, i: u64, word: &str) -> Option<String> {
        let mut s = TcpStream::connect_timeout(&self.client_addr(i), Duration::from_millis(300)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(word.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    pub fn field(&self, i: u64, word: &str, key: &str) -> Option<String> {
        self.four(i, word)?
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
    }

    pub fn leader(&self) -> Option<u64> {
        (1..=self.nodes).find(|&i| self.four(i, "srvr").is_some_and(|s| s.contains("Mode: leader")))
    }

    pub fn wait_leader(&self, timeout: Duration) -> u64 {
        wait_for(timeout, || self.leader()).expect("a leader is elected")
    }

    pub fn pid(&self, i: u64) -> u32 {
        let text = std::fs::read_to_string(self.dir.join("pids")).unwrap();
        text.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == i.to_string()).then(|| w.next()?.parse().ok())?
            })
            .unwrap()
    }

    pub fn alive(&self, i: u64) -> bool {
        super::running(self.pid(i))
    }

    pub fn kill(&self, i: u64) {
        let _ = Command::new("kill").args(["-KILL", &self.pid(i).to_string()]).status();
        wait_for(Duration::from_secs(5), || (!self.alive(i)).then_some(())).expect("node died");
    }

    /// Starts node i again, as an operator would (`drift cluster start`).
    pub fn start(&self, i: u64) {
        let out = drift()
            .args(["cluster", "start", "--node", &i.to_string(), "--dir"])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "drift cluster start --node {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops node i, as an operator would (`drift cluster stop`).
    pub fn stop(&self, i: u64) {
        let out = drift()
            .args(["cluster", "stop", "--node", &i.to_string(), "--dir"])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "drift cluster stop --node {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn admin(&self, i: u64, cmd: &str) -> String {
        let addr = self.admin_addr(i);
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(format!("{} {cmd}\n", self.fault_token.as_deref().unwrap()).as_bytes())
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    pub fn log(&self, i: u64) -> String {
        std::fs::read_to_string(self.dir.join(format!("node-{i}.log"))).unwrap_or_default()
    }

    /// Connect string of the listed nodes only.
    pub fn connect_to(&self, nodes: &[u64]) -> String {
        nodes
            .iter()
            .map(|&i| self.client_addr(i).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // `cluster down` ends what the pids file names (restarted nodes
        // too: `cluster start` records them), if their command lines
        // still match
        let _ = drift().args(["cluster", "down", "--dir"]).arg(&self.dir).output();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("cluster left in {} for inspection", self.dir.display());
        }
    }
}

pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub async fn connect(hosts: &str) -> zk::Client {
    connect_with(hosts, None).await
}

/// A session holding the table replicas' coordinator credentials (from
/// the cluster's secret): like a replica's, it may write under a table's
/// path, which the replicas' ACLs keep everyone else from.
pub async fn connect_as_replica(c: &Cluster) -> zk::Client {
    let creds = drift_node::table::coord::credentials(&c.config().secret_bytes());
    connect_with(&c.connect, Some(&creds)).await
}

async fn connect_with(hosts: &str, digest: Option<&[u8]>) -> zk::Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut connector = zk::Client::connector().with_session_timeout(Duration::from_secs(4));
        if let Some(d) = digest {
            connector = connector.with_auth("digest", d);
        }
        match connector.connect(hosts).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("cannot connect to {hosts}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Creates `{prefix}0` .. `{prefix}{n-1}` while the test's own faults
/// happen around it, each as [`create_resent`] does.
pub async fn create_each(client: &zk::Client, prefix: &str, n: usize) {
    for i in 0..n {
        create_resent(client, &format!("{prefix}{i}")).await;
    }
}

/// Creates `path`, sent again when a lost connection leaves its outcome
/// unknown (a node drops its clients' connections when it loses sight of
/// the leader, as ZooKeeper's do, and on a loaded machine a follower can
/// hear nothing from the leader for an election timeout); NodeExists on a
/// resend means the first one committed. Returns once the node is
/// acknowledged, as a client that retries would hold it.
pub async fn create_resent(client: &zk::Client, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut resent = false;
    loop {
        match client.create(path, b"", &persistent()).await {
            Ok(_) => return,
            Err(zk::Error::NodeExists) if resent => return,
            Err(zk::Error::ConnectionLoss) if Instant::now() < deadline => {
                resent = true;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("create {path}: {e}"),
        }
    }
}

pub fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// Whether python3 can import kazoo; without it a test says NOT RUN —
/// and fails instead where `DRIFT_REQUIRE_DEPS` is set (ci/test installs
/// kazoo, so there a missing kazoo is a broken set-up).
pub fn have_kazoo() -> bool {
    have_python_module("kazoo")
}

/// Whether python3 can import `module` (a client ci/test installs), as
/// [`have_kazoo`] judges it.
pub fn have_python_module(module: &str) -> bool {
    let have = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        let why = format!("python3 with {module} is missing (ci/test installs it)");
        assert!(
            std::env::var_os("DRIFT_REQUIRE_DEPS").is_none(),
            "{why}, and DRIFT_REQUIRE_DEPS is set"
        );
        eprintln!("NOT RUN: {why}");
    }
    have
}
