//! Keys are kept at least the retention, however late rotation comes, and
//! age out one window after it when rotation is on time.

mod filter_support;

use idem_tiered::filter::{KeyFilter, Membership};

use filter_support::{HOUR, at, config, hours, key, ready};

const WINDOW_MS: u64 = 3_600_000;
const MINUTE_MS: u64 = 60_000;

/// Rotates every minute after `from` up to `to` (both in ms after T0),
/// checking `key(1)` after each.
fn rotate_every_minute(filter: &KeyFilter, from: u64, to: u64, expect: Membership) {
    let mut now = from;
    while now < to {
        now = (now + MINUTE_MS).min(to);
        filter.rotate(at(now));
        assert_eq!(filter.check(&key(1)), expect, "at +{now} ms");
    }
}

#[test]
fn a_key_is_kept_at_least_the_retention_wherever_in_its_window_it_was_inserted() {
    for offset in [0, WINDOW_MS / 2, WINDOW_MS - 1] {
        let filter = ready(&config(1_000), at(0));
        filter.rotate(at(offset));
        filter.insert(&key(1));
        let retention_ends = offset + 3 * WINDOW_MS;
        rotate_every_minute(&filter, offset, retention_ends - 1, Membership::Maybe);
    }
}

#[test]
fn a_key_ages_out_one_window_after_the_retention_when_rotation_is_on_time() {
    let filter = ready(&config(1_000), at(0));
    filter.insert(&key(1));
    rotate_every_minute(&filter, 0, 4 * WINDOW_MS - 1, Membership::Maybe);
    assert!(filter.rotate(hours(4.0)));
    assert_eq!(filter.check(&key(1)), Membership::Absent);
}

#[test]
fn a_key_inserted_while_rotation_is_late_is_still_kept_the_retention() {
    let filter = ready(&config(1_000), at(0));
    // No rotation for two and a half hours: the key goes to the generation
    // started at 0, whose window ended long ago.
    filter.insert(&key(1));
    let inserted = 5 * WINDOW_MS / 2;
    assert!(filter.rotate(at(inserted)));
    rotate_every_minute(
        &filter,
        inserted,
        inserted + 3 * WINDOW_MS - 1,
        Membership::Maybe,
    );
    assert!(filter.rotate(at(inserted + 3 * WINDOW_MS)));
    assert_eq!(filter.check(&key(1)), Membership::Absent);
}

#[test]
fn inserts_go_to_the_newest_generation_and_lookups_check_them_all() {
    let filter = ready(&config(1_000), at(0));
    for hour in 0..4 {
        filter.rotate(hours(hour as f64));
        filter.insert(&key(100 + hour));
    }
    for hour in 0..4 {
        assert_eq!(filter.check(&key(100 + hour)), Membership::Maybe);
    }
    // The next rotation drops the first hour's key only.
    assert!(filter.rotate(hours(4.0)));
    assert_eq!(filter.check(&key(100)), Membership::Absent);
    for hour in 1..4 {
        assert_eq!(filter.check(&key(100 + hour)), Membership::Maybe);
    }
}

#[test]
fn after_a_pause_generations_go_one_window_at_a_time() {
    let filter = ready(&config(1_000), at(0));
    filter.insert(&key(1));
    // Down for ten and a half hours.
    assert!(filter.rotate(hours(10.5)));
    assert_eq!(
        filter.generation_starts().last().copied(),
        Some(hours(10.5))
    );
    assert!(!filter.rotate(hours(11.49)));
    assert!(filter.rotate(hours(11.5)));
    assert!(filter.rotate(hours(12.5)));
    assert_eq!(filter.check(&key(1)), Membership::Maybe);
    assert!(filter.rotate(hours(13.5)));
    assert_eq!(filter.check(&key(1)), Membership::Absent);
    assert_eq!(filter.stats().rotations, 4);
}

#[test]
fn a_clock_that_goes_back_rotates_nothing() {
    let filter = ready(&config(1_000), hours(5.0));
    filter.insert(&key(1));
    assert!(!filter.rotate(hours(1.0)));
    assert!(!filter.rotate(hours(5.0)));
    assert_eq!(filter.check(&key(1)), Membership::Maybe);
    assert_eq!(filter.generation_starts().last().copied(), Some(hours(5.0)));
    assert_eq!(HOUR.as_millis() as u64, WINDOW_MS);
}
