//! Nemeses: the fault vocabulary, a seeded schedule of faults, and their
//! execution against a backend. Every fault has a start and a stop, and
//! the heal stops them all (docs/ARCHITECTURE.md, "Faults").
//!
//! * `partition` — halves, one node, bridge, majorities ring, asymmetric:
//!   a set of directed links cut. As root, iptables DROP rules on the
//!   run's own addresses and Raft port, in a chain of this run's own (so
//!   traffic really stops, another run's is untouched, and teardown
//!   removes exactly those rules); otherwise the backend's per-link
//!   proxies close and refuse the cut links.
//! * `kill` / restart, `pause` / resume (SIGSTOP/SIGCONT) of a minority.
//! * `corrupt` — kill a server, truncate or flip one of its changelog or
//!   snapshot files, or drop its data dir; restart it at the stop.
//! * `diverge` — make one follower apply its next entry differently (the
//!   digest must catch it); `clock` — offset a server's entry times.
//! * `wipe` — kill a server and drop its data dir (keeper and table
//!   alike); restart it empty at the stop.
//! * `keeper-restart` — restart every server in turn (SIGTERM, start, wait
//!   until it answers), the next only once the last is back: the keeper
//!   runs inside each server process, so this is the keeper ensemble's
//!   rolling restart, the table replicas beside it restarting too.
//! * For the replicated table (the insert-retry workload), through the
//!   servers' token-guarded table hooks: `drop-reply` (inserts that commit
//!   get no HTTP answer), `stop-fetches` (a replica fetches nothing),
//!   `keeper-cut` (a replica loses its coordinator session and makes no
//!   new one: read-only, its ephemerals expire).
//! * For the kv service (the delete workload), through its hooks:
//!   `gc-tombstones` (chosen servers purge tombstones by time with a short
//!   grace, shorter than a repair takes, until the stop) and `skip-repair`
//!   (chosen servers start no scheduled repair until the stop). `clock`
//!   skews the kv coordinators' timestamps too.
//!
//! Each family of faults is a module of its own, with what starts, stops
//! and heals it: [`partitions`], [`processes`] (kill, pause, the rolling
//! restart), [`disks`] (corrupt, wipe), [`hooks`] (the table's and kv
//! service's hooks, diverge, clock). This module holds the vocabulary,
//! the schedule, and the runner that dispatches each step to its family.
//!
//! The schedule is derived from the run's seed and stored as applied, so a
//! replay applies the same faults at the same times. A stored schedule is
//! read back through [`RawStep`], the format every drift has written, and
//! checked ([`Step`]'s `TryFrom`, then [`check_schedule`]) before any
//! server starts: a hand-edited `run.json` is an error naming the field.

mod disks;
mod hooks;
mod partitions;
mod processes;

pub use partitions::{Partitioner, PartitionerMode};

use crate::backend::{Backend, Exit, Faults, Part};
use crate::recorder::Recorder;
use drift_workloads::Rng;
use partitions::partition_links;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The kinds of fault a campaign can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Partition,
    Kill,
    Pause,
    Corrupt,
    Diverge,
    Clock,
    DropReply,
    StopFetches,
    KeeperCut,
    KeeperRestart,
    Wipe,
    GcTombstones,
    SkipRepair,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Partition => "partition",
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Corrupt => "corrupt",
            FaultKind::Diverge => "diverge",
            FaultKind::Clock => "clock",
            FaultKind::DropReply => "drop-reply",
            FaultKind::StopFetches => "stop-fetches",
            FaultKind::KeeperCut => "keeper-cut",
            FaultKind::KeeperRestart => "keeper-restart",
            FaultKind::Wipe => "wipe",
            FaultKind::GcTombstones => "gc-tombstones",
            FaultKind::SkipRepair => "skip-repair",
        }
    }

    /// Whether it acts through the kv service's hooks (so needs a
    /// campaign with the kv service).
    pub fn needs_kv(self) -> bool {
        matches!(self, FaultKind::GcTombstones | FaultKind::SkipRepair)
    }

    /// Whether it acts through the replicated table's hooks (so needs a
    /// campaign with a table).
    pub fn needs_table(self) -> bool {
        matches!(
            self,
            FaultKind::DropReply | FaultKind::StopFetches | FaultKind::KeeperCut
        )
    }

    const ALL: [FaultKind; 13] = [
        FaultKind::Partition,
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Corrupt,
        FaultKind::Diverge,
        FaultKind::Clock,
        FaultKind::DropReply,
        FaultKind::StopFetches,
        FaultKind::KeeperCut,
        FaultKind::KeeperRestart,
        FaultKind::Wipe,
        FaultKind::GcTombstones,
        FaultKind::SkipRepair,
    ];

    fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether it can act on `part` of a node: the whole node always; one
    /// process (a replica or a coordinator) for kill, pause and partition;
    /// a replica for wipe; a coordinator for keeper-restart; the links
    /// between replicas and coordinators for a partition.
    pub fn acts_on(self, part: Part) -> bool {
        match part {
            Part::Node => true,
            Part::Replica => matches!(
                self,
                FaultKind::Kill | FaultKind::Pause | FaultKind::Partition | FaultKind::Wipe
            ),
            Part::Coordinator => matches!(
                self,
                FaultKind::Kill | FaultKind::Pause | FaultKind::Partition | FaultKind::KeeperRestart
            ),
            Part::ReplicaCoordinator => self == FaultKind::Partition,
        }
    }
}

/// Which links a partition cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Two halves cut apart.
    Halves,
    /// One server alone.
    One,
    /// Two sides cut apart; the server in the middle still sees both.
    Bridge,
    /// Each server sees a majority, no two the same.
    MajoritiesRing,
    /// The first half cannot reach the rest; replies flow.
    Asymmetric,
}

impl Shape {
    const ALL: [Shape; 5] = [
        Shape::Halves,
        Shape::One,
        Shape::Bridge,
        Shape::MajoritiesRing,
        Shape::Asymmetric,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Halves => "halves",
            Shape::One => "one",
            Shape::Bridge => "bridge",
            Shape::MajoritiesRing => "majorities-ring",
            Shape::Asymmetric => "asymmetric",
        }
    }
}

/// How `corrupt` damages a stopped server's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptMode {
    Truncate,
    Flip,
    Wipe,
}

impl CorruptMode {
    const ALL: [CorruptMode; 3] = [CorruptMode::Truncate, CorruptMode::Flip, CorruptMode::Wipe];

    pub fn name(self) -> &'static str {
        match self {
            CorruptMode::Truncate => "truncate",
            CorruptMode::Flip => "flip",
            CorruptMode::Wipe => "wipe",
        }
    }
}

/// Most grace a `gc-tombstones` fault gives tombstones: it is meant to be
/// shorter than a repair takes.
pub const GC_FAULT_GRACE_MS_MAX: u64 = 60_000;

/// Most a `clock` fault may offset a server's clock by: a day.
pub const CLOCK_OFFSET_MS_MAX: i64 = 86_400_000;

/// A fault, with what it needs to be applied again the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The directed links (from, to) to cut.
    Partition {
        shape: Shape,
        links: Vec<(u64, u64)>,
    },
    Kill,
    Pause,
    /// `pick` chooses the file and the byte.
    Corrupt {
        mode: CorruptMode,
        pick: u64,
    },
    Diverge,
    Clock {
        offset_ms: i64,
    },
    DropReply,
    StopFetches,
    KeeperCut,
    KeeperRestart,
    Wipe,
    GcTombstones {
        grace_ms: u64,
    },
    SkipRepair,
}

impl Fault {
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Partition { .. } => FaultKind::Partition,
            Fault::Kill => FaultKind::Kill,
            Fault::Pause => FaultKind::Pause,
            Fault::Corrupt { .. } => FaultKind::Corrupt,
            Fault::Diverge => FaultKind::Diverge,
            Fault::Clock { .. } => FaultKind::Clock,
            Fault::DropReply => FaultKind::DropReply,
            Fault::StopFetches => FaultKind::StopFetches,
            Fault::KeeperCut => FaultKind::KeeperCut,
            Fault::KeeperRestart => FaultKind::KeeperRestart,
            Fault::Wipe => FaultKind::Wipe,
            Fault::GcTombstones { .. } => FaultKind::GcTombstones,
            Fault::SkipRepair => FaultKind::SkipRepair,
        }
    }
}

/// One fault as scheduled and applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawStep", into = "RawStep")]
pub struct Step {
    /// When it starts and stops, ms since the main phase started.
    pub start_ms: u64,
    pub stop_ms: u64,
    pub fault: Fault,
    /// The servers it acts on (for a partition: all of them, shuffled).
    pub nodes: Vec<u64>,
    /// Which of their processes (the clickhouse target's nodes have two;
    /// elsewhere always the whole node).
    pub part: Part,
    /// What applying it did (filled in as it runs).
    pub applied: String,
}

/// A step as `run.json` stores it (the format every drift wrote): the
/// fault by name, its details in `variant` (partition shape, corrupt
/// `mode:pick`, clock offset), the cut links for a partition.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    pub start_ms: u64,
    pub stop_ms: u64,
    pub fault: String,
    #[serde(default)]
    pub variant: String,
    pub nodes: Vec<u64>,
    #[serde(default)]
    pub links: Vec<(u64, u64)>,
    /// [`Part::name`]; absent for the whole node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub part: String,
    #[serde(default)]
    pub applied: String,
}

impl TryFrom<RawStep> for Step {
    type Error = String;

    fn try_from(r: RawStep) -> Result<Step, String> {
        let kind = FaultKind::parse(&r.fault).ok_or_else(|| {
            let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
            format!("fault `{}` is not one of {}", r.fault, known.join(", "))
        })?;
        if kind != FaultKind::Partition && !r.links.is_empty() {
            return Err(format!("links belong to a partition, not to {}", kind.name()));
        }
        let part = Part::parse(&r.part).ok_or_else(|| {
            let known: Vec<&str> = Part::ALL.iter().map(|p| p.name()).filter(|n| !n.is_empty()).collect();
            format!("part `{}` is not one of {}", r.part, known.join(", "))
        })?;
        if !kind.acts_on(part) {
            return Err(format!("{} does not act on part `{}`", kind.name(), r.part));
        }
        let fault = match kind {
            FaultKind::Partition => {
                let shape = Shape::ALL.into_iter().find(|s| s.name() == r.variant).ok_or_else(|| {
                    let known: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
                    format!("partition shape `{}` is not one of {}", r.variant, known.join(", "))
                })?;
                Fault::Partition { shape, links: r.links }
            }
            FaultKind::Kill => Fault::Kill,
            FaultKind::Pause => Fault::Pause,
            FaultKind::Corrupt => {
                let (mode, pick) = r.variant.split_once(':').unwrap_or((&r.variant, "0"));
                let mode = CorruptMode::ALL.into_iter().find(|m| m.name() == mode);
                match (mode, pick.parse::<u64>()) {
                    (Some(mode), Ok(pick)) => Fault::Corrupt { mode, pick },
                    _ => {
                        return Err(format!(
                            "corrupt variant `{}` is not MODE:PICK (MODE truncate, flip or wipe)",
                            r.variant
                        ))
                    }
                }
            }
            FaultKind::Diverge => Fault::Diverge,
            FaultKind::Clock => match r.variant.parse::<i64>() {
                Ok(offset_ms) if offset_ms.abs() <= CLOCK_OFFSET_MS_MAX => Fault::Clock { offset_ms },
                _ => {
                    return Err(format!(
                        "clock variant `{}` is not an offset in ms within ±{CLOCK_OFFSET_MS_MAX}",
                        r.variant
                    ))
                }
            },
            FaultKind::DropReply => Fault::DropReply,
            FaultKind::StopFetches => Fault::StopFetches,
            FaultKind::KeeperCut => Fault::KeeperCut,
            FaultKind::KeeperRestart => Fault::KeeperRestart,
            FaultKind::Wipe => Fault::Wipe,
            FaultKind::GcTombstones => match r.variant.parse::<u64>() {
                Ok(grace_ms) if grace_ms <= GC_FAULT_GRACE_MS_MAX => Fault::GcTombstones { grace_ms },
                _ => {
                    return Err(format!(
                        "gc-tombstones variant `{}` is not a grace in ms within 0..={GC_FAULT_GRACE_MS_MAX}",
                        r.variant
                    ))
                }
            },
            FaultKind::SkipRepair => Fault::SkipRepair,
        };
        Ok(Step {
            start_ms: r.start_ms,
            stop_ms: r.stop_ms,
            fault,
            nodes: r.nodes,
            part,
            applied: r.applied,
        })
    }
}

impl From<Step> for RawStep {
    fn from(s: Step) -> RawStep {
        let fault = s.fault.kind().name().to_string();
        let (variant, links) = match s.fault {
            Fault::Partition { shape, links } => (shape.name().to_string(), links),
            Fault::Corrupt { mode, pick } => (format!("{}:{pick}", mode.name()), vec![]),
            Fault::Clock { offset_ms } => (offset_ms.to_string(), vec![]),
            Fault::GcTombstones { grace_ms } => (grace_ms.to_string(), vec![]),
            Fault::SkipRepair
            | Fault::Kill
            | Fault::Pause
            | Fault::Diverge
            | Fault::DropReply
            | Fault::StopFetches
            | Fault::KeeperCut
            | Fault::KeeperRestart
            | Fault::Wipe => (String::new(), vec![]),
        };
        RawStep {
            start_ms: s.start_ms,
            stop_ms: s.stop_ms,
            fault,
            variant,
            nodes: s.nodes,
            links,
            part: s.part.name().to_string(),
            applied: s.applied,
        }
    }
}

/// Checks a schedule against the cluster it is to run on: `nodes`
/// servers (ids 1..=nodes) for `limit_ms`. The error names the step and
/// the field.
pub fn check_schedule(steps: &[Step], nodes: u64, limit_ms: u64) -> Result<(), String> {
    let id_ok = |n: u64| (1..=nodes).contains(&n);
    for (i, s) in steps.iter().enumerate() {
        let at = |field: &str| format!("nemesis_schedule[{i}].{field}");
        if s.start_ms >= s.stop_ms || s.stop_ms > limit_ms {
            return Err(format!(
                "{}: {}..{} ms is not a window inside the run's {limit_ms} ms",
                at("start_ms"),
                s.start_ms,
                s.stop_ms
            ));
        }
        if let Some(bad) = s.nodes.iter().find(|&&n| !id_ok(n)) {
            return Err(format!("{}: node {bad} is not in 1..={nodes}", at("nodes")));
        }
        let wanted = match &s.fault {
            Fault::Partition { links, .. } => {
                if let Some((a, b)) = links.iter().find(|(a, b)| !id_ok(*a) || !id_ok(*b) || a == b) {
                    return Err(format!(
                        "{}: link {a}->{b} is not between two of 1..={nodes}",
                        at("links")
                    ));
                }
                if links.is_empty() {
                    return Err(format!("{}: a partition cuts at least one link", at("links")));
                }
                None
            }
            Fault::Kill
            | Fault::Pause
            | Fault::DropReply
            | Fault::KeeperRestart
            | Fault::GcTombstones { .. }
            | Fault::SkipRepair => (s.nodes.is_empty()).then_some("at least one node"),
            Fault::Corrupt { .. }
            | Fault::Diverge
            | Fault::Clock { .. }
            | Fault::StopFetches
            | Fault::KeeperCut
            | Fault::Wipe => (s.nodes.len() != 1).then_some("exactly one node"),
        };
        if let Some(wanted) = wanted {
            return Err(format!("{}: {} needs {wanted}", at("nodes"), s.fault.kind().name()));
        }
    }
    Ok(())
}

/// A seeded schedule: a fault every `interval_ms`, active for half of it,
/// up to `limit_ms`.
pub fn schedule(kinds: &[FaultKind], nodes: u64, interval_ms: u64, limit_ms: u64, seed: u64) -> Vec<Step> {
    let mut rng = Rng::new(Rng::derive(seed, "nemesis"));
    let mut out = Vec::new();
    if kinds.is_empty() || nodes < 2 {
        return out;
    }
    let mut t = interval_ms;
    while t + interval_ms / 2 < limit_ms {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let mut ids: Vec<u64> = (1..=nodes).collect();
        shuffle(&mut rng, &mut ids);
        let minority = (1 + rng.below(((nodes - 1) / 2).max(1))) as usize;
        let (fault, chosen) = match kind {
            FaultKind::Partition => {
                let shape = Shape::ALL[rng.below(Shape::ALL.len() as u64) as usize];
                let links = partition_links(shape, &ids);
                (Fault::Partition { shape, links }, ids.clone())
            }
            FaultKind::Kill => (Fault::Kill, ids[..minority].to_vec()),
            FaultKind::Pause => (Fault::Pause, ids[..minority].to_vec()),
            FaultKind::Corrupt => {
                let mode = CorruptMode::ALL[rng.below(3) as usize];
                let pick = rng.below(1 << 20);
                (Fault::Corrupt { mode, pick }, ids[..1].to_vec())
            }
            FaultKind::Clock => {
                let offset_ms = rng.below(20_001) as i64 - 10_000;
                (Fault::Clock { offset_ms }, ids[..1].to_vec())
            }
            FaultKind::Diverge => (Fault::Diverge, ids[..1].to_vec()),
            FaultKind::DropReply => (Fault::DropReply, ids[..minority].to_vec()),
            FaultKind::StopFetches => (Fault::StopFetches, ids[..1].to_vec()),
            FaultKind::KeeperCut => (Fault::KeeperCut, ids[..1].to_vec()),
            // every server, one after the other, in the shuffled order
            FaultKind::KeeperRestart => (Fault::KeeperRestart, ids.clone()),
            FaultKind::Wipe => (Fault::Wipe, ids[..1].to_vec()),
            FaultKind::GcTombstones => {
                let grace_ms = 50 + rng.below(451);
                (Fault::GcTombstones { grace_ms }, ids[..minority].to_vec())
            }
            FaultKind::SkipRepair => (Fault::SkipRepair, ids[..minority].to_vec()),
        };
        out.push(Step {
            start_ms: t,
            stop_ms: t + interval_ms / 2,
            fault,
            nodes: chosen,
            part: Part::Node,
            applied: String::new(),
        });
        t += interval_ms;
    }
    out
}

/// For nodes of two processes (the clickhouse target: a ClickHouse server
/// and its coordinator): which process each step acts on, drawn from the
/// seed apart from the schedule (so the same seed gives the same faults
/// at the same times on every target). A kill or pause strikes the
/// replica, the coordinator or both; a partition cuts the links between
/// replicas, between coordinators, between replicas and coordinators, or
/// all of them; a wipe drops a replica's data; keeper-restart restarts the
/// coordinators in turn.
pub fn assign_parts(steps: &mut [Step], seed: u64) {
    let mut rng = Rng::new(Rng::derive(seed, "nemesis-parts"));
    for s in steps {
        let kind = s.fault.kind();
        s.part = match kind {
            FaultKind::Wipe => Part::Replica,
            FaultKind::KeeperRestart => Part::Coordinator,
            _ => {
                let choices: Vec<Part> = Part::ALL.into_iter().filter(|p| kind.acts_on(*p)).collect();
                choices[rng.below(choices.len() as u64) as usize]
            }
        };
    }
}

fn shuffle(rng: &mut Rng, v: &mut [u64]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// The world a fault schedule runs in: the cluster behind [`Faults`],
/// time, and the history. Real servers are one ([`Servers`]: a locked
/// backend, the wall clock, the recorder); the simulator is the other
/// (`sim::stage::SimStage`: the simulated cluster, virtual time). The runner, the
/// executor and the heal below are written once over it.
pub trait Stage {
    /// Runs `f` on the cluster and the run's partitioner; None when the
    /// cluster cannot be had (a poisoned lock).
    fn with_cluster<R>(&self, f: impl FnOnce(&mut dyn Faults, &Partitioner) -> R) -> Option<R>;
    /// Milliseconds since the main phase started.
    fn now_ms(&self) -> u64;
    /// Waits until `ms` after the main phase's start, recording servers
    /// that exit meanwhile; false once the run is stopping.
    async fn sleep_until_ms(&self, ms: u64) -> bool;
    /// Records a nemesis event in the history.
    fn event(&self, f: &str, value: Value);
    /// Keeps `step` as applied (for run.json and the progress line).
    fn applied(&self, step: &Step);
    /// The exits [`Stage::note_exits`] saw and [`Stage::exits`] has not
    /// handed out yet.
    fn noted_exits(&self) -> &Mutex<Vec<Exit>>;
    /// Records every server that exited on its own since the last look
    /// (`node-exited`), and keeps them for [`Stage::exits`]: a wait that
    /// looks (each of [`Stage::sleep_until_ms`]'s) must not take an exit
    /// from the heal that waits to see it.
    fn note_exits(&self) {
        let fresh = self.with_cluster(|c, _| c.exits()).unwrap_or_default();
        for e in &fresh {
            let mut v = json!({"node": e.node, "code": e.code});
            if e.part != Part::Node {
                v["part"] = json!(e.part.name());
            }
            self.event("node-exited", v);
        }
        self.noted_exits()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(fresh);
    }
    /// Every server that exited on its own since the last call (recorded
    /// as [`Stage::note_exits`] does), each process's latest exit once.
    fn exits(&self) -> Vec<Exit> {
        self.note_exits();
        let noted = std::mem::take(&mut *self.noted_exits().lock().unwrap_or_else(|e| e.into_inner()));
        let mut latest: Vec<Exit> = Vec::new();
        for e in noted {
            latest.retain(|x| (x.node, x.part) != (e.node, e.part));
            latest.push(e);
        }
        latest
    }
}

/// Runs `schedule`: each step applied and stopped at its times, both
/// recorded as `start-<fault>` / `stop-<fault>` events, each applied step
/// kept. Returns early once the run is stopping.
pub async fn run<S: Stage>(s: &S, schedule: Vec<Step>) {
    for mut step in schedule {
        if !s.sleep_until_ms(step.start_ms).await {
            return;
        }
        step.applied = apply(s, &step).await;
        let raw = RawStep::from(step.clone());
        let mut event = json!({"nodes": raw.nodes, "variant": raw.variant, "applied": raw.applied});
        if !raw.part.is_empty() {
            event["part"] = json!(raw.part);
        }
        s.event(&format!("start-{}", raw.fault), event);
        s.applied(&step);
        if !s.sleep_until_ms(step.stop_ms).await {
            return;
        }
        let healed = stop(s, &step);
        s.event(
            &format!("stop-{}", raw.fault),
            json!({"nodes": raw.nodes, "healed": healed}),
        );
    }
}

/// What a step or the heal says when the cluster cannot be had.
pub const POISONED: &str = "cluster lock poisoned";

/// Applies `step` to the cluster; what it did.
pub async fn apply<S: Stage>(s: &S, step: &Step) -> String {
    if step.fault == Fault::KeeperRestart {
        // waits between servers: holds the cluster step by step
        return processes::rolling_restart(s, &step.nodes, step.part).await;
    }
    s.with_cluster(|c, p| match &step.fault {
        Fault::Partition { links, .. } => p.cut(c, links, step.part),
        Fault::Kill => processes::kill(c, &step.nodes, step.part),
        Fault::Pause => processes::pause(c, &step.nodes, step.part),
        Fault::KeeperRestart => unreachable!("handled above"),
        Fault::Corrupt { mode, pick } => disks::corrupt(c, step.nodes[0], *mode, *pick, step.part),
        // `wipe` is corrupt's data-dir drop, scheduled on its own
        Fault::Wipe => disks::corrupt(c, step.nodes[0], CorruptMode::Wipe, 0, step.part),
        Fault::Diverge => hooks::diverge(c, step.nodes[0]),
        Fault::Clock { offset_ms } => hooks::clock(c, step.nodes[0], *offset_ms),
        Fault::DropReply | Fault::StopFetches | Fault::KeeperCut | Fault::GcTombstones { .. } | Fault::SkipRepair => {
            let cmd = hooks::hook_command(&step.fault, true).expect("a hooked fault");
            hooks::hooks_on(c, &step.nodes, &cmd)
        }
    })
    .unwrap_or_else(|| POISONED.into())
}

/// Stops what `step` started; what it did.
pub fn stop<S: Stage>(s: &S, step: &Step) -> String {
    s.with_cluster(|c, p| match &step.fault {
        Fault::Partition { .. } => {
            p.heal(c);
            "healed".into()
        }
        Fault::Kill | Fault::Corrupt { .. } | Fault::Diverge | Fault::Wipe | Fault::KeeperRestart => {
            processes::restart_down(c)
        }
        Fault::Pause => processes::resume(c, &step.nodes),
        Fault::Clock { .. } => hooks::clock(c, step.nodes[0], 0),
        Fault::DropReply | Fault::StopFetches | Fault::KeeperCut | Fault::GcTombstones { .. } | Fault::SkipRepair => {
            let cmd = hooks::hook_command(&step.fault, false).expect("a hooked fault");
            hooks::hooks_on(c, &step.nodes, &cmd)
        }
    })
    .unwrap_or_else(|| POISONED.into())
}

/// How long a server started by the heal gets to refuse its data (exit
/// on its own) before the heal looks.
const HEAL_EXIT_WAIT_MS: u64 = 2_000;

/// Stops every fault and brings every server back; one that will not
/// start (a corruption it refuses) is wiped and rejoins from its peers.
/// With `table`, every replica's fault hooks are turned off too, and with
/// `kv` the kv service's. What went wrong, if anything.
pub async fn heal_all<S: Stage>(s: &S, table: bool, kv: bool) -> String {
    let Some(mut notes) = s.with_cluster(|c, p| {
        p.heal(c);
        let mut notes = Vec::new();
        for i in c.ids() {
            c.resume(i);
            if c.is_up(i) {
                notes.extend(hooks::heal(c, i, table, kv));
            } else if let Err(e) = c.start(i) {
                notes.push(e.to_string());
            }
        }
        notes
    }) else {
        return POISONED.into();
    };
    // a server that exits right away refused its data: the cluster brings
    // it back (a keeper server wiped, to rejoin from its peers)
    s.sleep_until_ms(s.now_ms() + HEAL_EXIT_WAIT_MS).await;
    let exits = s.exits();
    s.with_cluster(|c, _| {
        // an exit seen before the heal started the server again, by a
        // process that runs now, needs nothing (on a node of two
        // processes, the other one's being down is not this one's)
        for e in &exits {
            if !c.is_part_up(e.node, e.part) {
                notes.extend(c.recover_exit(e));
            }
        }
    });
    notes.join("; ")
}

/// Real servers as a [`Stage`]: the locked backend, the wall clock from
/// the main phase's start, the recorder.
pub struct Servers<'a> {
    pub cluster: &'a Mutex<Box<dyn Backend>>,
    pub partitioner: &'a Partitioner,
    pub recorder: &'a Recorder,
    pub applied: &'a Mutex<Vec<Step>>,
    pub started: Instant,
    pub stop: &'a AtomicBool,
    /// Exits its waits saw (see [`Stage::note_exits`]).
    pub exited: Mutex<Vec<Exit>>,
}

impl Stage for Servers<'_> {
    fn with_cluster<R>(&self, f: impl FnOnce(&mut dyn Faults, &Partitioner) -> R) -> Option<R> {
        let mut c = self.cluster.lock().ok()?;
        Some(f(c.as_mut(), self.partitioner))
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Blocks this thread (the nemesis's own): the future is ready when
    /// it first polls.
    async fn sleep_until_ms(&self, ms: u64) -> bool {
        let t = self.started + Duration::from_millis(ms);
        while Instant::now() < t {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            self.note_exits();
            std::thread::sleep(Duration::from_millis(50).min(t.saturating_duration_since(Instant::now())));
        }
        true
    }

    fn event(&self, f: &str, value: Value) {
        self.recorder.event(f, value);
    }

    fn applied(&self, step: &Step) {
        if let Ok(mut a) = self.applied.lock() {
            a.push(step.clone());
        }
    }

    fn noted_exits(&self) -> &Mutex<Vec<Exit>> {
        &self.exited
    }
}

/// Drives a future of [`Servers`], whose every await is done when first
/// polled (its sleeps block the calling thread).
pub fn finish<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// A `--nemesis` value: a fault, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NemesisArg(pub Option<FaultKind>);

impl NemesisArg {
    pub fn fault(self) -> Option<FaultKind> {
        self.0
    }
}

impl clap::ValueEnum for NemesisArg {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_replay_from_the_seed_and_stay_in_time() {
        let a = schedule(&FaultKind::ALL, 5, 4000, 60_000, 9);
        assert_eq!(a, schedule(&FaultKind::ALL, 5, 4000, 60_000, 9));
        assert_ne!(a, schedule(&FaultKind::ALL, 5, 4000, 60_000, 10));
        assert!(a.iter().all(|s| s.start_ms < s.stop_ms && s.stop_ms <= 60_000));
        for s in &a {
            if matches!(s.fault, Fault::Kill | Fault::Pause) {
                assert!(s.nodes.len() <= 2, "a minority only: {s:?}");
            }
        }
        assert_eq!(check_schedule(&a, 5, 60_000), Ok(()));
    }

    #[test]
    fn partitions_cut_what_they_say() {
        let ids = [1, 2, 3, 4, 5];
        let halves = partition_links(Shape::Halves, &ids);
        assert!(halves.contains(&(1, 3)) && halves.contains(&(3, 1)) && !halves.contains(&(1, 2)));
        let one = partition_links(Shape::One, &ids);
        assert_eq!(one.len(), 8);
        let bridge = partition_links(Shape::Bridge, &ids);
        assert!(
            !bridge.iter().any(|&(a, b)| a == 3 || b == 3),
            "the bridge server keeps every link"
        );
        let asym = partition_links(Shape::Asymmetric, &ids);
        assert!(asym.contains(&(1, 3)) && !asym.contains(&(3, 1)));
        let ring = partition_links(Shape::MajoritiesRing, &ids);
        for &n in &ids {
            let reachable = ids.iter().filter(|&&m| m != n && !ring.contains(&(n, m))).count() + 1;
            assert!(reachable >= 3, "server {n} sees a majority");
        }
    }

    #[test]
    fn steps_keep_the_stored_format_both_ways() {
        // as every drift before the typed plan wrote them
        let stored = r#"[
            {"start_ms":6000,"stop_ms":9000,"fault":"partition","variant":"halves","nodes":[2,1,3],"links":[[2,1],[1,2]],"applied":"x"},
            {"start_ms":12000,"stop_ms":15000,"fault":"corrupt","variant":"flip:77","nodes":[3],"links":[]},
            {"start_ms":18000,"stop_ms":21000,"fault":"clock","variant":"-420","nodes":[1]},
            {"start_ms":24000,"stop_ms":27000,"fault":"kill","variant":"","nodes":[1,2],"links":[],"applied":""}
        ]"#;
        let steps: Vec<Step> = serde_json::from_str(stored).unwrap();
        assert_eq!(
            steps[1].fault,
            Fault::Corrupt {
                mode: CorruptMode::Flip,
                pick: 77
            }
        );
        assert_eq!(steps[2].fault, Fault::Clock { offset_ms: -420 });
        let again: Vec<Step> = serde_json::from_value(serde_json::to_value(&steps).unwrap()).unwrap();
        assert_eq!(again, steps);
        assert_eq!(check_schedule(&steps, 3, 30_000), Ok(()));
    }

    #[test]
    fn a_bad_step_is_an_error_naming_what_is_wrong() {
        let one = |json: &str| serde_json::from_str::<Step>(json).map_err(|e| e.to_string());
        assert!(one(r#"{"start_ms":1,"stop_ms":2,"fault":"meteor","nodes":[1]}"#)
            .unwrap_err()
            .contains("fault `meteor` is not one of partition"));
        assert!(
            one(r#"{"start_ms":1,"stop_ms":2,"fault":"partition","variant":"donut","nodes":[1]}"#)
                .unwrap_err()
                .contains("partition shape `donut`")
        );
        assert!(
            one(r#"{"start_ms":1,"stop_ms":2,"fault":"clock","variant":"soon","nodes":[1]}"#)
                .unwrap_err()
                .contains("clock variant")
        );
        assert!(one(r#"{"start_ms":1,"fault":"kill","nodes":[1]}"#)
            .unwrap_err()
            .contains("stop_ms"));
        let step = |fault: Fault, nodes: Vec<u64>| Step {
            start_ms: 10,
            stop_ms: 20,
            fault,
            nodes,
            part: Part::Node,
            applied: String::new(),
        };
        let cases = [
            (
                step(Fault::Kill, vec![9]),
                "nemesis_schedule[0].nodes: node 9 is not in 1..=3",
            ),
            (step(Fault::Kill, vec![]), "kill needs at least one node"),
            (step(Fault::Diverge, vec![1, 2]), "diverge needs exactly one node"),
            (
                step(
                    Fault::Partition {
                        shape: Shape::One,
                        links: vec![(1, 4)],
                    },
                    vec![1, 2, 3],
                ),
                "nemesis_schedule[0].links: link 1->4",
            ),
        ];
        for (s, want) in cases {
            let e = check_schedule(&[s], 3, 1000).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let late = Step {
            stop_ms: 5000,
            ..step(Fault::Pause, vec![1])
        };
        assert!(check_schedule(&[late], 3, 1000).unwrap_err().contains("start_ms"));
    }
}
