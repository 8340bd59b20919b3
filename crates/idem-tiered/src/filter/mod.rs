//! A time-windowed, keyed Bloom pre-filter: it answers "certainly new"
//! for most new keys without touching storage.
//!
//! # What an answer means
//!
//! [`KeyFilter::check`] answers [`Membership::Absent`] — the key was never
//! inserted into any live generation, so it is certainly new — or
//! [`Membership::Maybe`]. A `Maybe` always goes to the exact check (the
//! store); an `Absent` may skip the places a record of the key could only be
//! if it had been inserted before. The filter never turns a new message into
//! a duplicate nor a duplicate into a new one: only the cost of finding out
//! changes (`docs/contract.md` §2 holds either way).
//!
//! That needs three things of the caller:
//!
//! - **Insert first.** [`KeyFilter::insert`] must return before the key's
//!   record can be seen by anyone as existing. A key whose record others can
//!   see but the filter lacks would be answered `Absent`: a duplicate taken
//!   for new.
//! - **Retention.** A key is kept at least [`FilterConfig::retention`] after
//!   its insert, and at most one window more plus the lateness of
//!   [`KeyFilter::rotate`]: make the retention at least the store's
//!   retention of a completed record. Call `rotate` often (say every tenth
//!   of a window, or let [`maintain`] do it); a late rotation keeps keys
//!   longer, never shorter.
//! - **Readiness.** A filter that may lack keys answers `Maybe` to every
//!   lookup. A new filter, or one loaded from a snapshot (keys inserted after
//!   the snapshot was taken are missing), is not [`Readiness::Ready`] until
//!   [`KeyFilter::rebuild`] has fed it the keys of the records created since
//!   [`Readiness::NeedsRebuild::since`] ([`KeyFilter::rebuild_from_tier`]
//!   reads them from a tier: only those completed since the snapshot when
//!   the tier can list them by completion time).
//!
//! # How it works
//!
//! The filter is `generations` Bloom bit arrays ([`fastbloom`]'s
//! `AtomicBloomFilter`: lookups and inserts from many tasks through `&self`,
//! without a lock), each receiving the keys of one window of
//! `retention / (generations - 1)`. An insert goes to the newest; a lookup
//! checks all of them; [`KeyFilter::rotate`] clears the oldest and makes it
//! the newest once the newest has received keys for a whole window. Each array is sized for
//! one window's share of [`FilterConfig::expected_items`], at the share of
//! [`FilterConfig::false_positive_rate`] that makes the whole rate when all
//! are full ([`FilterConfig::sizing`] shows the numbers).
//!
//! | keys per retention | rate | generations | memory |
//! | --- | --- | --- | --- |
//! | 10 M | 0.1 % | 1 array, no windows ([`BloomSizing`]) | 17.97 MB |
//! | 10 M | 0.1 % | 4 | 28.8 MB |
//! | 10 M | 0.1 % | 8 | 26.7 MB |
//! | 10 M | 1 % | 4 | 20.8 MB |
//!
//! Positions are derived from SipHash-1-3 keyed with the deployment's
//! [`FilterSeed`], over the namespace's length, the namespace and the key:
//! without the seed nobody can craft keys that crowd one region.
//!
//! [`KeyFilter::write_snapshot`] writes the arrays to a file (atomically,
//! checksummed, with the seed's fingerprint, never the seed);
//! [`KeyFilter::load_snapshot`] refuses any file it cannot trust, saying why,
//! and the caller then rebuilds. [`maintain`] rotates and snapshots on an
//! interval and writes a last snapshot at shutdown.
//!
//! ```
//! use std::time::Duration;
//! use idem_core::{Key, Timestamp};
//! use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter, Membership};
//!
//! let config = FilterConfig::new(FilterSeed::new(0x5eed), 100_000, Duration::from_secs(3600));
//! let filter = KeyFilter::new(&config, Timestamp::from_millis(0))?;
//! filter.rebuild(std::iter::empty::<Result<Key, std::convert::Infallible>>(), Some(0), |_, _| {})?;
//!
//! let key = Key::new("orders", "m-42")?;
//! assert_eq!(filter.check(&key), Membership::Absent); // certainly new
//! filter.insert(&key); // before its record can be seen
//! assert_eq!(filter.check(&key), Membership::Maybe); // ask the store
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```

mod config;
mod from_tier;
mod generations;
mod maintain;
mod readiness;
mod snapshot;
mod stats;

use idem_core::{Key, Timestamp};

use self::generations::Generations;
use self::readiness::ReadinessState;
use self::stats::{Answer, Counters};

pub use self::config::{
    BloomSizing, ConfigError, FilterConfig, FilterSeed, FilterSizing, MAX_FILTER_BYTES,
    MAX_GENERATIONS,
};
pub use self::from_tier::{FEED_PAGE, Fed, SNAPSHOT_CLOCK_MARGIN};
pub use self::maintain::maintain;
pub use self::readiness::{REBUILD_PROGRESS_EVERY, Readiness, RebuildError};
pub use self::snapshot::{SNAPSHOT_FORMAT_VERSION, SnapshotError};
pub use self::stats::FilterStats;

/// A filter's answer for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Membership {
    /// Certainly new: never inserted into a live generation.
    Absent,
    /// Perhaps seen: go to the exact check.
    Maybe,
}

impl Membership {
    /// Whether the key is certainly new.
    pub fn is_absent(self) -> bool {
        self == Membership::Absent
    }
}

/// The time-windowed, keyed Bloom pre-filter (see the [module docs](self)).
///
/// `Send + Sync`: share it in an `Arc`; every method takes `&self`.
pub struct KeyFilter {
    seed: FilterSeed,
    sizing: FilterSizing,
    generations: Generations,
    readiness: ReadinessState,
    counters: Counters,
}

impl KeyFilter {
    /// An empty filter whose newest generation starts at `now`. It answers
    /// `Maybe` until [`rebuild`](KeyFilter::rebuild) has run (with no keys,
    /// for a store that is empty).
    pub fn new(config: &FilterConfig, now: Timestamp) -> Result<Self, ConfigError> {
        let sizing = config.sizing()?;
        let generations = Generations::new(&sizing, &config.seed, now);
        Ok(Self::assemble(
            config.seed,
            sizing,
            generations,
            ReadinessState::needs_rebuild(None),
        ))
    }

    fn assemble(
        seed: FilterSeed,
        sizing: FilterSizing,
        generations: Generations,
        readiness: ReadinessState,
    ) -> Self {
        let counters = Counters::new(sizing.generations, generations.bytes());
        Self {
            seed,
            sizing,
            generations,
            readiness,
            counters,
        }
    }

    /// Whether `key` is certainly new ([`Membership::Absent`]) or must go to
    /// the exact check ([`Membership::Maybe`]). Always `Maybe` until the
    /// filter is [`Readiness::Ready`].
    pub fn check(&self, key: &Key) -> Membership {
        if !self.readiness.is_ready() {
            self.counters.lookup(Answer::NotReady);
            return Membership::Maybe;
        }
        if self.generations.contains(self.seed.hash_key(key)) {
            self.counters.lookup(Answer::Hit);
            Membership::Maybe
        } else {
            self.counters.lookup(Answer::Absent);
            Membership::Absent
        }
    }

    /// Adds `key` to the newest generation. Call it before the key's record
    /// can be seen as existing.
    pub fn insert(&self, key: &Key) {
        self.generations.insert(self.seed.hash_key(key));
        self.counters.insert();
    }

    /// Drops the oldest generation and starts a new one at `now`, if the
    /// newest has received keys for a whole window by then; returns whether
    /// it did. Keys older than the retention age out this way.
    ///
    /// Call it often: a late call keeps keys longer, never shorter. After a
    /// pause (the process down, the clock stalled), generations go one per
    /// window from the first call on. A clock that went back changes
    /// nothing.
    pub fn rotate(&self, now: Timestamp) -> bool {
        let rotated = self.generations.rotate(now);
        if rotated {
            self.counters.rotated();
            tracing::debug!(now = now.as_millis(), "key filter rotated");
        }
        rotated
    }

    /// When each generation started receiving keys, oldest first.
    pub fn generation_starts(&self) -> Vec<Timestamp> {
        self.generations.starts()
    }

    /// The sizing the filter was built with.
    pub fn sizing(&self) -> &FilterSizing {
        &self.sizing
    }

    /// Bytes of all bit arrays: what the filter holds in memory.
    pub fn memory_bytes(&self) -> u64 {
        self.generations.bytes()
    }

    /// The chance, now, that a key never inserted is answered `Maybe`:
    /// each generation's share of bits set to the power of the hashes per
    /// key, combined over the generations a lookup asks. It grows as the
    /// newest generation fills and drops at each rotation; past the
    /// configured rate, more keys arrive per window than the filter was
    /// sized for. Also sets the gauge
    /// `idem_filter_estimated_false_positive_rate`.
    ///
    /// Reads every bit: about a millisecond per 10 MB of filter. Call it
    /// from upkeep (as [`maintain`] does), not per lookup.
    pub fn estimated_false_positive_rate(&self) -> f64 {
        let hashes = self.sizing.generation.hashes as i32;
        let none: f64 = self
            .generations
            .fill()
            .iter()
            .map(|fill| 1.0 - fill.powi(hashes))
            .product();
        let rate = 1.0 - none;
        metrics::gauge!("idem_filter_estimated_false_positive_rate").set(rate);
        rate
    }

    /// What the filter has answered and done so far.
    pub fn stats(&self) -> FilterStats {
        self.counters
            .stats(self.sizing.generations, self.memory_bytes())
    }
}

impl std::fmt::Debug for KeyFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFilter")
            .field("seed", &self.seed)
            .field("sizing", &self.sizing)
            .field("readiness", &self.readiness())
            .finish_non_exhaustive()
    }
}
