//! `drift sim`: a seed sweep of a simulated campaign, and `drift bench
//! sim`: how fast simulated time runs.

use super::{simulate, swarm, Simulated};
use crate::cli::{BenchSimArgs, SimArgs};
use crate::fail::Failure;
use crate::plan::{BackendKind, Campaign, Plan};
use drift_checkers::checker::Verdict;
use drift_checkers::registry;
use drift_checkers::{check_all, CheckContext, Checker, History};
use drift_results::store::Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A failing seed of a sweep: its campaign, what the simulation produced
/// (kept for the `--keep` lowest failing seeds only, which are stored),
/// the verdict and why.
type Finding = (u64, Campaign, Option<Simulated>, Verdict, String);

/// A seed's campaign: the plan as given, or varied by the seed (swarm).
fn campaign_of(base: &Plan, seed: u64, swarm_mode: bool) -> Campaign {
    if swarm_mode {
        swarm(base.clone(), seed)
    } else {
        Campaign::new(base.clone(), seed)
    }
}

/// The checkers' verdict on a simulated history, and why, in memory
/// (without shrinking a linearizability failure to its core: the stored
/// run of a failing seed gets the full report).
pub fn judge(c: &Campaign, sim: &Simulated) -> Result<(Verdict, String), Failure> {
    let bench = crate::run::bench_of(c);
    let checkers: Vec<Box<dyn Checker>> = bench
        .checkers
        .iter()
        .map(|&k| registry::build_with(k, bench.model, &bench.init, false).map_err(Failure::new))
        .collect::<Result<_, _>>()?;
    let lines: Vec<u64> = (1..=sim.ops.len() as u64).collect();
    let h = History::from_ops(std::path::Path::new("(simulated history)"), sim.ops.clone(), lines)
        .map_err(|e| Failure::new(format!("seed {}: {e}", c.seed)))?;
    let ctx = CheckContext::new(bench.budget, bench.mem_bytes);
    let composed = check_all(&checkers, &h, &ctx).map_err(|e| Failure::new(e.to_string()))?;
    let why: Vec<String> = composed
        .results
        .iter()
        .filter(|r| r.verdict != Verdict::Valid)
        .map(|r| {
            let detail = match r.checker.as_str() {
                "digest" => r.details["problems"].to_string(),
                "linearizable" if r.verdict == Verdict::Invalid => format!(
                    "{} of {} keys not linearizable",
                    r.details["keys_invalid"], r.details["keys"]
                ),
                _ => r.reason.clone().unwrap_or_default(),
            };
            format!("{} {}: {detail}", r.checker, r.verdict.as_str())
        })
        .collect();
    Ok((composed.verdict, why.join("; ")))
}

/// The sweep's command line for one seed: the arguments it was given,
/// with `--from SEED --seeds 1` in place of the range.
fn one_seed_command(seed: u64) -> String {
    let mut out = vec!["drift".to_string()];
    let mut args = std::env::args().skip(1).peekable();
    while let Some(a) = args.next() {
        let flag = a.split('=').next().unwrap_or("").to_string();
        if ["--from", "--seeds", "--jobs", "--stop-after", "--keep"].contains(&flag.as_str()) {
            if !a.contains('=') {
                args.next();
            }
            continue;
        }
        out.push(a);
    }
    out.push(format!("--from {seed} --seeds 1"));
    out.join(" ")
}

/// A simulated server that panics is caught, reported as a broken
/// invariant and taken down; its panic is one line here, not a backtrace
/// per seed.
pub(crate) fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        noteln!("  panic{at}: {what}");
    }));
}

/// `drift sim`.
pub fn sweep(args: SimArgs) -> Result<i32, Failure> {
    quiet_panics();
    let mut test = args.test;
    test.backend = BackendKind::Sim;
    if test.seed.is_some() {
        return Err(Failure::new(
            "drift sim: seeds come from --from and --seeds, not --seed",
        ));
    }
    if args.swarm && (test.sim_batch_us.is_some() || test.sim_read_rounds.is_some() || test.sim_log_sync.is_some()) {
        return Err(Failure::new(
            "drift sim --swarm draws --sim-batch-us, --sim-read-rounds and --sim-log-sync per seed: give none of them with --swarm",
        ));
    }
    let base = Plan::from_args(&test)?;
    let store = Store::new(&test.store);
    let seeds: Vec<u64> = (args.from..args.from.saturating_add(args.seeds)).collect();
    out!(
        "drift sim  seeds {}..={} ({}){}  {}",
        seeds[0],
        seeds[seeds.len() - 1],
        seeds.len(),
        if args.swarm { "  swarm" } else { "" },
        serde_json::to_string(&base).unwrap_or_default()
    );
    let next = AtomicU64::new(0);
    let failed_count = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let found: Mutex<Vec<Finding>> = Mutex::new(Vec::new());
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let started = Instant::now();
    let simulated_us = AtomicU64::new(0);
    interrupt_ends_the_sweep();
    std::thread::scope(|s| {
        for _ in 0..args.jobs {
            s.spawn(|| loop {
                if args.stop_after > 0 && failed_count.load(Ordering::Relaxed) >= args.stop_after {
                    return;
                }
                if crate::interrupt::first_signal().is_some() {
                    return;
                }
                let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&seed) = seeds.get(k) else { return };
                let c = campaign_of(&base, seed, args.swarm);
                // a panic outside the servers (which the cluster catches)
                // is a failing seed too, not the end of the sweep
                let sim = match std::panic::catch_unwind(|| simulate(&c)) {
                    Ok(sim) => sim,
                    Err(_) => {
                        failed_count.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut errs) = errors.lock() {
                            errs.push(format!(
                                "seed {seed}: the simulation panicked (above); again: {}",
                                one_seed_command(seed)
                            ));
                        }
                        continue;
                    }
                };
                simulated_us.fetch_add(sim.simulated_us, Ordering::Relaxed);
                match judge(&c, &sim) {
                    Ok((Verdict::Valid, _)) => {}
                    Ok((v, why)) => {
                        failed_count.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut f) = found.lock() {
                            f.push((seed, c, Some(sim), v, why));
                            // hold the simulations of the lowest failing
                            // seeds only: memory stays bounded
                            let held = f.iter().filter(|x| x.2.is_some()).count() as u64;
                            if held > args.keep {
                                if let Some(x) = f.iter_mut().filter(|x| x.2.is_some()).max_by_key(|x| x.0) {
                                    x.2 = None;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        if let Ok(mut errs) = errors.lock() {
                            errs.push(e.message);
                        }
                    }
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(50) {
                    note!(
                        "\r  {n} of {} seeds, {} failing, {:.0} s    ",
                        seeds.len(),
                        failed_count.load(Ordering::Relaxed),
                        started.elapsed().as_secs_f64()
                    );
                }
            });
        }
    });
    noteln!();
    let wall = started.elapsed();
    let mut found = found.into_inner().unwrap_or_default();
    found.sort_by_key(|f| f.0);
    let ran = done.load(Ordering::Relaxed);
    let signal = crate::interrupt::first_signal();
    if signal.is_some() {
        out!("  interrupted: {ran} of {} seeds ran", seeds.len());
    }
    let code = |worst: i32| signal.map_or(worst, crate::interrupt::exit_code);
    out!(
        "  {ran} seeds in {:.1} s ({:.1} simulated s per wall s over {} jobs)",
        wall.as_secs_f64(),
        simulated_us.load(Ordering::Relaxed) as f64 / 1e6 / wall.as_secs_f64().max(1e-9),
        args.jobs
    );
    let errors = errors.into_inner().unwrap_or_default();
    for e in &errors {
        out!("  error: {e}");
    }
    if found.is_empty() {
        if errors.is_empty() {
            out!("  no failing seed");
            return Ok(code(0));
        }
        return Ok(code(1));
    }
    let mut worst = if errors.is_empty() { 0 } else { 1 };
    out!("  {} failing seeds of {ran}", found.len());
    for (k, (seed, c, sim, verdict, why)) in found.into_iter().enumerate() {
        worst = worst.max(verdict.exit_code());
        let Some(sim) = sim.filter(|_| (k as u64) < args.keep) else {
            out!("seed {seed}: {} — {why}", verdict.as_str().to_uppercase());
            out!("  again    {}", one_seed_command(seed));
            continue;
        };
        // stored like any campaign, so replay, report and compare work
        let (run, mut info) = crate::run::create_run(&c, &store)?;
        super::write_run(&run, &sim)?;
        info.nemesis_schedule = Campaign::schedule_json(&sim.applied);
        crate::run::write_run_json(&run, &info)?;
        let judged = crate::run::judge_run(&c, &run, &info, &store)?;
        out!("seed {seed}: {} — {why}", verdict.as_str().to_uppercase());
        out!("  stored   {}", run.path.display());
        out!("  replay   drift replay {}", run.path.display());
        out!("  again    {}", one_seed_command(seed));
        out!(
            "  built    {} (the same seed gives the same run with this build)",
            drift_results::files::Versions::current(env!("CARGO_PKG_VERSION"), option_env!("DRIFT_GIT_SHA")).short()
        );
        if let Ok(r) = &judged.report {
            out!("  report   {}", r.display());
        }
    }
    Ok(code(worst))
}

/// The first SIGINT, SIGTERM or SIGHUP ends a sweep after the seeds
/// running (no new one starts; the workers look at
/// [`crate::interrupt::first_signal`]): what was found is still printed
/// and stored, and drift exits as the signal would have. A second one
/// ends it at once.
fn interrupt_ends_the_sweep() {
    crate::interrupt::on_signal(|sig, first| {
        if !first {
            std::process::exit(crate::interrupt::exit_code(sig));
        }
        out!("\n  interrupted: no new seed starts; the failing seeds found are stored once the seeds running end (interrupt again to stop at once)");
    });
}

/// `drift bench sim`: simulated seconds per wall second of a campaign
/// in one thread.
pub fn bench(args: BenchSimArgs) -> Result<i32, Failure> {
    quiet_panics();
    let mut test = args.test;
    test.backend = BackendKind::Sim;
    let base = Plan::from_args(&test)?;
    out!(
        "drift bench sim  {} nodes, {} for {} simulated s, nemesis {:?}",
        base.nodes,
        base.workload().name(),
        base.time_limit_s,
        base.nemeses.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    out!("| seed | simulated s | wall s | simulated s / wall s | events | history ops | verdict |");
    out!("|---|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for seed in args.from..args.from + args.seeds {
        let c = Campaign::new(base.clone(), seed);
        let started = Instant::now();
        let sim = simulate(&c);
        let wall = started.elapsed().max(Duration::from_micros(1));
        let (verdict, _) = judge(&c, &sim)?;
        let ratio = sim.simulated_us as f64 / 1e6 / wall.as_secs_f64();
        ratios.push(ratio);
        out!(
            "| {seed} | {:.1} | {:.2} | {ratio:.0} | {} | {} | {} |",
            sim.simulated_us as f64 / 1e6,
            wall.as_secs_f64(),
            sim.events,
            sim.ops.len(),
            verdict.as_str()
        );
    }
    ratios.sort_by(f64::total_cmp);
    out!("median: {:.0}× real time", ratios[ratios.len() / 2]);
    Ok(0)
}
