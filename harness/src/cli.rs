//! The command line as clap parses it: options with a fixed set of values
//! are enums (`--help` lists them, clap refuses others), numbers carry
//! their bounds. What needs more than a type (paths exist, combinations
//! make sense) is checked by the command that uses them.

use crate::arg_values::*;
use crate::bench_linear::BenchCheckerArgs;
use crate::cluster::{ClusterArgs, NodeArgs};
use crate::plan::TestArgs;
use clap::{Args, Parser, Subcommand, ValueEnum};
use drift_checkers::linear::model::ModelKind;
use drift_checkers::registry::CheckerKind;
use drift_workloads::WorkloadKind;
use std::path::PathBuf;

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
    /// duplication, reordering and delays, clock drift, torn writes, and
    /// (but for the delete workload) how the keeper servers batch inputs
    /// and share read-index rounds.
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
    /// Instead of the in-process costs: a 3-node keeper cluster beside a
    /// 3-node cluster of this peer under the same closed-loop client load,
    /// fresh clusters each round, rounds alternated.
    #[arg(long, value_enum)]
    pub against: Option<KeeperPeer>,
    /// With --against: the operations measured (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [KeeperLoad::Create, KeeperLoad::Set, KeeperLoad::Multi, KeeperLoad::Get], requires = "against")]
    pub load: Vec<KeeperLoad>,
    /// With --against: concurrent sessions per cell (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 64], value_parser = concurrency_value, requires = "against")]
    pub concurrency: Vec<usize>,
    /// With --against: rounds (each system's median round is reported).
    #[arg(long, default_value_t = 3, value_parser = usize_positive, requires = "against")]
    pub rounds: usize,
    /// With --against: timed seconds per cell.
    #[arg(long, default_value_t = 5.0, value_parser = parse_cell_seconds, requires = "against")]
    pub seconds: f64,
    /// With --against: untimed seconds before each cell's timed window.
    #[arg(long, default_value_t = 1.0, value_parser = parse_warmup_seconds, requires = "against")]
    pub warmup: f64,
    /// With --against: the clusters' client port (each claims its own
    /// loopback address block).
    #[arg(long, default_value_t = 23200, value_parser = clap::value_parser!(u16).range(1024..=65530), requires = "against")]
    pub port: u16,
    /// With --against, instead of the throughput cells: load this many
    /// znodes of 100 bytes (ClickHouse block-id paths) into each system and
    /// report resident memory per server, bytes per znode, and the peak
    /// through a snapshot.
    #[arg(long, value_parser = znodes_value, requires = "against")]
    pub znodes: Option<u64>,
    /// With --against: extra `key = value` lines for the keeper cluster's
    /// file (e.g. `log_sync = "inline"`), to measure a setting beside the
    /// peer in the same sitting.
    #[arg(long = "set", requires = "against")]
    pub set: Vec<String>,
}

fn znodes_value(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (1_000..=10_000_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: a number of znodes from 1000 to 10000000")),
    }
}

/// What `drift bench keeper --against` measures the keeper beside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeeperPeer {
    /// Apache ZooKeeper, a 3-server ensemble on loopback.
    Zookeeper,
}

/// One operation of `drift bench keeper --against`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeeperLoad {
    /// A persistent sequential node under one parent.
    Create,
    /// setData on the session's own node.
    Set,
    /// A block node and a sequential log node in one multi.
    Multi,
    /// getData of the session's own node.
    Get,
}

fn concurrency_value(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: a number of sessions from 1 to 1024")),
    }
}

fn parse_warmup_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=60.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: seconds from 0 to 60")),
    }
}
