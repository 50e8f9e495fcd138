//! The simulated world a campaign runs in: the simulated cluster's
//! configuration from the plan (servers, network, disks, clocks, planted
//! bugs), and swarm mode's draws of that world from the seed.

use crate::nemesis::FaultKind;
use crate::plan::{Campaign, LogSync, PlantedBug, ReadRounds};
use drift_keeper::server::{PlantedBugs, ServerConfig};
use drift_keeper::sim::disk::KillMode;
use drift_keeper::sim::{NetConfig, SimConfig};
use drift_workloads::Rng;

/// The wall clock the simulated servers start at (fixed: a run's entry
/// times are part of what the seed replays).
pub const EPOCH_MS: i64 = 1_800_000_000_000;

fn bugs(list: &[PlantedBug]) -> PlantedBugs {
    PlantedBugs {
        send_before_sync: list.contains(&PlantedBug::SendBeforeSync),
        skip_truncation_rollback: list.contains(&PlantedBug::SkipRollback),
        local_read_in_quorum_round: list.contains(&PlantedBug::LocalQuorumRead),
        skip_digest_check: list.contains(&PlantedBug::SkipDigestCheck),
    }
}

/// The simulated cluster a campaign runs on.
pub fn sim_config(c: &Campaign) -> SimConfig {
    let plan = &c.plan;
    let sp = plan.sim.clone().unwrap_or_default();
    SimConfig {
        nodes: plan.nodes,
        seed: c.seed,
        server: ServerConfig {
            id: 0,
            members: Vec::new(),
            tick_ms: 50,
            election_ticks: 10,
            snapshot_distance: sp.snapshot_distance.max(1),
            reserved_log_items: (sp.snapshot_distance / 2).max(1),
            rotate_interval: sp.snapshot_distance.max(16),
            log_cache_bytes: drift_keeper::changelog::CACHE_BYTES_DEFAULT,
            log_reserve_bytes: drift_keeper::changelog::RESERVE_BYTES_DEFAULT,
            quorum_reads: plan.quorum_reads,
            shared_read_rounds: sp.read_rounds == ReadRounds::Shared,
            witness_blocks: plan.table.is_some(),
            digest: plan.digest,
            session_timeout_min_ms: 1_000,
            session_timeout_max_ms: 60_000,
            seed: c.seed,
            // the simulator serves no real client: its passwords come
            // from the campaign's seed, so a seed replays them too
            session_key: (c.seed, 0),
            bootstrap: true,
            fault_token: Some("sim".into()),
            snapshots: drift_keeper::snapshot::Config::default(),
            deferred_log_sync: sp.log_sync == LogSync::Deferred,
        },
        net: NetConfig {
            delay_us: (100, sp.delay_max_us.max(100)),
            slow: (0.01, 50_000),
            loss: sp.loss,
            duplicate: sp.duplicate,
            reorder: sp.reorder,
            clog: (sp.clog, 2_000_000),
            client_delay_us: (50, 500),
        },
        clock_drift_ppm: sp.clock_drift_ppm,
        kill_mode: if sp.torn_writes {
            KillMode::Mixed
        } else {
            KillMode::Drop
        },
        snapshot_write_us: (1_000, 50_000),
        log_sync_us: (100, 2_000),
        epoch_ms: EPOCH_MS,
        bugs: bugs(&sp.bugs),
        batch_us: sp.batch_us,
    }
}

/// Swarm mode: the campaign of `seed` with its world varied — a subset of
/// the faults, their pace, the network's misbehaviour (loss, duplication,
/// reordering, delays, clogged links), clock drift, torn writes, and for
/// the keeper's workloads how its servers batch inputs, share read-index
/// rounds and sync their logs — all drawn from the seed.
pub fn swarm(mut plan: crate::plan::Plan, seed: u64) -> Campaign {
    let mut rng = Rng::new(Rng::derive(seed, "swarm"));
    let offered: Vec<FaultKind> = if plan.nemeses.is_empty() {
        crate::plan::sim_faults(plan.workload())
    } else {
        plan.nemeses.clone()
    };
    let mut kinds: Vec<FaultKind> = offered.iter().copied().filter(|_| rng.below(2) == 1).collect();
    if kinds.is_empty() {
        kinds.push(offered[rng.below(offered.len() as u64) as usize]);
    }
    plan.nemeses = kinds;
    plan.nemesis_interval_s = 1 + rng.below(8);
    let odds = |rng: &mut Rng, most: f64| if rng.below(3) == 0 { 0.0 } else { rng.unit() * most };
    let mut sim = plan.sim.clone().unwrap_or_default();
    sim.loss = odds(&mut rng, 0.2);
    sim.duplicate = odds(&mut rng, 0.1);
    sim.reorder = odds(&mut rng, 0.3);
    sim.delay_max_us = [1_000, 5_000, 20_000, 100_000][rng.below(4) as usize];
    sim.clock_drift_ppm = [0, 100, 1_000, 20_000][rng.below(4) as usize];
    sim.torn_writes = rng.below(4) != 0;
    sim.snapshot_distance = [100, 1_000, 10_000][rng.below(3) as usize];
    sim.clog = odds(&mut rng, 0.002);
    // drawn last, so the draws before it are those of runs stored before
    // it was drawn; not for the kv workload, whose clients never reach a
    // keeper (batching its idle keepers would only move the world's other
    // draws, and with them the seeds that found the kv service's bugs)
    if plan.workload != drift_workloads::WorkloadKind::Delete {
        sim.batch_us = [0, 0, 200, 2_000][rng.below(4) as usize];
        // after the batching, for the same reason: half the seeds serve
        // each quorum read in its own read-index round, as the node does
        sim.read_rounds = if rng.below(2) == 0 {
            ReadRounds::PerRead
        } else {
            ReadRounds::Shared
        };
        // after the read rounds, for the same reason: half the seeds sync
        // the log before each step returns
        sim.log_sync = if rng.below(2) == 0 {
            LogSync::Inline
        } else {
            LogSync::Deferred
        };
    }
    plan.sim = Some(sim);
    Campaign::new(plan, seed)
}
