//! Opening stores on the test databases.

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
