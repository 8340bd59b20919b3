//! A record row as both dialects read it back, and what it answers.

use bytes::Bytes;
use idem_core::machine::{Current, Decision, decide_begin, retry_after};
use idem_core::tier::ImportItem;
use idem_core::{
    Begin, Claim, Completed, Entry, FencingToken, Fingerprint, InProgress, Key, Namespace, Record,
    RecordState, ScanQuery, StoreError, Timestamp,
};

/// `state` of a released key: absent to every reader, but the next
/// acquisition continues from its token.
pub(crate) const RELEASED: i16 = 0;
/// `state` of an `in_progress` record.
pub(crate) const IN_PROGRESS: i16 = 1;
/// `state` of a `completed` record.
pub(crate) const COMPLETED: i16 = 2;

/// One row of a record table. Times are milliseconds on the database's
/// clock; `expires_at` is when the sweeper may delete the row.
#[derive(Debug)]
pub(crate) struct StoredRow {
    pub state: i16,
    pub token: i64,
    pub fingerprint: Option<Vec<u8>>,
    pub attempts: i32,
    pub started_at: i64,
    pub lease_until: i64,
    pub outcome: Option<Vec<u8>>,
    pub completed_at: i64,
    pub expires_at: i64,
}

impl StoredRow {
    /// What `begin` answers for this row, which the statement found and
    /// did not take; `None` when the row should have been taken (it
    /// changed under the statement), so the caller tries again.
    pub fn answer_begin(
        self,
        fingerprint: Option<Fingerprint>,
        now: i64,
    ) -> Result<Option<Begin>, StoreError> {
        let current = self.current(now)?;
        Ok(match decide_begin(current, fingerprint, ms(now)) {
            Decision::Acquire { .. } => None,
            Decision::Wait { .. } => Some(Begin::InProgress {
                retry_after: retry_after(ms(self.lease_until), ms(now)),
            }),
            Decision::Replay => Some(Begin::Completed {
                outcome: self.outcome.map(Bytes::from),
                completed_at: ms(self.completed_at),
            }),
            Decision::Mismatch => Some(Begin::Mismatch),
        })
    }

    fn current(&self, now: i64) -> Result<Current, StoreError> {
        let fingerprint = fingerprint(self.fingerprint.as_deref())?;
        Ok(match self.state {
            IN_PROGRESS => Current::InProgress {
                fingerprint,
                lease_expires_at: ms(self.lease_until),
                attempts: u32::try_from(self.attempts).unwrap_or(0),
            },
            COMPLETED if self.expires_at > now => Current::Completed { fingerprint },
            RELEASED | COMPLETED => Current::Absent,
            other => return Err(corrupt_state(other)),
        })
    }

    /// The record this row shows at `now`: `in_progress` rows until swept,
    /// `completed` rows within their retention, released keys never.
    pub fn record(self, now: i64) -> Result<Option<Record>, StoreError> {
        let fp = fingerprint(self.fingerprint.as_deref())?;
        Ok(match self.state {
            IN_PROGRESS => Some(Record::InProgress(InProgress {
                token: token(self.token),
                fingerprint: fp,
                lease_expires_at: ms(self.lease_until),
                attempts: u32::try_from(self.attempts).unwrap_or(0),
                started_at: ms(self.started_at),
            })),
            COMPLETED if self.expires_at > now => Some(Record::Completed(Completed {
                token: token(self.token),
                fingerprint: fp,
                outcome: self.outcome.map(Bytes::from),
                completed_at: ms(self.completed_at),
                expires_at: ms(self.expires_at),
            })),
            RELEASED | COMPLETED => None,
            other => return Err(corrupt_state(other)),
        })
    }
}

fn corrupt_state(state: i16) -> StoreError {
    StoreError::Corrupt(format!(
        "a record row has state {state}; idem writes 0, 1 or 2"
    ))
}

/// A fingerprint column: 16 bytes or NULL.
pub(crate) fn fingerprint(bytes: Option<&[u8]>) -> Result<Option<Fingerprint>, StoreError> {
    bytes
        .map(|b| {
            <[u8; 16]>::try_from(b)
                .map(Fingerprint::from_bytes)
                .map_err(|_| {
                    StoreError::Corrupt(format!(
                        "a stored fingerprint is {} bytes; idem writes 16",
                        b.len()
                    ))
                })
        })
        .transpose()
}

/// A millisecond column as a timestamp (the database's clock is after 1970).
pub(crate) fn ms(t: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(t).unwrap_or(0))
}

/// A token column (always positive).
pub(crate) fn token(t: i64) -> FencingToken {
    FencingToken::new(u64::try_from(t).unwrap_or(0))
}

/// A token as the column holds it: tokens are at most `i64::MAX`, since
/// they start from the clock in milliseconds × 1024.
pub(crate) fn token_column(t: FencingToken) -> i64 {
    i64::try_from(t.get()).unwrap_or(i64::MAX)
}

/// A timestamp as the millisecond columns hold it.
pub(crate) fn millis_column(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// The token of a record to import, as the column holds it; a token
/// beyond the column's range (which no idem store issues: the SQL and
/// Redis stores' follow the clock in milliseconds × 1024, the others count
/// from 1) is refused rather than stored as another token.
pub(crate) fn import_token(item: &ImportItem) -> Result<i64, StoreError> {
    token_in_range(
        item.record.token,
        &format!("the record to import for {}", item.key),
    )
}

/// `t` as the token columns hold it, or an error naming `what` carried it.
pub(crate) fn token_in_range(t: FencingToken, what: &str) -> Result<i64, StoreError> {
    i64::try_from(t.get()).map_err(|_| {
        StoreError::Corrupt(format!(
            "{what} has token {t}, beyond the largest the SQL store's token columns hold ({}); \
             no idem store issues such tokens",
            i64::MAX
        ))
    })
}

/// Whole milliseconds of `d`, as the columns count them.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl StoredRow {
    /// This row as the claim a `begin` just made.
    pub fn claim(&self) -> Begin {
        Begin::Acquired(Claim {
            token: token(self.token),
            lease_expires_at: ms(self.lease_until),
            attempt: u32::try_from(self.attempts).unwrap_or(1),
        })
    }

    /// This row of key `k` as a scan entry, if it shows a record at `now`.
    pub fn entry(
        self,
        namespace: &Namespace,
        k: Vec<u8>,
        now: i64,
    ) -> Result<Option<Entry>, StoreError> {
        let Some(record) = self.record(now)? else {
            return Ok(None);
        };
        let key = Key::in_namespace(namespace.clone(), k)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(Some(Entry { key, record }))
    }
}

/// A scan's filters as the statements bind them.
pub(crate) struct ScanFilter {
    /// Only rows in this state.
    pub state: Option<i16>,
    /// Only rows started or completed before this time.
    pub older_than: Option<i64>,
    /// At most this many rows.
    pub limit: i64,
}

impl ScanFilter {
    pub fn of(query: &ScanQuery) -> Self {
        Self {
            state: query.state.map(|s| match s {
                RecordState::InProgress => IN_PROGRESS,
                RecordState::Completed => COMPLETED,
            }),
            older_than: query
                .older_than
                .map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX)),
            limit: i64::try_from(query.limit).unwrap_or(i64::MAX),
        }
    }
}
