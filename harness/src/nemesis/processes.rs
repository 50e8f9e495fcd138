//! Processes: `kill` (and the restart at its stop), `pause` (SIGSTOP,
//! SIGCONT at the stop), `keeper-restart` (a rolling restart); the
//! restart of whatever is down, which ends every fault that leaves a
//! server stopped; and their part of the heal.

use super::Stage;
use crate::backend::{Faults, Part};
use std::time::Duration;

/// How long a server restarted by `keeper-restart` gets to answer again
/// before the next one is restarted anyway.
const ROLLING_RESTART_WAIT_MS: u64 = 15_000;

/// `keeper-restart`: each of `nodes` stopped (SIGTERM) and started again,
/// the next once this one answers (or [`ROLLING_RESTART_WAIT_MS`]
/// passed). The cluster is held per step, not for the whole restart.
pub(super) async fn rolling_restart<S: Stage>(s: &S, nodes: &[u64], part: Part) -> String {
    let mut out = Vec::new();
    for &n in nodes {
        let started = s.with_cluster(|c, _| {
            c.stop_part(n, part, Duration::from_secs(3));
            c.start_part(n, part)
        });
        match started {
            None => return super::POISONED.into(),
            Some(Err(e)) => {
                out.push(format!("node {n}: {e}"));
                continue;
            }
            Some(Ok(())) => {}
        }
        let deadline = s.now_ms() + ROLLING_RESTART_WAIT_MS;
        let back = loop {
            let back = s
                .with_cluster(|c, _| c.four(n, "ruok").as_deref() == Some("imok"))
                .unwrap_or(false);
            if back || s.now_ms() >= deadline || !s.sleep_until_ms(s.now_ms() + 100).await {
                break back;
            }
        };
        out.push(if back {
            format!("restarted {n}")
        } else {
            format!(
                "restarted {n} (not answering after {}s)",
                ROLLING_RESTART_WAIT_MS / 1000
            )
        });
    }
    out.join("; ")
}

/// `kill`: each of `nodes` (its `part`) killed with SIGKILL.
pub(super) fn kill(c: &mut dyn Faults, nodes: &[u64], part: Part) -> String {
    for &n in nodes {
        c.kill_part(n, part);
    }
    format!("killed {:?}{}", nodes, part_note(part))
}

/// `pause`: each of `nodes` (its `part`) stopped with SIGSTOP.
pub(super) fn pause(c: &mut dyn Faults, nodes: &[u64], part: Part) -> String {
    for &n in nodes {
        c.pause_part(n, part);
    }
    format!("paused {:?}{}", nodes, part_note(part))
}

/// The stop of `pause`: each of `nodes` continued.
pub(super) fn resume(c: &mut dyn Faults, nodes: &[u64]) -> String {
    for &n in nodes {
        c.resume(n);
    }
    "resumed".into()
}

/// Every server that is down started again: the stop of every fault that
/// leaves one stopped (`kill`, `corrupt`, `wipe`, `keeper-restart`, and
/// `diverge`, whose replica the digest stops).
pub(super) fn restart_down(c: &mut dyn Faults) -> String {
    let mut out = Vec::new();
    for i in c.ids() {
        if !c.is_up(i) {
            out.push(match c.start(i) {
                Ok(()) => format!("restarted {i}"),
                Err(e) => e.to_string(),
            });
        }
    }
    out.join("; ")
}

/// " (replicas)" and the like: which processes a step acted on, for
/// what it says it did.
pub(super) fn part_note(part: Part) -> String {
    match part {
        Part::Node => String::new(),
        Part::Replica => " (replicas)".into(),
        Part::Coordinator => " (coordinators)".into(),
        Part::ReplicaCoordinator => " (replicas from coordinators)".into(),
    }
}
