//! The store's sessions are set up as its statements need, whatever the
//! URL or the server's defaults say: UTC, autocommit and a bounded lock
//! wait on MySQL; generic plans, a bounded lock wait and a statement cache
//! that holds every statement on PostgreSQL.

use std::time::Duration;

use idem_core::{Begin, Key, Lease, ScanQuery, Store};
use sqlx::{Connection, Row};

use super::{fresh_prefix, mysql_url, open, postgres_url};
use crate::store::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sessions_keep_utc_and_autocommit_whatever_the_url_says() {
    let url = mysql_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    // A zone other than UTC in the URL, which sqlx would set on the session.
    let zoned = format!("{url}{sep}timezone=%2B05:00&lock_timeout=3s");
    let prefix = fresh_prefix("sessions");
    let Some(store) = open("MySQL", &zoned, |b| b.table(&prefix).pool_size(2)).await else {
        return;
    };
    let Db::MySql(my) = &store.records().db else {
        unreachable!("a mysql:// URL opens MySQL")
    };
    let mut conn = my.pool.acquire().await.unwrap();
    let row = sqlx::query(
        "SELECT @@session.time_zone AS tz, CAST(@@session.autocommit AS SIGNED) AS ac,
                CAST(@@session.innodb_lock_wait_timeout AS SIGNED) AS lw",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let (tz, autocommit, lock_wait): (String, i64, i64) =
        (row.get("tz"), row.get("ac"), row.get("lw"));
    assert_eq!(tz, "+00:00", "the session's clock is UTC");
    assert_eq!(autocommit, 1, "each statement commits on its own");
    assert_eq!(
        lock_wait, 3,
        "lock waits end after the store's lock_timeout"
    );
    drop(conn);

    // The clock the records carry is the real one.
    let key = Key::new("sessions", "clock").unwrap();
    let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(60)).await.unwrap()
    else {
        panic!("a fresh key is acquired")
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let lease_ms = claim.lease_expires_at.as_millis() as i64;
    assert!(
        (lease_ms - 60_000 - now_ms).abs() < 5_000,
        "the lease ends a minute from now in UTC: {lease_ms} vs {now_ms}"
    );
    super::plans::drop_tables(&store, &zoned, &store.tables().name(0).to_string()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_keep_every_statement_of_every_shard_prepared() {
    let url = postgres_url();
    let prefix = fresh_prefix("sessions");
    let shards = 24;
    let Some(store) = open("PostgreSQL", &url, |b| {
        b.table(&prefix)
            .shards(shards)
            .pool_size(1)
            .lock_timeout(Duration::from_millis(1500))
    })
    .await
    else {
        return;
    };
    // Every statement of every shard, on the pool's one connection.
    let mut seen = vec![false; usize::from(shards)];
    let mut i = 0;
    while seen.iter().any(|s| !s) {
        let key = Key::new("sessions", format!("key-{i}")).unwrap();
        i += 1;
        let shard = usize::from(store.tables().shard_of(&key));
        if seen[shard] {
            continue;
        }
        seen[shard] = true;
        let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(60)).await.unwrap()
        else {
            panic!("a fresh key is acquired")
        };
        let renewed = store.extend(&key, claim.token, Lease::from_secs(60));
        assert!(!renewed.await.unwrap().is_stale());
        store.get(&key).await.unwrap();
        if shard % 2 == 0 {
            assert!(!store.release(&key, claim.token).await.unwrap().is_stale());
        } else {
            let done = store.complete(&key, claim.token, None, Duration::from_secs(60));
            assert!(!done.await.unwrap().is_stale());
        }
    }
    let mut query = ScanQuery::new(idem_core::Namespace::new("sessions").unwrap());
    query.limit = 10;
    store.scan(&query).await.unwrap();
    store.sweep().await.unwrap();

    let Db::Postgres(pg) = &store.records().db else {
        unreachable!("a postgres:// URL opens PostgreSQL")
    };
    let mut conn = pg.pool.acquire().await.unwrap();
    let cached = conn.cached_statements_size();
    let lock_timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(lock_timeout, "1500ms");
    drop(conn);
    // begin, extend, get, release or complete on each shard, scan and
    // sweep on each: 6 a shard, none evicted.
    assert!(
        cached >= 6 * usize::from(shards),
        "{cached} statements stayed prepared"
    );
    for t in store
        .tables()
        .all()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
    {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{t}\"")))
            .execute(&pg.pool)
            .await
            .unwrap();
    }
    for own in ["tokens", "schema"] {
        let drop = format!("DROP TABLE IF EXISTS \"{}_{own}\"", store.tables().prefix());
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(&pg.pool)
            .await
            .unwrap();
    }
}
