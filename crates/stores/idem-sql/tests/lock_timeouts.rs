//! A row locked by another transaction makes a call fail within the
//! store's lock timeout, as unavailable and saying so, not wait as long
//! as the holder (MySQL's default is 50 s, PostgreSQL's forever); and a
//! call cancelled while it waits gives its connection back as soon.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::{Duration, Instant};

use idem_core::{Begin, Key, Lease, Store};
use sqlx::{AssertSqlSafe, Connection};

const LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// Time allowed beyond the lock timeout for the round trips.
const SLACK: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_row_fails_the_call_within_the_lock_timeout() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("locks");
        let Some(store) = support::open(service, &url, |b| {
            b.table(&prefix).pool_size(1).lock_timeout(LOCK_TIMEOUT)
        })
        .await
        else {
            continue;
        };
        let key = Key::new("locks", "held-elsewhere").unwrap();
        let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(60)).await.unwrap()
        else {
            panic!("{service}: a fresh key is acquired")
        };
        let table = store.tables().for_key(&key).to_string();
        let ns = key.namespace().as_str().as_bytes();
        let k = &key.bytes()[..];

        // Another transaction holds the row's lock for the whole test.
        let holder: Box<dyn std::any::Any> = if url.starts_with("postgres") {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::raw_sql("BEGIN").execute(&mut c).await.unwrap();
            sqlx::query(AssertSqlSafe(format!(
                "SELECT 1 FROM \"{table}\" WHERE ns = $1 AND k = $2 FOR UPDATE"
            )))
            .bind(ns)
            .bind(k)
            .fetch_one(&mut c)
            .await
            .unwrap();
            Box::new(c)
        } else {
            let mut c = sqlx::MySqlConnection::connect(&url).await.unwrap();
            sqlx::raw_sql("BEGIN").execute(&mut c).await.unwrap();
            sqlx::query(AssertSqlSafe(format!(
                "SELECT 1 FROM `{table}` WHERE ns = ? AND k = ? FOR UPDATE"
            )))
            .bind(ns)
            .bind(k)
            .fetch_one(&mut c)
            .await
            .unwrap();
            Box::new(c)
        };

        let start = Instant::now();
        let err = store
            .extend(&key, claim.token, Lease::from_secs(60))
            .await
            .expect_err("the row is locked by another transaction");
        let took = start.elapsed();
        assert!(
            took < LOCK_TIMEOUT + SLACK,
            "{service}: the call waited {took:?}, beyond the lock timeout of {LOCK_TIMEOUT:?}"
        );
        assert!(err.is_transient(), "{service}: {err}");
        assert!(
            err.to_string().contains("lock timeout"),
            "{service}: the error says what happened: {err}"
        );

        // A call cancelled while it waits: the pool's one connection is
        // lent again once the server gives up the wait.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(200),
            store.complete(&key, claim.token, None, Duration::from_secs(60)),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "{service}: the complete waits for the lock"
        );
        let start = Instant::now();
        let other = Key::new("locks", "free").unwrap();
        store.get(&other).await.unwrap();
        let took = start.elapsed();
        assert!(
            took < LOCK_TIMEOUT + SLACK,
            "{service}: the next call waited {took:?} for the cancelled call's connection"
        );

        drop(holder);
        support::drop_tables(&store, &url).await;
    }
}
