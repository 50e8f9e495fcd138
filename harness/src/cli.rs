//! The command line as clap parses it: options with a fixed set of values
//! are enums (`--help` lists them, clap refuses others), numbers carry
//! their bounds. What needs more than a type (paths exist, combinations
//! make sense) is checked by the command that uses them.

use crate::nemesis::{FaultKind, PartitionerMode};
use crate::plan::{self, Defect, DigestMode, Target};
use clap::{Args, Parser, Subcommand, ValueEnum};
use drift_checkers::linear::model::ModelKind;
use drift_checkers::registry::CheckerKind;
use drift_workloads::WorkloadKind;
use std::path::PathBuf;

/// A `--nemesis` value: a fault, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NemesisArg(pub Option<FaultKind>);

impl NemesisArg {
    pub fn fault(self) -> Option<FaultKind> {
        self.0
    }
}

impl ValueEnum for NemesisArg {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: std::sync::OnceLock<Vec<NemesisArg>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            std::iter::once(NemesisArg(None))
                .chain(FaultKind::value_variants().iter().map(|k| NemesisArg(Some(*k))))
                .collect()
        })
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self.0 {
            None => Some(clap::builder::PossibleValue::new("none")),
            Some(k) => k.to_possible_value(),
        }
    }
}

/// `--init`: a JSON value.
fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON ({e}); a string needs its quotes: '\"\"'"))
}

/// A finite number in `lo..=hi` (`lo` itself excluded when `open`).
fn f64_within(s: &str, lo: f64, hi: f64, open: bool) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    let above = if open { v > lo } else { v >= lo };
    if !v.is_finite() || !above || v > hi {
        let from = if open {
            format!("more than {lo}")
        } else {
            format!("at least {lo}")
        };
        return Err(format!("must be {from} and at most {hi}"));
    }
    Ok(v)
}

/// Longest time budget accepted, in seconds: a week (more is a typo).
pub const BUDGET_S_MAX: f64 = 7.0 * 86_400.0;

/// `--budget-s`: seconds, more than 0, at most a week.
fn parse_budget_s(s: &str) -> Result<f64, String> {
    f64_within(s, 0.0, BUDGET_S_MAX, true)
}

/// `--max-*` limits of compare: a percentage of at least 0.
fn parse_percent(s: &str) -> Result<f64, String> {
    f64_within(s, 0.0, 1e9, false)
}

/// A fraction: 0 to 1.
fn parse_fraction(s: &str) -> Result<f64, String> {
    f64_within(s, 0.0, 1.0, false)
}

/// `drift bench table --seconds`: a cell's length.
fn parse_cell_seconds(s: &str) -> Result<f64, String> {
    f64_within(s, 0.5, 600.0, false)
}

/// A count of at least 1.
fn usize_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number")),
    }
}

/// `--rate`: operations per second, a finite number in bounds.
fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !v.is_finite() || !(plan::RATE_MIN..=plan::RATE_MAX).contains(&v) {
        return Err(format!("must be in {}..={}", plan::RATE_MIN, plan::RATE_MAX));
    }
    Ok(v)
}

#[derive(Parser, Debug)]
#[command(
    name = "drift",
    version,
    about = "Jepsen-style consistency testing and benchmarks for replicated systems",
    long_about = None,
    after_help = "Exit codes: 0 valid, 1 invalid, 2 unknown (a checker ran out of budget), 3 the run itself failed (bad input, bad arguments, setup)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a campaign: deploy a cluster, drive a workload under faults, check the history.
    Test(TestArgs),
    /// Check a recorded history (JSON Lines or Jepsen EDN, or a run directory).
    Check(CheckArgs),
    /// Convert a history (Jepsen's history.edn, or JSON Lines) to drift's JSON Lines.
    Convert(ConvertArgs),
    /// Run a stored run again with its seed and nemesis schedule.
    Replay(ReplayArgs),
    /// Compare stored runs: versions, config, verdicts, and throughput and latency per op and fault window.
    Compare(CompareArgs),
    /// Benchmarks: checker, repair, keeper, harness, table, sim.
    Bench(BenchArgs),
    /// Serve the result store over HTTP: runs, verdicts, reports, comparisons.
    Serve(ServeArgs),
    /// Run one node of the replicated stack.
    Node(NodeArgs),
    /// Run a local cluster to play with: up, env, status, stop, start, restart, down.
    Cluster(ClusterArgs),
    /// Run kv repair sessions now on a running cluster and print their reports.
    Repair(RepairArgs),
    /// Build the Docker image of this (statically linked) drift, for `--backend docker`.
    BuildImage,
    /// Sweep seeds of a simulated campaign (`--backend sim`): print the
    /// failing seeds, store each failing run, say how to replay it.
    Sim(SimArgs),
}

#[derive(Args, Debug)]
pub struct BenchSimArgs {
    /// Seeds to run, from `--from`.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// The campaign each seed runs (`--backend` is sim).
    #[command(flatten)]
    pub test: TestArgs,
}

#[derive(Args, Debug)]
pub struct SimArgs {
    /// How many seeds.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Vary the world per seed: which faults, how often, message loss,
    /// duplication, reordering and delays, clock drift, torn writes.
    #[arg(long)]
    pub swarm: bool,
    /// Seeds run at once (each simulation is one thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub jobs: u64,
    /// Stop after this many failing seeds (0: never).
    #[arg(long, default_value_t = 0)]
    pub stop_after: u64,
    /// Failing seeds stored as runs, with the full report (the lowest
    /// seeds); the others are listed with the command that runs them
    /// again.
    #[arg(long, default_value_t = 10)]
    pub keep: u64,
    /// The campaign each seed runs (`--backend` is sim, `--seed` is set
    /// per run).
    #[command(flatten)]
    pub test: TestArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Each listed server (default: every kv server) repairs the ranges it is the primary of with their other replicas, one session per range and peer; with --rounds 2 every replica of a range holds the range's newest versions afterwards. Exit codes: 0 every session completed, 1 a session failed, 3 no server could be asked (a bad cluster directory, a server down)."
)]
pub struct RepairArgs {
    /// The cluster's directory (as given to `drift cluster up`).
    #[arg(long, default_value = "drift-cluster")]
    pub dir: PathBuf,
    /// Only this range (0-based; range j's primary is the j-th server).
    #[arg(long)]
    pub range: Option<usize>,
    /// Only these servers start sessions (repeat or comma-separate).
    #[arg(long = "nodes", value_delimiter = ',')]
    pub nodes: Vec<u64>,
    /// How many times over (each round repairs every range once with each peer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10))]
    pub rounds: u64,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Root of the result store.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Address to listen on; port 0 takes a free one (the first line
    /// printed says which). Loopback by default: anyone who can reach the
    /// address can read every stored run.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Exit codes: 0 no run is worse than the baseline, 1 a checker turned invalid or a --max-* limit was crossed, 2 a checker turned unknown, 3 the comparison itself failed (a missing or corrupt file)."
)]
pub struct CompareArgs {
    /// The baseline, then the runs to compare with it: run directories
    /// (`store/latest` works), or a test directory for its newest run. A
    /// test directory alone compares its two newest runs.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
    /// Worse (exit 1) when an op's succeeded-ops throughput fell by more
    /// than this many percent against the baseline.
    #[arg(long = "max-throughput-drop", value_name = "PERCENT", value_parser = parse_percent)]
    pub max_throughput_drop: Option<f64>,
    /// Worse (exit 1) when an op's p99 latency rose by more than this many
    /// percent against the baseline.
    #[arg(long = "max-p99-rise", value_name = "PERCENT", value_parser = parse_percent)]
    pub max_p99_rise: Option<f64>,
    /// The --max-* limits judge only ops with at least this many
    /// successes in both runs (fewer say little about a rate or a p99).
    #[arg(long = "min-ops", default_value_t = 50)]
    pub min_ops: u64,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A run directory of `drift test`.
    pub run: PathBuf,
    /// Write the verdict as JUnit XML to FILE too (a test case per checker).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Reads are linearizable by default (a read-index round on drift, a sync first on ZooKeeper); with --local-reads a server answers from its own tree, and stale reads under partitions are expected findings of the linearizability checker."
)]
pub struct TestArgs {
    /// What the clients do: CAS registers, unique ids, a counter, a queue,
    /// ephemeral znodes (all through the ZooKeeper protocol), inserts into
    /// the replicated table retried under faults, or puts and deletes on
    /// the kv service.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Register)]
    pub workload: WorkloadKind,
    /// The system under test: drift (its own keeper), zookeeper (Apache
    /// ZooKeeper 3.8 from Debian's `zookeeper` package, as a baseline), or
    /// clickhouse (real ClickHouse servers replicating through drift's
    /// keeper or ZooKeeper; insert-retry only).
    #[arg(long, value_enum, default_value_t = Target::Drift)]
    pub target: Target,
    /// Servers in the cluster (server i binds 127.0.B.(10+i)).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=plan::NODES_MAX))]
    pub nodes: u64,
    /// Keys of the register workload.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=plan::KEYS_MAX as i64))]
    pub keys: u32,
    /// Concurrent client processes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=plan::CONCURRENCY_MAX))]
    pub concurrency: u64,
    /// Total operations per second across all clients.
    #[arg(long, default_value_t = 100.0, value_parser = parse_rate)]
    pub rate: f64,
    /// Seconds of the main phase.
    #[arg(long = "time-limit", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=plan::TIME_LIMIT_MAX_S))]
    pub time_limit: u64,
    /// Faults, comma-separated (or none).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kill,partition")]
    pub nemesis: Vec<NemesisArg>,
    /// Seconds between faults (each lasts half of it).
    #[arg(long = "nemesis-interval", default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=plan::TIME_LIMIT_MAX_S))]
    pub nemesis_interval: u64,
    /// How partitions cut links: auto (iptables as root, else per-link
    /// proxies), iptables, or proxies.
    #[arg(long, value_enum, default_value_t = PartitionerMode::Auto)]
    pub partitioner: PartitionerMode,
    /// Where the servers run: local processes; Docker containers on a
    /// network of the run's own (partitions then cut inside each
    /// container; drift must be statically linked: see `drift build-image`);
    /// hosts over SSH (`--hosts`); or simulated in one thread (`sim`:
    /// deterministic, the seed replays it exactly).
    #[arg(long, value_enum, default_value_t = plan::BackendKind::Local)]
    pub backend: plan::BackendKind,
    /// The hosts file of `--backend ssh` (see README, "On your own hosts").
    #[arg(long)]
    pub hosts: Option<PathBuf>,
    /// Who coordinates the ClickHouse servers of `--target clickhouse`:
    /// drift's keeper nodes (the default) or an Apache ZooKeeper ensemble.
    #[arg(long, value_enum)]
    pub coordinator: Option<plan::Coordinator>,
    /// The ClickHouse server executable of `--target clickhouse` (default:
    /// `clickhouse-server` on the PATH).
    #[arg(long = "clickhouse-bin")]
    pub clickhouse_bin: Option<PathBuf>,
    /// A bug planted in the simulated servers (`--backend sim` only; to
    /// show the simulator finds it). Repeatable.
    #[arg(long, value_enum)]
    pub plant: Vec<plan::PlantedBug>,
    /// Seed of every random choice (default: random, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Linearizable reads: the default (kept for older command lines).
    #[arg(long = "quorum-reads", conflicts_with = "local_reads")]
    pub quorum_reads: bool,
    /// Reads served from the server's own tree, as ZooKeeper serves them:
    /// under a partition a stale read is then an expected finding.
    #[arg(long = "local-reads")]
    pub local_reads: bool,
    /// Keeper digest mode.
    #[arg(long, value_enum, default_value_t = DigestMode::Incremental)]
    pub digest: DigestMode,
    /// Client port of the servers (Raft port+1, admin port+2).
    #[arg(long, default_value_t = 2281, value_parser = clap::value_parser!(u16).range(plan::PORT_MIN as i64..=(u16::MAX - plan::PORTS_USED) as i64))]
    pub port: u16,
    /// Address block B: server i binds 127.0.B.(10+i) (default: the
    /// lowest block no other cluster on this machine holds).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=254))]
    pub block: Option<u8>,
    /// Client operation timeout; past it the op is recorded `info`.
    #[arg(long = "op-timeout-ms", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=plan::TIMEOUT_MAX_MS))]
    pub op_timeout_ms: u64,
    /// The clients' session timeout: a session not heard from this long
    /// expires (its ephemerals go; a table replica cut from its keeper
    /// goes read-only).
    #[arg(long = "session-timeout-ms", default_value_t = 4000, value_parser = clap::value_parser!(u64).range(1..=plan::TIMEOUT_MAX_MS))]
    pub session_timeout_ms: u64,
    /// Time budget of the checkers, in seconds.
    #[arg(long = "check-budget-s", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=plan::TIME_LIMIT_MAX_S))]
    pub check_budget_s: u64,
    /// insert-retry: block ids the table keeps for dedup
    /// (replicated_deduplication_window) [default: 100; ClickHouse's is 1000]
    #[arg(long = "dedup-window", value_parser = clap::value_parser!(u64).range(0..=plan::DEDUP_WINDOW_MAX))]
    pub dedup_window: Option<u64>,
    /// insert-retry: how old a block id may get, measured from the newest
    /// (replicated_deduplication_window_seconds) [default: 5; ClickHouse's is a week]
    #[arg(long = "dedup-window-seconds", value_parser = clap::value_parser!(u64).range(1..=plan::TIME_LIMIT_MAX_S))]
    pub dedup_window_seconds: Option<u64>,
    /// insert-retry: how often the table's leader drops old block ids and
    /// log entries (cleanup_delay_period) [default: 1000; ClickHouse's is 30 s]
    #[arg(long = "cleanup-period-ms", value_parser = clap::value_parser!(u64).range(10..=plan::TIMEOUT_MAX_MS))]
    pub cleanup_period_ms: Option<u64>,
    /// insert-retry: attempts a logical insert gets before the client gives up [default: 5]
    #[arg(long = "insert-attempts", value_parser = clap::value_parser!(u32).range(1..=plan::INSERT_ATTEMPTS_MAX as i64))]
    pub insert_attempts: Option<u32>,
    /// insert-retry: start every node with a test-only table defect (its
    /// fault hooks on), to prove the dedup checker finds it: skip-dedup
    /// and no-block-id duplicate retried blocks, lose-part acknowledges
    /// blocks whose rows it drops. delete: repair-overwrites makes repair
    /// write the peer's version over the local one instead of merging
    #[arg(long, value_enum)]
    pub defect: Option<Defect>,
    /// delete: how tombstones are collected: time (older than the grace;
    /// a replica not repaired within it may resurrect a key) or repair
    /// (only once every replica of the range was repaired) [default: time]
    #[arg(long = "kv-gc", value_enum)]
    pub kv_gc: Option<plan::KvGc>,
    /// delete: the tombstones' grace period, ms [default: 10000]
    #[arg(long = "gc-grace-ms", value_parser = clap::value_parser!(u64).range(0..=plan::TIMEOUT_MAX_MS))]
    pub gc_grace_ms: Option<u64>,
    /// delete: how often each server repairs the ranges it is the primary
    /// of, ms; 0: only the final repair [default: 2000]
    #[arg(long = "repair-interval-ms", value_parser = clap::value_parser!(u64).range(0..=plan::TIMEOUT_MAX_MS))]
    pub repair_interval_ms: Option<u64>,
    /// delete: acknowledgements a write waits for [default: a majority of RF = min(3, nodes)]
    #[arg(long = "kv-w", value_parser = clap::value_parser!(u64).range(1..=plan::NODES_MAX))]
    pub kv_w: Option<u64>,
    /// delete: replicas a read waits for [default: a majority of RF]
    #[arg(long = "kv-r", value_parser = clap::value_parser!(u64).range(1..=plan::NODES_MAX))]
    pub kv_r: Option<u64>,
    /// Root of the result store.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Write the verdict as JUnit XML to FILE too, for CI systems: a test
    /// case per checker, an invalid one failed with its why and the
    /// command that reproduces the run.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
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
    /// Exit when the parent process goes away (campaigns start nodes so).
    #[arg(long = "exit-with-parent")]
    pub exit_with_parent: bool,
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
pub type CoordinatorArg = plan::Coordinator;

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
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=plan::NODES_MAX))]
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

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The history to read: Jepsen EDN (by its `.edn` name or its first
    /// characters) or JSON Lines.
    pub input: PathBuf,
    /// Where to write the JSON Lines.
    pub output: PathBuf,
    /// Replace OUTPUT if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// A history (JSON Lines, or Jepsen's history.edn), or a run
    /// directory holding one.
    pub input: PathBuf,
    /// Checker to run; repeat or comma-separate for several. Default: the
    /// checkers that judged the run, else linearizable.
    #[arg(long = "checker", value_enum, value_delimiter = ',')]
    pub checkers: Vec<CheckerKind>,
    /// Model for the linearizable checker (default: the run's, else
    /// cas-register).
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// What every key holds before the first operation, as JSON. Default
    /// null: a register starts empty, a kv key absent. Knossos's
    /// `(cas-register 0)` is `--init 0`; Porcupine's key/value histories
    /// start every key at the empty string: `--init '""'`.
    #[arg(long, value_parser = parse_json)]
    pub init: Option<serde_json::Value>,
    /// Time budget for the whole check, in seconds; past it the verdict is unknown.
    #[arg(long = "budget-s", value_parser = parse_budget_s)]
    pub budget_s: Option<f64>,
    /// Memory cap for a search, in MiB; past it the verdict is unknown.
    #[arg(long = "mem-mb", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub mem_mb: u64,
    /// Threads the checkers may use (keys judged in parallel) [default: all cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub jobs: Option<u64>,
    /// Print results.json to stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Directory for results.json and pictures (default: the run directory
    /// for a run, else a new run under the store).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Root of the result store.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Write the verdict as JUnit XML to FILE too, for CI systems: a test
    /// case per checker, an invalid one failed with its why.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Take a history whose client processes' times go backwards (a
    /// completion before its invocation) as written, instead of refusing
    /// it as bad input: for imported histories whose clocks need it.
    #[arg(long)]
    pub allow_unordered_time: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

// parsed once per process: the size of the largest variant does not matter
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum BenchWhat {
    /// Time the linearizability checker on every history of a folder
    /// (parsing excluded; median of --runs).
    Checker(BenchCheckerArgs),
    /// Merkle repair costs (hashes, bytes, rounds, streamed entries).
    Repair(BenchRepairArgs),
    /// Keeper core costs: apply throughput by digest mode, snapshot
    /// write/load, changelog appends with fsync.
    Keeper(BenchKeeperArgs),
    /// Generator + history recording throughput against a no-op client.
    Harness(BenchHarnessArgs),
    /// The replicated table's inserts on a local 3-replica cluster: rows/s,
    /// inserts/s and latency at several client counts, coordinator round
    /// trips per insert, beside the naive 3-round-trip path and beside
    /// Apache ZooKeeper as the coordinator.
    Table(BenchTableArgs),
    /// Simulated seconds per wall second of a campaign on the simulated
    /// backend (one thread).
    Sim(BenchSimArgs),
}

/// What `drift bench table` compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TableSetup {
    /// The keeper, two round trips per insert.
    Keeper,
    /// The keeper, the naive path: id check, lock, commit.
    Naive,
    /// Apache ZooKeeper, two round trips per insert.
    Zookeeper,
    /// Real ClickHouse servers, their ReplicatedMergeTree on drift's keeper.
    ClickhouseKeeper,
    /// Real ClickHouse servers on Apache ZooKeeper.
    ClickhouseZookeeper,
}

/// `drift bench table --target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchTableTarget {
    Clickhouse,
}

#[derive(Args, Debug)]
pub struct BenchTableArgs {
    /// Concurrent HTTP clients per cell (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 16, 64], value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub clients: Vec<u64>,
    /// Seconds each cell runs.
    #[arg(long, default_value_t = 5.0, value_parser = parse_cell_seconds)]
    pub seconds: f64,
    /// Rounds per cell (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub rounds: u64,
    /// Rows per insert (one block).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rows: u64,
    /// Setups to run, in this order (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [TableSetup::Keeper, TableSetup::Naive, TableSetup::Zookeeper])]
    pub setups: Vec<TableSetup>,
    /// `clickhouse`: real ClickHouse on drift's keeper against ClickHouse on
    /// Apache ZooKeeper, with drift's own table on its keeper beside them
    /// (the setups clickhouse-keeper, clickhouse-zookeeper, keeper).
    #[arg(long, value_enum, conflicts_with = "setups")]
    pub target: Option<BenchTableTarget>,
    /// The ClickHouse server executable (default: `clickhouse-server` on
    /// the PATH).
    #[arg(long = "clickhouse-bin")]
    pub clickhouse_bin: Option<PathBuf>,
    /// The clusters' client port (each setup claims its own address block).
    #[arg(long, default_value_t = 23100, value_parser = clap::value_parser!(u16).range(1024..=65530))]
    pub port: u16,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchHarnessArgs {
    /// Operations generated and recorded.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub ops: u64,
    /// The workload whose generator runs.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Register)]
    pub workload: WorkloadKind,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON document instead of the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchRepairArgs {
    /// Only the 50,000-key scenario (the 10M one builds ~4 GiB of replicas).
    #[arg(long)]
    pub small: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchKeeperArgs {
    /// Creates, sets and deletes per apply phase.
    #[arg(long, default_value_t = 100_000, value_parser = usize_positive)]
    pub ops: usize,
    /// Nodes in the snapshot tree.
    #[arg(long, default_value_t = 1_000_000, value_parser = usize_positive)]
    pub nodes: usize,
    /// Paired apply runs per mode (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = usize_positive)]
    pub runs: usize,
    /// Directory for snapshot and changelog files (default: a temporary one, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchCheckerArgs {
    /// Folder of histories, *.jsonl and *.edn [default: ../shared/data/histories/etcd].
    pub dir: Option<PathBuf>,
    /// Model to check against.
    #[arg(long, value_enum, default_value_t = ModelKind::CasRegister)]
    pub model: ModelKind,
    /// What every key holds first, as JSON (default null; see `drift check -h`).
    #[arg(long, value_parser = parse_json)]
    pub init: Option<serde_json::Value>,
    /// Timed runs per file; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=crate::bench::RUNS_MAX as i64))]
    pub runs: u32,
    /// Per-file time budget in seconds.
    #[arg(long = "budget-s", default_value_t = 60.0, value_parser = parse_budget_s)]
    pub budget_s: f64,
    /// Also time the explanation of violations.
    #[arg(long)]
    pub explain: bool,
    /// Time the dedup checker instead, on a generated insert-retry history
    /// of this many attempts (a correct table's: the check does all its work).
    #[arg(long = "dedup-attempts", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub dedup_attempts: Option<u64>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Time generated long histories instead of a folder's: 10 keys, 20
    /// processes, real linearization points, so each verdict is known.
    /// Without --ops/--inject/--info, the standard suite (BENCHMARKS.md).
    #[arg(long, conflicts_with_all = ["dir", "dedup_attempts"])]
    pub long: bool,
    /// With --long: operations in one generated history.
    #[arg(long, requires = "long", value_parser = clap::value_parser!(u64).range(1..=20_000_000))]
    pub ops: Option<u64>,
    /// With --long: the violation to inject.
    #[arg(long, requires = "long", value_enum)]
    pub inject: Option<drift_checkers::linear::synth::Inject>,
    /// With --long: fraction of ops that end `info` (e.g. 0.002).
    #[arg(long, requires = "long", value_parser = parse_fraction)]
    pub info: Option<f64>,
    /// With --long: the generator's seed.
    #[arg(long, requires = "long", default_value_t = 1)]
    pub seed: u64,
    /// With --long: also write each generated history here as JSON Lines
    /// (to run another checker on the same files).
    #[arg(long, requires = "long")]
    pub write: Option<PathBuf>,
    /// Threads the checker may use (keys in parallel).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub jobs: u64,
}
