//! `drift node` (run one node in the foreground) and `drift cluster
//! up|status|down` (a local cluster in the background to play with).
//!
//! A local cluster: node i binds 127.0.0.(10+i), client port P and Raft
//! port P+1, so a firewall rule on an address pair cuts one link.
//! `up` writes `<dir>/cluster.toml`, starts the nodes with their logs in
//! `<dir>/node-<i>.log`, records their PIDs in `<dir>/pids`, waits for a
//! leader, and prints the connect string. `down` ends exactly those PIDs
//! (after checking they are still our nodes).

use crate::cli::{ClusterAction, ClusterArgs, NodeArgs};
use crate::fail::Failure;
use drift_node::config::ClusterConfig;
use drift_node::keeper_node::{self, NodeOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Most nodes a local cluster has (their addresses 127.0.0.11..=19).
pub const NODES_MAX: u64 = 9;
const UP_TIMEOUT: Duration = Duration::from_secs(30);

pub fn node(args: NodeArgs) -> Result<i32, Failure> {
    let mut config = ClusterConfig::load(&args.config).map_err(Failure::new)?;
    if let Some(d) = args.digest {
        if drift_keeper::DigestMode::parse(&d).is_none() {
            return Err(Failure::new(format!("--digest {d}: expected off, incremental or full")));
        }
        config.digest = d;
    }
    config.quorum_reads |= args.quorum_reads;
    if args.fault_hooks.is_some() != args.admin.is_some() {
        return Err(Failure::new("--fault-hooks and --admin go together"));
    }
    let mut peer_via = Vec::new();
    for v in &args.peer_via {
        let parsed = v
            .split_once('=')
            .and_then(|(id, addr)| Some((id.trim().parse::<u64>().ok()?, addr.trim().parse().ok()?)));
        match parsed {
            Some((id, addr)) if config.peers.iter().any(|p| p.id == id) => peer_via.push((id, addr)),
            Some((id, _)) => {
                return Err(Failure::new(format!(
                    "--peer-via {v}: no peer {id} in the cluster file"
                )))
            }
            None => return Err(Failure::new(format!("--peer-via {v}: expected ID=IP:PORT"))),
        }
    }
    keeper_node::run(NodeOptions {
        id: args.id,
        config,
        fault_token: args.fault_hooks,
        admin: args.admin,
        exit_with_parent: args.exit_with_parent,
        peer_via,
        bootstrap: args.bootstrap,
    })
    .map_err(|e| Failure::new(format!("node {}: {e}", args.id)))?;
    Ok(0)
}

pub fn cluster(args: ClusterArgs) -> Result<i32, Failure> {
    match args.action {
        ClusterAction::Up {
            nodes,
            dir,
            port,
            quorum_reads,
            fault_hooks,
            set,
        } => up(nodes, &dir, port, quorum_reads, fault_hooks.as_deref(), &set),
        ClusterAction::Status { dir } => status(&dir),
        ClusterAction::Down { dir } => down(&dir),
    }
}

/// Node i's loopback address.
/// A base port for nodes that use ports `port..=port + used`: not
/// privileged, and the last one still a port.
pub fn check_port(port: u16, used: u16) -> Result<(), Failure> {
    if port < 1024 || port > u16::MAX - used {
        return Err(Failure::new(format!(
            "--port must be in 1024..={} (a node uses ports P..=P+{used})",
            u16::MAX - used
        )));
    }
    Ok(())
}

pub fn node_ip(i: u64) -> String {
    format!("127.0.0.{}", 10 + i)
}

/// The cluster file of a local cluster.
pub fn local_config(nodes: u64, data_dir: &Path, port: u16, quorum_reads: bool, set: &[String]) -> String {
    let mut t = String::new();
    let defaults = [
        ("data_dir", format!("{:?}", data_dir.display().to_string())),
        ("tick_ms", "50".to_string()),
        ("quorum_reads", quorum_reads.to_string()),
    ];
    let overridden = |k: &str| set.iter().any(|l| l.split('=').next().is_some_and(|x| x.trim() == k));
    for (k, v) in defaults {
        if !overridden(k) {
            t.push_str(&format!("{k} = {v}\n"));
        }
    }
    for line in set {
        t.push_str(line);
        t.push('\n');
    }
    for i in 1..=nodes {
        t.push_str(&format!(
            "\n[[peer]]\nid = {i}\nraft = \"{ip}:{raft}\"\nclient = \"{ip}:{port}\"\n",
            ip = node_ip(i),
            raft = port + 1
        ));
    }
    t
}

fn up(
    nodes: u64,
    dir: &Path,
    port: u16,
    quorum_reads: bool,
    fault_hooks: Option<&str>,
    set: &[String],
) -> Result<i32, Failure> {
    if !(1..=NODES_MAX).contains(&nodes) {
        return Err(Failure::new(format!("--nodes must be in 1..={NODES_MAX}")));
    }
    // client port P, Raft P+1, admin P+2
    check_port(port, 2)?;
    if dir.join("pids").exists() {
        return Err(Failure::new(format!(
            "{}: a cluster is already up here (drift cluster down first)",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| Failure::new(e.to_string()))?;
    let config_path = dir.join("cluster.toml");
    if let Some(line) = set.iter().find(|l| !l.contains('=')) {
        return Err(Failure::new(format!("--set {line:?}: expected `key = value`")));
    }
    let text = local_config(nodes, &dir.join("data"), port, quorum_reads, set);
    std::fs::write(&config_path, text).map_err(|e| Failure::new(format!("{}: {e}", config_path.display())))?;
    let config = ClusterConfig::load(&config_path).map_err(Failure::new)?;
    let exe = std::env::current_exe().map_err(|e| Failure::new(e.to_string()))?;
    // each pid is recorded as soon as its node runs, so `down` can end
    // whatever started even if a later node fails to
    let pids_path = dir.join("pids");
    let mut pids =
        std::fs::File::create(&pids_path).map_err(|e| Failure::new(format!("{}: {e}", pids_path.display())))?;
    for i in 1..=nodes {
        let log = std::fs::File::create(dir.join(format!("node-{i}.log"))).map_err(|e| Failure::new(e.to_string()))?;
        let mut cmd = Command::new(&exe);
        cmd.args(["node", "--config"])
            .arg(&config_path)
            .args(["--id", &i.to_string(), "--bootstrap"]);
        if let Some(token) = fault_hooks {
            cmd.args([
                "--fault-hooks",
                token,
                "--admin",
                &format!("{}:{}", node_ip(i), port + 2),
            ]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| Failure::new(e.to_string()))?)
            .stderr(log)
            .spawn()
            .map_err(|e| Failure::new(format!("starting node {i}: {e}")))?;
        writeln!(pids, "{i} {}", child.id()).map_err(|e| Failure::new(format!("{}: {e}", pids_path.display())))?;
    }
    let deadline = Instant::now() + UP_TIMEOUT;
    loop {
        let leaders = config
            .peers
            .iter()
            .filter(|p| four_letter(p.client, "srvr").is_some_and(|s| s.contains("Mode: leader")))
            .count();
        if leaders == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err(Failure::new(format!(
                "no leader within {}s; see {}/node-*.log (drift cluster down --dir {} to stop)",
                UP_TIMEOUT.as_secs(),
                dir.display(),
                dir.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out!("{}", config.connect_string());
    Ok(0)
}

/// Sends a four-letter word; the answer, or None if the node is down.
pub fn four_letter(addr: SocketAddr, word: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn read_pids(dir: &Path) -> Result<Vec<(u64, u32)>, Failure> {
    let path: PathBuf = dir.join("pids");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Failure::new(format!("{}: {e} (is a cluster up here?)", path.display())))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(n, l)| {
            let mut w = l.split_whitespace();
            match (
                w.next().and_then(|x| x.parse().ok()),
                w.next().and_then(|x| x.parse().ok()),
            ) {
                (Some(id), Some(pid)) => Ok((id, pid)),
                _ => Err(Failure::new(format!(
                    "{}:{}: expected `<id> <pid>`",
                    path.display(),
                    n + 1
                ))),
            }
        })
        .collect()
}

/// Whether `pid` is still one of our nodes (not a recycled PID).
fn is_our_node(pid: u32, config: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let c = String::from_utf8_lossy(&c);
            c.contains("node") && c.contains(&*config.display().to_string())
        })
        .unwrap_or(false)
}

fn status(dir: &Path) -> Result<i32, Failure> {
    let config = ClusterConfig::load(&dir.join("cluster.toml")).map_err(Failure::new)?;
    let pids = read_pids(dir)?;
    let config_path = std::fs::canonicalize(dir.join("cluster.toml")).map_err(|e| Failure::new(e.to_string()))?;
    out!(
        "{:<5} {:<8} {:<9} {:<10} {:<12} digest",
        "node",
        "pid",
        "alive",
        "role",
        "applied"
    );
    for p in &config.peers {
        let pid = pids.iter().find(|(id, _)| *id == p.id).map(|(_, pid)| *pid);
        let alive = pid.is_some_and(|pid| is_our_node(pid, &config_path));
        let srvr = four_letter(p.client, "srvr").unwrap_or_default();
        let dgst = four_letter(p.client, "dgst").unwrap_or_default();
        let field = |text: &str, key: &str| crate::backend::field_of(text, key).unwrap_or_else(|| "-".into());
        out!(
            "{:<5} {:<8} {:<9} {:<10} {:<12} {}",
            p.id,
            pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            alive,
            field(&srvr, "Mode:"),
            field(&dgst, "applied_index"),
            field(&dgst, "digest\t")
        );
    }
    out!("connect: {}", config.connect_string());
    Ok(0)
}

fn down(dir: &Path) -> Result<i32, Failure> {
    let pids = read_pids(dir)?;
    let config_path = std::fs::canonicalize(dir.join("cluster.toml")).map_err(|e| Failure::new(e.to_string()))?;
    let ours: Vec<u32> = pids
        .iter()
        .map(|(_, p)| *p)
        .filter(|p| is_our_node(*p, &config_path))
        .collect();
    signal(&ours, "TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && ours.iter().any(|p| is_our_node(*p, &config_path)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<u32> = ours.iter().copied().filter(|p| is_our_node(*p, &config_path)).collect();
    signal(&left, "KILL");
    std::fs::remove_file(dir.join("pids")).map_err(|e| Failure::new(e.to_string()))?;
    out!("stopped {} node(s)", ours.len());
    Ok(0)
}

fn signal(pids: &[u32], sig: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(|p| p.to_string()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
