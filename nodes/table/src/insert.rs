//! One block's insert as a replica decides it, sans-IO: the two
//! coordinator round trips, what each answer means, and how a commit
//! whose answer was lost is settled through its lock.
//!
//! 1. One multi checks that the block's id is absent and takes a block
//!    number (an ephemeral-sequential lock under the partition). "Node
//!    exists" on the id is a duplicate: nothing is written, and the client
//!    is told success.
//! 2. The part is written; one multi then creates the log entry, this
//!    replica's part node, the block id (holding the part's name), the
//!    quorum node if asked, and deletes the lock.
//!
//! A commit whose answer is lost is settled through its lock
//! ([`Resolution`]): deleting the lock succeeds only if the commit did not
//! happen (the commit deletes it) and makes sure it never will; when the
//! lock is already gone, the part's node says whether the commit happened.
//! A block found not committed is tried again from step 1 (at most
//! [`BLOCK_ATTEMPTS_MAX`] times); one that cannot be settled within
//! [`RESOLVE_TIMEOUT_MS`] ends [`Done::Unknown`], for the driver's
//! background resolver to settle with the same [`Resolution`].
//!
//! The driver (the node's table module) makes each coordinator call and
//! writes or removes the part's files as the [`Step`]s say, and feeds
//! each result back as an [`Input`] with the time.

use crate::entry::{EntryKind, LogEntry};
use crate::part::PartInfo;
use crate::quorum::QuorumEntry;
use crate::zk::{
    allocate_ops, commit_ops, sequence_of, Commit, CreateMode, KeeperOp, Paths, QuorumMode, COMMIT_BLOCK_OP,
};

/// Fresh attempts of a block found not committed.
pub const BLOCK_ATTEMPTS_MAX: usize = 3;
/// How long an insert tries to learn whether a commit whose answer was
/// lost happened, before it answers that it does not know (ms).
pub const RESOLVE_TIMEOUT_MS: u64 = 15_000;
/// Between two tries to settle a lost commit (ms).
pub const RESOLVE_RETRY_MS: u64 = 100;
/// Multis that take a block number, at most (the partition's lock
/// directory is made between them when it is missing).
const ALLOCATE_TRIES_MAX: u32 = 2;

/// A coordinator call's failure, as the insert tells them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    NodeExists,
    NoNode,
    /// A versioned op found another version.
    BadVersion,
    /// The outcome is unknown (the answer was lost).
    Lost(String),
    /// No live session: the call was not made.
    NoSession,
    Other(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::NodeExists => write!(f, "node exists"),
            Fail::NoNode => write!(f, "no node"),
            Fail::BadVersion => write!(f, "bad version"),
            Fail::Lost(why) => write!(f, "outcome unknown: {why}"),
            Fail::NoSession => write!(f, "no coordinator session"),
            Fail::Other(why) => write!(f, "{why}"),
        }
    }
}

/// A multi's failure: the op that failed, when the coordinator said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiFail {
    pub index: Option<usize>,
    pub fail: Fail,
}

/// Why a block certainly was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The coordinator refused or failed a call.
    Keeper(String),
    /// Another quorum insert committed first (a non-parallel quorum).
    QuorumBusy,
    /// The block number's lock is gone: the session that took it expired.
    LockGone(String),
    /// Found not committed [`BLOCK_ATTEMPTS_MAX`] times.
    NotCommitted,
    /// The part's files could not be written.
    PartWrite(String),
}

/// How a block's insert ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Committed(PartInfo),
    /// Answered as written and kept nowhere: the `lose-part` defect (the
    /// part is not current anywhere).
    DefectLost(PartInfo),
    /// Its id was there already: nothing was written.
    Duplicate,
    Refused(Refused),
    /// The commit's answer was lost and the coordinator could not be asked
    /// in time: the part stays precommitted under its lock.
    Unknown {
        part: String,
        lock: String,
        why: String,
    },
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Round trip 1: take a block number (checking the id): answer
    /// [`Input::Allocated`].
    Allocate(Vec<KeeperOp>),
    /// The naive path's own round trip: does the block id exist? Answer
    /// [`Input::IdExists`].
    CheckId(String),
    /// Make the partition's lock directory: answer [`Input::DirMade`].
    MakeDir(String),
    /// Write the part's files under this name: answer
    /// [`Input::PartWritten`].
    WritePart(String),
    /// Round trip 2, the commit (the driver holds its commit gate around
    /// it): answer [`Input::Committed`].
    Commit(Vec<KeeperOp>),
    /// The `lose-part` defect's commit: the id recorded and the lock
    /// released, no log entry and no part node. Answer
    /// [`Input::Committed`].
    DefectCommit(Vec<KeeperOp>),
    /// Remove the part's files and delete its lock (whatever comes of it):
    /// answer [`Input::Discarded`].
    Discard {
        part: String,
        lock: String,
    },
    /// Settling a lost commit: delete the lock (`Err(Fail::NoSession)`
    /// without a session): answer [`Input::LockDeleted`].
    DeleteLock(String),
    /// Settling a lost commit: does this replica's part node exist? Answer
    /// [`Input::PartNode`].
    PartNodeExists(String),
    /// Wait until this time (the monotonic clock's ms): answer
    /// [`Input::Woke`].
    SleepUntil(u64),
    Done(Done),
}

/// A result the driver feeds back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The first step.
    Start,
    /// The allocate multi's answer: the lock it created.
    Allocated(Result<String, MultiFail>),
    IdExists(Result<bool, Fail>),
    DirMade(Result<(), Fail>),
    PartWritten(Result<(), String>),
    Committed(Result<(), MultiFail>),
    Discarded,
    LockDeleted(Result<(), Fail>),
    PartNode(Result<bool, Fail>),
    Woke,
}

/// The time an input comes at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The machine's clock, ms since the epoch: the log entry's time.
    pub wall_ms: u64,
    /// A clock that never goes back (ms from any origin): deadlines.
    pub mono_ms: u64,
}

/// Something worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A lost commit was settled.
    CommitResolved { part: String, committed: bool },
    /// The `lose-part` defect answered a block as written and kept none of it.
    DefectLostPart { part: String, block_id: Option<String> },
}

/// The test-only defects that change an insert's decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defects {
    /// Look for no block id (every retry is written again).
    pub skip_dedup: bool,
    /// Leave no block id behind.
    pub no_block_id: bool,
    /// Record the id but keep no part.
    pub lose_part: bool,
}

/// What a block's insert is given.
#[derive(Debug, Clone)]
pub struct BlockSpec {
    pub paths: Paths,
    /// This replica's name (the log entry's source).
    pub replica: String,
    pub partition: String,
    /// The block's id, when it is deduplicated.
    pub id: Option<String>,
    /// The part's checksums, as its part node holds them.
    pub sums: Vec<u8>,
    /// Replicas the insert waits for (0: no quorum).
    pub quorum: u32,
    pub quorum_parallel: bool,
    /// Check the id with a round trip of its own before allocating (the
    /// naive path the benchmark compares against).
    pub naive: bool,
    pub defects: Defects,
}

/// Settling a commit whose answer was lost, through its lock (see the
/// module header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    part_node: String,
    lock: String,
    deadline_ms: u64,
}

/// A [`Resolution`]'s next step, or its end: `Some(committed)`, or `None`
/// when the coordinator could not be asked before the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    Step(Step),
    Settled(Option<bool>),
}

impl Resolution {
    /// Settles the commit of part `part` under `lock`, trying until
    /// `deadline_ms` (the monotonic clock); the first step.
    pub fn start(paths: &Paths, part: &str, lock: &str, deadline_ms: u64) -> (Resolution, Step) {
        let r = Resolution {
            part_node: paths.my_part(part),
            lock: lock.to_string(),
            deadline_ms,
        };
        let first = Step::DeleteLock(r.lock.clone());
        (r, first)
    }

    /// The answer to the last step, at `now_ms` (the monotonic clock).
    pub fn on(&mut self, now_ms: u64, input: Input) -> Settle {
        match input {
            // the lock was there: the commit never happened, and now never will
            Input::LockDeleted(Ok(())) => Settle::Settled(Some(false)),
            // gone: committed, or the session that held it expired
            Input::LockDeleted(Err(Fail::NoNode)) => Settle::Step(Step::PartNodeExists(self.part_node.clone())),
            Input::PartNode(Ok(there)) => Settle::Settled(Some(there)),
            Input::Woke => Settle::Step(Step::DeleteLock(self.lock.clone())),
            // no answer yet: again, until the deadline
            _ if now_ms >= self.deadline_ms => Settle::Settled(None),
            _ => Settle::Step(Step::SleepUntil(now_ms + RESOLVE_RETRY_MS)),
        }
    }
}

#[derive(Debug, Clone)]
enum State {
    Start,
    CheckingId,
    /// `last`: the index of the multi's last op, the lock's create.
    Allocating {
        tries: u32,
        last: usize,
    },
    MakingDir {
        tries: u32,
    },
    Writing {
        part: PartInfo,
        lock: String,
    },
    Committing {
        part: PartInfo,
        lock: String,
        defect: bool,
    },
    Discarding {
        then: Then,
    },
    Resolving {
        part: PartInfo,
        why: String,
        r: Resolution,
    },
    Finished,
}

/// What follows a discard.
#[derive(Debug, Clone)]
enum Then {
    Done(Done),
    /// The block was found not committed: try it again.
    Again,
}

/// One block's insert (see the module header).
#[derive(Debug, Clone)]
pub struct BlockInsert {
    spec: BlockSpec,
    /// Attempts made (a block found not committed is tried again).
    attempts: usize,
    state: State,
    notes: Vec<Note>,
}

impl BlockInsert {
    pub fn new(spec: BlockSpec) -> BlockInsert {
        BlockInsert {
            spec,
            attempts: 0,
            state: State::Start,
            notes: Vec::new(),
        }
    }

    /// The id looked for before a number is taken (none under `skip-dedup`).
    fn check_id(&self) -> Option<&str> {
        self.spec.id.as_deref().filter(|_| !self.spec.defects.skip_dedup)
    }

    /// The id the commit records (none under either dedup defect).
    fn commit_id(&self) -> Option<&str> {
        let d = self.spec.defects;
        self.spec.id.as_deref().filter(|_| !(d.skip_dedup || d.no_block_id))
    }

    /// What happened worth a log line since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    fn allocate(&mut self, tries: u32) -> Step {
        let id = if self.spec.naive { None } else { self.check_id() };
        let ops = allocate_ops(&self.spec.paths, &self.spec.partition, id);
        self.state = State::Allocating {
            tries: tries + 1,
            last: ops.len() - 1,
        };
        Step::Allocate(ops)
    }

    fn attempt(&mut self) -> Step {
        self.attempts += 1;
        if self.attempts > BLOCK_ATTEMPTS_MAX {
            return self.finish(Done::Refused(Refused::NotCommitted));
        }
        let naive_check = self
            .check_id()
            .filter(|_| self.spec.naive)
            .map(|id| self.spec.paths.block(id));
        match naive_check {
            Some(path) => {
                self.state = State::CheckingId;
                Step::CheckId(path)
            }
            None => self.allocate(0),
        }
    }

    fn finish(&mut self, d: Done) -> Step {
        self.state = State::Finished;
        Step::Done(d)
    }

    fn discard(&mut self, part: &PartInfo, lock: &str, then: Then) -> Step {
        self.state = State::Discarding { then };
        Step::Discard {
            part: part.name(),
            lock: lock.to_string(),
        }
    }

    fn keeper(what: &str, f: &Fail) -> Done {
        Done::Refused(Refused::Keeper(format!("{what}: {f}")))
    }

    /// The commit multi of `part` under `lock`, at `now_ms`.
    fn commit_ops(&self, part: &PartInfo, lock: &str, now_ms: u64) -> Vec<KeeperOp> {
        let s = &self.spec;
        let name = part.name();
        let id = self.commit_id();
        let entry = LogEntry {
            create_time_s: (now_ms / 1000) as i64,
            source_replica: s.replica.clone(),
            kind: EntryKind::GetPart {
                part: part.clone(),
                block_id: id.map(str::to_string),
                quorum: s.quorum,
            },
        }
        .encode();
        let quorum = if s.quorum > 0 {
            let q = QuorumEntry::new(part.clone(), s.quorum, &s.replica).encode();
            if s.quorum_parallel {
                QuorumMode::Parallel(q)
            } else {
                QuorumMode::Status(q)
            }
        } else {
            QuorumMode::None
        };
        commit_ops(
            &s.paths,
            &Commit {
                log_entry: &entry,
                lock_path: lock,
                block_id: id,
                part: &name,
                part_data: &s.sums,
                quorum,
            },
        )
    }

    /// The `lose-part` defect's commit: the lock released and the id
    /// recorded, nothing else.
    fn defect_ops(&self, part: &PartInfo, lock: &str) -> Vec<KeeperOp> {
        let mut ops = vec![KeeperOp::Delete {
            path: lock.to_string(),
            version: -1,
        }];
        if let Some(id) = &self.spec.id {
            ops.push(KeeperOp::Create {
                path: self.spec.paths.block(id),
                data: part.name().into_bytes(),
                mode: CreateMode::Persistent,
            });
        }
        ops
    }

    /// The answer to the last step (or [`Input::Start`] first), at `now`:
    /// the next step.
    pub fn on(&mut self, now: Now, input: Input) -> Step {
        let state = std::mem::replace(&mut self.state, State::Finished);
        match (state, input) {
            (State::Start, Input::Start) => self.attempt(),
            (State::CheckingId, Input::IdExists(Ok(true))) => self.finish(Done::Duplicate),
            (State::CheckingId, Input::IdExists(Ok(false))) => self.allocate(0),
            (State::CheckingId, Input::IdExists(Err(f))) => self.finish(Self::keeper("checking the block id", &f)),
            (State::Allocating { tries, last }, Input::Allocated(r)) => self.on_allocated(tries, last, r),
            (State::MakingDir { tries }, Input::DirMade(Ok(()))) => self.allocate(tries),
            (State::MakingDir { .. }, Input::DirMade(Err(f))) => {
                self.finish(Self::keeper("creating the partition's block numbers", &f))
            }
            (State::Writing { part, lock }, Input::PartWritten(Err(e))) => {
                let why = format!("writing part {}: {e}", part.name());
                self.discard(&part, &lock, Then::Done(Done::Refused(Refused::PartWrite(why))))
            }
            (State::Writing { part, lock }, Input::PartWritten(Ok(()))) => {
                let defect = self.spec.defects.lose_part;
                let ops = if defect {
                    self.defect_ops(&part, &lock)
                } else {
                    self.commit_ops(&part, &lock, now.wall_ms)
                };
                self.state = State::Committing { part, lock, defect };
                if defect {
                    Step::DefectCommit(ops)
                } else {
                    Step::Commit(ops)
                }
            }
            (
                State::Committing {
                    part,
                    lock,
                    defect: true,
                },
                Input::Committed(r),
            ) => match r {
                Ok(()) => {
                    self.notes.push(Note::DefectLostPart {
                        part: part.name(),
                        block_id: self.spec.id.clone(),
                    });
                    let done = Done::DefectLost(part.clone());
                    self.discard(&part, &lock, Then::Done(done))
                }
                Err(e) => self.finish(Self::keeper("the defect's commit", &e.fail)),
            },
            (State::Committing { part, lock, .. }, Input::Committed(r)) => {
                self.on_committed(now.mono_ms, part, lock, r)
            }
            (State::Discarding { then }, Input::Discarded) => match then {
                Then::Done(d) => self.finish(d),
                Then::Again => self.attempt(),
            },
            (State::Resolving { part, why, mut r }, input) => match r.on(now.mono_ms, input) {
                Settle::Step(step) => {
                    self.state = State::Resolving { part, why, r };
                    step
                }
                Settle::Settled(Some(true)) => {
                    self.notes.push(Note::CommitResolved {
                        part: part.name(),
                        committed: true,
                    });
                    self.finish(Done::Committed(part))
                }
                Settle::Settled(Some(false)) => {
                    self.notes.push(Note::CommitResolved {
                        part: part.name(),
                        committed: false,
                    });
                    let lock = r.lock.clone();
                    self.discard(&part, &lock, Then::Again)
                }
                Settle::Settled(None) => self.finish(Done::Unknown {
                    part: part.name(),
                    lock: r.lock,
                    why,
                }),
            },
            (state, input) => {
                let what = format!("the insert got {input:?} in state {state:?}");
                self.finish(Done::Refused(Refused::Keeper(what)))
            }
        }
    }

    fn on_allocated(&mut self, tries: u32, last: usize, r: Result<String, MultiFail>) -> Step {
        match r {
            Ok(lock) => {
                let prefix = self.spec.paths.lock_prefix(&self.spec.partition);
                let Some(number) = sequence_of(&lock, &prefix) else {
                    return self.finish(Done::Refused(Refused::Keeper(format!(
                        "lock {lock} has no block number"
                    ))));
                };
                let part = PartInfo::new(&self.spec.partition, number, number, 0);
                let name = part.name();
                self.state = State::Writing { part, lock };
                Step::WritePart(name)
            }
            // the id's check is the multi's first op
            Err(MultiFail {
                index: Some(0),
                fail: Fail::NodeExists,
            }) if last > 0 => self.finish(Done::Duplicate),
            // the partition's first block: its lock directory
            Err(MultiFail {
                index: Some(i),
                fail: Fail::NoNode,
            }) if i == last => {
                if tries >= ALLOCATE_TRIES_MAX {
                    return self.finish(Done::Refused(Refused::Keeper(
                        "the partition's lock directory keeps vanishing".into(),
                    )));
                }
                self.state = State::MakingDir { tries };
                Step::MakeDir(self.spec.paths.partition_numbers(&self.spec.partition))
            }
            Err(e) => self.finish(Self::keeper("allocating a block number", &e.fail)),
        }
    }

    fn on_committed(&mut self, mono_ms: u64, part: PartInfo, lock: String, r: Result<(), MultiFail>) -> Step {
        let name = part.name();
        let id = self.commit_id().is_some();
        let quorum_op = (self.spec.quorum > 0).then(|| COMMIT_BLOCK_OP + usize::from(id));
        let refused = |why: Refused| Then::Done(Done::Refused(why));
        let then = match r {
            Ok(()) => return self.finish(Done::Committed(part)),
            Err(MultiFail {
                index: Some(i),
                fail: Fail::NodeExists,
            }) if id && i == COMMIT_BLOCK_OP => Then::Done(Done::Duplicate),
            Err(MultiFail {
                index: Some(i),
                fail: Fail::NodeExists,
            }) if Some(i) == quorum_op => refused(Refused::QuorumBusy),
            Err(MultiFail {
                index: Some(1),
                fail: Fail::NoNode,
            }) => refused(Refused::LockGone(format!(
                "the block number lock {lock} is gone (the session expired): part {name} was not committed"
            ))),
            Err(MultiFail { index: Some(i), fail }) => {
                refused(Refused::Keeper(format!("committing part {name} (op {i}): {fail}")))
            }
            Err(MultiFail {
                index: None,
                fail: fail @ (Fail::Lost(_) | Fail::NoSession),
            }) => {
                let (r, first) = Resolution::start(&self.spec.paths, &name, &lock, mono_ms + RESOLVE_TIMEOUT_MS);
                self.state = State::Resolving {
                    part,
                    why: fail.to_string(),
                    r,
                };
                return first;
            }
            Err(MultiFail { index: None, fail }) => refused(Refused::Keeper(format!("committing part {name}: {fail}"))),
        };
        self.discard(&part, &lock, then)
    }
}

#[cfg(test)]
mod tests;
