//! A source layer that times each delivery from its fetch to its ack.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{DeadLetter, Delivery, RetryReason, Source, SourceError};

/// Wraps a source and records, for each acked delivery, the time from its
/// fetch to its ack being done: the latency a consumer adds per message,
/// as the benchmarks report it. Every verb goes through to the inner source
/// unchanged.
pub struct Timed<S> {
    inner: S,
    times: Arc<AckTimes>,
}

/// What a [`Timed`] source recorded: a bounded histogram, however long it
/// runs.
#[derive(Debug, Default)]
pub struct AckTimes {
    latencies: Mutex<Latencies>,
    acked: AtomicUsize,
    changed: Notify,
}

/// Sub-buckets per power of two: each bucket is at most 1/64 (1.6 %) wide.
const SUB_BUCKETS: u64 = 64;
/// Buckets for every `u64` of nanoseconds: 64 exact ones, then 64 per
/// power of two from 2^6 to 2^63.
const BUCKETS: usize = (SUB_BUCKETS + (64 - 6) * SUB_BUCKETS) as usize;

/// Latencies in a histogram of fixed size (about 30 KiB): log-linear
/// buckets over every duration up to `u64::MAX` nanoseconds, each at most
/// 1.6 % wide, so a run of any length reads back its quantiles to within
/// that.
///
/// ```
/// use std::time::Duration;
/// use idem_consumer::Latencies;
/// let l: Latencies = (1..=100).map(Duration::from_millis).collect();
/// assert_eq!(l.count(), 100);
/// let p50 = l.quantile(0.5);
/// assert!(p50 >= Duration::from_millis(50) && p50 <= Duration::from_millis(51));
/// assert_eq!(l.max(), Duration::from_millis(100));
/// ```
#[derive(Clone, Debug)]
pub struct Latencies {
    buckets: Box<[u64]>,
    count: u64,
    max: Duration,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            buckets: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            max: Duration::ZERO,
        }
    }
}

impl Latencies {
    /// Adds one latency.
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(nanos)] += 1;
        self.count += 1;
        self.max = self.max.max(latency);
    }

    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The largest latency recorded (exact).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The latency at quantile `q` (0.5 for the median, 0.99 for p99): the
    /// upper end of the bucket holding it, at most [`max`](Self::max);
    /// zero when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let rank = ((self.count as f64 * q.clamp(0.0, 1.0)).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Duration::from_nanos(upper_of(i)).min(self.max);
            }
        }
        self.max
    }
}

impl FromIterator<Duration> for Latencies {
    fn from_iter<I: IntoIterator<Item = Duration>>(iter: I) -> Self {
        let mut l = Latencies::default();
        for d in iter {
            l.record(d);
        }
        l
    }
}

/// The bucket of `nanos`.
fn bucket_of(nanos: u64) -> usize {
    if nanos < SUB_BUCKETS {
        return nanos as usize;
    }
    let exp = u64::from(63 - nanos.leading_zeros()); // 6..=63
    let shift = exp - 6;
    let sub = (nanos >> shift) - SUB_BUCKETS; // 0..64
    (SUB_BUCKETS + (exp - 6) * SUB_BUCKETS + sub) as usize
}

/// The largest value of bucket `i`.
fn upper_of(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return i;
    }
    let shift = (i - SUB_BUCKETS) / SUB_BUCKETS;
    let sub = (i - SUB_BUCKETS) % SUB_BUCKETS;
    let low = (SUB_BUCKETS + sub) << shift;
    low.saturating_add((1u64 << shift) - 1)
}

impl<S: Source> Timed<S> {
    /// Times `inner`'s deliveries.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            times: Arc::default(),
        }
    }

    /// The times, to read while or after the source is used.
    pub fn times(&self) -> Arc<AckTimes> {
        self.times.clone()
    }
}

impl AckTimes {
    /// How many deliveries were acked.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Acquire)
    }

    /// Waits until at least `n` deliveries were acked.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn wait_for(&self, n: usize) {
        loop {
            let changed = self.changed.notified();
            if self.acked() >= n {
                return;
            }
            changed.await;
        }
    }

    /// The latencies recorded so far.
    pub fn latencies(&self) -> Latencies {
        self.latencies.lock().clone()
    }

    fn record(&self, fetched: Instant) {
        self.latencies.lock().record(fetched.elapsed());
        self.acked.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }
}

/// The fetch time, and the delivery as the inner source knows it.
fn untimed<R>(d: Delivery<(Instant, R)>) -> (Instant, Delivery<R>) {
    let (at, receipt) = d.receipt;
    let delivery = Delivery {
        message: d.message,
        receipt,
    };
    (at, delivery)
}

impl<S: Source> Source for Timed<S> {
    type Receipt = (Instant, S::Receipt);

    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn lag(&self) -> Result<Option<u64>, SourceError> {
        self.inner.lag().await
    }

    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<Self::Receipt>>, SourceError> {
        let got = self.inner.fetch(max).await?;
        let now = Instant::now();
        Ok(got
            .into_iter()
            .map(|d| Delivery {
                message: d.message,
                receipt: (now, d.receipt),
            })
            .collect())
    }

    async fn ack(&self, d: Delivery<Self::Receipt>) -> Result<(), SourceError> {
        let (at, d) = untimed(d);
        let r = self.inner.ack(d).await;
        self.times.record(at);
        r
    }

    async fn retry(
        &self,
        d: Delivery<Self::Receipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        self.inner.retry(untimed(d).1, delay, reason).await
    }

    async fn dead_letter(
        &self,
        d: Delivery<Self::Receipt>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        self.inner.dead_letter(untimed(d).1, why).await
    }

    async fn requeue(&self, d: Delivery<Self::Receipt>) -> Result<(), SourceError> {
        self.inner.requeue(untimed(d).1).await
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        self.inner.keep_alive_every()
    }

    async fn keep_alive(&self, receipt: &Self::Receipt) -> Result<(), SourceError> {
        self.inner.keep_alive(&receipt.1).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_whose_bounds_hold_it() {
        let mut v = 1u64;
        while v < u64::MAX / 3 {
            for x in [v, v + 1, v * 2 - 1, v * 3 / 2] {
                let i = bucket_of(x);
                assert!(i < BUCKETS);
                assert!(upper_of(i) >= x, "{x} above bucket {i}");
                assert!(
                    i == 0 || upper_of(i - 1) < x,
                    "{x} belongs below bucket {i}"
                );
                assert!(upper_of(i) - x <= x / 64 + 1, "bucket {i} too wide at {x}");
            }
            v = v * 3 + 1;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_read_back_within_a_bucket() {
        let l: Latencies = (1..=10_000).map(Duration::from_micros).collect();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = Duration::from_micros((10_000.0 * q) as u64);
            let got = l.quantile(q);
            assert!(
                got >= exact && got <= exact.mul_f64(1.02),
                "{q}: {got:?} vs {exact:?}"
            );
        }
        assert_eq!(l.quantile(1.0), Duration::from_micros(10_000));
        assert_eq!(Latencies::default().quantile(0.5), Duration::ZERO);
    }

    #[test]
    fn a_long_run_stays_the_same_size() {
        let mut l = Latencies::default();
        for i in 0..1_000_000u64 {
            l.record(Duration::from_nanos(i * 997));
        }
        assert_eq!(l.count(), 1_000_000);
        assert_eq!(l.buckets.len(), BUCKETS);
    }
}
