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

    /// The same error for another caller that met the same failure (each
    /// item of a batch that failed as a whole). An unavailable store's
    /// cause is copied as its message.
    pub fn copied(&self) -> StoreError {
        match self {
            StoreError::Invalid(e) => StoreError::Invalid(e.clone()),
            StoreError::CapacityExceeded { limit } => {
                StoreError::CapacityExceeded { limit: *limit }
            }
            StoreError::Unavailable(e) => StoreError::unavailable(e.to_string()),
            StoreError::Corrupt(what) => StoreError::Corrupt(what.clone()),
        }
    }

    /// Whether retrying later may succeed (the store was down or busy).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::CapacityExceeded { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_error_says_what_the_first_said_once() {
        let first = StoreError::unavailable("connection reset");
        let copy = first.copied();
        assert_eq!(copy.to_string(), first.to_string());
        assert_eq!(
            copy.to_string(),
            "the store is unavailable: connection reset"
        );
        assert!(copy.is_transient());
        let full = StoreError::CapacityExceeded { limit: 3 };
        assert_eq!(full.copied().to_string(), full.to_string());
        assert!(matches!(
            StoreError::Corrupt("x".into()).copied(),
            StoreError::Corrupt(m) if m == "x"
        ));
    }
}
