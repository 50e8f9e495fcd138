//! Faults the servers inflict on themselves through their token-guarded
//! hooks: the table's (`drop-reply`, `stop-fetches`, `keeper-cut`), the
//! kv service's (`gc-tombstones`, `skip-repair`), and the keeper's
//! `diverge` and `clock`; and their part of the heal (every hook off,
//! every clock back).

use super::Fault;
use crate::backend::Faults;

/// The hook command of a table or kv fault's start or stop.
pub(super) fn hook_command(fault: &Fault, start: bool) -> Option<String> {
    Some(
        match (fault, start) {
            (Fault::DropReply, true) => "table drop-replies-on",
            (Fault::DropReply, false) => "table drop-replies-off",
            (Fault::StopFetches, true) => "table stop-fetches",
            (Fault::StopFetches, false) => "table resume-fetches",
            (Fault::KeeperCut, true) => "table keeper-cut",
            (Fault::KeeperCut, false) => "table keeper-heal",
            (Fault::GcTombstones { grace_ms }, true) => return Some(format!("kv gc-grace {grace_ms}")),
            (Fault::GcTombstones { .. }, false) => "kv gc-grace off",
            (Fault::SkipRepair, true) => "kv repair-off",
            (Fault::SkipRepair, false) => "kv repair-on",
            _ => return None,
        }
        .to_string(),
    )
}

/// Sends `cmd` to each of `nodes`' hooks; what each answered.
pub(super) fn hooks_on(c: &dyn Faults, nodes: &[u64], cmd: &str) -> String {
    nodes
        .iter()
        .map(|&n| match c.admin(n, cmd) {
            Ok(a) => format!("{cmd} on node {n}: {a}"),
            Err(e) => format!("{cmd} on node {n} failed: {e}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `diverge`: node `n`'s next entry applied differently — a follower's
/// (a leader's divergence would be every replica's).
pub(super) fn diverge(c: &mut dyn Faults, n: u64) -> String {
    let leader = c.leader();
    let target = if Some(n) == leader {
        c.ids()
            .into_iter()
            .find(|&i| Some(i) != leader && c.is_up(i))
            .unwrap_or(n)
    } else {
        n
    };
    match c.admin(target, "diverge") {
        Ok(a) => format!("diverge armed on node {target}: {a}"),
        Err(e) => format!("diverge on node {target} failed: {e}"),
    }
}

/// `clock`: node `n`'s entry times (and kv timestamps) offset by
/// `offset_ms`; 0 at the stop.
pub(super) fn clock(c: &mut dyn Faults, n: u64, offset_ms: i64) -> String {
    c.admin(n, &format!("clock {offset_ms}"))
        .unwrap_or_else(|e| e.to_string())
}

/// The heal's part on one server that is up: its clock back, a
/// divergence armed and not yet applied taken back (else the final
/// phase's first write would stop the server after the heal), and with
/// `table` and `kv` every table and kv hook off. What went wrong.
pub(super) fn heal(c: &mut dyn Faults, i: u64, table: bool, kv: bool) -> Vec<String> {
    let _ = c.admin(i, "clock 0");
    let _ = c.admin(i, "diverge off");
    let mut faults = Vec::new();
    if table {
        faults.extend([Fault::DropReply, Fault::StopFetches, Fault::KeeperCut]);
    }
    if kv {
        faults.extend([Fault::GcTombstones { grace_ms: 0 }, Fault::SkipRepair]);
    }
    let mut notes = Vec::new();
    for f in faults {
        let cmd = hook_command(&f, false).expect("a hooked fault");
        if let Err(e) = c.admin(i, &cmd) {
            notes.push(format!("node {i}: {cmd}: {e}"));
        }
    }
    notes
}
