//! `drift`: the one binary. This file only parses arguments, dispatches,
//! and maps outcomes to exit codes (0 valid, 1 invalid, 2 unknown, 3 the
//! run itself failed).

/// `println!` for drift's output: see [`fail::out_line`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::fail::out_line(format_args!($($arg)*))
    };
}

mod arg_values;
mod backend;
mod bench;
mod bench_harness;
mod bench_keeper;
mod bench_keeper_mem;
mod bench_keeper_zk;
mod bench_linear;
mod bench_repair;
mod bench_table;
mod campaign;
mod cgroup;
mod check;
mod claim;
mod cli;
mod clickhouse;
mod cluster;
mod compare;
mod container;
mod convert;
mod deletes;
mod docker;
mod events;
mod fail;
mod hosts;
mod image;
mod inserts;
mod judge;
mod junit;
mod local;
mod nemesis;
mod plan;
mod proxy;
mod recorder;
mod repair;
mod replyproxy;
mod run;
mod serve;
mod servers;
mod settle;
mod sim;
mod ssh;
mod sshcluster;

use clap::Parser;
use cli::{BenchWhat, Cli, Command};

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { fail::EXIT_FAILED } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let outcome = match cli.command {
        Command::Check(args) => check::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Bench(b) => match b.what {
            BenchWhat::Checker(args) => bench::checker(args),
            BenchWhat::Repair(args) => bench_repair::repair(args),
            BenchWhat::Keeper(args) if args.against.is_some() && args.znodes.is_some() => {
                bench_keeper_mem::against(&args)
            }
            BenchWhat::Keeper(args) if args.against.is_some() => bench_keeper_zk::against(&args),
            BenchWhat::Keeper(args) => bench_keeper::keeper(args),
            BenchWhat::Harness(args) => bench_harness::harness(args),
            BenchWhat::Table(args) => bench_table::table(args),
            BenchWhat::Sim(args) => sim::sweep::bench(args),
        },
        Command::Test(args) => campaign::run(args),
        Command::Replay(args) => campaign::replay(&args.run, args.junit),
        Command::Compare(args) => compare::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Node(args) => cluster::node(args),
        Command::Cluster(args) => cluster::cluster(args),
        Command::Repair(args) => repair::run(args),
        Command::Sim(args) => sim::sweep::sweep(args),
        Command::BuildImage => image::build_image(),
    };
    match outcome {
        Ok(code) => std::process::exit(code),
        Err(f) => {
            eprintln!("drift: {}", f.message);
            std::process::exit(f.code);
        }
    }
}
