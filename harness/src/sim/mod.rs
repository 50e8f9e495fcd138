//! `--backend sim` and `drift sim`: a campaign whose servers are the
//! keeper's own sans-IO servers (`drift_keeper::server`) in one simulated
//! cluster (`drift_keeper::sim`) — one thread, one seeded event queue,
//! simulated network, disks and clocks — driven by the same workloads
//! (through simulated clients that speak the wire protocol), the same
//! fault schedule, the same history format, checkers and store as a
//! campaign on real processes. The seed replays a run exactly, event for
//! event: `drift replay` of a simulated run gives the same history.
//! Beside each keeper runs, for the delete workload, a kv server
//! (`kv.rs`), and for the insert-retry workload a table replica
//! (`table.rs`) that the simulated keepers coordinate.
//!
//! Besides the history checkers, the cluster's invariants (one leader per
//! term, committed entries never change, digest aborts exactly where a
//! divergence was injected, no storage failure but simulated crashes)
//! are checked as it runs; a broken one becomes an `invariant-violated`
//! event that the `digest` checker counts as a problem.

pub mod client;
pub mod config;
pub mod exec;
pub mod kv;
pub mod stage;
pub mod sweep;
pub mod table;
pub mod world;

use crate::fail::Failure;
use crate::nemesis::{self, Step};
use crate::plan::Campaign;
use crate::settle;
use client::{SimZk, Spec};
pub use config::{sim_config, swarm};
use drift_checkers::history::{HistoryWriter, Op};
use drift_keeper::sim::Cluster;
use drift_results::store::Store;
use drift_workloads::worker::Session as _;
use serde_json::json;
use stage::SimStage;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use world::{event, Recording, Sim, H};

/// Simulated time the setup (a leader, the workload's root) may take.
const SETUP_US: u64 = 60_000_000;
/// Simulated time the cluster gets to converge after the heal.
const CONVERGE_US: u64 = 60_000_000;
/// Simulated time the kv final phase (repairs and reads) may take.
const KV_FINAL_US: u64 = 300_000_000;
/// Simulated time the table's final phase (a sync and a read of every
/// replica) may take: without merges a replica that lost its disk
/// fetches every part again, a few a second on the swarm's slowest
/// networks (100 ms delays), and a run that found nothing is `unknown`
/// if its reads give up first. A read that succeeds ends the phase early,
/// so only slow runs pay for it.
const TABLE_FINAL_US: u64 = 600_000_000;

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
    /// Committed entries seen before their server's changelog held them
    /// (see `drift_keeper::sim::Invariants::commits_ahead_of_log`): how
    /// the simulator's tests know a batched run reached that case.
    #[cfg_attr(not(test), allow(dead_code))]
    pub commits_ahead_of_log: u64,
}

/// Runs campaign `c` in a simulated cluster.
pub fn simulate(c: &Campaign) -> Simulated {
    let plan = &c.plan;
    let workload = plan.workload();
    let cluster = Cluster::new(sim_config(c));
    let w = exec::World::new(cluster);
    let h: H = Rc::new(RefCell::new(Recording::default()));
    let sp = plan.sim.clone().unwrap_or_default();
    // the kv service beside the keepers, for the delete workload
    let mut kv_failed = None;
    if let Some(k) = &plan.kv {
        let ids: Vec<u64> = (1..=plan.nodes).collect();
        match kv::KvSim::new(k, &ids, c.seed, sp.torn_writes) {
            Ok(sim) => kv::start(&w, sim),
            Err(e) => kv_failed = Some(e),
        }
    }
    let spec = Spec {
        workload,
        servers: (1..=plan.nodes).collect(),
        session_timeout_ms: plan.session_timeout_ms as i32,
        op_timeout_us: plan.op_timeout_ms * 1000,
        sync_reads: false,
    };
    let ids: Vec<u64> = (1..=plan.nodes).collect();

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
    // the table beside the keepers, for the insert-retry workload: its
    // replicas register once a leader is there
    let inserts = plan.table.as_ref().map(|t| {
        table::start(&w, table::TableSim::new(t, &ids, spec.clone()));
        let client = crate::inserts::InsertClient {
            replicas: crate::inserts::Replicas(ids.iter().map(|i| (format!("r{i}"), String::new())).collect()),
            op_timeout: std::time::Duration::from_millis(plan.op_timeout_ms),
            attempts_max: t.insert_attempts,
            delayed_retry: std::time::Duration::from_millis(
                t.dedup_window_seconds * 1000 + 2 * t.cleanup_period_ms.max(1000) + 500,
            ),
            dialect: drift_workloads::table::Dialect::DRIFT,
        };
        let clock = plan.nemeses.contains(&nemesis::FaultKind::Clock);
        let epsilon_ms = crate::plan::CLOCK_SKEW_MS + if clock { crate::plan::CLOCK_FAULT_SKEW_MS } else { 0 };
        (t.clone(), client, epsilon_ms)
    });
    let writable = inserts.is_none() || !*ready.borrow() || table::wait_writable(&w, SETUP_US);
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
    if !writable {
        *ready.borrow_mut() = false;
        event(
            &w,
            &h,
            "invariant-violated",
            json!({"node": 0, "what": "the table's replicas were not all writable within 60 s of a leader"}),
        );
    }
    if let Some(e) = kv_failed {
        *ready.borrow_mut() = false;
        event(&w, &h, "invariant-violated", json!({"node": 0, "what": e}));
    }
    let table_service = |w: &exec::W| table::SimTable {
        w: w.clone(),
        h: h.clone(),
        ids: ids.clone(),
        op_timeout_us: spec.op_timeout_us,
    };
    if let Some((t, _, epsilon_ms)) = &inserts {
        let names = ids.iter().map(|i| format!("r{i}")).collect();
        event(
            &w,
            &h,
            drift_checkers::dedup::PARAMS_F,
            crate::inserts::window_event(
                t.dedup_window,
                t.dedup_window_seconds,
                *epsilon_ms,
                names,
                plan.witness(),
            ),
        );
    }
    let kv_service = |w: &exec::W| kv::SimKv {
        w: w.clone(),
        h: h.clone(),
        op_timeout_us: spec.op_timeout_us,
    };
    if let Some(k) = &plan.kv {
        let start_ts_us = config::EPOCH_MS as u64 * 1000 + t0;
        event(
            &w,
            &h,
            crate::deletes::CONFIG_EVENT,
            crate::deletes::config_event(k, start_ts_us, crate::deletes::clock_skew_ms(plan)),
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
            if let Some((_, client, _)) = &inserts {
                let service = table_service(&w);
                let client = crate::inserts::Inserter::new(wid, service, client);
                tasks.push(Box::pin(async move {
                    drift_workloads::worker::run(&world, client, wid, pace).await
                }));
                continue;
            }
            if plan.kv.is_some() {
                let service = kv_service(&w);
                tasks.push(Box::pin(async move {
                    let client = crate::deletes::KvRequests::new(wid, service, workload);
                    drift_workloads::worker::run(&world, client, wid, pace).await
                }));
                continue;
            }
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
    let with_kv = plan.kv.is_some();
    settle_phase(&stage, 2 * CONVERGE_US, |s| async move {
        settle::heal(&s, false, with_kv, CONVERGE_US / 1000).await
    });
    // final phase, on a calm network (as a heal removes every network
    // fault on processes)
    w.borrow_mut().cluster.calm_network();
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
        if with_kv {
            kv_final_phase(&w, &h, kv_service(&w));
        }
        if inserts.is_some() {
            let service = table_service(&w);
            let per_replica = std::time::Duration::from_micros(TABLE_FINAL_US / ids.len().max(1) as u64);
            let fin = async move { crate::inserts::final_reads(&service, first, per_replica).await };
            let until = exec::now_us(&w) + TABLE_FINAL_US;
            exec::run(&w, vec![Box::pin(fin)], until);
        }
    }
    settle_phase(&stage, 2 * CONVERGE_US, |s| async move {
        settle::final_digests(&s, CONVERGE_US / 1000).await
    });

    // the invariants, and the servers' own events, onto the timeline
    table::finish(&w);
    let mut world = w.borrow_mut();
    world.cluster.invariants.finish();
    let end_us = world.cluster.now_us();
    let t0_us = h.borrow().t0_us;
    let mut ops = std::mem::take(&mut h.borrow_mut().ops);
    let (logs, violations) = {
        let world = &mut *world;
        world::onto_timeline(
            &mut world.cluster,
            world.kv.as_mut(),
            world.table.as_mut(),
            t0_us,
            &mut ops,
        )
    };
    // one timeline: by time, recorded order within a time
    ops.sort_by_key(|o| o.time);
    for (i, o) in ops.iter_mut().enumerate() {
        o.index = i as u64;
    }
    let applied = stage.applied.borrow().clone();
    let done = Simulated {
        ops,
        logs,
        applied,
        violations,
        trace_hash: world.cluster.trace_hash(),
        simulated_us: end_us,
        events: world.cluster.events(),
        commits_ahead_of_log: world.cluster.invariants.commits_ahead_of_log,
    };
    drop(world);
    exec::shut_down(&w);
    done
}

/// The delete workload's final phase (`crate::deletes::final_phase`) on
/// the simulated service, after every server's scheduled repair and GC
/// is paused as on processes: nothing moves the replicas but the final
/// repairs.
fn kv_final_phase(w: &exec::W, h: &H, service: kv::SimKv) {
    let ids: Vec<u64> = w.borrow().cluster.ids();
    for i in ids {
        for cmd in ["repair-off", "gc-off"] {
            let answer = kv::admin(w, i, cmd);
            if answer != "ok" {
                event(
                    w,
                    h,
                    "final-op-failed",
                    json!({"f": format!("kv {cmd}"), "node": i, "why": answer}),
                );
            }
        }
    }
    let fin = async move { crate::deletes::final_phase(&service).await };
    let until = exec::now_us(w) + KV_FINAL_US;
    exec::run(w, vec![Box::pin(fin)], until);
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
mod tests;
