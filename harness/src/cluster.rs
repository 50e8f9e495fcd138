//! `drift node` (run one node in the foreground) and `drift cluster
//! up|status|down` (a local cluster in the background to play with).
//!
//! A local cluster: node i binds 127.0.B.(10+i) of an address block B
//! that no other cluster on the machine holds ([`crate::claim`]), client
//! port P and Raft port P+1, so a firewall rule on an address pair cuts
//! one link. The nodes hold the block's claim for as long as any runs.
//! `up` writes `<dir>/cluster.toml` (mode 0600: it holds the peers'
//! secret), starts the nodes with their logs in `<dir>/node-<i>.log`,
//! records their PIDs in `<dir>/pids`, waits for a leader, and prints the
//! connect string. `stop|start|restart --node N` keep `pids` true for one
//! node; `down` ends exactly the PIDs listed (after checking they are
//! still our nodes). With `--fault-hooks`, the hooks' token is in
//! `<dir>/fault-token` (0600), never on a command line.

use crate::claim::{Block, Claim};
use crate::fail::Failure;
use crate::plan::NODES_MAX;
use crate::servers::{
    four_letter, http_get, local_config, local_table, tables_writable, write_private, LocalKv, LocalTable,
    FAULT_TOKEN_ENV,
};
use clap::{Args, Subcommand, ValueEnum};
use drift_keeper::DigestMode;
use drift_node::config::ClusterConfig;
use drift_node::keeper_node::{self, NodeOptions};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UP_TIMEOUT: Duration = Duration::from_secs(30);

/// The exit code of a server that hit a broken invariant (a panic in any
/// of its threads).
pub const PANIC_EXIT: i32 = 101;

/// A panic in any thread of a server ends the whole process: a replica
/// whose task died holding its state (a poisoned lock) would otherwise
/// stay up answering nothing, where a crash is seen, logged and restarted.
fn fail_stop_on_panic(id: u64) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        println!(
            "{}",
            serde_json::json!({"event": drift_keeper::NodeEvent::Panic.name(), "node": id, "what": info.to_string()})
        );
        std::process::exit(PANIC_EXIT);
    }));
}

pub fn node(args: NodeArgs) -> Result<i32, Failure> {
    fail_stop_on_panic(args.id);
    let mut config = ClusterConfig::load(&args.config)?;
    if let Some(d) = args.digest {
        config.digest = d.name().to_string();
    }
    config.quorum_reads |= args.quorum_reads;
    let fault_token = match (&args.admin, &args.fault_token_file) {
        (None, Some(_)) => return Err(Failure::new("--fault-token-file needs --admin")),
        (None, None) => None,
        (Some(_), file) => Some(fault_token(file.as_deref())?),
    };
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
    let failed = |e: drift_node::error::NodeError| Failure::new(format!("node {}: {e}", args.id));
    if !config.keeper {
        if std::env::var_os(drift_node::table::hooks::DEFECT_ENV).is_some() {
            return Err(Failure::new(format!(
                "{}: defects are armed on keeper nodes only (campaigns run those)",
                drift_node::table::hooks::DEFECT_ENV
            )));
        }
        drift_node::table::run_tables_only(&config, args.id, fault_token, args.admin, args.exit_with_parent)
            .map_err(failed)?;
        return Ok(0);
    }
    // the tables run beside the keeper, on their own runtime, until it stops
    let tables = drift_node::table::start(&config, args.id).map_err(failed)?;
    // the kv service too runs beside the keeper, on a runtime of its own
    let kv = drift_node::kv::start(&config, args.id).map_err(failed)?;
    arm_defect(
        tables.as_ref().map(|t| &*t.node),
        kv.as_ref().map(|k| &*k.node),
        fault_token.is_some(),
    )?;
    let table_admin = tables.as_ref().map(|t| {
        let node = t.node.clone();
        std::sync::Arc::new(move |line: &str| node.admin(line)) as drift_node::keeper_node::TableAdmin
    });
    let kv_admin = kv.as_ref().map(|k| {
        let node = k.node.clone();
        std::sync::Arc::new(move |line: &str| node.admin(line)) as drift_node::keeper_node::TableAdmin
    });
    keeper_node::run(NodeOptions {
        id: args.id,
        config,
        fault_token,
        admin: args.admin,
        exit_with_parent: args.exit_with_parent,
        peer_via,
        bootstrap: args.bootstrap,
        table_admin,
        kv_admin,
    })
    .map_err(failed)?;
    drop(tables);
    drop(kv);
    Ok(0)
}

/// Arms the test-only table or kv defect named by the environment
/// ([`drift_node::table::hooks::DEFECT_ENV`]), only on a node whose fault
/// hooks are on: a defect is never on by default, nor without the token.
fn arm_defect(
    tables: Option<&drift_node::table::TableNode>,
    kv: Option<&drift_node::kv::KvNode>,
    hooks_on: bool,
) -> Result<(), Failure> {
    let env = drift_node::table::hooks::DEFECT_ENV;
    let Some(defect) = std::env::var_os(env) else {
        return Ok(());
    };
    let defect = defect.to_string_lossy();
    if !hooks_on {
        return Err(Failure::new(format!(
            "{env}={defect}: a defect is armed only on a node with fault hooks (--admin and a token)"
        )));
    }
    if defect == drift_node::kv::DEFECT_REPAIR_OVERWRITES {
        let Some(k) = kv else {
            return Err(Failure::new(format!("{env}={defect}: this node runs no kv service")));
        };
        let answer = k.admin("defect-overwrite on");
        return if answer == "ok" {
            Ok(())
        } else {
            Err(Failure::new(format!("{env}={defect}: {answer}")))
        };
    }
    let Some(t) = tables else {
        return Err(Failure::new(format!("{env}={defect}: this node holds no table")));
    };
    t.arm_defect(&defect).map_err(Failure::new)
}

/// Fewest characters a fault token has.
const FAULT_TOKEN_CHARS_MIN: usize = 16;

/// The fault hooks' token: from `file`, else from [`FAULT_TOKEN_ENV`].
fn fault_token(file: Option<&Path>) -> Result<String, Failure> {
    let (token, from) = match file {
        Some(f) => (
            std::fs::read_to_string(f).map_err(|e| Failure::new(format!("--fault-token-file {}: {e}", f.display())))?,
            f.display().to_string(),
        ),
        None => (
            std::env::var(FAULT_TOKEN_ENV).map_err(|_| {
                Failure::new(format!(
                    "--admin needs the fault hooks' token: --fault-token-file PATH or {FAULT_TOKEN_ENV}"
                ))
            })?,
            FAULT_TOKEN_ENV.to_string(),
        ),
    };
    let token = token.trim().to_string();
    if token.len() < FAULT_TOKEN_CHARS_MIN || token.contains(char::is_whitespace) {
        return Err(Failure::new(format!(
            "{from}: the fault token must be one word of at least {FAULT_TOKEN_CHARS_MIN} characters"
        )));
    }
    Ok(token)
}

pub fn cluster(args: ClusterArgs) -> Result<i32, Failure> {
    match args.action {
        ClusterAction::Up {
            nodes,
            dir,
            port,
            block,
            quorum_reads: _,
            local_reads,
            fault_hooks,
            set,
            no_table,
            table: which,
            table_settings,
            table_replicas,
            http_port,
            interserver_port,
            coordinator,
            no_kv,
            kv_port,
            kv_settings,
            target,
            clickhouse_bin,
        } => {
            if target == ClusterTarget::Clickhouse {
                let bin = crate::clickhouse::find_bin(clickhouse_bin.as_deref()).map_err(Failure::new)?;
                if no_table || table_replicas.is_some() || !table_settings.is_empty() || which != TableArg::Events {
                    return Err(Failure::new(
                        "--target clickhouse holds the table `events` on every node: --no-table, --table, --table-replicas and --table-setting are for drift's table",
                    ));
                }
                let ch = ClickHouseUp {
                    bin,
                    http_port,
                    interserver_port,
                    tcp_port: CLICKHOUSE_TCP_PORT,
                    merge_tree: Vec::new(),
                };
                return up(UpSpec {
                    nodes,
                    dir: &dir,
                    port,
                    block,
                    quorum_reads: !local_reads,
                    fault_hooks,
                    set: &set,
                    table: None,
                    kv: None,
                    zookeeper: coordinator == CoordinatorArg::Zookeeper,
                    clickhouse: Some(&ch),
                    zookeeper_heap_mb: None,
                });
            } else if clickhouse_bin.is_some() {
                return Err(Failure::new("--clickhouse-bin is for --target clickhouse"));
            }
            let kv = if no_kv || coordinator == CoordinatorArg::Zookeeper {
                None
            } else {
                let mut settings = kv_settings.clone();
                if !settings
                    .iter()
                    .any(|l| l.split('=').next().is_some_and(|k| k.trim() == "rf"))
                {
                    settings.push(format!("rf = {}", nodes.min(3)));
                }
                Some(LocalKv::new(kv_port, &settings)?)
            };
            let replicas = table_replicas.unwrap_or(nodes);
            if !(1..=nodes).contains(&replicas) {
                return Err(Failure::new(format!("--table-replicas must be in 1..={nodes}")));
            }
            let table = if no_table {
                None
            } else {
                let declaration = match which {
                    TableArg::Events => DEFAULT_TABLE,
                    TableArg::Inserts => drift_workloads::table::TABLE_DECLARATION,
                };
                Some(local_table(
                    declaration,
                    replicas,
                    http_port,
                    interserver_port,
                    &table_settings,
                )?)
            };
            if coordinator == CoordinatorArg::Zookeeper && table.is_none() {
                return Err(Failure::new(
                    "--coordinator zookeeper coordinates the table: not with --no-table",
                ));
            }
            up(UpSpec {
                nodes,
                dir: &dir,
                port,
                block,
                quorum_reads: !local_reads,
                fault_hooks,
                set: &set,
                table: table.as_ref(),
                kv: kv.as_ref(),
                zookeeper: coordinator == CoordinatorArg::Zookeeper,
                clickhouse: None,
                zookeeper_heap_mb: None,
            })
        }
        ClusterAction::Stop { dir, node } => stop_node(&dir, node),
        ClusterAction::Start { dir, node } => start_node(&dir, node),
        ClusterAction::Restart { dir, node } => {
            stop_node(&dir, node)?;
            start_node(&dir, node)
        }
        ClusterAction::Hold { dir } => hold(&dir),
        ClusterAction::Env { dir } => env(&dir),
        ClusterAction::Status { dir } => status(&dir),
        ClusterAction::Down { dir } => down(&dir),
    }
}

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

/// The table `drift cluster up` declares unless told not to.
pub const DEFAULT_TABLE: &str = "name = \"events\"\ncolumns = \"id UInt64, key String, value Int64\"\npartition_by = \"intDiv(id, 1000)\"\norder_by = \"id\"\n";

/// What a local cluster is made of.
pub struct UpSpec<'a> {
    pub nodes: u64,
    pub dir: &'a Path,
    pub port: u16,
    pub block: Option<u8>,
    pub quorum_reads: bool,
    pub fault_hooks: bool,
    pub set: &'a [String],
    pub table: Option<&'a LocalTable>,
    pub kv: Option<&'a LocalKv>,
    /// Apache ZooKeeper on the peers' client addresses instead of the
    /// keeper (the nodes then run their tables only).
    pub zookeeper: bool,
    /// Real ClickHouse servers hold the table (then no drift table, and no
    /// drift node beside a ZooKeeper ensemble).
    pub clickhouse: Option<&'a ClickHouseUp>,
    /// The ZooKeeper JVMs' fixed heap (default: the small one tests use).
    pub zookeeper_heap_mb: Option<u32>,
}

/// The ClickHouse servers of `drift cluster up --target clickhouse`.
pub struct ClickHouseUp {
    pub bin: PathBuf,
    pub http_port: u16,
    pub interserver_port: u16,
    pub tcp_port: u16,
    /// `<merge_tree>` settings of every server.
    pub merge_tree: Vec<(String, String)>,
}

/// ClickHouse's native protocol port (clickhouse-client's default).
pub const CLICKHOUSE_TCP_PORT: u16 = 9000;
/// The table of a ClickHouse cluster to play with: `events`, as on drift's.
pub const CLICKHOUSE_EVENTS_DDL: &str = "CREATE TABLE IF NOT EXISTS events (id UInt64, key String, value Int64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/events', '{replica}') PARTITION BY intDiv(id, 1000) ORDER BY id";
/// Where a ClickHouse cluster records its servers' PIDs.
const CH_PIDS: &str = "ch-pids";

fn up(spec: UpSpec<'_>) -> Result<i32, Failure> {
    let config = start_cluster(&spec)?;
    if let Some(ch) = spec.clickhouse {
        let urls: Vec<String> = config
            .peers
            .iter()
            .map(|p| format!("http://{}:{}/", p.client.ip(), ch.http_port))
            .collect();
        noteln!("ClickHouse servers (table events) on {}", urls.join(" "));
    }
    if !config.tables.is_empty() {
        let urls = config.table_urls();
        let names: Vec<&str> = config.tables.iter().map(|t| t.name.as_str()).collect();
        noteln!("tables {} on {}", names.join(", "), urls.join(" "));
    }
    let kv: Vec<String> = config
        .peers
        .iter()
        .filter_map(|p| p.kv)
        .map(|a| format!("http://{a}"))
        .collect();
    if !kv.is_empty() {
        noteln!("kv on {}", kv.join(" "));
    }
    out!("{}", config.connect_string());
    Ok(0)
}

/// Starts a local cluster in the background and waits until it serves:
/// a leader, and every table replica writable.
pub fn start_cluster(spec: &UpSpec<'_>) -> Result<ClusterConfig, Failure> {
    let UpSpec {
        nodes,
        dir,
        port,
        block,
        quorum_reads,
        fault_hooks,
        set,
        table,
        kv,
        zookeeper,
        clickhouse,
        zookeeper_heap_mb,
    } = *spec;
    if zookeeper && !crate::servers::zookeeper_installed() {
        return Err(Failure::new(
            "--coordinator zookeeper needs Apache ZooKeeper (apt install zookeeper)",
        ));
    }
    if zookeeper && table.is_none() && clickhouse.is_none() && kv.is_some() {
        return Err(Failure::new(
            "a ZooKeeper ensemble coordinates a table, or runs bare: not beside the kv service alone",
        ));
    }
    if !(1..=NODES_MAX).contains(&nodes) {
        return Err(Failure::new(format!("--nodes must be in 1..={NODES_MAX}")));
    }
    // client port P, Raft P+1, admin P+2 (ZooKeeper's election port P+3)
    check_port(port, 3)?;
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
    // held by the nodes (their stdin) once this process is gone
    let claim = Claim::acquire(block, nodes, port, &claim_holder(&dir))?;
    let secret = drift_node::peer_auth::new_secret().map_err(|e| Failure::new(format!("a cluster secret: {e}")))?;
    let mut set = set.to_vec();
    if zookeeper {
        set.push("keeper = false".into());
    }
    let block = claim.block;
    let text = local_config(
        nodes,
        &|i| block.ip(i),
        &dir.join("data"),
        port,
        quorum_reads,
        &secret,
        &set,
        table,
        kv,
    );
    let config = crate::servers::write_cluster_file(&config_path, &text).map_err(Failure::new)?;
    let token_path = dir.join("fault-token");
    if fault_hooks {
        let token = drift_node::peer_auth::new_secret().map_err(|e| Failure::new(format!("a fault token: {e}")))?;
        write_private(&token_path, &token).map_err(Failure::new)?;
    } else {
        let _ = std::fs::remove_file(&token_path);
    }
    // recorded before anything runs: from here on, a failure ends what
    // had started (with `stop_cluster`, as `down` would), so that a
    // cluster that did not come up holds no process, port or address block
    write_pids(&dir, &[])?;
    // beside ZooKeeper, ClickHouse servers need no drift node, and a bare
    // ensemble (a benchmark's peer) none either
    let drift_nodes = !(zookeeper && (clickhouse.is_some() || table.is_none()));
    let launch = || -> Result<(), Failure> {
        spawn_holder(&dir, &claim)?;
        if zookeeper {
            start_zookeeper(&dir, &config, claim.block, nodes, port, &claim, zookeeper_heap_mb)?;
        }
        // each pid is recorded as soon as its node runs, so that a failure
        // later ends whatever started
        let mut pids = Vec::new();
        for i in (1..=nodes).filter(|_| drift_nodes) {
            let pid = spawn_node(&dir, i, true, Some(&claim))?.id();
            pids.push((i, pid));
            write_pids(&dir, &pids)?;
        }
        let deadline = Instant::now() + UP_TIMEOUT;
        wait_until(deadline, "no leader", || {
            config
                .peers
                .iter()
                .filter(|p| four_letter(p.client, "srvr").is_some_and(|s| s.contains("Mode: leader")))
                .count()
                == 1
        })?;
        if !config.tables.is_empty() {
            // every replica registered and out of read-only mode
            let https: Vec<SocketAddr> = config.peers.iter().filter_map(|p| p.http).collect();
            wait_until(deadline, "the tables' replicas were not all ready", || {
                tables_writable(&https)
            })?;
        }
        if let Some(ch) = clickhouse {
            start_clickhouse(&dir, &config, ch, &claim, deadline)?;
        }
        let kvs: Vec<SocketAddr> = config.peers.iter().filter_map(|p| p.kv).collect();
        if !kvs.is_empty() {
            wait_until(deadline, "the kv service did not answer on every node", || {
                kvs.iter()
                    .all(|a| http_get(*a, "/ping").is_some_and(|(code, _)| code == 200))
            })?;
        }
        Ok(())
    };
    match launch() {
        Ok(()) => Ok(config),
        Err(e) => {
            let cleanup = match stop_cluster(&dir) {
                Ok(n) => format!(
                    "what had started is stopped ({n} process(es)); the logs stay in {}",
                    dir.display()
                ),
                Err(s) => format!("stopping what had started failed too: {}", s.message),
            };
            Err(Failure {
                code: e.code,
                message: format!("{}; {cleanup}", e.message),
            })
        }
    }
}

/// Polls `ready` every 100 ms until it holds; after `deadline`, fails
/// with `what`.
fn wait_until(deadline: Instant, what: &str, mut ready: impl FnMut() -> bool) -> Result<(), Failure> {
    while !ready() {
        if Instant::now() > deadline {
            return Err(Failure::new(format!("{what} within {}s", UP_TIMEOUT.as_secs())));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The ClickHouse servers of `--target clickhouse`: one per node on its
/// address, holding the address block's claim, recorded in `<dir>/ch-pids`;
/// answers awaited, then the table `events` created on each.
fn start_clickhouse(
    dir: &Path,
    config: &ClusterConfig,
    ch: &ClickHouseUp,
    claim: &Claim,
    deadline: Instant,
) -> Result<(), Failure> {
    let coordinators: Vec<SocketAddr> = config.peers.iter().map(|p| p.client).collect();
    let mut pids = Vec::new();
    let mut https = Vec::new();
    for p in &config.peers {
        let server_dir = dir.join(format!("ch{}", p.id));
        let http = SocketAddr::new(p.client.ip(), ch.http_port);
        crate::clickhouse::write_server_files(&crate::clickhouse::ServerConfig {
            id: p.id,
            dir: &server_dir,
            http,
            interserver: SocketAddr::new(p.client.ip(), ch.interserver_port),
            tcp_port: ch.tcp_port,
            coordinators: &coordinators,
            session_timeout_ms: 30_000,
            merge_tree: &ch.merge_tree,
        })
        .map_err(Failure::new)?;
        let log_path = server_dir.join("stderr.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Failure::new(format!("{}: {e}", log_path.display())))?;
        let stdin = Stdio::from(
            claim
                .share()
                .map_err(|e| Failure::new(format!("the address block's lock: {e}")))?,
        );
        let child = crate::clickhouse::server_command(&ch.bin, &server_dir)
            .stdin(stdin)
            .stdout(log.try_clone().map_err(|e| Failure::new(e.to_string()))?)
            .stderr(log)
            .spawn()
            .map_err(|e| Failure::new(format!("starting ClickHouse server {}: {e}", p.id)))?;
        pids.push((p.id, child.id()));
        let text: String = pids.iter().map(|(i, p)| format!("{i} {p}\n")).collect();
        std::fs::write(dir.join(CH_PIDS), text).map_err(|e| Failure::new(e.to_string()))?;
        https.push((p.id, http));
    }
    for (i, http) in &https {
        wait_until(
            deadline,
            &format!("ClickHouse server {i} did not answer on {http}"),
            || http_get(*http, "/ping").is_some_and(|(c, _)| c == 200),
        )?;
    }
    for (i, http) in &https {
        crate::clickhouse::create_table_on(*http, CLICKHOUSE_EVENTS_DDL, deadline)
            .map_err(|e| Failure::new(format!("creating the table on ClickHouse server {i}: {e}")))?;
    }
    Ok(())
}

/// The ZooKeeper ensemble of a `--coordinator zookeeper` cluster: one JVM
/// per node on its client address, holding the address block's claim,
/// recorded in `<dir>/zk-pids` (the caller waits for its leader).
fn start_zookeeper(
    dir: &Path,
    config: &ClusterConfig,
    block: Block,
    nodes: u64,
    port: u16,
    claim: &Claim,
    heap_mb: Option<u32>,
) -> Result<(), Failure> {
    crate::servers::write_zookeeper_configs(config, block, nodes, port).map_err(Failure::new)?;
    let mut pids = Vec::new();
    for i in 1..=nodes {
        let log_path = dir.join(format!("zookeeper-{i}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Failure::new(format!("{}: {e}", log_path.display())))?;
        let stdin = Stdio::from(
            claim
                .share()
                .map_err(|e| Failure::new(format!("the address block's lock: {e}")))?,
        );
        let child = crate::servers::zookeeper_command(&config.node_dir(i), heap_mb)
            .stdin(stdin)
            .stdout(log.try_clone().map_err(|e| Failure::new(e.to_string()))?)
            .stderr(log)
            .spawn()
            .map_err(|e| Failure::new(format!("starting ZooKeeper {i}: {e}")))?;
        pids.push((i, child.id()));
        let text: String = pids.iter().map(|(i, p)| format!("{i} {p}\n")).collect();
        std::fs::write(dir.join("zk-pids"), text).map_err(|e| Failure::new(e.to_string()))?;
    }
    Ok(())
}

/// How a cluster's claim on its address block names its holder.
fn claim_holder(dir: &Path) -> String {
    format!("drift cluster in {}", dir.display())
}

/// The address block a cluster file's nodes are on.
fn block_of(config: &ClusterConfig) -> Option<u8> {
    match config.peers.first()?.client.ip() {
        std::net::IpAddr::V4(ip) => Some(ip.octets()[2]),
        std::net::IpAddr::V6(_) => None,
    }
}

/// Starts node `i` of the cluster in `dir` (canonical) in the background,
/// its output appended to `node-<i>.log`, with its fault hooks when the
/// cluster has a `fault-token`, holding `claim` (as its stdin) when
/// given; its PID.
/// Starts node i in the background; the child (dropping it leaves the
/// node running).
fn spawn_node(dir: &Path, i: u64, bootstrap: bool, claim: Option<&Claim>) -> Result<std::process::Child, Failure> {
    let config_path = dir.join("cluster.toml");
    let config = ClusterConfig::load(&config_path)?;
    let peer = config
        .peer(i)
        .ok_or_else(|| Failure::new(format!("no node {i} in {}", config_path.display())))?;
    let log_path = dir.join(format!("node-{i}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| Failure::new(format!("{}: {e}", log_path.display())))?;
    let exe = std::env::current_exe().map_err(|e| Failure::new(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.args(["node", "--config"])
        .arg(&config_path)
        .args(["--id", &i.to_string()])
        .args(bootstrap.then_some("--bootstrap"));
    let token_path = dir.join("fault-token");
    if token_path.exists() {
        let admin = SocketAddr::new(peer.client.ip(), peer.client.port() + 2);
        cmd.arg("--fault-token-file")
            .arg(&token_path)
            .args(["--admin", &admin.to_string()]);
    }
    let stdin = match claim {
        Some(c) => Stdio::from(
            c.share()
                .map_err(|e| Failure::new(format!("the address block's lock: {e}")))?,
        ),
        None => Stdio::null(),
    };
    cmd.stdin(stdin)
        .stdout(log.try_clone().map_err(|e| Failure::new(e.to_string()))?)
        .stderr(log)
        .spawn()
        .map_err(|e| Failure::new(format!("starting node {i}: {e}")))
}

/// `drift cluster env`: the cluster's addresses as shell assignments.
fn env(dir: &Path) -> Result<i32, Failure> {
    let (dir, config_path) = cluster_dir(dir)?;
    if !config_path.exists() {
        return Err(Failure::new(format!(
            "{}: no cluster here (no cluster.toml; `drift cluster up --dir {}` makes one)",
            dir.display(),
            dir.display()
        )));
    }
    let config = ClusterConfig::load(&config_path)?;
    for line in env_lines(&dir, &config) {
        out!("{line}");
    }
    Ok(0)
}

/// [`env`]'s lines: `export NAME='value'`, values quoted for the shell.
fn env_lines(dir: &Path, config: &ClusterConfig) -> Vec<String> {
    let quote = |v: &str| format!("'{}'", v.replace('\'', r"'\''"));
    let mut vars = vec![
        ("DRIFT_CONNECT".to_string(), config.connect_string()),
        ("DRIFT_DIR".to_string(), dir.display().to_string()),
    ];
    let hooks = dir.join("fault-token").exists();
    for p in &config.peers {
        let i = p.id;
        vars.push((format!("DRIFT_HOST_{i}"), p.client.ip().to_string()));
        vars.push((format!("DRIFT_CLIENT_{i}"), p.client.to_string()));
        if hooks {
            let admin = SocketAddr::new(p.client.ip(), p.client.port() + 2);
            vars.push((format!("DRIFT_ADMIN_PORT_{i}"), admin.port().to_string()));
        }
        if let Some(a) = p.http {
            vars.push((format!("DRIFT_TABLE_{i}"), format!("http://{a}")));
        }
        if let Some(a) = p.kv {
            vars.push((format!("DRIFT_KV_{i}"), format!("http://{a}")));
        }
        let ch = std::fs::read_to_string(dir.join(format!("ch{i}/config.xml")))
            .ok()
            .and_then(|x| crate::clickhouse::http_of_config(&x));
        if let Some(a) = ch {
            vars.push((format!("DRIFT_CLICKHOUSE_{i}"), format!("http://{a}")));
        }
    }
    vars.into_iter()
        .map(|(k, v)| format!("export {k}={}", quote(&v)))
        .collect()
}

/// Where `up` records the PID of the cluster's block holder.
const HOLDER_PID: &str = "holder-pid";

/// Starts the process that holds `claim` (as its stdin) until `down`, so
/// that a cluster whose servers all stopped keeps its address block, and
/// records its PID in `<dir>/holder-pid`.
fn spawn_holder(dir: &Path, claim: &Claim) -> Result<(), Failure> {
    let dir = std::fs::canonicalize(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let exe = std::env::current_exe().map_err(|e| Failure::new(e.to_string()))?;
    let lock = claim
        .share()
        .map_err(|e| Failure::new(format!("the address block's lock: {e}")))?;
    let child = Command::new(exe)
        .args(["cluster", "hold", "--dir"])
        .arg(&dir)
        .stdin(Stdio::from(lock))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Failure::new(format!("starting the address block's holder: {e}")))?;
    let path = dir.join(HOLDER_PID);
    std::fs::write(&path, format!("{}\n", child.id())).map_err(|e| Failure::new(format!("{}: {e}", path.display())))
}

/// The block holder's life: its standard input is the block's locked
/// file; it waits, and ends when the cluster's file is gone (a directory
/// removed without `down`) or when `down` ends it.
fn hold(dir: &Path) -> Result<i32, Failure> {
    let config = dir.join("cluster.toml");
    while config.exists() {
        std::thread::sleep(Duration::from_secs(2));
    }
    Ok(0)
}

/// Ends the block holder of the cluster in `dir`, if it runs.
fn end_holder(dir: &Path) -> Result<(), Failure> {
    let path = dir.join(HOLDER_PID);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    if let Ok(pid) = text.trim().parse::<u32>() {
        // ours when its command line names `cluster hold` and this directory
        if cmdline_has(pid, "hold") {
            end_processes(&[pid], &dir.display().to_string());
        }
    }
    std::fs::remove_file(&path).map_err(|e| Failure::new(format!("{}: {e}", path.display())))
}

/// Replaces `<dir>/pids` with `pids` (one `<id> <pid>` line each).
fn write_pids(dir: &Path, pids: &[(u64, u32)]) -> Result<(), Failure> {
    let text: String = pids.iter().map(|(i, p)| format!("{i} {p}\n")).collect();
    let tmp = dir.join("pids.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, dir.join("pids")))
        .map_err(|e| Failure::new(format!("{}: {e}", dir.join("pids").display())))
}

/// The cluster's directory, canonical, and its cluster file's path.
fn cluster_dir(dir: &Path) -> Result<(PathBuf, PathBuf), Failure> {
    let dir = std::fs::canonicalize(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let config = dir.join("cluster.toml");
    Ok((dir, config))
}

/// Ends `pids` (our nodes only): SIGTERM, up to 5 s, then SIGKILL. How
/// many were running.
fn end_nodes(pids: &[u32], config_path: &Path) -> usize {
    end_processes(pids, &config_path.display().to_string())
}

/// Ends the processes of `pids` whose command line still names `marker`
/// (so never a recycled PID): SIGTERM, up to 5 s, then SIGKILL, and
/// returns once each has exited (a zombie or gone). A process's command
/// line empties as it starts to exit, before it has released its files
/// and ports: waiting on that alone returned with the process still
/// running.
fn end_processes(pids: &[u32], marker: &str) -> usize {
    let ours: Vec<u32> = pids.iter().copied().filter(|p| cmdline_has(*p, marker)).collect();
    signal(&ours, "TERM");
    let running = |deadline: Instant| {
        while Instant::now() < deadline && ours.iter().any(|p| still_running(*p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        ours.iter().copied().filter(|p| still_running(*p)).collect::<Vec<u32>>()
    };
    let left = running(Instant::now() + Duration::from_secs(5));
    // only those still ours: a PID that exited may have been handed on
    let left: Vec<u32> = left.into_iter().filter(|p| cmdline_has(*p, marker)).collect();
    signal(&left, "KILL");
    running(Instant::now() + Duration::from_secs(5));
    ours.len()
}

/// Whether `pid` has not yet exited: its /proc entry exists and it is
/// neither a zombie nor dead.
fn still_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last `)`
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z' | 'X' | 'x') | None)
}

fn cmdline_has(pid: u32, marker: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains(marker))
        .unwrap_or(false)
}

fn no_such_node(node: u64, config_path: &Path) -> Failure {
    Failure::new(format!("--node {node}: no such node in {}", config_path.display()))
}

fn stop_node(dir: &Path, node: u64) -> Result<i32, Failure> {
    let (dir, config_path) = cluster_dir(dir)?;
    if ClusterConfig::load(&config_path)?.peer(node).is_none() {
        return Err(no_such_node(node, &config_path));
    }
    let mut pids = read_pids(&dir)?;
    let Some(at) = pids.iter().position(|(id, _)| *id == node) else {
        out!("node {node} is not running");
        return Ok(0);
    };
    let (_, pid) = pids.remove(at);
    let ended = end_nodes(&[pid], &config_path);
    write_pids(&dir, &pids)?;
    out!(
        "node {node}: {}",
        if ended == 1 { "stopped" } else { "was not running" }
    );
    Ok(0)
}

fn start_node(dir: &Path, node: u64) -> Result<i32, Failure> {
    let (dir, config_path) = cluster_dir(dir)?;
    let config = ClusterConfig::load(&config_path)?;
    let addr = config
        .peer(node)
        .map(|p| p.client)
        .ok_or_else(|| no_such_node(node, &config_path))?;
    let mut pids = read_pids(&dir)?;
    if let Some((_, pid)) = pids.iter().find(|(id, _)| *id == node) {
        if is_our_node(*pid, &config_path) {
            return Err(Failure::new(format!("node {node} is already running (pid {pid})")));
        }
    }
    // the running nodes hold the block's claim; when none does, this one
    // takes it on
    let claim = match block_of(&config) {
        Some(b) => Claim::rejoin(b, &claim_holder(&dir))?,
        None => None,
    };
    let mut child = spawn_node(&dir, node, false, claim.as_ref())?;
    let pid = child.id();
    pids.retain(|(id, _)| *id != node);
    pids.push((node, pid));
    pids.sort_unstable();
    write_pids(&dir, &pids)?;
    let deadline = Instant::now() + UP_TIMEOUT;
    while four_letter(addr, "ruok").as_deref() != Some("imok") {
        // its parent knows for sure whether it exited (its command line
        // read from /proc is no such proof: one read came back without it)
        if child.try_wait().map_or(true, |status| status.is_some()) {
            return Err(Failure::new(format!(
                "node {node} exited at start; see {}",
                dir.join(format!("node-{node}.log")).display()
            )));
        }
        if Instant::now() > deadline {
            return Err(Failure::new(format!("node {node} does not answer on {addr}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    out!("node {node}: started (pid {pid})");
    Ok(0)
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
    let config = ClusterConfig::load(&dir.join("cluster.toml"))?;
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
    let dir = std::fs::canonicalize(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let ch_path = dir.join(CH_PIDS);
    if ch_path.exists() {
        let text = std::fs::read_to_string(&ch_path).map_err(|e| Failure::new(e.to_string()))?;
        out!("{:<5} {:<8} {:<9} clickhouse", "node", "pid", "alive");
        for l in text.lines() {
            let mut w = l.split_whitespace();
            let (Some(id), Some(pid)) = (w.next(), w.next().and_then(|p| p.parse::<u32>().ok())) else {
                continue;
            };
            let alive = cmdline_has(pid, &dir.display().to_string());
            let http = std::fs::read_to_string(dir.join(format!("ch{id}/config.xml")))
                .ok()
                .and_then(|x| crate::clickhouse::http_of_config(&x));
            let version = http
                .and_then(|a| crate::clickhouse::query(a, "SELECT version()").ok())
                .map_or_else(
                    || "no answer".to_string(),
                    |v| format!("{} on http://{}/", v.trim(), http.expect("asked")),
                );
            out!("{:<5} {:<8} {:<9} {}", id, pid, alive, version);
        }
    }
    Ok(0)
}

pub fn down(dir: &Path) -> Result<i32, Failure> {
    let ended = stop_cluster(dir)?;
    out!("stopped {ended} node(s)");
    Ok(0)
}

/// Ends every process of the cluster in `dir`; how many ran.
pub fn stop_cluster(dir: &Path) -> Result<usize, Failure> {
    let (dir, config_path) = cluster_dir(dir)?;
    let pids: Vec<u32> = read_pids(&dir)?.into_iter().map(|(_, p)| p).collect();
    let mut ended = end_nodes(&pids, &config_path);
    std::fs::remove_file(dir.join("pids")).map_err(|e| Failure::new(e.to_string()))?;
    let zk_path = dir.join("zk-pids");
    if zk_path.exists() {
        let text = std::fs::read_to_string(&zk_path).map_err(|e| Failure::new(e.to_string()))?;
        let zk: Vec<u32> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        // a ZooKeeper JVM is ours when its command line names a zoo.cfg in this directory
        ended += end_processes(&zk, &dir.join("data").display().to_string());
        std::fs::remove_file(&zk_path).map_err(|e| Failure::new(e.to_string()))?;
    }
    let ch_path = dir.join(CH_PIDS);
    if ch_path.exists() {
        // a ClickHouse server is ours when its command line names a
        // config in this directory; the servers go before their
        // coordinators would have, had they been first
        ended += end_processes(&pid_list(&ch_path)?, &dir.display().to_string());
        std::fs::remove_file(&ch_path).map_err(|e| Failure::new(e.to_string()))?;
    }
    // the block goes last, once nothing of the cluster runs
    end_holder(&dir)?;
    Ok(ended)
}

/// The PIDs of a `<id> <pid>` file.
fn pid_list(path: &Path) -> Result<Vec<u32>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect())
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

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The cluster file (TOML: data_dir, knobs, [[peer]] id/raft/client).
    #[arg(long)]
    pub config: PathBuf,
    /// This node's id in the cluster file.
    #[arg(long)]
    pub id: u64,
    /// Serve the fault hooks (diverge, clock, isolate, …) on this address,
    /// to whoever sends the token. The token is read from
    /// --fault-token-file, else from the DRIFT_FAULT_TOKEN environment
    /// variable — never from the command line, which every user can see.
    #[arg(long)]
    pub admin: Option<std::net::SocketAddr>,
    /// A file holding the fault hooks' token (with --admin).
    #[arg(long = "fault-token-file")]
    pub fault_token_file: Option<PathBuf>,
    /// Override the config's digest mode.
    #[arg(long, value_enum)]
    pub digest: Option<DigestMode>,
    /// Override the config: linearizable reads through a read-index round.
    #[arg(long = "quorum-reads")]
    pub quorum_reads: bool,
    /// Exit once process PID is no longer this node's parent: campaigns
    /// start nodes so, with their own PID, so that a node whose campaign
    /// died before the node began to watch it exits too.
    #[arg(long = "exit-with-parent", value_name = "PID")]
    pub exit_with_parent: Option<u32>,
    /// Reach peer ID through ADDR instead of its Raft address (`ID=ADDR`,
    /// repeatable): campaigns route links through their own proxies.
    #[arg(long = "peer-via")]
    pub peer_via: Vec<String>,
    /// The first start of a new cluster. A node that finds no Raft state
    /// without this flag lost it, and votes only after hearing from a
    /// leader (it may have voted in a term it no longer knows).
    #[arg(long)]
    pub bootstrap: bool,
}

/// The table a local cluster declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TableArg {
    Events,
    Inserts,
}

/// What coordinates a local cluster's table.
pub type CoordinatorArg = crate::plan::Coordinator;

/// Who holds a local cluster's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClusterTarget {
    /// drift's own nodes.
    Drift,
    /// Real ClickHouse servers, one per node.
    Clickhouse,
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub action: ClusterAction,
}

#[derive(Subcommand, Debug)]
pub enum ClusterAction {
    /// Start a local cluster in the background and print its connect string.
    Up {
        /// Nodes in the cluster.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=crate::plan::NODES_MAX))]
        nodes: u64,
        /// Directory for the cluster file, data and logs.
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
        /// Client port; node i listens on 127.0.B.(10+i):port, Raft on port+1.
        #[arg(long, default_value_t = 2181, value_parser = clap::value_parser!(u16).range(1024..=65533))]
        port: u16,
        /// Address block B (default: the lowest no other cluster holds).
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=254))]
        block: Option<u8>,
        /// Linearizable reads (a read-index round before each read): the
        /// default, as in `drift test`; kept for older command lines.
        #[arg(long = "quorum-reads", conflicts_with = "local_reads")]
        quorum_reads: bool,
        /// Reads served from the node's own tree, as ZooKeeper serves them:
        /// faster, but a read may miss a write acknowledged elsewhere.
        #[arg(long = "local-reads")]
        local_reads: bool,
        /// Start each node with its fault hooks on; node i's admin endpoint
        /// is 127.0.B.(10+i):port+2 and the token is in <dir>/fault-token.
        #[arg(long = "fault-hooks")]
        fault_hooks: bool,
        /// Extra `key = value` lines for the cluster file (e.g. snapshot_distance = 50).
        #[arg(long = "set")]
        set: Vec<String>,
        /// Declare no table (by default the cluster has the table `events`:
        /// id UInt64, key String, value Int64, partitioned by intDiv(id, 1000)).
        #[arg(long = "no-table", conflicts_with = "table")]
        no_table: bool,
        /// Which table the cluster declares: `events`, or `inserts` (the
        /// insert-retry workload's: id UInt64, p UInt64, tag String,
        /// partitioned by p), to drive the workload's client by hand.
        #[arg(long, value_enum, default_value_t = TableArg::Events)]
        table: TableArg,
        /// Who holds the table: drift's own nodes, or one real ClickHouse
        /// server per node (`clickhouse-server` on the PATH or
        /// `--clickhouse-bin`) replicating a ReplicatedMergeTree through the
        /// coordinator (its HTTP on --http-port, native port 9000).
        #[arg(long = "target", value_enum, default_value_t = ClusterTarget::Drift)]
        target: ClusterTarget,
        /// The ClickHouse server executable of `--target clickhouse`.
        #[arg(long = "clickhouse-bin")]
        clickhouse_bin: Option<PathBuf>,
        /// A setting of the table, `key = value` (repeatable), e.g.
        /// `replicated_deduplication_window = 5`.
        #[arg(long = "table-setting")]
        table_settings: Vec<String>,
        /// How many nodes (1..=N) hold a replica of the table (default: all);
        /// the others run the keeper only.
        #[arg(long = "table-replicas")]
        table_replicas: Option<u64>,
        /// The table's HTTP port on every node's address (ClickHouse's 8123).
        #[arg(long = "http-port", default_value_t = 8123, value_parser = clap::value_parser!(u16).range(1024..))]
        http_port: u16,
        /// Where replicas fetch parts from each other (ClickHouse's 9009).
        #[arg(long = "interserver-port", default_value_t = 9009, value_parser = clap::value_parser!(u16).range(1024..))]
        interserver_port: u16,
        /// What coordinates the table: the nodes' own keeper, or an Apache
        /// ZooKeeper ensemble on the same client addresses (a baseline; the
        /// nodes then run their tables only).
        #[arg(long, value_enum, default_value_t = CoordinatorArg::Keeper)]
        coordinator: CoordinatorArg,
        /// Run no kv service (by default every node serves the kv service:
        /// leaderless LWW replicas, RF 3 or the node count if smaller).
        #[arg(long = "no-kv")]
        no_kv: bool,
        /// The kv service's HTTP port on every node's address.
        #[arg(long = "kv-port", default_value_t = 8124, value_parser = clap::value_parser!(u16).range(1024..))]
        kv_port: u16,
        /// A setting of the kv service, `key = value` (repeatable), e.g.
        /// `gc_grace_ms = 2000` (see `nodes/node/src/config.rs`).
        #[arg(long = "kv-setting")]
        kv_settings: Vec<String>,
    },
    /// Stop one node of the cluster (SIGTERM, then SIGKILL).
    Stop {
        /// The cluster's directory (as given to `drift cluster up`).
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
        /// The node's id.
        #[arg(long)]
        node: u64,
    },
    /// Start one stopped node of the cluster again.
    Start {
        /// The cluster's directory (as given to `drift cluster up`).
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
        /// The node's id.
        #[arg(long)]
        node: u64,
    },
    /// Stop one node, then start it again.
    Restart {
        /// The cluster's directory (as given to `drift cluster up`).
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
        /// The node's id.
        #[arg(long)]
        node: u64,
    },
    /// Holds a cluster's address block from `up` to `down` (started by
    /// `up`, servers running or not); exits once the cluster file is gone.
    #[command(hide = true)]
    Hold {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Print the cluster's addresses as shell variables, for
    /// `eval "$(drift cluster env)"`: DRIFT_CONNECT (the connect string),
    /// DRIFT_DIR, and per node i DRIFT_HOST_i, DRIFT_CLIENT_i,
    /// DRIFT_ADMIN_PORT_i (with fault hooks), DRIFT_TABLE_i, DRIFT_KV_i and
    /// DRIFT_CLICKHOUSE_i (URLs), for whatever address block it got.
    Env {
        /// The cluster's directory (as given to `drift cluster up`).
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
    },
    /// Show each node's role, zxid and digest.
    Status {
        /// The cluster's directory (as given to `drift cluster up`).
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
    },
    /// Stop the cluster's nodes (SIGTERM, then SIGKILL) and give up its address block.
    Down {
        /// The cluster's directory (as given to `drift cluster up`).
        #[arg(long, default_value = "drift-cluster")]
        dir: PathBuf,
    },
}
