//! What must hold in every simulated run, checked as it runs — what a
//! client history cannot show.

use crate::disk::Disk;
use crate::entry::DigestMismatch;
use crate::server::{Effect, KeeperServer};
use std::collections::{BTreeMap, BTreeSet};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The server it was seen at.
    pub node: u64,
    /// When (simulated µs).
    pub at_us: u64,
    pub what: String,
}

#[derive(Debug, Default)]
pub struct Invariants {
    /// The simulated time, kept current by the cluster.
    pub now_us: u64,
    /// Term → the server that led it.
    leaders: BTreeMap<u64, u64>,
    /// Index → (term, hash) of the entry first seen committed there.
    committed: BTreeMap<u64, (u64, u64)>,
    /// Per server, the commit index already compared.
    checked_to: BTreeMap<u64, u64>,
    /// Per server, the log index its injected divergence was applied at,
    /// until the digest catches it.
    diverged: BTreeMap<u64, u64>,
    /// Servers whose files the `corrupt` fault damaged since their last
    /// start (a refusal to start is then expected).
    corrupted: BTreeSet<u64>,
    /// Per server, what it told its peers it holds durably since its
    /// last start: see [`Promise`].
    promises: BTreeMap<u64, Promise>,
    /// Divergences caught, as (server, index).
    pub caught: Vec<(u64, u64)>,
    /// Committed entries a server's changelog did not hold yet (or held
    /// the entry they replace) when they were compared: a batched
    /// follower's commit index moving with the append, before the advance
    /// writes it. How a test knows it reached the case.
    pub commits_ahead_of_log: u64,
    pub violations: Vec<Violation>,
}

/// What a server's messages promised: Raft lets a server acknowledge an
/// entry or grant a vote only once that is on its disk, so a crash must
/// not take it back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Promise {
    /// The highest term it acknowledged appends in, and the highest index
    /// it acknowledged in that term.
    acked: Option<(u64, u64)>,
    /// The highest term it granted a vote in, and to whom.
    vote: Option<(u64, u64)>,
}

fn entry_hash(e: &raft::prelude::Entry) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(3, 4);
    std::hash::Hasher::write_i32(&mut h, e.entry_type as i32);
    std::hash::Hasher::write(&mut h, &e.data);
    std::hash::Hasher::write(&mut h, &e.context);
    std::hash::Hasher::finish(&h)
}

impl Invariants {
    fn violate(&mut self, node: u64, what: String) {
        let at_us = self.now_us;
        self.violations.push(Violation { node, at_us, what });
    }

    /// Looks at a server after it handled an event.
    pub fn observe<D: Disk>(&mut self, s: &KeeperServer<D>) {
        let id = s.id();
        if s.is_leader() {
            match self.leaders.get(&s.term()) {
                Some(&other) if other != id => {
                    let term = s.term();
                    self.violate(id, format!("two leaders in term {term}: {other} and {id}"))
                }
                Some(_) => {}
                None => {
                    self.leaders.insert(s.term(), id);
                }
            }
        }
        let from = self.checked_to.get(&id).copied().unwrap_or(0) + 1;
        let to = s.commit_index();
        for index in from..=to {
            let Some(e) = s.entry(index) else { continue };
            if s.entry_term(index) != Some(e.term) {
                self.commits_ahead_of_log += 1;
            }
            let seen = (e.term, entry_hash(&e));
            match self.committed.get(&index) {
                Some(&first) if first != seen => self.violate(
                    id,
                    format!(
                        "committed index {index} holds term {} here, term {} where first seen committed{}",
                        seen.0,
                        first.0,
                        if seen.0 == first.0 { " (different contents)" } else { "" }
                    ),
                ),
                Some(_) => {}
                None => {
                    self.committed.insert(index, seen);
                }
            }
        }
        if to >= from {
            self.checked_to.insert(id, to);
        }
    }

    /// A server logged `event`.
    pub fn logged(&mut self, id: u64, event: &str, fields: &serde_json::Value) {
        if event == crate::NodeEvent::DivergeApplied.name() {
            if let Some(index) = fields.get("log_index").and_then(|v| v.as_u64()) {
                self.diverged.insert(id, index);
            }
        }
    }

    /// The `diverge` hook was armed on `id`.
    pub fn diverge_armed(&mut self, _id: u64) {}

    /// The `corrupt` fault damaged `id`'s files.
    pub fn corrupted(&mut self, id: u64) {
        self.corrupted.insert(id);
        self.promises.remove(&id);
    }

    /// A server stopped on a digest mismatch.
    pub fn digest_mismatch(&mut self, id: u64, m: &DigestMismatch) {
        match self.diverged.remove(&id) {
            Some(index) if index == m.log_index => self.caught.push((id, index)),
            Some(index) => self.violate(
                id,
                format!(
                    "the divergence injected at index {index} was caught at {} instead",
                    m.log_index
                ),
            ),
            None => self.violate(
                id,
                format!(
                    "digest mismatch at index {} ({}) with no divergence injected",
                    m.log_index, m.phase
                ),
            ),
        }
    }

    /// What a server's step and advance handed out: each batch of effects
    /// ends with [`Effect::Flush`], and no batch is empty, so a driver that
    /// holds frames back until a flush holds none back past the step.
    pub fn flushed(&mut self, id: u64, out: &[Effect]) {
        let empty_batch = out
            .iter()
            .enumerate()
            .any(|(i, e)| matches!(e, Effect::Flush) && (i == 0 || matches!(out[i - 1], Effect::Flush)));
        if empty_batch || out.last().is_some_and(|e| !matches!(e, Effect::Flush)) {
            self.violate(id, format!("effects not ended by a flush: {} effects", out.len()));
        }
    }

    /// A server stopped on a storage failure that was no simulated crash.
    pub fn fatal(&mut self, id: u64, reason: &str) {
        self.violate(id, format!("storage failure: {reason}"));
    }

    /// A server panicked (it is taken down as a crash).
    pub fn panicked(&mut self, id: u64, why: &str) {
        self.violate(id, format!("panicked: {why}"));
    }

    /// A server could not open its storage.
    pub fn open_failed(&mut self, id: u64, reason: &str) {
        if !self.corrupted.remove(&id) {
            self.violate(id, format!("cannot start on its own disk: {reason}"));
        }
    }

    /// A server crashed (its log is read again on restart).
    pub fn crashed(&mut self, id: u64) {
        self.checked_to.remove(&id);
    }

    /// Server `id` sent a Raft message (protobuf bytes): an acknowledged
    /// append or a granted vote is remembered as a promise.
    pub fn sent(&mut self, id: u64, raft_bytes: &[u8]) {
        use protobuf::Message as _;
        use raft::prelude::{Message, MessageType};
        // Only two kinds of message make promises; the rest (appends with
        // their entries above all) are not worth decoding.
        let kind = message_type(raft_bytes);
        if kind != MessageType::MsgAppendResponse as u64 && kind != MessageType::MsgRequestVoteResponse as u64 {
            return;
        }
        let Ok(m) = Message::parse_from_bytes(raft_bytes) else {
            return;
        };
        if m.reject {
            return;
        }
        let p = self.promises.entry(id).or_default();
        match m.get_msg_type() {
            MessageType::MsgAppendResponse => match p.acked {
                Some((t, i)) if t > m.term || (t == m.term && i >= m.index) => {}
                _ => p.acked = Some((m.term, m.index)),
            },
            MessageType::MsgRequestVoteResponse if p.vote.is_none_or(|(t, _)| m.term > t) => {
                p.vote = Some((m.term, m.to));
            }
            _ => {}
        }
    }

    /// Server `s` is about to crash. Acknowledged entries it has since
    /// dropped itself — a leader of a later term overwrote them — are no
    /// longer promised: the crash may strike after the truncation reached
    /// the disk and before the later term did, so the recovered term is
    /// no evidence either way. (A granted vote stays promised.)
    pub fn crashing<D: Disk>(&mut self, s: &KeeperServer<D>) {
        if let Some(p) = self.promises.get_mut(&s.id()) {
            if p.acked.is_some_and(|(t, i)| s.term() > t || s.last_index() < i) {
                p.acked = None;
            }
        }
    }

    /// Server `id` lost its disk (wiped, or damaged by the `corrupt`
    /// fault): what it promised is gone with it, by design of the fault.
    pub fn forget_promises(&mut self, id: u64) {
        self.promises.remove(&id);
    }

    /// A server started again on its disk: earlier damage is settled
    /// either way, and what it recovered must keep its promises.
    pub fn started<D: Disk>(&mut self, s: &KeeperServer<D>) {
        let id = s.id();
        self.corrupted.remove(&id);
        self.checked_to.remove(&id);
        let Some(p) = self.promises.remove(&id) else { return };
        let (term, vote, last) = (s.term(), s.vote(), s.last_index());
        if let Some((t, c)) = p.vote {
            if term < t || (term == t && vote != c) {
                self.violate(
                    id,
                    format!(
                        "granted its vote in term {t} to {c} before a crash, recovered term {term} voting for {vote}: the vote was sent before it was durable"
                    ),
                );
            }
        }
        if let Some((t, i)) = p.acked {
            // a later term may truncate what an earlier one acknowledged
            if term < t || (term == t && last < i) {
                self.violate(
                    id,
                    format!(
                        "acknowledged entries to index {i} in term {t} before a crash, recovered term {term} with its log ending at {last}: the acknowledgement was sent before the entries were durable"
                    ),
                );
            }
        }
    }

    /// At the end: every divergence applied must have been caught.
    pub fn finish(&mut self) {
        for (id, index) in std::mem::take(&mut self.diverged) {
            self.violate(id, format!("the divergence injected at index {index} was never caught"));
        }
    }

    /// Committed indexes seen so far.
    pub fn committed(&self) -> usize {
        self.committed.len()
    }
}

/// A Raft message's type read off its encoding without decoding it: the
/// protobuf encoder writes fields in number order, so the type (field 1, a
/// varint) comes first, or is absent when it is 0 (`MsgHup`). Anything
/// unreadable reads as `u64::MAX`, which no type has.
fn message_type(bytes: &[u8]) -> u64 {
    const TYPE_TAG: u8 = 1 << 3; // field 1, wire type 0 (varint)
    match bytes.first() {
        Some(&TYPE_TAG) => {}
        _ => return 0,
    }
    let mut v = 0u64;
    for (i, b) in bytes[1..].iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return v;
        }
    }
    u64::MAX
}

#[cfg(test)]
mod message_type_tests {
    use super::message_type;
    use protobuf::{Message as _, ProtobufEnum as _};
    use raft::prelude::{Entry, Message, MessageType};

    #[test]
    fn the_type_read_off_the_bytes_is_the_decoded_type_for_every_kind() {
        for kind in MessageType::values() {
            let mut m = Message::default();
            m.set_msg_type(*kind);
            m.to = 2;
            m.from = 3;
            m.term = 7;
            m.index = 300;
            m.reject = true;
            let e = Entry {
                data: vec![8u8; 40].into(),
                ..Default::default()
            };
            m.entries = vec![e].into();
            let bytes = m.write_to_bytes().unwrap();
            assert_eq!(message_type(&bytes), kind.value() as u64, "{kind:?}");
        }
        assert_eq!(message_type(&[]), 0);
        assert_eq!(message_type(&[8, 0x80]), u64::MAX, "a cut varint");
    }
}
