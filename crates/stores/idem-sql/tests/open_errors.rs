//! Opening a store: TLS where the URL asks for it, and a clear error when
//! the database is unreachable, unknown, refuses the login, or the user
//! lacks rights. Passwords never appear in errors.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_sql::{OpenError, SqlStore};

async fn open_err(url: &str) -> OpenError {
    match SqlStore::builder(url)
        .timeout(Duration::from_secs(3))
        .connect()
        .await
    {
        Ok(_) => panic!("{url} should not open"),
        Err(e) => e,
    }
}

/// Whether the database at `url` answers at all; skips (or fails in CI)
/// when not.
async fn reachable(service: &str, url: &str) -> bool {
    match SqlStore::builder(url).table("idem_probe").connect().await {
        Ok(_) => true,
        Err(e) => idem_testkit::services::absent::<()>(service, url, e).is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_unknown_databases_say_what_to_check() {
    for (scheme, port) in [("postgres", 1), ("mysql", 1)] {
        let url = format!("{scheme}://app:s3cret@127.0.0.1:{port}/test");
        let e = open_err(&url).await.to_string();
        assert!(e.contains("is the server running"), "{e}");
        assert!(e.contains("app:***@") && !e.contains("s3cret"), "{e}");
    }
    for (service, url) in support::databases() {
        if !reachable(service, &url).await {
            continue;
        }
        let (base, _) = url.rsplit_once('/').unwrap();
        let e = open_err(&format!("{base}/idem_no_such_database"))
            .await
            .to_string();
        assert!(
            e.contains("create the database or name one that exists"),
            "{e}"
        );
        let e = open_err(&format!("{base}/test?shards=0")).await.to_string();
        assert!(e.contains("1 to 256"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_rights_is_told_which_to_grant() {
    let pg = support::postgres_url();
    if reachable("PostgreSQL", &pg).await {
        // PostgreSQL 15 lets only the owner create tables in `public`.
        support::exec(
            &pg,
            "DO $$ BEGIN CREATE ROLE idem_no_rights LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        )
        .await;
        support::exec(&pg, "REVOKE CREATE ON SCHEMA public FROM PUBLIC").await;
        let url = pg.replacen("postgres@", "idem_no_rights@", 1);
        let prefix = support::fresh_prefix("rights");
        match SqlStore::builder(&url).table(&prefix).connect().await {
            Err(OpenError::Rights(m)) => assert!(m.contains("grant"), "{m}"),
            other => panic!("PostgreSQL: expected a rights error, got {:?}", other.err()),
        }
    }
    let my = support::mysql_url();
    if reachable("MySQL", &my).await {
        support::exec(&my, "CREATE USER IF NOT EXISTS 'idem_no_rights'@'%'").await;
        support::exec(&my, "GRANT SELECT ON test.* TO 'idem_no_rights'@'%'").await;
        let url = my.replacen("root@", "idem_no_rights@", 1);
        let prefix = support::fresh_prefix("rights");
        match SqlStore::builder(&url).table(&prefix).connect().await {
            Err(OpenError::Rights(m)) => assert!(m.contains("grant"), "{m}"),
            other => panic!("MySQL: expected a rights error, got {:?}", other.err()),
        }
    }
}

/// `sslmode=require` encrypts the store's connections: the server lists
/// them as TLS while the store is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_use_tls_when_the_url_asks() {
    let pg = support::postgres_url();
    if !reachable("PostgreSQL", &pg).await {
        return;
    }
    let ssl_on = support::count(&pg, "SELECT (current_setting('ssl') = 'on')::int::int8").await;
    if ssl_on != 1 {
        let _ = idem_testkit::services::absent::<()>("PostgreSQL with ssl = on", &pg, "ssl is off");
        return;
    }
    let sep = if pg.contains('?') { '&' } else { '?' };
    let url = format!("{pg}{sep}sslmode=require&application_name=idem_tls_test");
    let store = SqlStore::builder(&url)
        .table("idem_tls")
        .connect()
        .await
        .unwrap();
    let tls = support::count(
        &pg,
        "SELECT COUNT(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE s.ssl AND a.application_name = 'idem_tls_test'",
    )
    .await;
    assert!(tls >= 1, "the store's connections are encrypted");
    let plain = support::count(
        &pg,
        "SELECT COUNT(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE NOT s.ssl AND a.application_name = 'idem_tls_test'",
    )
    .await;
    assert_eq!(plain, 0);
    drop(store);
    // And the URL decides: `sslmode=disable` connects in the clear.
    let url = format!("{pg}{sep}sslmode=disable&application_name=idem_plain_test");
    let _store = SqlStore::builder(&url)
        .table("idem_tls")
        .connect()
        .await
        .unwrap();
    let plain = support::count(
        &pg,
        "SELECT COUNT(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE NOT s.ssl AND a.application_name = 'idem_plain_test'",
    )
    .await;
    assert!(plain >= 1);
}
