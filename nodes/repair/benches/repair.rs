//! Criterion benchmarks of the repair core: hashing, tree upkeep, build,
//! and the reference scenario's diff and repair
//! (50,000 keys, 33 divergent). `drift bench repair` prints
//! the session cost tables.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use drift_repair::entry::{self, Entry};
use drift_repair::session::{SessionConfig, HASH_BYTES_DEFAULT};
use drift_repair::token;
use drift_repair::tree::{hash_of, xor, MerkleTree};
use drift_repair::{run, Replica, TokenRange};
use sha2::{Digest as _, Sha256};

const KEY: &[u8] = b"user:000000012345:pk";
const VALUE: &[u8] = b"a value of about sixty bytes, like a small row in a kv store.";

/// The canonical bytes `entry::digest` hashes, built once.
fn canonical() -> Vec<u8> {
    drift_repair::entry::canonical_bytes(KEY, 7, Some(VALUE))
}

fn hashing(c: &mut Criterion) {
    c.bench_function("token/murmur3_x86_32 slice (ours), 20B key", |b| {
        b.iter(|| token::token(black_box(KEY)))
    });
    c.bench_function("token/murmur3 crate (Read), 20B key", |b| {
        b.iter(|| murmur3::murmur3_32(&mut std::io::Cursor::new(black_box(KEY)), 0).unwrap())
    });
    let bytes = canonical();
    c.bench_function(&format!("sha256/raw {} bytes", bytes.len()), |b| {
        b.iter(|| <[u8; 32]>::from(Sha256::digest(black_box(&bytes))))
    });
    c.bench_function("entry/digest (same bytes, canonical encoding)", |b| {
        b.iter(|| entry::digest(black_box(KEY), 7, Some(black_box(VALUE))))
    });
    let mut tree = MerkleTree::new(TokenRange::FULL, 16);
    let t = token::token(KEY);
    let mut prev = entry::digest(KEY, 6, Some(VALUE));
    let mut ts = 6u64;
    c.bench_function("entry/digest + incremental update (depth 16)", |b| {
        b.iter(|| {
            ts += 1;
            let d = entry::digest(black_box(KEY), ts, Some(black_box(VALUE)));
            tree.update(t, Some(&prev), Some(&d));
            prev = d;
        })
    });
    let (x, y) = (hash_of(&prev), hash_of(&entry::digest(KEY, 8, None)));
    c.bench_function("tree/combine (XOR of two node hashes)", |b| {
        b.iter(|| xor(black_box(x), black_box(y)))
    });
}

fn build(c: &mut Criterion) {
    let items: Vec<(u32, entry::Digest)> = (0..1_000_000u32)
        .map(|i| {
            let k = format!("key{i}");
            (token::token(k.as_bytes()), entry::digest(k.as_bytes(), 1, Some(b"v")))
        })
        .collect();
    let mut g = c.benchmark_group("tree");
    g.sample_size(10);
    g.bench_function("full build, 1M entries, depth 16", |b| {
        b.iter(|| MerkleTree::build(TokenRange::FULL, 16, items.iter().map(|(t, d)| (*t, d))).root())
    });
    g.finish();
}

fn scenario(n: u32, divergent: u32, depth: u32) -> (Replica, Replica) {
    let mut a = Replica::new(TokenRange::FULL, depth);
    for i in 0..n {
        a.merge(Entry::put(
            format!("key{i}").as_bytes(),
            1,
            format!("value{i}").as_bytes(),
        ));
    }
    let mut b = a.clone();
    for j in 0..divergent {
        let i = (j as u64 * 1_515_151 % n as u64) as u32;
        let side = if j % 2 == 0 { &mut a } else { &mut b };
        side.merge(Entry::put(format!("key{i}").as_bytes(), 2, b"newer"));
    }
    (a, b)
}

fn sessions(c: &mut Criterion) {
    let (a, b) = scenario(50_000, 33, 12);
    let mut g = c.benchmark_group("reference scenario (50k keys, 33 divergent, depth 12)");
    g.sample_size(20);
    for row_level in [false, true] {
        let cfg = SessionConfig {
            seed: 1,
            row_level,
            started_ts: 0,
            hash_bytes: HASH_BYTES_DEFAULT,
            set_reconciliation: false,
        };
        g.bench_function(
            if row_level {
                "diff + row-level repair"
            } else {
                "diff + range repair"
            },
            |bench| {
                bench.iter_batched(
                    || (a.clone(), b.clone()),
                    |(mut x, mut y)| run(&mut x, 1, &mut y, 2, cfg).unwrap().entries_streamed(),
                    BatchSize::LargeInput,
                )
            },
        );
    }
    g.finish();
}

criterion_group!(benches, hashing, build, sessions);
criterion_main!(benches);
