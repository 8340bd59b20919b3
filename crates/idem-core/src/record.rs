//! The record and the answers of the store's operations (docs/contract.md §1–§2).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use crate::{Fingerprint, Key, Namespace, Timestamp};

/// A fencing token: strictly increasing per key across every acquisition,
/// never reused, also after a record expired or was released.
///
/// A downstream sink that remembers the highest token it has seen for a key
/// can refuse a write from a holder whose lease was taken over.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token (read back from storage or the wire).
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "token#{}", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// How long a claim is held without being extended.
///
/// Must be longer than zero and at most [`Limits::max_lease`](crate::Limits)
/// (7 days by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lease(Duration);

impl Lease {
    /// A lease of `d`.
    pub const fn new(d: Duration) -> Self {
        Self(d)
    }

    /// A lease of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// A lease of `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    /// Its length.
    pub const fn duration(self) -> Duration {
        self.0
    }
}

/// One stored record. Absent means never seen, or expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Someone holds the key and is working on it.
    InProgress(InProgress),
    /// The work is done and its outcome stored.
    Completed(Completed),
}

impl Record {
    /// The token of the last acquisition.
    pub fn token(&self) -> FencingToken {
        match self {
            Record::InProgress(r) => r.token,
            Record::Completed(r) => r.token,
        }
    }

    /// Which state the record is in.
    pub fn state(&self) -> RecordState {
        match self {
            Record::InProgress(_) => RecordState::InProgress,
            Record::Completed(_) => RecordState::Completed,
        }
    }
}

/// The fields of an `in_progress` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InProgress {
    /// The holder's fencing token.
    pub token: FencingToken,
    /// The fingerprint given to `begin`, if any.
    pub fingerprint: Option<Fingerprint>,
    /// When the holder's lease runs out unless extended.
    pub lease_expires_at: Timestamp,
    /// How many acquisitions this record has seen (1, then +1 per takeover).
    pub attempts: u32,
    /// When the current holder acquired it.
    pub started_at: Timestamp,
}

/// The fields of a `completed` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The token that completed it.
    pub token: FencingToken,
    /// The fingerprint given to `begin`, if any.
    pub fingerprint: Option<Fingerprint>,
    /// The stored outcome, returned to every duplicate.
    pub outcome: Option<Bytes>,
    /// When it was completed.
    pub completed_at: Timestamp,
    /// When it is forgotten (retention); after that the key is absent again.
    pub expires_at: Timestamp,
}

/// A record's state, for filtering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// `in_progress`.
    InProgress,
    /// `completed`.
    Completed,
}

/// What `begin` found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Begin {
    /// The caller now holds the key: do the work, then `complete` or `release`.
    Acquired(Claim),
    /// Another holder's lease is live: try again after `retry_after`.
    InProgress {
        /// Time left on the other holder's lease (at least 1 ms).
        retry_after: Duration,
    },
    /// The work was done before: here is its outcome. Do not run it again.
    Completed {
        /// The stored outcome.
        outcome: Option<Bytes>,
        /// When it was completed.
        completed_at: Timestamp,
    },
    /// A record exists for this key with a different fingerprint: the key was
    /// reused for different content. Never treated as new.
    Mismatch,
}

/// A successful acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The fencing token to pass to `complete`, `release` and `extend`.
    pub token: FencingToken,
    /// When the lease runs out unless extended.
    pub lease_expires_at: Timestamp,
    /// 1 for a first acquisition, more after takeovers of expired leases.
    pub attempt: u32,
}

/// The answer of an operation that needs the caller to own the record.
///
/// A token owns a record while the record is `in_progress` under that token
/// and its lease is live. Once the lease has run out the token is stale,
/// whether or not someone has taken over yet: a lease is a promise with an
/// end, and every store keeps it the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Fenced<T = ()> {
    /// The token owned the record and the operation took effect.
    Ok(T),
    /// The token does not own the record: nothing changed.
    Stale,
}

impl<T> Fenced<T> {
    /// Whether the token was stale.
    pub fn is_stale(&self) -> bool {
        matches!(self, Fenced::Stale)
    }

    /// Maps the value of `Ok`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Ok(t) => Fenced::Ok(f(t)),
            Fenced::Stale => Fenced::Stale,
        }
    }
}

/// One item of [`Store::begin_many`](crate::Store::begin_many).
#[derive(Clone, Debug)]
pub struct BeginItem {
    /// The key.
    pub key: Key,
    /// The content's fingerprint, if the caller has one.
    pub fingerprint: Option<Fingerprint>,
    /// The lease to take.
    pub lease: Lease,
}

/// One item of [`Store::complete_many`](crate::Store::complete_many).
#[derive(Clone, Debug)]
pub struct CompleteItem {
    /// The key.
    pub key: Key,
    /// The token `begin` returned.
    pub token: FencingToken,
    /// The outcome to store.
    pub outcome: Option<Bytes>,
    /// How long to keep the completed record.
    pub retention: Duration,
}

/// A record found by [`Store::scan`](crate::Store::scan).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its key.
    pub key: Key,
    /// The record.
    pub record: Record,
}

/// Which records [`Store::scan`](crate::Store::scan) lists: one namespace, in
/// key order, one page at a time.
///
/// ```
/// use idem_core::{Namespace, RecordState, ScanQuery, Timestamp};
/// // In-progress records of `orders` started before some time: stuck work.
/// let query = ScanQuery::new(Namespace::new("orders")?)
///     .state(RecordState::InProgress)
///     .older_than(Timestamp::from_millis(1_700_000_000_000))
///     .limit(100);
/// # Ok::<_, idem_core::InvalidInput>(())
/// ```
#[derive(Clone, Debug)]
pub struct ScanQuery {
    /// The namespace to list.
    pub namespace: Namespace,
    /// Only records in this state.
    pub state: Option<RecordState>,
    /// Only records started (in progress) or completed before this time.
    pub older_than: Option<Timestamp>,
    /// Only keys after this one (exclusive): the last key of the previous page.
    pub after: Option<Bytes>,
    /// At most this many records.
    pub limit: usize,
}

impl ScanQuery {
    /// Every record of `namespace`, 1 000 at a time.
    pub fn new(namespace: Namespace) -> Self {
        Self {
            namespace,
            state: None,
            older_than: None,
            after: None,
            limit: 1_000,
        }
    }

    /// Only records in `state`.
    pub fn state(mut self, state: RecordState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records started or completed before `t`.
    pub fn older_than(mut self, t: Timestamp) -> Self {
        self.older_than = Some(t);
        self
    }

    /// Only keys after `key`.
    pub fn after(mut self, key: impl Into<Bytes>) -> Self {
        self.after = Some(key.into());
        self
    }

    /// At most `limit` records.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Whether `record` (already known to be live) passes the filters.
    pub fn admits(&self, record: &Record) -> bool {
        let (state, since) = match record {
            Record::InProgress(r) => (RecordState::InProgress, r.started_at),
            Record::Completed(r) => (RecordState::Completed, r.completed_at),
        };
        self.state.is_none_or(|s| s == state) && self.older_than.is_none_or(|t| since < t)
    }
}
