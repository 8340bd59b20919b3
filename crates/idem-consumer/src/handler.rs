//! The user's handler.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{BoxError, ClaimHandle};

use crate::Message;

/// Does a message's work. Called at most once per key at a time; called
/// again only after a failure (transient) or after a lease was lost.
///
/// `Ok` carries the outcome to store (JSON text reads best through
/// `idem serve`; empty for none). A closure
/// `Fn(Message, ClaimHandle) -> impl Future<Output = Result<Bytes, HandlerError>>`
/// is a handler.
pub trait Handler: Send + Sync + 'static {
    /// Handles `message` under `claim` (its fencing token, and whether the
    /// lease is being lost).
    fn handle(
        &self,
        message: Message,
        claim: ClaimHandle,
    ) -> impl Future<Output = Result<Bytes, HandlerError>> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Message, ClaimHandle) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, HandlerError>> + Send,
{
    fn handle(
        &self,
        message: Message,
        claim: ClaimHandle,
    ) -> impl Future<Output = Result<Bytes, HandlerError>> + Send {
        self(message, claim)
    }
}

/// Why a handler did not finish its work.
#[derive(Debug)]
pub struct HandlerError {
    error: BoxError,
    kind: Kind,
    retry_after: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Transient,
    Permanent,
    Pause,
}

impl HandlerError {
    /// A failure another try may fix: the message is retried with backoff.
    pub fn transient(error: impl Into<BoxError>) -> Self {
        Self::of(Kind::Transient, error)
    }

    /// A failure no retry can fix: the message is dead-lettered at once.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        Self::of(Kind::Permanent, error)
    }

    /// The handler cannot take any message now, whatever the message (it is
    /// misconfigured: a wrong address, a refused credential). The message
    /// is not counted as an attempt and never dead-lettered for it: the
    /// runner pauses consumption with backoff, holds the message (or hands
    /// it back) and tries again, and reports not ready until a call
    /// succeeds.
    pub fn pause(error: impl Into<BoxError>) -> Self {
        Self::of(Kind::Pause, error)
    }

    fn of(kind: Kind, error: impl Into<BoxError>) -> Self {
        Self {
            error: error.into(),
            kind,
            retry_after: None,
        }
    }

    /// Retry no sooner than `after` (a downstream's `Retry-After`).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Whether retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        self.kind == Kind::Permanent
    }

    /// Whether the handler asked to pause consumption
    /// ([`HandlerError::pause`]).
    pub fn is_pause(&self) -> bool {
        self.kind == Kind::Pause
    }

    /// The delay the handler asked for, if any.
    pub fn requested_delay(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error.as_ref())
    }
}
