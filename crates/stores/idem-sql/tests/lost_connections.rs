//! Connections the server drops (a restart, a failover, an administrator's
//! kill) cost at most the calls that were on them: the pool opens new ones
//! and the records are intact.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_core::{Begin, Key, Lease, Store};
use idem_sql::{SqlStore, SqlStoreBuilder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_recovers_when_the_server_kills_its_connections() {
    for (service, admin) in support::databases() {
        let Some(store) = own_store(service, &admin, "idem_lost", |b| b).await else {
            continue;
        };
        let key = |i: usize| Key::new("lost", format!("{}-{i}", std::process::id())).unwrap();
        let mut claims = Vec::new();
        for i in 0..20 {
            let Begin::Acquired(c) = store
                .begin(&key(i), None, Lease::from_secs(60))
                .await
                .unwrap()
            else {
                panic!("{service}: fresh key");
            };
            claims.push(c);
        }
        let killed = kill_connections(&admin, "idem_lost").await;
        assert!(
            killed >= 1,
            "{service}: the store's connections were killed"
        );
        // Calls may fail while the pool notices; within a few tries they work.
        for (i, c) in claims.iter().enumerate() {
            let mut tries = 0;
            let done = loop {
                tries += 1;
                match store
                    .complete(&key(i), c.token, Some("ok".into()), Duration::from_secs(60))
                    .await
                {
                    Ok(done) => break done,
                    Err(e) if tries < 5 && e.is_transient() => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("{service}: the store did not recover: {e}"),
                }
            };
            assert!(
                !done.is_stale(),
                "{service}: the claim survived the lost connection"
            );
        }
        for i in 0..20 {
            assert!(matches!(
                store
                    .begin(&key(i), None, Lease::from_secs(60))
                    .await
                    .unwrap(),
                Begin::Completed { .. }
            ));
        }
    }
}

/// A store whose connections the server knows by `name` (PostgreSQL's
/// application name, a MySQL user of that name), so that
/// [`kill_connections`] reaches them and no one else's.
async fn own_store(
    service: &str,
    admin: &str,
    name: &str,
    configure: impl FnOnce(SqlStoreBuilder) -> SqlStoreBuilder,
) -> Option<SqlStore> {
    let table = "idem_lost_connections";
    let url = if admin.starts_with("postgres") {
        let sep = if admin.contains('?') { '&' } else { '?' };
        format!("{admin}{sep}application_name={name}")
    } else {
        support::open(service, admin, |b| b.table(table)).await?;
        support::exec(admin, &format!("CREATE USER IF NOT EXISTS '{name}'@'%'")).await;
        support::exec(admin, &format!("GRANT ALL ON test.* TO '{name}'@'%'")).await;
        admin.replacen("root@", &format!("{name}@"), 1)
    };
    support::open(service, &url, |b| configure(b.table(table))).await
}

/// Kills the server side of every connection [`own_store`] named `name`;
/// how many there were.
async fn kill_connections(admin: &str, name: &str) -> i64 {
    if admin.starts_with("postgres") {
        return support::count(
            admin,
            &format!(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = '{name}'"
            ),
        )
        .await;
    }
    use sqlx::{Connection, Executor, Row};
    let mut c = sqlx::MySqlConnection::connect(admin).await.unwrap();
    let ids: Vec<i64> = sqlx::query("SELECT id FROM information_schema.processlist WHERE user = ?")
        .bind(name)
        .fetch_all(&mut c)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<i64, _>(0))
        .collect();
    for id in &ids {
        let _ = c.execute(sqlx::AssertSqlSafe(format!("KILL {id}"))).await;
    }
    ids.len() as i64
}

/// A server restart breaks every idle connection of the pool at once. The
/// first call that meets one fails; the pool then checks the others before
/// handing them out, so the calls after it work, however many broken
/// connections the pool held (each used to fail a call of its own, and a
/// caller retrying with backoff met them for seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_idle_connections_cost_one_call_not_one_each() {
    for (service, admin) in support::databases() {
        let Some(store) = own_store(service, &admin, "idem_idle_broken", |b| b.pool_size(8)).await
        else {
            continue;
        };
        let run = format!("{}-{}", std::process::id(), service);
        let key = |i: usize| Key::new("idle-broken", format!("{run}-{i}")).unwrap();
        // Enough calls at once that the pool opens most of its connections
        // (reads: begins made at once go as one statement).
        let calls = (0..64).map(|i| {
            let (store, key) = (store.clone(), key(i));
            tokio::spawn(async move { store.get(&key).await.unwrap() })
        });
        for call in futures_util::future::join_all(calls).await {
            call.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let killed = kill_connections(&admin, "idem_idle_broken").await;
        assert!(killed >= 3, "{service}: the pool held {killed} connections");
        tokio::time::sleep(Duration::from_millis(100)).await;

        let mut failed = Vec::new();
        for i in 64..64 + 2 * killed as usize {
            if let Err(e) = store.begin(&key(i), None, Lease::from_secs(60)).await {
                assert!(e.is_transient(), "{service}: {e}");
                failed.push(e.to_string());
            }
        }
        assert!(
            failed.len() <= 1,
            "{service}: {} of {killed} broken connections failed a call each: {failed:?}",
            failed.len()
        );
    }
}
