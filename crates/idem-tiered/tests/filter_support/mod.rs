//! What the filter tests share: a seed, settings, keys and times.

#![allow(dead_code)]

use std::convert::Infallible;
use std::time::Duration;

use idem_core::{Key, Timestamp};
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};

pub const HOUR: Duration = Duration::from_secs(3600);

/// A retention of three hours over 4 generations: one-hour windows.
pub const RETENTION: Duration = Duration::from_secs(3 * 3600);

/// The time the tests start at.
pub const T0: u64 = 1_764_669_600_000;

pub fn seed() -> FilterSeed {
    FilterSeed::new(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210)
}

/// `expected_items` keys per three hours, 0.1 %, 4 generations.
pub fn config(expected_items: u64) -> FilterConfig {
    FilterConfig::new(seed(), expected_items, RETENTION)
}

pub fn key(n: u64) -> Key {
    Key::new("orders", format!("m-{n}")).unwrap()
}

/// `T0` plus `ms` milliseconds.
pub fn at(ms: u64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

/// `T0` plus `hours` hours.
pub fn hours(hours: f64) -> Timestamp {
    at((hours * 3_600_000.0) as u64)
}

/// Nothing to feed: a rebuild for a store that is empty.
pub fn no_keys() -> std::iter::Empty<Result<Key, Infallible>> {
    std::iter::empty()
}

/// Keys to feed a rebuild.
pub fn feed(keys: impl IntoIterator<Item = Key>) -> impl Iterator<Item = Result<Key, Infallible>> {
    keys.into_iter().map(Ok)
}

/// A filter built at `now` and marked ready with nothing fed.
pub fn ready(config: &FilterConfig, now: Timestamp) -> KeyFilter {
    let filter = KeyFilter::new(config, now).unwrap();
    filter.rebuild(no_keys(), Some(0), |_, _| {}).unwrap();
    filter
}
