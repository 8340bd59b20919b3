//! Durable `begin` + `complete` cycles per second on the file store, by
//! durability mode and number of concurrent operations, beside the raw
//! engine's durable insert rate measured in the same run.
//!
//! `cargo bench -p idem-file --bench file_store`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use idem_core::{Begin, Fenced, Key, Lease, Namespace, Store};
use idem_file::{Durability, FileStore};

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

async fn cycles(store: FileStore, ns: Namespace, n: u64) {
    for _ in 0..n {
        let i = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let key = Key::in_namespace(ns.clone(), format!("order-{i:012}")).unwrap();
        let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(30)).await.unwrap()
        else {
            panic!("fresh keys are acquired");
        };
        let done = store
            .complete(
                &key,
                claim.token,
                Some("ok".into()),
                Duration::from_secs(3600),
            )
            .await
            .unwrap();
        assert_eq!(done, Fenced::Ok(()));
    }
}

fn store_cycles(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("file_store");
    g.throughput(Throughput::Elements(1));
    for (mode, durability) in [
        ("group_commit", Durability::GroupCommit),
        ("immediate", Durability::Immediate),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::builder(dir.path())
            .durability(durability)
            .open()
            .unwrap();
        let ns = Namespace::new("bench").unwrap();
        for concurrency in [1u64, 64, 256, 1024] {
            g.bench_with_input(
                BenchmarkId::new(mode, concurrency),
                &concurrency,
                |b, &c| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let (store, ns) = (store.clone(), ns.clone());
                        async move {
                            let per_task = iters.div_ceil(c);
                            let start = Instant::now();
                            let tasks: Vec<_> = (0..c)
                                .map(|_| tokio::spawn(cycles(store.clone(), ns.clone(), per_task)))
                                .collect();
                            for t in tasks {
                                t.await.unwrap();
                            }
                            // Report per requested iteration.
                            start
                                .elapsed()
                                .mul_f64(iters as f64 / (per_task * c) as f64)
                        }
                    })
                },
            );
        }
    }
    g.finish();
}

/// The engine alone: random keys of the same shape, one durable commit
/// (write batch + fsync) per 256 keys, and per key.
fn raw_engine(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::builder(dir.path())
        .manual_journal_persist(true)
        .open()
        .unwrap();
    // The engine as the store configures it.
    let options = || KeyspaceCreateOptions::default().max_memtable_size(idem_file::MEMTABLE_BYTES);
    let ks = db.keyspace("raw", options).unwrap();
    let value = [7u8; 28];
    let counter = Arc::new(AtomicU64::new(0));
    let mut g = c.benchmark_group("fjall_raw");
    for per_commit in [256u64, 1] {
        g.throughput(Throughput::Elements(per_commit));
        g.bench_function(BenchmarkId::new("durable_insert", per_commit), |b| {
            b.iter(|| {
                let mut batch = db.batch();
                for _ in 0..per_commit {
                    // Scrambled so keys land all over the key space.
                    let i = counter
                        .fetch_add(1, Ordering::Relaxed)
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    batch.insert(&ks, format!("\x05bench{i:020}").as_bytes(), &value[..]);
                }
                batch.commit().unwrap();
                db.persist(PersistMode::SyncData).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = raw_engine, store_cycles
}
criterion_main!(benches);
