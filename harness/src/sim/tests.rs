//! The simulator's own tests: one seed, one run; the seeds that found
//! bugs; swarm replay; the rolling restart.

use super::config::EPOCH_MS;
use super::*;
use crate::cli::{Cli, Command};
use crate::plan::Plan;
use clap::Parser;
use drift_checkers::history::OpType;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The campaign `drift test --backend sim <args>` runs with `seed`.
fn campaign(args: &[&str], seed: u64) -> Campaign {
    let argv = ["drift", "test", "--backend", "sim"].iter().chain(args);
    let Command::Test(t) = Cli::try_parse_from(argv).expect("arguments parse").command else {
        panic!("not drift test")
    };
    Campaign::new(Plan::from_args(&t).expect("a valid plan"), seed)
}

/// Swarm seed `seed` in the world its test has run since the simulated
/// servers came to share read-index rounds (and before swarm mode drew
/// whether they do): shared rounds, and logs synced inline (before the
/// servers could leave their syncs to their driver). The seeds kept below
/// were found earlier still, with a round per read and no batching, and
/// that change moved their runs; the keeper's are also run as drawn now
/// (below).
fn swarm_as_pinned(plan: Plan, seed: u64) -> Campaign {
    let mut plan = swarm(plan, seed).plan;
    if let Some(sim) = plan.sim.as_mut() {
        sim.read_rounds = crate::plan::ReadRounds::Shared;
        sim.log_sync = crate::plan::LogSync::Inline;
    }
    Campaign::new(plan, seed)
}

/// The arguments of a campaign pinned to a seed that reaches a rare path:
/// the world it was found in, where servers synced their logs inline
/// (deferred syncs, the default since, move every run).
fn as_found<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend(["--sim-log-sync", "inline"]);
    all
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
    for workload in [
        "register",
        "unique-ids",
        "counter",
        "total-queue",
        "ephemeral",
        "delete",
        "insert-retry",
    ] {
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
    let eight = "partition,kill,pause,clock,corrupt,diverge,wipe,keeper-restart";
    let cases: [(&str, bool, u64); 13] = [
        ("kill", false, 762),
        ("kill,partition", true, 642),
        (six, true, 53),
        (six, true, 133),
        (six, true, 421),
        (seven, true, 286),
        (seven, true, 307),
        (seven, true, 469),
        (seven, true, 1626),
        // a divergence armed as the main phase ended, applied by the
        // final phase's first write once the heal was over (the heal now
        // takes back a divergence not yet applied)
        (eight, true, 621),
        (eight, true, 892),
        (eight, true, 1178),
        // one wiped disk, and the followers that had heard of a commit
        // they missed deaf to every candidate (their election clocks
        // stood still while they waited for the entries) until they gave
        // up waiting and elected a log without them
        (eight, true, 5611),
    ];
    for (nemesis, swarmed, seed) in cases {
        let args = ["--time-limit", "30", "--nemesis", nemesis];
        // as found (logs synced inline), and with the defaults of now
        let mut worlds = vec![campaign(&as_found(&args), seed), campaign(&args, seed)];
        if swarmed {
            // as pinned, and as swarm mode draws it now where that differs
            // (a round per read for 642, 53, 421, 307, 892 and 1178)
            let c = worlds.swap_remove(1);
            worlds = vec![swarm_as_pinned(c.plan.clone(), seed)];
            let drawn = swarm(c.plan, seed);
            if drawn != worlds[0] {
                worlds.push(drawn);
            }
        }
        for c in worlds {
            let sim = simulate(&c);
            let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
            let world = c.plan.sim.as_ref().map(|s| (s.read_rounds, s.log_sync));
            assert_eq!(
                verdict,
                drift_checkers::checker::Verdict::Valid,
                "seed {seed} ({nemesis}, swarm {swarmed}, {world:?}): {why}"
            );
        }
    }
}

/// Seeds of the delete workload whose runs found bugs in the kv service
/// (fixed since; BENCHMARKS.md), run again: each must now be valid.
#[test]
fn the_kv_seeds_that_found_bugs_stay_fixed() {
    /// What the convergence checker was not told when the seed failed:
    /// taken out of the history again, the finding comes back, so the
    /// seed still reaches its case.
    enum Without {
        Nothing,
        ClockSkew,
        FinalHorizons,
    }
    let cases = [
        // a server restarted mid-session reused a session id its peer
        // held (drift_repair::server's `a_peer_restarted_mid_session…`)
        ("kill,partition", false, 35, Without::Nothing),
        // a GC pass ordered against a session on another server's
        // drifting clock: the convergence checker now allows the skew
        ("kill,partition", true, 620, Without::ClockSkew),
        // a purge by a horizon a repair session carried, after a pass
        // that purged nothing and logged nothing: the checker now reads
        // the final GC horizons
        ("kill,partition", true, 5275, Without::FinalHorizons),
    ];
    for (nemesis, swarmed, seed, without) in cases {
        let c = campaign(
            &as_found(&["--workload", "delete", "--time-limit", "30", "--nemesis", nemesis]),
            seed,
        );
        let c = if swarmed { swarm_as_pinned(c.plan, seed) } else { c };
        let mut sim = simulate(&c);
        let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
        assert_eq!(
            verdict,
            drift_checkers::checker::Verdict::Valid,
            "seed {seed} ({nemesis}): {why}"
        );
        for o in sim.ops.iter_mut() {
            match without {
                Without::ClockSkew if o.f == "kv-config" => o.value["clock_skew_ms"] = 0.into(),
                Without::FinalHorizons if o.f == "kv-replica" => {
                    for r in o.value["ranges"].as_array_mut().into_iter().flatten() {
                        r["gc_horizon"] = 0.into();
                    }
                }
                _ => {}
            }
        }
        if !matches!(without, Without::Nothing) {
            let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
            assert!(why.contains("resurrected"), "seed {seed}: {verdict:?} {why}");
        }
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

/// Quorum reads each in a read-index round of its own, as the node
/// serves them (`--sim-read-rounds per-read`): the same seed makes a
/// different run with more events (a heartbeat to each follower per
/// read), valid; swarm mode draws both ways, and the run is stored with
/// the way it ran.
#[test]
fn reads_in_rounds_of_their_own_run_as_the_node_serves_them() {
    let args = [
        "--workload",
        "insert-retry",
        "--time-limit",
        "10",
        "--nemesis",
        "kill,partition",
    ];
    let shared = campaign(&args, 5);
    let mut own_args = args.to_vec();
    own_args.extend(["--sim-read-rounds", "per-read"]);
    let own = campaign(&own_args, 5);
    assert_eq!(
        own.plan.sim.as_ref().map(|s| s.read_rounds),
        Some(crate::plan::ReadRounds::PerRead)
    );
    let (a, b) = (simulate(&shared), simulate(&own));
    assert!(
        b.events > a.events,
        "a round per read: {} events, shared rounds: {}",
        b.events,
        a.events
    );
    for (c, sim) in [(&shared, &a), (&own, &b)] {
        let (verdict, why) = sweep::judge(c, sim).expect("judged");
        assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "{why}");
    }
    let stored = serde_json::to_string(own.plan.sim.as_ref().expect("a simulated world")).expect("serialises");
    assert!(stored.contains("\"read_rounds\":\"per-read\""), "{stored}");
    let drawn: BTreeSet<_> = (1..=20)
        .filter_map(|seed| swarm(shared.plan.clone(), seed).plan.sim.map(|s| s.read_rounds))
        .collect();
    assert_eq!(drawn.len(), 2, "twenty swarm seeds drew one way of reading only");
}

/// The kv service beside the keepers (the delete workload): its own
/// faults simulated with the keeper's, the convergence checker judging
/// the simulated history as it judges one from processes, and a server
/// that crashed replaying its log on restart.
#[test]
fn the_kv_service_runs_beside_the_keepers_with_its_faults() {
    let c = campaign(
        &[
            "--workload",
            "delete",
            "--time-limit",
            "20",
            "--nemesis",
            "kill,partition,pause,clock,gc-tombstones,skip-repair,wipe",
            "--nemesis-interval",
            "2",
        ],
        3,
    );
    let sim = simulate(&c);
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "{why}");
    let count = |f: &str| sim.ops.iter().filter(|o| o.f == f).count();
    let applied: std::collections::BTreeSet<&str> = sim.applied.iter().map(|s| s.fault.kind().name()).collect();
    assert!(applied.len() >= 4, "faults applied: {applied:?}");
    assert_eq!(count("kv-config"), 1);
    assert_eq!(count("kv-replica"), 5, "every server's final read");
    assert!(
        count("kv-gc") > 0 && count("kv-repair") > 20,
        "{} {}",
        count("kv-gc"),
        count("kv-repair")
    );
    assert!(count("put") > 100 && count("delete") > 50 && count("get") > 100);
    let lines: Vec<Value> = sim
        .logs
        .values()
        .flatten()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["service"] == "kv")
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "kv_started" && l["records_replayed"].as_u64() > Some(0)),
        "a restarted server replayed its log"
    );
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}

/// The `repair-overwrites` defect planted in the simulated service: the
/// simulation's invariant names the version a repair went back on, and
/// the convergence checker finds the replicas it left apart.
#[test]
fn the_overwrite_defect_is_found_inside_the_simulation_and_by_the_checker() {
    let c = campaign(
        &[
            "--workload",
            "delete",
            "--time-limit",
            "20",
            "--nemesis",
            "kill,partition",
            "--defect",
            "repair-overwrites",
        ],
        2,
    );
    let sim = simulate(&c);
    assert!(
        sim.violations
            .iter()
            .any(|(_, what)| what.contains("replaced by the older")),
        "{:?}",
        sim.violations
    );
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Invalid, "{why}");
    assert!(why.contains("convergence invalid"), "{why}");
}

/// The replicated table beside the keepers, under the keeper's faults
/// and its own: inserts retried, answered, deduplicated, every replica
/// read at the end, the coordinator's witness recorded, no invariant
/// broken, judged valid.
#[test]
fn the_table_runs_beside_the_keepers_with_its_faults() {
    let c = campaign(
        &[
            "--workload",
            "insert-retry",
            "--nodes",
            "3",
            "--time-limit",
            "20",
            "--nemesis",
            "kill,partition,drop-reply,stop-fetches,keeper-cut",
            "--nemesis-interval",
            "3",
        ],
        3,
    );
    let sim = simulate(&c);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    let count = |f: &str, kind: OpType| sim.ops.iter().filter(|o| o.f == f && o.kind == kind).count();
    assert!(count("insert", OpType::Ok) > 50, "inserts answered");
    assert!(
        count("insert", OpType::Info) > 0,
        "some answers lost (drop-reply, kills)"
    );
    assert_eq!(count("read", OpType::Ok), 3, "every replica read at the end");
    assert!(
        sim.ops.iter().any(|o| o.f == drift_checkers::dedup::WITNESS_F),
        "the coordinator's witness"
    );
    let faults: Vec<String> = sim.applied.iter().map(|s| format!("{s:?}")).collect();
    for f in ["DropReply", "KeeperCut"] {
        assert!(faults.iter().any(|s| s.contains(f)), "{f} applied: {faults:?}");
    }
    let logs = sim
        .logs
        .values()
        .flatten()
        .filter(|l| l.contains("\"service\":\"table\""));
    assert!(
        logs.clone().any(|l| l.contains("part_fetched")),
        "replicas fetched parts"
    );
    assert!(
        logs.clone().any(|l| l.contains("block_ids_cleaned")),
        "the leader cleaned up"
    );
    // merges: the leader assigns them, replicas merge their own sources,
    // and a replica without them takes a merged part from another
    assert!(logs.clone().any(|l| l.contains("merge_assigned")), "merges assigned");
    assert!(logs.clone().any(|l| l.contains("part_merged")), "parts merged");
    let merged_fetched = logs.clone().any(|l| {
        let v: Value = serde_json::from_str(l).expect("a log line is JSON");
        let level = |k: &str| v[k].as_str().and_then(|p| p.rsplit('_').next()?.parse::<u32>().ok());
        v["event"] == "fetch_covering" || (v["event"] == "part_fetched" && level("part").is_some_and(|l| l > 0))
    });
    assert!(merged_fetched, "a merged part fetched");
    // quorum inserts: replicas that fetched a quorum part counted in its
    // quorum node, one completed it, and the writers' waits ended in `ok`
    assert!(
        logs.clone()
            .any(|l| l.contains("quorum_counted") && l.contains("\"reached\":true")),
        "a quorum reached by a fetch"
    );
    let quorum_procs: BTreeSet<_> = sim
        .ops
        .iter()
        .filter(|o| o.f == "insert" && o.kind == OpType::Invoke && o.value["quorum"].as_u64() > Some(1))
        .map(|o| (o.process, o.value["insert"].as_u64()))
        .collect();
    let mut open = BTreeMap::new();
    let mut quorum_ok = 0;
    for o in sim.ops.iter().filter(|o| o.f == "insert") {
        if o.kind == OpType::Invoke {
            open.insert(o.process, o.value["insert"].as_u64());
        } else if o.kind == OpType::Ok
            && open
                .get(&o.process)
                .is_some_and(|i| quorum_procs.contains(&(o.process, *i)))
        {
            quorum_ok += 1;
        }
    }
    assert!(quorum_ok > 5, "quorum inserts answered ok: {quorum_ok}");
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "{why}");
}

/// Each table defect planted in the simulated replicas is found twice:
/// by the invariant inside the simulation (an acknowledged block not in
/// the coordinator) and by the dedup checker from the history alone.
#[test]
fn each_table_defect_is_found_inside_the_simulation_and_by_the_checker() {
    for (defect, finding) in [
        ("skip-dedup", "not recorded"),
        ("no-block-id", "not recorded"),
        ("lose-part", "the part not listed"),
    ] {
        let c = campaign(
            &[
                "--workload",
                "insert-retry",
                "--nodes",
                "3",
                "--time-limit",
                "15",
                "--nemesis",
                "kill,drop-reply",
                "--defect",
                defect,
            ],
            2,
        );
        let sim = simulate(&c);
        assert!(
            sim.violations.iter().any(|(_, what)| what.contains(finding)),
            "{defect}: {:?}",
            sim.violations
        );
        let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
        assert_eq!(verdict, drift_checkers::checker::Verdict::Invalid, "{defect}: {why}");
        assert!(
            why.contains("dedup invalid"),
            "{defect}: the checker, from the history: {why}"
        );
    }
}

/// Seeds that take the simulated replicas through the paths the first
/// sweeps of the table found broken in its driver: a pull whose pointer
/// moved under it (an earlier pull committed and lost its answer: the
/// queue is read again, BadVersion once kept a replica's queue stuck), a
/// queue reload during which a commit made a part current (read again,
/// else the part went missing from one replica), and a lost commit
/// settled through its lock; and since the replicas merge, a pull that
/// waited for another (the leader pulls before it assigns a merge: two
/// pulls copying from the same pointer once left an entry out of a
/// queue, and the replicas diverged, seed 191 of the first sweep with
/// merges), a merge made, a part fetched as the part covering it, and
/// a reload that gave up while commits kept landing (its pull fails now:
/// the leader chose a merge from the queue that reload left stale, which
/// spanned a part that queue lacked and dropped its rows, seed 625).
/// Seeds from 1 on run until each common path was reached (any change
/// to the driver moves which seed reaches which, so none of them is
/// pinned); the rare paths, which no seed of the first 40 reaches, are
/// pinned to a seed that does (found with `drift test --backend sim
/// --workload insert-retry --time-limit 30 --seed N` and the log line).
/// Every one of them must stay valid.
#[test]
fn the_table_seeds_that_found_bugs_stay_fixed() {
    let mut unreached = vec![
        ("a pointer moved under a pull", "pointer_moved"),
        ("a lost commit settled", "commit_resolved"),
        ("a pull waited for another", "pull_waited"),
        ("a merge made", "part_merged"),
        ("a covering part fetched", "fetch_covering"),
        ("a quorum completed by a fetch", "\"reached\":true"),
    ];
    let pinned = [
        (
            "a reload that gave up under commits",
            "queue_reload_failed",
            RELOAD_GAVE_UP_SEED,
        ),
        // a commit that found its own listing gone: an earlier commit of a
        // smaller covering part landed and lost its answer; the entry once
        // retried for ever with a larger one (seed 135 of the first sweep
        // with quorum inserts: a final read timed out). Seed 198 since a
        // pull copies on past a reload (188 no longer reaches it; 198 was
        // the first of 1–275 that does)
        ("a stale commit read the queue again", "stale_commit_reloaded", 198),
        // none of seeds 1–40 since a pull copies on past a reload (198
        // does, and 55, found searching on from 41)
        ("a reload read again", "\"reads\":2", 198),
    ];
    let run = |seed: u64| {
        let c = campaign(&as_found(&["--workload", "insert-retry", "--time-limit", "30"]), seed);
        let sim = simulate(&c);
        assert!(sim.violations.is_empty(), "seed {seed}: {:?}", sim.violations);
        let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
        assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "seed {seed}: {why}");
        sim.logs.into_values().flatten().collect::<Vec<String>>()
    };
    let mut runs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (what, needle, seed) in pinned {
        let lines = runs.entry(seed).or_insert_with(|| run(seed));
        assert!(
            lines.iter().any(|l| l.contains(needle)),
            "seed {seed} no longer reaches {what} ({needle}): find another"
        );
    }
    for seed in 1..=SEEDS_TO_REACH_MAX {
        let lines = run(seed);
        unreached.retain(|(_, needle)| !lines.iter().any(|l| l.contains(needle)));
        if unreached.is_empty() {
            return;
        }
    }
    panic!("no seed up to {SEEDS_TO_REACH_MAX} reaches {unreached:?}");
}

/// An acknowledged quorum insert's part merged away before its writer
/// saw the quorum: the invariant that the part is listed, checked after
/// the wait, reported it missing (seed 793 of the first 1,000-seed sweep
/// with quorum inserts, the only one of those seeds that reached the
/// case); it is checked as the commit is known now. Pinned to a seed that
/// reaches the case: 64 since quorum reads share read-index rounds (793
/// no longer does). Should a change to the driver move the seed off the
/// case, find another with `drift test --backend sim --workload
/// insert-retry --time-limit 30 --seed N` and the log line
/// `quorum_part_merged_in_wait` (64, 176 and 288 of the first 400 when
/// this seed was chosen).
#[test]
fn a_quorum_part_merged_during_its_wait_stays_acknowledged() {
    let c = campaign(&as_found(&["--workload", "insert-retry", "--time-limit", "30"]), 64);
    let sim = simulate(&c);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "{why}");
    assert!(
        sim.logs
            .values()
            .flatten()
            .any(|l| l.contains("quorum_part_merged_in_wait")),
        "seed 64 no longer reaches a part merged during its quorum wait"
    );
}

/// Lost replicas: with the log kept short (`--logs-to-keep 10`), the
/// leader marks lost a replica cut off long enough for its session to
/// expire; when it returns it clears its queue and listing and clones a
/// healthy replica, as the node does. Pinned to a seed that reaches the
/// case: seed 7 when this was written; since quorum reads share
/// read-index rounds, 97, the only one of seeds 1–120 (should a change
/// move it off the case, find another with `drift test --backend sim
/// --workload insert-retry --time-limit 30 --nemesis partition,kill
/// --logs-to-keep 10 --seed N` and the log lines `replica_marked_lost`
/// and `cloned` with `"new":false`). It must stay valid.
#[test]
fn a_lost_replica_clones_a_healthy_one() {
    let seed = LOST_REPLICA_SEED;
    let c = campaign(
        &as_found(&[
            "--workload",
            "insert-retry",
            "--time-limit",
            "30",
            "--nemesis",
            "partition,kill",
            "--logs-to-keep",
            "10",
        ]),
        seed,
    );
    let sim = simulate(&c);
    assert!(sim.violations.is_empty(), "seed {seed}: {:?}", sim.violations);
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "seed {seed}: {why}");
    let lines: Vec<&String> = sim.logs.values().flatten().collect();
    let marked = lines.iter().any(|l| l.contains("replica_marked_lost"));
    let cloned = lines
        .iter()
        .any(|l| l.contains("\"event\":\"cloned\"") && l.contains("\"new\":false"));
    assert!(
        marked && cloned,
        "seed {seed} no longer marks a replica lost and clones it: find another"
    );
}

/// See [`a_lost_replica_clones_a_healthy_one`].
const LOST_REPLICA_SEED: u64 = 97;

/// How many seeds [`the_table_seeds_that_found_bugs_stay_fixed`] runs at
/// most (seed 9 alone reached all three paths when it was written; since
/// the queue is read in one pipelined round, a commit lands during a
/// reload rarely, first in seed 31).
const SEEDS_TO_REACH_MAX: u64 = 40;

/// A seed whose queue reload gives up while commits keep landing: the
/// only one of seeds 1–1,000 since quorum reads share read-index rounds
/// (earlier, one of the first 40 reached it).
const RELOAD_GAVE_UP_SEED: u64 = 741;

/// Two swarm seeds of the table with every fault the simulator offers.
/// Seed 3 (12 % loss, clogged links): a pull of a hundred entries read
/// them one round trip each, and the replica's queue ran nothing until
/// the pull ended, so its final read timed out (the node reads a batch in
/// one multi-read and runs its queue beside the puller, as the simulated
/// replica now does). Seed 2 (a wipe) once showed a writer wiped before
/// any fetch leaving a part nobody holds, which the other replicas' queues
/// tried to fetch for ever; since quorum inserts and cloning changed its
/// timing it loses nothing, and the wipes are tested below on a campaign
/// of wipes alone. Seed 9 of the swarm without `wipe`: below.
#[test]
fn the_table_swarm_seeds_that_found_bugs_stay_fixed() {
    let all = "partition,kill,pause,corrupt,diverge,clock,wipe,keeper-restart,drop-reply,stop-fetches,keeper-cut";
    let base = campaign(
        &["--workload", "insert-retry", "--time-limit", "30", "--nemesis", all],
        1,
    );
    let c = swarm_as_pinned(base.plan.clone(), 3);
    let sim = simulate(&c);
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "seed 3: {why}");

    // Wipes (seeds 8 and 9 of `--nemesis wipe`, which found the clone
    // reading its source's parts before its queue: an entry the source
    // ran between the two reads was never copied, and the clone lacked
    // that part for good, "after SYNC REPLICA, r1 and r2 hold different
    // rows"). A writer wiped before any fetch leaves parts nobody holds:
    // the other replicas drop them as lost, as the node does, the wiped
    // replica clones a healthy one, every replica ends holding the same
    // rows, and the checker finds the acknowledged rows lost (a wipe
    // exceeds what an insert without quorum promises).
    for seed in [8, 9] {
        let c = campaign(
            &["--workload", "insert-retry", "--time-limit", "30", "--nemesis", "wipe"],
            seed,
        );
        let sim = simulate(&c);
        let lines: Vec<&String> = sim.logs.values().flatten().collect();
        assert!(
            lines.iter().any(|l| l.contains("part_lost_forever")),
            "wipe seed {seed}: no replica dropped a part nobody holds"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("\"event\":\"cloned\"") && l.contains("\"new\":false")),
            "wipe seed {seed}: no wiped replica cloned"
        );
        let reads: Vec<Vec<String>> = sim
            .ops
            .iter()
            .filter(|o| o.f == "read" && o.kind == OpType::Ok)
            .map(|o| {
                let mut rows: Vec<String> = o.value.as_array().into_iter().flatten().map(Value::to_string).collect();
                rows.sort();
                rows
            })
            .collect();
        assert_eq!(reads.len(), 5, "wipe seed {seed}: every replica read");
        assert!(
            reads.windows(2).all(|p| p[0] == p[1]),
            "wipe seed {seed}: the replicas hold different rows"
        );
        let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
        assert_eq!(
            verdict,
            drift_checkers::checker::Verdict::Invalid,
            "wipe seed {seed}: {why}"
        );
        assert!(why.contains("was acknowledged"), "wipe seed {seed}: {why}");
    }

    // Seed 9 of the swarm without `wipe` (delays up to 100 ms, clogs,
    // duplicates): the keepers kept electing after the heal, the
    // replicas' sessions expired, and each new session read the queue one
    // entry per round trip; the final reads gave up (`unknown`). The
    // queue is now read in one pipelined round, as the node's multi-read
    // does, and the final phase may take 600 simulated seconds (and runs
    // on a calm network, which this seed no longer needs).
    let no_wipe = "partition,kill,pause,corrupt,diverge,clock,keeper-restart,drop-reply,stop-fetches,keeper-cut";
    let base = campaign(&["--workload", "insert-retry", "--nemesis", no_wipe], 1);
    let c = swarm_as_pinned(base.plan.clone(), 9);
    let sim = simulate(&c);
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(
        verdict,
        drift_checkers::checker::Verdict::Valid,
        "no-wipe swarm seed 9: {why}"
    );
}

/// Swarm seed 202 of insert-retry (five replicas, kill, 2 % loss, 13 %
/// reordering, snapshots every 100 entries): the leader's pull before a
/// merge found `log_pointer` moved under it (an earlier pull that gave up
/// had committed), read the queue again — and stopped there, the 108 log
/// entries past the reloaded pointer not copied. The merge chosen next
/// from that queue spanned parts it had never heard of (`0_0_23_2` over
/// blocks 13–15 and 19–22) and dropped acknowledged rows. A pull now
/// copies on from the reloaded pointer (`pulled_past_reload`), in the
/// simulator and the node alike.
#[test]
fn a_pull_that_reloads_the_queue_copies_on_past_it() {
    let base = campaign(&["--workload", "insert-retry"], 1);
    let c = swarm_as_pinned(base.plan.clone(), 202);
    let sim = simulate(&c);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(
        verdict,
        drift_checkers::checker::Verdict::Valid,
        "swarm seed 202: {why}"
    );
    assert!(
        sim.logs.values().flatten().any(|l| l.contains("pulled_past_reload")),
        "swarm seed 202 no longer reaches a pull that copies on after a reload"
    );
}

/// Servers that batch their inputs before advancing Raft, as the node's
/// driver does: a follower's commit index moves with the append that
/// carries it, before the advance writes the entries to the changelog.
/// The invariant read the committed entry from the changelog, found the
/// one the append replaces, and reported a divergence on seed 1 (node 1,
/// index 3163: term 2 against term 3); it reads Raft's view now.
#[test]
fn a_batched_commit_ahead_of_the_changelog_is_no_divergence() {
    let args = [
        "--workload",
        "insert-retry",
        "--nodes",
        "3",
        "--nemesis",
        "kill,partition",
        "--sim-batch-us",
        "100",
        "--time-limit",
        "30",
    ];
    let c = campaign(&args, 1);
    assert_eq!(c.plan.sim.as_ref().map(|s| s.batch_us), Some(100));
    let sim = simulate(&c);
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    assert!(
        sim.commits_ahead_of_log > 0,
        "no committed entry was seen ahead of its server's changelog: the case is not reached"
    );
    let (verdict, why) = sweep::judge(&c, &sim).expect("judged");
    assert_eq!(verdict, drift_checkers::checker::Verdict::Valid, "{why}");
}

/// An exit that one of the nemesis's waits saw is kept for the heal,
/// which looks for exits after its own wait: taken by the wait and
/// dropped, it was never seen, and a server that refused its data at
/// the heal stayed down (a real campaign's `corrupt` found it).
#[test]
fn an_exit_seen_while_waiting_is_kept_for_the_heal() {
    use crate::nemesis::Stage;
    let c = campaign(&["--workload", "register", "--nodes", "3"], 1);
    let w = exec::World::new(Cluster::new(sim_config(&c)));
    let h: H = Rc::new(RefCell::new(world::Recording::default()));
    let stage = stage::SimStage::new(&w, &h, false, 0);
    // a server that stops itself: nothing the harness did
    w.borrow_mut().cluster.kill(2, false);
    let waits = stage.clone();
    exec::run(
        &w,
        vec![Box::pin(async move {
            waits.sleep_until_ms(10).await;
        })],
        1_000_000,
    );
    let exits: Vec<u64> = stage.exits().iter().map(|e| e.node).collect();
    assert_eq!(exits, vec![2]);
    assert!(stage.exits().is_empty(), "an exit is handed out once");
}
