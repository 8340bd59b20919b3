//! Opening stores on the test databases.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]
#![allow(dead_code)]

use std::time::Duration;

use idem_sql::{SqlStore, SqlStoreBuilder};
use idem_testkit::{Subject, TimeControl, services};

/// The PostgreSQL test database (`IDEM_TEST_POSTGRES_URL`).
pub fn postgres_url() -> String {
    services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// The MySQL/MariaDB test database (`IDEM_TEST_MYSQL_URL`).
pub fn mysql_url() -> String {
    services::url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// A store on `url`, or `None` (skipped, with the reason printed) when the
/// database cannot be used here.
pub async fn open(
    service: &str,
    url: &str,
    configure: impl FnOnce(SqlStoreBuilder) -> SqlStoreBuilder,
) -> Option<SqlStore> {
    let builder = configure(SqlStore::builder(url).timeout(Duration::from_secs(10)));
    match builder.connect().await {
        Ok(store) => Some(store),
        Err(e) => services::absent(service, url, e),
    }
}

/// A conformance subject: the database keeps time, so the suite sleeps,
/// 100 ms a step.
pub fn subject(store: SqlStore) -> Subject<SqlStore> {
    Subject::new(
        store,
        TimeControl::Real {
            unit: Duration::from_millis(100),
        },
    )
}

/// Both test databases: (service name, URL).
pub fn databases() -> [(&'static str, String); 2] {
    [("PostgreSQL", postgres_url()), ("MySQL", mysql_url())]
}

/// A table prefix no other run uses, for tests that make and drop tables.
pub fn fresh_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("idem_{name}_{}_{nanos}", std::process::id())
}

/// Drops the tables of `store`: its record tables, its token high-water
/// marks and its schema table.
pub async fn drop_tables(store: &SqlStore, url: &str) {
    let tables = store.tables();
    let mut names: Vec<String> = tables.all().map(|t| t.to_string()).collect();
    names.push(format!("{}_tokens", tables.prefix()));
    names.push(format!("{}_schema", tables.prefix()));
    for name in names {
        let sql = if url.starts_with("postgres") {
            format!("DROP TABLE IF EXISTS \"{name}\"")
        } else {
            format!("DROP TABLE IF EXISTS `{name}`")
        };
        exec(url, &sql).await;
    }
}

/// Runs one statement on the database at `url`, on a connection of its own.
pub async fn exec(url: &str, sql: &str) -> u64 {
    use sqlx::{AssertSqlSafe, Connection, Executor};
    let sql = AssertSqlSafe(sql.to_owned());
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        c.execute(sql).await.unwrap().rows_affected()
    } else {
        let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
        c.execute(sql).await.unwrap().rows_affected()
    }
}

/// The number in the first column of the first row of `sql`.
pub async fn count(url: &str, sql: &str) -> i64 {
    use sqlx::{AssertSqlSafe, Connection, Row};
    let sql = AssertSqlSafe(sql.to_owned());
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(sql)
            .fetch_one(&mut c)
            .await
            .unwrap()
            .get::<i64, _>(0)
    } else {
        let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
        sqlx::query(sql)
            .fetch_one(&mut c)
            .await
            .unwrap()
            .get::<i64, _>(0)
    }
}
