//! idem's consumer runner: however often a broker delivers a message, its
//! handler's effect happens once (docs/contract.md §7).
//!
//! A [`Source`] is a broker seen through five verbs: fetch a batch, ack,
//! retry later with a delay, dead-letter, and hand back at shutdown. The
//! [`Runner`] takes messages from it, claims their keys in batches
//! (`begin_many`), runs the [`Handler`] under the [`Guard`](idem_core::Guard)
//! (lease renewed while it works), stores the outcome, and maps every outcome
//! to a broker action:
//!
//! | outcome | action |
//! |---|---|
//! | handler succeeded, or the key was completed before (a duplicate) | ack |
//! | another consumer holds the key | retry after its `retry_after` |
//! | handler failed (transient) | claim released, retry with backoff and jitter |
//! | attempts exhausted ([`Runner::max_attempts`], default 16) | dead-letter with key, attempts and last error, then ack |
//! | handler failed permanently, key missing, fingerprint mismatch | dead-letter at once |
//! | store unreachable | no ack: retry later (fail closed), unless the guard fails open |
//!
//! When the handler's own database transaction records each key (an inbox
//! table beside the business data), [`Runner::unguarded`] runs it without a
//! store: every delivery reaches the handler, which finds a duplicate in its
//! table, and the rest of the table above holds.
//!
//! ```no_run
//! use idem_consumer::{HandlerError, KeyFrom, MemorySource, Message, Runner};
//! use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let source = MemorySource::new("orders");
//! let guard = Guard::new(MemoryStore::new());
//! let handler = |message: Message, claim: ClaimHandle| async move {
//!     // Charge once; a sink can refuse writes with an older claim.token().
//!     let _ = (message.body, claim.token());
//!     Ok::<_, HandlerError>(Bytes::from_static(b"\"charged\""))
//! };
//! let report = Runner::new(guard, source, handler)
//!     .key(KeyFrom::MessageId)
//!     .concurrency(32)
//!     .run(CancellationToken::new())
//!     .await?;
//! println!("{report:?}");
//! # Ok(()) }
//! ```
//!
//! A new source is tested with `testing` (feature `test-util`): a handler
//! that records every call and effect, a runner started and stopped, and a
//! consumer that dies mid-handler.
#![deny(missing_docs)]

mod backoff;
mod boxed;
pub mod copy;
pub mod dlq;
mod handler;
mod key;
mod memory;
mod message;
mod runner;
mod source;
#[cfg(feature = "test-util")]
pub mod testing;
mod timed;

pub use backoff::Backoff;
pub use boxed::{AnyReceipt, BoxSource};
pub use handler::{Handler, HandlerError};
pub use key::{KeyFrom, KeyFromError};
pub use memory::MemorySource;
pub use message::{Delivery, Message};
pub use runner::{Readiness, Report, RunError, Runner};
pub use source::{Capabilities, DeadLetter, RetryReason, Source, SourceError};
pub use timed::{AckTimes, Latencies, Timed};
