//! One block's insert, step by step, without a coordinator: each test
//! answers the steps by hand, the way the coordinator would.

use super::*;
use crate::zk::sequence_name;

fn spec() -> BlockSpec {
    BlockSpec {
        paths: Paths::new("/t", "r1"),
        replica: "r1".into(),
        partition: "p".into(),
        id: Some("p_1_2".into()),
        sums: b"sums".to_vec(),
        quorum: 0,
        quorum_parallel: false,
        naive: false,
        defects: Defects::default(),
    }
}

fn at(ms: u64) -> Now {
    Now {
        wall_ms: ms,
        mono_ms: ms,
    }
}

fn lock(n: u64) -> String {
    sequence_name(&Paths::new("/t", "r1").lock_prefix("p"), n)
}

fn lost() -> MultiFail {
    MultiFail {
        index: None,
        fail: Fail::Lost("the connection dropped".into()),
    }
}

/// Answers the first round trip with lock `n` and the part's write: the
/// commit multi.
fn to_commit(b: &mut BlockInsert, n: u64) -> Vec<KeeperOp> {
    let Step::Allocate(_) = b.on(at(0), Input::Start) else {
        panic!("no allocate")
    };
    assert_eq!(
        b.on(at(0), Input::Allocated(Ok(lock(n)))),
        Step::WritePart(PartInfo::new("p", n, n, 0).name())
    );
    match b.on(at(7_000), Input::PartWritten(Ok(()))) {
        Step::Commit(ops) => ops,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_block_is_checked_numbered_written_and_committed_in_two_round_trips() {
    let mut b = BlockInsert::new(spec());
    let Step::Allocate(ops) = b.on(at(0), Input::Start) else {
        panic!()
    };
    assert_eq!(ops.len(), 3, "the id's check rides with the lock");
    assert_eq!(ops[0].path(), "/t/blocks/p_1_2");
    assert_eq!(
        b.on(at(0), Input::Allocated(Ok(lock(5)))),
        Step::WritePart("p_5_5_0".into())
    );
    let Step::Commit(ops) = b.on(at(7_000), Input::PartWritten(Ok(()))) else {
        panic!()
    };
    assert_eq!(ops[1].path(), lock(5), "the commit deletes the lock");
    assert_eq!(ops[COMMIT_BLOCK_OP].path(), "/t/blocks/p_1_2");
    assert_eq!(
        b.on(at(7_001), Input::Committed(Ok(()))),
        Step::Done(Done::Committed(PartInfo::new("p", 5, 5, 0)))
    );
}

#[test]
fn an_id_already_there_is_a_duplicate_and_nothing_is_written() {
    let mut b = BlockInsert::new(spec());
    b.on(at(0), Input::Start);
    let dup = MultiFail {
        index: Some(0),
        fail: Fail::NodeExists,
    };
    assert_eq!(b.on(at(0), Input::Allocated(Err(dup))), Step::Done(Done::Duplicate));
    // a duplicate that raced past the check is found at the commit: its
    // part and lock go
    let mut b = BlockInsert::new(spec());
    to_commit(&mut b, 3);
    let dup = MultiFail {
        index: Some(COMMIT_BLOCK_OP),
        fail: Fail::NodeExists,
    };
    assert_eq!(
        b.on(at(1), Input::Committed(Err(dup))),
        Step::Discard {
            part: "p_3_3_0".into(),
            lock: lock(3)
        }
    );
    assert_eq!(b.on(at(1), Input::Discarded), Step::Done(Done::Duplicate));
}

#[test]
fn the_partitions_first_block_makes_its_lock_directory_once() {
    let mut b = BlockInsert::new(spec());
    b.on(at(0), Input::Start);
    let no_dir = || MultiFail {
        index: Some(2),
        fail: Fail::NoNode,
    };
    assert_eq!(
        b.on(at(0), Input::Allocated(Err(no_dir()))),
        Step::MakeDir("/t/block_numbers/p".into())
    );
    assert!(matches!(b.on(at(0), Input::DirMade(Ok(()))), Step::Allocate(_)));
    let Step::Done(Done::Refused(Refused::Keeper(why))) = b.on(at(0), Input::Allocated(Err(no_dir()))) else {
        panic!()
    };
    assert!(why.contains("keeps vanishing"), "{why}");
}

#[test]
fn a_lost_commit_answer_is_settled_through_the_lock_and_retried_when_it_did_not_happen() {
    let mut b = BlockInsert::new(spec());
    to_commit(&mut b, 3);
    assert_eq!(b.on(at(10), Input::Committed(Err(lost()))), Step::DeleteLock(lock(3)));
    // the lock was there: not committed, and now never will be
    assert_eq!(
        b.on(at(11), Input::LockDeleted(Ok(()))),
        Step::Discard {
            part: "p_3_3_0".into(),
            lock: lock(3)
        }
    );
    assert_eq!(
        b.take_notes(),
        vec![Note::CommitResolved {
            part: "p_3_3_0".into(),
            committed: false
        }]
    );
    assert!(
        matches!(b.on(at(12), Input::Discarded), Step::Allocate(_)),
        "a fresh attempt"
    );
}

#[test]
fn a_lost_commit_answer_whose_lock_is_gone_is_committed_if_the_part_node_is_there() {
    for there in [true, false] {
        let mut b = BlockInsert::new(spec());
        to_commit(&mut b, 4);
        b.on(at(10), Input::Committed(Err(lost())));
        assert_eq!(
            b.on(at(11), Input::LockDeleted(Err(Fail::NoNode))),
            Step::PartNodeExists("/t/replicas/r1/parts/p_4_4_0".into())
        );
        let next = b.on(at(12), Input::PartNode(Ok(there)));
        if there {
            assert_eq!(next, Step::Done(Done::Committed(PartInfo::new("p", 4, 4, 0))));
        } else {
            assert!(matches!(next, Step::Discard { .. }), "{next:?}");
        }
    }
}

#[test]
fn a_commit_that_cannot_be_settled_in_time_ends_unknown_with_its_lock() {
    let mut b = BlockInsert::new(spec());
    to_commit(&mut b, 6);
    b.on(at(1_000), Input::Committed(Err(lost())));
    let mut now = 1_000;
    let mut sleeps = 0;
    let mut step = b.on(at(now), Input::LockDeleted(Err(Fail::NoSession)));
    while let Step::SleepUntil(until) = step {
        sleeps += 1;
        now = until;
        assert_eq!(b.on(at(now), Input::Woke), Step::DeleteLock(lock(6)));
        step = b.on(at(now), Input::LockDeleted(Err(Fail::NoSession)));
    }
    assert_eq!(sleeps as u64, RESOLVE_TIMEOUT_MS / RESOLVE_RETRY_MS);
    assert_eq!(
        step,
        Step::Done(Done::Unknown {
            part: "p_6_6_0".into(),
            lock: lock(6),
            why: "outcome unknown: the connection dropped".into()
        })
    );
}

#[test]
fn a_block_found_not_committed_three_times_is_refused() {
    let mut b = BlockInsert::new(spec());
    let mut step = b.on(at(0), Input::Start);
    for n in 0..BLOCK_ATTEMPTS_MAX as u64 {
        assert!(matches!(step, Step::Allocate(_)), "{step:?}");
        b.on(at(0), Input::Allocated(Ok(lock(n))));
        b.on(at(0), Input::PartWritten(Ok(())));
        b.on(at(0), Input::Committed(Err(lost())));
        b.on(at(0), Input::LockDeleted(Ok(())));
        step = b.on(at(0), Input::Discarded);
    }
    assert_eq!(step, Step::Done(Done::Refused(Refused::NotCommitted)));
}

#[test]
fn definite_commit_failures_discard_the_part_and_say_why() {
    let cases = [
        (
            MultiFail {
                index: Some(1),
                fail: Fail::NoNode,
            },
            "lock",
        ),
        (
            MultiFail {
                index: Some(0),
                fail: Fail::Other("bad arguments".into()),
            },
            "op 0",
        ),
    ];
    for (fail, said) in cases {
        let mut b = BlockInsert::new(spec());
        to_commit(&mut b, 2);
        assert!(matches!(b.on(at(0), Input::Committed(Err(fail))), Step::Discard { .. }));
        let Step::Done(Done::Refused(r)) = b.on(at(0), Input::Discarded) else {
            panic!()
        };
        assert!(format!("{r:?}").contains(said), "{r:?}");
    }
    // a second non-parallel quorum insert: its quorum node exists
    let mut b = BlockInsert::new(BlockSpec { quorum: 2, ..spec() });
    let ops = to_commit(&mut b, 2);
    assert_eq!(ops.last().map(KeeperOp::path), Some("/t/quorum/status"));
    let busy = MultiFail {
        index: Some(COMMIT_BLOCK_OP + 1),
        fail: Fail::NodeExists,
    };
    b.on(at(0), Input::Committed(Err(busy)));
    assert_eq!(
        b.on(at(0), Input::Discarded),
        Step::Done(Done::Refused(Refused::QuorumBusy))
    );
    // a part that could not be written
    let mut b = BlockInsert::new(spec());
    b.on(at(0), Input::Start);
    b.on(at(0), Input::Allocated(Ok(lock(1))));
    assert!(matches!(
        b.on(at(0), Input::PartWritten(Err("disk full".into()))),
        Step::Discard { .. }
    ));
    assert!(matches!(
        b.on(at(0), Input::Discarded),
        Step::Done(Done::Refused(Refused::PartWrite(_)))
    ));
}

#[test]
fn the_dedup_defects_change_what_is_checked_and_what_is_recorded() {
    let commit_records_id = |ops: &[KeeperOp]| ops.iter().any(|o| o.path() == "/t/blocks/p_1_2");
    // skip-dedup: no check, no id recorded
    let mut b = BlockInsert::new(BlockSpec {
        defects: Defects {
            skip_dedup: true,
            ..Defects::default()
        },
        ..spec()
    });
    let Step::Allocate(ops) = b.on(at(0), Input::Start) else {
        panic!()
    };
    assert_eq!(ops.len(), 1, "the lock alone");
    b.on(at(0), Input::Allocated(Ok(lock(1))));
    let Step::Commit(ops) = b.on(at(0), Input::PartWritten(Ok(()))) else {
        panic!()
    };
    assert!(!commit_records_id(&ops));
    // no-block-id: checked, but none left behind
    let mut b = BlockInsert::new(BlockSpec {
        defects: Defects {
            no_block_id: true,
            ..Defects::default()
        },
        ..spec()
    });
    let Step::Allocate(ops) = b.on(at(0), Input::Start) else {
        panic!()
    };
    assert_eq!(ops.len(), 3);
    b.on(at(0), Input::Allocated(Ok(lock(1))));
    let Step::Commit(ops) = b.on(at(0), Input::PartWritten(Ok(()))) else {
        panic!()
    };
    assert!(!commit_records_id(&ops));
    // lose-part: the id recorded and the lock released, nothing else; the
    // part goes and the block is answered as written
    let mut b = BlockInsert::new(BlockSpec {
        defects: Defects {
            lose_part: true,
            ..Defects::default()
        },
        ..spec()
    });
    b.on(at(0), Input::Start);
    b.on(at(0), Input::Allocated(Ok(lock(1))));
    let Step::DefectCommit(ops) = b.on(at(0), Input::PartWritten(Ok(()))) else {
        panic!()
    };
    assert_eq!(
        ops.iter().map(KeeperOp::path).collect::<Vec<_>>(),
        vec![lock(1).as_str(), "/t/blocks/p_1_2"]
    );
    assert!(matches!(b.on(at(0), Input::Committed(Ok(()))), Step::Discard { .. }));
    assert_eq!(
        b.on(at(0), Input::Discarded),
        Step::Done(Done::DefectLost(PartInfo::new("p", 1, 1, 0)))
    );
    assert!(matches!(b.take_notes()[..], [Note::DefectLostPart { .. }]));
}

#[test]
fn the_naive_path_checks_the_id_in_a_round_trip_of_its_own() {
    let mut b = BlockInsert::new(BlockSpec { naive: true, ..spec() });
    assert_eq!(b.on(at(0), Input::Start), Step::CheckId("/t/blocks/p_1_2".into()));
    let Step::Allocate(ops) = b.on(at(0), Input::IdExists(Ok(false))) else {
        panic!()
    };
    assert_eq!(ops.len(), 1);
    // a node-exists on the lock alone is not a duplicate
    let exists = MultiFail {
        index: Some(0),
        fail: Fail::NodeExists,
    };
    assert!(matches!(
        b.on(at(0), Input::Allocated(Err(exists))),
        Step::Done(Done::Refused(_))
    ));
    let mut b = BlockInsert::new(BlockSpec { naive: true, ..spec() });
    b.on(at(0), Input::Start);
    assert_eq!(b.on(at(0), Input::IdExists(Ok(true))), Step::Done(Done::Duplicate));
}

#[test]
fn an_answer_out_of_turn_ends_the_insert_with_what_came_and_never_panics() {
    let mut b = BlockInsert::new(spec());
    let Step::Done(Done::Refused(Refused::Keeper(why))) = b.on(at(0), Input::Committed(Ok(()))) else {
        panic!()
    };
    assert!(why.contains("Committed"), "{why}");
}
