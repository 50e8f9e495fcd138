//! The table's fault hooks, reachable only through the node's
//! token-guarded admin endpoint (`<token> table <hook> [table]`): each
//! forces one failure deterministically, so tests and nemeses never wait
//! and hope.
//!
//! * `stop-fetches` / `resume-fetches` — the replica's fetches fail (and
//!   back off) until resumed;
//! * `drop-insert-reply` — the next insert that succeeds closes its HTTP
//!   connection without an answer (the client cannot know it committed);
//! * `fail-commit-reply` — the next commit multi succeeds at the
//!   coordinator but the replica treats the reply as lost and must find
//!   out what happened;
//! * `corrupt-next-part` — the next part this replica serves to a fetching
//!   replica has one byte flipped;
//! * `truncate-next-part` — the next part served is cut short.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
pub struct Hooks {
    pub fetches_stopped: AtomicBool,
    pub drop_insert_reply: AtomicBool,
    pub fail_commit_reply: AtomicBool,
    pub corrupt_next_part: AtomicBool,
    pub truncate_next_part: AtomicBool,
}

impl Hooks {
    /// Takes a one-shot hook: true once after it was armed.
    pub fn take(flag: &AtomicBool) -> bool {
        flag.swap(false, Ordering::SeqCst)
    }

    /// Applies a hook command; the answer for the admin client.
    pub fn apply(&self, hook: &str) -> Result<(), String> {
        let flag = match hook {
            "stop-fetches" => {
                self.fetches_stopped.store(true, Ordering::SeqCst);
                return Ok(());
            }
            "resume-fetches" => {
                self.fetches_stopped.store(false, Ordering::SeqCst);
                return Ok(());
            }
            "drop-insert-reply" => &self.drop_insert_reply,
            "fail-commit-reply" => &self.fail_commit_reply,
            "corrupt-next-part" => &self.corrupt_next_part,
            "truncate-next-part" => &self.truncate_next_part,
            other => {
                return Err(format!(
                    "unknown table hook {other:?} (stop-fetches | resume-fetches | drop-insert-reply | fail-commit-reply | corrupt-next-part | truncate-next-part)"
                ))
            }
        };
        flag.store(true, Ordering::SeqCst);
        Ok(())
    }
}
