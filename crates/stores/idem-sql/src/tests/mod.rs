//! Tests that look inside the store: the plans of its statements and the
//! settings of its sessions, on the test databases.

mod admin;
mod plans;
mod sessions;

use std::time::Duration;

use idem_testkit::services;

use crate::{SqlStore, SqlStoreBuilder};

fn postgres_url() -> String {
    services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

fn mysql_url() -> String {
    services::url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// A store on `url`, or `None` (skipped, with the reason printed) when the
/// database cannot be used here.
async fn open(
    service: &str,
    url: &str,
    configure: impl FnOnce(SqlStoreBuilder) -> SqlStoreBuilder,
) -> Option<SqlStore> {
    let builder = configure(
        SqlStore::builder(url)
            .timeout(Duration::from_secs(10))
            .sweep_interval(None),
    );
    match builder.connect().await {
        Ok(store) => Some(store),
        Err(e) => services::absent(service, url, e),
    }
}

/// A table prefix no other run uses.
fn fresh_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("idem_{name}_{}_{nanos}", std::process::id())
}
