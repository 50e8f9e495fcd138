//! SIGINT, SIGTERM and SIGHUP for the commands that own servers (a
//! campaign, a benchmark) or findings not yet stored (a simulator
//! sweep): without a handler the signal ends drift at once, and what it
//! started outlives it (containers, remote processes, a benchmark's
//! clusters, which are made to outlive the command that started them),
//! or what it found is lost.
//!
//! One thread watches for the signals and hands each to the handler the
//! command set last ([`on_signal`]); the signal handler itself only
//! stores the signal's number. Two signals within one look (50 ms) count
//! as one.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

/// Called with the signal's number and whether it is the first handled.
type Handler = Box<dyn Fn(i32, bool) + Send>;

/// The first signal a handler was called for, 0 while none was.
static FIRST: AtomicI32 = AtomicI32::new(0);

/// What a signal does now (set by [`on_signal`] before any signal is
/// caught).
static HANDLER: Mutex<Option<Handler>> = Mutex::new(None);

/// How often the watcher looks.
const LOOK: Duration = Duration::from_millis(50);

/// From now on each SIGINT, SIGTERM or SIGHUP calls `handler` with the
/// signal's number and whether it is the first (a command ends its work
/// early on the first, at once on another), on the watcher's thread (the
/// handler may block, or exit the process). Replaces the handler set
/// before. From the first signal on, a write to a stdout that is gone no
/// longer ends drift: the same Ctrl-C may have ended the `| tee` it
/// writes into, and the command still has servers to stop or findings to
/// store.
pub fn on_signal(handler: impl Fn(i32, bool) + Send + 'static) {
    watch();
    *HANDLER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(handler));
}

/// The first signal handled, if one was.
pub fn first_signal() -> Option<i32> {
    Some(FIRST.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// The exit code a shell gives a process a signal ended: 128 plus its
/// number.
pub fn exit_code(signal: i32) -> i32 {
    128 + signal
}

fn watch() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // the signal that came since the last look, 0 while none has
        let came = Arc::new(AtomicUsize::new(0));
        let seen = came.clone();
        let look = move || loop {
            std::thread::sleep(LOOK);
            let signal = seen.swap(0, Ordering::SeqCst);
            if signal != 0 {
                // held while it runs: a command setting its handler then
                // waits for this one to finish
                if let Some(h) = HANDLER.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    let first = FIRST
                        .compare_exchange(0, signal as i32, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok();
                    crate::fail::STDOUT_MAY_BE_GONE.store(true, Ordering::SeqCst);
                    h(signal as i32, first);
                }
            }
        };
        // the watcher first: a signal caught with no one to see it would
        // leave drift deaf to Ctrl-C
        if let Err(e) = std::thread::Builder::new().name("interrupt".into()).spawn(look) {
            noteln!("warning: drift cannot stop what it started when interrupted: {e}");
            return;
        }
        for signal in [
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ] {
            if let Err(e) = signal_hook::flag::register_usize(signal, came.clone(), signal as usize) {
                noteln!("warning: drift cannot stop what it started when interrupted: {e}");
            }
        }
    });
}
