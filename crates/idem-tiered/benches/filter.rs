//! The key filter's lookup and insert, in ns per operation, beside raw
//! fastbloom (`BloomFilter`, `AtomicBloomFilter`) in the same run.
//!
//! Every filter is sized for 10 M keys at 0.1 %: idem's over 4 generations
//! (28.8 MB), fastbloom's as one array (18 MB), both hashing with keyed
//! SipHash-1-3 and holding the same 1 M keys. A lookup of an absent key
//! checks every generation of idem's filter; of a present key, it stops at
//! the first that has it.
//!
//!   cargo bench -p idem-tiered --bench filter

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use fastbloom::{AtomicBloomFilter, BloomFilter};
use idem_core::{Key, Timestamp};
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};

const EXPECTED: u64 = 10_000_000;
const RATE: f64 = 0.001;
const HELD: usize = 1_000_000;
const SEED: u128 = 0x5eed_5eed_5eed_5eed;

struct Filters {
    idem: KeyFilter,
    bloom: BloomFilter,
    atomic: AtomicBloomFilter,
    present: Vec<Key>,
    absent: Vec<Key>,
}

fn keys(prefix: &str) -> Vec<Key> {
    (0..HELD)
        .map(|n| Key::new("orders", format!("{prefix}-{n:010}")).unwrap())
        .collect()
}

fn filters() -> Filters {
    let config = FilterConfig::new(
        FilterSeed::new(SEED),
        EXPECTED,
        Duration::from_secs(3 * 3600),
    );
    let idem = KeyFilter::new(&config, Timestamp::from_millis(0)).unwrap();
    idem.rebuild(
        std::iter::empty::<Result<Key, Infallible>>(),
        Some(0),
        |_, _| {},
    )
    .unwrap();
    let mut bloom = BloomFilter::with_false_pos(RATE)
        .seed(&SEED)
        .expected_items(EXPECTED as usize);
    let atomic = AtomicBloomFilter::with_false_pos(RATE)
        .seed(&SEED)
        .expected_items(EXPECTED as usize);
    let present = keys("present");
    // One generation a quarter of the keys, as after steady traffic.
    for (n, key) in present.iter().enumerate() {
        if n > 0 && n % (HELD / 4) == 0 {
            idem.rotate(Timestamp::from_millis((n / (HELD / 4)) as u64 * 3_600_000));
        }
        idem.insert(key);
        bloom.insert(key);
        atomic.insert(key);
    }
    Filters {
        idem,
        bloom,
        atomic,
        present,
        absent: keys("absent"),
    }
}

/// Runs `op` over `keys` in turn; criterion keeps its result from being
/// optimised away.
fn bench_over<R>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    keys: &[Key],
    mut op: impl FnMut(&Key) -> R,
) {
    let mut next = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            let result = op(black_box(&keys[next]));
            next = (next + 1) % keys.len();
            result
        })
    });
}

fn lookup(c: &mut Criterion) {
    let f = filters();
    for (case, keys) in [("absent", &f.absent), ("present", &f.present)] {
        let mut group = c.benchmark_group(format!("lookup_{case}"));
        bench_over(&mut group, "idem_key_filter_4_generations", keys, |k| {
            f.idem.check(k)
        });
        bench_over(&mut group, "fastbloom_bloom_filter", keys, |k| {
            f.bloom.contains(k)
        });
        bench_over(&mut group, "fastbloom_atomic_bloom_filter", keys, |k| {
            f.atomic.contains(k)
        });
        group.finish();
    }
}

fn insert(c: &mut Criterion) {
    let mut f = filters();
    let keys = keys("inserted");
    let mut group = c.benchmark_group("insert");
    bench_over(&mut group, "idem_key_filter_4_generations", &keys, |k| {
        f.idem.insert(k)
    });
    bench_over(&mut group, "fastbloom_bloom_filter", &keys, |k| {
        f.bloom.insert(k)
    });
    bench_over(&mut group, "fastbloom_atomic_bloom_filter", &keys, |k| {
        f.atomic.insert(k)
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = lookup, insert
}
criterion_main!(benches);
