//! What a Raft message from a peer must satisfy before it is stepped.
//!
//! raft-rs trusts its peers: a message of the wrong shape makes it panic
//! (an empty `MsgPropose`, a commit index past the log, a vote response
//! with term 0, …) or corrupt its log (entries that are not contiguous).
//! A node steps a peer's message only after [`check`] passed, so that
//! nothing a peer sends can take it down. The checks are the shapes
//! raft-rs 0.7 asserts on, read off its `raft.rs` and `raft_log.rs`, and
//! the message types this node's use of Raft never sends.
//!
//! Fault model: peers are authenticated (the driver's handshake) and the
//! message's `from` is the authenticated peer. What this does not catch:
//! a peer that holds the cluster secret and lies within the protocol (a
//! higher term, a forged commit index) can still disturb or mislead Raft —
//! Raft does not tolerate Byzantine peers, and neither does this check.

use crate::changelog::ENTRY_DATA_BYTES_MAX;
use raft::prelude::{EntryType, Message, MessageType};
use raft::{RawNode, StateRole, Storage};

/// Most a message's term may run ahead of this node's. Real elections
/// move terms by ones; a term near `u64::MAX` would overflow raft-rs's
/// `term + 1`.
pub const TERM_JUMP_MAX: u64 = 1 << 32;

/// A peer's Raft message refused before it is stepped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{why}")]
pub struct Refused {
    /// The message's type and the peer whose connection carried it.
    pub msg_type: MessageType,
    pub from: u64,
    pub why: String,
}

/// Whether `m`, received from the authenticated peer `from`, may be
/// stepped into `raw`; else why not. `voters` is the cluster's fixed
/// membership.
pub fn check<S: Storage>(raw: &RawNode<S>, m: &Message, from: u64, voters: &[u64]) -> Result<(), Refused> {
    check_message(raw, m, from, voters).map_err(|why| Refused {
        msg_type: m.msg_type,
        from,
        why,
    })
}

fn check_message<S: Storage>(raw: &RawNode<S>, m: &Message, from: u64, voters: &[u64]) -> Result<(), String> {
    use MessageType::*;
    let r = &raw.raft;
    if m.from != from {
        return Err(format!("message from {} on peer {from}'s connection", m.from));
    }
    if m.to != r.id || m.from == r.id || !voters.contains(&m.from) {
        return Err(format!("message {} -> {} is not a link of node {}", m.from, m.to, r.id));
    }
    // a server whose log lost acknowledged entries asks for a snapshot
    // with a rejected append (see the server's `fall_behind`); nothing
    // else carries the request
    if m.request_snapshot != 0 && !(m.msg_type == MsgAppendResponse && m.reject) {
        return Err("request_snapshot is set outside a rejected append".into());
    }
    match m.msg_type {
        // writes reach the leader as forwarded requests, never as raft
        // proposals; leader transfer is not used
        MsgPropose | MsgTransferLeader | MsgTimeoutNow => {
            return Err(format!("{:?} is not accepted from peers", m.msg_type))
        }
        MsgHup | MsgBeat | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum => {
            return Err(format!("{:?} is a local message", m.msg_type))
        }
        _ => {}
    }
    if m.msg_type == MsgReadIndex {
        // forwarded by a follower with no term, answered only by a leader
        if m.term != 0 || m.entries.len() != 1 || r.state != StateRole::Leader {
            return Err("MsgReadIndex needs term 0, one entry, and this node leading".into());
        }
        return Ok(());
    }
    if m.term == 0 {
        return Err(format!("{:?} with term 0", m.msg_type));
    }
    if m.term > r.term.saturating_add(TERM_JUMP_MAX) {
        return Err(format!("term {} runs too far ahead of {}", m.term, r.term));
    }
    match m.msg_type {
        MsgAppend => check_append(raw, m),
        MsgHeartbeat => {
            // the driver clamps the commit of a heartbeat to the log (a
            // node whose data dir was dropped may hear of a larger one)
            Ok(())
        }
        MsgSnapshot => check_snapshot(raw, m, voters),
        MsgAppendResponse => {
            let last = r.raft_log.last_index();
            if m.index > last || m.reject_hint > last || m.request_snapshot > last {
                return Err(format!(
                    "append response for index {} (hint {}, snapshot asked from {}) past the last index {last}",
                    m.index, m.reject_hint, m.request_snapshot
                ));
            }
            Ok(())
        }
        MsgRequestVote | MsgRequestPreVote => check_vote_request(raw, m),
        MsgRequestVoteResponse | MsgRequestPreVoteResponse => check_vote_response(raw, m),
        MsgReadIndexResp => {
            if m.term != r.term || m.entries.len() != 1 || r.state != StateRole::Follower || m.from != r.leader_id {
                return Err("MsgReadIndexResp must come from this term's leader with one entry".into());
            }
            Ok(())
        }
        MsgHeartbeatResponse => Ok(()),
        other => Err(format!("{other:?} is not expected from a peer")),
    }
}

/// An append's entries follow `m.index` one by one, with terms between
/// the previous entry's and the message's, all normal entries that fit a
/// changelog record; a probe past this node's log carries the term it
/// assumes there.
fn check_append<S: Storage>(raw: &RawNode<S>, m: &Message) -> Result<(), String> {
    let log = &raw.raft.raft_log;
    if m.index > log.last_index() && m.log_term == 0 {
        return Err(format!("append after index {} with log term 0", m.index));
    }
    let mut term = m.log_term.max(1);
    for (i, e) in m.entries.iter().enumerate() {
        let expected = m.index.checked_add(1 + i as u64);
        if expected != Some(e.index) {
            return Err(format!("entry {i} has index {}, expected {expected:?}", e.index));
        }
        if e.term < term || e.term > m.term {
            return Err(format!(
                "entry {} has term {} outside {term}..={}",
                e.index, e.term, m.term
            ));
        }
        if protobuf::Message::compute_size(e) as usize > ENTRY_DATA_BYTES_MAX {
            return Err(format!("entry {} is larger than a log record holds", e.index));
        }
        if e.get_entry_type() != EntryType::EntryNormal {
            return Err(format!(
                "entry {} is a configuration change (membership is fixed)",
                e.index
            ));
        }
        term = e.term;
    }
    Ok(())
}

/// A snapshot names a place in the log no earlier than what is committed
/// here (and agrees with it there), and the cluster's own membership.
fn check_snapshot<S: Storage>(raw: &RawNode<S>, m: &Message, voters: &[u64]) -> Result<(), String> {
    let log = &raw.raft.raft_log;
    let meta = m.get_snapshot().get_metadata();
    if meta.index == 0 || meta.term == 0 || meta.term > m.term {
        return Err(format!(
            "snapshot at index {} term {} in term {}",
            meta.index, meta.term, m.term
        ));
    }
    if meta.index <= log.committed && log.term(meta.index).ok() != Some(meta.term) {
        return Err(format!(
            "snapshot at index {} term {} contradicts the committed log",
            meta.index, meta.term
        ));
    }
    let cs = meta.get_conf_state();
    let mut named: Vec<u64> = cs.get_voters().to_vec();
    named.sort_unstable();
    let mut ours = voters.to_vec();
    ours.sort_unstable();
    if named != ours
        || !cs.get_learners().is_empty()
        || !cs.get_voters_outgoing().is_empty()
        || !cs.get_learners_next().is_empty()
        || cs.auto_leave
    {
        return Err(format!("snapshot names a membership other than {ours:?}"));
    }
    Ok(())
}

fn check_vote_request<S: Storage>(raw: &RawNode<S>, m: &Message) -> Result<(), String> {
    let r = &raw.raft;
    if !m.context.is_empty() {
        // a transfer campaign would bypass the leader lease
        return Err("vote request with a context (leader transfer is not used)".into());
    }
    if m.priority != 0 {
        return Err("vote request with a priority (priorities are not used)".into());
    }
    // at term 0 a rejection would be sent with term 0, which raft-rs
    // refuses to send (it panics): refuse what would be rejected
    if r.term == 0 && !r.raft_log.is_up_to_date(m.index, m.log_term) {
        return Err("vote request behind this node's log at term 0".into());
    }
    Ok(())
}

fn check_vote_response<S: Storage>(raw: &RawNode<S>, m: &Message) -> Result<(), String> {
    let r = &raw.raft;
    if m.reject {
        return Ok(());
    }
    // a candidate wins only with its log durable (raft-rs asserts it
    // when it becomes leader); a grant now is dropped, the next round wins
    if m.msg_type == MessageType::MsgRequestVoteResponse
        && r.state == StateRole::Candidate
        && r.raft_log.persisted != r.raft_log.last_index()
    {
        return Err("vote granted while this candidate's log is not yet durable".into());
    }
    // a grant for a term past the one a pre-campaign asks for answers
    // nothing this node asked (a late grant for an earlier one raft ignores)
    if m.msg_type == MessageType::MsgRequestPreVoteResponse && m.term > r.term.saturating_add(1) {
        return Err(format!("pre-vote granted for term {}, past {}", m.term, r.term + 1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each refused shape is shown to take raft-rs down when stepped
    //! unchecked (`catch_unwind`), so the check guards a real panic; and
    //! the messages a healthy cluster exchanges pass.
    use super::*;
    use raft::prelude::{ConfState, Entry};
    use raft::storage::MemStorage;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    const VOTERS: [u64; 3] = [1, 2, 3];

    fn node(id: u64) -> RawNode<MemStorage> {
        let storage = MemStorage::new_with_conf_state(ConfState::from((VOTERS.to_vec(), vec![])));
        let cfg = raft::Config {
            id,
            election_tick: 10,
            heartbeat_tick: 2,
            ..raft::Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        RawNode::new(&cfg, storage, &logger).unwrap()
    }

    /// Node 1 as a follower of leader 2 in term 2, with entries 1..=3.
    fn follower() -> RawNode<MemStorage> {
        let mut n = node(1);
        let entries: Vec<Entry> = (1..=3)
            .map(|index| Entry {
                index,
                term: 2,
                ..Entry::default()
            })
            .collect();
        let m = msg(MessageType::MsgAppend, 2, 1, 2, |m| m.entries = entries.into());
        check(&n, &m, 2, &VOTERS).unwrap();
        n.step(m).unwrap();
        n
    }

    /// Persists what raft has ready (the driver's job).
    fn persist(n: &mut RawNode<MemStorage>) {
        let rd = n.ready();
        if let Some(hs) = rd.hs() {
            n.mut_store().wl().set_hardstate(hs.clone());
        }
        n.mut_store().wl().append(rd.entries()).unwrap();
        let _ = n.advance(rd);
    }

    /// Node 1 as the leader of term 1 that has committed in its term.
    fn leader() -> RawNode<MemStorage> {
        let mut n = node(1);
        n.campaign().unwrap();
        persist(&mut n);
        let term = n.raft.term;
        n.step(msg(MessageType::MsgRequestVoteResponse, 2, 1, term, |_| {}))
            .unwrap();
        assert_eq!(n.raft.state, StateRole::Leader);
        persist(&mut n);
        let last = n.raft.raft_log.last_index();
        n.step(msg(MessageType::MsgAppendResponse, 2, 1, term, |m| m.index = last))
            .unwrap();
        assert_eq!(n.raft.raft_log.committed, last);
        n
    }

    fn msg(kind: MessageType, from: u64, to: u64, term: u64, f: impl FnOnce(&mut Message)) -> Message {
        let mut m = Message {
            from,
            to,
            term,
            ..Message::default()
        };
        m.set_msg_type(kind);
        f(&mut m);
        m
    }

    /// `m` is refused, and stepping it unchecked panics.
    fn guards_a_panic(mut n: RawNode<MemStorage>, m: Message) {
        let from = m.from;
        assert!(check(&n, &m, from, &VOTERS).is_err(), "{m:?} passes");
        let stepped = catch_unwind(AssertUnwindSafe(move || {
            let _ = n.step(m);
        }));
        assert!(stepped.is_err(), "raft-rs took it without a panic");
    }

    #[test]
    fn an_empty_proposal_from_a_peer_is_refused() {
        let n = leader();
        let term = n.raft.term;
        guards_a_panic(n, msg(MessageType::MsgPropose, 2, 1, term, |_| {}));
    }

    #[test]
    fn a_probe_past_the_log_with_term_0_and_a_high_commit_is_refused() {
        guards_a_panic(
            follower(),
            msg(MessageType::MsgAppend, 2, 1, 2, |m| {
                m.index = 10;
                m.commit = 20;
            }),
        );
    }

    #[test]
    fn an_append_response_past_the_log_is_refused() {
        let mut n = leader();
        let term = n.raft.term;
        let last = n.raft.raft_log.last_index();
        let m = msg(MessageType::MsgAppendResponse, 2, 1, term, |m| m.index = u64::MAX);
        assert!(check(&n, &m, 2, &VOTERS).is_err(), "{m:?} passes");
        // unchecked, raft-rs asserts on it in a debug build; in a release
        // build it takes it, and the leader believes the follower holds
        // entries past its own log
        let stepped = catch_unwind(AssertUnwindSafe(|| {
            let _ = n.step(m);
        }));
        if stepped.is_ok() {
            let matched = n.raft.prs().get(2).map(|p| p.matched);
            assert!(
                matched.is_some_and(|i| i > last),
                "raft-rs took it and kept a sane progress ({matched:?}, last {last})"
            );
        }
    }

    #[test]
    fn a_snapshot_request_rides_only_a_rejected_append_within_the_log() {
        let n = leader();
        let term = n.raft.term;
        let last = n.raft.raft_log.last_index();
        let ask = |kind, reject, at| {
            msg(kind, 2, 1, term, |m| {
                m.index = last;
                m.reject = reject;
                m.request_snapshot = at;
            })
        };
        check(&n, &ask(MessageType::MsgAppendResponse, true, last), 2, &VOTERS).unwrap();
        for bad in [
            ask(MessageType::MsgAppendResponse, false, last),
            ask(MessageType::MsgHeartbeatResponse, true, last),
            ask(MessageType::MsgAppendResponse, true, last + 1),
        ] {
            assert!(check(&n, &bad, 2, &VOTERS).is_err(), "{bad:?}");
        }
        // and a leader given one answers with a snapshot, not a panic
        let mut n = n;
        n.step(ask(MessageType::MsgAppendResponse, true, last)).unwrap();
    }

    #[test]
    fn a_read_index_without_its_entry_is_refused() {
        guards_a_panic(leader(), msg(MessageType::MsgReadIndex, 2, 1, 0, |_| {}));
    }

    #[test]
    fn a_vote_request_with_term_0_is_refused() {
        guards_a_panic(node(1), msg(MessageType::MsgRequestVote, 2, 1, 0, |_| {}));
    }

    #[test]
    fn entries_that_do_not_follow_one_by_one_are_refused() {
        let n = follower();
        for entries in [vec![(5, 2)], vec![(4, 2), (6, 2)], vec![(4, 3)], vec![(4, 2), (5, 1)]] {
            let m = msg(MessageType::MsgAppend, 2, 1, 2, |m| {
                m.index = 3;
                m.log_term = 2;
                m.entries = entries
                    .iter()
                    .map(|&(index, term)| Entry {
                        index,
                        term,
                        ..Entry::default()
                    })
                    .collect::<Vec<_>>()
                    .into();
            });
            assert!(check(&n, &m, 2, &VOTERS).is_err(), "{entries:?}");
        }
    }

    #[test]
    fn messages_of_a_healthy_cluster_pass() {
        let n = follower();
        let ok = [
            msg(MessageType::MsgHeartbeat, 2, 1, 2, |m| m.commit = 3),
            msg(MessageType::MsgAppend, 2, 1, 2, |m| {
                m.index = 3;
                m.log_term = 2;
                m.entries = vec![Entry {
                    index: 4,
                    term: 2,
                    ..Entry::default()
                }]
                .into();
            }),
            msg(MessageType::MsgRequestPreVote, 3, 1, 3, |m| {
                m.index = 3;
                m.log_term = 2;
            }),
        ];
        for m in ok {
            assert_eq!(check(&n, &m, m.from, &VOTERS), Ok(()), "{m:?}");
        }
        let l = leader();
        let term = l.raft.term;
        let ack = msg(MessageType::MsgAppendResponse, 2, 1, term, |m| m.index = 1);
        assert_eq!(check(&l, &ack, 2, &VOTERS), Ok(()));
        // and a message on another peer's connection is not
        assert!(check(&l, &ack, 3, &VOTERS).is_err());
    }
}
