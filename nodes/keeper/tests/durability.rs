//! Changelog and snapshots on a disk that crashes and rots.

use drift_keeper::acl::Acl;
use drift_keeper::changelog::{self, Changelog, ChangelogError, Config, LogRecord};
use drift_keeper::disk::{Disk, DiskOp, MemDisk};
use drift_keeper::snapshot::{self, SnapshotError, SnapshotMeta, Snapshots};
use drift_keeper::{Create, CreateMode, DigestMode, Op, Storage, Write};

fn rec(index: u64, term: u64) -> LogRecord {
    LogRecord {
        index,
        term,
        kind: 0,
        data: format!("entry {index} term {term}").into_bytes(),
    }
}

fn config(rotate: u64) -> Config {
    Config {
        rotate_interval: rotate,
        reserved_log_items: 0,
        zstd_level: 1,
        // only the newest record in memory: every other one is read back
        // from its segment, so these tests run the read path too
        cache_bytes: 0,
        reserve_bytes: 0,
    }
}

fn indices(log: &Changelog) -> Vec<(u64, u64)> {
    let last = log.last_index().unwrap_or(0);
    (log.start_index()..=last)
        .filter_map(|i| Some((i, log.term(i)?)))
        .collect()
}

/// A disk holding `bytes` as the file `name`, synced.
fn disk_holding(name: &str, bytes: &[u8]) -> MemDisk {
    let mut d = MemDisk::new();
    d.write(name, bytes).unwrap();
    d.sync(name).unwrap();
    d
}

/// A log of records 1..=`n` ([`rec`], appended one at a time): its disk,
/// its one segment's name and bytes, and where each record ends (from 0,
/// the start of the first).
fn appended_one_by_one(n: u64) -> (MemDisk, String, Vec<u8>, Vec<usize>) {
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
    let mut ends = vec![0usize];
    for i in 1..=n {
        log.append(&mut disk, &[rec(i, 1)]).unwrap();
        ends.push(ends.last().unwrap() + changelog::encode_record(&rec(i, 1), 1).len());
    }
    let name = changelog::segment_name(1);
    let bytes = disk.read(&name).unwrap();
    assert_eq!(*ends.last().unwrap(), bytes.len());
    (disk, name, bytes, ends)
}

/// Record `index` as the log reads it (from disk unless it is the newest).
fn at(log: &Changelog, disk: &MemDisk, index: u64) -> Option<LogRecord> {
    log.get(disk, index).unwrap().map(|r| r.into_owned())
}

#[test]
fn append_returns_after_one_sync_per_segment_and_survives_a_crash() {
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(100)).unwrap();
    let batch: Vec<LogRecord> = (1..=10).map(|i| rec(i, 1)).collect();
    log.append(&mut disk, &batch).unwrap();
    assert_eq!(disk.syncs, 1, "one fsync for the whole batch");
    disk.crash();
    let (log, report) = Changelog::open(&mut disk, config(100)).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(log.last_index(), Some(10));
    assert_eq!(at(&log, &disk, 7), Some(rec(7, 1)));
}

#[test]
fn segments_rotate_every_rotate_interval_entries() {
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(4)).unwrap();
    let batch: Vec<LogRecord> = (1..=10).map(|i| rec(i, 1)).collect();
    log.append(&mut disk, &batch).unwrap();
    assert_eq!(
        log.segment_names(),
        [
            changelog::segment_name(1),
            changelog::segment_name(5),
            changelog::segment_name(9)
        ]
    );
    assert_eq!(disk.syncs, 3);
    let (reopened, _) = Changelog::open(&mut disk, config(4)).unwrap();
    assert_eq!(indices(&reopened), indices(&log));
}

#[test]
fn crash_at_any_byte_keeps_exactly_the_whole_records_before_it() {
    let (_, name, bytes, ends) = appended_one_by_one(6);
    for cut in 0..=bytes.len() {
        let mut d = disk_holding(&name, &bytes[..cut]);
        let (log, report) = Changelog::open(&mut d, config(1000)).unwrap();
        let whole = ends.iter().filter(|&&e| e <= cut).count() as u64 - 1;
        assert_eq!(log.last_index().unwrap_or(0), whole, "cut at {cut}");
        let at_boundary = ends.contains(&cut);
        assert_eq!(report.torn_tail.is_some(), !at_boundary, "cut at {cut}");
        if let Some(t) = report.torn_tail {
            assert_eq!(
                (t.file.as_str(), t.offset),
                (name.as_str(), ends[whole as usize] as u64)
            );
            // the repair is durable: a second open finds nothing to repair
            let (_, again) = Changelog::open(&mut d, config(1000)).unwrap();
            assert_eq!(again.torn_tail, None);
        }
    }
}

/// Room reserved ahead of the log's end (`Config::reserve_bytes`) and
/// left by a crash reads as zeros after the last record. Cut at any byte
/// of the last records with the rest of the room zeros, the log keeps
/// exactly the whole records, takes the zeros for the segment's end
/// (nothing torn at a record's boundary) and cuts them off; a record cut
/// short before the zeros is still a torn tail. Zeros after an earlier
/// segment's records are its end too.
#[test]
fn zeros_after_the_last_record_are_the_segments_end_not_a_torn_tail() {
    const ROOM: usize = 4096;
    let (_, name, bytes, ends) = appended_one_by_one(4);
    for cut in ends[2]..=bytes.len() {
        let mut file = bytes[..cut].to_vec();
        file.resize(ROOM, 0);
        let mut d = disk_holding(&name, &file);
        let (log, report) = Changelog::open(&mut d, config(1000)).unwrap();
        let whole = ends.iter().filter(|&&e| e <= cut).count() - 1;
        assert_eq!(log.last_index(), Some(whole as u64), "cut at {cut}");
        assert_eq!(report.torn_tail.is_some(), !ends.contains(&cut), "cut at {cut}");
        assert_eq!(
            d.len(&name).unwrap(),
            ends[whole] as u64,
            "cut at {cut}: the zeros are cut off"
        );
        assert_eq!(at(&log, &d, whole as u64), Some(rec(whole as u64, 1)));
    }
    // an earlier segment's zeros
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(4)).unwrap();
    log.append(&mut disk, &(1..=10).map(|i| rec(i, 1)).collect::<Vec<_>>())
        .unwrap();
    let first = changelog::segment_name(1);
    let len = disk.len(&first).unwrap();
    disk.append(&first, &[0; 100]).unwrap();
    disk.sync(&first).unwrap();
    let (again, report) = Changelog::open(&mut disk, config(4)).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(indices(&again), indices(&log));
    assert_eq!(at(&again, &disk, 2), Some(rec(2, 1)));
    assert_eq!(disk.len(&first).unwrap(), len);
    // but zeros followed by a record of the segment are damage
    let mut damaged = disk.read(&first).unwrap();
    damaged.splice(0..0, [0u8; 16]);
    disk.write(&first, &damaged).unwrap();
    disk.sync(&first).unwrap();
    assert!(matches!(
        Changelog::open(&mut disk, config(4)),
        Err(ChangelogError::Corrupt { .. })
    ));
}

/// After a power loss, the unsynced pages of reserved room may reach the
/// disk in any order: a block of the room still zeros with written
/// records after it. In the last segment that is a torn tail at the first
/// record it breaks (the records after it were never synced); the same
/// records after a flipped byte instead of a zero block are damage.
#[test]
fn a_block_of_room_never_written_before_later_records_is_a_torn_tail() {
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
    let big = |i: u64| LogRecord {
        index: i,
        term: 1,
        kind: 0,
        // distinct, so none is all zeros and none compresses
        data: (0..700u32).map(|b| (b as u64 * 31 + i * 7) as u8 | 1).collect(),
    };
    let recs: Vec<LogRecord> = (1..=20).map(big).collect();
    log.append(&mut disk, &recs).unwrap();
    let name = changelog::segment_name(1);
    let bytes = disk.read(&name).unwrap();
    let size = changelog::encode_record(&big(1), 1).len();
    assert!(bytes.len() > 3 * 4096, "{} bytes", bytes.len());
    // the block [4096, 8192) never written: record k holds byte 4096
    let k = 4096 / size;
    let mut holed = bytes.clone();
    holed[4096..8192].fill(0);
    let mut d = disk_holding(&name, &holed);
    let (log, report) = Changelog::open(&mut d, config(1000)).unwrap();
    assert_eq!(log.last_index(), Some(k as u64));
    let torn = report.torn_tail.expect("a torn tail");
    assert_eq!(torn.offset, (k * size) as u64);
    assert_eq!(d.len(&name).unwrap(), (k * size) as u64);
    // the block holding the last synced record, written again with the
    // records after it and lost: zeros from the first of those to the
    // block's end, later blocks written
    let j = 4096 / size + 1;
    assert!(j * size < 8192 && !(j * size).is_multiple_of(4096));
    let mut partial = bytes.clone();
    partial[j * size..8192].fill(0);
    let mut d = disk_holding(&name, &partial);
    let (log, report) = Changelog::open(&mut d, config(1000)).unwrap();
    assert_eq!(log.last_index(), Some(j as u64));
    assert_eq!(report.torn_tail.expect("a torn tail").offset, (j * size) as u64);
    // zeros from a record's start that stop short of the block's end are
    // damage: a page is written whole or not at all
    let mut short = bytes.clone();
    short[j * size..8000].fill(0);
    assert!(matches!(
        Changelog::open(&mut disk_holding(&name, &short), config(1000)),
        Err(ChangelogError::Corrupt { .. })
    ));
    // a flipped byte there instead is damage: a later record follows
    let mut flipped = bytes;
    flipped[4100] ^= 0x5a;
    assert!(matches!(
        Changelog::open(&mut disk_holding(&name, &flipped), config(1000)),
        Err(ChangelogError::Corrupt { .. })
    ));
}

/// Through the memory disk's own crash model: a log with room reserved
/// ahead, a synced batch, then an unsynced batch of which the crash loses
/// one page inside the room (or all of it, or none) and leaves the room's
/// zeros after it. Every such log opens, with the synced batch whole and
/// no more than the unsynced batch lost.
#[test]
fn a_crash_that_loses_a_page_of_the_unsynced_tail_inside_the_room_opens_with_every_synced_record() {
    use drift_keeper::disk::TailFate;
    let big = |i: u64| LogRecord {
        index: i,
        term: 1,
        kind: 0,
        // distinct, so none is all zeros and none compresses
        data: (0..700u32).map(|b| (b as u64 * 31 + i * 7) as u8 | 1).collect(),
    };
    let reserving = Config {
        reserve_bytes: 64 * 1024,
        ..config(1000)
    };
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, reserving).unwrap();
    log.append(&mut disk, &(1..=5).map(big).collect::<Vec<_>>()).unwrap();
    let unsynced = log
        .append_unsynced(&mut disk, &(6..=30).map(big).collect::<Vec<_>>())
        .unwrap()
        .expect("a segment to sync");
    let mut fates = vec![TailFate::Drop, TailFate::Keep];
    let mut holes_seen = 0;
    disk.clone().crash_with(|_, _, holes| {
        holes_seen = holes;
        TailFate::Keep
    });
    assert!(holes_seen >= 3, "{holes_seen} blocks inside the tail and the room");
    fates.extend((0..holes_seen).map(|block| TailFate::Hole { block }));
    for fate in fates {
        let mut d = disk.clone();
        d.crash_with(|_, _, _| fate);
        assert!(d.read(&unsynced).unwrap().len() >= 64 * 1024, "the room's zeros stay");
        let (log, _) =
            Changelog::open(&mut d, reserving).unwrap_or_else(|e| panic!("{fate:?}: the log does not open: {e}"));
        let last = log.last_index().unwrap_or(0);
        assert!(last >= 5, "{fate:?}: synced records lost (last {last})");
        for i in 1..=last {
            assert_eq!(at(&log, &d, i), Some(big(i)), "{fate:?}: record {i}");
        }
        match fate {
            TailFate::Keep => assert_eq!(last, 30),
            TailFate::Drop => assert_eq!(last, 5),
            // the records before the lost page
            _ => assert!(last < 30, "{fate:?}: a record in the hole read back"),
        }
    }
}

#[test]
fn a_record_hidden_in_an_entrys_data_does_not_turn_a_torn_tail_into_corruption() {
    // a client's data may hold the bytes of a well-formed record (a raw
    // record stores data verbatim); tearing the entry that carries them is
    // still a torn tail
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
    log.append(&mut disk, &[rec(1, 1), rec(2, 1)]).unwrap();
    let mut data = changelog::encode_record(&rec(1, 1), 1);
    // incompressible filler around it: the carrier is stored raw
    let mut x = 0x9e37_79b9u32;
    let noise: Vec<u8> = (0..2048)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    data.splice(0..0, noise.iter().copied());
    data.extend_from_slice(&noise);
    let carrier = LogRecord {
        index: 3,
        term: 1,
        kind: 0,
        data,
    };
    let name = changelog::segment_name(1);
    let before = disk.read(&name).unwrap().len();
    log.append(&mut disk, &[carrier]).unwrap();
    let whole = disk.read(&name).unwrap();
    // the crash keeps the carrier up to just past the hidden record
    let cut = before + 20 + 2048 + changelog::encode_record(&rec(1, 1), 1).len() + 10;
    assert!(cut < whole.len());
    let mut d = MemDisk::new();
    d.write(&name, &whole[..cut]).unwrap();
    d.sync(&name).unwrap();
    let (log, report) = Changelog::open(&mut d, config(1000)).expect("a torn tail, not corruption");
    assert_eq!(log.last_index(), Some(2));
    assert!(report.torn_tail.is_some());
}

#[test]
fn small_records_are_stored_raw_and_large_compressible_ones_compressed() {
    let small = rec(1, 1);
    let raw = changelog::encode_record(&small, 1);
    assert_eq!(raw[..4], 0xD71F_7C0Bu32.to_be_bytes(), "raw record magic");
    assert!(raw.ends_with(&small.data), "the data is stored as it is");
    let large = LogRecord {
        index: 2,
        term: 1,
        kind: 0,
        data: b"/clickhouse/tables/t/blocks/all_1_1_0".repeat(200),
    };
    let packed = changelog::encode_record(&large, 1);
    assert_eq!(packed[..4], 0xD71F_7C0Au32.to_be_bytes(), "compressed record magic");
    assert!(packed.len() < large.data.len() / 4, "{} bytes", packed.len());
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
    log.append(&mut disk, &[small.clone(), large.clone()]).unwrap();
    let (log, report) = Changelog::open(&mut disk, config(1000)).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(
        (at(&log, &disk, 1), at(&log, &disk, 2)),
        (Some(small.clone()), Some(large.clone()))
    );
}

#[test]
fn a_changelog_written_with_every_record_compressed_still_loads() {
    // the format before raw records compressed even the smallest record
    let mut bytes = Vec::new();
    for i in 1..=3 {
        let r = rec(i, 2);
        let mut plain = Vec::new();
        plain.extend_from_slice(&r.index.to_be_bytes());
        plain.extend_from_slice(&r.term.to_be_bytes());
        plain.push(r.kind);
        plain.extend_from_slice(&r.data);
        let payload = zstd::bulk::compress(&plain, 1).unwrap();
        bytes.extend_from_slice(&0xD71F_7C0Au32.to_be_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_be_bytes());
        bytes.extend_from_slice(&payload);
    }
    let mut disk = MemDisk::new();
    let name = changelog::segment_name(1);
    disk.write(&name, &bytes).unwrap();
    disk.sync(&name).unwrap();
    let (mut log, report) = Changelog::open(&mut disk, config(1000)).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(indices(&log), [(1, 2), (2, 2), (3, 2)]);
    assert_eq!(at(&log, &disk, 2), Some(rec(2, 2)));
    // and appending after them mixes the two kinds in one segment
    log.append(&mut disk, &[rec(4, 2)]).unwrap();
    let (log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
    assert_eq!(at(&log, &disk, 4), Some(rec(4, 2)));
}

#[test]
fn interrupted_append_loses_only_the_unacknowledged_entry() {
    for keep in [0, 5, 13, 40, 10_000] {
        let mut disk = MemDisk::new();
        let (mut log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
        for i in 1..=4 {
            log.append(&mut disk, &[rec(i, 1)]).unwrap();
        }
        disk.fail_next(DiskOp::Sync);
        assert!(log.append(&mut disk, &[rec(5, 1)]).is_err(), "not acknowledged");
        disk.crash_keeping(|_, _| keep);
        let (log, _) = Changelog::open(&mut disk, config(1000)).unwrap();
        let last = log.last_index().unwrap();
        assert!(
            last == 4 || (last == 5 && at(&log, &disk, 5) == Some(rec(5, 1))),
            "keep {keep}: last {last}"
        );
    }
}

#[test]
fn flipped_byte_anywhere_is_detected_with_file_and_offset() {
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(3)).unwrap();
    let batch: Vec<LogRecord> = (1..=6).map(|i| rec(i, 1)).collect();
    log.append(&mut disk, &batch).unwrap();
    let original = indices(&log);
    for name in log.segment_names() {
        let len = disk.len(&name).unwrap() as usize;
        let is_last = name == changelog::segment_name(4);
        for offset in 0..len {
            let mut d = disk.clone();
            d.flip(&name, offset, 0x40);
            match Changelog::open(&mut d, config(3)) {
                Err(ChangelogError::Corrupt { file, offset: at, .. }) => {
                    assert_eq!(file, name);
                    assert!(at as usize <= offset, "reported {at} after the flip at {offset}");
                }
                Ok((loaded, report)) => {
                    // only a damaged last record of the last segment may be cut off, and it is reported
                    assert!(is_last, "{name}@{offset}: loaded a corrupt non-final segment");
                    let t = report
                        .torn_tail
                        .unwrap_or_else(|| panic!("{name}@{offset}: loaded silently"));
                    assert_eq!(t.file, name);
                    assert_eq!(indices(&loaded), original[..5]);
                }
                Err(e) => panic!("{name}@{offset}: {e}"),
            }
        }
    }
}

#[test]
fn overwriting_a_suffix_replaces_conflicting_entries() {
    let mut disk = MemDisk::new();
    let (mut log, _) = Changelog::open(&mut disk, config(4)).unwrap();
    log.append(&mut disk, &(1..=10).map(|i| rec(i, 1)).collect::<Vec<_>>())
        .unwrap();
    log.append(&mut disk, &[rec(6, 2), rec(7, 2)]).unwrap();
    let want: Vec<(u64, u64)> = (1..=5).map(|i| (i, 1)).chain([(6, 2), (7, 2)]).collect();
    assert_eq!(indices(&log), want);
    let (reopened, report) = Changelog::open(&mut disk, config(4)).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(indices(&reopened), want);
    assert!(matches!(
        log.append(&mut disk, &[rec(20, 2)]),
        Err(ChangelogError::Invalid(_))
    ));
}

#[test]
fn compaction_drops_whole_segments_below_the_snapshot_keeping_reserved_items() {
    let mut disk = MemDisk::new();
    let cfg = Config {
        rotate_interval: 4,
        reserved_log_items: 2,
        zstd_level: 1,
        cache_bytes: 1 << 20,
        reserve_bytes: 0,
    };
    let (mut log, _) = Changelog::open(&mut disk, cfg).unwrap();
    log.append(&mut disk, &(1..=20).map(|i| rec(i, 1)).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(log.compact(&mut disk, 15).unwrap(), 3);
    assert_eq!(log.start_index(), 13);
    assert!(at(&log, &disk, 12).is_none() && at(&log, &disk, 13).is_some());
    let (reopened, _) = Changelog::open(&mut disk, cfg).unwrap();
    assert_eq!(reopened.start_index(), 13);
    assert_eq!(reopened.last_index(), Some(20));
}

fn sample_storage() -> Storage {
    let mut s = Storage::new(DigestMode::Full);
    let mut z = 0;
    let mut w = |s: &mut Storage, session: i64, req: Write| {
        z += 1;
        s.preprocess(session, z, 1000 + z, &req);
        s.commit(z);
    };
    w(&mut s, 0, Write::CreateSession { timeout_ms: 5000 });
    w(
        &mut s,
        1,
        Write::AddAuth {
            scheme: "digest".into(),
            auth: b"u:p".to_vec(),
        },
    );
    for (p, mode) in [
        ("/a", CreateMode::Persistent),
        ("/a/s-", CreateMode::PersistentSequential),
        ("/e", CreateMode::Ephemeral),
        ("/c", CreateMode::Container),
    ] {
        let op = Op::Create(Create {
            path: p.into(),
            data: p.as_bytes().to_vec(),
            acl: Acl::open(),
            mode,
            ttl_ms: 0,
        });
        w(&mut s, 1, Write::Op(op));
    }
    let auth_acl = vec![Acl {
        perms: 31,
        id: drift_keeper::acl::Id {
            scheme: "auth".into(),
            id: String::new(),
        },
    }];
    let op = Op::Create(Create {
        path: "/p".into(),
        data: vec![1; 3000],
        acl: auth_acl,
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    });
    w(&mut s, 1, Write::Op(op));
    s
}

fn meta_of(s: &Storage, index: u64) -> SnapshotMeta {
    SnapshotMeta {
        last_index: index,
        last_term: 3,
        zxid: s.state().last_zxid(),
        digest: s.digest(),
    }
}

#[test]
fn snapshot_round_trips_compressed_and_raw() {
    let s = sample_storage();
    let meta = meta_of(&s, 7);
    for compress in [true, false] {
        let bytes = snapshot::encode(s.state(), &meta, compress, 3);
        assert_eq!(bytes.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]), compress);
        let (state, m) = snapshot::decode("x", &bytes, true).unwrap();
        assert_eq!(m, meta);
        assert_eq!(&state, s.state());
        state.check_invariants();
    }
}

/// A snapshot is written from a copy taken at one index while the
/// server goes on applying entries: what it writes is the tree at that
/// index, whatever was replaced, added or removed after the copy.
#[test]
fn a_frozen_state_snapshots_the_tree_as_it_was_when_frozen() {
    let mut s = sample_storage();
    let before = s.state().clone();
    let meta = meta_of(&s, 7);
    let frozen = s.state().freeze();
    let later = [
        Write::Op(Op::SetData {
            path: "/a".into(),
            data: b"changed".to_vec(),
            version: -1,
        }),
        Write::Op(Op::Create(Create {
            path: "/late".into(),
            data: Vec::new(),
            acl: Acl::open(),
            mode: CreateMode::Persistent,
            ttl_ms: 0,
        })),
        Write::Op(Op::Delete {
            path: "/c".into(),
            version: -1,
        }),
        Write::CreateSession { timeout_ms: 6000 },
    ];
    let mut zxid = s.state().last_zxid();
    for req in &later {
        zxid += 1;
        s.preprocess(1, zxid, 2000 + zxid, req);
        s.commit(zxid);
    }
    assert!(s.state().get("/late").is_some() && s.state().get("/c").is_none());
    assert_ne!(s.state().get("/a").unwrap().data, before.get("/a").unwrap().data);
    assert_ne!(s.state().sessions().len(), before.sessions().len());
    let snaps = Snapshots::new(snapshot::Config::default());
    let mut disk = MemDisk::new();
    let (name, _) = snaps.write(&mut disk, &frozen, &meta).unwrap();
    let (state, m) = snaps.load(&disk, &name, true).unwrap();
    assert_eq!(m, meta);
    assert_eq!(state, before);
}

#[test]
fn flipped_snapshot_byte_is_never_loaded_silently() {
    let s = sample_storage();
    let meta = meta_of(&s, 7);
    for compress in [true, false] {
        let bytes = snapshot::encode(s.state(), &meta, compress, 3);
        for offset in 0..bytes.len() {
            let mut b = bytes.clone();
            b[offset] ^= 0x10;
            match snapshot::decode("snap", &b, true) {
                Ok((state, m)) => assert!(
                    state == *s.state() && m == meta,
                    "compress {compress}: flip at {offset} loaded a different state"
                ),
                Err(SnapshotError::Corrupt { file, offset: at, .. }) => {
                    assert_eq!(file, "snap");
                    assert!(at as usize <= offset, "flip at {offset} reported at {at}");
                }
                Err(SnapshotError::UnsupportedVersion { .. }) => {
                    panic!("flip at {offset} taken for a newer version")
                }
                Err(SnapshotError::DigestMismatch { .. }) => {}
                Err(e) => panic!("flip at {offset}: {e}"),
            }
        }
    }
}

#[test]
fn newer_snapshot_format_is_refused_with_a_clear_error() {
    let s = sample_storage();
    let mut bytes = snapshot::encode(s.state(), &meta_of(&s, 7), false, 3);
    // what a newer build writes: the same prologue with a higher version
    bytes[8] = snapshot::FORMAT_VERSION + 1;
    let crc = crc32fast::hash(&bytes[..9]).to_be_bytes();
    bytes[9..13].copy_from_slice(&crc);
    let e = snapshot::decode("snapshot_x.bin", &bytes, true).unwrap_err();
    assert!(matches!(e, SnapshotError::UnsupportedVersion { version: 2, .. }));
    assert!(e.to_string().contains("newer than this build reads"), "{e}");
}

#[test]
fn snapshot_whose_tree_does_not_match_its_digest_is_refused() {
    let s = sample_storage();
    let mut meta = meta_of(&s, 7);
    meta.digest.value ^= 1;
    let bytes = snapshot::encode(s.state(), &meta, true, 3);
    assert!(matches!(
        snapshot::decode("x", &bytes, true),
        Err(SnapshotError::DigestMismatch { .. })
    ));
}

#[test]
fn interrupted_snapshot_write_is_cleaned_up_at_start() {
    let s = sample_storage();
    let snaps = Snapshots::new(snapshot::Config {
        snapshots_to_keep: 2,
        ..Default::default()
    });
    let mut disk = MemDisk::new();
    snaps.write(&mut disk, &s.state().freeze(), &meta_of(&s, 5)).unwrap();
    // the next write dies before its file is durable: nothing of it
    // survives under the snapshot's name
    let mut broken = disk.clone();
    broken.fail_next_on(DiskOp::Sync, &format!("tmp_{}", snapshot::file_name(6, 3)));
    assert!(snaps.write(&mut broken, &s.state().freeze(), &meta_of(&s, 6)).is_err());
    broken.crash();
    snaps.clean_incomplete(&mut broken).unwrap();
    assert_eq!(snaps.load_latest(&broken, true).unwrap().unwrap().1.last_index, 5);
    // rewriting the same snapshot and dying half-way keeps the good one
    let mut again = disk.clone();
    again.fail_next_on(DiskOp::Rename, &format!("tmp_{}", snapshot::file_name(5, 3)));
    assert!(snaps.write(&mut again, &s.state().freeze(), &meta_of(&s, 5)).is_err());
    again.crash();
    assert_eq!(
        snaps.clean_incomplete(&mut again).unwrap(),
        [format!("tmp_{}", snapshot::file_name(5, 3))]
    );
    let (state, meta, _) = snaps.load_latest(&again, true).unwrap().unwrap();
    assert_eq!((meta.last_index, &state), (5, s.state()));
    // a crash after the temporary file but before its rename
    let mut d = disk.clone();
    d.write("tmp_snapshot_x.bin", b"partial").unwrap();
    let removed = snaps.clean_incomplete(&mut d).unwrap();
    assert_eq!(removed, ["tmp_snapshot_x.bin"]);
    assert_eq!(snaps.list(&d).unwrap().len(), 1);
    let (state, meta, _) = snaps.load_latest(&d, true).unwrap().unwrap();
    assert_eq!((meta.last_index, &state), (5, s.state()));
    // keeping two: a third write prunes the oldest
    for i in 6..=8 {
        snaps.write(&mut disk, &s.state().freeze(), &meta_of(&s, i)).unwrap();
    }
    let kept: Vec<u64> = snaps.list(&disk).unwrap().into_iter().map(|(i, _, _)| i).collect();
    assert_eq!(kept, [7, 8]);
    assert!(disk.list().unwrap().iter().all(|n| !n.starts_with("tmp_")));
}

#[test]
fn only_the_newest_records_within_the_cache_stay_in_memory_and_older_ones_read_back_the_same() {
    // records of 19–21 bytes of data; a cache of 100 bytes holds the
    // newest 4 or 5 of them, whatever was appended, truncated or compacted
    let mut disk = MemDisk::new();
    let cfg = Config {
        rotate_interval: 8,
        reserved_log_items: 3,
        zstd_level: 1,
        cache_bytes: 100,
        reserve_bytes: 0,
    };
    let (mut log, _) = Changelog::open(&mut disk, cfg).unwrap();
    let mut want: Vec<LogRecord> = (1..=30).map(|i| rec(i, 1)).collect();
    for chunk in want.chunks(7) {
        log.append(&mut disk, chunk).unwrap();
        assert!(log.cached_bytes() <= 100, "{} bytes cached", log.cached_bytes());
    }
    assert_eq!(log.read_range(&disk, 0, u64::MAX).unwrap(), want);
    assert!(
        matches!(log.get(&disk, 30).unwrap(), Some(std::borrow::Cow::Borrowed(_))),
        "the newest is served from memory"
    );
    assert!(
        matches!(log.get(&disk, 3).unwrap(), Some(std::borrow::Cow::Owned(_))),
        "an old one is read back"
    );
    // Raft overwrites a suffix: 26.. of term 2, across the cache's edge
    log.append(&mut disk, &(26..=33).map(|i| rec(i, 2)).collect::<Vec<_>>())
        .unwrap();
    want.truncate(25);
    want.extend((26..=33).map(|i| rec(i, 2)));
    assert_eq!(log.read_range(&disk, 0, u64::MAX).unwrap(), want);
    // a truncation deeper than the cache empties it; reads still agree
    log.truncate_from(&mut disk, 12).unwrap();
    want.truncate(11);
    assert!(log.cached_bytes() <= 100);
    assert_eq!(log.read_range(&disk, 0, u64::MAX).unwrap(), want);
    log.append(&mut disk, &(12..=40).map(|i| rec(i, 3)).collect::<Vec<_>>())
        .unwrap();
    want.extend((12..=40).map(|i| rec(i, 3)));
    log.compact(&mut disk, 35).unwrap();
    let start = log.start_index();
    assert!(start > 1 && start <= 33, "compacted to {start}");
    assert_eq!(log.read_range(&disk, 0, u64::MAX).unwrap(), want[start as usize - 1..]);
    assert!(log.cached_bytes() <= 100);
    // a reopen caches the newest within the same bound
    let (reopened, _) = Changelog::open(&mut disk, cfg).unwrap();
    assert!(reopened.cached_bytes() <= 100 && reopened.cached_bytes() > 0);
    assert_eq!(
        reopened.read_range(&disk, 0, u64::MAX).unwrap(),
        want[start as usize - 1..]
    );
}

#[test]
fn a_record_read_back_that_was_damaged_on_disk_is_an_error_naming_its_file() {
    let mut disk = MemDisk::new();
    let cfg = Config {
        cache_bytes: 0,
        ..config(100)
    };
    let (mut log, _) = Changelog::open(&mut disk, cfg).unwrap();
    log.append(&mut disk, &(1..=3).map(|i| rec(i, 1)).collect::<Vec<_>>())
        .unwrap();
    let name = drift_keeper::changelog::segment_name(1);
    let mut bytes = disk.read(&name).unwrap();
    bytes[20] ^= 0xFF;
    disk.write(&name, &bytes).unwrap();
    match log.get(&disk, 1) {
        Err(ChangelogError::Corrupt { file, offset, .. }) => assert_eq!((file.as_str(), offset), (name.as_str(), 0)),
        other => panic!("expected a corrupt record, got {other:?}"),
    }
}

/// A tree of 30,000 nodes, whose snapshot spans several blocks and zstd
/// frames.
fn large_storage() -> Storage {
    // the sample's tree, its digest kept incrementally (the full mode
    // rehashes the tree on every commit)
    let mut s = Storage::from_state(sample_storage().state().clone(), false);
    let mut z = 1000;
    let op = |path: String, data: Vec<u8>| {
        Write::Op(Op::Create(Create {
            path,
            data,
            acl: Acl::open(),
            mode: CreateMode::Persistent,
            ttl_ms: 0,
        }))
    };
    s.preprocess(1, z, 5000, &op("/big".into(), vec![]));
    s.commit(z);
    for i in 0..30_000u64 {
        z += 1;
        let data: Vec<u8> = (0..64)
            .map(|k| (i.wrapping_mul(31).wrapping_add(k * 7) % 251) as u8)
            .collect();
        s.preprocess(1, z, 5000 + z, &op(format!("/big/n{i:06}"), data));
        s.commit(z);
    }
    s
}

#[test]
fn a_large_snapshot_encodes_to_the_bytes_earlier_builds_wrote() {
    // (length, CRC32) of the file, compressed and not, as the build before
    // snapshots were written in pieces encoded it whole in memory
    let s = large_storage();
    let meta = meta_of(&s, 9);
    let got: Vec<(usize, u32)> = [false, true]
        .iter()
        .map(|&c| {
            let b = snapshot::encode(s.state(), &meta, c, 3);
            (b.len(), crc32fast::hash(&b))
        })
        .collect();
    assert_eq!(got, GOLDEN);
}

/// (length, CRC32) of the large snapshot raw and compressed, from the build
/// that encoded snapshots whole in memory.
const GOLDEN: [(usize, u32); 2] = [(4_924_686, 3_941_942_163), (555_508, 1_610_835_853)];
