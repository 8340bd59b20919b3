//! The sweeper deletes expired rows in bounded batches, never a live
//! record, and tokens keep increasing over what it deleted.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_core::{Begin, Claim, Key, Lease, Record, Store};
use idem_sql::SqlStore;

async fn acquire(store: &SqlStore, key: &Key, lease: Lease) -> Claim {
    match store.begin(key, None, lease).await.unwrap() {
        Begin::Acquired(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn key(name: &str, i: usize) -> Key {
    Key::new("sweep", format!("{name}-{i}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_deletes_expired_rows_in_batches_and_never_a_live_one() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("sweep");
        let Some(store) = support::open(service, &url, |b| {
            b.table(&prefix)
                .shards(2)
                .sweep_interval(None)
                .sweep_batch(7)
                .tombstone_ttl(Duration::from_millis(50))
                .abandoned_retention(Duration::from_millis(50))
        })
        .await
        else {
            continue;
        };
        let short = Duration::from_millis(50);
        let mut expired_tokens = Vec::new();
        // 30 completed with a short retention, 5 released, 5 abandoned.
        for i in 0..30 {
            let c = acquire(&store, &key("done", i), Lease::from_secs(60)).await;
            let _ = store
                .complete(&key("done", i), c.token, None, short)
                .await
                .unwrap();
            expired_tokens.push(c.token);
        }
        for i in 0..5 {
            let c = acquire(&store, &key("released", i), Lease::from_secs(60)).await;
            let _ = store.release(&key("released", i), c.token).await.unwrap();
            acquire(&store, &key("abandoned", i), Lease::from_millis(20)).await;
        }
        // Live: 5 held with a long lease, 5 completed with a long retention.
        for i in 0..5 {
            acquire(&store, &key("held", i), Lease::from_secs(60)).await;
            let c = acquire(&store, &key("kept", i), Lease::from_secs(60)).await;
            let _ = store
                .complete(
                    &key("kept", i),
                    c.token,
                    Some("k".into()),
                    Duration::from_secs(3600),
                )
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let swept = store.sweep().await.unwrap();
        assert_eq!(swept, 40, "{service}: every expired row, 7 a statement");
        assert_eq!(
            store.sweep().await.unwrap(),
            0,
            "{service}: nothing left to sweep"
        );
        for i in 0..5 {
            assert!(matches!(
                store.get(&key("held", i)).await.unwrap(),
                Some(Record::InProgress(_))
            ));
            assert!(matches!(
                store.get(&key("kept", i)).await.unwrap(),
                Some(Record::Completed(_))
            ));
        }
        // Tokens continue above the swept rows' tokens.
        for (i, old) in expired_tokens.iter().enumerate() {
            let again = acquire(&store, &key("done", i), Lease::from_secs(60)).await;
            assert!(again.token > *old, "{service}: token after sweeping");
            assert_eq!(again.attempt, 1);
        }
        support::drop_tables(&store, &url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sweeper_runs_by_itself() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("bgsweep");
        let Some(store) = support::open(service, &url, |b| {
            b.table(&prefix)
                .sweep_interval(Some(Duration::from_millis(100)))
        })
        .await
        else {
            continue;
        };
        let table = store.tables().name(0).to_string();
        let quoted = if url.starts_with("postgres") {
            format!("\"{table}\"")
        } else {
            format!("`{table}`")
        };
        for i in 0..10 {
            let c = acquire(&store, &key("bg", i), Lease::from_secs(60)).await;
            let _ = store
                .complete(&key("bg", i), c.token, None, Duration::from_millis(20))
                .await
                .unwrap();
        }
        let mut rows = -1;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            rows = support::count(&url, &format!("SELECT COUNT(*) FROM {quoted}")).await;
            if rows == 0 {
                break;
            }
        }
        assert_eq!(rows, 0, "{service}: the sweeper deleted the expired rows");
        support::drop_tables(&store, &url).await;
    }
}

/// PostgreSQL: the sweeper skips rows another transaction holds instead of
/// waiting for them, so a sweep never queues behind live work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_skips_rows_another_transaction_holds() {
    use sqlx::{AssertSqlSafe, Connection, Executor};
    let url = support::postgres_url();
    let prefix = support::fresh_prefix("sweeplock");
    let Some(store) = support::open("PostgreSQL", &url, |b| {
        b.table(&prefix).sweep_interval(None)
    })
    .await
    else {
        return;
    };
    for i in 0..3 {
        let c = acquire(&store, &key("locked", i), Lease::from_secs(60)).await;
        let _ = store
            .complete(&key("locked", i), c.token, None, Duration::from_millis(10))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let table = store.tables().name(0).to_string();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute(AssertSqlSafe(format!(
            "SELECT * FROM \"{table}\" WHERE k = 'locked-0'::bytea FOR UPDATE"
        )))
        .await
        .unwrap();
    let swept = tokio::time::timeout(Duration::from_secs(5), store.sweep())
        .await
        .expect("a sweep does not wait for a locked row")
        .unwrap();
    assert_eq!(swept, 2);
    holder.execute("ROLLBACK").await.unwrap();
    assert_eq!(store.sweep().await.unwrap(), 1);
    support::drop_tables(&store, &url).await;
}
