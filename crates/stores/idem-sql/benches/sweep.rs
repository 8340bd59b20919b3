//! How long PostgreSQL takes to sweep a backlog of expired records:
//! `SqlStore::sweep` (batches of 1 000 deleted by address), the statement
//! it replaced (each batch joined back on the key and re-checked against
//! the clock), in sessions set as the store's (generic plans), and one
//! plain `DELETE` of every expired row, the floor. Each starts from the
//! same table, filled, vacuumed and analysed.
//!
//! `cargo bench -p idem-sql --bench sweep`; `IDEM_BENCH_ROWS` (1 000 000)
//! expired rows, on `IDEM_TEST_POSTGRES_URL`.

use std::time::{Duration, Instant};

use idem_sql::SqlStore;
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

const PREFIX: &str = "idem_bench_sweep";
const BATCH: i64 = 1000;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Empties the table and fills it with `rows` records that expired long
/// ago, then lets the planner read them, as a table that lived would be.
async fn fill(pool: &PgPool, rows: u64) -> Duration {
    let start = Instant::now();
    sqlx::raw_sql(AssertSqlSafe(format!("TRUNCATE \"{PREFIX}\"")))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{PREFIX}\" (ns, k, state, token, fp, attempts, started_at, lease_until,
                                  outcome, completed_at, expires_at)
         SELECT convert_to('sweep', 'UTF8'), convert_to('key-' || g, 'UTF8'), 2, g * 1024, NULL,
                1, 1, 0, NULL, 1, 1000 + g % 100000
         FROM generate_series(1, $1) AS g"
    )))
    .bind(rows as i64)
    .execute(pool)
    .await
    .unwrap();
    // One statement a call: VACUUM runs outside a transaction only.
    for statement in [
        format!("VACUUM ANALYZE \"{PREFIX}\""),
        "CHECKPOINT".to_owned(),
    ] {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(pool)
            .await
            .unwrap();
    }
    start.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rows = env("IDEM_BENCH_ROWS", 1_000_000);
    let store = SqlStore::builder(&url)
        .table(PREFIX)
        .sweep_interval(None)
        .sweep_batch(BATCH as u32)
        .connect()
        .await
        .expect("PostgreSQL at IDEM_TEST_POSTGRES_URL");
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("plan_cache_mode", "force_generic_plan")]);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    println!(
        "PostgreSQL at {}: {rows} expired rows, batches of {BATCH}",
        idem_sql::redacted(&url)
    );
    println!("| statement | rows deleted | time | rows/s | ms a batch |");
    println!("| --- | --- | --- | --- | --- |");
    let row = |what: &str, n: u64, took: Duration, batches: u64| {
        println!(
            "| {what} | {n} | {:.1} s | {:.0} | {:.1} |",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64(),
            took.as_secs_f64() * 1000.0 / batches.max(1) as f64
        );
    };

    fill(&pool, rows).await;
    let start = Instant::now();
    let n = store.sweep().await.unwrap();
    row(
        "`SqlStore::sweep` (by ctid)",
        n,
        start.elapsed(),
        n.div_ceil(BATCH as u64),
    );

    fill(&pool, rows).await;
    let old = format!(
        "WITH c AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now),
        d AS (SELECT r.ns, r.k FROM \"{PREFIX}\" r CROSS JOIN c WHERE r.expires_at <= c.now
              ORDER BY r.expires_at LIMIT $1 FOR UPDATE OF r SKIP LOCKED)
        DELETE FROM \"{PREFIX}\" AS r USING d, c
        WHERE r.ns = d.ns AND r.k = d.k AND r.expires_at <= c.now"
    );
    let start = Instant::now();
    let (mut n, mut batches) = (0, 0);
    loop {
        let deleted = sqlx::query(AssertSqlSafe(old.clone()))
            .bind(BATCH)
            .execute(&pool)
            .await
            .unwrap()
            .rows_affected();
        n += deleted;
        batches += 1;
        if deleted < BATCH as u64 {
            break;
        }
    }
    row(
        "the previous statement (join on the key)",
        n,
        start.elapsed(),
        batches,
    );

    fill(&pool, rows).await;
    let start = Instant::now();
    let n = sqlx::raw_sql(AssertSqlSafe(format!(
        "DELETE FROM \"{PREFIX}\" WHERE expires_at <= floor(extract(epoch FROM clock_timestamp()) * 1000)::int8"
    )))
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    row(
        "one plain `DELETE` of every expired row",
        n,
        start.elapsed(),
        1,
    );

    for t in [
        PREFIX.to_owned(),
        format!("{PREFIX}_tokens"),
        format!("{PREFIX}_schema"),
    ] {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{t}\"")))
            .execute(&pool)
            .await
            .unwrap();
    }
}
