//! The transactional sink: a consumer's effect written as a row of an
//! effects table by the transaction that records the message's key in
//! idem-sql's [`Inbox`], on the run's PostgreSQL or MariaDB. The consumer
//! calls the recording sink inside that transaction, so a kill or a cut
//! session there ends it before its commit.
//!
//! Checked at the end: every message's key has exactly one row (none for a
//! poison message), whatever was killed, cut or restarted meanwhile.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::HandlerError;
use idem_core::Key;
use idem_sql::{Claimed, Inbox, InboxError, SqlConnection};
use sqlx::pool::PoolOptions;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};

/// A database of the run's: the store's server, through the same link.
#[derive(Clone)]
pub enum Db {
    Postgres(PgPool),
    MySql(MySqlPool),
}

impl Db {
    /// Connects to the database of the SQL store URL `store_url`, without
    /// idem's own parameters (`table=`, `shards=`, …). With `idle`, the
    /// server ends a session that sits that long inside a transaction (a
    /// holder stopped mid-call): its inbox row would otherwise block the
    /// redelivery's claim for as long as the holder stays stopped.
    pub async fn connect(store_url: &str, idle: Option<Duration>) -> Result<Self, String> {
        let url = database_url(store_url);
        let failed = |e: sqlx::Error| format!("{}: {e}", idem_sql::redacted(&url));
        if url.starts_with("postgres") {
            let set = idle.map(|d| {
                format!(
                    "SET idle_in_transaction_session_timeout = {}",
                    d.as_millis().max(1)
                )
            });
            Ok(Db::Postgres(
                options(set).connect(&url).await.map_err(failed)?,
            ))
        } else if url.starts_with("mysql") || url.starts_with("mariadb") {
            // MariaDB counts whole seconds.
            let set = idle.map(|d| {
                format!(
                    "SET SESSION idle_transaction_timeout = {}",
                    d.as_secs().max(1)
                )
            });
            Ok(Db::MySql(options(set).connect(&url).await.map_err(failed)?))
        } else {
            Err(format!(
                "the inbox lives in PostgreSQL or MariaDB, not at {}",
                idem_sql::redacted(&url)
            ))
        }
    }

    async fn execute(&self, sql: String) -> Result<(), String> {
        let done = match self {
            Db::Postgres(p) => sqlx::raw_sql(AssertSqlSafe(sql)).execute(p).await.map(drop),
            Db::MySql(p) => sqlx::raw_sql(AssertSqlSafe(sql)).execute(p).await.map(drop),
        };
        done.map_err(|e| format!("the inbox tables: {e}"))
    }

    async fn close(&self) {
        match self {
            Db::Postgres(p) => p.close().await,
            Db::MySql(p) => p.close().await,
        }
    }
}

/// A pool whose connections run `set` first.
fn options<DB>(set: Option<String>) -> PoolOptions<DB>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    PoolOptions::new().after_connect(move |conn, _| {
        let set = set.clone();
        Box::pin(async move {
            if let Some(set) = set {
                sqlx::raw_sql(AssertSqlSafe(set)).execute(conn).await?;
            }
            Ok(())
        })
    })
}

/// `url` without the query parameters that are idem's, not the driver's.
fn database_url(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(n, _)| n);
            !matches!(name, "table" | "shards" | "pool_size" | "lock_timeout")
        })
        .collect();
    if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// The run's inbox and effects tables: `{name}` and `{name}_fx`.
#[derive(Clone)]
pub struct Tables {
    db: Db,
    inbox: Inbox,
    effects: Arc<str>,
}

impl Tables {
    /// The tables named after `name` in the database of `store_url`;
    /// `idle` as [`Db::connect`] takes it.
    pub async fn open(store_url: &str, name: &str, idle: Option<Duration>) -> Result<Self, String> {
        let inbox = Inbox::new(name).map_err(|e| e.to_string())?;
        Ok(Self {
            db: Db::connect(store_url, idle).await?,
            inbox,
            effects: format!("{name}_fx").into(),
        })
    }

    /// Creates both tables (for the run, before its consumers start).
    pub async fn create(&self) -> Result<(), String> {
        let id = match self.db {
            Db::Postgres(_) => "BIGSERIAL PRIMARY KEY",
            Db::MySql(_) => "BIGINT AUTO_INCREMENT PRIMARY KEY",
        };
        self.db
            .execute(format!(
                "CREATE TABLE {} (id {id}, k VARCHAR(64) NOT NULL, token BIGINT NOT NULL, \
                 process BIGINT NOT NULL)",
                self.effects
            ))
            .await?;
        match &self.db {
            Db::Postgres(p) => self.inbox.install(p).await,
            Db::MySql(p) => self.inbox.install(p).await,
        }
        .map_err(|e| format!("the inbox table: {e}"))
    }

    /// The tokens of the committed effect rows, per key.
    pub async fn effects(&self) -> Result<HashMap<String, Vec<u64>>, String> {
        let sql = format!("SELECT k, token FROM {}", self.effects);
        let rows: Vec<(String, i64)> = match &self.db {
            Db::Postgres(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await,
            Db::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await,
        }
        .map_err(|e| format!("reading the effects table: {e}"))?;
        let mut committed: HashMap<String, Vec<u64>> = HashMap::new();
        for (k, token) in rows {
            committed.entry(k).or_default().push(token as u64);
        }
        Ok(committed)
    }

    /// Drops both tables and closes the pool.
    pub async fn drop_all(self) {
        let _ = self
            .db
            .execute(format!("DROP TABLE IF EXISTS {}", self.effects))
            .await;
        let _ = self
            .db
            .execute(format!("DROP TABLE IF EXISTS {}", self.inbox.table()))
            .await;
        self.db.close().await;
    }

    /// Handles message `key` (token `token`, process `process`) in one
    /// transaction: records the key in the inbox, writes the effect row,
    /// calls `sink` (the recording sink, which may kill this process), and
    /// commits. A key recorded before is answered without an effect.
    pub async fn handle<F>(
        &self,
        key: &str,
        token: u64,
        process: u32,
        sink: F,
    ) -> Result<Bytes, HandlerError>
    where
        F: Future<Output = Result<Bytes, HandlerError>>,
    {
        let effect = Effect {
            inbox: &self.inbox,
            key: Key::new("chaos", key.to_owned())
                .map_err(|e| HandlerError::permanent(e.to_string()))?,
            row: (
                key.to_owned(),
                i64::try_from(token).map_err(HandlerError::permanent)?,
                i64::from(process),
            ),
        };
        let insert = |(a, b, c): (&str, &str, &str)| {
            format!(
                "INSERT INTO {} (k, token, process) VALUES ({a}, {b}, {c})",
                self.effects
            )
        };
        match &self.db {
            Db::Postgres(pool) => effect.apply(pool, insert(("$1", "$2", "$3")), sink).await,
            Db::MySql(pool) => effect.apply(pool, insert(("?", "?", "?")), sink).await,
        }
    }
}

/// One message's transaction.
struct Effect<'a> {
    inbox: &'a Inbox,
    key: Key,
    /// The effect row: key, token, process.
    row: (String, i64, i64),
}

impl Effect<'_> {
    async fn apply<DB, F>(
        self,
        pool: &sqlx::Pool<DB>,
        insert: String,
        sink: F,
    ) -> Result<Bytes, HandlerError>
    where
        DB: sqlx::Database,
        DB::Connection: SqlConnection,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
        for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        F: Future<Output = Result<Bytes, HandlerError>>,
    {
        // The database's own errors (a session ended, a server restarting)
        // are retried with the whole transaction.
        let db = |e: sqlx::Error| HandlerError::transient(format!("the effects table: {e}"));
        let mut tx = pool.begin().await.map_err(db)?;
        if self.inbox.claim(&mut *tx, &self.key).await.map_err(claim)? == Claimed::Duplicate {
            return Ok(Bytes::from_static(b"handled before"));
        }
        let (k, token, process) = self.row;
        sqlx::query(AssertSqlSafe(insert))
            .bind(k)
            .bind(token)
            .bind(process)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let body = sink.await?;
        tx.commit().await.map_err(db)?;
        Ok(body)
    }
}

/// An inbox failure as the handler reports it: a database that is busy or
/// gone is retried, anything else (the table missing) refuses the message.
fn claim(e: InboxError) -> HandlerError {
    if e.is_transient() {
        HandlerError::transient(e)
    } else {
        HandlerError::permanent(e)
    }
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn the_database_url_keeps_only_the_drivers_parameters() {
        assert_eq!(
            database_url("postgres://p@h:5432/test?table=chaos_x"),
            "postgres://p@h:5432/test"
        );
        assert_eq!(
            database_url("mysql://r@h/test?shards=2&ssl-mode=DISABLED&table=t"),
            "mysql://r@h/test?ssl-mode=DISABLED"
        );
        assert_eq!(database_url("postgres://h/test"), "postgres://h/test");
    }
}
