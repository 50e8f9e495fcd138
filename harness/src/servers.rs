//! What every backend (local processes, Docker containers, SSH hosts) and
//! the commands that start servers share about running them: the node's
//! config for a cluster, the files written with private modes, the
//! four-letter calls, the HTTP helpers, the fault token, file damage, and
//! Apache ZooKeeper's and the parent-watch launch helpers. The commands
//! (`cluster.rs`, `local.rs`, …) use it; it uses none of them. (A node's
//! fault hooks are called through `backend::FaultHooks`.)

use crate::backend::{BackendError, Damage};
use crate::claim::Block;
use crate::fail::Failure;
use drift_node::config::ClusterConfig;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The environment variable a node reads its fault hooks' token from
/// when no `--fault-token-file` is given.
pub const FAULT_TOKEN_ENV: &str = "DRIFT_FAULT_TOKEN";

/// The kv service of a local cluster: its port on every node's address
/// and its `[kv]` settings (`key = value` lines).
pub struct LocalKv {
    pub port: u16,
    pub settings: Vec<String>,
}

impl LocalKv {
    /// Checks the settings are `key = value` lines.
    pub fn new(port: u16, settings: &[String]) -> Result<LocalKv, Failure> {
        if let Some(s) = settings.iter().find(|s| !s.contains('=')) {
            return Err(Failure::new(format!("--kv-setting {s:?}: expected `key = value`")));
        }
        Ok(LocalKv {
            port,
            settings: settings.to_vec(),
        })
    }
}

/// The cluster file of a local cluster, with the peers' `secret`.
/// A table for the nodes of a local cluster: its HTTP and interserver
/// ports on every node's address, and its `[[table]]` declaration.
pub struct LocalTable {
    /// Nodes 1..=replicas hold a replica; the others are keepers only.
    pub replicas: u64,
    pub http_port: u16,
    pub interserver_port: u16,
    pub declaration: String,
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

/// The settings a campaign's servers run with, before `extra`: the digest
/// mode, and snapshots and compaction often, so that faults meet them.
pub fn campaign_settings(digest: drift_keeper::DigestMode, extra: Vec<String>) -> Vec<String> {
    let mut set = vec![
        format!("digest = {:?}", digest.name()),
        "snapshot_distance = 2000".to_string(),
        "reserved_log_items = 500".to_string(),
        "rotate_interval = 1000".to_string(),
        "session_timeout_min_ms = 1000".to_string(),
    ];
    set.extend(extra);
    set
}

/// Writes a cluster file (mode 0600: it holds the secret) and reads it back
/// as the nodes will.
pub fn write_cluster_file(path: &Path, text: &str) -> Result<ClusterConfig, String> {
    write_private(path, text)?;
    ClusterConfig::load(path).map_err(|e| e.to_string())
}

/// Sends signal `sig` (`STOP`, `CONT`, `TERM`, …) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

#[allow(clippy::too_many_arguments)]
pub fn local_config(
    nodes: u64,
    ip: &dyn Fn(u64) -> std::net::IpAddr,
    data_dir: &Path,
    port: u16,
    quorum_reads: bool,
    secret: &str,
    set: &[String],
    table: Option<&LocalTable>,
    kv: Option<&LocalKv>,
) -> String {
    let mut t = String::new();
    let defaults = [
        ("data_dir", format!("{:?}", data_dir.display().to_string())),
        ("secret", format!("{secret:?}")),
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
            ip = ip(i),
            raft = port + 1
        ));
        if let Some(tb) = table.filter(|tb| i <= tb.replicas) {
            t.push_str(&format!(
                "http = \"{ip}:{}\"\ninterserver = \"{ip}:{}\"\n",
                tb.http_port,
                tb.interserver_port,
                ip = ip(i)
            ));
        }
        if let Some(kv) = kv {
            t.push_str(&format!("kv = \"{}:{}\"\n", ip(i), kv.port));
        }
    }
    if let Some(kv) = kv {
        t.push_str("\n[kv]\n");
        for line in &kv.settings {
            t.push_str(line);
            t.push('\n');
        }
    }
    if let Some(tb) = table {
        t.push_str("\n[[table]]\n");
        t.push_str(&tb.declaration);
    }
    t
}

/// Writes `text` to `path` readable by this user alone (a secret or a
/// token lives there).
pub fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A plain HTTP/1.0 GET: (status, body), or `None` if it could not be had.
pub fn http_get(addr: SocketAddr, target: &str) -> Option<(u16, String)> {
    http_request(addr, "GET", target, b"", Duration::from_secs(5))
}

/// One HTTP/1.0 request with `body`; the status and the body answered,
/// or `None` when the server cannot be reached or answers nothing within
/// `timeout`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
    timeout: Duration,
) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    let head = format!(
        "{method} {target} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// zoo.cfg and myid for each node: quorum on 127.0.0.(10+i) ports
/// P+1/P+3, clients on P; ticks of 200 ms so elections and session
/// expiry run at the pace of the drift keeper's.
pub(crate) fn write_zookeeper_configs(config: &ClusterConfig, block: Block, n: u64, port: u16) -> Result<(), String> {
    for i in 1..=n {
        let dir = config.node_dir(i);
        std::fs::create_dir_all(dir.join("data")).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::write(dir.join("data").join("myid"), format!("{i}\n")).map_err(|e| e.to_string())?;
        let mut cfg = format!(
            "tickTime=200\ninitLimit=25\nsyncLimit=10\ndataDir={}\nclientPort={port}\nclientPortAddress={}\nmaxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=*\nminSessionTimeout=1000\nmaxSessionTimeout=30000\n",
            dir.join("data").display(),
            block.ip(i)
        );
        for j in 1..=n {
            cfg.push_str(&format!("server.{j}={}:{}:{}\n", block.ip(j), port + 1, port + 3));
        }
        std::fs::write(dir.join("zoo.cfg"), cfg).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(())
}

/// The command that runs one Apache ZooKeeper server from `dir/zoo.cfg`:
/// by default a small heap and the serial collector (tests and campaigns
/// run several JVMs on two cores); with `heap_mb`, that fixed heap and the
/// JVM's default collector, as a performance comparison runs it.
pub(crate) fn zookeeper_command(dir: &Path, heap_mb: Option<u32>) -> Command {
    let mut c = Command::new("java");
    match heap_mb {
        Some(mb) => c.args([format!("-Xms{mb}m"), format!("-Xmx{mb}m")]),
        None => c.args(["-Xms128m", "-Xmx256m", "-XX:+UseSerialGC"]),
    };
    c.args(["-cp", ZOOKEEPER_CLASSPATH])
        .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
        .arg("-Dzookeeper.root.logger=INFO,CONSOLE")
        .arg("-Dlog4j.configuration=file:/etc/zookeeper/conf/log4j.properties")
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(dir.join("zoo.cfg"));
    c
}

/// Whether Apache ZooKeeper is installed where the zookeeper target looks.
pub fn zookeeper_installed() -> bool {
    Path::new("/usr/share/java/zookeeper.jar").exists()
}

/// A watcher that SIGKILLs `pid` once this drift is gone (or quits once
/// `pid` is): for servers that do not end with their parent by themselves
/// (a JVM, a ClickHouse server). Reap it after `pid` ended.
pub(crate) fn watch_parent(pid: u32) -> Option<Child> {
    let watch = format!(
        "while kill -0 {drift} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         kill -0 {drift} 2>/dev/null || kill -9 {pid} 2>/dev/null; true",
        drift = std::process::id(),
    );
    use std::os::unix::process::CommandExt as _;
    Command::new("sh")
        .args(["-c", &watch])
        // apart from drift's process group, as the server it watches is
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Ends `child` (SIGKILL) if it runs, then reaps its watcher, which
/// notices within its half-second poll that the process is gone and
/// quits: nothing of the pair outlives this call.
pub(crate) fn end_watched(child: &mut Option<Child>, watcher: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    if let Some(mut w) = watcher.take() {
        let _ = w.wait();
    }
}

/// Damages the newest changelog segment or snapshot under `dir` (a
/// stopped server's data directory, or a ZooKeeper one's): truncates it,
/// or flips one byte, the file and the byte chosen by `pick`. Returns
/// what was done.
pub fn damage_files(dir: &Path, how: Damage, pick: u64) -> Result<String, BackendError> {
    let where_ = if dir.join("data/version-2").is_dir() {
        dir.join("data/version-2")
    } else {
        dir.to_path_buf()
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&where_)
        .map_err(|e| BackendError::io(&where_, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(damageable))
        .collect();
    files.sort();
    let Some(target) = files.get((pick as usize) % files.len().max(1)).cloned() else {
        return Ok("nothing to corrupt".into());
    };
    let mut bytes = std::fs::read(&target).map_err(|e| BackendError::io(&target, e))?;
    let Some(what) = damage(&mut bytes, how, pick / files.len() as u64) else {
        return Ok(format!("{} is empty", target.display()));
    };
    std::fs::write(&target, bytes).map_err(|e| BackendError::io(&target, e))?;
    Ok(format!("{what} of {}", target.display()))
}

/// Whether `name` is a file `corrupt` may damage: a changelog segment or
/// snapshot (the keeper's, or ZooKeeper's).
pub fn damageable(name: &str) -> bool {
    ["changelog_", "snapshot_", "log.", "snapshot."]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Damages a file's bytes in place: cuts off the last quarter of what is
/// written, or flips the byte `pick` chooses; what it did (`None` for an
/// empty file).
pub fn damage(bytes: &mut Vec<u8>, how: Damage, pick: u64) -> Option<String> {
    if bytes.is_empty() {
        return None;
    }
    // ZooKeeper preallocates its logs with zeros: damage the written part
    let used = bytes.iter().rposition(|&b| b != 0).map_or(bytes.len(), |p| p + 1);
    Some(match how {
        Damage::Truncate => {
            let keep = used * 3 / 4;
            bytes.truncate(keep);
            format!("truncated to {keep} bytes")
        }
        Damage::Flip => {
            let at = pick as usize % used;
            bytes[at] ^= 0x5a;
            format!("flipped byte {at}")
        }
    })
}

/// Debian's Apache ZooKeeper 3.8 (`apt install zookeeper`).
const ZOOKEEPER_CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";

/// The table of `declaration` with `settings` (`key = value` lines).
pub fn local_table(
    declaration: &str,
    replicas: u64,
    http_port: u16,
    interserver_port: u16,
    settings: &[String],
) -> Result<LocalTable, Failure> {
    let mut declaration = declaration.to_string();
    if !settings.is_empty() {
        declaration.push_str("[table.settings]\n");
        for s in settings {
            if !s.contains('=') {
                return Err(Failure::new(format!("--table-setting {s:?}: expected `key = value`")));
            }
            declaration.push_str(s);
            declaration.push('\n');
        }
    }
    Ok(LocalTable {
        replicas,
        http_port,
        interserver_port,
        declaration,
    })
}

/// Whether every table replica at `https` is registered and out of
/// read-only mode (`/replicas_status` answers 200).
pub fn tables_writable(https: &[SocketAddr]) -> bool {
    https
        .iter()
        .all(|a| http_get(*a, "/replicas_status").is_some_and(|(code, _)| code == 200))
}
