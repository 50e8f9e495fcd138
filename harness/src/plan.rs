//! The campaign plan: everything one run of `drift test` is — workload,
//! target, servers, rates, timeouts, faults, partitioner, digest mode,
//! checkers, address block — typed, and the seed and fault schedule
//! beside it ([`Campaign`]).
//!
//! A plan is built from the command line ([`Plan::from_args`]) or read
//! back from a stored `run.json` ([`Campaign::load`]); both go through
//! [`Plan::check`], so a hand-edited or damaged file is an error that
//! names the field, found before any server starts. `run.json` stores
//! the plan under `config` with the keys every drift has written, so a
//! run stored by an older drift still loads and replays.

use crate::fail::Failure;
use crate::nemesis::{self, FaultKind, NemesisArg, PartitionerMode, Step};
use clap::Args;
use drift_checkers::linear::model::ModelKind;
use drift_checkers::registry::CheckerKind;
use drift_results::files::RunInfo;
use drift_workloads::{Workload, WorkloadKind};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The cluster file's line that has the keeper log each block id it
/// creates and removes (the dedup checker's witness).
pub const WITNESS_LINE: &str = "witness_blocks = true";

/// Most servers a local cluster has (their addresses 127.0.B.11..=19).
pub const NODES_MAX: u64 = 9;
/// Bounds of the numeric options, shared by the CLI's parsers and
/// [`Plan::check`] (a stored plan is held to what the CLI allows).
pub const CONCURRENCY_MAX: u64 = 1000;
pub const KEYS_MAX: u32 = 10_000;
pub const RATE_MIN: f64 = 0.01;
pub const RATE_MAX: f64 = 1e6;
/// A week: a longer time is a typo.
pub const TIME_LIMIT_MAX_S: u64 = 7 * 24 * 3600;
pub const TIMEOUT_MAX_MS: u64 = 600_000;
/// Ports above the client port P a cluster uses: Raft P+1, admin P+2,
/// ZooKeeper's election P+3, proxies P+11..=P+10+NODES_MAX.
pub const PORTS_USED: u16 = 10 + NODES_MAX as u16;
/// Lowest client port: not a privileged one.
pub const PORT_MIN: u16 = 1024;
/// Most block ids a campaign's table may keep (ClickHouse keeps 1000 by
/// default; more makes the window's edge unreachable in a campaign).
pub const DEDUP_WINDOW_MAX: u64 = 1_000_000;
/// The fewest log entries `--logs-to-keep` may keep: the table keeps at
/// least `min_replicated_logs_to_keep` (10) anyway.
pub const LOGS_TO_KEEP_MIN: u64 = 10;
/// Most attempts a logical insert gets.
pub const INSERT_ATTEMPTS_MAX: u32 = 100;
/// The table's HTTP port is P+4 and its interserver port P+5 (ClickHouse's
/// 8123 and 9009 would collide between runs on one address block).
pub const TABLE_HTTP_PORT_OFFSET: u16 = 4;
pub const TABLE_INTERSERVER_PORT_OFFSET: u16 = 5;
/// The kv service's HTTP port is P+6.
pub const KV_PORT_OFFSET: u16 = 6;

/// Where the servers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Processes on this machine, on loopback addresses.
    #[default]
    Local,
    /// Docker containers on a bridge network of the run's own (the drift
    /// executable must be statically linked).
    Docker,
    /// Hosts reached over SSH, listed in a hosts file (`--hosts`).
    Ssh,
    /// The keeper's own servers simulated in one thread, network, disks
    /// and clocks included: deterministic, replayable from the seed.
    Sim,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
            BackendKind::Ssh => "ssh",
            BackendKind::Sim => "sim",
        }
    }
}

/// The system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// drift's own keeper.
    Drift,
    /// Apache ZooKeeper 3.8 (Debian's `zookeeper` package), as a baseline.
    Zookeeper,
    /// Real ClickHouse servers (`clickhouse-server`), one per node, their
    /// ReplicatedMergeTree coordinated by drift's keeper or Apache
    /// ZooKeeper (`--coordinator`): the insert-retry workload only.
    Clickhouse,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Drift => "drift",
            Target::Zookeeper => "zookeeper",
            Target::Clickhouse => "clickhouse",
        }
    }
}

/// What coordinates a table whose replicas are not drift's own nodes (the
/// clickhouse target), or a local cluster's table (`drift cluster up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Coordinator {
    /// drift's keeper nodes.
    #[default]
    Keeper,
    /// An Apache ZooKeeper 3.8 ensemble on the same addresses.
    Zookeeper,
}

impl Coordinator {
    pub fn name(self) -> &'static str {
        match self {
            Coordinator::Keeper => "keeper",
            Coordinator::Zookeeper => "zookeeper",
        }
    }
}

/// The faults a simulated keeper cluster knows: every fault but those
/// that act on the replicated table or the kv service, which the
/// simulator adds for the workloads that run them.
pub const SIM_FAULTS: [FaultKind; 8] = [
    FaultKind::Partition,
    FaultKind::Kill,
    FaultKind::Pause,
    FaultKind::Corrupt,
    FaultKind::Diverge,
    FaultKind::Clock,
    FaultKind::Wipe,
    FaultKind::KeeperRestart,
];

/// How far apart the controller's clock and the servers' (and two
/// servers') may be, for the checkers that compare times across clocks
/// (the dedup window by seconds, ε; the convergence checker's rule 3); a
/// `clock` fault adds its most (its offsets are within ±10 s, on one
/// server at a time).
pub const CLOCK_SKEW_MS: u64 = 1000;
pub const CLOCK_FAULT_SKEW_MS: u64 = 10_000;

/// The kv service's own faults, which backend sim simulates too when the
/// workload runs the kv service (delete).
pub const SIM_KV_FAULTS: [FaultKind; 2] = [FaultKind::GcTombstones, FaultKind::SkipRepair];

/// The table's own faults, which backend sim simulates too when the
/// workload runs the table (insert-retry).
pub const SIM_TABLE_FAULTS: [FaultKind; 3] = [FaultKind::DropReply, FaultKind::StopFetches, FaultKind::KeeperCut];

/// The faults backend sim simulates for `workload`.
pub fn sim_faults(workload: Workload) -> Vec<FaultKind> {
    let mut f = SIM_FAULTS.to_vec();
    if workload.is_kv() {
        f.extend(SIM_KV_FAULTS);
    }
    if workload.is_table() {
        f.extend(SIM_TABLE_FAULTS);
    }
    f
}

/// The faults the clickhouse target takes: its nodes have no drift fault
/// hooks (drop-reply is a proxy of drift's own in front of each server).
pub const CLICKHOUSE_FAULTS: [FaultKind; 6] = [
    FaultKind::Kill,
    FaultKind::Pause,
    FaultKind::Partition,
    FaultKind::KeeperRestart,
    FaultKind::DropReply,
    FaultKind::Wipe,
];

/// The keeper's digest mode (`digest` in the cluster file): the keeper's
/// own type.
pub use drift_keeper::DigestMode;

/// A test-only table defect (`--defect`), armed on every node through
/// its fault hooks to prove the dedup checker finds what it breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Defect {
    /// Blocks are committed without looking for their id: retries duplicate.
    SkipDedup,
    /// Commits leave no block id behind: retries duplicate.
    NoBlockId,
    /// A block's id is recorded, its rows are not, and the client is told
    /// success: acknowledged rows are lost and their retries swallowed.
    LosePart,
    /// (delete) A repair writes the peer's version over its own instead of
    /// merging: a newer write is lost to an older one.
    RepairOverwrites,
}

impl Defect {
    /// As the node's `DRIFT_TABLE_DEFECT` names it.
    pub fn name(self) -> &'static str {
        match self {
            Defect::SkipDedup => "skip-dedup",
            Defect::NoBlockId => "no-block-id",
            Defect::LosePart => "lose-part",
            Defect::RepairOverwrites => "repair-overwrites",
        }
    }

    /// Whether it breaks the kv service (else the table).
    pub fn is_kv(self) -> bool {
        self == Defect::RepairOverwrites
    }
}

/// How the kv service collects tombstones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KvGc {
    /// Older than the grace period.
    Time,
    /// Older than the grace period and than the last repair of the range
    /// with every other replica.
    Repair,
}

impl KvGc {
    pub fn name(self) -> &'static str {
        match self {
            KvGc::Time => "time",
            KvGc::Repair => "repair",
        }
    }
}

/// The delete workload's kv service, as `run.json` stores it under
/// `config.kv`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvPlan {
    pub rf: u64,
    pub w: u64,
    pub r: u64,
    pub gc: KvGc,
    pub gc_grace_ms: u64,
    pub repair_interval_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defect: Option<Defect>,
}

impl KvPlan {
    pub const DEFAULT_GC_GRACE_MS: u64 = 10_000;
    pub const DEFAULT_REPAIR_INTERVAL_MS: u64 = 2_000;
    /// How often each server's GC pass runs.
    pub const GC_INTERVAL_MS: u64 = 500;
    /// The depth of each range's Merkle tree.
    pub const TREE_DEPTH: u32 = 8;
    /// How long a coordinator waits for its replicas.
    pub const REQUEST_TIMEOUT_MS: u64 = 1_000;

    fn from_args(args: &TestArgs) -> KvPlan {
        let rf = args.nodes.min(3);
        KvPlan {
            rf,
            w: args.kv_w.unwrap_or(rf / 2 + 1),
            r: args.kv_r.unwrap_or(rf / 2 + 1),
            gc: args.kv_gc.unwrap_or(KvGc::Time),
            gc_grace_ms: args.gc_grace_ms.unwrap_or(Self::DEFAULT_GC_GRACE_MS),
            repair_interval_ms: args.repair_interval_ms.unwrap_or(Self::DEFAULT_REPAIR_INTERVAL_MS),
            defect: args.defect,
        }
    }

    /// The `[kv]` lines of the campaign's cluster file.
    pub fn settings(&self) -> Vec<String> {
        vec![
            format!("rf = {}", self.rf),
            format!("w = {}", self.w),
            format!("r = {}", self.r),
            format!("gc = {:?}", self.gc.name()),
            format!("gc_grace_ms = {}", self.gc_grace_ms),
            format!("gc_interval_ms = {}", Self::GC_INTERVAL_MS),
            format!("repair_interval_ms = {}", self.repair_interval_ms),
            format!("tree_depth = {}", Self::TREE_DEPTH),
            format!("request_timeout_ms = {}", Self::REQUEST_TIMEOUT_MS),
        ]
    }
}

/// The insert-retry workload's table and client, as `run.json` stores them
/// under `config.table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TablePlan {
    /// `replicated_deduplication_window`: block ids kept.
    pub dedup_window: u64,
    /// `replicated_deduplication_window_seconds`, from the newest id.
    pub dedup_window_seconds: u64,
    /// `cleanup_delay_period_ms`: how often the leader cleans up.
    pub cleanup_period_ms: u64,
    /// Attempts a logical insert gets.
    pub insert_attempts: u32,
    /// `max_replicated_logs_to_keep`: an inactive replica further behind
    /// is marked lost (and clones a healthy one when it returns); none:
    /// the table's default (1000, as ClickHouse's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_to_keep: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defect: Option<Defect>,
}

impl TablePlan {
    /// Small by default, so that a campaign of minutes reaches the
    /// window's edge (ClickHouse: 1000 ids, a week, 30 s).
    pub const DEFAULT_WINDOW: u64 = 100;
    pub const DEFAULT_WINDOW_SECONDS: u64 = 5;
    pub const DEFAULT_CLEANUP_MS: u64 = 1000;
    pub const DEFAULT_ATTEMPTS: u32 = 5;

    fn from_args(args: &TestArgs) -> TablePlan {
        TablePlan {
            dedup_window: args.dedup_window.unwrap_or(Self::DEFAULT_WINDOW),
            dedup_window_seconds: args.dedup_window_seconds.unwrap_or(Self::DEFAULT_WINDOW_SECONDS),
            cleanup_period_ms: args.cleanup_period_ms.unwrap_or(Self::DEFAULT_CLEANUP_MS),
            insert_attempts: args.insert_attempts.unwrap_or(Self::DEFAULT_ATTEMPTS),
            logs_to_keep: args.logs_to_keep,
            defect: args.defect,
        }
    }

    /// The `[table.settings]` lines of the campaign's table.
    pub fn settings(&self) -> Vec<String> {
        vec![
            format!("replicated_deduplication_window = {}", self.dedup_window),
            format!(
                "replicated_deduplication_window_seconds = {}",
                self.dedup_window_seconds
            ),
            format!("cleanup_delay_period_ms = {}", self.cleanup_period_ms),
        ]
        .into_iter()
        .chain(self.logs_to_keep.map(|n| format!("max_replicated_logs_to_keep = {n}")))
        .collect()
    }
}

fn is_local(b: &BackendKind) -> bool {
    *b == BackendKind::Local
}

fn is_keeper(c: &Coordinator) -> bool {
    *c == Coordinator::Keeper
}

fn d_session_timeout_ms() -> u64 {
    4000
}

fn d_check_budget_s() -> u64 {
    120
}

/// One campaign's configuration, as `run.json` stores it under `config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub workload: WorkloadKind,
    pub target: Target,
    pub nodes: u64,
    /// Keys of the register workload.
    pub keys: u32,
    pub concurrency: u64,
    /// Operations per second over all clients.
    pub rate: f64,
    pub time_limit_s: u64,
    #[serde(rename = "nemesis")]
    pub nemeses: Vec<FaultKind>,
    pub nemesis_interval_s: u64,
    /// Linearizable reads (a read-index round on drift, `sync` first on
    /// ZooKeeper); false: reads served locally, stale ones expected.
    pub quorum_reads: bool,
    pub digest: DigestMode,
    pub port: u16,
    pub op_timeout_ms: u64,
    #[serde(default = "d_session_timeout_ms")]
    pub session_timeout_ms: u64,
    #[serde(default)]
    pub partitioner: PartitionerMode,
    /// Where the servers run (local processes unless said).
    #[serde(default, skip_serializing_if = "is_local")]
    pub backend: BackendKind,
    /// The hosts file of the ssh backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<std::path::PathBuf>,
    #[serde(default = "d_check_budget_s")]
    pub check_budget_s: u64,
    /// The checkers that judge it (derived: see [`Plan::checkers`]).
    #[serde(default)]
    pub checkers: Vec<CheckerKind>,
    /// The address block the servers bind; none: the lowest free one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<u8>,
    /// The table and its client, for the insert-retry workload (none for
    /// the znode workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TablePlan>,
    /// The kv service, for the delete workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvPlan>,
    /// The simulated network, disks and clocks (backend sim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimPlan>,
    /// Who coordinates the clickhouse target's replicas.
    #[serde(default, skip_serializing_if = "is_keeper")]
    pub coordinator: Coordinator,
    /// The ClickHouse server executable the clickhouse target runs (none:
    /// `clickhouse-server` on the PATH).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clickhouse_bin: Option<std::path::PathBuf>,
}

/// A bug planted in the simulated servers, to show the simulator finds
/// it (see `drift sim --plant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PlantedBug {
    /// Send the Raft messages that must wait for the log's sync before it.
    SendBeforeSync,
    /// Keep the preprocessed overlay when a new leader truncates the log.
    SkipRollback,
    /// Answer a quorum read from the local tree at once.
    LocalQuorumRead,
    /// Apply entries with the digest check off.
    SkipDigestCheck,
}

impl PlantedBug {
    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::SendBeforeSync => "send-before-sync",
            PlantedBug::SkipRollback => "skip-rollback",
            PlantedBug::LocalQuorumRead => "local-quorum-read",
            PlantedBug::SkipDigestCheck => "skip-digest-check",
        }
    }
}

/// How simulated keeper servers serve quorum reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ReadRounds {
    /// One read-index round in flight; the reads that come meanwhile go
    /// together in the next (fewer events: the simulator's default).
    #[default]
    Shared,
    /// A round for each read, as the node runs (its `shared_read_rounds`
    /// is off).
    PerRead,
}

/// When a keeper server's log entries are synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogSync {
    /// Before the step that wrote them returns: the server waits on the
    /// disk (how runs stored before this choice existed ran).
    Inline,
    /// By the driver, on a thread of its own (a simulated delay), while
    /// the server goes on; what needs them durable waits for it. The
    /// node's default.
    #[default]
    Deferred,
}

/// How a simulated cluster's world behaves (backend sim); drawn per
/// seed in swarm mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimPlan {
    /// Odds a Raft message is lost, duplicated, or reordered.
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Odds a peer message clogs its link for up to 2 s (nothing gets
    /// through until the clog ends).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub clog: f64,
    /// Most one-way delay of a peer message (µs; least 100).
    pub delay_max_us: u64,
    /// Each server's clock drifts by up to this (parts per million).
    pub clock_drift_ppm: u64,
    /// Kills may strike between a write and its sync, and what was not
    /// synced is then kept, dropped, torn or corrupted.
    pub torn_writes: bool,
    /// Entries between snapshots (small, so runs make and ship them).
    pub snapshot_distance: u64,
    /// A keeper server takes every input that comes within this many µs
    /// before it advances Raft once, as the node's driver takes what
    /// waited while its last write ran (0: it advances after each input).
    /// Batched, Raft's commit index can run ahead of the changelog
    /// between an input and the advance that writes it.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub batch_us: u64,
    /// Whether quorum reads share read-index rounds.
    #[serde(default, skip_serializing_if = "is_shared")]
    pub read_rounds: ReadRounds,
    /// When the servers' log entries are synced. Always stored: a run
    /// stored without it synced inline, and replays so.
    #[serde(default = "inline")]
    pub log_sync: LogSync,
    /// Bugs planted in every server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bugs: Vec<PlantedBug>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

fn inline() -> LogSync {
    LogSync::Inline
}

fn is_shared(r: &ReadRounds) -> bool {
    *r == ReadRounds::Shared
}

impl Default for SimPlan {
    fn default() -> Self {
        SimPlan {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            clog: 0.0,
            delay_max_us: 2_000,
            clock_drift_ppm: 200,
            torn_writes: true,
            snapshot_distance: 2_000,
            batch_us: 0,
            read_rounds: ReadRounds::Shared,
            log_sync: LogSync::Deferred,
            bugs: Vec::new(),
        }
    }
}

/// A plan with its seed and fault schedule: all a run needs to be run
/// again the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct Campaign {
    pub plan: Plan,
    pub seed: u64,
    pub schedule: Vec<Step>,
    /// Where the verdict goes as JUnit XML too (`--junit`); not stored.
    pub junit: Option<std::path::PathBuf>,
}

impl Plan {
    /// The plan of `drift test`'s arguments.
    pub fn from_args(args: &TestArgs) -> Result<Plan, Failure> {
        if !args.plant.is_empty() && args.backend != BackendKind::Sim {
            return Err(Failure::new(
                "--plant plants bugs in simulated servers: it needs --backend sim",
            ));
        }
        if args.sim_batch_us.is_some() && args.backend != BackendKind::Sim {
            return Err(Failure::new(
                "--sim-batch-us is for simulated servers: it needs --backend sim",
            ));
        }
        if args.sim_read_rounds.is_some() && args.backend != BackendKind::Sim {
            return Err(Failure::new(
                "--sim-read-rounds is for simulated servers: it needs --backend sim",
            ));
        }
        if args.sim_log_sync.is_some() && args.backend != BackendKind::Sim {
            return Err(Failure::new(
                "--sim-log-sync is for simulated servers: it needs --backend sim (a node's is `log_sync` in its cluster file)",
            ));
        }
        let mut plan = Plan {
            workload: args.workload,
            target: args.target,
            nodes: args.nodes,
            keys: args.keys,
            concurrency: args.concurrency,
            rate: args.rate,
            time_limit_s: args.time_limit,
            nemeses: {
                let mut kinds: Vec<FaultKind> = args.nemesis.iter().filter_map(|n| n.fault()).collect();
                kinds.dedup();
                kinds
            },
            nemesis_interval_s: args.nemesis_interval,
            quorum_reads: !args.local_reads,
            digest: args.digest,
            port: args.port,
            op_timeout_ms: args.op_timeout_ms,
            session_timeout_ms: args.session_timeout_ms,
            partitioner: args.partitioner,
            backend: args.backend,
            hosts: args.hosts.clone(),
            check_budget_s: args.check_budget_s,
            checkers: Vec::new(),
            block: args.block,
            table: None,
            kv: None,
            sim: (args.backend == BackendKind::Sim).then(|| SimPlan {
                bugs: args.plant.clone(),
                batch_us: args.sim_batch_us.unwrap_or(0),
                read_rounds: args.sim_read_rounds.unwrap_or_default(),
                log_sync: args.sim_log_sync.unwrap_or_default(),
                ..SimPlan::default()
            }),
            coordinator: args.coordinator.unwrap_or_default(),
            clickhouse_bin: args.clickhouse_bin.clone(),
        };
        if args.target != Target::Clickhouse {
            if let Some(c) = args.coordinator {
                return Err(Failure::new(format!(
                    "--coordinator {} chooses who coordinates real ClickHouse servers: it needs --target clickhouse",
                    c.name()
                )));
            }
            if args.clickhouse_bin.is_some() {
                return Err(Failure::new("--clickhouse-bin is for --target clickhouse"));
            }
        }
        let table_options = [
            ("--dedup-window", args.dedup_window.is_some()),
            ("--dedup-window-seconds", args.dedup_window_seconds.is_some()),
            ("--cleanup-period-ms", args.cleanup_period_ms.is_some()),
            ("--insert-attempts", args.insert_attempts.is_some()),
            ("--logs-to-keep", args.logs_to_keep.is_some()),
            ("--defect", args.defect.is_some_and(|d| !d.is_kv())),
        ];
        let kv_options = [
            ("--kv-gc", args.kv_gc.is_some()),
            ("--gc-grace-ms", args.gc_grace_ms.is_some()),
            ("--repair-interval-ms", args.repair_interval_ms.is_some()),
            ("--kv-w", args.kv_w.is_some()),
            ("--kv-r", args.kv_r.is_some()),
            ("--defect", args.defect.is_some_and(|d| d.is_kv())),
        ];
        for (options, owner, mine) in [
            (&table_options[..], "insert-retry", plan.workload().is_table()),
            (&kv_options[..], "delete", plan.workload().is_kv()),
        ] {
            if let Some((name, _)) = options.iter().find(|(_, g)| *g).filter(|_| !mine) {
                return Err(Failure::new(format!(
                    "{name}{} is an option of --workload {owner}, not of {}",
                    args.defect
                        .filter(|_| *name == "--defect")
                        .map_or(String::new(), |d| format!(" {}", d.name())),
                    plan.workload().name()
                )));
            }
        }
        if plan.workload().is_table() {
            plan.table = Some(TablePlan::from_args(args));
        }
        if plan.workload().is_kv() {
            plan.kv = Some(KvPlan::from_args(args));
        }
        plan.checkers = plan.checkers();
        plan.check().map_err(Failure::new)?;
        Ok(plan)
    }

    pub fn workload(&self) -> Workload {
        Workload::new(self.workload, self.keys)
    }

    /// Whether the run records the dedup checker's witness (rule 6a):
    /// the insert-retry workload on local processes, coordinated by
    /// drift's keeper, which then logs every block id it creates and
    /// removes (`witness_blocks` in the cluster file).
    pub fn witness(&self) -> bool {
        self.table.is_some()
            && matches!(self.backend, BackendKind::Local | BackendKind::Sim)
            && match self.target {
                Target::Drift => true,
                Target::Zookeeper => false,
                Target::Clickhouse => self.coordinator == Coordinator::Keeper,
            }
    }

    /// The checkers that judge the run: the workload's, and the digest
    /// checker where the servers keep a tree digest (drift's keeper, not
    /// Apache ZooKeeper).
    pub fn checkers(&self) -> Vec<CheckerKind> {
        let mut names = self.workload().checkers();
        let keeper = match self.target {
            Target::Drift => true,
            Target::Zookeeper => false,
            Target::Clickhouse => self.coordinator == Coordinator::Keeper,
        };
        if keeper {
            names.push(CheckerKind::Digest);
        }
        names
    }

    /// `<workload>-<target>` (`-zookeeper` after a clickhouse target's
    /// name when ZooKeeper coordinates it).
    fn target_label(&self) -> String {
        match (self.target, self.coordinator) {
            (Target::Clickhouse, Coordinator::Zookeeper) => "clickhouse-zookeeper".into(),
            (t, _) => t.name().into(),
        }
    }

    /// The model linearizability is judged by.
    pub fn model(&self) -> Option<ModelKind> {
        self.workload().model()
    }

    /// `<workload>-<target>`: the test's name in the store.
    pub fn test_name(&self) -> String {
        format!("{}-{}", self.workload().name(), self.target_label())
    }

    /// Every bound the CLI enforces, and what the target allows; the
    /// error names the field.
    pub fn check(&self) -> Result<(), String> {
        fn within<T: PartialOrd + std::fmt::Display>(field: &str, v: T, lo: T, hi: T) -> Result<(), String> {
            if v < lo || v > hi {
                return Err(format!("{field} = {v} is outside {lo}..={hi}"));
            }
            Ok(())
        }
        within("nodes", self.nodes, 1, NODES_MAX)?;
        within("keys", self.keys, 1, KEYS_MAX)?;
        within("concurrency", self.concurrency, 1, CONCURRENCY_MAX)?;
        if !self.rate.is_finite() {
            return Err(format!("rate = {} is not a number", self.rate));
        }
        within("rate", self.rate, RATE_MIN, RATE_MAX)?;
        within("time_limit_s", self.time_limit_s, 1, TIME_LIMIT_MAX_S)?;
        within("nemesis_interval_s", self.nemesis_interval_s, 1, TIME_LIMIT_MAX_S)?;
        within("port", self.port, PORT_MIN, u16::MAX - PORTS_USED)?;
        within("op_timeout_ms", self.op_timeout_ms, 1, TIMEOUT_MAX_MS)?;
        within("session_timeout_ms", self.session_timeout_ms, 1, TIMEOUT_MAX_MS)?;
        within("check_budget_s", self.check_budget_s, 1, TIME_LIMIT_MAX_S)?;
        match (&self.table, self.workload().is_table()) {
            (Some(t), true) => {
                within("table.dedup_window", t.dedup_window, 0, DEDUP_WINDOW_MAX)?;
                within(
                    "table.dedup_window_seconds",
                    t.dedup_window_seconds,
                    1,
                    TIME_LIMIT_MAX_S,
                )?;
                within("table.cleanup_period_ms", t.cleanup_period_ms, 10, TIMEOUT_MAX_MS)?;
                within("table.insert_attempts", t.insert_attempts, 1, INSERT_ATTEMPTS_MAX)?;
                if let Some(n) = t.logs_to_keep {
                    within("table.logs_to_keep", n, LOGS_TO_KEEP_MIN, DEDUP_WINDOW_MAX)?;
                }
            }
            (None, true) => {
                return Err(format!(
                    "table: missing (the {} workload needs it)",
                    self.workload().name()
                ))
            }
            (Some(_), false) => {
                return Err(format!(
                    "table: only the insert-retry workload has one, not {}",
                    self.workload().name()
                ))
            }
            (None, false) => {}
        }
        match (&self.kv, self.workload().is_kv()) {
            (Some(k), true) => {
                within("kv.rf", k.rf, 1, self.nodes)?;
                within("kv.w", k.w, 1, k.rf)?;
                within("kv.r", k.r, 1, k.rf)?;
                within("kv.gc_grace_ms", k.gc_grace_ms, 0, TIMEOUT_MAX_MS)?;
                within("kv.repair_interval_ms", k.repair_interval_ms, 0, TIMEOUT_MAX_MS)?;
                if let Some(d) = k.defect.filter(|d| !d.is_kv()) {
                    return Err(format!("kv.defect: {} is a table defect", d.name()));
                }
            }
            (None, true) => {
                return Err(format!(
                    "kv: missing (the {} workload needs it)",
                    self.workload().name()
                ))
            }
            (Some(_), false) => {
                return Err(format!(
                    "kv: only the delete workload has one, not {}",
                    self.workload().name()
                ))
            }
            (None, false) => {}
        }
        if let Some(d) = self.table.as_ref().and_then(|t| t.defect).filter(|d| d.is_kv()) {
            return Err(format!("table.defect: {} is a kv defect", d.name()));
        }
        if !self.workload().is_kv() {
            if let Some(k) = self.nemeses.iter().find(|k| k.needs_kv()) {
                return Err(format!(
                    "nemesis {} acts on the kv service: it needs --workload delete",
                    k.name()
                ));
            }
        }
        if self.backend != BackendKind::Local && self.target == Target::Zookeeper {
            return Err(format!(
                "backend {} runs drift's servers only (not --target zookeeper)",
                self.backend.name()
            ));
        }
        if self.backend == BackendKind::Sim {
            if self.target != Target::Drift {
                return Err(format!(
                    "backend sim simulates drift's own servers, not target {}",
                    self.target.name()
                ));
            }
            if let Some(k) = self.nemeses.iter().find(|k| !sim_faults(self.workload()).contains(k)) {
                return Err(format!(
                    "nemesis {} acts on the {}, which workload {} does not run: backend sim simulates the keeper (partition, kill, pause, corrupt, diverge, clock, wipe and keeper-restart), with workload delete the kv service (gc-tombstones, skip-repair), with workload insert-retry the table (drop-reply, stop-fetches, keeper-cut)",
                    k.name(),
                    if k.needs_kv() { "kv service" } else { "replicated table" },
                    self.workload().name()
                ));
            }
            if self.sim.is_none() {
                return Err("sim: backend sim needs its world (loss, delays, clocks); this config has none".into());
            }
        } else if self.sim.is_some() {
            return Err(format!(
                "sim: a simulated world is for backend sim, not {}",
                self.backend.name()
            ));
        }
        match (self.backend, &self.hosts) {
            (BackendKind::Ssh, None) => return Err("hosts: backend ssh needs a hosts file (--hosts)".into()),
            (BackendKind::Local | BackendKind::Docker | BackendKind::Sim, Some(_)) => {
                return Err(format!(
                    "hosts: a hosts file is for backend ssh, not {}",
                    self.backend.name()
                ))
            }
            _ => {}
        }
        if self.target == Target::Zookeeper && self.workload().is_kv() {
            return Err("workload delete runs on the drift target only (the kv service is drift's)".into());
        }
        if !self.workload().is_table() {
            if let Some(k) = self.nemeses.iter().find(|k| k.needs_table()) {
                return Err(format!(
                    "nemesis {} acts on the replicated table: it needs --workload insert-retry",
                    k.name()
                ));
            }
        }
        if self.target == Target::Clickhouse {
            self.check_clickhouse()?;
        } else if self.coordinator != Coordinator::Keeper || self.clickhouse_bin.is_some() {
            return Err(format!(
                "coordinator, clickhouse_bin: for target clickhouse, not {}",
                self.target.name()
            ));
        }
        if self.target == Target::Zookeeper && self.workload().is_table() {
            return Err(
                "workload insert-retry runs on the drift target only (not implemented on zookeeper: the table on Apache ZooKeeper is `drift cluster up --coordinator zookeeper`)".into(),
            );
        }
        if self.target == Target::Zookeeper {
            // ZooKeeper has no fault hooks, and on loopback its peers
            // connect from 127.0.0.1, so a per-link cut cannot name them
            if let Some(k) = self
                .nemeses
                .iter()
                .find(|k| matches!(k, FaultKind::Partition | FaultKind::Diverge | FaultKind::Clock) || k.needs_table())
            {
                return Err(format!(
                    "nemesis {} is not available on the zookeeper target (kill, pause, corrupt, wipe and keeper-restart are)",
                    k.name()
                ));
            }
        }
        Ok(())
    }
}

impl Plan {
    /// What the clickhouse target allows: the insert-retry workload on
    /// local processes, the faults that need no drift node hooks.
    fn check_clickhouse(&self) -> Result<(), String> {
        if !self.workload().is_table() {
            return Err(format!(
                "target clickhouse runs the insert-retry workload (real ReplicatedMergeTree), not {}",
                self.workload().name()
            ));
        }
        if self.backend != BackendKind::Local {
            return Err(format!(
                "target clickhouse runs its servers as local processes, not on backend {}",
                self.backend.name()
            ));
        }
        if let Some(k) = self.nemeses.iter().find(|k| !CLICKHOUSE_FAULTS.contains(k)) {
            return Err(format!(
                "nemesis {} needs drift's node hooks: not available on target clickhouse (kill, pause, partition, keeper-restart, drop-reply and wipe are)",
                k.name()
            ));
        }
        if let Some(d) = self.table.as_ref().and_then(|t| t.defect) {
            return Err(format!(
                "defect {} is planted through drift's node hooks: not on target clickhouse",
                d.name()
            ));
        }
        if self.partitioner == PartitionerMode::Proxies && self.nemeses.contains(&FaultKind::Partition) {
            return Err(
                "partitioner proxies: target clickhouse cuts links with nftables rules on the processes' cgroups (run as root)".into(),
            );
        }
        Ok(())
    }
}

impl Campaign {
    /// A new campaign of `plan`: the seed given (or a fresh one) and the
    /// schedule derived from it.
    pub fn new(plan: Plan, seed: u64) -> Campaign {
        let mut schedule = nemesis::schedule(
            &plan.nemeses,
            plan.nodes,
            plan.nemesis_interval_s * 1000,
            plan.time_limit_s * 1000,
            seed,
        );
        if plan.target == Target::Clickhouse {
            nemesis::assign_parts(&mut schedule, seed);
        }
        Campaign {
            plan,
            seed,
            schedule,
            junit: None,
        }
    }

    /// The campaign a stored `run.json` describes, checked: an error
    /// names the file and the field.
    pub fn load(run_json: &Path) -> Result<Campaign, Failure> {
        let at = |what: String| Failure::new(format!("{}: {what}", run_json.display()));
        let bytes = std::fs::read(run_json).map_err(|e| at(e.to_string()))?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let info: RunInfo = serde_path_to_error::deserialize(&mut de).map_err(|e| at(path_error("", &e)))?;
        if info.kind != "test" {
            return Err(at(format!(
                "not a campaign run (kind {:?}); re-check it with drift check",
                info.kind
            )));
        }
        let plan: Plan = serde_path_to_error::deserialize(&info.config).map_err(|e| at(path_error("config", &e)))?;
        plan.check().map_err(|e| at(format!("config.{e}")))?;
        let seed = info.seed.ok_or_else(|| at("seed: missing".into()))?;
        let mut schedule = Vec::new();
        for (i, v) in info.nemesis_schedule.iter().enumerate() {
            let mut step: Step = serde_path_to_error::deserialize(v)
                .map_err(|e| at(path_error(&format!("nemesis_schedule[{i}]"), &e)))?;
            step.applied.clear();
            schedule.push(step);
        }
        nemesis::check_schedule(&schedule, plan.nodes, plan.time_limit_s * 1000).map_err(at)?;
        if plan.target != Target::Clickhouse {
            if let Some(i) = schedule.iter().position(|s| s.part != crate::backend::Part::Node) {
                return Err(at(format!(
                    "nemesis_schedule[{i}].part: only target clickhouse has nodes of several processes"
                )));
            }
        }
        if plan.nodes < 2 && !schedule.is_empty() {
            return Err(at("nemesis_schedule: faults need at least two nodes".into()));
        }
        Ok(Campaign {
            plan,
            seed,
            schedule,
            junit: None,
        })
    }

    /// `run.json`'s `config` value.
    pub fn config(&self) -> serde_json::Value {
        serde_json::to_value(&self.plan).expect("a plan serializes")
    }

    /// `run.json`'s `nemesis_schedule` for `steps`.
    pub fn schedule_json(steps: &[Step]) -> Vec<serde_json::Value> {
        steps
            .iter()
            .map(|s| serde_json::to_value(s).expect("a step serializes"))
            .collect()
    }
}

/// `within.path: message` of a deserialization error inside `within`
/// (`within: message` where it is about `within` itself).
fn path_error<E: std::fmt::Display>(within: &str, e: &serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    match (within.is_empty(), path == ".") {
        (true, true) => e.inner().to_string(),
        (true, false) => format!("{path}: {}", e.inner()),
        (false, true) => format!("{within}: {}", e.inner()),
        (false, false) => format!("{within}.{path}: {}", e.inner()),
    }
}

/// `--rate`: operations per second, a finite number in bounds.
pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !v.is_finite() || !(RATE_MIN..=RATE_MAX).contains(&v) {
        return Err(format!("must be in {}..={}", RATE_MIN, RATE_MAX));
    }
    Ok(v)
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
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=NODES_MAX))]
    pub nodes: u64,
    /// Keys of the register workload.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=KEYS_MAX as i64))]
    pub keys: u32,
    /// Concurrent client processes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=CONCURRENCY_MAX))]
    pub concurrency: u64,
    /// Total operations per second across all clients.
    #[arg(long, default_value_t = 100.0, value_parser = parse_rate)]
    pub rate: f64,
    /// Seconds of the main phase.
    #[arg(long = "time-limit", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=TIME_LIMIT_MAX_S))]
    pub time_limit: u64,
    /// Faults, comma-separated (or none).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kill,partition")]
    pub nemesis: Vec<NemesisArg>,
    /// Seconds between faults (each lasts half of it).
    #[arg(long = "nemesis-interval", default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=TIME_LIMIT_MAX_S))]
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
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
    /// The hosts file of `--backend ssh` (see README, "On your own hosts").
    #[arg(long)]
    pub hosts: Option<PathBuf>,
    /// Who coordinates the ClickHouse servers of `--target clickhouse`:
    /// drift's keeper nodes (the default) or an Apache ZooKeeper ensemble.
    #[arg(long, value_enum)]
    pub coordinator: Option<Coordinator>,
    /// The ClickHouse server executable of `--target clickhouse` (default:
    /// `clickhouse-server` on the PATH).
    #[arg(long = "clickhouse-bin")]
    pub clickhouse_bin: Option<PathBuf>,
    /// A bug planted in the simulated servers (`--backend sim` only; to
    /// show the simulator finds it). Repeatable.
    #[arg(long, value_enum)]
    pub plant: Vec<PlantedBug>,
    /// Simulated keeper servers take the inputs that come within this many
    /// µs before they advance Raft once, as the node's driver batches
    /// (`--backend sim` only; default 0: one advance per input; swarm
    /// mode draws it).
    #[arg(long = "sim-batch-us")]
    pub sim_batch_us: Option<u64>,
    /// Whether simulated keeper servers share read-index rounds among
    /// quorum reads (`shared`, the default) or give each read its own,
    /// as the node does (`per-read`) (`--backend sim` only; swarm mode
    /// draws it).
    #[arg(long = "sim-read-rounds", value_enum)]
    pub sim_read_rounds: Option<ReadRounds>,
    /// When simulated keeper servers sync their log: `deferred` (the
    /// default, as the node does: a simulated sync thread, the server
    /// going on meanwhile) or `inline` (before each step returns)
    /// (`--backend sim` only; swarm mode draws it).
    #[arg(long = "sim-log-sync", value_enum)]
    pub sim_log_sync: Option<LogSync>,
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
    #[arg(long, default_value_t = 2281, value_parser = clap::value_parser!(u16).range(PORT_MIN as i64..=(u16::MAX - PORTS_USED) as i64))]
    pub port: u16,
    /// Address block B: server i binds 127.0.B.(10+i) (default: the
    /// lowest block no other cluster on this machine holds).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=254))]
    pub block: Option<u8>,
    /// Client operation timeout; past it the op is recorded `info`.
    #[arg(long = "op-timeout-ms", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=TIMEOUT_MAX_MS))]
    pub op_timeout_ms: u64,
    /// The clients' session timeout: a session not heard from this long
    /// expires (its ephemerals go; a table replica cut from its keeper
    /// goes read-only).
    #[arg(long = "session-timeout-ms", default_value_t = 4000, value_parser = clap::value_parser!(u64).range(1..=TIMEOUT_MAX_MS))]
    pub session_timeout_ms: u64,
    /// Time budget of the checkers, in seconds.
    #[arg(long = "check-budget-s", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=TIME_LIMIT_MAX_S))]
    pub check_budget_s: u64,
    /// insert-retry: block ids the table keeps for dedup
    /// (replicated_deduplication_window) [default: 100; ClickHouse's is 1000]
    #[arg(long = "dedup-window", value_parser = clap::value_parser!(u64).range(0..=DEDUP_WINDOW_MAX))]
    pub dedup_window: Option<u64>,
    /// insert-retry: how old a block id may get, measured from the newest
    /// (replicated_deduplication_window_seconds) [default: 5; ClickHouse's is a week]
    #[arg(long = "dedup-window-seconds", value_parser = clap::value_parser!(u64).range(1..=TIME_LIMIT_MAX_S))]
    pub dedup_window_seconds: Option<u64>,
    /// insert-retry: how often the table's leader drops old block ids and
    /// log entries (cleanup_delay_period) [default: 1000; ClickHouse's is 30 s]
    #[arg(long = "cleanup-period-ms", value_parser = clap::value_parser!(u64).range(10..=TIMEOUT_MAX_MS))]
    pub cleanup_period_ms: Option<u64>,
    /// insert-retry: log entries an inactive replica may fall behind
    /// before the leader marks it lost, to clone a healthy replica when it
    /// returns (max_replicated_logs_to_keep) [default: 1000, as ClickHouse's]
    #[arg(long = "logs-to-keep", value_parser = clap::value_parser!(u64).range(LOGS_TO_KEEP_MIN..=DEDUP_WINDOW_MAX))]
    pub logs_to_keep: Option<u64>,
    /// insert-retry: attempts a logical insert gets before the client gives up [default: 5]
    #[arg(long = "insert-attempts", value_parser = clap::value_parser!(u32).range(1..=INSERT_ATTEMPTS_MAX as i64))]
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
    pub kv_gc: Option<KvGc>,
    /// delete: the tombstones' grace period, ms [default: 10000]
    #[arg(long = "gc-grace-ms", value_parser = clap::value_parser!(u64).range(0..=TIMEOUT_MAX_MS))]
    pub gc_grace_ms: Option<u64>,
    /// delete: how often each server repairs the ranges it is the primary
    /// of, ms; 0: only the final repair [default: 2000]
    #[arg(long = "repair-interval-ms", value_parser = clap::value_parser!(u64).range(0..=TIMEOUT_MAX_MS))]
    pub repair_interval_ms: Option<u64>,
    /// delete: acknowledgements a write waits for [default: a majority of RF = min(3, nodes)]
    #[arg(long = "kv-w", value_parser = clap::value_parser!(u64).range(1..=NODES_MAX))]
    pub kv_w: Option<u64>,
    /// delete: replicas a read waits for [default: a majority of RF]
    #[arg(long = "kv-r", value_parser = clap::value_parser!(u64).range(1..=NODES_MAX))]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            workload: WorkloadKind::Register,
            target: Target::Drift,
            nodes: 5,
            keys: 5,
            concurrency: 10,
            rate: 100.0,
            time_limit_s: 60,
            nemeses: vec![FaultKind::Kill, FaultKind::Partition],
            nemesis_interval_s: 6,
            quorum_reads: true,
            digest: DigestMode::Incremental,
            port: 2281,
            op_timeout_ms: 2000,
            session_timeout_ms: 4000,
            partitioner: PartitionerMode::Auto,
            backend: BackendKind::Local,
            hosts: None,
            check_budget_s: 120,
            checkers: vec![],
            block: None,
            table: None,
            kv: None,
            sim: None,
            coordinator: Coordinator::Keeper,
            clickhouse_bin: None,
        }
    }

    #[test]
    fn a_plan_is_stored_with_the_keys_every_drift_wrote() {
        let v = serde_json::to_value(plan()).unwrap();
        for key in [
            "workload",
            "target",
            "nodes",
            "keys",
            "concurrency",
            "rate",
            "time_limit_s",
            "nemesis",
            "nemesis_interval_s",
            "quorum_reads",
            "digest",
            "port",
            "op_timeout_ms",
            "session_timeout_ms",
            "partitioner",
            "check_budget_s",
            "checkers",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["workload"], "register");
        assert_eq!(v["nemesis"], serde_json::json!(["kill", "partition"]));
        assert_eq!(serde_json::from_value::<Plan>(v).unwrap(), plan());
    }

    #[test]
    fn a_plan_out_of_bounds_is_refused_naming_the_field() {
        type Edit = fn(&mut Plan);
        let cases: [(Edit, &str); 4] = [
            (|p| p.nodes = 0, "nodes = 0"),
            (|p| p.rate = f64::INFINITY, "rate"),
            (|p| p.port = 80, "port = 80"),
            (
                |p| {
                    p.target = Target::Zookeeper;
                    p.nemeses = vec![FaultKind::Clock]
                },
                "nemesis clock",
            ),
        ];
        for (edit, want) in cases {
            let mut p = plan();
            edit(&mut p);
            let e = p.check().unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
