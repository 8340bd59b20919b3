//! Time as the store sees it.
//!
//! Leases and retention are measured on the store's clock, never the caller's,
//! so clock skew between consumers cannot break a lease. Stores that run in the
//! process (memory, file) read a [`Clock`]; tests inject a [`ManualClock`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: milliseconds since the Unix epoch, on the store's clock.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The timestamp `ms` milliseconds after the Unix epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This timestamp moved `d` later, saturating at the far future.
    pub fn after(self, d: Duration) -> Self {
        Self(self.0.saturating_add(millis(d)))
    }

    /// How long from `earlier` to `self`; zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Whole milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A source of the current time for stores that keep time themselves.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(millis(since_epoch))
    }
}

/// A clock that moves only when told to: for tests of leases and retention.
///
/// Clones share one time.
///
/// ```
/// use idem_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now().since(t0), Duration::from_secs(5));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at the current wall-clock time.
    pub fn new() -> Self {
        Self::at(SystemClock.now())
    }

    /// A clock standing at `t`.
    pub fn at(t: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(t.0)))
    }

    /// Moves the clock `d` forward.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(millis(d), Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// The clock handle stores keep.
pub type SharedClock = Arc<dyn Clock>;
