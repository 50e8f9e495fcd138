//! Failures of the run itself: bad input, bad arguments, setup. They all
//! exit 3 (docs/ARCHITECTURE.md, "Exit codes") with one line saying what and where.

/// Exit code of a run that failed before it could reach a verdict.
pub const EXIT_FAILED: i32 = 3;

/// Set once drift is interrupted (by the signal watcher): [`out_line`] then
/// lets a failed write pass instead of exiting.
pub static STDOUT_MAY_BE_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stdout (what `out!` expands to). When stdout is
/// gone (`drift cluster status | head -1`) the process ends quietly with
/// [`EXIT_FAILED`], as a pipe's writer does when its reader left, instead
/// of panicking as `println!` would; any other write error is reported.
pub fn out_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| stdout.write_all(b"\n"));
    match written {
        Ok(()) => {}
        // the terminal's Ctrl-C also ended a `| tee` drift writes into,
        // or a hang-up closed the terminal: the run goes on to stop its
        // servers and store its verdict, unheard
        Err(_) if STDOUT_MAY_BE_GONE.load(std::sync::atomic::Ordering::Relaxed) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(EXIT_FAILED),
        Err(e) => {
            noteln!("drift: writing to stdout: {e}");
            std::process::exit(EXIT_FAILED)
        }
    }
}

/// Writes to stderr (what `note!` and `noteln!` expand to): progress
/// lines and warnings, which a closed stderr (a `2>&1 | tee` the same
/// Ctrl-C ended) must not turn into a panic, as `eprint!` would, nor
/// into an abort when a panic hook writes there again.
pub fn err_text(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_fmt(args);
}

#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_FAILED,
            message: message.into(),
        }
    }
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.to_string())
    }
}
