//! The store's error.

use crate::InvalidInput;

/// A boxed error from a store's backend.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation failed. `Stale` is not an error: it is an answer
/// ([`Fenced::Stale`](crate::Fenced)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The input was refused before anything was touched.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The store holds as many records as it may; live records are never
    /// dropped to make room, since that would let a duplicate through.
    #[error(
        "the store holds its limit of {limit} records; raise the capacity, shorten retention, or add a store with more room"
    )]
    CapacityExceeded {
        /// The configured capacity.
        limit: usize,
    },
    /// The store could not be reached or could not write: retry later.
    #[error("the store is unavailable: {0}")]
    Unavailable(#[source] BoxError),
    /// A stored record could not be read.
    #[error("a stored record is corrupt: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Wraps a backend error that means "try again later".
    pub fn unavailable(e: impl Into<BoxError>) -> Self {
        StoreError::Unavailable(e.into())
    }

    /// Whether retrying later may succeed (the store was down or busy).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::CapacityExceeded { .. }
        )
    }
}
