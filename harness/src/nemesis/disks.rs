//! Disks: `corrupt` (a server killed, one of its changelog or snapshot
//! files truncated or a byte flipped, or its data dir dropped) and `wipe`
//! (a server killed and its data dir dropped, keeper and table alike).
//! Their stop is the restart of what is down ([`super::processes`]).

use super::processes::part_note;
use super::CorruptMode;
use crate::backend::{Damage, Faults, Part};

/// Kills node `n` (its `part`) and damages its files as `mode` says.
pub(super) fn corrupt(c: &mut dyn Faults, n: u64, mode: CorruptMode, pick: u64, part: Part) -> String {
    if let Some(why) = c.refuse_disk_fault(n) {
        return why;
    }
    c.kill_part(n, part);
    let what = match mode {
        CorruptMode::Wipe => c
            .wipe_part(n, part)
            .map(|_| format!("wiped node {n}{}", part_note(part))),
        CorruptMode::Truncate => c.corrupt(n, Damage::Truncate, pick),
        CorruptMode::Flip => c.corrupt(n, Damage::Flip, pick),
    };
    what.unwrap_or_else(|e| e.to_string())
}
