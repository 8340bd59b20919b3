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

/// What a [`Timed`] source recorded.
#[derive(Debug, Default)]
pub struct AckTimes {
    latencies: Mutex<Vec<Duration>>,
    acked: AtomicUsize,
    changed: Notify,
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

    /// Every latency recorded so far, in the order the acks were done.
    pub fn latencies(&self) -> Vec<Duration> {
        self.latencies.lock().clone()
    }

    fn record(&self, fetched: Instant) {
        self.latencies.lock().push(fetched.elapsed());
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
