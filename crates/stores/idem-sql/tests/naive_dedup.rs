//! Why a claim and not a check, on a real PostgreSQL and MySQL/MariaDB:
//! 32 deliveries of each of the same 50 messages run at once, each
//! "processing" its message by inserting a row into an effects table.
//!
//! - The naive pattern, "SELECT the dedup row; if absent, do the effect,
//!   then INSERT the dedup row", lets duplicates through: deliveries that
//!   check before any of them has inserted all find the row absent, and the
//!   dedup row's unique key only stops the second INSERT after the second
//!   effect ran.
//! - idem's `begin` → effect → `complete` runs each effect exactly once:
//!   `begin` is one statement that claims the key or reports who has it.
//!
//! A short sleep between the check (or the claim) and the effect stands in
//! for the business work. A round that happens to produce no duplicate is
//! run again with new keys, a few times; the naive pattern must have
//! duplicated some effect across the rounds, and idem never. Tables are
//! named per run and dropped at the end.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Begin, Fenced, Key, Lease, Store};
use idem_sql::SqlStore;
use idem_testkit::services;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool, Row};
use tokio::sync::Barrier;

/// Concurrent deliveries of every message.
const DELIVERIES: usize = 32;
/// Messages, each delivered `DELIVERIES` times.
const MESSAGES: usize = 50;
/// Rounds of new keys before the naive pattern is declared lucky.
const ROUNDS: usize = 5;
/// The business work between the check and the effect.
const WORK: Duration = Duration::from_millis(2);
const LEASE: Lease = Lease::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// A plain connection pool on either database, for the naive pattern and
/// the effects tables.
enum Db {
    Postgres(PgPool),
    MySql(MySqlPool),
}

impl Db {
    async fn open(url: &str) -> Result<Self, sqlx::Error> {
        let timeout = Duration::from_secs(10);
        Ok(if url.starts_with("mysql") || url.starts_with("mariadb") {
            Db::MySql(
                MySqlPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(timeout)
                    .connect(url)
                    .await?,
            )
        } else {
            Db::Postgres(
                PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(timeout)
                    .connect(url)
                    .await?,
            )
        })
    }

    async fn execute(&self, sql: String) {
        let done = match self {
            Db::Postgres(pool) => sqlx::query(AssertSqlSafe(sql.clone()))
                .execute(pool)
                .await
                .map(drop),
            Db::MySql(pool) => sqlx::query(AssertSqlSafe(sql.clone()))
                .execute(pool)
                .await
                .map(drop),
        };
        done.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The naive check: is the dedup row there?
    async fn seen(&self, table: &str, key: &str) -> bool {
        let found = match self {
            Db::Postgres(pool) => {
                sqlx::query(AssertSqlSafe(format!("SELECT 1 FROM {table} WHERE k = $1")))
                    .bind(key)
                    .fetch_optional(pool)
                    .await
                    .map(|r| r.is_some())
            }
            Db::MySql(pool) => {
                sqlx::query(AssertSqlSafe(format!("SELECT 1 FROM {table} WHERE k = ?")))
                    .bind(key)
                    .fetch_optional(pool)
                    .await
                    .map(|r| r.is_some())
            }
        };
        found.expect("the check reads the dedup table")
    }

    /// The effect: one row in `table` per processing of `key`.
    async fn effect(&self, table: &str, key: &str, delivery: usize) {
        let delivery = i32::try_from(delivery).unwrap();
        let done = match self {
            Db::Postgres(pool) => sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (k, delivery) VALUES ($1, $2)"
            )))
            .bind(key)
            .bind(delivery)
            .execute(pool)
            .await
            .map(drop),
            Db::MySql(pool) => sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (k, delivery) VALUES (?, ?)"
            )))
            .bind(key)
            .bind(delivery)
            .execute(pool)
            .await
            .map(drop),
        };
        done.expect("the effect is written");
    }

    /// The naive mark: INSERT the dedup row. Whether `key` was already
    /// there (a unique violation: another delivery marked it first, after
    /// both had run the effect).
    async fn mark(&self, table: &str, key: &str) -> bool {
        let done = match self {
            Db::Postgres(pool) => {
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {table} (k) VALUES ($1)"
                )))
                .bind(key)
                .execute(pool)
                .await
            }
            .map(drop),
            Db::MySql(pool) => {
                sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} (k) VALUES (?)")))
                    .bind(key)
                    .execute(pool)
                    .await
            }
            .map(drop),
        };
        match done {
            Ok(()) => false,
            Err(e)
                if e.as_database_error()
                    .is_some_and(|d| d.is_unique_violation()) =>
            {
                true
            }
            Err(e) => panic!("the dedup row is written: {e}"),
        }
    }

    /// How many times each key's effect ran.
    async fn effects(&self, table: &str) -> HashMap<String, i64> {
        let sql = format!("SELECT k, COUNT(*) AS n FROM {table} GROUP BY k");
        let rows: Vec<(String, i64)> = match self {
            Db::Postgres(pool) => sqlx::query(AssertSqlSafe(sql))
                .fetch_all(pool)
                .await
                .expect("the effects are read")
                .iter()
                .map(|r| (r.get("k"), r.get("n")))
                .collect(),
            Db::MySql(pool) => sqlx::query(AssertSqlSafe(sql))
                .fetch_all(pool)
                .await
                .expect("the effects are read")
                .iter()
                .map(|r| (r.get("k"), r.get("n")))
                .collect(),
        };
        rows.into_iter().collect()
    }
}

/// This run's tables.
struct Names {
    seen: String,
    naive_effects: String,
    idem_effects: String,
    records: String,
}

impl Names {
    fn new() -> Self {
        let run = support::fresh_prefix("naive");
        Self {
            seen: format!("{run}_seen"),
            naive_effects: format!("{run}_naive_effects"),
            idem_effects: format!("{run}_idem_effects"),
            records: format!("{run}_records"),
        }
    }
}

/// One delivery of every key, the naive way; answers how many of its
/// dedup INSERTs found the row already there.
async fn naive_delivery(
    db: Arc<Db>,
    names: Arc<Names>,
    keys: Arc<Vec<String>>,
    delivery: usize,
    start: Arc<Barrier>,
) -> usize {
    start.wait().await;
    let mut too_late = 0;
    for key in keys.iter() {
        if db.seen(&names.seen, key).await {
            continue;
        }
        tokio::time::sleep(WORK).await;
        db.effect(&names.naive_effects, key, delivery).await;
        too_late += usize::from(db.mark(&names.seen, key).await);
    }
    too_late
}

/// One delivery of every key through idem: claim, effect, complete. A key
/// another delivery holds is asked again shortly, as a redelivery would,
/// until it is completed.
async fn idem_delivery(
    store: SqlStore,
    db: Arc<Db>,
    names: Arc<Names>,
    keys: Arc<Vec<String>>,
    delivery: usize,
    start: Arc<Barrier>,
) {
    start.wait().await;
    for k in keys.iter() {
        let key = Key::new("naive", k.clone()).unwrap();
        loop {
            match store.begin(&key, None, LEASE).await.expect("begin") {
                Begin::Acquired(claim) => {
                    tokio::time::sleep(WORK).await;
                    db.effect(&names.idem_effects, k, delivery).await;
                    let done = store
                        .complete(&key, claim.token, None, RETENTION)
                        .await
                        .expect("complete");
                    assert_eq!(done, Fenced::Ok(()), "{k}: the claim was held");
                    break;
                }
                Begin::Completed { .. } => break,
                Begin::InProgress { retry_after } => {
                    tokio::time::sleep(retry_after.min(WORK)).await;
                }
                Begin::Mismatch => panic!("{k}: no fingerprint was given"),
            }
        }
    }
}

/// Deliveries of each key the effects table holds beyond the first, and
/// keys it has no effect for.
fn tally(effects: &HashMap<String, i64>, keys: &[String]) -> (i64, usize) {
    let extra = keys
        .iter()
        .map(|k| effects.get(k).copied().unwrap_or(0).saturating_sub(1))
        .sum();
    let missing = keys.iter().filter(|k| !effects.contains_key(*k)).count();
    (extra, missing)
}

async fn check_then_insert_duplicates_and_begin_does_not(service: &str, url: &str) {
    let db = match Db::open(url).await {
        Ok(db) => Arc::new(db),
        Err(e) => return services::absent(service, url, e).unwrap_or(()),
    };
    let names = Arc::new(Names::new());
    let Some(store) = support::open(service, url, |b| {
        b.table(&names.records).sweep_interval(None)
    })
    .await
    else {
        return;
    };
    db.execute(format!(
        "CREATE TABLE {} (k VARCHAR(100) NOT NULL PRIMARY KEY)",
        names.seen
    ))
    .await;
    for table in [&names.naive_effects, &names.idem_effects] {
        db.execute(format!(
            "CREATE TABLE {table} (k VARCHAR(100) NOT NULL, delivery INT NOT NULL)"
        ))
        .await;
    }

    let (mut naive_extra, mut naive_too_late, mut idem_extra) = (0, 0, 0);
    let mut rounds = 0;
    for round in 0..ROUNDS {
        rounds += 1;
        let keys: Arc<Vec<String>> =
            Arc::new((0..MESSAGES).map(|m| format!("r{round}-m{m}")).collect());

        let start = Arc::new(Barrier::new(DELIVERIES));
        let naive: Vec<_> = (0..DELIVERIES)
            .map(|d| {
                tokio::spawn(naive_delivery(
                    db.clone(),
                    names.clone(),
                    keys.clone(),
                    d,
                    start.clone(),
                ))
            })
            .collect();
        for task in naive {
            naive_too_late += task.await.unwrap();
        }

        let start = Arc::new(Barrier::new(DELIVERIES));
        let idem: Vec<_> = (0..DELIVERIES)
            .map(|d| {
                tokio::spawn(idem_delivery(
                    store.clone(),
                    db.clone(),
                    names.clone(),
                    keys.clone(),
                    d,
                    start.clone(),
                ))
            })
            .collect();
        for task in idem {
            task.await.unwrap();
        }

        let (extra, missing) = tally(&db.effects(&names.naive_effects).await, &keys);
        assert_eq!(missing, 0, "the naive pattern processed every message");
        naive_extra += extra;
        let (extra, missing) = tally(&db.effects(&names.idem_effects).await, &keys);
        assert_eq!(missing, 0, "idem processed every message");
        idem_extra += extra;
        if naive_extra > 0 {
            break;
        }
    }
    eprintln!(
        "{service}: {rounds} round(s) of {DELIVERIES} deliveries × {MESSAGES} messages: \
         check-then-insert ran {naive_extra} duplicate effects ({naive_too_late} dedup INSERTs \
         found the row already there, after their effect); begin/complete ran {idem_extra}"
    );

    db.execute(format!(
        "DROP TABLE IF EXISTS {}, {}, {}",
        names.seen, names.naive_effects, names.idem_effects
    ))
    .await;
    support::drop_tables(&store, url).await;

    assert_eq!(
        idem_extra, 0,
        "begin → effect → complete ran an effect twice"
    );
    assert!(
        naive_extra > 0,
        "check-then-insert ran no effect twice in {rounds} rounds; the demonstration failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_insert_duplicates_effects_and_begin_runs_each_once_on_postgres() {
    check_then_insert_duplicates_and_begin_does_not("PostgreSQL", &support::postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_insert_duplicates_effects_and_begin_runs_each_once_on_mysql() {
    check_then_insert_duplicates_and_begin_does_not("MySQL", &support::mysql_url()).await;
}
