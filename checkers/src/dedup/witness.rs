//! Rule 6a: the coordinator's witness of block ids.
//!
//! Where drift's keeper coordinates the table, the run records every
//! creation and removal of a block id (a child of a `blocks` node) the
//! keeper applied, in zxid order, with the id's ctime — the time the
//! table's cleanup orders ids by — and every block id a server computed
//! for an attempt, under the attempt's `query_id`. With both, dedup is
//! judged exactly rather than from the client's side:
//!
//! * a key may be stored at most as many times as its id was created (a
//!   block is committed in the same multi that creates its id, so a copy
//!   beyond that passed the id check with the id present, or never looked);
//! * each creation after the first follows a removal; the removal was the
//!   window's to make only if, when it was applied, at least `window`
//!   other present ids of the table were as new as the removed one, or the
//!   removed id was older than the newest by more than the window's
//!   seconds. A copy made possible only by a removal inside the window is
//!   a duplicate inside the window, whoever removed the id.
//!
//! No indeterminate attempt widens anything: what the coordinator did is
//! known, not bounded.

use crate::history::{HistoryError, Process};
use crate::pairing::History;
use std::collections::{BTreeMap, BTreeSet};

/// The history line (`info` of the nemesis) for one block id created or
/// removed by the coordinator.
pub const WITNESS_F: &str = "block-id";
/// The history line for one block id a server computed for an attempt.
pub const BLOCK_OF_F: &str = "insert-block";

/// A removal of an id, judged against the window.
#[derive(Debug, Clone)]
pub struct Removal {
    pub zxid: i64,
    /// Whether the window allowed it (see the module's rules).
    pub allowed: bool,
    /// How it was judged, for a finding.
    pub why: String,
}

/// One block id's life as the coordinator applied it.
#[derive(Debug, Default, Clone)]
pub struct IdLife {
    /// Creations in zxid order: (zxid, ctime ms).
    pub creates: Vec<(i64, i64)>,
    /// Removals in zxid order.
    pub removals: Vec<Removal>,
    /// Creations each following a removal the window allowed.
    pub renewed: u64,
}

/// What the witness allows a key: at most `copies` copies, and why.
#[derive(Debug, Clone)]
pub struct Allowance {
    pub copies: u64,
    pub created: u64,
    pub why: String,
}

#[derive(Debug, Default)]
pub struct Witness {
    /// Block ids by their name (the last part of the path).
    pub ids: BTreeMap<String, IdLife>,
    /// Block ids each attempt's server computed, by query id, in the
    /// order it logged them.
    pub by_query: BTreeMap<String, Vec<String>>,
    /// Lines of the coordinator read.
    pub events: u64,
    /// Removals the window did not allow.
    pub premature: u64,
}

fn bad(h: &History, at: usize, why: impl Into<String>) -> HistoryError {
    HistoryError {
        at: h.location(at),
        reason: why.into(),
    }
}

/// One witnessed event: (zxid, is a creation, table's blocks path, id, ctime).
type Event = (i64, bool, String, String, Option<i64>);

/// A table's ids present: by name (their ctime), and by (ctime, name).
type Present = (BTreeMap<String, i64>, BTreeSet<(i64, String)>);

impl Witness {
    /// Reads the witness lines of `h`, and judges each removal against a
    /// window of `window` ids and `window_ms` (ctime order).
    pub fn read(h: &History, window: u64, window_ms: i64) -> Result<Witness, HistoryError> {
        let mut w = Witness::default();
        let mut events: Vec<Event> = Vec::new();
        for &i in &h.nemesis {
            let op = &h.ops[i];
            if op.process != Process::Nemesis {
                continue;
            }
            let v = &op.value;
            if op.f == WITNESS_F {
                let zxid = v["zxid"]
                    .as_i64()
                    .ok_or_else(|| bad(h, i, "a block-id line without a numeric zxid"))?;
                let path = v["path"]
                    .as_str()
                    .ok_or_else(|| bad(h, i, "a block-id line without a path"))?;
                let (parent, id) = path
                    .rsplit_once('/')
                    .filter(|(_, id)| !id.is_empty())
                    .ok_or_else(|| bad(h, i, format!("block-id path {path:?} names no id")))?;
                let create = match v["op"].as_str() {
                    Some("create") => true,
                    Some("remove") => false,
                    other => return Err(bad(h, i, format!("block-id op {other:?}: expected create or remove"))),
                };
                events.push((zxid, create, parent.to_string(), id.to_string(), v["ctime_ms"].as_i64()));
            } else if op.f == BLOCK_OF_F {
                if let (Some(q), Some(id)) = (v["query_id"].as_str(), v["block_id"].as_str()) {
                    w.by_query.entry(q.to_string()).or_default().push(id.to_string());
                }
            }
        }
        // a multi that removes and creates one path lists the removal first
        events.sort_by_key(|e| (e.0, e.1));
        // a create and a remove of one id in one multi, the id absent
        // after it (no ctime), is a check that the id is absent (as
        // ClickHouse's block-number lock makes it), not an id's life
        let checks: BTreeSet<(i64, String, String)> = events
            .iter()
            .filter(|e| e.1 && e.4.is_none())
            .map(|e| (e.0, e.2.clone(), e.3.clone()))
            .collect();
        events.retain(|e| !checks.contains(&(e.0, e.2.clone(), e.3.clone())));
        w.events = events.len() as u64;
        // per table: the ids present, by name and by (ctime, name)
        let mut present: BTreeMap<String, Present> = BTreeMap::new();
        for (zxid, create, parent, id, ctime) in events {
            let (names, by_age) = present.entry(parent).or_default();
            let life = w.ids.entry(id.clone()).or_default();
            if create {
                let ctime = ctime.unwrap_or(i64::MIN);
                if let Some(old) = names.insert(id.clone(), ctime) {
                    by_age.remove(&(old, id.clone()));
                }
                by_age.insert((ctime, id));
                if !life.creates.is_empty() && life.removals.last().is_some_and(|r| r.allowed) {
                    life.renewed += 1;
                }
                life.creates.push((zxid, ctime));
                continue;
            }
            let removal = match names.remove(&id) {
                None => Removal {
                    zxid,
                    allowed: true,
                    why: "its creation was not witnessed".into(),
                },
                Some(ctime) => {
                    by_age.remove(&(ctime, id.clone()));
                    let newest = by_age.last().map_or(ctime, |(t, _)| *t).max(ctime);
                    let as_new = by_age.range((ctime, String::new())..).count() as u64;
                    let age_ms = newest.saturating_sub(ctime);
                    let allowed = as_new >= window || age_ms > window_ms;
                    let mut why = format!(
                        "removed at zxid {zxid:#x} with {as_new} other id(s) as new present (window {window}) and {:.3} s older than the newest (window {:.3} s)",
                        age_ms as f64 / 1e3,
                        window_ms as f64 / 1e3
                    );
                    // the id's earlier life, if it had one: a remover that
                    // judged the id by an earlier creation's ctime (a time
                    // it kept by name) would have found it outside the window
                    let earlier = life.creates.iter().rev().skip(1).map(|c| c.1).min();
                    if let Some(first) = earlier.filter(|_| !allowed) {
                        let as_new_then = by_age.range((first, String::new())..).count() as u64;
                        if as_new_then >= window || newest.saturating_sub(first) > window_ms {
                            why.push_str(&format!(
                                "; by the ctime of its earlier creation ({:.3} s older than the newest) it would have been outside the window: the remover judged the id made again by the time of its first life (a ctime kept by name, as ClickHouse before 19.9 caches it)",
                                newest.saturating_sub(first) as f64 / 1e3
                            ));
                        }
                    }
                    Removal { zxid, allowed, why }
                }
            };
            if !removal.allowed {
                w.premature += 1;
            }
            life.removals.push(removal);
        }
        Ok(w)
    }

    /// The block ids a server logged for `query_id`.
    pub fn ids_of(&self, query_id: &str) -> &[String] {
        self.by_query.get(query_id).map_or(&[], Vec::as_slice)
    }

    /// How many copies the witness allows a key whose block ids are
    /// `ids`: at most as many as creations, and at most one plus the
    /// creations that followed a removal the window allowed.
    pub fn allowance(&self, ids: &BTreeSet<String>) -> Allowance {
        let (mut created, mut renewed) = (0u64, 0u64);
        let mut early: Vec<&Removal> = Vec::new();
        for id in ids {
            if let Some(life) = self.ids.get(id) {
                created += life.creates.len() as u64;
                renewed += life.renewed;
                // a premature removal matters when a creation followed it
                for (k, r) in life.removals.iter().enumerate() {
                    if !r.allowed && life.creates.len() > k + 1 {
                        early.push(r);
                    }
                }
            }
        }
        let copies = created.min(1 + renewed).max(1);
        let ids_text = ids.iter().cloned().collect::<Vec<_>>().join(", ");
        let why = if created == 0 {
            format!("its block id {ids_text} was never created in the coordinator (no insert of it left its id behind)")
        } else if let Some(r) = early.first() {
            format!(
                "its block id {ids_text} was created {created}× in the coordinator, but only {} of those creations followed a removal the window allowed; {}",
                renewed,
                r.why
            )
        } else {
            format!("its block id {ids_text} was created {created}× in the coordinator")
        };
        Allowance { copies, created, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn history(events: &[(&str, &str, i64, i64)]) -> History {
        let lines: Vec<(u64, &str, &str, Value)> = events
            .iter()
            .map(|(op, id, zxid, ctime)| {
                (
                    0,
                    "nemesis",
                    WITNESS_F,
                    serde_json::json!({"op": op, "path": format!("/t/blocks/{id}"), "zxid": zxid, "ctime_ms": ctime}),
                )
            })
            .collect();
        History::from_script(&lines).unwrap()
    }

    fn ids(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_removal_with_window_newer_ids_renews_and_one_inside_the_window_does_not() {
        // window 2 ids: a, then b and c, then a removed (2 newer: allowed)
        // and made again; d removed with 1 newer (inside the window) and made again
        let h = history(&[
            ("create", "a", 1, 100),
            ("create", "b", 2, 200),
            ("create", "c", 3, 300),
            ("remove", "a", 4, 0),
            ("create", "a", 5, 400),
            ("create", "d", 6, 500),
            ("create", "e", 7, 600),
            ("remove", "d", 8, 0),
            ("create", "d", 9, 700),
        ]);
        let w = Witness::read(&h, 2, 1_000_000).unwrap();
        let a = w.allowance(&ids(&["a"]));
        assert_eq!((a.copies, a.created), (2, 2), "{}", a.why);
        let d = w.allowance(&ids(&["d"]));
        assert_eq!((d.copies, d.created), (1, 2), "{}", d.why);
        assert!(d.why.contains("1 other id(s) as new"), "{}", d.why);
        assert_eq!(w.premature, 1);
    }

    #[test]
    fn a_premature_removal_judged_by_the_ids_first_ctime_is_named_as_such() {
        // a (first life at 1 s) is removed rightly, made again at 7.5 s,
        // and removed again 0.1 s later: inside a 5 s window by its new
        // ctime, outside it by its first; e's second removal is inside the
        // window by either of its ctimes
        let h = history(&[
            ("create", "a", 1, 1_000),
            ("create", "b", 2, 7_000),
            ("remove", "a", 3, 0),
            ("create", "a", 4, 7_500),
            ("create", "c", 5, 7_600),
            ("remove", "a", 6, 0),
            ("create", "a", 7, 8_000),
            ("create", "e", 8, 8_100),
            ("remove", "e", 9, 0),
            ("create", "e", 10, 8_200),
            ("remove", "e", 11, 0),
            ("create", "e", 12, 8_300),
        ]);
        let w = Witness::read(&h, 100, 5_000).unwrap();
        let a = w.allowance(&ids(&["a"]));
        assert_eq!((a.copies, a.created), (2, 3), "{}", a.why);
        assert!(a.why.contains("0.100 s older than the newest"), "{}", a.why);
        assert!(
            a.why.contains("by the ctime of its earlier creation (6.600 s older"),
            "{}",
            a.why
        );
        let e = w.allowance(&ids(&["e"]));
        assert_eq!((e.copies, e.created), (1, 3), "{}", e.why);
        assert!(!e.why.contains("earlier creation"), "{}", e.why);
        assert_eq!(w.premature, 3);
    }

    #[test]
    fn age_alone_allows_a_removal_once_a_newer_id_is_older_than_the_window() {
        let h = history(&[
            ("create", "a", 1, 1_000),
            ("create", "b", 2, 12_001),
            ("remove", "a", 3, 0),
            ("create", "a", 4, 13_000),
        ]);
        // 10 s window: b is 11.001 s newer
        let w = Witness::read(&h, 100, 10_000).unwrap();
        assert_eq!(w.allowance(&ids(&["a"])).copies, 2);
        // 12 s window: not old enough
        let w = Witness::read(&h, 100, 12_000).unwrap();
        assert_eq!(w.allowance(&ids(&["a"])).copies, 1);
    }

    #[test]
    fn a_create_and_remove_in_one_multi_is_a_check_not_a_creation() {
        // ClickHouse's lock checks the id is absent by creating and
        // removing it in one multi; the witness sees both, and no ctime
        let lines: Vec<(u64, &str, &str, Value)> = [("create", 7, None), ("remove", 7, None), ("create", 9, Some(5))]
            .iter()
            .map(|(op, zxid, ctime)| {
                (
                    0,
                    "nemesis",
                    WITNESS_F,
                    serde_json::json!({"op": op, "path": "/t/blocks/a", "zxid": zxid, "ctime_ms": ctime}),
                )
            })
            .collect();
        let w = Witness::read(&History::from_script(&lines).unwrap(), 1, 1000).unwrap();
        let a = w.allowance(&ids(&["a"]));
        assert_eq!((a.copies, a.created), (1, 1), "{}", a.why);
        assert_eq!((w.events, w.premature), (1, 0));
    }

    #[test]
    fn a_key_whose_id_was_never_created_may_have_one_copy() {
        let h = history(&[("create", "a", 1, 1)]);
        let w = Witness::read(&h, 100, 1000).unwrap();
        let x = w.allowance(&ids(&["x"]));
        assert_eq!((x.copies, x.created), (1, 0));
        assert!(x.why.contains("never created"), "{}", x.why);
    }

    #[test]
    fn a_witness_line_without_a_zxid_is_an_input_error() {
        let h = History::from_script(&[(
            0,
            "nemesis",
            WITNESS_F,
            serde_json::json!({"op": "create", "path": "/t/blocks/a"}),
        )])
        .unwrap();
        let e = Witness::read(&h, 1, 1).unwrap_err();
        assert!(e.reason.contains("zxid"), "{}", e.reason);
    }
}
