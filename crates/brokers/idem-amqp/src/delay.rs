//! Delayed retry: one retry queue per delay bucket.
//!
//! RabbitMQ expires messages only at the head of a queue, so a long TTL
//! would hold shorter ones queued behind it. Each bucket's queue has its
//! own message TTL (`x-message-ttl`), so the head always expires first and
//! nothing waits longer than its bucket. A delay is rounded up to the next
//! bucket (at most 2.5 times longer). Delays beyond the last bucket share the
//! `long` queue with their exact TTL (the message's `expiration`), and there
//! a long one can hold shorter ones behind it (all of them over an hour).
//!
//! Retry queues are quorum queues with at-least-once dead-lettering, named
//! `<queue>.retry-v2.<bucket>`: the classic `<queue>.retry.<bucket>` queues
//! of older versions cannot be declared again with these arguments, and
//! under their own they still return what they hold to the work queue.

use std::time::Duration;

/// Bucket lengths in milliseconds with their queue-name suffixes.
const BUCKETS: [(u64, &str); 16] = [
    (100, "100ms"),
    (250, "250ms"),
    (500, "500ms"),
    (1_000, "1s"),
    (2_000, "2s"),
    (5_000, "5s"),
    (10_000, "10s"),
    (20_000, "20s"),
    (30_000, "30s"),
    (60_000, "1m"),
    (120_000, "2m"),
    (300_000, "5m"),
    (600_000, "10m"),
    (1_200_000, "20m"),
    (1_800_000, "30m"),
    (3_600_000, "1h"),
];

/// What a retry queue's name adds to its work queue's name, before the
/// bucket.
pub(crate) const RETRY_INFIX: &str = ".retry-v2.";

/// The longest bucket suffix.
pub(crate) const LONGEST_SUFFIX: &str = "long";

/// Every retry queue of work queue `queue`.
pub(crate) fn retry_queues(queue: &str) -> impl Iterator<Item = String> + '_ {
    BUCKETS
        .iter()
        .map(|(_, suffix)| *suffix)
        .chain([LONGEST_SUFFIX])
        .map(move |suffix| format!("{queue}{RETRY_INFIX}{suffix}"))
}

/// Where a retry of a given delay waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RetryRoute {
    /// The retry queue's name suffix (`<queue>.retry-v2.<suffix>`).
    pub(crate) suffix: &'static str,
    /// How long the message waits, in milliseconds.
    pub(crate) ttl_ms: u64,
    /// Whether the queue's own TTL is the wait (a bucket), or the message
    /// carries it (`long`).
    pub(crate) queue_ttl: bool,
}

impl RetryRoute {
    /// The route for `delay`: the smallest bucket at least as long.
    pub(crate) fn for_delay(delay: Duration) -> Self {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        match BUCKETS.iter().find(|(len, _)| *len >= ms) {
            Some(&(ttl_ms, suffix)) => Self {
                suffix,
                ttl_ms,
                queue_ttl: true,
            },
            None => Self {
                suffix: LONGEST_SUFFIX,
                ttl_ms: ms,
                queue_ttl: false,
            },
        }
    }

    /// The retry queue for work queue `queue`.
    pub(crate) fn queue(&self, queue: &str) -> String {
        format!("{queue}{RETRY_INFIX}{}", self.suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_a_bucket_and_never_down() {
        let route = |ms| RetryRoute::for_delay(Duration::from_millis(ms));
        assert_eq!(route(0).ttl_ms, 100);
        assert_eq!(route(100).ttl_ms, 100);
        assert_eq!(route(101).ttl_ms, 250);
        assert_eq!(route(1_100).suffix, "2s");
        assert_eq!(route(3_600_000).suffix, "1h");
        assert_eq!(
            route(3_600_001),
            RetryRoute {
                suffix: "long",
                ttl_ms: 3_600_001,
                queue_ttl: false,
            }
        );
        assert!(route(3_600_000).queue_ttl);
        assert_eq!(route(750).queue("orders"), "orders.retry-v2.1s");
        for pair in BUCKETS.windows(2) {
            assert!(pair[1].0 as f64 <= pair[0].0 as f64 * 2.5, "{pair:?}");
        }
    }
}
