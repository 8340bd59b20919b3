//! Limits on what a store accepts, and the errors for input beyond them.

use std::time::Duration;

use bytes::Bytes;

use crate::tier::ImportItem;
use crate::{BeginItem, CompleteItem, Key, Lease};

/// What a store accepts. Every store checks these before it touches a record,
/// so a rejected call changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes, without the namespace. Default 255.
    pub max_key_bytes: usize,
    /// Longest lease. Default 7 days.
    pub max_lease: Duration,
    /// Longest retention of a completed record. Default 365 days.
    pub max_retention: Duration,
    /// Largest stored outcome, in bytes. Default 1 MiB.
    pub max_outcome_bytes: usize,
    /// Most items in one `begin_many` or `complete_many`. Default 10 000.
    pub max_batch: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: 255,
            max_lease: Duration::from_secs(7 * 24 * 3600),
            max_retention: Duration::from_secs(365 * 24 * 3600),
            max_outcome_bytes: 1024 * 1024,
            max_batch: 10_000,
        }
    }
}

impl Limits {
    /// Checks a key's length.
    pub fn check_key(&self, key: &Key) -> Result<(), InvalidInput> {
        let len = key.bytes().len();
        if len > self.max_key_bytes {
            return Err(InvalidInput::KeyTooLong {
                len,
                limit: self.max_key_bytes,
            });
        }
        Ok(())
    }

    /// Checks a lease's length.
    pub fn check_lease(&self, lease: Lease) -> Result<(), InvalidInput> {
        let d = lease.duration();
        if d < Duration::from_millis(1) {
            return Err(InvalidInput::LeaseTooShort);
        }
        if d > self.max_lease {
            return Err(InvalidInput::LeaseTooLong {
                lease: d,
                limit: self.max_lease,
            });
        }
        Ok(())
    }

    /// Checks a retention's length.
    pub fn check_retention(&self, retention: Duration) -> Result<(), InvalidInput> {
        if retention < Duration::from_millis(1) {
            return Err(InvalidInput::RetentionTooShort);
        }
        if retention > self.max_retention {
            return Err(InvalidInput::RetentionTooLong {
                retention,
                limit: self.max_retention,
            });
        }
        Ok(())
    }

    /// Checks an outcome's size.
    pub fn check_outcome(&self, outcome: Option<&Bytes>) -> Result<(), InvalidInput> {
        let len = outcome.map_or(0, Bytes::len);
        if len > self.max_outcome_bytes {
            return Err(InvalidInput::OutcomeTooLarge {
                len,
                limit: self.max_outcome_bytes,
            });
        }
        Ok(())
    }

    /// Checks the arguments of `begin`.
    pub fn check_begin(&self, key: &Key, lease: Lease) -> Result<(), InvalidInput> {
        self.check_key(key)?;
        self.check_lease(lease)
    }

    /// Checks the arguments of `complete`.
    pub fn check_complete(
        &self,
        key: &Key,
        outcome: Option<&Bytes>,
        retention: Duration,
    ) -> Result<(), InvalidInput> {
        self.check_key(key)?;
        self.check_outcome(outcome)?;
        self.check_retention(retention)
    }

    /// Checks a batch's size.
    pub fn check_batch(&self, len: usize) -> Result<(), InvalidInput> {
        if len > self.max_batch {
            return Err(InvalidInput::BatchTooLarge {
                len,
                limit: self.max_batch,
            });
        }
        Ok(())
    }

    /// Checks every item of a `begin_many`, naming the first bad one.
    pub fn check_begin_items(&self, items: &[BeginItem]) -> Result<(), InvalidInput> {
        self.check_batch(items.len())?;
        for (index, item) in items.iter().enumerate() {
            self.check_begin(&item.key, item.lease)
                .map_err(|e| e.in_item(index))?;
        }
        Ok(())
    }

    /// Checks every item of a `complete_many`, naming the first bad one.
    pub fn check_complete_items(&self, items: &[CompleteItem]) -> Result<(), InvalidInput> {
        self.check_batch(items.len())?;
        for (index, item) in items.iter().enumerate() {
            self.check_complete(&item.key, item.outcome.as_ref(), item.retention)
                .map_err(|e| e.in_item(index))?;
        }
        Ok(())
    }

    /// Checks an `import_many` batch: its size, and each record's key and
    /// outcome.
    pub fn check_import_items(&self, items: &[ImportItem]) -> Result<(), InvalidInput> {
        self.check_batch(items.len())?;
        for (index, item) in items.iter().enumerate() {
            self.check_key(&item.key)
                .and_then(|()| self.check_outcome(item.record.outcome.as_ref()))
                .map_err(|e| e.in_item(index))?;
        }
        Ok(())
    }
}

/// Input a store refuses. The message says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The namespace breaks `[A-Za-z0-9_.-]{1,64}`.
    #[error("namespace {namespace:?} is not valid: {reason}")]
    Namespace {
        /// The namespace given (cut to 80 characters).
        namespace: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The key is empty.
    #[error("the key is empty; give 1 or more bytes")]
    EmptyKey,
    /// The key is longer than the limit.
    #[error("key is {len} bytes; the limit is {limit} (set `max_key_bytes`)")]
    KeyTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A stored key could not be read back.
    #[error("an encoded key is malformed")]
    EncodedKey,
    /// The lease is zero (shorter than 1 ms).
    #[error("lease must be at least 1 ms")]
    LeaseTooShort,
    /// The lease is longer than the limit.
    #[error("lease of {lease:?} is longer than the limit of {limit:?} (set `max_lease`)")]
    LeaseTooLong {
        /// The lease asked for.
        lease: Duration,
        /// The limit.
        limit: Duration,
    },
    /// The retention is zero (shorter than 1 ms).
    #[error("retention must be at least 1 ms")]
    RetentionTooShort,
    /// The retention is longer than the limit.
    #[error(
        "retention of {retention:?} is longer than the limit of {limit:?} (set `max_retention`)"
    )]
    RetentionTooLong {
        /// The retention asked for.
        retention: Duration,
        /// The limit.
        limit: Duration,
    },
    /// The outcome is larger than the limit.
    #[error("outcome is {len} bytes; the limit is {limit} (set `max_outcome_bytes`)")]
    OutcomeTooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The batch has more items than the limit.
    #[error("batch has {len} items; the limit is {limit} (split it, or set `max_batch`)")]
    BatchTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// One item of a batch is bad; the whole batch was refused.
    #[error("batch item {index}: {error}")]
    InItem {
        /// The item's position, from 0.
        index: usize,
        /// What is wrong with it.
        error: Box<InvalidInput>,
    },
}

impl InvalidInput {
    fn in_item(self, index: usize) -> Self {
        InvalidInput::InItem {
            index,
            error: Box::new(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_change() {
        let limits = Limits::default();
        let key = Key::new("n", vec![b'k'; 300]).unwrap();
        assert_eq!(
            limits.check_key(&key).unwrap_err().to_string(),
            "key is 300 bytes; the limit is 255 (set `max_key_bytes`)"
        );
        let items = vec![
            BeginItem {
                key: Key::new("n", "ok").unwrap(),
                fingerprint: None,
                lease: Lease::from_secs(1),
            },
            BeginItem {
                key: Key::new("n", "ok").unwrap(),
                fingerprint: None,
                lease: Lease::from_secs(0),
            },
        ];
        assert_eq!(
            limits.check_begin_items(&items).unwrap_err().to_string(),
            "batch item 1: lease must be at least 1 ms"
        );
    }
}
