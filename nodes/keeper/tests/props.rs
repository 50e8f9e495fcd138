//! Properties of the keeper core over random operation sequences.

use drift_keeper::acl::{Acl, Id, PERM_ALL, PERM_READ};
use drift_keeper::changelog::{self, Changelog, LogRecord};
use drift_keeper::disk::MemDisk;
use drift_keeper::entry::Entry;
use drift_keeper::snapshot::{self, SnapshotMeta};
use drift_keeper::{Create, CreateMode, Digest, DigestMode, Op, Response, Storage, Write};
use proptest::prelude::*;

const PATHS: [&str; 7] = ["/a", "/b", "/a/x", "/a/y", "/b/z", "/a/x/q", "/c"];

fn path() -> impl Strategy<Value = String> {
    prop::sample::select(&PATHS[..]).prop_map(str::to_string)
}

fn op() -> impl Strategy<Value = Op> {
    let mode = prop::sample::select(vec![
        CreateMode::Persistent,
        CreateMode::Ephemeral,
        CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential,
        CreateMode::Container,
        CreateMode::PersistentWithTtl,
    ]);
    let version = prop_oneof![Just(-1), 0..3i32];
    prop_oneof![
        (path(), mode, prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(p, mode, data)| {
            Op::Create(Create {
                path: p,
                data,
                acl: Acl::open(),
                mode,
                ttl_ms: if mode.is_ttl() { 3 } else { 0 },
            })
        }),
        (path(), version.clone()).prop_map(|(path, version)| Op::Delete { path, version }),
        (path(), prop::collection::vec(any::<u8>(), 0..8), version.clone())
            .prop_map(|(path, data, version)| Op::SetData { path, data, version }),
        (path(), version).prop_map(|(path, version)| Op::Check { path, version }),
    ]
}

/// (session, request): sessions 0 (system) and 1..=3.
fn write() -> impl Strategy<Value = (i64, Write)> {
    let session = 0..4i64;
    prop_oneof![
        6 => (session.clone(), op()).prop_map(|(s, o)| (s, Write::Op(o))),
        2 => (session.clone(), prop::collection::vec(op(), 1..4)).prop_map(|(s, ops)| (s, Write::Multi(ops))),
        1 => Just((0, Write::CreateSession { timeout_ms: 1000 })),
        1 => (1..4i64).prop_map(|s| (s, Write::CloseSession)),
        1 => (1..4i64).prop_map(|s| (s, Write::AddAuth { scheme: "digest".into(), auth: b"u:p".to_vec() })),
        1 => path().prop_map(|p| (0, Write::Reap { path: p })),
        1 => (session, path(), any::<bool>()).prop_map(|(s, p, open)| {
            let acl = if open {
                vec![Acl { perms: PERM_ALL, id: Id { scheme: "world".into(), id: "anyone".into() } }]
            } else {
                vec![Acl { perms: PERM_READ | 16, id: Id { scheme: "auth".into(), id: String::new() } }]
            };
            (s, Write::SetAcl { path: p, acl, version: -1 })
        }),
    ]
}

/// The log: entries with zxid = position + 1 and time advancing.
fn log() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec((write(), 0..3i64), 1..60).prop_map(|ws| {
        let mut time = 1_000;
        ws.into_iter()
            .enumerate()
            .map(|(i, ((session, request), dt))| {
                time += dt;
                Entry {
                    zxid: i as i64 + 1,
                    time_ms: time,
                    session,
                    digest: Digest::NONE,
                    request,
                }
            })
            .collect()
    })
}

/// Applies entries one by one (preprocess then commit), checking the
/// invariants after each; returns the responses.
fn apply_each(s: &mut Storage, entries: &[Entry]) -> Vec<Response> {
    entries
        .iter()
        .map(|e| {
            s.preprocess(e.session, e.zxid, e.time_ms, &e.request);
            let r = s.commit(e.zxid).response;
            s.state().check_invariants();
            r
        })
        .collect()
}

/// Preprocesses everything first, then commits: a follower that fell
/// behind on commits.
fn apply_batched(s: &mut Storage, entries: &[Entry]) -> Vec<Response> {
    for e in entries {
        s.preprocess(e.session, e.zxid, e.time_ms, &e.request);
    }
    entries.iter().map(|e| s.commit(e.zxid).response).collect()
}

fn snapshot_bytes(s: &Storage, index: u64) -> Vec<u8> {
    let meta = SnapshotMeta {
        last_index: index,
        last_term: 1,
        zxid: s.state().last_zxid(),
        digest: s.digest(),
    };
    snapshot::encode(s.state(), &meta, true, 3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Full mode asserts inside `commit` that the incremental digest equals
    /// a recompute from scratch after every entry.
    #[test]
    fn incremental_digest_equals_full_recompute(entries in log()) {
        let mut s = Storage::new(DigestMode::Full);
        apply_each(&mut s, &entries);
        prop_assert_eq!(s.digest().value, drift_keeper::digest::tree_value(s.state().recompute_digest()));
    }

    #[test]
    fn replicas_applying_the_same_log_agree_byte_for_byte(entries in log()) {
        let mut a = Storage::new(DigestMode::Incremental);
        let mut b = Storage::new(DigestMode::Full);
        let ra = apply_each(&mut a, &entries);
        let rb = apply_batched(&mut b, &entries);
        prop_assert_eq!(ra, rb);
        prop_assert_eq!(a.digest(), b.digest());
        prop_assert_eq!(snapshot_bytes(&a, 9), snapshot_bytes(&b, 9));
    }

    #[test]
    fn snapshot_then_load_behaves_identically_for_the_rest_of_the_log(entries in log(), cut in any::<prop::sample::Index>()) {
        let k = cut.index(entries.len() + 1);
        let mut whole = Storage::new(DigestMode::Full);
        let want = apply_each(&mut whole, &entries);
        let mut first = Storage::new(DigestMode::Full);
        apply_each(&mut first, &entries[..k]);
        let bytes = snapshot_bytes(&first, k as u64);
        let (state, meta) = snapshot::decode("s", &bytes, true).unwrap();
        prop_assert_eq!(meta.digest, first.digest());
        let mut resumed = Storage::from_state(state, true);
        prop_assert_eq!(resumed.digest(), first.digest());
        let rest = apply_each(&mut resumed, &entries[k..]);
        prop_assert_eq!(&rest[..], &want[k..]);
        prop_assert_eq!(resumed.digest(), whole.digest());
        prop_assert_eq!(snapshot_bytes(&resumed, 1), snapshot_bytes(&whole, 1));
    }

    #[test]
    fn rollback_then_replay_matches_a_replica_that_never_saw_the_truncated_entries(
        entries in log(), other in log(), cut in any::<prop::sample::Index>()
    ) {
        // a follower preprocesses a suffix from a deposed leader, rolls it
        // back, and takes the new leader's entries instead
        let k = cut.index(entries.len() + 1);
        let mut follower = Storage::new(DigestMode::Full);
        for e in &entries[..k] {
            follower.preprocess(e.session, e.zxid, e.time_ms, &e.request);
        }
        for e in &other {
            let zxid = k as i64 + e.zxid;
            follower.preprocess(e.session, zxid, e.time_ms, &e.request);
        }
        follower.rollback_after(k as i64);
        for e in &entries[k..] {
            follower.preprocess(e.session, e.zxid, e.time_ms, &e.request);
        }
        let got: Vec<Response> = entries.iter().map(|e| follower.commit(e.zxid).response).collect();
        let mut clean = Storage::new(DigestMode::Full);
        let want = apply_each(&mut clean, &entries);
        prop_assert_eq!(got, want);
        prop_assert_eq!(follower.digest(), clean.digest());
    }

    #[test]
    fn crash_anywhere_in_the_changelog_replays_to_the_last_synced_entry(
        entries in log(), cut in any::<prop::sample::Index>(), torn in any::<prop::sample::Index>()
    ) {
        // every entry but the last is appended and synced; the last append
        // is interrupted, and the crash keeps any prefix of its bytes
        let k = cut.index(entries.len()) + 1;
        let entries = &entries[..k];
        let mut disk = MemDisk::new();
        let cfg = changelog::Config { rotate_interval: 7, reserved_log_items: 0, zstd_level: 1, cache_bytes: 0, reserve_bytes: 0 };
        let (mut log, _) = Changelog::open(&mut disk, cfg).unwrap();
        let records: Vec<LogRecord> = entries
            .iter()
            .map(|e| LogRecord { index: e.zxid as u64, term: 1, kind: 0, data: e.encode() })
            .collect();
        for r in &records[..k - 1] {
            log.append(&mut disk, std::slice::from_ref(r)).unwrap();
        }
        disk.fail_next(drift_keeper::disk::DiskOp::Sync);
        prop_assert!(log.append(&mut disk, &records[k - 1..]).is_err());
        disk.crash_keeping(|_, n| torn.index(n + 1));
        let (log, _) = Changelog::open(&mut disk, cfg).unwrap();
        let survived = log.last_index().unwrap_or(0) as usize;
        prop_assert!(survived == k - 1 || survived == k);
        let mut replayed = Storage::new(DigestMode::Full);
        for r in log.read_range(&disk, 0, u64::MAX).unwrap() {
            let e = Entry::decode(&r.data).unwrap();
            replayed.preprocess(e.session, e.zxid, e.time_ms, &e.request);
            replayed.commit(e.zxid);
        }
        let mut reference = Storage::new(DigestMode::Full);
        apply_each(&mut reference, &entries[..survived]);
        prop_assert_eq!(replayed.digest(), reference.digest());
        prop_assert_eq!(snapshot_bytes(&replayed, 1), snapshot_bytes(&reference, 1));
    }

    #[test]
    fn log_entries_round_trip_through_their_encoding(entries in log()) {
        for mut e in entries {
            e.digest = Digest { version: 1, value: e.zxid as u64 * 7919 };
            prop_assert_eq!(Entry::decode(&e.encode()).unwrap(), e);
        }
    }

    #[test]
    fn entry_decoder_never_panics_on_garbage(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        digest_version in 0u8..3,
    ) {
        let _ = Entry::decode(&bytes);
        // a valid header (format, zxid, time, session, digest) with a
        // garbage request, so the request decoder is what gets fuzzed
        let mut framed = vec![drift_keeper::entry::FORMAT_VERSION];
        framed.extend_from_slice(&[0u8; 24]);
        framed.push(digest_version);
        if digest_version != 0 {
            framed.extend_from_slice(&[7u8; 8]);
        }
        framed.extend_from_slice(&bytes);
        let _ = Entry::decode(&framed);
    }

    /// The wire decoders take anything: garbage, truncations, and valid
    /// headers followed by garbage bodies for every opcode.
    #[test]
    fn jute_decoders_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        op in prop::sample::select(vec![-11i32, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 19, 21, 22, 100, 101, 105, 999])
    ) {
        let _ = drift_keeper::proto::Request::decode(&bytes);
        let _ = drift_keeper::proto::ConnectRequest::decode(&bytes);
        let _ = drift_keeper::jute::split_frames(&bytes);
        let mut framed = 7i32.to_be_bytes().to_vec();
        framed.extend_from_slice(&op.to_be_bytes());
        framed.extend_from_slice(&bytes);
        let _ = drift_keeper::proto::Request::decode(&framed);
    }
}

/// A length near a limit: well under, at, or just over it.
fn near(max: usize) -> BoxedStrategy<usize> {
    prop_oneof![0..4usize, Just(max - 1), Just(max), Just(max + 1)].boxed()
}

fn path_near_limit() -> BoxedStrategy<String> {
    near(drift_keeper::path::PATH_BYTES_MAX)
        .prop_map(|n| format!("/{}", "p".repeat(n.saturating_sub(1))))
        .boxed()
}

fn acl_near_limits() -> BoxedStrategy<Vec<Acl>> {
    use drift_keeper::acl::{ACL_ENTRIES_MAX, ACL_ID_BYTES_MAX};
    (near(ACL_ENTRIES_MAX), near(ACL_ID_BYTES_MAX))
        .prop_map(|(n, id)| {
            vec![
                Acl {
                    perms: PERM_ALL,
                    id: Id {
                        scheme: "digest".into(),
                        id: "i".repeat(id)
                    }
                };
                n
            ]
        })
        .boxed()
}

fn op_near_limits() -> BoxedStrategy<Op> {
    use drift_keeper::node::DATA_BYTES_MAX;
    let create = (path_near_limit(), near(DATA_BYTES_MAX), acl_near_limits()).prop_map(|(path, n, acl)| {
        Op::Create(Create {
            path,
            data: vec![1; n],
            acl,
            mode: CreateMode::Persistent,
            ttl_ms: 0,
        })
    });
    let set = (path_near_limit(), near(DATA_BYTES_MAX)).prop_map(|(path, n)| Op::SetData {
        path,
        data: vec![2; n],
        version: -1,
    });
    prop_oneof![create, set].boxed()
}

/// Writes whose fields sit on either side of the decoder's limits.
fn write_near_limits() -> impl Strategy<Value = Write> {
    use drift_keeper::acl::ACL_ID_BYTES_MAX;
    prop_oneof![
        op_near_limits().prop_map(Write::Op),
        prop::collection::vec(op_near_limits(), 1..4).prop_map(Write::Multi),
        (path_near_limit(), acl_near_limits()).prop_map(|(path, acl)| Write::SetAcl { path, acl, version: -1 }),
        (near(ACL_ID_BYTES_MAX), near(ACL_ID_BYTES_MAX)).prop_map(|(s, a)| Write::AddAuth {
            scheme: "s".repeat(s),
            auth: vec![b'a'; a]
        }),
        path_near_limit().prop_map(|path| Write::Sync { path }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// What `limit::check` admits, every replica decodes; what the decoder
    /// refuses, `limit::check` refuses before it is proposed.
    #[test]
    fn admitted_writes_are_exactly_the_ones_every_replica_decodes(request in write_near_limits()) {
        let mut w = drift_keeper::codec::Writer::new();
        request.encode(&mut w);
        prop_assert_eq!(request.encoded_len(), w.buf.len());
        let e = Entry { zxid: 1, time_ms: 1, session: 1, digest: Digest::NONE, request: request.clone() };
        let decoded = Entry::decode(&e.encode());
        match drift_keeper::limit::check(&request) {
            Ok(()) => prop_assert_eq!(decoded.map(|d| d.request), Ok(request)),
            Err(over) if over.field == "request bytes" => {}
            Err(over) => prop_assert!(decoded.is_err(), "{over} yet the entry decodes"),
        }
    }
}
