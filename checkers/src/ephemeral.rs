//! `ephemeral`: no ephemeral znode outlives its session, and none vanishes
//! while its session lives. A session is one client process: it `create`s
//! ephemerals (value: the name), `read`s the children (value: the sorted
//! names; a read syncs first, so it sees every write acknowledged before
//! it began), and ends with `close` (acknowledged close) or `expire` (the
//! client walks away and the session must time out). A process whose op
//! ends `info` also ends its session, unacknowledged. The run ends with a
//! `final-read` after every session had time to expire.
//!
//! * outlived — a read that began after a session's acknowledged close, or
//!   the final read, lists an ephemeral of an ended session;
//! * vanished — a read of session S misses an ephemeral S created `ok`
//!   before the read began, although S was still alive after the read
//!   (a later create of S succeeded, which an expired session cannot do);
//! * unexpected — a listed name no create ever tried, or one whose create
//!   failed definitely.

use crate::checker::{elapsed_ms, CheckContext, CheckResult, Checker, Verdict};
use crate::history::{HistoryError, Process};
use crate::pairing::{History, Operation, Outcome};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Most violations listed per kind.
const LISTED_MAX: usize = 32;

pub struct Ephemeral;

/// One session's operations, in order.
#[derive(Default)]
struct Session<'h> {
    ops: Vec<&'h Operation>,
    /// Position where an acknowledged close completed.
    closed_at: Option<usize>,
}

fn names<'h>(h: &'h History, o: &Operation) -> Result<BTreeSet<&'h str>, HistoryError> {
    h.array_of(o)?
        .iter()
        .map(|e| {
            e.as_str().ok_or_else(|| HistoryError {
                at: h.location(o.complete.unwrap_or(o.invoke)),
                reason: format!("{} returned a name that is not a string: {e}", h.f_of(o)),
            })
        })
        .collect()
}

fn created_name<'h>(h: &'h History, o: &Operation) -> Result<&'h str, HistoryError> {
    h.invoke_op(o).value.as_str().ok_or_else(|| HistoryError {
        at: h.location(o.invoke),
        reason: format!("create needs a name, got {}", h.invoke_op(o).value),
    })
}

struct Findings {
    listed: BTreeMap<&'static str, Vec<Value>>,
    counts: BTreeMap<&'static str, u64>,
}

impl Findings {
    fn add(&mut self, kind: &'static str, v: Value) {
        *self.counts.entry(kind).or_default() += 1;
        let l = self.listed.entry(kind).or_default();
        if l.len() < LISTED_MAX {
            l.push(v);
        }
    }
}

impl Checker for Ephemeral {
    fn name(&self) -> &str {
        "ephemeral"
    }

    fn check(&self, h: &History, _ctx: &CheckContext) -> Result<CheckResult, HistoryError> {
        let started = Instant::now();
        let mut sessions: BTreeMap<u64, Session> = BTreeMap::new();
        // name -> (session, create outcome)
        let mut owner: BTreeMap<&str, (u64, Outcome)> = BTreeMap::new();
        let mut finals: Vec<&Operation> = Vec::new();
        for o in &h.operations {
            let Process::Client(p) = o.process else { continue };
            match h.f_of(o) {
                "final-read" => finals.push(o),
                "create" => {
                    owner.insert(created_name(h, o)?, (p, o.outcome));
                    sessions.entry(p).or_default().ops.push(o);
                }
                "close" if o.outcome == Outcome::Ok => {
                    let s = sessions.entry(p).or_default();
                    s.closed_at = o.complete;
                    s.ops.push(o);
                }
                _ => sessions.entry(p).or_default().ops.push(o),
            }
        }
        let mut found = Findings {
            listed: BTreeMap::new(),
            counts: BTreeMap::new(),
        };
        let line = |pos: usize| h.lines[pos];
        // what a name listed by read `o` says; the final read comes after
        // every session ended
        let judge = |name: &str, o: &Operation, last: bool| -> Option<(&'static str, Value)> {
            let read_line = line(o.complete.unwrap_or(o.invoke));
            match owner.get(name) {
                None => Some((
                    "unexpected",
                    json!({"name": name, "read_line": read_line, "final": last}),
                )),
                Some((q, Outcome::Fail)) => Some((
                    "unexpected",
                    json!({"name": name, "session": q, "create": "failed", "read_line": read_line, "final": last}),
                )),
                Some(&(q, _)) if last => Some((
                    "outlived",
                    json!({"name": name, "session": q, "read_line": read_line, "final": true}),
                )),
                Some(&(q, _)) => {
                    let closed = sessions.get(&q).and_then(|s| s.closed_at).filter(|&at| at < o.invoke)?;
                    Some((
                        "outlived",
                        json!({"name": name, "session": q, "closed_line": line(closed), "read_line": read_line}),
                    ))
                }
            }
        };
        let (mut reads, mut created_ok) = (0u64, 0u64);
        for (&p, s) in &sessions {
            // ephemerals this session created ok before the current op; a
            // process has one op at a time, so "before" is "earlier here"
            let mut mine: BTreeSet<&str> = BTreeSet::new();
            // the session's last successful create: proof it was alive
            let last_create_ok = s
                .ops
                .iter()
                .rposition(|l| h.f_of(l) == "create" && l.outcome == Outcome::Ok);
            for (k, o) in s.ops.iter().enumerate() {
                match (h.f_of(o), o.outcome) {
                    ("create", Outcome::Ok) => {
                        created_ok += 1;
                        mine.insert(created_name(h, o)?);
                    }
                    ("read", Outcome::Ok) => {
                        reads += 1;
                        let listed = names(h, o)?;
                        for n in &listed {
                            if let Some((kind, v)) = judge(n, o, false) {
                                found.add(kind, v);
                            }
                        }
                        if last_create_ok.is_some_and(|last| last > k) {
                            for n in mine.difference(&listed) {
                                let at = line(o.complete.unwrap_or(o.invoke));
                                found.add("vanished", json!({"name": n, "session": p, "read_line": at}));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut final_sizes = Vec::new();
        for o in finals.iter().filter(|o| o.outcome == Outcome::Ok) {
            let listed = names(h, o)?;
            final_sizes.push(listed.len());
            for n in listed {
                if let Some((kind, v)) = judge(n, o, true) {
                    found.add(kind, v);
                }
            }
        }
        let violations: u64 = found.counts.values().sum();
        let verdict = if violations > 0 {
            Verdict::Invalid
        } else if created_ok == 0 || finals.iter().all(|o| o.outcome != Outcome::Ok) {
            // nothing created tests nothing; without a final read,
            // "outlived" cannot be judged for sessions that expired rather
            // than closed
            Verdict::Unknown
        } else {
            Verdict::Valid
        };
        let reason = match verdict {
            Verdict::Invalid => Some(
                found
                    .counts
                    .iter()
                    .map(|(k, n)| format!("{n} {k}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            Verdict::Unknown if created_ok == 0 => Some("no ephemeral create succeeded: nothing to judge".to_string()),
            Verdict::Unknown => Some("no final read succeeded".to_string()),
            _ => None,
        };
        Ok(CheckResult {
            checker: self.name().into(),
            verdict,
            reason,
            elapsed_ms: elapsed_ms(started),
            details: json!({
                "sessions": sessions.len(),
                "closed": sessions.values().filter(|s| s.closed_at.is_some()).count(),
                "expired": sessions.values().filter(|s| s.ops.iter().any(|o| h.f_of(o) == "expire" && o.outcome == Outcome::Ok)).count(),
                "created_ok": created_ok,
                "reads": reads,
                "final_read_sizes": final_sizes,
                "violations": found.counts,
                "listed": found.listed,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(script: &[(u64, &str, &str, Value)]) -> CheckResult {
        let h = History::from_script(script).unwrap();
        Ephemeral.check(&h, &CheckContext::new(None, 1 << 30)).unwrap()
    }

    fn final_read(names: Value) -> [(u64, &'static str, &'static str, Value); 2] {
        [
            (99, "invoke", "final-read", Value::Null),
            (99, "ok", "final-read", names),
        ]
    }

    #[test]
    fn sessions_that_close_and_expire_cleanly_are_valid() {
        let mut s = vec![
            (1, "invoke", "create", json!("a")),
            (1, "ok", "create", json!("a")),
            (2, "invoke", "create", json!("b")),
            (2, "ok", "create", json!("b")),
            (1, "invoke", "read", Value::Null),
            (1, "ok", "read", json!(["a", "b"])),
            (1, "invoke", "close", Value::Null),
            (1, "ok", "close", Value::Null),
            (2, "invoke", "read", Value::Null),
            (2, "ok", "read", json!(["b"])),
            (2, "invoke", "expire", Value::Null),
            (2, "ok", "expire", Value::Null),
        ];
        s.extend(final_read(json!([])));
        let r = check(&s);
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.details);
        assert_eq!(r.details["closed"], 1);
        assert_eq!(r.details["expired"], 1);
    }

    #[test]
    fn an_ephemeral_seen_after_its_session_closed_outlived_it() {
        let mut s = vec![
            (1, "invoke", "create", json!("a")),
            (1, "ok", "create", json!("a")),
            (1, "invoke", "close", Value::Null),
            (1, "ok", "close", Value::Null),
            (2, "invoke", "read", Value::Null),
            (2, "ok", "read", json!(["a"])),
        ];
        s.extend(final_read(json!([])));
        let r = check(&s);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["violations"]["outlived"], 1);
        // a read that began before the close completed may see it
        let s = vec![
            (1, "invoke", "create", json!("a")),
            (1, "ok", "create", json!("a")),
            (2, "invoke", "read", Value::Null),
            (1, "invoke", "close", Value::Null),
            (1, "ok", "close", Value::Null),
            (2, "ok", "read", json!(["a"])),
            (99, "invoke", "final-read", Value::Null),
            (99, "ok", "final-read", json!([])),
        ];
        assert_eq!(check(&s).verdict, Verdict::Valid);
    }

    #[test]
    fn the_final_read_must_find_no_ephemeral_of_an_expired_session() {
        let mut s = vec![
            (1, "invoke", "create", json!("a")),
            (1, "ok", "create", json!("a")),
            (1, "invoke", "expire", Value::Null),
            (1, "ok", "expire", Value::Null),
        ];
        s.extend(final_read(json!(["a"])));
        let r = check(&s);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["listed"]["outlived"][0]["final"], true);
        // no final read: nothing to judge expiry by
        assert_eq!(check(&s[..4]).verdict, Verdict::Unknown);
    }

    #[test]
    fn an_ephemeral_missing_while_its_session_lives_vanished() {
        let base = [
            (1, "invoke", "create", json!("a")),
            (1, "ok", "create", json!("a")),
            (1, "invoke", "read", Value::Null),
            (1, "ok", "read", json!([])),
        ];
        // the session proves it was alive after the read
        let mut s = base.to_vec();
        s.extend([(1, "invoke", "create", json!("b")), (1, "ok", "create", json!("b"))]);
        s.extend(final_read(json!([])));
        let r = check(&s);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["violations"]["vanished"], 1);
        // without that proof the session may have expired: no verdict on it
        let mut s = base.to_vec();
        s.extend(final_read(json!([])));
        assert_eq!(check(&s).verdict, Verdict::Valid);
    }

    #[test]
    fn names_nobody_created_or_whose_create_failed_are_unexpected() {
        let mut s = vec![
            (1, "invoke", "create", json!("a")),
            (1, "fail", "create", Value::Null),
            (2, "invoke", "read", Value::Null),
            (2, "ok", "read", json!(["a", "zz"])),
        ];
        s.extend(final_read(json!([])));
        let r = check(&s);
        assert_eq!(r.details["violations"]["unexpected"], 2, "{}", r.details);
    }

    #[test]
    fn a_name_whose_create_failed_is_unexpected_in_any_read_and_an_unknown_create_is_not() {
        let mut s = vec![
            (1, "invoke", "create", json!("a")),
            (1, "fail", "create", Value::Null),
            (2, "invoke", "create", json!("b")),
            (2, "info", "create", Value::Null),
            (3, "invoke", "read", Value::Null),
            (3, "ok", "read", json!(["b"])),
        ];
        s.extend(final_read(json!(["a"])));
        let r = check(&s);
        assert_eq!(r.details["violations"], json!({"unexpected": 1}), "{}", r.details);
        assert_eq!(r.details["listed"]["unexpected"][0]["final"], true);
    }

    #[test]
    fn a_read_that_is_not_a_list_of_names_is_a_history_error() {
        let h = History::from_script(&[(1, "invoke", "read", Value::Null), (1, "ok", "read", json!(3))]).unwrap();
        let e = Ephemeral.check(&h, &CheckContext::new(None, 1 << 30)).err().unwrap();
        assert!(e.reason.contains("must return an array"), "{}", e.reason);
    }
}
