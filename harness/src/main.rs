//! `drift`: the one binary. This file only parses arguments, dispatches,
//! and maps outcomes to exit codes (0 valid, 1 invalid, 2 unknown, 3 the
//! run itself failed).

/// `println!` for drift's output: see [`fail::out_line`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::fail::out_line(format_args!($($arg)*))
    };
}

/// `eprint!` for drift's progress and warnings: see [`fail::err_text`].
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::fail::err_text(format_args!($($arg)*))
    };
}

/// `eprintln!` for drift's progress and warnings: see [`fail::err_text`].
macro_rules! noteln {
    () => {
        $crate::fail::err_text(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::fail::err_text(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// mimalloc instead of the C library's allocator: the node's write path
/// allocates many small, short-lived buffers (frames, entries, answers),
/// and glibc's malloc and free took a fifth of a keeper server's CPU
/// under set at 64 clients (BENCHMARKS.md, "mimalloc for good"). How it
/// gives memory back differs by command: see [`tune_allocator`].
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's option number for the purge delay (`mi_option_t` in the
/// `mimalloc.h` that `libmimalloc-sys` builds; the crate leaves it
/// unnamed).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// How a command uses memory, for [`tune_allocator`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemoryUse {
    /// Most commands: mimalloc's defaults.
    Default,
    /// `drift check`, whose `--mem-mb` caps the search.
    Capped,
    /// `drift node`: a server whose tree grows under load.
    Server,
}

/// mimalloc's defaults suit most commands: a page that empties goes back
/// to the system a second later, which spares the node a system call per
/// freed page under load, and its arenas ask for transparent huge pages.
///
/// `drift check`, whose `--mem-mb` caps the search, gives pages back at
/// once, so that the cap bounds the process and not only the search's
/// tables (the search frees and allocates large tables): `drift check
/// --mem-mb 48` peaked at 102 MB of RSS with the defaults, 79 MB so, 69 MB
/// on glibc's allocator.
///
/// `drift node` runs without transparent huge pages. Its first touch of
/// a huge page (a tree that grows) has the kernel zero 2 MiB on the
/// thread that touched it, the server's loop as often as not: under
/// multi at 64 sessions a tenth of the servers' CPU went to zeroing
/// pages, and each such fault holds up every request queued behind the
/// loop (BENCHMARKS.md, "Small pages for the node"). The process-wide
/// switch (`PR_SET_THP_DISABLE`) is used rather than mimalloc's option,
/// which is read as it starts, before `main`.
fn tune_allocator(use_: MemoryUse) {
    match use_ {
        MemoryUse::Default => {}
        // SAFETY: sets one of mimalloc's options, a plain value it reads
        // when it next purges; called before any thread starts (the call
        // itself is not thread-safe)
        MemoryUse::Capped => unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) },
        MemoryUse::Server => {
            // SAFETY: a prctl with plain integer arguments; it changes
            // only how the kernel backs this process's future page faults
            let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
            if r != 0 {
                // a kernel without the switch: the node runs as before
                noteln!(
                    "drift: transparent huge pages stay on for this node (prctl: {})",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
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
mod interrupt;
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
    tune_allocator(match cli.command {
        Command::Check(_) => MemoryUse::Capped,
        Command::Node(_) => MemoryUse::Server,
        _ => MemoryUse::Default,
    });
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
            noteln!("drift: {}", f.message);
            std::process::exit(f.code);
        }
    }
}

#[cfg(test)]
mod allocator_tests {
    /// The option number is mimalloc's purge delay, whose default is
    /// 1,000 ms (another option at that number, after an upgrade of
    /// `libmimalloc-sys`, would fail this).
    #[test]
    fn the_purge_delay_option_is_the_one_named() {
        // SAFETY: reads an option's value
        let ms = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(ms, 1000);
    }
}
