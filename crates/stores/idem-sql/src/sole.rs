//! Holding a store as the cold tier of one process's memory hot tier
//! ([`Tier::hold_sole_front`](idem_core::tier::Tier::hold_sole_front)): a
//! session-level advisory lock (PostgreSQL's `pg_try_advisory_lock`,
//! MySQL's `GET_LOCK`) on a connection of its own, kept for the life of
//! the hold. The server lets the lock go when the session ends, so a
//! process that was killed leaves nothing behind for the next one.

use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use idem_core::tier::SoleFront;
#[cfg(feature = "mysql")]
use sqlx::MySqlConnection;
use sqlx::PgConnection;
use tokio::sync::oneshot;

use crate::error::store;
use crate::store::{Db, Inner};

/// How often the held connection is checked.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// The connection that holds the lock.
enum Held {
    Postgres(PgConnection),
    #[cfg(feature = "mysql")]
    MySql(MySqlConnection),
}

impl Inner {
    /// Takes the lock for the store's tables, or fails saying who must
    /// change what.
    pub(crate) async fn hold_sole_front(self: &Arc<Self>) -> Result<SoleFront, StoreError> {
        let held = self.take_lock().await?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(watch(self.clone(), held, stopped));
        Ok(SoleFront::holding(stop))
    }

    /// The lock's name: one per table prefix, so stores on other tables
    /// of the same database are not held.
    fn sole_front_name(&self) -> String {
        format!("idem:sole-front:{}", self.tables.prefix())
    }

    async fn take_lock(&self) -> Result<Held, StoreError> {
        let name = self.sole_front_name();
        let (held, taken) = match &self.db {
            Db::Postgres(pg) => {
                let mut conn = pg.pool.acquire().await.map_err(store)?.detach();
                let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(lock_number(&name))
                    .fetch_one(&mut conn)
                    .await
                    .map_err(store)?;
                (Held::Postgres(conn), taken)
            }
            #[cfg(feature = "mysql")]
            Db::MySql(my) => {
                let mut conn = my.pool.acquire().await.map_err(store)?.detach();
                let taken: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&name)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(store)?;
                (Held::MySql(conn), taken == Some(1))
            }
        };
        if !taken {
            return Err(StoreError::unavailable(format!(
                "another process has the {} as the cold tier of its memory hot tier (lock {name:?}); \
                 processes with memory hot tiers share no claims, so two on one cold tier could each \
                 run the same key: give every process one Redis hot tier (--hot-store redis://…), \
                 or stop the other process first",
                self.description
            )));
        }
        Ok(held)
    }
}

/// Checks the held connection every few seconds until the hold is
/// dropped; a connection that was lost (the database restarted) is
/// replaced and the lock taken again, loudly when another process has it
/// meanwhile.
async fn watch(inner: Arc<Inner>, mut held: Held, mut stopped: oneshot::Receiver<()>) {
    let mut ticks = tokio::time::interval(WATCH_EVERY);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = ticks.tick() => {}
        }
        let alive = match &mut held {
            Held::Postgres(c) => sqlx::query("SELECT 1").execute(c).await.is_ok(),
            #[cfg(feature = "mysql")]
            Held::MySql(c) => sqlx::query("SELECT 1").execute(c).await.is_ok(),
        };
        if alive {
            continue;
        }
        match inner.take_lock().await {
            Ok(again) => {
                tracing::warn!(
                    "the connection holding the cold tier as this process's was lost; held again"
                );
                held = again;
            }
            Err(e) => tracing::error!(
                error = %e,
                "the connection holding the cold tier as this process's was lost, and the lock cannot be taken again; retrying"
            ),
        }
    }
}

/// A 64-bit advisory lock number for `name` (FNV-1a): the same in every
/// process and every build.
fn lock_number(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}
