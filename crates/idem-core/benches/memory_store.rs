//! Deliveries per second on the memory store: one thread, two threads, and
//! the batch forms. Each run is a fresh store fed 200 000 keys plus 10 %
//! duplicates (every tenth delivery repeats an earlier key); a delivery is a
//! `begin`, and a `complete` when acquired.
//!
//! `cargo bench -p idem-core --bench memory_store`

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::FutureExt;
use idem_core::{Begin, BeginItem, CompleteItem, Key, Lease, MemoryStore, Namespace, Store};

const LEASE: Lease = Lease::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

const KEYS: u64 = 200_000;

/// `n` distinct keys with a duplicate of an earlier key after every tenth.
fn keys(prefix: &str, n: u64) -> Vec<Key> {
    let ns = Namespace::new("bench").unwrap();
    let mut out = Vec::with_capacity((n + n / 10) as usize);
    for i in 0..n {
        out.push(Key::in_namespace(ns.clone(), format!("{prefix}-order-{i:010}")).unwrap());
        if i % 10 == 9 {
            out.push(out[(i / 2) as usize].clone());
        }
    }
    out
}

/// One delivery: `begin`, and `complete` when acquired. The memory store's
/// futures are ready at once, so they are polled without a runtime.
fn cycle(store: &MemoryStore, key: &Key) {
    let begun = store
        .begin(key, None, LEASE)
        .now_or_never()
        .unwrap()
        .unwrap();
    if let Begin::Acquired(claim) = begun {
        let done = store
            .complete(key, claim.token, Some("ok".into()), RETENTION)
            .now_or_never()
            .unwrap()
            .unwrap();
        assert!(!done.is_stale());
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_store");
    let deliveries = keys("k", KEYS);
    g.throughput(Throughput::Elements(deliveries.len() as u64));
    g.bench_function("deliveries/1_thread", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let store = MemoryStore::new();
                let start = Instant::now();
                for k in &deliveries {
                    cycle(&store, k);
                }
                spent += start.elapsed();
            }
            spent
        })
    });
    let halves = [keys("a", KEYS / 2), keys("b", KEYS / 2)];
    g.bench_function("deliveries/2_threads", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let store = MemoryStore::new();
                let start = Instant::now();
                std::thread::scope(|s| {
                    for half in &halves {
                        let store = &store;
                        s.spawn(move || half.iter().for_each(|k| cycle(store, k)));
                    }
                });
                spent += start.elapsed();
            }
            spent
        })
    });
    let mut round = 0u64;
    const BATCH: u64 = 256;
    g.throughput(Throughput::Elements(BATCH));
    // Batches of fresh keys, 256 a batch, into a store that keeps growing.
    g.bench_function("begin_many_complete_many/256", |b| {
        let store = MemoryStore::new();
        b.iter_custom(|iters| {
            round += 1;
            let ns = Namespace::new("bench").unwrap();
            let all: Vec<Key> = (0..iters * BATCH)
                .map(|i| Key::in_namespace(ns.clone(), format!("r{round}-{i:010}")).unwrap())
                .collect();
            let batches: Vec<Vec<BeginItem>> = all
                .chunks(BATCH as usize)
                .map(|c| {
                    c.iter()
                        .map(|key| BeginItem {
                            key: key.clone(),
                            fingerprint: None,
                            lease: LEASE,
                        })
                        .collect()
                })
                .collect();
            let start = Instant::now();
            for items in &batches {
                let begun = store.begin_many(items).now_or_never().unwrap().unwrap();
                let completes: Vec<CompleteItem> = items
                    .iter()
                    .zip(begun)
                    .filter_map(|(i, b)| match b {
                        Begin::Acquired(c) => Some(CompleteItem {
                            key: i.key.clone(),
                            token: c.token,
                            outcome: Some("ok".into()),
                            retention: RETENTION,
                        }),
                        _ => None,
                    })
                    .collect();
                store
                    .complete_many(&completes)
                    .now_or_never()
                    .unwrap()
                    .unwrap();
            }
            start.elapsed()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
