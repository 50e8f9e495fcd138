//! What the leader's cleanup removes from the shared log, and which
//! replicas it gives up on.
//!
//! A log entry may go once every replica that is not lost has copied it
//! (its `log_pointer` is past it), keeping at least
//! `min_replicated_logs_to_keep` entries. A replica that is not active and
//! is more than `max_replicated_logs_to_keep` entries behind the newest is
//! marked lost instead of holding the log back: when it comes back it
//! clones a healthy replica rather than replaying a log that is gone.

/// One replica's place in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaPointer {
    pub name: String,
    /// The index of the next log entry it will copy.
    pub log_pointer: u64,
    pub is_active: bool,
    pub is_lost: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogCleanup {
    /// Log entries with a lower index may be removed.
    pub remove_below: u64,
    /// Replicas to mark lost, by name.
    pub mark_lost: Vec<String>,
}

/// `newest` is the index of the newest log entry (none: nothing to do).
pub fn log_cleanup(newest: Option<u64>, replicas: &[ReplicaPointer], min_keep: u64, max_keep: u64) -> LogCleanup {
    let Some(newest) = newest else {
        return LogCleanup {
            remove_below: 0,
            mark_lost: Vec::new(),
        };
    };
    let mut mark_lost: Vec<String> = replicas
        .iter()
        .filter(|r| !r.is_lost && !r.is_active && newest.saturating_sub(r.log_pointer) > max_keep)
        .map(|r| r.name.clone())
        .collect();
    mark_lost.sort();
    let min_pointer = replicas
        .iter()
        .filter(|r| !r.is_lost && !mark_lost.contains(&r.name))
        .map(|r| r.log_pointer)
        .min()
        .unwrap_or(0);
    let keep_from = (newest + 1).saturating_sub(min_keep);
    LogCleanup {
        remove_below: min_pointer.min(keep_from),
        mark_lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, log_pointer: u64, is_active: bool) -> ReplicaPointer {
        ReplicaPointer {
            name: name.into(),
            log_pointer,
            is_active,
            is_lost: false,
        }
    }

    #[test]
    fn the_log_is_kept_for_the_slowest_replica_that_is_not_lost() {
        let c = log_cleanup(Some(100), &[r("a", 101, true), r("b", 40, true)], 10, 1000);
        assert_eq!(c.remove_below, 40);
        assert!(c.mark_lost.is_empty());
        // at least min_keep entries stay
        let c = log_cleanup(Some(100), &[r("a", 101, true)], 10, 1000);
        assert_eq!(c.remove_below, 91);
        // an inactive replica too far behind is lost and holds nothing back
        let c = log_cleanup(Some(100), &[r("a", 101, true), r("b", 5, false)], 10, 50);
        assert_eq!((c.remove_below, c.mark_lost), (91, vec!["b".to_string()]));
        // an active one catches up on its own
        let c = log_cleanup(Some(100), &[r("a", 101, true), r("b", 5, true)], 10, 50);
        assert_eq!((c.remove_below, c.mark_lost.len()), (5, 0));
        assert_eq!(log_cleanup(None, &[], 10, 50).remove_below, 0);
    }
}
