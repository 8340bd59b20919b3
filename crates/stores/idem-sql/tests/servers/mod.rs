//! The real PostgreSQL and MariaDB the inbox and transition tests run
//! against (the URLs of `support`): pools, table names of this process, and
//! plain SQL on either.

#![allow(dead_code)] // each test file uses its part

use std::future::Future;
use std::time::Duration;

use idem_sql::SqlConnection;
use idem_testkit::services;
use sqlx::mysql::{MySqlConnection, MySqlPoolOptions};
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};

/// A pool of at most `connections` on the test PostgreSQL, or `None`
/// (skipped, or a panic under `CI`/`IDEM_REQUIRE_SERVICES`).
pub async fn postgres(connections: u32) -> Option<PgPool> {
    let url = crate::support::postgres_url();
    match PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
    {
        Ok(pool) => Some(pool),
        Err(e) => services::absent("PostgreSQL", &url, e),
    }
}

/// A pool of at most `connections` on the test MySQL/MariaDB, or `None`.
pub async fn mysql(connections: u32) -> Option<MySqlPool> {
    let url = crate::support::mysql_url();
    match MySqlPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
    {
        Ok(pool) => Some(pool),
        Err(e) => services::absent("MySQL/MariaDB", &url, e),
    }
}

/// `name` made unique to this process: tests running in parallel, and
/// reruns, never share a table.
pub fn table(name: &str) -> String {
    format!("{name}_{}", std::process::id())
}

/// Plain SQL with literal values on either database, to set up and check
/// what the code under test did.
pub trait Sql: SqlConnection {
    /// Runs `sql`; the rows it affected.
    fn run(&mut self, sql: &str) -> impl Future<Output = u64> + Send;
    /// The integer `sql` selects (a `COUNT(*)`).
    fn count(&mut self, sql: &str) -> impl Future<Output = i64> + Send;
    /// The text `sql` selects, if a row.
    fn text(&mut self, sql: &str) -> impl Future<Output = Option<String>> + Send;
}

macro_rules! impl_sql {
    ($conn:ty) => {
        impl Sql for $conn {
            fn run(&mut self, sql: &str) -> impl Future<Output = u64> + Send {
                let sql = sql.to_owned();
                async move {
                    sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                        .execute(self)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"))
                        .rows_affected()
                }
            }
            fn count(&mut self, sql: &str) -> impl Future<Output = i64> + Send {
                let sql = sql.to_owned();
                async move {
                    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.clone()))
                        .fetch_one(self)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"))
                }
            }
            fn text(&mut self, sql: &str) -> impl Future<Output = Option<String>> + Send {
                let sql = sql.to_owned();
                async move {
                    sqlx::query_scalar::<_, String>(AssertSqlSafe(sql.clone()))
                        .fetch_optional(self)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"))
                }
            }
        }
    };
}

impl_sql!(PgConnection);
impl_sql!(MySqlConnection);

/// Runs the generic test `$name(pool)` on PostgreSQL and on MySQL/MariaDB,
/// as the tests `$name::postgres` and `$name::mysql`, with pools of
/// `$connections`.
macro_rules! on_both {
    ($name:ident, $connections:expr) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(pool) = crate::servers::postgres($connections).await {
                    super::$name(pool).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                if let Some(pool) = crate::servers::mysql($connections).await {
                    super::$name(pool).await;
                }
            }
        }
    };
}

pub(crate) use on_both;
