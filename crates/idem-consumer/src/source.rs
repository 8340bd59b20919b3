//! A broker, as the runner sees it.

use std::future::Future;
use std::time::Duration;

use idem_core::BoxError;

use crate::Delivery;

/// A broker seen through the verbs the runner needs. Each adapter (RabbitMQ,
/// NATS JetStream, Redis Streams, Kafka, RocketMQ) implements it; [`MemorySource`](crate::MemorySource)
/// is one in memory, for tests.
///
/// Every verb that settles a delivery takes it by value: a delivery is acked,
/// retried, dead-lettered or handed back exactly once. A delivery the runner
/// never settles (the process died) is redelivered by the broker; the guard
/// absorbs the duplicate.
///
/// # Cancel safety
///
/// `fetch` must lose nothing when its future is dropped (the runner drops it
/// at shutdown): a message taken from the broker but not returned stays
/// unacknowledged and is redelivered. The settling verbs are awaited to the
/// end by the runner, also at shutdown.
pub trait Source: Send + Sync + 'static {
    /// The broker's handle for settling one delivery.
    type Receipt: Send + Sync + 'static;

    /// The queue, stream or topic name: the runner's default namespace.
    fn name(&self) -> &str;

    /// Up to `max` messages; waits a while for the first, and may answer
    /// with none (the runner asks again).
    fn fetch(
        &self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivery<Self::Receipt>>, SourceError>> + Send;

    /// The message is done with: its effect is recorded.
    fn ack(
        &self,
        delivery: Delivery<Self::Receipt>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Delivers the message again after `delay` (at the broker: the runner
    /// does not hold it). `reason` says whether this counts as a handler
    /// attempt ([`RetryReason::counts_as_attempt`]).
    fn retry(
        &self,
        delivery: Delivery<Self::Receipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Parks the message in the dead-letter destination, with its body and
    /// headers and the headers `idem-key`, `idem-attempts` and
    /// `idem-last-error`, then acks it.
    fn dead_letter(
        &self,
        delivery: Delivery<Self::Receipt>,
        why: DeadLetter,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Hands the message back for immediate redelivery, without counting an
    /// attempt: at shutdown, for work that did not finish.
    fn requeue(
        &self,
        delivery: Delivery<Self::Receipt>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// How often [`keep_alive`](Source::keep_alive) must be called while the
    /// handler works, for a broker that redelivers unacked messages after a
    /// timer (NATS `AckWait`); `None` when it does not.
    fn keep_alive_every(&self) -> Option<Duration> {
        None
    }

    /// Tells the broker the message with this receipt is still being
    /// worked on.
    fn keep_alive(
        &self,
        receipt: &Self::Receipt,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        let _ = receipt;
        async { Ok(()) }
    }

    /// What this source's verbs mean on its broker, for the runner to
    /// adapt (default: [`Capabilities::default`]).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// How many messages wait at the broker for this consumer (published,
    /// not yet delivered to it), for the gauge
    /// `idem_consumer_lag{namespace}` the runner keeps; `None` where the
    /// broker does not tell (the default).
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it loses nothing.
    fn lag(&self) -> impl Future<Output = Result<Option<u64>, SourceError>> + Send {
        async { Ok(None) }
    }

    /// Stops handing out messages of `lane` (a partition) until
    /// [`resume_lane`](Source::resume_lane): the runner calls it while a
    /// message of that lane waits in place, so the messages behind it stay
    /// at the broker instead of taking the runner's room. A source without
    /// lanes ignores it.
    fn pause_lane(&self, lane: &bytes::Bytes) {
        let _ = lane;
    }

    /// Hands out messages of `lane` again.
    fn resume_lane(&self, lane: &bytes::Bytes) {
        let _ = lane;
    }
}

/// What a [`Source`]'s verbs mean on its broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// A retry handed to the broker uses up a delivery the broker counts
    /// itself (RocketMQ's reconsume times, NATS's delivery count): a retry
    /// because another holder is working ([`RetryReason::Busy`]) or the
    /// store is unreachable ([`RetryReason::Unavailable`]) then waits in
    /// the runner, kept alive, instead of going to the broker, so that only
    /// handler failures use up attempts (a store outage never dead-letters
    /// a message).
    pub busy_retry_uses_attempt: bool,
    /// The longest the broker lets a consumer hold one delivery without
    /// settling it, however often it is kept alive (RabbitMQ's consumer
    /// timeout); `None` for no limit. A retry waiting in place longer goes
    /// to the broker instead.
    pub max_hold: Option<Duration>,
}

impl Default for Capabilities {
    /// Busy retries counted by idem only, deliveries held as long as kept
    /// alive.
    fn default() -> Self {
        Self {
            busy_retry_uses_attempt: false,
            max_hold: None,
        }
    }
}

impl Capabilities {
    /// These capabilities, with busy retries using up the broker's count.
    pub fn busy_retry_uses_attempt(mut self, yes: bool) -> Self {
        self.busy_retry_uses_attempt = yes;
        self
    }

    /// These capabilities, with deliveries held at most `hold`.
    pub fn max_hold(mut self, hold: Duration) -> Self {
        self.max_hold = Some(hold);
        self
    }
}

/// Why a message is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryReason {
    /// Another consumer holds the key.
    Busy,
    /// The handler failed.
    Failed,
    /// The idempotency store could not be reached.
    Unavailable,
}

impl RetryReason {
    /// Only a handler failure uses up an attempt.
    pub fn counts_as_attempt(self) -> bool {
        self == RetryReason::Failed
    }

    /// The attempts a message has used up once retried for this reason,
    /// having used `used` before. Saturating: a count read back from a
    /// header may be anything up to `u32::MAX`.
    pub fn attempts_used_after(self, used: u32) -> u32 {
        used.saturating_add(u32::from(self.counts_as_attempt()))
    }

    /// The label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Busy => "busy",
            RetryReason::Failed => "failed",
            RetryReason::Unavailable => "unavailable",
        }
    }
}

/// Why a message is dead-lettered: what the dead-letter headers carry.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The idempotency key (`idem-key`), when the message had one.
    pub key: Option<String>,
    /// Handler attempts made (`idem-attempts`).
    pub attempts: u32,
    /// The last error (`idem-last-error`).
    pub last_error: String,
}

impl DeadLetter {
    /// The headers a dead-lettered message gets, beside its own, each
    /// value made safe with [`header_text`](crate::copy::header_text) (a
    /// handler's error body may span lines; a key may hold anything).
    /// `idem-dead-lettered-at` is the time, in milliseconds since the Unix
    /// epoch, on this host's clock.
    pub fn headers(&self) -> [(&'static str, String); 4] {
        let safe = |text: &str| crate::copy::header_text(text).into_owned();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        [
            ("idem-key", safe(self.key.as_deref().unwrap_or_default())),
            ("idem-attempts", self.attempts.to_string()),
            ("idem-last-error", safe(&self.last_error)),
            (crate::dlq::PARKED_AT_HEADER, now.to_string()),
        ]
    }
}

/// A broker operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SourceError {
    what: String,
    #[source]
    source: BoxError,
}

impl SourceError {
    /// `what` failed because of `source`.
    pub fn new(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            what: what.into(),
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_count_read_from_a_header_saturates_instead_of_overflowing() {
        // A producer may send `idem-attempts: 4294967295`.
        assert_eq!(RetryReason::Failed.attempts_used_after(u32::MAX), u32::MAX);
        assert_eq!(RetryReason::Failed.attempts_used_after(2), 3);
        assert_eq!(RetryReason::Busy.attempts_used_after(2), 2);
        assert_eq!(
            RetryReason::Unavailable.attempts_used_after(u32::MAX),
            u32::MAX
        );
    }
}
