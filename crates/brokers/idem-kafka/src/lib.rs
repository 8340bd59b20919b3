//! Kafka source and idempotent publisher for idem's consumer runner.
//!
//! [`KafkaSource`] is a member of a consumer group that implements
//! [`idem_consumer::Source`]: the runner claims each message's key, runs the
//! handler once per key, and the source commits the message's offset only
//! after its effect is recorded, and only up to the first message of the
//! partition still in work. Kafka redelivers everything after the last
//! committed offset when a member dies or partitions move; the guard turns
//! those redeliveries into acknowledged duplicates.
//!
//! Retries do not block the partition by default: a message to try again
//! is copied to a retry topic (`<topic>-retry-0`, `-1`, …, each with a
//! longer fixed delay) and its offset committed; the copy is consumed when
//! due. After the attempts run out it goes to `<topic>-dlt`. The
//! trade-off: the copy comes back after later messages of its partition,
//! so per-key order is lost for retried messages. When order matters,
//! [`RetryMode::Blocking`] holds the message in place (with
//! [`Runner::retry_in_place`](idem_consumer::Runner::retry_in_place) and
//! [`Runner::ordered`](idem_consumer::Runner::ordered)): nothing behind it
//! in its partition runs until it succeeds or is dead-lettered.
//!
//! The consumer reads with `isolation.level=read_committed` (aborted
//! transactional writes are never handled) and auto-commit off.
//! [`KafkaPublisher`] writes with the idempotent producer, a record key and
//! a `message-id` header.
//!
//! ```no_run
//! use idem_consumer::{HandlerError, KeyFrom, Message, Runner};
//! use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
//! use idem_kafka::{KafkaConfig, KafkaSource};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = KafkaConfig::from_url("kafka://127.0.0.1:9092?topic=orders&group=billing")?
//!     .concurrency(32);
//! let source = KafkaSource::connect(config).await?;
//! let handler = |message: Message, _claim: ClaimHandle| async move {
//!     let _ = message.body;
//!     Ok::<_, HandlerError>(Bytes::new())
//! };
//! let stop = CancellationToken::new();
//! Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
//!     .key(KeyFrom::MessageId)
//!     .concurrency(32)
//!     .run(stop)
//!     .await?;
//! source.close().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod config;
mod consumer;
mod dlq;
mod error;
mod offsets;
mod publisher;
mod record;
mod source;

pub use config::{ConfigError, KafkaConfig, Lanes, OffsetReset, RetryMode};
pub use dlq::KafkaDeadLetters;
pub use error::ConnectError;
pub use publisher::{KafkaPublisher, PublishError, Published};
pub use record::{ATTEMPTS, DUE, MESSAGE_ID, ORIGIN, Receipt};
pub use source::KafkaSource;

/// What a polled record decodes to, and the headers of its retry copies
/// and dead letters, for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod decode {
    pub use crate::record::{Record, copy_header_list, due_of, message_of};
}
