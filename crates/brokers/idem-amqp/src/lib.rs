//! RabbitMQ (AMQP 0-9-1) source for idem's consumer runner.
//!
//! [`AmqpSource`] consumes one queue with manual acks and a prefetch equal
//! to the concurrency; the [`Runner`](idem_consumer::Runner) decides what
//! happens to each message, and the source carries it out at the broker:
//!
//! - **ack**: `basic.ack`.
//! - **retry**: a copy (body, properties and headers kept, `idem-attempts`
//!   updated) is published with publisher confirms to a retry queue
//!   `<queue>.retry-v2.<bucket>`, and only then is the original acked: a
//!   crash in between duplicates the message, never loses it, and the guard
//!   absorbs the duplicate. Each retry queue has its bucket's message TTL
//!   and dead-letters expired messages back to the work queue. One queue
//!   per delay bucket (100 ms to 1 h, each at most 2.5 times the one
//!   before), delays rounded up: RabbitMQ expires messages only at a
//!   queue's head, and with one TTL per queue a short retry is never held
//!   behind a long one. Delays over an hour share the
//!   `<queue>.retry-v2.long` queue with their own TTL (`expiration`), where
//!   that can happen.
//! - **dead-letter**: a copy with `idem-key`, `idem-attempts` and
//!   `idem-last-error` added is published to `<queue>.dead-letter` (or the
//!   configured name), confirmed, then the original is acked.
//! - **requeue** (shutdown): the message is republished to the work queue
//!   with its count unchanged and acked, so that its redelivery does not
//!   count an attempt (a `nack` with requeue would mark it redelivered);
//!   `nack` with requeue is the fallback when republishing fails.
//!
//! Every copy is persistent (`delivery_mode` 2), whatever the original's
//! mode: the original is acked once its copy is confirmed, so the copy is
//! all that is left of the message. Its headers are built by
//! [`idem_consumer::copy`]: idem's own replaced (values made single-line
//! text), the others kept with their AMQP types, and `CC` and `BCC`, which
//! RabbitMQ would route the copy by (sender-selected distribution), kept
//! as `idem-original-CC` and `idem-original-BCC`. (An `x-delay` header acts
//! only on an exchange of the delayed-message plugin, which idem does not
//! publish to.)
//!
//! # Queues idem declares
//!
//! The retry and dead-letter queues are quorum queues (RabbitMQ 3.10 or
//! later): durable, replicated in a cluster, and the retry queues move
//! expired messages back to the work queue with at-least-once
//! dead-lettering (`x-dead-letter-strategy=at-least-once`, which needs
//! `x-overflow=reject-publish`; no length limit is set). A classic queue
//! dead-letters at most once: a message can be lost on its way back. The
//! work queue is the user's: one that exists is used as it is, a missing
//! one is declared a durable classic queue.
//!
//! Older versions declared classic retry queues named `<queue>.retry.<bucket>`:
//! they are left alone, still return what they hold to the work queue when
//! its TTL ends, and can be deleted once empty (within the longest delay
//! used). A classic dead-letter queue of an older version is refused at
//! connect ([`ConnectError::QueueArguments`]): move its messages elsewhere
//! and delete it, or name another one (`dead_letter=`).
//!
//! When a republish is not confirmed (a retry or dead-letter queue was
//! deleted, the broker refused it), the original is handed back with a
//! `nack` after a one-second pause instead of staying unacked while the
//! channel lives, and the queue is declared again on next use.
//!
//! Every wait for the broker (connecting, declaring, a publish's confirm,
//! an ack) ends when the connection closes or after
//! [`answer_timeout`](AmqpConfig::answer_timeout) (30 s, `answer_timeout_ms=`
//! in the URL), whichever comes first, and counts as failed: a link that
//! hangs without closing, or a confirm lapin never resolves because the
//! connection broke as the publish went out, would otherwise hold the
//! message and its permit for good, and keep the consumer from stopping.
//!
//! # Attempts
//!
//! The handler attempt number is `idem-attempts + 1`, where the header
//! counts attempts used: a retry after a handler failure adds one, a retry
//! because the key is busy or the store is away does not.
//!
//! A consumer that dies mid-handler leaves its messages unacked, and the
//! broker redelivers them. Classic queues only flag such a message
//! `redelivered` (quorum queues count deliveries in `x-delivery-count`, but
//! count a requeue at shutdown as well, and turning a queue into a quorum
//! queue means deleting it). So the source keeps working queues as they are
//! and turns the flag into a count: a delivery flagged `redelivered` is
//! republished to the back of the work queue with `idem-attempts` one
//! higher and acked, before any handler sees it. A poison message that
//! kills the process each time therefore uses an attempt per crash and is
//! dead-lettered after [`max_attempts`](idem_consumer::Runner::max_attempts).
//! The count is an upper bound: a message the broker had sent ahead
//! (prefetched) but no handler had started also counts one attempt when
//! the connection is lost; [`AmqpSource::close`] hands such messages back
//! without counting at a clean shutdown.
//!
//! # Connection loss
//!
//! When the connection or the consuming channel closes (a broker restart,
//! `rabbitmqctl close_connection`, a network failure), the next fetch
//! connects again, re-declares and resumes consuming; the runner calls
//! fetch again with its backoff (100 ms doubling to 5 s) while that fails.
//! Deliveries of the lost connection cannot be settled any more: settling
//! them fails (the runner logs it), the broker redelivers them, and the
//! guard acks the copies of those already handled as duplicates.
//!
//! RabbitMQ closes a channel whose delivery stays unacked longer than its
//! `consumer_timeout` (30 minutes by default), and redelivers everything
//! unacked on it. The source tells the runner to hold a delivery at most
//! [`AmqpConfig::max_hold`] (25 minutes by default, `max_hold_ms=` in the
//! URL) through [`Source::capabilities`](idem_consumer::Source::capabilities):
//! a longer wait in place goes to a retry queue instead. A handler itself
//! must finish sooner. Set it under the broker's `consumer_timeout` when
//! that is shorter.
//!
//! ```no_run
//! use idem_amqp::{AmqpConfig, AmqpSource};
//! use idem_consumer::{HandlerError, Message, Runner};
//! use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = AmqpConfig::from_url("amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders")?
//!     .concurrency(32);
//! let source = AmqpSource::connect(config).await?;
//! let handler = |message: Message, _claim: ClaimHandle| async move {
//!     let _ = message.body;
//!     Ok::<_, HandlerError>(Bytes::new())
//! };
//! Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
//!     .concurrency(32)
//!     .run(CancellationToken::new())
//!     .await?;
//! source.close().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod config;
mod delay;
mod dlq;
mod error;
mod link;
mod properties;
mod publisher;
mod source;

pub use config::{AmqpConfig, ConfigError};
pub use dlq::AmqpDeadLetters;
pub use error::{ConnectError, PublishError};
pub use publisher::AmqpPublisher;
pub use source::{AmqpReceipt, AmqpSource};

/// What a delivery's properties and body decode to, for the fuzz targets in
/// `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod decode {
    pub use crate::properties::message_of;
}
