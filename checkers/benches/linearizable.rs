//! Criterion benchmarks of the linearizability checker on the real Jepsen
//! etcd histories (read in place from ../shared; absent → said, skipped).
//! Parsing is outside the timed loop; explanation is off (verdict only), as
//! in `drift bench checker`.

use criterion::{criterion_group, criterion_main, Criterion};
use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::Linearizable;
use drift_checkers::{CheckContext, Checker, History};
use std::path::{Path, PathBuf};

/// The slowest histories for Porcupine (EXPECTED.tsv), plus a typical one.
const FILES: [&str; 6] = [
    "etcd_002.jsonl",
    "etcd_099.jsonl",
    "etcd_057.jsonl",
    "etcd_007.jsonl",
    "etcd_075.jsonl",
    "etcd_000.jsonl",
];

fn etcd_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/histories/etcd");
    dir.is_dir().then_some(dir)
}

fn bench(c: &mut Criterion) {
    let Some(dir) = etcd_dir() else {
        eprintln!("NOT RUN: ../shared/data/histories/etcd is absent");
        return;
    };
    let checker = Linearizable {
        model: ModelKind::CasRegister,
        explain: false,
        init: serde_json::Value::Null,
        tuning: Default::default(),
    };
    let ctx = CheckContext::new(None, 1 << 30);
    for file in FILES {
        let h = History::load(&dir.join(file)).expect("etcd history loads");
        c.bench_function(&format!("linearizable/{file}"), |b| {
            b.iter(|| checker.check(&h, &ctx).unwrap().verdict)
        });
    }
    let mut all: Vec<History> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .map(|p| History::load(&p).expect("etcd history loads"))
        .collect();
    all.sort_by(|a, b| a.file.cmp(&b.file));
    c.bench_function("linearizable/all-102-etcd", |b| {
        b.iter(|| {
            all.iter()
                .filter(|h| checker.check(h, &ctx).unwrap().verdict as u8 == 0)
                .count()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
