//! How database errors become store errors, and which are worth retrying.

use idem_core::StoreError;

/// A database error met during an operation: the store is unavailable for
/// now (the server is down, a connection broke, the pool is exhausted, a
/// row stayed locked past the lock timeout).
pub(crate) fn store(e: sqlx::Error) -> StoreError {
    crate::idle::note(&e);
    if lock_timed_out(&e) {
        return StoreError::unavailable(LockTimeout(e));
    }
    StoreError::Unavailable(Box::new(e))
}

/// A statement waited longer than the session's lock timeout for a row
/// another transaction holds.
#[derive(Debug, thiserror::Error)]
#[error(
    "a row lock held by another transaction was not released within the store's lock timeout ({0}); \
     try again, and if such waits are expected raise lock_timeout (builder or `?lock_timeout=` in the store URL)"
)]
pub(crate) struct LockTimeout(#[source] pub(crate) sqlx::Error);

/// The MySQL or MariaDB error number of a database error; `None` for
/// PostgreSQL's (and in a build without the `mysql` feature).
pub(crate) fn mysql_number(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    #[cfg(feature = "mysql")]
    {
        db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(sqlx::mysql::MySqlDatabaseError::number)
    }
    #[cfg(not(feature = "mysql"))]
    {
        let _ = db;
        None
    }
}

/// Why a MySQL or MariaDB URL is refused by a build without the `mysql`
/// feature.
#[cfg(not(feature = "mysql"))]
pub(crate) fn no_mysql() -> String {
    "MySQL and MariaDB stores are not in this build: build with the `mysql` feature (the \
     `idem` binary: `cargo build --release --features mysql`, or `--features full`)"
        .to_owned()
}

/// MySQL's ER_LOCK_WAIT_TIMEOUT or PostgreSQL's lock_not_available.
pub(crate) fn lock_timed_out(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    match mysql_number(db.as_ref()) {
        Some(n) => n == 1205,
        None => db.code().as_deref() == Some("55P03"),
    }
}

/// Whether the statement that failed with `e` was rolled back whole by the
/// server for a reason that goes away on a second try: a deadlock with a
/// concurrent batch or a serialization failure. The store runs it again.
///
/// A lock wait that timed out is not retried: the lock's holder is busy
/// for longer than the timeout, and waiting again would only double the
/// time the caller waits for the same answer.
pub(crate) fn retryable(e: &StoreError) -> bool {
    let StoreError::Unavailable(source) = e else {
        return false;
    };
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    // MySQL/MariaDB: ER_LOCK_DEADLOCK.
    if let Some(n) = mysql_number(db.as_ref()) {
        return n == 1213;
    }
    // PostgreSQL: serialization_failure, deadlock_detected.
    matches!(db.code().as_deref(), Some("40001" | "40P01"))
}

/// `raise_token_floor` was asked for a floor the database's clock does not
/// pass within the time the store waits: the SQL stores' tokens follow
/// that clock, so they cannot be made to exceed the floor any sooner.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot raise the token floor to {floor}: the SQL store's tokens are at least the database's time in ms × 1024, \
     which is {clock_tokens} now and passes the floor only in {ahead_ms} ms, longer than the {waited_ms} ms the store waits; \
     raise the floor by less (the tokens advance 1024 a millisecond), or check the database server's clock"
)]
pub(crate) struct FloorAheadOfClock {
    pub(crate) floor: u64,
    pub(crate) clock_tokens: i64,
    pub(crate) ahead_ms: u64,
    pub(crate) waited_ms: u64,
}
