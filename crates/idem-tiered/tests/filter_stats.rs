//! `stats()` counts every answer, insert and rotation.

mod filter_support;

use idem_tiered::filter::{FilterStats, KeyFilter};

use filter_support::{at, config, feed, hours, key};

#[test]
fn stats_count_each_answer_insert_and_rotation() {
    let filter = KeyFilter::new(&config(1_000), at(0)).unwrap();
    let _ = filter.check(&key(1)); // not ready: maybe, not a hit
    filter.rebuild(feed([key(1)]), Some(1), |_, _| {}).unwrap();
    filter.insert(&key(2));
    let _ = filter.check(&key(1)); // hit
    let _ = filter.check(&key(2)); // hit
    let _ = filter.check(&key(3)); // absent
    filter.rotate(hours(2.0));
    assert_eq!(
        filter.stats(),
        FilterStats {
            lookups: 4,
            absent: 1,
            maybe: 3,
            hits: 2,
            inserts: 2,
            rotations: 1,
            generations: 4,
            bytes: filter.memory_bytes(),
        }
    );
}
