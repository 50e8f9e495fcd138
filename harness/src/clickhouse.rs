//! The clickhouse target: real ClickHouse servers, one per node, whose
//! ReplicatedMergeTree tables are coordinated by drift's keeper nodes or by
//! an Apache ZooKeeper ensemble — ClickHouse as its users run it, the
//! coordinator the only part drift wrote.
//!
//! Node i is two processes on 127.0.B.(10+i): its coordinator (client
//! port P, peers P+1 and P+3, as [`LocalCluster`] runs them) and a
//! ClickHouse server (HTTP P+4, interserver P+5; `clickhouse-server` from
//! the PATH or `--clickhouse-bin`), with its own config, data and logs
//! under the run directory (`nodes/ch<i>/`), replica name `r<i>`. The
//! workload reaches each server through a proxy of drift's own on P+8
//! ([`crate::replyproxy`]: the `drop-reply` fault).
//!
//! What differs between ClickHouse versions is read off the servers at
//! setup, never assumed ([`Facts`]): the version, the insert settings the
//! workload may use ([`Dialect`]) and the `<merge_tree>` settings the
//! servers really run with (the dedup window the checker judges by).
//!
//! Faults, per node part ([`Part`]): SIGKILL / SIGSTOP of the server, the
//! coordinator or both; partitions between replicas, between
//! coordinators, or between replicas and coordinators (nftables rules on
//! each process's cgroup, [`crate::cgroup`]); a rolling restart of the
//! coordinators; a replica's data dropped and restored from its peers as
//! ClickHouse's documentation says (the table's metadata put back and
//! `flags/force_restore_data` set: the server fetches every part it lacks).
//!
//! A ClickHouse server that exits on its own once the campaign runs (it
//! does when it starts while its coordinator is unreachable) is started
//! again after [`RESTART_BACKOFF`], as a service manager would; the exit
//! is still recorded. Every process is drift's own child, ended by PID.

use crate::backend::{
    Backend, BackendError, Corrupt, Damage, Db, Exit, FaultHooks, Faults, Kill, LinkCut, LogFiles, Part, Pause, Probe,
    TableHttp,
};
use crate::cgroup::{Endpoint, NftCut, RunCgroups};
use crate::claim::Block;
use crate::local::LocalCluster;
use crate::plan::Coordinator;
use crate::replyproxy::ReplyProxies;
use drift_workloads::table::Dialect;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server that exited on its own is started again after this long.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// How long a server gets to answer `/ping` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// A setup query's answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of a server's error log quoted when it fails to start.
const LOG_LINES_QUOTED: usize = 3;
/// The settings asked of every server at setup (what the workload can use).
const INSERT_SETTINGS: [&str; 4] = [
    "insert_deduplication_token",
    "insert_quorum_parallel",
    "min_insert_block_size_rows",
    "min_insert_block_size_bytes",
];
/// The `<merge_tree>` settings read back from every server.
pub const MERGE_TREE_SETTINGS: [&str; 4] = [
    "replicated_deduplication_window",
    "replicated_deduplication_window_seconds",
    "cleanup_delay_period",
    "cleanup_delay_period_random_add",
];
/// The log line of a block a server found already inserted.
const DEDUP_LINE: &str = "already exists; ignoring it";

/// Where a ClickHouse server is: `given`, or `clickhouse-server` on the
/// PATH (`/usr/sbin` too, where Debian puts it). The error says how to
/// get one.
pub fn find_bin(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--clickhouse-bin {}: no such file", p.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("clickhouse-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "--target clickhouse needs a ClickHouse server: apt install clickhouse-server, or --clickhouse-bin PATH"
                .into()
        })
}

/// What a server turned out to be (read at setup).
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub version: String,
    pub dialect: Dialect,
    /// The `<merge_tree>` settings it runs with, of [`MERGE_TREE_SETTINGS`].
    pub merge_tree: BTreeMap<String, String>,
}

impl Facts {
    /// A `<merge_tree>` setting as a number.
    pub fn setting(&self, name: &str) -> Option<u64> {
        self.merge_tree.get(name).and_then(|v| v.parse().ok())
    }

    /// `run.json`'s `target`: what ran, and what the workload left out.
    pub fn json(&self, coordinator: Coordinator) -> Value {
        json!({
            "system": "clickhouse",
            "version": self.version,
            "coordinator": coordinator.name(),
            "merge_tree": self.merge_tree,
            "settings": {
                "insert_deduplication_token": self.dialect.token,
                "insert_quorum_parallel": self.dialect.quorum_parallel,
                "min_insert_block_size_rows": self.dialect.squash_off,
            },
            "mixes_left_out": self.dialect.left_out().iter()
                .map(|(m, why)| json!({"mix": m, "why": why})).collect::<Vec<_>>(),
        })
    }
}

/// What [`ClickHouseCluster::new`] builds, beside the coordinator.
pub struct ChSpec<'a> {
    pub bin: &'a Path,
    pub block: Block,
    pub http_port: u16,
    pub interserver_port: u16,
    /// The native protocol port (clickhouse-client's).
    pub tcp_port: u16,
    /// Where each server's reply proxy listens, if the workload needs it.
    pub proxy_port: Option<u16>,
    pub session_timeout_ms: u64,
    /// `<merge_tree>` settings, `name = value`.
    pub merge_tree: &'a [(String, String)],
    /// Processes in cgroups, so partitions can cut their links.
    pub partitions: bool,
}

struct Server {
    id: u64,
    http: SocketAddr,
    interserver: SocketAddr,
    dir: PathBuf,
    child: Option<Child>,
    watcher: Option<Child>,
    paused: bool,
    /// Set once it exited on its own: when it is started again.
    restart_at: Option<Instant>,
    /// Its data was dropped: the next start puts the tables' metadata back.
    restore: bool,
    cgroup: Option<PathBuf>,
}

impl Server {
    fn log(&self) -> PathBuf {
        self.dir.join("clickhouse-server.log")
    }

    fn err_log(&self) -> PathBuf {
        self.dir.join("clickhouse-server.err.log")
    }

    fn stderr(&self) -> PathBuf {
        self.dir.join("stderr.log")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The tables' metadata kept aside at creation (for a wiped replica).
    fn saved_metadata(&self) -> PathBuf {
        self.dir.join("metadata-saved")
    }
}

pub struct ClickHouseCluster {
    coord: LocalCluster,
    coordinator: Coordinator,
    servers: Vec<Server>,
    bin: PathBuf,
    block: Block,
    /// The coordinators' client port.
    port: u16,
    proxies: Option<ReplyProxies>,
    // dropped in this order: the rules, then the cgroups
    cut: Option<NftCut>,
    groups: Option<RunCgroups>,
    /// Restart servers that exit on their own (once the campaign runs).
    supervise: bool,
}

/// What a server's `config.xml` says (ClickHouse's own format; 18.16 and
/// later read it).
pub struct ServerConfig<'a> {
    pub id: u64,
    pub dir: &'a Path,
    pub http: SocketAddr,
    pub interserver: SocketAddr,
    pub tcp_port: u16,
    pub coordinators: &'a [SocketAddr],
    pub session_timeout_ms: u64,
    /// `<merge_tree>` settings, `name = value`.
    pub merge_tree: &'a [(String, String)],
}

fn config_xml(c: &ServerConfig<'_>) -> String {
    let d = c.dir.display();
    let mut x = String::from("<?xml version=\"1.0\"?>\n<yandex>\n");
    x.push_str(&format!(
        "  <logger>\n    <level>debug</level>\n    <log>{d}/clickhouse-server.log</log>\n    <errorlog>{d}/clickhouse-server.err.log</errorlog>\n    <size>100M</size>\n    <count>2</count>\n    <console>0</console>\n  </logger>\n"
    ));
    x.push_str(&format!("  <listen_host>{}</listen_host>\n", c.http.ip()));
    x.push_str(&format!("  <http_port>{}</http_port>\n", c.http.port()));
    x.push_str(&format!("  <tcp_port>{}</tcp_port>\n", c.tcp_port));
    x.push_str(&format!(
        "  <interserver_http_port>{}</interserver_http_port>\n  <interserver_http_host>{}</interserver_http_host>\n",
        c.interserver.port(),
        c.interserver.ip()
    ));
    x.push_str(&format!(
        "  <path>{d}/data/</path>\n  <tmp_path>{d}/data/tmp/</tmp_path>\n  <user_files_path>{d}/data/user_files/</user_files_path>\n  <format_schema_path>{d}/data/format_schemas/</format_schema_path>\n  <users_config>{d}/users.xml</users_config>\n"
    ));
    x.push_str("  <default_profile>default</default_profile>\n  <default_database>default</default_database>\n");
    x.push_str("  <mark_cache_size>67108864</mark_cache_size>\n  <uncompressed_cache_size>67108864</uncompressed_cache_size>\n");
    x.push_str("  <max_concurrent_queries>200</max_concurrent_queries>\n");
    x.push_str("  <zookeeper>\n");
    for (k, a) in c.coordinators.iter().enumerate() {
        x.push_str(&format!(
            "    <node index=\"{}\"><host>{}</host><port>{}</port></node>\n",
            k + 1,
            a.ip(),
            a.port()
        ));
    }
    x.push_str(&format!(
        "    <session_timeout_ms>{}</session_timeout_ms>\n    <operation_timeout_ms>{}</operation_timeout_ms>\n  </zookeeper>\n",
        c.session_timeout_ms,
        c.session_timeout_ms.min(10_000)
    ));
    x.push_str(&format!(
        "  <macros>\n    <shard>01</shard>\n    <replica>r{}</replica>\n  </macros>\n",
        c.id
    ));
    x.push_str("  <merge_tree>\n");
    for (k, v) in c.merge_tree {
        x.push_str(&format!("    <{k}>{v}</{k}>\n"));
    }
    x.push_str("  </merge_tree>\n</yandex>\n");
    x
}

/// Writes a server's `config.xml` and `users.xml` into its directory.
pub fn write_server_files(c: &ServerConfig<'_>) -> Result<(), String> {
    std::fs::create_dir_all(c.dir).map_err(|e| format!("{}: {e}", c.dir.display()))?;
    for (name, text) in [("config.xml", config_xml(c)), ("users.xml", USERS_XML.to_string())] {
        let p = c.dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

/// The HTTP address a written `config.xml` names.
pub fn http_of_config(xml: &str) -> Option<SocketAddr> {
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let at = xml.find(&open)? + open.len();
        Some(xml[at..at + xml[at..].find('<')?].trim().to_string())
    };
    format!("{}:{}", tag("listen_host")?, tag("http_port")?).parse().ok()
}

/// The command that runs the server whose files are in `dir`.
pub fn server_command(bin: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(bin);
    // the multi-call binary names its role; clickhouse-server is one
    if bin.file_name().is_some_and(|f| f == "clickhouse") {
        cmd.arg("server");
    }
    cmd.arg(format!("--config-file={}", dir.join("config.xml").display()))
        .current_dir(dir);
    cmd
}

/// Every server's `users.xml`: the default user, no password, from
/// loopback only.
const USERS_XML: &str = "<?xml version=\"1.0\"?>\n<yandex>\n  <profiles>\n    <default>\n      <max_memory_usage>4000000000</max_memory_usage>\n    </default>\n  </profiles>\n  <users>\n    <default>\n      <password></password>\n      <networks><ip>127.0.0.0/8</ip></networks>\n      <profile>default</profile>\n      <quota>default</quota>\n    </default>\n  </users>\n  <quotas>\n    <default></default>\n  </quotas>\n</yandex>\n";

/// One query over HTTP: the answer's body, or the server's error.
pub fn query(addr: SocketAddr, sql: &str) -> Result<String, QueryError> {
    match crate::servers::http_request(addr, "POST", "/", sql.as_bytes(), QUERY_TIMEOUT) {
        Some((200, body)) => Ok(body),
        Some((status, body)) => Err(QueryError {
            addr,
            refused: Some((status, body.trim().to_string())),
        }),
        None => Err(QueryError { addr, refused: None }),
    }
}

/// A query without a result: the server's error status and body, or no
/// answer at all.
#[derive(Debug)]
pub struct QueryError {
    pub addr: SocketAddr,
    pub refused: Option<(u16, String)>,
}

impl QueryError {
    /// ClickHouse's error code, when it answered with one.
    pub fn code(&self) -> Option<u64> {
        self.refused
            .as_ref()
            .and_then(|(_, body)| drift_workloads::table::error_code(body))
    }

    /// The error's text ("" when there was no answer).
    pub fn body(&self) -> &str {
        self.refused.as_ref().map_or("", |(_, body)| body)
    }

    /// Whether ClickHouse lost its session with the coordinator
    /// (connection loss, an operation timed out, the session expired),
    /// not the statement refused: code 999 (`KEEPER_EXCEPTION`) with one
    /// of those.
    pub fn coordination_lost(&self) -> bool {
        self.code() == Some(999)
            && ["Connection loss", "Operation timeout", "Session expired"]
                .iter()
                .any(|w| self.body().contains(w))
    }
}

/// Runs `ddl`, a `CREATE TABLE IF NOT EXISTS`, on the server at `addr`.
/// A coordinator may drop its clients while this runs (a server that lost
/// its leader does, as ZooKeeper's do): ClickHouse then fails the
/// statement with a coordination error, and the statement, which makes
/// the table or finds it made, is asked again until `deadline`.
pub fn create_table_on(addr: SocketAddr, ddl: &str, deadline: Instant) -> Result<(), QueryError> {
    loop {
        match query(addr, ddl) {
            Ok(_) => return Ok(()),
            Err(e) if e.coordination_lost() && Instant::now() < deadline => {
                noteln!("{e}; asking again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.refused {
            Some((status, body)) => write!(f, "{}: HTTP {status}: {body}", self.addr),
            None => write!(f, "{}: no answer", self.addr),
        }
    }
}

impl From<QueryError> for String {
    fn from(e: QueryError) -> String {
        e.to_string()
    }
}

/// What the server at `addr` is (module header).
pub fn detect(addr: SocketAddr) -> Result<Facts, String> {
    let version = query(addr, "SELECT version()")?.trim().to_string();
    let names = |list: &[&str]| list.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
    let have: Vec<String> = query(
        addr,
        &format!(
            "SELECT name FROM system.settings WHERE name IN ({}) FORMAT TabSeparated",
            names(&INSERT_SETTINGS)
        ),
    )?
    .lines()
    .map(str::to_string)
    .collect();
    let has = |n: &str| have.iter().any(|h| h == n);
    let merge_tree = query(
        addr,
        &format!(
            "SELECT name, value FROM system.merge_tree_settings WHERE name IN ({}) FORMAT TabSeparated",
            names(&MERGE_TREE_SETTINGS)
        ),
    )?
    .lines()
    .filter_map(|l| l.split_once('\t'))
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Ok(Facts {
        version,
        dialect: Dialect {
            token: has("insert_deduplication_token"),
            quorum_parallel: has("insert_quorum_parallel"),
            squash_off: has("min_insert_block_size_rows") && has("min_insert_block_size_bytes"),
        },
        merge_tree,
    })
}

/// The last lines of a log, for an error.
fn last_lines(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LOG_LINES_QUOTED)..].join(" | ")
}

impl ClickHouseCluster {
    /// The servers' directories and configs written, the reply proxies
    /// listening, the cgroups made (with partitions); nothing started.
    pub fn new(
        run_dir: &Path,
        coord: LocalCluster,
        coordinator: Coordinator,
        port: u16,
        spec: &ChSpec<'_>,
    ) -> Result<ClickHouseCluster, String> {
        let ids = coord.ids();
        let coordinators: Vec<SocketAddr> = ids.iter().map(|&i| coord.client_addr(i)).collect();
        let mut servers = Vec::new();
        for &i in &ids {
            let ip = spec.block.ip(i);
            let s = Server {
                id: i,
                http: SocketAddr::new(ip, spec.http_port),
                interserver: SocketAddr::new(ip, spec.interserver_port),
                dir: run_dir.join("nodes").join(format!("ch{i}")),
                child: None,
                watcher: None,
                paused: false,
                restart_at: None,
                restore: false,
                cgroup: None,
            };
            write_server_files(&ServerConfig {
                id: i,
                dir: &s.dir,
                http: s.http,
                interserver: s.interserver,
                tcp_port: spec.tcp_port,
                coordinators: &coordinators,
                session_timeout_ms: spec.session_timeout_ms,
                merge_tree: spec.merge_tree,
            })?;
            servers.push(s);
        }
        let proxies = match spec.proxy_port {
            Some(p) => Some(ReplyProxies::start(
                &servers
                    .iter()
                    .map(|s| (SocketAddr::new(s.http.ip(), p), s.http))
                    .collect::<Vec<_>>(),
            )?),
            None => None,
        };
        let mut c = ClickHouseCluster {
            coord,
            coordinator,
            servers,
            bin: spec.bin.to_path_buf(),
            block: spec.block,
            port,
            proxies,
            cut: None,
            groups: None,
            supervise: false,
        };
        if spec.partitions {
            let groups = RunCgroups::create()?;
            for &i in &ids {
                c.coord.place_in_cgroup(i, groups.procs(&format!("k{i}"))?);
                c.servers[(i - 1) as usize].cgroup = Some(groups.procs(&format!("c{i}"))?);
            }
            c.cut = Some(NftCut::create()?);
            c.groups = Some(groups);
        }
        Ok(c)
    }

    fn server(&mut self, i: u64) -> &mut Server {
        &mut self.servers[(i - 1) as usize]
    }

    /// Server `i`'s own HTTP address (not its proxy's).
    pub fn http(&self, i: u64) -> SocketAddr {
        self.servers[(i - 1) as usize].http
    }

    /// Starts every coordinator (the servers come after a leader:
    /// [`ClickHouseCluster::start_servers`]).
    pub fn start_coordinators(&mut self) -> Result<(), BackendError> {
        self.coord.start_all()
    }

    /// Starts every ClickHouse server and waits until each answers; one
    /// that exits first fails with its log's last lines.
    pub fn start_servers(&mut self) -> Result<(), String> {
        for i in self.ids() {
            self.start_server(i).map_err(|e| e.to_string())?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for i in self.ids() {
            loop {
                if crate::servers::http_get(self.http(i), "/ping").is_some_and(|(c, _)| c == 200) {
                    break;
                }
                let s = self.server(i);
                if let Some(Ok(Some(status))) = s.child.as_mut().map(|c| c.try_wait()) {
                    s.child = None;
                    let log = if last_lines(&s.err_log()).is_empty() {
                        last_lines(&s.stderr())
                    } else {
                        last_lines(&s.err_log())
                    };
                    return Err(format!(
                        "ClickHouse server {i} exited while starting ({status}): {}",
                        if log.is_empty() {
                            "its logs are empty".into()
                        } else {
                            log
                        }
                    ));
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "ClickHouse server {i} did not answer on {} within {}s (logs in {})",
                        self.http(i),
                        START_TIMEOUT.as_secs(),
                        self.servers[(i - 1) as usize].dir.display()
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Runs `ddl` (a CREATE TABLE) on every server, then keeps each
    /// server's table metadata aside (to restore a wiped replica).
    pub fn create_table(&mut self, ddl: &str) -> Result<(), String> {
        for i in self.ids() {
            create_table_on(self.http(i), ddl, Instant::now() + START_TIMEOUT)
                .map_err(|e| format!("creating the table on server {i}: {e}"))?;
            let s = &self.servers[(i - 1) as usize];
            let meta = s.data().join("metadata/default");
            let saved = s.saved_metadata();
            std::fs::create_dir_all(&saved).map_err(|e| format!("{}: {e}", saved.display()))?;
            for e in std::fs::read_dir(&meta)
                .map_err(|e| format!("{}: {e}", meta.display()))?
                .flatten()
            {
                if e.path().extension().is_some_and(|x| x == "sql") {
                    std::fs::copy(e.path(), saved.join(e.file_name()))
                        .map_err(|err| format!("{}: {err}", e.path().display()))?;
                }
            }
        }
        Ok(())
    }

    /// What every server is; an error when they differ (a campaign judges
    /// by one window).
    pub fn facts(&self) -> Result<Facts, String> {
        let mut first: Option<Facts> = None;
        for s in &self.servers {
            let f = detect(s.http).map_err(|e| format!("asking ClickHouse server {} what it is: {e}", s.id))?;
            match &first {
                None => first = Some(f),
                Some(x) if *x != f => {
                    return Err(format!("ClickHouse servers 1 and {} differ: {x:?} against {f:?}", s.id))
                }
                Some(_) => {}
            }
        }
        first.ok_or_else(|| "no ClickHouse server".into())
    }

    /// From now on a server that exits on its own is started again.
    pub fn supervise(&mut self) {
        self.supervise = true;
    }

    /// Blocks each server deduplicated, as its log says (a count that
    /// survives its restarts, unlike `system.events`).
    pub fn dedup_counts(&self) -> Vec<(String, u64)> {
        self.servers
            .iter()
            .map(|s| {
                let n = std::fs::read_to_string(s.log())
                    .map(|t| t.lines().filter(|l| l.contains(DEDUP_LINE)).count() as u64)
                    .unwrap_or(0);
                (format!("r{}", s.id), n)
            })
            .collect()
    }

    fn start_server(&mut self, i: u64) -> Result<(), BackendError> {
        let bin = self.bin.clone();
        let s = self.server(i);
        if s.child.is_some() {
            return Ok(());
        }
        s.restart_at = None;
        if s.restore {
            restore_metadata(s).map_err(|e| BackendError::io(s.data(), e))?;
            s.restore = false;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(s.stderr())
            .map_err(|e| BackendError::io(s.stderr(), e))?;
        let cmd = server_command(&bin, &s.dir);
        let mut cmd = match &s.cgroup {
            Some(p) => crate::cgroup::in_cgroup(&cmd, p),
            None => cmd,
        };
        use std::os::unix::process::CommandExt as _;
        let child = cmd
            // its own process group: a terminal's Ctrl-C reaches drift,
            // which stops it itself (`crate::interrupt`)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| BackendError::io(s.stderr(), e))?)
            .stderr(log)
            .spawn()
            .map_err(|source| BackendError::Spawn { node: i, source })?;
        if let Some(mut old) = s.watcher.take() {
            let _ = old.wait();
        }
        s.watcher = crate::servers::watch_parent(child.id());
        s.child = Some(child);
        s.paused = false;
        Ok(())
    }

    fn stop_server(&mut self, i: u64, grace: Duration) {
        let s = self.server(i);
        s.restart_at = None;
        if let Some(mut c) = s.child.take() {
            if s.paused {
                crate::servers::signal(c.id(), "CONT");
            }
            crate::servers::signal(c.id(), "TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    s.paused = false;
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        s.paused = false;
    }

    fn kill_server(&mut self, i: u64) {
        let s = self.server(i);
        s.restart_at = None;
        if let Some(mut c) = s.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        s.paused = false;
    }

    /// The two ends of node `a`'s and `b`'s processes that `part` cuts.
    fn endpoints(&self, a: u64, b: u64, part: Part) -> Vec<(Endpoint, Endpoint)> {
        let peer_ports: Vec<u16> = match self.coordinator {
            Coordinator::Keeper => vec![self.port + 1],
            Coordinator::Zookeeper => vec![self.port + 1, self.port + 3],
        };
        let ip = |i: u64| self.block.ip(i);
        let replica = |i: u64, listening: bool| Endpoint {
            group: format!("c{i}"),
            ip: ip(i),
            ports: if listening {
                vec![self.servers[(i - 1) as usize].interserver.port()]
            } else {
                vec![]
            },
        };
        let coordinator = |i: u64, ports: Vec<u16>| Endpoint {
            group: format!("k{i}"),
            ip: ip(i),
            ports,
        };
        let mut out = Vec::new();
        if matches!(part, Part::Node | Part::Replica) {
            out.push((replica(a, true), replica(b, true)));
        }
        if matches!(part, Part::Node | Part::Coordinator) {
            out.push((coordinator(a, peer_ports.clone()), coordinator(b, peer_ports.clone())));
        }
        if matches!(part, Part::Node | Part::ReplicaCoordinator) {
            // replica a and coordinator b: both ways of a's session
            out.push((replica(a, false), coordinator(b, vec![self.port])));
            out.push((coordinator(b, vec![self.port]), replica(a, false)));
        }
        out
    }
}

/// Puts a wiped server's table metadata back and asks it to restore its
/// data from the other replicas (ClickHouse's documented recovery from a
/// lost replica's disk).
fn restore_metadata(s: &Server) -> std::io::Result<()> {
    let meta = s.data().join("metadata/default");
    std::fs::create_dir_all(&meta)?;
    for e in std::fs::read_dir(s.saved_metadata())?.flatten() {
        std::fs::copy(e.path(), meta.join(e.file_name()))?;
    }
    let flags = s.data().join("flags");
    std::fs::create_dir_all(&flags)?;
    std::fs::write(flags.join("force_restore_data"), b"")
}

impl Db for ClickHouseCluster {
    /// What the drop does: the servers and coordinators killed and
    /// their watchers reaped, then the rules and the cgroups (empty now).
    fn dismantle(&mut self) {
        self.end_servers();
        self.coord.dismantle();
        self.cut.take();
        self.groups.take();
    }

    fn ids(&self) -> Vec<u64> {
        self.coord.ids()
    }

    fn client_addr(&self, i: u64) -> SocketAddr {
        self.coord.client_addr(i)
    }

    fn peer_addr(&self, i: u64) -> SocketAddr {
        self.coord.peer_addr(i)
    }

    /// The coordinator first, then the server.
    fn start(&mut self, i: u64) -> Result<(), BackendError> {
        self.coord.start(i)?;
        self.start_server(i)
    }

    fn stop(&mut self, i: u64, grace: Duration) {
        self.stop_server(i, grace);
        self.coord.stop(i, grace);
    }

    fn is_up(&self, i: u64) -> bool {
        self.coord.is_up(i) && self.servers[(i - 1) as usize].child.is_some()
    }

    fn is_part_up(&self, i: u64, part: Part) -> bool {
        match part {
            Part::Coordinator => self.coord.is_up(i),
            Part::Replica => self.servers[(i - 1) as usize].child.is_some(),
            Part::Node | Part::ReplicaCoordinator => self.is_up(i),
        }
    }

    /// The coordinators' exits and the servers'; a server that exited on
    /// its own is started again after [`RESTART_BACKOFF`] once the campaign
    /// runs.
    fn exits(&mut self) -> Vec<Exit> {
        let mut out: Vec<Exit> = self
            .coord
            .exits()
            .into_iter()
            .map(|e| Exit {
                part: Part::Coordinator,
                ..e
            })
            .collect();
        let now = Instant::now();
        let supervise = self.supervise;
        for s in &mut self.servers {
            if let Some(Ok(Some(status))) = s.child.as_mut().map(|c| c.try_wait()) {
                s.child = None;
                s.paused = false;
                if supervise {
                    s.restart_at = Some(now + RESTART_BACKOFF);
                }
                out.push(Exit {
                    node: s.id,
                    code: status.code(),
                    part: Part::Replica,
                });
            }
        }
        let due: Vec<u64> = self
            .servers
            .iter()
            .filter(|s| s.child.is_none() && s.restart_at.is_some_and(|t| t <= now))
            .map(|s| s.id)
            .collect();
        for i in due {
            let _ = self.start_server(i);
        }
        out
    }

    fn wipe(&mut self, i: u64) -> Result<(), BackendError> {
        self.wipe_part(i, Part::Node)
    }

    fn start_part(&mut self, i: u64, part: Part) -> Result<(), BackendError> {
        match part {
            Part::Coordinator => self.coord.start(i),
            Part::Replica => self.start_server(i),
            Part::Node | Part::ReplicaCoordinator => self.start(i),
        }
    }

    fn stop_part(&mut self, i: u64, part: Part, grace: Duration) {
        match part {
            Part::Coordinator => self.coord.stop(i, grace),
            Part::Replica => self.stop_server(i, grace),
            Part::Node | Part::ReplicaCoordinator => self.stop(i, grace),
        }
    }

    /// A replica's data (the server must be down), a coordinator's, or
    /// both.
    fn wipe_part(&mut self, i: u64, part: Part) -> Result<(), BackendError> {
        if matches!(part, Part::Node | Part::Coordinator) {
            self.coord.wipe(i)?;
        }
        if matches!(part, Part::Node | Part::Replica) {
            let s = self.server(i);
            if s.child.is_some() {
                return Err(BackendError::Running { node: i, what: "wipe" });
            }
            match std::fs::remove_dir_all(s.data()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BackendError::io(s.data(), e)),
            }
            s.restore = true;
        }
        Ok(())
    }
}

impl Kill for ClickHouseCluster {
    fn kill(&mut self, i: u64) {
        self.kill_part(i, Part::Node)
    }

    fn kill_part(&mut self, i: u64, part: Part) {
        if matches!(part, Part::Node | Part::Replica) {
            self.kill_server(i);
        }
        if matches!(part, Part::Node | Part::Coordinator) {
            self.coord.kill(i);
        }
    }
}

impl Pause for ClickHouseCluster {
    fn pause(&mut self, i: u64) {
        self.pause_part(i, Part::Node)
    }

    fn pause_part(&mut self, i: u64, part: Part) {
        if matches!(part, Part::Node | Part::Replica) {
            let s = self.server(i);
            if let Some(c) = &s.child {
                crate::servers::signal(c.id(), "STOP");
                s.paused = true;
            }
        }
        if matches!(part, Part::Node | Part::Coordinator) {
            self.coord.pause(i);
        }
    }

    fn resume(&mut self, i: u64) {
        let s = self.server(i);
        if let Some(c) = &s.child {
            if s.paused {
                crate::servers::signal(c.id(), "CONT");
            }
        }
        s.paused = false;
        self.coord.resume(i);
    }
}

impl Corrupt for ClickHouseCluster {
    fn corrupt(&mut self, _i: u64, _how: Damage, _pick: u64) -> Result<String, BackendError> {
        Err(BackendError::Unsupported(
            "corrupt is not a fault of the clickhouse target",
        ))
    }
}

impl LogFiles for ClickHouseCluster {
    /// The coordinators' logs (their events reach the history).
    fn log_files(&self) -> Vec<(u64, PathBuf)> {
        self.coord.log_files()
    }

    fn exit_log(&self, e: &Exit) -> Option<PathBuf> {
        match e.part {
            Part::Replica => {
                let s = &self.servers[(e.node - 1) as usize];
                Some(if last_lines(&s.err_log()).is_empty() {
                    s.stderr()
                } else {
                    s.err_log()
                })
            }
            _ => self.coord.exit_log(e),
        }
    }
}

impl Probe for ClickHouseCluster {
    fn four(&self, i: u64, word: &str) -> Option<String> {
        self.coord.four(i, word)
    }

    fn answering(&self) -> Vec<u64> {
        self.coord.answering()
    }

    fn leader(&self) -> Option<u64> {
        self.coord.leader()
    }

    fn applied_index(&self, i: u64) -> Option<String> {
        self.coord.applied_index(i)
    }

    fn digest(&self, i: u64) -> Option<(String, String)> {
        self.coord.digest(i)
    }
}

impl FaultHooks for ClickHouseCluster {
    /// Its servers' hooks are drift's own, below (`admin`).
    fn hooks_of(&self, _i: u64) -> Result<(SocketAddr, &str), BackendError> {
        Err(BackendError::Unsupported(
            "ClickHouse servers have no drift fault hooks",
        ))
    }

    /// `table drop-replies-on|off` switch server i's reply proxy; the
    /// heal's resets of faults this target has not are answered as such.
    fn admin(&self, i: u64, cmd: &str) -> Result<String, BackendError> {
        let k = (i - 1) as usize;
        let proxy = |on: bool| match &self.proxies {
            Some(p) => Ok(format!(
                "reply proxy {}: {} ({} answers dropped so far)",
                p.addr(k),
                if on { "dropping" } else { "forwarding" },
                p.set_dropping(k, on)
            )),
            None => Err(BackendError::Unsupported("this cluster has no reply proxies")),
        };
        match cmd {
            "table drop-replies-on" => proxy(true),
            "table drop-replies-off" => proxy(false),
            "clock 0" | "table resume-fetches" | "table keeper-heal" => Ok("not a fault of this target".into()),
            _ => Err(BackendError::Unsupported(
                "ClickHouse servers have no drift fault hooks",
            )),
        }
    }
}

impl LinkCut for ClickHouseCluster {
    fn cut_links(&self, links: &[(u64, u64)], part: Part) -> Option<usize> {
        let (cut, groups) = (self.cut.as_ref()?, self.groups.as_ref()?);
        let mut cuts = 0;
        for &(a, b) in links {
            let rules: Vec<String> = self
                .endpoints(a, b, part)
                .iter()
                .flat_map(|(x, y)| cut.link_rules(groups, x, y))
                .collect();
            if cut.apply(&rules).is_ok() {
                cuts += 1;
            }
        }
        Some(cuts)
    }

    fn heal_links(&self) {
        if let Some(c) = &self.cut {
            c.heal();
        }
    }
}

impl TableHttp for ClickHouseCluster {
    /// Where the workload reaches server i: its reply proxy, if any.
    fn table_http(&self, i: u64) -> Option<SocketAddr> {
        let k = (i - 1) as usize;
        Some(self.proxies.as_ref().map_or(self.servers[k].http, |p| p.addr(k)))
    }

    fn kv_http(&self, _i: u64) -> Option<SocketAddr> {
        None
    }

    fn deduplicated_blocks(&self) -> Option<Vec<(String, u64)>> {
        Some(self.dedup_counts())
    }

    fn logged_block_ids(&self) -> Vec<(String, String)> {
        self.servers
            .iter()
            .flat_map(|s| {
                // the rotated log first (it holds the older lines)
                let mut text = std::fs::read_to_string(s.log().with_extension("log.0")).unwrap_or_default();
                text.push_str(&std::fs::read_to_string(s.log()).unwrap_or_default());
                block_ids_in_log(&text)
            })
            .collect()
    }
}

/// The `(query id, block id)` pairs of a ClickHouse server's log, from its
/// lines `… {<query id>} <Debug> db.table (Replicated OutputStream): Wrote
/// block with ID '<id>', N rows`: the server writes each block of an
/// insert, logs its id, then commits it (or finds it already there).
pub fn block_ids_in_log(text: &str) -> Vec<(String, String)> {
    const WROTE: &str = "Wrote block with ID '";
    text.lines()
        .filter_map(|l| {
            let at = l.find(WROTE)?;
            let id = l[at + WROTE.len()..].split('\'').next()?;
            let q = l[..at].split_once(" {")?.1.split_once("} ")?.0;
            (!q.is_empty() && !id.is_empty()).then(|| (q.to_string(), id.to_string()))
        })
        .collect()
}

impl Backend for ClickHouseCluster {
    fn name(&self) -> &'static str {
        match self.coordinator {
            Coordinator::Keeper => "local processes (ClickHouse servers on drift's keeper)",
            Coordinator::Zookeeper => "local processes (ClickHouse servers on Apache ZooKeeper)",
        }
    }
}

impl Faults for ClickHouseCluster {
    /// A server is started again as it is; a coordinator as
    /// [`LocalCluster`] brings one back.
    fn recover_exit(&mut self, e: &Exit) -> Option<String> {
        match e.part {
            Part::Replica => {
                let started = self.start_server(e.node);
                Some(format!(
                    "ClickHouse server {} exited ({}): {}",
                    e.node,
                    e.how(),
                    match started {
                        Ok(()) => "started again".to_string(),
                        Err(err) => err.to_string(),
                    }
                ))
            }
            _ => self.coord.recover_exit(&Exit {
                part: Part::Node,
                ..e.clone()
            }),
        }
    }
}

impl ClickHouseCluster {
    /// Every server ended and every watcher reaped.
    fn end_servers(&mut self) {
        for s in &mut self.servers {
            crate::servers::end_watched(&mut s.child, &mut s.watcher);
        }
    }
}

impl Drop for ClickHouseCluster {
    fn drop(&mut self) {
        self.end_servers();
    }
}

/// The campaign table of the insert-retry workload on ClickHouse (the
/// same columns and partitioning as on drift's table).
pub const INSERTS_DDL: &str = "CREATE TABLE IF NOT EXISTS inserts (id UInt64, p UInt64, tag String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/inserts', '{replica}') PARTITION BY p ORDER BY id";
/// Where the workload reaches each server's reply proxy: P+8.
pub const REPLY_PROXY_PORT_OFFSET: u16 = 8;
/// A server's native protocol port: P+7. A server needs one even if no
/// client uses it: 18.16's replica restarting thread reads it to
/// re-register the replica, and without it never recovers a session.
pub const NATIVE_PORT_OFFSET: u16 = 7;

/// The `<merge_tree>` settings of a campaign's table plan: the window by
/// count and age, cleanup every period (whole seconds, at least one) with
/// no random delay added, and the log kept for an inactive replica
/// (`--logs-to-keep`) when the plan sets it.
pub fn merge_tree_settings(t: &crate::plan::TablePlan) -> Vec<(String, String)> {
    vec![
        ("replicated_deduplication_window".into(), t.dedup_window.to_string()),
        (
            "replicated_deduplication_window_seconds".into(),
            t.dedup_window_seconds.to_string(),
        ),
        (
            "cleanup_delay_period".into(),
            t.cleanup_period_ms.div_ceil(1000).max(1).to_string(),
        ),
        ("cleanup_delay_period_random_add".into(), "0".into()),
    ]
    .into_iter()
    .chain(
        t.logs_to_keep
            .map(|n| ("max_replicated_logs_to_keep".to_string(), n.to_string())),
    )
    .collect()
}

/// A campaign's ClickHouse cluster, deployed: the coordinators up with a
/// leader, every server answering, the workload's table on each, and what
/// the servers turned out to be. Nothing outlives the returned cluster.
pub fn deploy(
    plan: &crate::plan::Plan,
    run_dir: &Path,
    block: Block,
    token: &str,
) -> Result<(ClickHouseCluster, Facts), crate::fail::Failure> {
    use crate::fail::Failure;
    let table = plan
        .table
        .as_ref()
        .ok_or_else(|| Failure::new("target clickhouse runs the insert-retry workload"))?;
    let bin = find_bin(plan.clickhouse_bin.as_deref()).map_err(Failure::new)?;
    if plan.coordinator == Coordinator::Zookeeper && !crate::servers::zookeeper_installed() {
        return Err(Failure::new(
            "--coordinator zookeeper needs Apache ZooKeeper: apt install zookeeper",
        ));
    }
    let spec = crate::local::LocalSpec {
        nodes: plan.nodes,
        block,
        port: plan.port,
        quorum_reads: plan.quorum_reads,
        digest: plan.digest,
        token,
        zookeeper: plan.coordinator == Coordinator::Zookeeper,
        proxies: false,
        table: None,
        kv: None,
        extra: if plan.witness() {
            vec![crate::plan::WITNESS_LINE.into()]
        } else {
            Vec::new()
        },
        defect: None,
    };
    let coord = LocalCluster::new(run_dir, spec).map_err(Failure::new)?;
    let settings = merge_tree_settings(table);
    let ch = ChSpec {
        bin: &bin,
        block,
        http_port: plan.port + crate::plan::TABLE_HTTP_PORT_OFFSET,
        interserver_port: plan.port + crate::plan::TABLE_INTERSERVER_PORT_OFFSET,
        tcp_port: plan.port + NATIVE_PORT_OFFSET,
        proxy_port: Some(plan.port + REPLY_PROXY_PORT_OFFSET),
        session_timeout_ms: plan.session_timeout_ms,
        merge_tree: &settings,
        partitions: plan.nemeses.contains(&crate::nemesis::FaultKind::Partition),
    };
    let mut c = ClickHouseCluster::new(run_dir, coord, plan.coordinator, plan.port, &ch)
        .map_err(|e| Failure::new(format!("target clickhouse: {e}")))?;
    c.start_coordinators()?;
    c.await_coordinators().map_err(Failure::new)?;
    c.start_servers().map_err(Failure::new)?;
    let facts = c.facts().map_err(Failure::new)?;
    c.create_table(INSERTS_DDL).map_err(Failure::new)?;
    c.supervise();
    Ok((c, facts))
}

impl ClickHouseCluster {
    /// Waits until every coordinator answers and one leads; one that exits
    /// meanwhile fails with its log's last lines.
    pub fn await_coordinators(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(e) = self.coord.exits().first() {
                let log = self.coord.exit_log(e).map(|p| last_lines(&p)).unwrap_or_default();
                return Err(format!(
                    "coordinator {} exited during setup ({}): {log}",
                    e.node,
                    e.how()
                ));
            }
            let up = self
                .ids()
                .iter()
                .all(|&i| self.coord.four(i, "ruok").as_deref() == Some("imok"));
            if up && self.coord.leader().is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the coordinators elected no leader within {}s (logs under the run dir)",
                    START_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_coordinator_session_is_told_from_a_refused_statement() {
        let answer = |body: &str| QueryError {
            addr: "127.0.0.11:8123".parse().unwrap(),
            refused: Some((500, body.to_string())),
        };
        // as ClickHouse 18.16 answers over HTTP; the first is its answer
        // to a CREATE TABLE whose multi the keeper committed and whose
        // connection it then dropped (the `lose-multi` hook), after which
        // CREATE TABLE IF NOT EXISTS found the table made
        let lost = [
            "Code: 999, e.displayText() = Coordination::Exception: Connection loss, e.what() = Coordination::Exception",
            "Code: 999, e.displayText() = Coordination::Exception: Connection loss, path: /clickhouse, e.what() = Coordination::Exception",
            "Code: 999, e.displayText() = Coordination::Exception: Session expired (Session expired), e.what() = Coordination::Exception",
            "Code: 999, e.displayText() = Coordination::Exception: Operation timeout, path: /clickhouse/tables/events",
        ];
        for e in lost {
            assert!(answer(e).coordination_lost(), "{e}");
        }
        let refused = [
            "Code: 253, e.displayText() = DB::Exception: Replica /clickhouse/tables/events/replicas/r1 already exists., e.what() = DB::Exception",
            "Code: 62, e.displayText() = DB::Exception: Syntax error: failed at position 1, e.what() = DB::Exception",
            "Code: 999, e.displayText() = Coordination::Exception: Node exists, path: /clickhouse/tables/events",
            // the words in another code's message
            "Code: 60, e.displayText() = DB::Exception: Table default.Code: 999 Connection loss doesn't exist., e.what() = DB::Exception",
        ];
        for e in refused {
            assert!(!answer(e).coordination_lost(), "{e}");
        }
        let silent = QueryError {
            addr: "127.0.0.11:8123".parse().unwrap(),
            refused: None,
        };
        assert!(!silent.coordination_lost(), "no answer");
    }

    #[test]
    fn block_ids_are_read_from_the_servers_log_under_their_query_id() {
        let log = "2026.12.03 10:23:42.400138 [ 20 ] {drift-8000000001-1} <Debug> default.inserts (Replicated OutputStream): Wrote block with ID '0_127_138', 2 rows\n\
            2026.12.03 10:23:43.146665 [ 20 ] {drift-1000000007-1} <Information> default.inserts (Replicated OutputStream): Block with ID 6_1_2 already exists; ignoring it.\n\
            2026.12.03 10:23:43.2 [ 21 ] {} <Debug> default.inserts (Replicated OutputStream): Wrote block with ID '1_2_3', 1 rows\n";
        assert_eq!(
            block_ids_in_log(log),
            vec![("drift-8000000001-1".to_string(), "0_127_138".to_string())]
        );
    }

    #[test]
    fn a_servers_config_names_its_address_coordinators_macros_and_window() {
        let settings = [("replicated_deduplication_window".to_string(), "100".to_string())];
        let coordinators: Vec<SocketAddr> =
            vec!["127.0.4.11:2281".parse().unwrap(), "127.0.4.12:2281".parse().unwrap()];
        let x = config_xml(&ServerConfig {
            id: 2,
            dir: Path::new("/run/nodes/ch2"),
            http: "127.0.4.12:2285".parse().unwrap(),
            interserver: "127.0.4.12:2286".parse().unwrap(),
            tcp_port: 2288,
            coordinators: &coordinators,
            session_timeout_ms: 4000,
            merge_tree: &settings,
        });
        assert_eq!(http_of_config(&x), Some("127.0.4.12:2285".parse().unwrap()));
        for want in [
            "<listen_host>127.0.4.12</listen_host>",
            "<http_port>2285</http_port>",
            "<interserver_http_host>127.0.4.12</interserver_http_host>",
            "<node index=\"2\"><host>127.0.4.12</host><port>2281</port></node>",
            "<session_timeout_ms>4000</session_timeout_ms>",
            "<replica>r2</replica>",
            "<replicated_deduplication_window>100</replicated_deduplication_window>",
            "<path>/run/nodes/ch2/data/</path>",
        ] {
            assert!(x.contains(want), "{want} not in\n{x}");
        }
        assert!(
            x.contains("<tcp_port>2288</tcp_port>"),
            "18.16 needs one to recover a session"
        );
    }
}
