//! What the guard answers when it does not return the handler's value.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use crate::{BoxError, InvalidInput, StoreError};

/// Why [`Guard::run`](super::Guard::run) did not return a value.
///
/// [`GuardError::disposition`] maps each case to what a message consumer
/// should do with the message.
#[derive(Debug)]
#[non_exhaustive]
pub enum GuardError<E> {
    /// Another holder is working on this key: try again after `retry_after`.
    InProgress {
        /// Time left on the other holder's lease.
        retry_after: Duration,
    },
    /// The key was used before for different content (another fingerprint).
    Mismatch,
    /// The handler failed. The claim was released (after compensation, if
    /// any), so a redelivery runs it again.
    Handler(E),
    /// The handler succeeded, but its lease was lost before the outcome could
    /// be stored, and another holder has taken over the key (or completed
    /// it): that holder finishes. (A lease that ran out with no one taking
    /// over is not this: the guard claims the key again and stores the
    /// outcome.) `outcome` is what would have been stored (decode it with
    /// the codec to recover the value).
    LeaseLost {
        /// The encoded outcome.
        outcome: Bytes,
    },
    /// The key, lease, retention or outcome was refused.
    Invalid(InvalidInput),
    /// The outcome could not be encoded, or a stored one not decoded.
    Outcome(BoxError),
    /// The store failed; nothing ran (the guard fails closed), or the outcome
    /// could not be stored and the claim will expire.
    Store(StoreError),
}

/// What a consumer should do with a message after [`GuardError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Acknowledge: the work is done or being done elsewhere.
    Ack,
    /// Deliver again later; after `after` if given.
    RetryLater {
        /// When another try can succeed.
        after: Option<Duration>,
    },
    /// Retrying cannot help: park the message for a person.
    DeadLetter,
}

impl<E> GuardError<E> {
    /// What a consumer should do with the message.
    pub fn disposition(&self) -> Disposition {
        match self {
            GuardError::InProgress { retry_after } => Disposition::RetryLater {
                after: Some(*retry_after),
            },
            GuardError::Handler(_) => Disposition::RetryLater { after: None },
            GuardError::Store(e) if e.is_transient() => Disposition::RetryLater { after: None },
            GuardError::LeaseLost { .. } => Disposition::Ack,
            GuardError::Mismatch
            | GuardError::Invalid(_)
            | GuardError::Outcome(_)
            | GuardError::Store(_) => Disposition::DeadLetter,
        }
    }

    pub(super) fn from_store(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(e) => GuardError::Invalid(e),
            e => GuardError::Store(e),
        }
    }
}

impl<E: fmt::Display> fmt::Display for GuardError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardError::InProgress { retry_after } => write!(
                f,
                "another holder is working on this key; retry in {retry_after:?}"
            ),
            GuardError::Mismatch => f.write_str(
                "this key was used before with different content (fingerprint mismatch)",
            ),
            GuardError::Handler(e) => write!(f, "handler failed: {e}"),
            GuardError::LeaseLost { .. } => f.write_str(
                "the lease was lost before the outcome was stored; another holder has the key",
            ),
            GuardError::Invalid(e) => write!(f, "{e}"),
            GuardError::Outcome(e) => write!(f, "outcome encoding or decoding failed: {e}"),
            GuardError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for GuardError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GuardError::Handler(e) => Some(e),
            GuardError::Invalid(e) => Some(e),
            GuardError::Outcome(e) => Some(e.as_ref()),
            GuardError::Store(e) => Some(e),
            _ => None,
        }
    }
}
