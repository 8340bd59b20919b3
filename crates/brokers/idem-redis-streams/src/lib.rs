//! Redis Streams source for idem's consumer runner.
//!
//! [`RedisStreamSource`] consumes one stream through a consumer group
//! (created with the stream if missing), for the
//! [`Runner`](idem_consumer::Runner); [`RedisStreamPublisher`] adds entries
//! in the layout it reads. Needs Redis 6.2 or later (or Valkey) for
//! `XAUTOCLAIM`; one Redis, not a cluster.
//!
//! ```no_run
//! use idem_consumer::{HandlerError, Message, Runner};
//! use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
//! use idem_redis_streams::{RedisStreamConfig, RedisStreamSource};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = RedisStreamConfig::from_url("redis://127.0.0.1:6379?stream=orders&group=idem")?
//!     .concurrency(32);
//! let source = RedisStreamSource::connect(config).await?;
//! let handler = |message: Message, _claim: ClaimHandle| async move {
//!     let _ = message.body;
//!     Ok::<_, HandlerError>(Bytes::new())
//! };
//! Runner::new(Guard::new(MemoryStore::new()), source, handler)
//!     .concurrency(32)
//!     .run(CancellationToken::new())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Entry layout
//!
//! An entry is a field map:
//!
//! | field | becomes |
//! |---|---|
//! | `message-id` | [`Message::id`](idem_consumer::Message::id): the producer's id, the default idempotency key (entry ids differ per `XADD`, so a duplicate publish has a new one) |
//! | `body` | the body (empty when absent) |
//! | `content-type` | the content type |
//! | `idem-attempts` | handler attempts used up before this copy (written on retried and handed-back copies; not a header) |
//! | any other | a header, in field order |
//!
//! # Attempts
//!
//! `Message::attempt` = `idem-attempts` (0 when absent) + the group's
//! delivery counter for this entry (1 on a first read; each claim from a
//! consumer that died or stalled adds one). A retry for
//! [`RetryReason::Failed`](idem_consumer::RetryReason::Failed) writes the
//! copy with `idem-attempts` = this attempt; other retries and hand-backs
//! write this attempt − 1, so they do not count. A message that kills its
//! consumer mid-handler is thus counted each time it is claimed, and
//! dead-lettered once the runner's `max_attempts` is reached.
//!
//! # Where things go
//!
//! - **Ack**: `XACK`. Entries stay in the stream (other groups may read
//!   it); trim it on the producer side (`XADD … MAXLEN ~ n`).
//! - **Retry**: Redis has no delayed delivery, so the copy waits in a
//!   sorted set beside the stream, `<stream>.retry`, scored with its due
//!   time on Redis's clock; one script acks the entry and adds the copy.
//!   Each fetch first moves due copies back into the stream (`XADD` and
//!   `ZREM` in one script, so two consumers never both move one).
//! - **Dead letters**: `XADD` to `<stream>.dead-letter` (or
//!   [`RedisStreamConfig::dead_letter`]) with the entry's fields plus
//!   `idem-key`, `idem-attempts` and `idem-last-error`, in one script with
//!   the ack. idem's fields replace the entry's of the same name (a
//!   replayed dead letter's), and their values are escaped to one line.
//! - **Hand-back at shutdown**: a copy at the stream's end, with the ack,
//!   for immediate redelivery.
//! - **Dead consumers**: an entry left pending longer than
//!   [`RedisStreamConfig::claim_idle`] is claimed (`XAUTOCLAIM`) by a live
//!   consumer. While a handler works, its entry's idle time is reset every
//!   third of that (`XCLAIM … JUSTID`), so a slow handler keeps its entry.
//!   Each start is a new consumer (`idem-<pid>-<random>`) unless
//!   [`RedisStreamConfig::consumer`] names one; names of consumers gone for
//!   good can be removed with `XGROUP DELCONSUMER` once they hold nothing.
//!
//! Every settling script acks first and writes the copy only if the entry
//! was still pending, so an entry claimed and settled by another consumer
//! meanwhile is not copied twice.
#![deny(missing_docs)]

mod config;
mod connect;
mod dlq;
mod entry;
mod publisher;
mod source;

pub use config::{ConfigError, RedisStreamConfig};
pub use connect::ConnectError;
pub use dlq::RedisStreamDeadLetters;
pub use publisher::{PublishError, RedisStreamPublisher};
pub use source::{Backlog, RedisStreamReceipt, RedisStreamSource};

/// What an entry Redis answers with decodes to, for the fuzz targets in
/// `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod decode {
    use idem_consumer::Message;
    use redis::Value;

    /// The message of the entry `id` with the flat `[field, value, …]`
    /// array `fields`, delivered `deliveries` times; `None` for what is not
    /// an entry.
    pub fn message_of(id: &Value, fields: &Value, deliveries: u32) -> Option<Message> {
        crate::entry::Entry::parse(id, fields).map(|e| e.message(deliveries))
    }
}
