//! The false-positive rate measured on a full filter meets the configured
//! one, the filter's own estimate of it agrees with the measurement, and no
//! inserted key is ever answered `Absent`.

mod filter_support;

use idem_core::Key;
use idem_tiered::filter::{KeyFilter, Membership};

use filter_support::{at, config, key, ready};

const PER_GENERATION: u64 = 250_000;

/// A filter for 750 000 keys per retention (250 000 per window), with each
/// of its 4 generations holding its 250 000: 1 M keys, the fullest it gets.
fn full_filter() -> KeyFilter {
    let config = config(3 * PER_GENERATION);
    assert_eq!(config.sizing().unwrap().generation.items, PER_GENERATION);
    let window = config.sizing().unwrap().window.as_millis() as u64;
    let filter = ready(&config, at(0));
    for generation in 0..4 {
        if generation > 0 {
            assert!(filter.rotate(at(generation * window)));
        }
        for n in generation * PER_GENERATION..(generation + 1) * PER_GENERATION {
            filter.insert(&key(n));
        }
    }
    filter
}

#[test]
fn measured_false_positive_rate_meets_the_configured_rate() {
    let filter = full_filter();
    let probes = 1_000_000u64;
    let false_positives = (0..probes)
        .filter(|n| {
            filter.check(&Key::new("orders", format!("absent-{n}")).unwrap()) == Membership::Maybe
        })
        .count();
    let rate = false_positives as f64 / probes as f64;
    // 0.1 % is 1 000 of 1 M probes, give or take 32 (one standard
    // deviation): 0.12 % is six of them above.
    assert!(rate <= 0.0012, "measured false-positive rate {rate}");
    assert!(
        rate > 0.0,
        "a full filter with no false positive at all is oversized"
    );
}

/// The share of `probes` keys never inserted that `filter` answers `Maybe`.
fn measured(filter: &KeyFilter, probes: u64) -> f64 {
    let hits = (0..probes)
        .filter(|n| {
            filter.check(&Key::new("orders", format!("never-{n}")).unwrap()) == Membership::Maybe
        })
        .count();
    hits as f64 / probes as f64
}

#[test]
fn the_estimate_follows_the_bits_set_and_agrees_with_the_measured_rate() {
    let config = config(3 * PER_GENERATION);
    let filter = ready(&config, at(0));
    assert_eq!(filter.estimated_false_positive_rate(), 0.0, "empty");
    // A quarter of one generation's keys: far under the configured rate.
    for n in 0..PER_GENERATION / 4 {
        filter.insert(&key(n));
    }
    let light = filter.estimated_false_positive_rate();
    assert!(light > 0.0 && light < 0.0001, "{light}");

    let full = full_filter();
    let estimate = full.estimated_false_positive_rate();
    let rate = measured(&full, 1_000_000);
    // Four full generations of a filter sized for 0.1 % each way: the
    // estimate within a fifth of what 1 M probes measure.
    assert!(
        (estimate - rate).abs() <= rate * 0.2,
        "estimated {estimate}, measured {rate}"
    );

    // Twice the keys a window was sized for: the estimate says so.
    let overfull = ready(&config, at(0));
    for n in 0..2 * PER_GENERATION {
        overfull.insert(&key(n));
    }
    let over = overfull.estimated_false_positive_rate();
    assert!(over > estimate, "{over} against {estimate}");
    let rate = measured(&overfull, 200_000);
    assert!(
        (over - rate).abs() <= rate * 0.2,
        "estimated {over}, measured {rate}"
    );
}

#[test]
fn no_inserted_key_is_ever_absent() {
    let filter = full_filter();
    let absent = (0..4 * PER_GENERATION)
        .filter(|&n| filter.check(&key(n)).is_absent())
        .count();
    assert_eq!(absent, 0);
}
