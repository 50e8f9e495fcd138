//! `--backend sim` and `drift sim`: a campaign whose servers are the
//! keeper's own sans-IO servers (`drift_keeper::server`) in one simulated
//! cluster (`drift_keeper::sim`) — one thread, one seeded event queue,
//! simulated network, disks and clocks — driven by the same workloads
//! (through simulated clients that speak the wire protocol), the same
//! fault schedule, the same history format, checkers and store as a
//! campaign on real processes. The seed replays a run exactly, event for
//! event: `drift replay` of a simulated run gives the same history.
//!
//! Besides the history checkers, the cluster's invariants (one leader per
//! term, committed entries never change, digest aborts exactly where a
//! divergence was injected, no storage failure but simulated crashes)
//! are checked as it runs; a broken one becomes an `invariant-violated`
//! event that the `digest` checker counts as a problem.

pub mod client;
pub mod exec;
pub mod stage;
pub mod sweep;
pub mod world;

use crate::fail::Failure;
use crate::nemesis::{self, FaultKind, Step};
use crate::plan::{Campaign, PlantedBug};
use crate::settle;
use client::{SimZk, Spec};
use drift_checkers::history::{HistoryWriter, Op, OpType, Process};
use drift_keeper::server::{PlantedBugs, ServerConfig};
use drift_keeper::sim::disk::KillMode;
use drift_keeper::sim::{Cluster, NetConfig, SimConfig};
use drift_results::store::Store;
use drift_workloads::worker::Session as _;
use drift_workloads::Rng;
use serde_json::{json, Value};
use stage::SimStage;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use world::{event, Recording, Sim, H};

/// Simulated time the setup (a leader, the workload's root) may take.
const SETUP_US: u64 = 60_000_000;
/// Simulated time the cluster gets to converge after the heal.
const CONVERGE_US: u64 = 60_000_000;
/// The wall clock the simulated servers start at (fixed: a run's entry
/// times are part of what the seed replays).
const EPOCH_MS: i64 = 1_800_000_000_000;

/// A simulated campaign's outcome.
pub struct Simulated {
    /// The history, in time order.
    pub ops: Vec<Op>,
    /// Each server's log lines (JSON).
    pub logs: BTreeMap<u64, Vec<String>>,
    /// The fault schedule as applied.
    pub applied: Vec<Step>,
    /// Broken invariants: (server, what).
    pub violations: Vec<(u64, String)>,
    pub trace_hash: u64,
    /// Simulated time from the first event to the last.
    pub simulated_us: u64,
    pub events: u64,
}

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
            quorum_reads: plan.quorum_reads,
            witness_blocks: false,
            digest: plan.digest,
            session_timeout_min_ms: 1_000,
            session_timeout_max_ms: 60_000,
            seed: c.seed,
            bootstrap: true,
            fault_token: Some("sim".into()),
            snapshots: drift_keeper::snapshot::Config::default(),
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
        epoch_ms: EPOCH_MS,
        bugs: bugs(&sp.bugs),
        // one advance per input, as every stored simulated run was made
        batch_us: 0,
    }
}

/// Swarm mode: the campaign of `seed` with its world varied — a subset of
/// the faults, their pace, the network's misbehaviour (loss, duplication,
/// reordering, delays, clogged links), clock drift, torn writes — all
/// drawn from the seed.
pub fn swarm(mut plan: crate::plan::Plan, seed: u64) -> Campaign {
    let mut rng = Rng::new(Rng::derive(seed, "swarm"));
    let offered: Vec<FaultKind> = if plan.nemeses.is_empty() {
        crate::plan::SIM_FAULTS.to_vec()
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
    plan.sim = Some(sim);
    Campaign::new(plan, seed)
}

/// Runs campaign `c` in a simulated cluster.
pub fn simulate(c: &Campaign) -> Simulated {
    let plan = &c.plan;
    let workload = plan.workload();
    let cluster = Cluster::new(sim_config(c));
    let w = exec::World::new(cluster);
    let h: H = Rc::new(RefCell::new(Recording::default()));
    let spec = Spec {
        workload,
        servers: (1..=plan.nodes).collect(),
        session_timeout_ms: plan.session_timeout_ms as i32,
        op_timeout_us: plan.op_timeout_ms * 1000,
        sync_reads: false,
    };
    let sp = plan.sim.clone().unwrap_or_default();

    // setup: a leader and the workload's root
    let ready = Rc::new(RefCell::new(false));
    {
        let (w2, spec2, ready2) = (w.clone(), spec.clone(), ready.clone());
        let setup = async move {
            loop {
                if let Ok(z) = SimZk::connect(&w2, &spec2, 0, false).await {
                    if z.setup().await.is_ok() {
                        z.release().await;
                        *ready2.borrow_mut() = true;
                        return;
                    }
                }
                let at = exec::now_us(&w2) + 200_000;
                exec::sleep_until(&w2, at).await;
            }
        };
        let until = exec::now_us(&w) + SETUP_US;
        exec::run(&w, vec![Box::pin(setup)], until);
    }
    let t0 = exec::now_us(&w);
    h.borrow_mut().t0_us = t0;
    if !*ready.borrow() {
        event(
            &w,
            &h,
            "invariant-violated",
            json!({"node": 0, "what": "no leader and no workload root within 60 s of the start"}),
        );
    }

    // main phase: the workers and the nemesis
    let limit_us = plan.time_limit_s * 1_000_000;
    let stage = SimStage::new(&w, &h, sp.torn_writes, t0);
    if *ready.borrow() {
        let every_us = (plan.concurrency as f64 / plan.rate * 1e6) as u64;
        let mut tasks: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>> = Vec::new();
        for wid in 0..plan.concurrency {
            let world = Sim {
                w: w.clone(),
                h: h.clone(),
                spec: spec.clone(),
            };
            let pace = drift_workloads::worker::Pace {
                stride: plan.concurrency,
                seed: c.seed,
                until_us: t0 + limit_us,
                every_us: every_us.max(1),
            };
            tasks.push(Box::pin(async move {
                let client = drift_workloads::worker::Znodes::new(&world, workload, wid);
                drift_workloads::worker::run(&world, client, wid, pace).await
            }));
        }
        let (s, schedule) = (stage.clone(), c.schedule.clone());
        tasks.push(Box::pin(async move { nemesis::run(&s, schedule).await }));
        let until = t0 + limit_us + spec.op_timeout_us * 3 + 5_000_000;
        exec::run(&w, tasks, until);
    }

    // heal: every fault stopped, every server back
    settle_phase(&stage, 2 * CONVERGE_US, |s| async move {
        settle::heal(&s, false, false, CONVERGE_US / 1000).await
    });
    // final phase
    if *ready.borrow() {
        let settle = workload
            .settle_before_final(std::time::Duration::from_millis(plan.session_timeout_ms))
            .as_micros() as u64;
        if settle > 0 {
            let until = exec::now_us(&w) + settle;
            w.borrow_mut().cluster.run_until(until);
        }
        let world = Sim {
            w: w.clone(),
            h: h.clone(),
            spec: spec.clone(),
        };
        let first = plan.concurrency;
        let fin = async move { drift_workloads::worker::final_phase(&world, workload, first).await };
        let until = exec::now_us(&w) + 120_000_000;
        exec::run(&w, vec![Box::pin(fin)], until);
    }
    settle_phase(&stage, 2 * CONVERGE_US, |s| async move {
        settle::final_digests(&s, CONVERGE_US / 1000).await
    });

    // the invariants, and the servers' own events, onto the timeline
    let mut world = w.borrow_mut();
    world.cluster.invariants.finish();
    let end_us = world.cluster.now_us();
    let t0_us = h.borrow().t0_us;
    let mut ops = std::mem::take(&mut h.borrow_mut().ops);
    let mut logs = BTreeMap::new();
    let mut seen = crate::events::Witnessed::default();
    for id in world.cluster.ids() {
        let mut lines = Vec::new();
        for (at, ev, fields) in world.cluster.log(id) {
            let mut line = json!({"ts_ms": EPOCH_MS + (*at / 1000) as i64, "node": id, "event": ev});
            if let (Some(o), Value::Object(f)) = (line.as_object_mut(), fields) {
                o.extend(f.clone());
            }
            if let Some((f, v)) = crate::events::history_event(id, &line, &mut seen) {
                ops.push(Op {
                    index: 0,
                    time: (*at as i64 - t0_us as i64) * 1000,
                    process: Process::Nemesis,
                    kind: OpType::Info,
                    f: f.into(),
                    value: v,
                    key: None,
                    node: None,
                    error: None,
                });
            }
            lines.push(line.to_string());
        }
        logs.insert(id, lines);
    }
    let violations: Vec<(u64, String)> = world
        .cluster
        .invariants
        .violations
        .iter()
        .map(|v| (v.node, v.what.clone()))
        .collect();
    for v in &world.cluster.invariants.violations {
        ops.push(Op {
            index: 0,
            time: (v.at_us as i64 - t0_us as i64) * 1000,
            process: Process::Nemesis,
            kind: OpType::Info,
            f: "invariant-violated".into(),
            value: json!({"node": v.node, "what": v.what}),
            key: None,
            node: None,
            error: None,
        });
    }
    // one timeline: by time, recorded order within a time
    ops.sort_by_key(|o| o.time);
    for (i, o) in ops.iter_mut().enumerate() {
        o.index = i as u64;
    }
    let applied = stage.applied.borrow().clone();
    Simulated {
        ops,
        logs,
        applied,
        violations,
        trace_hash: world.cluster.trace_hash(),
        simulated_us: end_us,
        events: world.cluster.events(),
    }
}

/// Runs one of the phases written once for both worlds ([`settle`]) on
/// the simulated stage, for at most `limit_us` of simulated time.
fn settle_phase<F: std::future::Future<Output = ()> + 'static>(
    stage: &SimStage,
    limit_us: u64,
    phase: impl FnOnce(SimStage) -> F,
) {
    let until = exec::now_us(&stage.w) + limit_us;
    exec::run(&stage.w, vec![Box::pin(phase(stage.clone()))], until);
}

/// Writes a simulated run's history and server logs into its directory.
fn write_run(run: &drift_results::store::RunDir, sim: &Simulated) -> Result<(), Failure> {
    let io = |what: &std::path::Path, e: std::io::Error| Failure::new(format!("{}: {e}", what.display()));
    let path = run.history();
    let mut wr = HistoryWriter::create(&path).map_err(|e| io(&path, e))?;
    for op in &sim.ops {
        wr.append_buffered(op).map_err(|e| io(&path, e))?;
    }
    wr.flush().map_err(|e| io(&path, e))?;
    let nodes = run.path.join("nodes");
    std::fs::create_dir_all(&nodes).map_err(|e| io(&nodes, e))?;
    for (id, lines) in &sim.logs {
        let p = nodes.join(format!("n{id}.log"));
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(&p, text).map_err(|e| io(&p, e))?;
    }
    Ok(())
}

/// `drift test --backend sim` (and `drift replay` of a simulated run).
pub fn execute(c: Campaign, store: Store) -> Result<i32, Failure> {
    let started = std::time::Instant::now();
    let (run, mut info) = crate::run::create_run(&c, &store)?;
    out!("  run dir {}", run.path.display());
    out!("  servers simulated in one thread (backend sim): the seed replays this run exactly");
    let planted = c.plan.sim.as_ref().map(|s| s.bugs.as_slice()).unwrap_or_default();
    if !planted.is_empty() {
        out!(
            "  planted bugs: {}",
            planted.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
        );
    }
    sweep::quiet_panics();
    let sim = simulate(&c);
    let wall = started.elapsed();
    write_run(&run, &sim)?;
    info.nemesis_schedule = Campaign::schedule_json(&sim.applied);
    crate::run::write_run_json(&run, &info)?;
    let judged = crate::run::judge_run(&c, &run, &info, &store)?;
    out!(
        "\n  simulated {:.1} s in {:.2} s ({:.0}× real time), {} events, trace {:#018x}",
        sim.simulated_us as f64 / 1e6,
        wall.as_secs_f64(),
        sim.simulated_us as f64 / 1e6 / wall.as_secs_f64().max(1e-9),
        sim.events,
        sim.trace_hash
    );
    for (node, what) in &sim.violations {
        out!("  invariant violated on node {node}: {what}");
    }
    crate::run::summarise(&c, &judged, sim.ops.len() as u64, wall, &[], &run);
    Ok(judged.results.verdict.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::plan::Plan;
    use clap::Parser;

    /// The campaign `drift test --backend sim <args>` runs with `seed`.
    fn campaign(args: &[&str], seed: u64) -> Campaign {
        let argv = ["drift", "test", "--backend", "sim"].iter().chain(args);
        let Command::Test(t) = Cli::try_parse_from(argv).expect("arguments parse").command else {
            panic!("not drift test")
        };
        Campaign::new(Plan::from_args(&t).expect("a valid plan"), seed)
    }

    /// The history as the store writes it: one JSON line per operation.
    fn history_bytes(s: &Simulated) -> Vec<u8> {
        let mut out = Vec::new();
        for op in &s.ops {
            out.extend(serde_json::to_vec(op).expect("an op serialises"));
            out.push(b'\n');
        }
        out
    }

    /// Every simulated workload, twice with one seed: the same trace hash,
    /// byte-identical histories and server logs; another seed gives
    /// another run.
    #[test]
    fn one_seed_gives_one_run_for_every_workload() {
        for workload in ["register", "unique-ids", "counter", "total-queue", "ephemeral"] {
            let args = [
                "--workload",
                workload,
                "--time-limit",
                "8",
                "--nemesis",
                "kill,partition,pause,clock",
                "--nemesis-interval",
                "2",
            ];
            let c = campaign(&args, 7);
            let (a, b) = (simulate(&c), simulate(&c));
            assert!(
                a.ops.iter().filter(|o| o.kind == OpType::Ok).count() > 10,
                "{workload}: the workload ran"
            );
            assert!(!a.applied.is_empty(), "{workload}: faults were injected");
            assert_eq!(a.trace_hash, b.trace_hash, "{workload}: trace hash");
            assert!(history_bytes(&a) == history_bytes(&b), "{workload}: histories differ");
            assert_eq!(a.logs, b.logs, "{workload}: server logs");
            assert_eq!(a.events, b.events, "{workload}: event counts");
            let other = simulate(&campaign(&args, 8));
            assert_ne!(
                a.trace_hash, other.trace_hash,
                "{workload}: seeds 7 and 8 gave one trace"
            );
            assert!(
                history_bytes(&a) != history_bytes(&other),
                "{workload}: seeds 7 and 8 gave one history"
            );
        }
    }

    /// Seeds whose runs found bugs (fixed since; BENCHMARKS.md, "The
    /// simulator"), run again: each must now be valid.
    #[test]
    fn the_seeds_that_found_bugs_stay_fixed() {
        let six = "partition,kill,pause,clock,corrupt,diverge";
        let seven = "partition,kill,pause,clock,corrupt,diverge,wipe";
        let cases: [(&str, bool, u64); 9] = [
            ("kill", false, 762),
            ("kill,partition", true, 642),
            (six, true, 53),
            (six, true, 133),
            (six, true, 421),
            (seven, true, 286),
            (seven, true, 307),
            (seven, true, 469),
            (seven, true, 1626),
        ];
        for (nemesis, swarmed, seed) in cases {
            let c = campaign(&["--time-limit", "30", "--nemesis", nemesis], seed);
            let c = if swarmed { swarm(c.plan, seed) } else { c };
            let sim = simulate(&c);
            let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
            assert_eq!(
                verdict,
                drift_checkers::checker::Verdict::Valid,
                "seed {seed} ({nemesis}, swarm {swarmed}): {why}"
            );
        }
    }

    /// `keeper-restart` runs in the simulator through the one executor:
    /// every server restarted in turn, the next only once the last
    /// follows a leader again (a simulated server starts in no time, so
    /// without that wait all would restart at one instant); the run stays
    /// valid.
    #[test]
    fn a_rolling_restart_waits_for_each_server_to_rejoin() {
        let c = campaign(
            &[
                "--time-limit",
                "12",
                "--nemesis",
                "keeper-restart",
                "--nemesis-interval",
                "3",
            ],
            5,
        );
        let sim = simulate(&c);
        let steps: Vec<&Op> = sim.ops.iter().filter(|o| o.f == "start-keeper-restart").collect();
        assert!(!steps.is_empty(), "no rolling restart was applied");
        for o in &steps {
            let applied = o.value["applied"].as_str().unwrap_or_default();
            assert_eq!(applied.matches("restarted").count(), 5, "{applied}");
            assert!(!applied.contains("not answering"), "{applied}");
        }
        let mut restarts: Vec<i64> = sim
            .logs
            .values()
            .flatten()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["event"] == "started")
            .filter_map(|l| l["ts_ms"].as_i64())
            .filter(|&t| t > EPOCH_MS)
            .collect();
        restarts.sort_unstable();
        assert_eq!(restarts.len(), 5 * steps.len(), "{restarts:?}");
        for round in restarts.chunks(5) {
            assert!(
                round.windows(2).all(|p| p[0] < p[1]),
                "servers restarted at one instant: {round:?}"
            );
        }
        let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
        assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "{why}");
    }

    /// Swarm mode draws the world from the seed: the same seed, the same
    /// world and the same run.
    #[test]
    fn a_swarm_seed_replays_too() {
        let c = campaign(&["--time-limit", "6"], 1);
        let (s1, s2) = (swarm(c.plan.clone(), 41), swarm(c.plan.clone(), 41));
        assert_eq!(s1, s2);
        assert_ne!(s1.plan.sim, swarm(c.plan.clone(), 42).plan.sim);
        assert_eq!(simulate(&s1).trace_hash, simulate(&s2).trace_hash);
    }
}
