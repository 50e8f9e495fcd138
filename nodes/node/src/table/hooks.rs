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
//! * `fail-entry-commit-reply` — the same for the next queue entry's
//!   commit (a fetch's, a merge's): the entry is run again;
//! * `cut-after-commit` — the next commit multi succeeds, its reply is
//!   lost and the replica is cut from its coordinator at that moment (as
//!   `keeper-cut`), so it cannot learn the outcome in time: 319;
//! * `hold-commits` / `release-commits` — inserts that reach their commit
//!   wait (their block number taken, their lock held) until released;
//! * `corrupt-next-part` — the next part this replica serves to a fetching
//!   replica has one byte flipped;
//! * `truncate-next-part` — the next part served is cut short;
//! * `forge-next-part` — the next part served holds its rows twice, with
//!   a `checksums.txt` that matches (what a server without the writer's
//!   listing in the coordinator would accept);
//! * `drop-replies-on` / `drop-replies-off` — while on, every insert
//!   that succeeds closes its connection unanswered (the `drop-reply`
//!   nemesis);
//! * `keeper-cut` / `keeper-heal` — the replica loses its coordinator:
//!   its session is abandoned without a goodbye (the coordinator expires
//!   it, its ephemerals with it, after the session timeout) and no new one
//!   is made until healed (the `keeper-cut` nemesis);
//! * defects, for proving the checker: `defect-skip-dedup` (blocks are
//!   committed without looking for their id), `defect-no-block-id`
//!   (commits leave no block id behind) and `defect-lose-part` (a commit
//!   records the block id but neither the part nor its log entry, and
//!   the client is told success: the id survives, the data does not);
//!   `defect-off`. Never on unless asked for with the token: through the
//!   admin endpoint, or [`DEFECT_ENV`] at start, honoured only by a node
//!   whose fault hooks are on.

use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable a node with fault hooks arms a defect from
/// at start (`skip-dedup`, `no-block-id` or `lose-part`), so a defect
/// outlives the node's restarts within a campaign.
pub const DEFECT_ENV: &str = "DRIFT_TABLE_DEFECT";
/// The defects [`DEFECT_ENV`] may name.
pub const DEFECTS: [&str; 3] = ["skip-dedup", "no-block-id", "lose-part"];

#[derive(Default)]
pub struct Hooks {
    pub fetches_stopped: AtomicBool,
    pub drop_insert_reply: AtomicBool,
    pub fail_commit_reply: AtomicBool,
    pub fail_entry_commit_reply: AtomicBool,
    pub cut_after_commit: AtomicBool,
    pub hold_commits: AtomicBool,
    pub corrupt_next_part: AtomicBool,
    pub truncate_next_part: AtomicBool,
    pub forge_next_part: AtomicBool,
    pub drop_replies: AtomicBool,
    pub skip_dedup: AtomicBool,
    pub no_block_id: AtomicBool,
    pub lose_part: AtomicBool,
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
            "drop-replies-on" | "drop-replies-off" => {
                self.drop_replies.store(hook == "drop-replies-on", Ordering::SeqCst);
                return Ok(());
            }
            "defect-skip-dedup" => {
                self.skip_dedup.store(true, Ordering::SeqCst);
                return Ok(());
            }
            "defect-no-block-id" => {
                self.no_block_id.store(true, Ordering::SeqCst);
                return Ok(());
            }
            "defect-lose-part" => {
                self.lose_part.store(true, Ordering::SeqCst);
                return Ok(());
            }
            "defect-off" => {
                self.skip_dedup.store(false, Ordering::SeqCst);
                self.no_block_id.store(false, Ordering::SeqCst);
                self.lose_part.store(false, Ordering::SeqCst);
                return Ok(());
            }
            "drop-insert-reply" => &self.drop_insert_reply,
            "fail-commit-reply" => &self.fail_commit_reply,
            "fail-entry-commit-reply" => &self.fail_entry_commit_reply,
            "cut-after-commit" => &self.cut_after_commit,
            "hold-commits" => &self.hold_commits,
            "release-commits" => {
                self.hold_commits.store(false, Ordering::SeqCst);
                return Ok(());
            }
            "corrupt-next-part" => &self.corrupt_next_part,
            "truncate-next-part" => &self.truncate_next_part,
            "forge-next-part" => &self.forge_next_part,
            other => {
                return Err(format!(
                    "unknown table hook {other:?} (stop-fetches | resume-fetches | drop-insert-reply | drop-replies-on | drop-replies-off | fail-commit-reply | fail-entry-commit-reply | cut-after-commit | hold-commits | release-commits | corrupt-next-part | truncate-next-part | forge-next-part | keeper-cut | keeper-heal | defect-skip-dedup | defect-no-block-id | defect-lose-part | defect-off)"
                ))
            }
        };
        flag.store(true, Ordering::SeqCst);
        Ok(())
    }
}
