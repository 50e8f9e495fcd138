//! The cluster file `drift node --config cluster.toml --id N` reads.
//!
//! ```toml
//! data_dir = "/var/lib/drift"      # node N uses <data_dir>/node-N
//! tick_ms = 50
//! snapshot_distance = 100000       # as ClickHouse Keeper; ZooKeeper snapCount is 100000 too
//! reserved_log_items = 10000
//! rotate_interval = 100000
//! log_cache_bytes = 33554432       # newest log entries held in memory; older ones are read from disk
//! log_reserve_bytes = 1048576      # zeros written ahead of the log's end at a time (0: none)
//! log_sync = "deferred"            # deferred (a sync thread; the loop goes on) | inline (the loop waits)
//! quorum_reads = false
//! witness_blocks = false           # log every block id's creation and removal (campaigns' dedup witness)
//! digest = "incremental"           # off | incremental | full
//! session_timeout_min_ms = 1000
//! session_timeout_max_ms = 30000
//! secret = "<64 hex digits>"       # the peers' shared key (required)
//!
//! keeper = true                   # false: tables only, coordinated by `coordinator`
//! coordinator = "127.0.0.11:2181"  # ZooKeeper connect string (default: the peers' client addresses)
//!
//! [[peer]]
//! id = 1
//! raft = "127.0.0.11:7001"
//! client = "127.0.0.11:2181"
//! http = "127.0.0.11:8123"         # the table's HTTP interface (needed with tables)
//! interserver = "127.0.0.11:9009"  # where replicas fetch parts from it
//!
//! kv = "127.0.0.11:8125"          # the kv service's HTTP interface (needed with [kv])
//!
//! [kv]                             # leaderless LWW key/value replicas on the peers with `kv`
//! rf = 3                           # replicas per key
//! w = 2                            # acks a write waits for (default a majority of rf)
//! r = 2                            # replies a read waits for (default a majority of rf)
//! gc = "time"                      # time | repair (purge only what every replica saw repaired)
//! gc_grace_ms = 10000
//! gc_interval_ms = 1000
//! repair_interval_ms = 5000        # 0: repair only when asked (`drift repair`)
//! tree_depth = 10                  # Merkle tree depth per range
//!
//! [[table]]                        # a replicated table on every peer
//! name = "events"
//! columns = "id UInt64, key String, value Int64"
//! partition_by = "intDiv(id, 1000)"  # a column, intDiv(column, N) or tuple()
//! order_by = "id"                    # a column or (a, b, …)
//! [table.settings]                   # see drift_table::TableSettings
//! replicated_deduplication_window = 1000
//! ```
//!
//! Every error names the file and what is wrong; unknown keys are errors
//! (a typo must not silently change a knob).
//!
//! `secret` authenticates peers to each other (see `peer_auth`): it is
//! what a node must hold to open a Raft connection, so the file is the
//! secret's only home — never a command line — and should be readable by
//! the nodes' user alone (`drift cluster up` and campaigns write it 0600
//! with a fresh 256-bit secret).

use crate::error::ConfigError;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    pub id: u64,
    /// Address peers reach this node's Raft transport at (it binds here).
    pub raft: SocketAddr,
    /// Address ZooKeeper clients connect to.
    pub client: SocketAddr,
    /// The tables' HTTP interface.
    #[serde(default)]
    pub http: Option<SocketAddr>,
    /// Where other replicas fetch this one's parts.
    #[serde(default)]
    pub interserver: Option<SocketAddr>,
    /// The kv service's HTTP interface (clients, replicas and repair).
    #[serde(default)]
    pub kv: Option<SocketAddr>,
}

/// The kv service, as the cluster file's `[kv]` declares it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvDecl {
    #[serde(default = "d_rf")]
    pub rf: usize,
    #[serde(default)]
    pub w: Option<usize>,
    #[serde(default)]
    pub r: Option<usize>,
    #[serde(default = "d_gc")]
    pub gc: String,
    #[serde(default = "d_gc_grace")]
    pub gc_grace_ms: u64,
    #[serde(default = "d_gc_interval")]
    pub gc_interval_ms: u64,
    #[serde(default = "d_repair_interval")]
    pub repair_interval_ms: u64,
    #[serde(default = "d_tree_depth")]
    pub tree_depth: u32,
    /// How long a coordinator waits for its replicas.
    #[serde(default = "d_kv_timeout")]
    pub request_timeout_ms: u64,
}

fn d_rf() -> usize {
    3
}
fn d_gc() -> String {
    "time".into()
}
fn d_gc_grace() -> u64 {
    10_000
}
fn d_gc_interval() -> u64 {
    1_000
}
fn d_repair_interval() -> u64 {
    5_000
}
fn d_tree_depth() -> u32 {
    10
}
fn d_kv_timeout() -> u64 {
    1_000
}

impl KvDecl {
    /// Acks a write waits for.
    pub fn w(&self) -> usize {
        self.w.unwrap_or(self.rf / 2 + 1)
    }

    /// Replies a read waits for.
    pub fn r(&self) -> usize {
        self.r.unwrap_or(self.rf / 2 + 1)
    }

    fn validate(&self, servers: usize) -> Result<(), String> {
        if !(1..=servers).contains(&self.rf) {
            return Err(format!(
                "[kv] rf = {}: must be between 1 and the {servers} peers with `kv`",
                self.rf
            ));
        }
        for (name, v) in [("w", self.w()), ("r", self.r())] {
            if !(1..=self.rf).contains(&v) {
                return Err(format!("[kv] {name} = {v}: must be between 1 and rf ({})", self.rf));
            }
        }
        if self.gc != "time" && self.gc != "repair" {
            return Err(format!("[kv] gc = {:?}: expected time or repair", self.gc));
        }
        if !(1..=drift_repair::tree::TREE_DEPTH_MAX).contains(&self.tree_depth) {
            return Err(format!(
                "[kv] tree_depth {} outside 1..={}",
                self.tree_depth,
                drift_repair::tree::TREE_DEPTH_MAX
            ));
        }
        if self.gc_interval_ms == 0 || !(10..=600_000).contains(&self.request_timeout_ms) {
            return Err("[kv] gc_interval_ms must be positive and request_timeout_ms in 10..=600000".into());
        }
        Ok(())
    }
}

/// A replicated table as the cluster file declares it (parsed into a
/// schema by `crate::table::decl`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableDecl {
    pub name: String,
    /// `name Type, …` with Type UInt64, Int64 or String.
    pub columns: String,
    #[serde(default)]
    pub partition_by: Option<String>,
    #[serde(default)]
    pub order_by: Option<String>,
    #[serde(default)]
    pub settings: TableSettingsDecl,
}

/// Table settings, ClickHouse's names; absent ones take the defaults of
/// `drift_table::TableSettings`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSettingsDecl {
    pub replicated_deduplication_window: Option<u64>,
    pub replicated_deduplication_window_seconds: Option<u64>,
    pub cleanup_delay_period_ms: Option<u64>,
    pub min_replicated_logs_to_keep: Option<u64>,
    pub max_replicated_logs_to_keep: Option<u64>,
    pub max_parts_to_merge_at_once: Option<usize>,
    pub parts_to_merge_min: Option<usize>,
    pub fetch_pool_size: Option<usize>,
    pub merge_pool_size: Option<usize>,
    pub merge_selecting_period_ms: Option<u64>,
    pub zookeeper_path: Option<String>,
    /// A benchmark baseline: check the block id, take the lock and commit
    /// in three round trips instead of two.
    pub naive_insert_path: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub data_dir: PathBuf,
    #[serde(default = "d_tick")]
    pub tick_ms: u64,
    #[serde(default = "d_election_ticks")]
    pub election_ticks: usize,
    #[serde(default = "d_snapshot_distance")]
    pub snapshot_distance: u64,
    #[serde(default = "d_reserved")]
    pub reserved_log_items: u64,
    #[serde(default = "d_rotate")]
    pub rotate_interval: u64,
    /// Bytes of the newest Raft log entries held in memory.
    #[serde(default = "d_log_cache")]
    pub log_cache_bytes: usize,
    /// Room written ahead of the changelog's end at a time, so a sync
    /// after an append need not write the file's new block map.
    #[serde(default = "d_log_reserve")]
    pub log_reserve_bytes: u64,
    /// Who syncs the log's new entries.
    #[serde(default)]
    pub log_sync: LogSync,
    #[serde(default)]
    pub quorum_reads: bool,
    /// Log every creation and removal of a table's block id (a znode
    /// under a `blocks` node) as it is applied: the witness an
    /// insert-retry campaign's dedup checker judges by.
    #[serde(default)]
    pub witness_blocks: bool,
    #[serde(default = "d_digest")]
    pub digest: String,
    #[serde(default = "d_min_timeout")]
    pub session_timeout_min_ms: u64,
    /// Also how long a write to a client may stall: a client that takes
    /// no bytes for that long is let go, and what was queued for it dropped.
    #[serde(default = "d_max_timeout")]
    pub session_timeout_max_ms: u64,
    /// Seed for the election jitter. The session passwords are keyed by
    /// a value drawn from `secret` instead ([`ClusterConfig::server_config`]),
    /// so no client can compute one from this file's seed, nor from its
    /// default 0.
    #[serde(default)]
    pub seed: u64,
    /// The peers' shared key, hex (at least 32 digits).
    pub secret: String,
    /// Whether nodes run the keeper (false: tables only, coordinated by
    /// `coordinator`, e.g. an Apache ZooKeeper ensemble on the peers'
    /// client addresses).
    #[serde(default = "d_true")]
    pub keeper: bool,
    /// The tables' ZooKeeper connect string; default: every peer's client
    /// address.
    #[serde(default)]
    pub coordinator: Option<String>,
    /// The tables' coordinator session timeout: how long a replica cut off
    /// from the coordinator keeps its session (and its locks).
    #[serde(default = "d_table_session")]
    pub table_session_timeout_ms: u64,
    #[serde(rename = "peer")]
    pub peers: Vec<Peer>,
    #[serde(rename = "table", default)]
    pub tables: Vec<TableDecl>,
    /// The kv service on the peers with a `kv` address.
    #[serde(default)]
    pub kv: Option<KvDecl>,
}

/// Who syncs a keeper's log entries to disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogSync {
    /// A sync thread: the server's loop writes the entries and goes on
    /// taking requests and peer messages while the disk syncs them; one
    /// sync covers every entry written before it began, and what must
    /// wait for them to be durable (acknowledgements, votes) waits for it.
    #[default]
    Deferred,
    /// The loop itself, before it goes on.
    Inline,
}

fn d_table_session() -> u64 {
    6_000
}

fn d_true() -> bool {
    true
}

fn d_tick() -> u64 {
    50
}
fn d_election_ticks() -> usize {
    10
}
fn d_snapshot_distance() -> u64 {
    100_000
}
fn d_reserved() -> u64 {
    10_000
}
fn d_rotate() -> u64 {
    100_000
}
fn d_log_cache() -> usize {
    drift_keeper::changelog::CACHE_BYTES_DEFAULT
}
/// The most room `log_reserve_bytes` may ask for at a time (the next
/// sync writes it all).
const LOG_RESERVE_BYTES_MAX: u64 = 64 << 20;
fn d_log_reserve() -> u64 {
    drift_keeper::changelog::RESERVE_BYTES_DEFAULT
}
fn d_digest() -> String {
    "incremental".into()
}
fn d_min_timeout() -> u64 {
    1_000
}
fn d_max_timeout() -> u64 {
    30_000
}

/// Most peers in a cluster: Raft's quorum work grows with it and nobody
/// runs a coordination service wider than this.
pub const PEERS_MAX: usize = 15;

impl ClusterConfig {
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| ConfigError::In {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    pub fn parse(text: &str) -> Result<ClusterConfig, ConfigError> {
        let c: ClusterConfig = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate().map_err(ConfigError::Invalid)?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), String> {
        if self.peers.is_empty() || self.peers.len() > PEERS_MAX {
            return Err(format!(
                "needs 1..={PEERS_MAX} [[peer]] entries, has {}",
                self.peers.len()
            ));
        }
        let ids: BTreeSet<u64> = self.peers.iter().map(|p| p.id).collect();
        if ids.len() != self.peers.len() || ids.contains(&0) {
            return Err("peer ids must be distinct and non-zero".into());
        }
        if let Some(p) = self.peers.iter().find(|p| p.raft.port() == 0 || p.client.port() == 0) {
            return Err(format!(
                "peer {}: port 0 is not an address peers or clients can reach (give each node its port)",
                p.id
            ));
        }
        crate::peer_auth::parse_secret(&self.secret)?;
        let addrs: BTreeSet<SocketAddr> = self.peers.iter().flat_map(|p| [p.raft, p.client]).collect();
        if addrs.len() != 2 * self.peers.len() {
            return Err("every raft and client address must be distinct".into());
        }
        if !(5..=10_000).contains(&self.tick_ms) {
            return Err(format!("tick_ms {} outside 5..=10000", self.tick_ms));
        }
        if self.election_ticks < 3 {
            return Err("election_ticks must be at least 3".into());
        }
        if self.snapshot_distance == 0 || self.rotate_interval == 0 {
            return Err("snapshot_distance and rotate_interval must be positive".into());
        }
        if self.log_reserve_bytes > LOG_RESERVE_BYTES_MAX {
            return Err(format!(
                "log_reserve_bytes {} over {LOG_RESERVE_BYTES_MAX}",
                self.log_reserve_bytes
            ));
        }
        if drift_keeper::DigestMode::parse(&self.digest).is_none() {
            return Err(format!("digest = {:?}: expected off, incremental or full", self.digest));
        }
        if self.session_timeout_min_ms == 0 || self.session_timeout_min_ms > self.session_timeout_max_ms {
            return Err("session timeouts: need 0 < min <= max".into());
        }
        if !self.tables.is_empty() {
            // peers with `http` and `interserver` hold a replica of every table
            let mut replicas = 0;
            for p in &self.peers {
                match (p.http, p.interserver) {
                    (Some(http), Some(inter)) if http.port() != 0 && inter.port() != 0 => replicas += 1,
                    (None, None) => {}
                    _ => {
                        return Err(format!(
                            "peer {}: a replica needs both `http` and `interserver`, with ports",
                            p.id
                        ))
                    }
                }
            }
            if replicas == 0 {
                return Err("tables are declared but no peer has `http` and `interserver`".into());
            }
            let all: Vec<SocketAddr> = self
                .peers
                .iter()
                .flat_map(|p| [Some(p.raft), Some(p.client), p.http, p.interserver])
                .flatten()
                .collect();
            if all.iter().collect::<BTreeSet<_>>().len() != all.len() {
                return Err("every raft, client, http and interserver address must be distinct".into());
            }
            let mut names = BTreeSet::new();
            for t in &self.tables {
                if !names.insert(t.name.as_str()) {
                    return Err(format!("table {} declared twice", t.name));
                }
            }
        }
        let kv_servers = self.peers.iter().filter(|p| p.kv.is_some()).count();
        match &self.kv {
            Some(kv) => kv.validate(kv_servers)?,
            None if kv_servers > 0 => return Err("peers have `kv` addresses but there is no [kv] section".into()),
            None => {}
        }
        if let Some(p) = self.peers.iter().find(|p| p.kv.is_some_and(|a| a.port() == 0)) {
            return Err(format!("peer {}: kv port 0 is not an address others can reach", p.id));
        }
        let every: Vec<SocketAddr> = self
            .peers
            .iter()
            .flat_map(|p| [Some(p.raft), Some(p.client), p.http, p.interserver, p.kv])
            .flatten()
            .collect();
        if every.iter().collect::<BTreeSet<_>>().len() != every.len() {
            return Err("every raft, client, http, interserver and kv address must be distinct".into());
        }
        if !(1_000..=600_000).contains(&self.table_session_timeout_ms) {
            return Err(format!(
                "table_session_timeout_ms {} outside 1000..=600000",
                self.table_session_timeout_ms
            ));
        }
        if let Some(c) = &self.coordinator {
            if c.split(',').any(|a| a.trim().parse::<SocketAddr>().is_err()) {
                return Err(format!("coordinator = {c:?}: expected host:port,host:port,…"));
            }
        }
        Ok(())
    }

    /// The secret's bytes (validated when loaded).
    pub fn secret_bytes(&self) -> Vec<u8> {
        crate::peer_auth::parse_secret(&self.secret).expect("validated")
    }

    /// 128 bits the cluster secret gives every node alike and no client
    /// can compute: they key the session passwords.
    fn session_key(&self) -> (u64, u64) {
        let mac = crate::peer_auth::hmac_sha256(&self.secret_bytes(), &[b"drift-keeper-session-key-v1"]);
        let half = |i: usize| u64::from_be_bytes(mac[i..i + 8].try_into().expect("a MAC is 32 bytes"));
        (half(0), half(8))
    }

    pub fn peer(&self, id: u64) -> Option<&Peer> {
        self.peers.iter().find(|p| p.id == id)
    }

    pub fn digest_mode(&self) -> drift_keeper::DigestMode {
        drift_keeper::DigestMode::parse(&self.digest).expect("validated")
    }

    /// What the keeper server `id` needs of this file.
    pub fn server_config(
        &self,
        id: u64,
        bootstrap: bool,
        fault_token: Option<String>,
    ) -> drift_keeper::server::ServerConfig {
        drift_keeper::server::ServerConfig {
            id,
            members: self
                .peers
                .iter()
                .map(|p| drift_keeper::server::Member {
                    id: p.id,
                    raft: p.raft,
                    client: p.client,
                })
                .collect(),
            tick_ms: self.tick_ms,
            election_ticks: self.election_ticks,
            snapshot_distance: self.snapshot_distance,
            reserved_log_items: self.reserved_log_items,
            log_cache_bytes: self.log_cache_bytes,
            log_reserve_bytes: self.log_reserve_bytes,
            rotate_interval: self.rotate_interval,
            quorum_reads: self.quorum_reads,
            shared_read_rounds: false,
            witness_blocks: self.witness_blocks,
            digest: self.digest_mode(),
            session_timeout_min_ms: self.session_timeout_min_ms,
            session_timeout_max_ms: self.session_timeout_max_ms,
            seed: self.seed,
            session_key: self.session_key(),
            bootstrap,
            fault_token,
            snapshots: drift_keeper::snapshot::Config::default(),
            deferred_log_sync: self.log_sync == LogSync::Deferred,
        }
    }

    pub fn node_dir(&self, id: u64) -> PathBuf {
        self.data_dir.join(format!("node-{id}"))
    }

    /// The tables' HTTP interfaces, `http://addr/`, one per replica.
    pub fn table_urls(&self) -> Vec<String> {
        self.peers
            .iter()
            .filter_map(|p| p.http)
            .map(|a| format!("http://{a}/"))
            .collect()
    }

    /// Where the tables' coordinator is.
    pub fn coordinator(&self) -> String {
        self.coordinator.clone().unwrap_or_else(|| self.connect_string())
    }

    /// The ZooKeeper connect string of the cluster.
    pub fn connect_string(&self) -> String {
        self.peers
            .iter()
            .map(|p| p.client.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
data_dir = "/tmp/x"
secret = "000102030405060708090a0b0c0d0e0f"
[[peer]]
id = 1
raft = "127.0.0.11:7001"
client = "127.0.0.11:2181"
[[peer]]
id = 2
raft = "127.0.0.12:7001"
client = "127.0.0.12:2181"
"#;

    #[test]
    fn parses_with_defaults() {
        let c = ClusterConfig::parse(GOOD).unwrap();
        assert_eq!((c.tick_ms, c.peers.len(), c.digest.as_str()), (50, 2, "incremental"));
        assert_eq!(c.connect_string(), "127.0.0.11:2181,127.0.0.12:2181");
        assert_eq!(c.log_sync, LogSync::Deferred);
        assert!(c.server_config(1, true, None).deferred_log_sync);
        let inline = ClusterConfig::parse(&format!("log_sync = \"inline\"\n{GOOD}")).unwrap();
        assert!(!inline.server_config(1, true, None).deferred_log_sync);
    }

    /// The session key: every node of a cluster must get the same one (a
    /// client moves between servers with its password), it must come from
    /// the secret, not from the file's seed (0 unless set, and readable by
    /// whoever can read the config), and the seed stays the file's, so one
    /// configuration elects the same first leader on every start.
    #[test]
    fn the_session_key_comes_from_the_secret_and_the_seed_from_the_file() {
        let c = ClusterConfig::parse(GOOD).unwrap();
        let key = c.server_config(1, true, None).session_key;
        assert_eq!(c.server_config(2, false, None).session_key, key, "nodes of one cluster");
        assert_ne!(key, (c.seed, 0), "the file's seed");
        let other = ClusterConfig::parse(&GOOD.replace("0e0f", "0e10")).unwrap();
        assert_ne!(other.server_config(1, true, None).session_key, key, "another secret");
        let seeded = ClusterConfig::parse(&format!("seed = 7\n{GOOD}")).unwrap();
        assert_eq!(
            seeded.server_config(1, true, None).session_key,
            key,
            "the file's seed plays no part"
        );
        assert_eq!(
            seeded.server_config(2, true, None).seed,
            7,
            "the jitter's seed is the file's"
        );
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        assert!(ClusterConfig::parse(&format!("{GOOD}\nbogus = 1"))
            .unwrap_err()
            .to_string()
            .contains("bogus"));
        assert!(ClusterConfig::parse(&GOOD.replace("id = 2", "id = 1"))
            .unwrap_err()
            .to_string()
            .contains("distinct"));
        assert!(ClusterConfig::parse(&format!("digest = \"sometimes\"\n{GOOD}"))
            .unwrap_err()
            .to_string()
            .contains("digest"));
        let e = ClusterConfig::parse(&format!("log_reserve_bytes = 67108865\n{GOOD}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("log_reserve_bytes 67108865 over 67108864"), "{e}");
        assert_eq!(
            ClusterConfig::parse(&format!("log_reserve_bytes = 0\n{GOOD}"))
                .unwrap()
                .server_config(1, true, None)
                .log_reserve_bytes,
            0
        );
        let e = ClusterConfig::parse(&format!("log_sync = \"later\"\n{GOOD}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("later") && e.contains("deferred") && e.contains("inline"),
            "{e}"
        );
        assert!(ClusterConfig::parse("data_dir = 3").is_err());
        assert!(ClusterConfig::parse(&GOOD.replace("127.0.0.12:2181", "127.0.0.12:0"))
            .unwrap_err()
            .to_string()
            .contains("port 0"));
        assert!(ClusterConfig::parse(&GOOD.replace("secret = ", "# "))
            .unwrap_err()
            .to_string()
            .contains("secret"));
        assert!(ClusterConfig::parse(&GOOD.replace("0e0f", ""))
            .unwrap_err()
            .to_string()
            .contains("too short"));
    }
}
