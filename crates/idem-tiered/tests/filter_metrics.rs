//! The filter reports its answers and its size as `metrics`:
//! `idem_filter_lookups_total{answer}`, `idem_filter_bytes`,
//! `idem_filter_generations`, `idem_filter_estimated_false_positive_rate`.

mod filter_support;

#[path = "../../brokers/idem-kafka/tests/support/recorder.rs"]
mod recorder;

use idem_tiered::filter::KeyFilter;

use filter_support::{at, config, key, ready};

#[test]
fn lookups_by_answer_and_the_filter_size_are_exported() {
    let recorder = recorder::recorder();
    let filter = KeyFilter::new(&config(1_000), at(0)).unwrap();
    let _ = filter.check(&key(1));
    let filter = {
        drop(filter);
        ready(&config(1_000), at(0))
    };
    filter.insert(&key(1));
    let _ = filter.check(&key(1));
    let _ = filter.check(&key(2));
    let _ = filter.check(&key(3));
    let lookups = "idem_filter_lookups_total";
    assert_eq!(recorder.counter(lookups, "answer=maybe"), 2);
    assert_eq!(recorder.counter(lookups, "answer=absent"), 2);
    assert_eq!(
        recorder.gauge("idem_filter_bytes", ""),
        Some(filter.memory_bytes() as f64)
    );
    assert_eq!(recorder.gauge("idem_filter_generations", ""), Some(4.0));
    for n in 0..1_000 {
        filter.insert(&key(n));
    }
    let estimate = filter.estimated_false_positive_rate();
    assert!(estimate > 0.0, "a thousand keys set bits");
    assert_eq!(
        recorder.gauge("idem_filter_estimated_false_positive_rate", ""),
        Some(estimate)
    );
}
