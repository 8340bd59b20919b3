//! Connections the server drops (a restart, a failover, an administrator's
//! kill) cost at most the calls that were on them: the pool opens new ones
//! and the records are intact.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_core::{Begin, Key, Lease, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_recovers_when_the_server_kills_its_connections() {
    for (service, admin) in support::databases() {
        // The store connects under a name of its own, so the kill below
        // reaches its connections and no one else's.
        let url = if admin.starts_with("postgres") {
            let sep = if admin.contains('?') { '&' } else { '?' };
            format!("{admin}{sep}application_name=idem_lost_connections")
        } else {
            if support::open(service, &admin, |b| b.table("idem_lost_connections"))
                .await
                .is_none()
            {
                continue;
            }
            support::exec(&admin, "CREATE USER IF NOT EXISTS 'idem_lost'@'%'").await;
            support::exec(&admin, "GRANT ALL ON test.* TO 'idem_lost'@'%'").await;
            admin.replacen("root@", "idem_lost@", 1)
        };
        let Some(store) = support::open(service, &url, |b| b.table("idem_lost_connections")).await
        else {
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
        let killed = if url.starts_with("postgres") {
            support::count(
                &admin,
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = 'idem_lost_connections'",
            )
            .await
        } else {
            kill_mysql_connections(&admin).await
        };
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

async fn kill_mysql_connections(url: &str) -> i64 {
    use sqlx::{Connection, Executor, Row};
    let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
    let ids: Vec<i64> = sqlx::query(
        "SELECT id FROM information_schema.processlist
         WHERE user = 'idem_lost'",
    )
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
