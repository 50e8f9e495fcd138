//! A kv server coordinating one client request, sans-IO: the decisions of
//! a write and of a read, with replies and the deadline as inputs.
//!
//! * A write stamps its entry ([`Stamper`]: the coordinator's clock, never
//!   going back), goes to every replica of its key, and is acknowledged
//!   once W replicas applied it; it fails when every replica answered or
//!   the deadline passed with fewer. The replicas not yet heard from
//!   still get it: a write reaches every replica it can, acknowledged or
//!   not.
//! * A read asks every replica and answers the LWW winner of the first R
//!   replies (no read repair: anti-entropy converges the replicas).
//!
//! The driver (the node's kv module, or a simulation) sends the entry or
//! the read to each of a [`Round`]'s replicas, feeds each reply to
//! `on_reply` until it returns the result, and calls `timed_out` when
//! the deadline comes first.

use crate::entry::Entry;
use std::collections::BTreeSet;

/// The coordinator's timestamps: microseconds on its clock, strictly
/// increasing on one coordinator even if the clock goes back.
#[derive(Debug, Clone, Default)]
pub struct Stamper {
    last: u64,
}

impl Stamper {
    /// The timestamp of a write coordinated at `clock_us`.
    pub fn next(&mut self, clock_us: u64) -> u64 {
        self.last = clock_us.max(self.last + 1);
        self.last
    }
}

/// What a coordinated write got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteResult {
    pub ts: u64,
    pub acks: usize,
    /// The replicas that acknowledged, in the order they did.
    pub acked: Vec<u64>,
    pub wanted: usize,
    pub errors: Vec<String>,
}

/// What a coordinated read got: the winner of the answers, if R came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    pub winner: Option<Entry>,
    pub replies: usize,
    pub wanted: usize,
    pub errors: Vec<String>,
}

/// What a write and a read share: the replicas asked, those not heard
/// from, how many useful replies came and how many are wanted, the
/// errors, and whether the round was decided (after which nothing counts).
#[derive(Debug, Clone)]
struct Tally {
    replicas: Vec<u64>,
    waiting: BTreeSet<u64>,
    wanted: usize,
    got: usize,
    errors: Vec<String>,
    decided: bool,
}

impl Tally {
    fn new(replicas: Vec<u64>, wanted: usize) -> Tally {
        Tally {
            waiting: replicas.iter().copied().collect(),
            replicas,
            wanted,
            got: 0,
            errors: Vec::new(),
            decided: false,
        }
    }

    /// Counts replica `r`'s reply (`Ok`: a useful one); whether it was
    /// taken — asked, not heard from yet, and the round undecided.
    fn hear<T>(&mut self, r: u64, reply: Result<T, String>) -> Option<T> {
        if self.decided || !self.waiting.remove(&r) {
            return None;
        }
        match reply {
            Ok(v) => {
                self.got += 1;
                Some(v)
            }
            Err(e) => {
                self.errors.push(e);
                None
            }
        }
    }

    /// Whether the reply just heard decided the round: `wanted` useful
    /// replies, or every replica heard from.
    fn decide(&mut self) -> bool {
        if self.decided {
            return false;
        }
        self.decided = self.got >= self.wanted || self.waiting.is_empty();
        self.decided
    }
}

/// A coordinated request as its driver sees it: whom to ask, each reply,
/// and the result once decided.
pub trait Round {
    /// What a replica answers.
    type Reply;
    type Result;
    /// Every replica of the key: whom the request goes to.
    fn replicas(&self) -> &[u64];
    /// Replica `r`'s reply, or why it gave none. The result once the
    /// request is decided, exactly once; a reply from a replica not asked
    /// or heard already, or after the decision, is ignored.
    fn on_reply(&mut self, r: u64, reply: Result<Self::Reply, String>) -> Option<Self::Result>;
    /// Keeps an error no replica's reply carries (its request failed
    /// inside the driver).
    fn note(&mut self, error: String);
    /// Decided without waiting more, for `why`: what it got by then.
    fn give_up(&mut self, why: String) -> Self::Result;
    /// The deadline came first.
    fn timed_out(&mut self, after_ms: u64) -> Self::Result {
        self.give_up(format!("timed out after {after_ms} ms"))
    }
}

/// One coordinated write.
#[derive(Debug, Clone)]
pub struct WriteRound {
    entry: Entry,
    tally: Tally,
    /// The replicas that acknowledged, in the order they did.
    acked: Vec<u64>,
}

impl WriteRound {
    /// The write of `entry` (stamped) to `replicas`, acknowledged after `w`.
    pub fn new(entry: Entry, replicas: Vec<u64>, w: usize) -> WriteRound {
        WriteRound {
            entry,
            tally: Tally::new(replicas, w),
            acked: Vec::new(),
        }
    }

    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    fn result(&self) -> WriteResult {
        WriteResult {
            ts: self.entry.ts,
            acks: self.acked.len(),
            acked: self.acked.clone(),
            wanted: self.tally.wanted,
            errors: self.tally.errors.clone(),
        }
    }
}

impl Round for WriteRound {
    /// Applied, or why not.
    type Reply = ();
    type Result = WriteResult;

    fn replicas(&self) -> &[u64] {
        &self.tally.replicas
    }

    fn on_reply(&mut self, r: u64, reply: Result<(), String>) -> Option<WriteResult> {
        if self.tally.hear(r, reply).is_some() {
            self.acked.push(r);
        }
        self.tally.decide().then(|| self.result())
    }

    fn note(&mut self, error: String) {
        self.tally.errors.push(error);
    }

    fn give_up(&mut self, why: String) -> WriteResult {
        self.tally.decided = true;
        self.note(why);
        self.result()
    }
}

/// One coordinated read.
#[derive(Debug, Clone)]
pub struct ReadRound {
    key: Vec<u8>,
    tally: Tally,
    winner: Option<Entry>,
}

impl ReadRound {
    /// The read of `key` from `replicas`, answered after `r` replies.
    pub fn new(key: Vec<u8>, replicas: Vec<u64>, r: usize) -> ReadRound {
        ReadRound {
            key,
            tally: Tally::new(replicas, r),
            winner: None,
        }
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    fn result(&self) -> ReadResult {
        ReadResult {
            winner: self.winner.clone(),
            replies: self.tally.got,
            wanted: self.tally.wanted,
            errors: self.tally.errors.clone(),
        }
    }
}

impl Round for ReadRound {
    /// The replica's version of the key (None: it holds none); a version
    /// of another key is no version.
    type Reply = Option<Entry>;
    type Result = ReadResult;

    fn replicas(&self) -> &[u64] {
        &self.tally.replicas
    }

    fn on_reply(&mut self, r: u64, reply: Result<Option<Entry>, String>) -> Option<ReadResult> {
        if let Some(v) = self.tally.hear(r, reply).flatten().filter(|v| v.key == self.key) {
            if self.winner.as_ref().is_none_or(|w| v.lww_cmp(w).is_gt()) {
                self.winner = Some(v);
            }
        }
        self.tally.decide().then(|| self.result())
    }

    fn note(&mut self, error: String) {
        self.tally.errors.push(error);
    }

    fn give_up(&mut self, why: String) -> ReadResult {
        self.tally.decided = true;
        self.note(why);
        self.result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(key: &[u8], ts: u64, value: Option<&[u8]>) -> Entry {
        Entry {
            key: key.to_vec(),
            ts,
            value: value.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn a_stamp_never_goes_back_on_one_coordinator() {
        let mut s = Stamper::default();
        assert_eq!(s.next(100), 100);
        assert_eq!(s.next(100), 101);
        assert_eq!(s.next(50), 102);
        assert_eq!(s.next(500), 500);
    }

    #[test]
    fn a_write_is_decided_at_w_acks_or_when_every_replica_answered() {
        let mut w = WriteRound::new(entry(b"k", 7, Some(b"v")), vec![1, 2, 3], 2);
        assert_eq!(w.on_reply(2, Ok(())), None);
        assert_eq!(w.on_reply(2, Ok(())), None, "a second reply of one replica counts once");
        assert_eq!(w.on_reply(9, Ok(())), None, "a replica not asked counts not");
        let r = w.on_reply(3, Ok(())).expect("decided at W");
        assert_eq!((r.acks, r.acked, r.ts), (2, vec![2, 3], 7));

        let mut w = WriteRound::new(entry(b"k", 7, None), vec![1, 2, 3], 3);
        assert_eq!(w.on_reply(1, Err("down".into())), None);
        assert_eq!(w.on_reply(2, Ok(())), None);
        let r = w.on_reply(3, Err("full".into())).expect("every replica answered");
        assert_eq!((r.acks, r.errors.len()), (1, 2));

        let mut w = WriteRound::new(entry(b"k", 7, None), vec![1, 2, 3], 2);
        w.on_reply(1, Ok(()));
        let r = w.timed_out(50);
        assert_eq!(r.acks, 1);
        assert_eq!(r.errors, vec!["timed out after 50 ms".to_string()]);
    }

    #[test]
    fn a_read_answers_the_lww_winner_of_the_first_r_replies() {
        let mut r = ReadRound::new(b"k".to_vec(), vec![1, 2, 3], 2);
        assert_eq!(r.on_reply(1, Ok(Some(entry(b"k", 5, Some(b"a"))))), None);
        let got = r.on_reply(2, Ok(Some(entry(b"k", 5, None)))).expect("R replies");
        // a tombstone beats a value of the same timestamp
        assert_eq!(got.winner, Some(entry(b"k", 5, None)));
        // the third replica's newer version came too late to count
        assert_eq!(r.on_reply(3, Ok(Some(entry(b"k", 9, Some(b"z"))))), None);

        let mut r = ReadRound::new(b"k".to_vec(), vec![1, 2], 2);
        assert_eq!(r.on_reply(1, Ok(Some(entry(b"other", 99, Some(b"x"))))), None);
        let got = r.on_reply(2, Ok(None)).expect("R replies");
        assert_eq!(got.winner, None, "a version of another key is no answer");
    }

    proptest! {
        /// Whatever the order and fate of the replies: a write is decided
        /// exactly when the W-th acknowledgement or the last reply comes,
        /// with the acknowledging replicas in the order they acked; a
        /// read's winner is the LWW greatest of the first R versions.
        #[test]
        fn rounds_match_a_reference(
            fates in proptest::collection::vec((any::<bool>(), 0u64..4, any::<bool>()), 1..7),
            wanted in 1usize..7,
        ) {
            let replicas: Vec<u64> = (1..=fates.len() as u64).collect();
            let mut w = WriteRound::new(entry(b"k", 1, None), replicas.clone(), wanted);
            let mut rd = ReadRound::new(b"k".to_vec(), replicas.clone(), wanted);
            let (mut acked, mut replies, mut best): (Vec<u64>, usize, Option<Entry>) = (Vec::new(), 0, None);
            let (mut w_done, mut r_done) = (None, None);
            for (i, &(ok, ts, tomb)) in fates.iter().enumerate() {
                let r = replicas[i];
                let last = i + 1 == fates.len();
                if w_done.is_some() {
                    prop_assert_eq!(w.on_reply(r, Ok(())), None, "a reply after the decision");
                } else {
                    if ok { acked.push(r); }
                    let got = w.on_reply(r, if ok { Ok(()) } else { Err("no".into()) });
                    let decided = acked.len() >= wanted || last;
                    prop_assert_eq!(got.is_some(), decided);
                    if let Some(g) = got {
                        prop_assert_eq!(&g.acked, &acked);
                        w_done = Some(g);
                    }
                }
                if r_done.is_some() {
                    prop_assert_eq!(rd.on_reply(r, Ok(None)), None, "a reply after the decision");
                } else {
                    let v = entry(b"k", ts, if tomb { None } else { Some(b"v") });
                    if ok {
                        replies += 1;
                        if best.as_ref().is_none_or(|b| v.lww_cmp(b).is_gt()) { best = Some(v.clone()); }
                    }
                    let got = rd.on_reply(r, if ok { Ok(Some(v)) } else { Err("no".into()) });
                    prop_assert_eq!(got.is_some(), replies >= wanted || last);
                    if let Some(g) = got {
                        prop_assert_eq!(&g.winner, &best);
                        r_done = Some(g);
                    }
                }
            }
        }
    }
}
