//! Apache RocketMQ source for idem's consumer runner.
//!
//! [`RocketMqSource`] consumes a topic in a consumer group through the
//! RocketMQ client's push consumer and implements
//! [`idem_consumer::Source`]: the runner claims each message's key (its
//! RocketMQ `KEYS`, as [`Message::id`](idem_consumer::Message::id)), runs
//! the handler once per key, and acks, retries through the group's
//! `%RETRY%` topic, or dead-letters to its `%DLQ%` topic.
//! [`RocketMqPublisher`] publishes with a key and properties.
//!
//! Why a push consumer: the client's pull consumers commit offsets but
//! cannot send a message back for a later retry, and an orderly consumer
//! retries by holding the queue on the client, which the runner's contract
//! rules out (a retry waits at the broker). The push consumer's listener is
//! bridged to the runner's pull-shaped `fetch`; see [`RocketMqSource`] for
//! how each verb maps and what the client cannot do.
//!
//! ```no_run
//! use idem_consumer::{HandlerError, KeyFrom, Message, Runner};
//! use idem_core::{Bytes, ClaimHandle, Guard, Lease, MemoryStore};
//! use idem_rocketmq::{RocketMqConfig, RocketMqSource};
//! use std::time::Duration;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let lease = Duration::from_secs(30);
//! let config = RocketMqConfig::from_url("rocketmq://127.0.0.1:9876?topic=orders&group=billing")?
//!     .concurrency(32)
//!     .lease(lease);
//! let source = RocketMqSource::connect(config).await?;
//! let guard = Guard::new(MemoryStore::new()).lease(Lease::new(lease));
//! let handler = |message: Message, _claim: ClaimHandle| async move {
//!     let _ = message.body;
//!     Ok::<_, HandlerError>(Bytes::new())
//! };
//! Runner::new(guard, source.clone(), handler)
//!     .key(KeyFrom::MessageId)
//!     .concurrency(32)
//!     .run(CancellationToken::new())
//!     .await?;
//! // Commits the offsets; what was never acked goes to the next consumer.
//! source.shutdown().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod client;
mod config;
mod dlq;
mod monitor;
mod publisher;
mod source;

pub use client::{ClientHost, ConnectError};
pub use config::{ConfigError, RocketMqConfig};
pub use dlq::RocketMqDeadLetters;
pub use monitor::RocketMqMonitor;
pub use publisher::{PublishError, Published, RocketMqPublisher};
pub use source::{Receipt, RocketMqSource};

/// What a delivered message decodes to, and the properties of its dead
/// letter, for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod decode {
    pub use crate::source::{Decoded, dead_letter_properties, message_of};
}
