//! What the filter is sized from, and the sizing that follows.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use fastbloom::DefaultHasher;
use idem_core::Key;

/// The most generations a filter may have: every lookup checks each one.
pub const MAX_GENERATIONS: u32 = 64;

/// The largest filter, in bytes of bit arrays (1 TiB): beyond it the numbers
/// are a mistake, not a plan.
pub const MAX_FILTER_BYTES: u64 = 1 << 40;

/// The per-deployment secret the filter's hashes are keyed with.
///
/// Bit positions depend on it, so nobody who lacks it can craft keys that
/// all land in one region of the filter and make every lookup a `Maybe`.
/// Keep it as secret as any other credential, and the same across restarts:
/// a snapshot written under one seed is refused under another.
///
/// `Debug` shows only the [`fingerprint`](FilterSeed::fingerprint).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FilterSeed(u128);

impl FilterSeed {
    /// A seed from 128 secret bits.
    pub const fn new(secret: u128) -> Self {
        Self(secret)
    }

    /// A seed from 16 secret bytes.
    pub const fn from_bytes(secret: [u8; 16]) -> Self {
        Self(u128::from_be_bytes(secret))
    }

    /// A 64-bit value that tells seeds apart without revealing them: SipHash
    /// keyed with the seed over a fixed label. Snapshots store it instead of
    /// the seed.
    pub fn fingerprint(&self) -> u64 {
        // No key hashes to this input: an encoded key starts with its
        // namespace length, at most 64, never 0xff.
        let mut hasher = self.build_hasher();
        hasher.write(b"\xffidem filter seed fingerprint");
        hasher.finish()
    }

    /// The keyed SipHash-1-3 the filter hashes keys with (what fastbloom's
    /// `.seed(&secret)` installs).
    pub(crate) fn build_hasher(&self) -> <DefaultHasher as BuildHasher>::Hasher {
        DefaultHasher::seeded(&self.0.to_be_bytes()).build_hasher()
    }

    pub(crate) fn secret(&self) -> u128 {
        self.0
    }

    /// The hash a key's bit positions are derived from: namespace length,
    /// namespace, key bytes — the injective [`Key::encode`] layout, fed
    /// without building it, so `("ab", "c")` and `("a", "bc")` differ.
    pub(crate) fn hash_key(&self, key: &Key) -> u64 {
        let namespace = key.namespace().as_str().as_bytes();
        let mut hasher = self.build_hasher();
        // A namespace is at most 64 bytes, so its length fits a byte.
        hasher.write(&[namespace.len() as u8]);
        hasher.write(namespace);
        hasher.write(key.bytes());
        hasher.finish()
    }
}

impl fmt::Debug for FilterSeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FilterSeed(fingerprint {:016x})", self.fingerprint())
    }
}

/// What a [`KeyFilter`](super::KeyFilter) is built for.
///
/// ```
/// use std::time::Duration;
/// use idem_tiered::filter::{FilterConfig, FilterSeed};
///
/// let mut config = FilterConfig::new(FilterSeed::new(0x5eed), 10_000_000, Duration::from_secs(24 * 3600));
/// config.false_positive_rate = 0.01;
/// let sizing = config.sizing()?;
/// assert_eq!(sizing.generations, 4);
/// assert_eq!(sizing.window, Duration::from_secs(8 * 3600));
/// # Ok::<_, idem_tiered::filter::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct FilterConfig {
    /// The per-deployment secret the hashes are keyed with.
    pub seed: FilterSeed,
    /// Distinct keys inserted per `retention`. More may be inserted; the
    /// false-positive rate then rises above `false_positive_rate`.
    pub expected_items: u64,
    /// The chance that a key never inserted answers `Maybe`, with every
    /// generation holding its expected keys (the worst moment, just before a
    /// rotation). Default 0.001 (0.1 %).
    pub false_positive_rate: f64,
    /// How long a key is remembered at least. Make it at least the store's
    /// retention of a completed record.
    pub retention: Duration,
    /// How many generations the retention is split over (at least 2). Keys
    /// are kept between `retention` and `retention` plus one window, a window
    /// being `retention / (generations - 1)`: more generations waste less
    /// time and cost more hashing per lookup. Default 4.
    pub generations: u32,
}

impl FilterConfig {
    /// A filter for `expected_items` keys per `retention`, at 0.1 % false
    /// positives, over 4 generations.
    pub fn new(seed: FilterSeed, expected_items: u64, retention: Duration) -> Self {
        Self {
            seed,
            expected_items,
            false_positive_rate: 0.001,
            retention,
            generations: 4,
        }
    }

    /// The sizing these settings lead to, or what is wrong with them.
    pub fn sizing(&self) -> Result<FilterSizing, ConfigError> {
        let generations = self.generations;
        if !(2..=MAX_GENERATIONS).contains(&generations) {
            return Err(ConfigError::Generations { generations });
        }
        let rate = self.false_positive_rate;
        if !(rate > 0.0 && rate < 1.0) {
            return Err(ConfigError::FalsePositiveRate { rate });
        }
        if self.expected_items == 0 {
            return Err(ConfigError::NoExpectedItems);
        }
        let windows = u64::from(generations - 1);
        let retention_ms = u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX);
        if retention_ms < windows {
            return Err(ConfigError::RetentionTooShort {
                retention: self.retention,
                generations,
            });
        }
        // Rounded up, so that `generations - 1` windows cover the retention.
        let window_ms = retention_ms.div_ceil(windows);
        let items = self.expected_items.div_ceil(windows);
        // A lookup checks every generation, so their rates add up: each gets
        // the share that makes the whole `rate` when all are full.
        let generation_rate = 1.0 - (1.0 - rate).powf(1.0 / f64::from(generations));
        let generation = BloomSizing::new(items, generation_rate);
        let sizing = FilterSizing {
            generations,
            window: Duration::from_millis(window_ms),
            generation,
        };
        let bytes = sizing.total_bytes();
        if bytes > MAX_FILTER_BYTES {
            return Err(ConfigError::TooLarge { bytes });
        }
        Ok(sizing)
    }
}

/// The size of one Bloom bit array for `items` keys at a false-positive rate:
/// `-items · ln(rate) / ln(2)²` bits, rounded up to whole 64-bit words, and
/// the number of hashes that makes it most accurate. No rounding to a power
/// of two: 10 M keys at 0.1 % take 17.97 MB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BloomSizing {
    /// Keys the array is built for.
    pub items: u64,
    /// False-positive rate with `items` keys in it.
    pub false_positive_rate: f64,
    /// Bits in the array, a multiple of 64.
    pub bits: u64,
    /// Bits set per key.
    pub hashes: u32,
}

impl BloomSizing {
    /// The smallest array that holds `items` keys at `false_positive_rate`.
    ///
    /// ```
    /// use idem_tiered::filter::BloomSizing;
    /// let sizing = BloomSizing::new(10_000_000, 0.001);
    /// assert!(sizing.bytes() <= 18_000_000);
    /// assert_eq!(sizing.hashes, 10);
    /// ```
    pub fn new(items: u64, false_positive_rate: f64) -> Self {
        let items = items.max(1);
        // fastbloom's `optimal_size`, in floating point so that absurd
        // numbers saturate (and `FilterConfig::sizing` refuses them) instead
        // of overflowing.
        let ln2_squared = std::f64::consts::LN_2 * std::f64::consts::LN_2;
        let bytes = (items as f64 * false_positive_rate.ln() / (-8.0 * ln2_squared)).ceil();
        let bits = (bytes as u64).saturating_mul(8).max(64);
        let bits = bits.div_ceil(64).saturating_mul(64);
        let hashes = fastbloom::optimal_hashes(
            usize::try_from(bits).unwrap_or(usize::MAX),
            usize::try_from(items).unwrap_or(usize::MAX),
        );
        Self {
            items,
            false_positive_rate,
            bits,
            hashes,
        }
    }

    /// Bytes of the bit array.
    pub fn bytes(&self) -> u64 {
        self.bits / 8
    }
}

/// How a [`FilterConfig`] is laid out: `generations` bit arrays, one per
/// window, each sized for the keys of one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FilterSizing {
    /// Bit arrays: the one being filled and those keeping the retention.
    pub generations: u32,
    /// The time each generation receives keys for.
    pub window: Duration,
    /// One generation's array.
    pub generation: BloomSizing,
}

impl FilterSizing {
    /// Bytes of all bit arrays: what the filter keeps in memory and writes
    /// to a snapshot (plus a header).
    pub fn total_bytes(&self) -> u64 {
        self.generation
            .bytes()
            .saturating_mul(u64::from(self.generations))
    }

    /// The window in whole milliseconds (at least 1: `sizing` refuses less).
    pub(crate) fn window_ms(&self) -> u64 {
        u64::try_from(self.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// A [`FilterConfig`] that cannot be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `generations` is out of range.
    #[error(
        "generations is {generations}; it must be 2 to {MAX_GENERATIONS} (one being filled, the others keeping the retention); 4 is a good start"
    )]
    Generations {
        /// What was given.
        generations: u32,
    },
    /// `false_positive_rate` is not a probability strictly between 0 and 1.
    #[error("false_positive_rate is {rate}; it must be above 0 and below 1 (0.001 is 0.1 %)")]
    FalsePositiveRate {
        /// What was given.
        rate: f64,
    },
    /// `expected_items` is 0.
    #[error("expected_items is 0; give the number of distinct keys inserted per retention")]
    NoExpectedItems,
    /// The retention is shorter than one millisecond per window.
    #[error(
        "retention of {retention:?} is too short for {generations} generations (each window needs at least 1 ms); lengthen the retention or use fewer generations"
    )]
    RetentionTooShort {
        /// What was given.
        retention: Duration,
        /// The generations it is split over.
        generations: u32,
    },
    /// The bit arrays would take more than [`MAX_FILTER_BYTES`].
    #[error(
        "the filter would take {bytes} bytes, more than the {MAX_FILTER_BYTES} limit; lower expected_items or raise false_positive_rate"
    )]
    TooLarge {
        /// What the settings call for.
        bytes: u64,
    },
}
