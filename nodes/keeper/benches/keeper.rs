//! Criterion benchmarks of the keeper core. `drift bench keeper` prints the
//! whole-system figures (1M-node snapshots, fsync'd appends); these are the
//! pieces, for regression tracking.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use drift_keeper::acl::Acl;
use drift_keeper::changelog::{Changelog, Config, LogRecord};
use drift_keeper::digest::{content_hash, digest_from_content, node_digest};
use drift_keeper::disk::MemDisk;
use drift_keeper::node::Stat;
use drift_keeper::snapshot::{self, SnapshotMeta};
use drift_keeper::{Create, CreateMode, DigestMode, Op, Storage, Write};

const TREE: usize = 10_000;

fn create(path: String) -> Write {
    Write::Op(Op::Create(Create {
        path,
        data: vec![b'x'; 100],
        acl: Acl::open(),
        mode: CreateMode::Persistent,
        ttl_ms: 0,
    }))
}

/// Entry times as a leader stamps them (wall-clock milliseconds, 2027).
const TIME_BASE_MS: i64 = 1_800_000_000_000;

fn tree(mode: DigestMode, n: usize) -> (Storage, i64) {
    let mut s = Storage::new(mode);
    let mut z = 0;
    for r in std::iter::once(create("/b".into())).chain((0..n).map(|i| create(format!("/b/n{i:09}")))) {
        z += 1;
        s.preprocess(0, z, TIME_BASE_MS + z, &r);
        s.commit(z);
    }
    (s, z)
}

fn digests(c: &mut Criterion) {
    // a node as a busy tree has it: zxids in the millions, times in
    // wall-clock milliseconds, a few versions
    let stat = Stat {
        czxid: 4_200_000,
        mzxid: 4_700_123,
        ctime: TIME_BASE_MS,
        mtime: TIME_BASE_MS + 86_400_000,
        version: 17,
        cversion: 3,
        pzxid: 4_600_000,
        data_length: 100,
        ..Stat::default()
    };
    let data = vec![7u8; 100];
    c.bench_function("digest/node 100B (content + fields)", |b| {
        b.iter(|| node_digest("/b/n000000001", &data, &stat, 0))
    });
    let content = content_hash("/b/n000000001", &data);
    c.bench_function("digest/fields only (stat change)", |b| {
        b.iter(|| digest_from_content(content, &stat, 0))
    });
}

fn apply(c: &mut Criterion) {
    for (mode, name) in [
        (DigestMode::Off, "off"),
        (DigestMode::Incremental, "incremental"),
        (DigestMode::Full, "full"),
    ] {
        let n = if mode == DigestMode::Full { 1_000 } else { TREE };
        c.bench_function(&format!("apply/set on {n}-node tree, digest {name}"), |b| {
            b.iter_batched_ref(
                || tree(mode, n),
                |(s, z)| {
                    for i in 0..100 {
                        *z += 1;
                        let w = Write::Op(Op::SetData {
                            path: format!("/b/n{i:09}"),
                            data: vec![b'y'; 100],
                            version: -1,
                        });
                        s.preprocess(0, *z, TIME_BASE_MS + *z, &w);
                        s.commit(*z);
                    }
                },
                BatchSize::LargeInput,
            )
        });
    }
}

fn snapshots(c: &mut Criterion) {
    let (s, z) = tree(DigestMode::Incremental, 100_000);
    let meta = SnapshotMeta {
        last_index: z as u64,
        last_term: 1,
        zxid: z,
        digest: s.digest(),
    };
    c.bench_function("snapshot/encode 100k nodes zstd", |b| {
        b.iter(|| snapshot::encode(s.state(), &meta, true, 3).len())
    });
    let bytes = snapshot::encode(s.state(), &meta, true, 3);
    c.bench_function("snapshot/decode 100k nodes zstd", |b| {
        b.iter(|| snapshot::decode("bench", &bytes, true).unwrap().0.node_count())
    });
}

fn changelog(c: &mut Criterion) {
    let batch: Vec<LogRecord> = (1..=128)
        .map(|i| LogRecord {
            index: i,
            term: 1,
            kind: 0,
            data: vec![b'z'; 150],
        })
        .collect();
    c.bench_function("changelog/append 128 x 150B records (in-memory disk)", |b| {
        b.iter_batched(
            || {
                let mut disk = MemDisk::new();
                let (log, _) = Changelog::open(&mut disk, Config::default()).unwrap();
                (disk, log)
            },
            |(mut disk, mut log)| log.append(&mut disk, &batch).unwrap(),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, digests, apply, snapshots, changelog);
criterion_main!(benches);
