//! The operator's statements on tables of 100 000 rows: `purge --expired`
//! finds its rows through the expiry index on MariaDB, and a count given a
//! time limit (the status page's) is stopped by the server itself, with
//! nothing of the limit left on the pool's sessions.

use std::time::Duration;

use idem_core::Namespace;
use idem_core::admin::{Admin, Purge};
use sqlx::AssertSqlSafe;

use super::plans::{PlanRow, drop_tables};
use super::{fresh_prefix, mysql_url, open, postgres_url};
use crate::SqlStore;
use crate::store::Db;

/// Rows in each table.
const ROWS: i64 = 100_000;

/// Rows among them past their retention.
const EXPIRED: i64 = 1_000;

/// A count stopped by the server after a millisecond answers its reason;
/// dropped half-way or stopped, it leaves every session of the pool as it
/// was: the counts after it, with no limit, finish.
async fn counts_stop_on_the_server(store: &SqlStore, ns: &Namespace, reason: &str) {
    let all = store.stats(ns).await.unwrap();
    assert_eq!(all.expired, EXPIRED as u64, "{all:?}");
    assert_eq!(all.completed, (ROWS - EXPIRED) as u64, "{all:?}");
    let e = store
        .stats_within(ns, Duration::from_millis(1))
        .await
        .expect_err("a count of 100 000 rows takes more than a millisecond");
    assert!(e.to_string().contains(reason), "{e}");
    let bounded = store
        .stats_within(ns, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(bounded, all);
    // A caller who leaves part way.
    for _ in 0..3 {
        let _ = tokio::time::timeout(
            Duration::from_millis(2),
            store.stats_within(ns, Duration::from_secs(60)),
        )
        .await;
    }
    for _ in 0..8 {
        assert_eq!(store.stats(ns).await.unwrap(), all);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_purge_of_the_expired_reads_the_expiry_index_and_counts_stop_on_the_server() {
    let url = mysql_url();
    let prefix = fresh_prefix("admin");
    let Some(store) = open("MySQL", &url, |b| b.table(&prefix)).await else {
        return;
    };
    let Db::MySql(my) = &store.records().db else {
        unreachable!("a mysql:// URL opens MySQL")
    };
    let table = store.tables().name(0).to_string();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO `{table}` (ns, k, state, token, fp, attempts, started_at, lease_until,
                               outcome, completed_at, expires_at)
         SELECT 'admin', CONCAT('key-', seq), 2, seq * 1024, NULL, 1, 0, 0, NULL, 0,
                IF(seq <= {EXPIRED}, 1, 9000000000000)
         FROM seq_1_to_{ROWS}"
    )))
    .execute(&my.pool)
    .await
    .unwrap();

    let rows = sqlx::query(AssertSqlSafe(format!(
        "EXPLAIN {}",
        crate::admin::mysql_purge(&table, Purge::Expired)
    )))
    .bind("admin".as_bytes())
    .bind(5000_i64)
    .fetch_all(&my.pool)
    .await
    .unwrap();
    let plan: Vec<PlanRow> = rows.iter().map(PlanRow::of).collect();
    eprintln!("MariaDB: purge --expired on {ROWS} rows: {plan:?}");
    let expires = format!("{table}_expires");
    assert!(
        plan.iter()
            .all(|r| r.key.as_deref() == Some(expires.as_str())
                && r.access == "range"
                && !r.extra.contains("filesort")
                && r.rows.is_some_and(|n| n < (ROWS / 10) as u64)),
        "purge --expired does not walk the expiry index: {plan:?}"
    );

    let ns = Namespace::new("admin").unwrap();
    counts_stop_on_the_server(&store, &ns, "max_statement_time").await;
    let gone = store.purge(&ns, Purge::Expired, &|_| {}).await.unwrap();
    assert_eq!(gone, EXPIRED as u64);
    drop_tables(&store, &url, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_counts_stop_on_the_server() {
    let url = postgres_url();
    let prefix = fresh_prefix("admin");
    let Some(store) = open("PostgreSQL", &url, |b| b.table(&prefix)).await else {
        return;
    };
    let Db::Postgres(pg) = &store.records().db else {
        unreachable!("a postgres:// URL opens PostgreSQL")
    };
    let table = store.tables().name(0).to_string();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at)
         SELECT convert_to('admin', 'UTF8'), convert_to('key-' || g, 'UTF8'), 2, g * 1024, NULL,
                1, 0, 0, NULL, 0, CASE WHEN g <= {EXPIRED} THEN 1 ELSE 9000000000000 END
         FROM generate_series(1, {ROWS}) AS g"
    )))
    .execute(&pg.pool)
    .await
    .unwrap();
    let ns = Namespace::new("admin").unwrap();
    counts_stop_on_the_server(&store, &ns, "statement timeout").await;
    drop_tables(&store, &url, &table).await;
}
