//! How database errors become store errors, and which are worth retrying.

use idem_core::StoreError;

/// A database error met during an operation: the store is unavailable for
/// now (the server is down, a connection broke, the pool is exhausted).
pub(crate) fn store(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(Box::new(e))
}

/// Whether the statement that failed with `e` was rolled back whole by the
/// server for a reason that goes away on a second try: a deadlock with a
/// concurrent batch or a serialization failure. The store runs it again.
pub(crate) fn retryable(e: &StoreError) -> bool {
    let StoreError::Unavailable(source) = e else {
        return false;
    };
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    // MySQL/MariaDB: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(my.number(), 1213 | 1205);
    }
    // PostgreSQL: serialization_failure, deadlock_detected.
    matches!(db.code().as_deref(), Some("40001" | "40P01"))
}
