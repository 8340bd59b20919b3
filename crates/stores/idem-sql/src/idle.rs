//! Idle connections a server restart broke are found before a call uses
//! them.
//!
//! sqlx tests a connection as it goes back to the pool, not as it comes
//! out (a second round trip on every call). A server restart breaks every
//! idle connection at once, and each would then fail one call: with a pool
//! of 16, a caller retrying with backoff met broken connections for
//! seconds after the server was back. So the first call that finds a
//! connection broken marks the time, and a connection that was already
//! idle then is pinged before its next use; so is one idle for longer than
//! [`LONG_IDLE`] (a restart while the store was quiet, or a firewall that
//! dropped it). Calls in flight at the break still fail, once each.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sqlx::Connection;
use sqlx::pool::PoolConnectionMetadata;

/// An idle connection older than this is pinged before use.
pub(crate) const LONG_IDLE: Duration = Duration::from_secs(60);

/// The process's reference point for [`BROKEN_AT`].
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// When a call in this process last found a database connection broken,
/// in milliseconds after [`EPOCH`] rounded up (0: never). It is one mark for
/// every store's pools: a break seen on one server costs the pools of
/// another at most a ping of each idle connection.
static BROKEN_AT: AtomicU64 = AtomicU64::new(0);

/// Notes that a call found its connection broken (`e` is an I/O error).
pub(crate) fn note(e: &sqlx::Error) {
    if broke(e) {
        let at = u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        BROKEN_AT.fetch_max(at, Ordering::Relaxed);
    }
}

/// Whether `e` says the connection broke: the server closed or reset it,
/// cannot be reached, or said it ended the session (PostgreSQL's
/// connection exceptions and shutdowns, MariaDB's killed connection and
/// shutdown, MySQL's idle timeout).
fn broke(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => match crate::error::mysql_number(db.as_ref()) {
            Some(n) => matches!(n, 1053 | 1927 | 4031),
            None => db
                .code()
                .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        },
        _ => false,
    }
}

/// Whether a connection idle for `idle_for` may be broken: it was idle
/// when a broken one was last found, or it has been idle a long time.
fn suspect(idle_for: Duration) -> bool {
    suspect_at(idle_for, BROKEN_AT.load(Ordering::Relaxed), EPOCH.elapsed())
}

/// [`suspect`] with the mark and the time since [`EPOCH`] given.
fn suspect_at(idle_for: Duration, broken_at: u64, now: Duration) -> bool {
    idle_for >= LONG_IDLE
        || (broken_at != 0 && idle_for >= now.saturating_sub(Duration::from_millis(broken_at)))
}

/// sqlx's `before_acquire` hook: pings a [`suspect`] connection, which the
/// pool closes if the ping fails (and then hands out another or opens one).
pub(crate) fn check<C: Connection>(
    conn: &mut C,
    meta: PoolConnectionMetadata,
) -> BoxFuture<'_, Result<bool, sqlx::Error>> {
    Box::pin(async move {
        if suspect(meta.idle_for) {
            conn.ping().await?;
        }
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn connections_idle_at_a_break_are_suspect_and_later_ones_not() {
        let now = 1000 * MS;
        assert!(!suspect_at(900 * MS, 0, now), "nothing broke yet");
        assert!(suspect_at(400 * MS, 600, now), "idle when it broke");
        assert!(suspect_at(400 * MS, 601, now), "idle since the mark's ms");
        assert!(!suspect_at(399 * MS, 600, now), "used after it broke");
        assert!(suspect_at(LONG_IDLE, 0, now), "idle for long");
        assert!(!suspect_at(LONG_IDLE - MS, 0, now));
    }

    #[test]
    fn only_an_io_error_marks_a_break() {
        assert!(!broke(&sqlx::Error::PoolTimedOut));
        assert!(!broke(&sqlx::Error::RowNotFound));
        let before = BROKEN_AT.load(Ordering::Relaxed);
        std::thread::sleep(5 * MS);
        note(&sqlx::Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
        let after = BROKEN_AT.load(Ordering::Relaxed);
        assert!(after > before, "{before} → {after}");
    }
}
