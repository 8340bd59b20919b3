//! NATS JetStream source for idem's consumer runner.
//!
//! [`JetStreamSource`] reads a stream through a durable pull consumer and
//! implements [`idem_consumer::Source`]: the runner claims each message's
//! key, runs the handler once per key, and acks (AckAck), naks with a delay
//! or dead-letters the message. [`JetStreamPublisher`] publishes with a
//! `Nats-Msg-Id`, which the stream deduplicates on.
//!
//! ```no_run
//! use idem_consumer::{HandlerError, KeyFrom, Message, Runner};
//! use idem_core::{Bytes, ClaimHandle, Guard, Lease, MemoryStore};
//! use idem_jetstream::{JetStreamConfig, JetStreamSource};
//! use std::time::Duration;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let lease = Duration::from_secs(30);
//! let config = JetStreamConfig::from_url("nats://127.0.0.1:4222?stream=ORDERS&consumer=idem&subject=orders.>")?
//!     .concurrency(32)
//!     .lease(lease);
//! let source = JetStreamSource::connect(config).await?;
//! let guard = Guard::new(MemoryStore::new()).lease(Lease::new(lease));
//! let handler = |message: Message, _claim: ClaimHandle| async move {
//!     let _ = message.body;
//!     Ok::<_, HandlerError>(Bytes::new())
//! };
//! Runner::new(guard, source, handler)
//!     .key(KeyFrom::MessageId)
//!     .concurrency(32)
//!     .run(CancellationToken::new())
//!     .await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod config;
mod connect;
mod dlq;
mod publisher;
mod source;
mod subject;

pub use config::{ConfigError, JetStreamConfig};
pub use connect::ConnectError;
pub use dlq::JetStreamDeadLetters;
pub use publisher::{JetStreamPublisher, PublishError, Published};
pub use source::{JetStreamSource, Receipt};

/// What a delivery decodes to, and the headers of its dead letter, for the
/// fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod decode {
    pub use crate::source::{dead_letter_headers, message_of};
}
