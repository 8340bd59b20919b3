//! Every single-key statement finds its row through the primary key, on
//! a table of 100 000 rows that was filled but never analysed: no plan
//! scans the table, and a renewal takes milliseconds. The tier's
//! statements walk the primary key too, and `completed_keys` pages through
//! such a table in encoded-key order. On PostgreSQL a session keeps the
//! plan it made on the table as it was then: statements planned on a table
//! just created stay off sequential scans as it fills.

use std::time::{Duration, Instant};

use idem_core::{Begin, BeginItem, CompleteItem, FencingToken, Key, Lease, Store};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, PgConnection, QueryBuilder, Row};

use super::{fresh_prefix, mysql_url, open, postgres_url};
use crate::SqlStore;
use crate::mysql::MySql;
use crate::pg::Postgres;
use crate::store::Db;

/// Rows in the table the plans are checked on.
const ROWS: i64 = 100_000;

/// A key among the table's rows.
fn row_key(i: i64) -> Key {
    Key::new("plans", format!("key-{i}")).unwrap()
}

/// The median of `runs` renewals of a claim on the table.
async fn median_renewal(store: &SqlStore) -> Duration {
    let key = Key::new("plans", "renewed").unwrap();
    let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(60)).await.unwrap()
    else {
        panic!("a fresh key is acquired")
    };
    let mut took = Vec::new();
    for _ in 0..21 {
        let start = Instant::now();
        let renewed = store
            .extend(&key, claim.token, Lease::from_secs(60))
            .await
            .unwrap();
        took.push(start.elapsed());
        assert!(!renewed.is_stale(), "the holder renews its claim");
    }
    took.sort();
    took[took.len() / 2]
}

/// A PostgreSQL store on a table of its own that nothing analyses, and a
/// connection of its pool.
async fn unanalysed_postgres(name: &str) -> Option<(SqlStore, PoolConnection<sqlx::Postgres>)> {
    let prefix = fresh_prefix(name);
    let store = open("PostgreSQL", &postgres_url(), |b| b.table(&prefix)).await?;
    let table = store.tables().name(0).to_string();
    let mut conn = postgres(&store).pool.acquire().await.unwrap();
    // Statistics arrive only if something analyses the table: nothing
    // here may, so the plans are those of a table just created and filled.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER TABLE \"{table}\" SET (autovacuum_enabled = false)"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    Some((store, conn))
}

fn postgres(store: &SqlStore) -> &Postgres {
    let Db::Postgres(pg) = &store.records().db else {
        unreachable!("a postgres:// URL opens PostgreSQL")
    };
    pg
}

/// A MySQL store on a table of its own, and a connection of its pool.
async fn mysql_store(name: &str) -> Option<(SqlStore, PoolConnection<sqlx::MySql>)> {
    let prefix = fresh_prefix(name);
    let store = open("MySQL", &mysql_url(), |b| b.table(&prefix)).await?;
    let conn = mysql(&store).pool.acquire().await.unwrap();
    Some((store, conn))
}

fn mysql(store: &SqlStore) -> &MySql {
    let Db::MySql(my) = &store.records().db else {
        unreachable!("a mysql:// URL opens MySQL")
    };
    my
}

/// The plan a session of the store runs for `statement`: the generic one,
/// which no parameter value changes.
async fn generic_plan(conn: &mut PgConnection, statement: &str, params: usize) -> String {
    sqlx::raw_sql(AssertSqlSafe(format!("PREPARE idem_plan AS {statement}")))
        .execute(&mut *conn)
        .await
        .unwrap();
    let args = match params {
        0 => String::new(),
        n => format!("({})", vec!["NULL"; n].join(", ")),
    };
    let plan: Vec<String> =
        sqlx::query_scalar(AssertSqlSafe(format!("EXPLAIN EXECUTE idem_plan{args}")))
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    sqlx::raw_sql("DEALLOCATE idem_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    plan.join("\n")
}

/// The record statements of a table: name, text and number of parameters.
fn record_statements(sql: &crate::pg::TableSql) -> [(&'static str, &String, usize); 7] {
    [
        ("begin", &sql.begin, 5),
        ("complete", &sql.complete, 6),
        ("release", &sql.release, 4),
        ("extend", &sql.extend, 5),
        ("get", &sql.get, 2),
        ("scan", &sql.scan, 5),
        ("sweep", &sql.sweep, 1),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_single_key_statements_stay_on_the_primary_key_before_analyze() {
    let url = postgres_url();
    let Some((store, mut conn)) = unanalysed_postgres("plans").await else {
        return;
    };
    let pg = postgres(&store);
    let table = store.tables().name(0).to_string();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at)
         SELECT convert_to('plans', 'UTF8'), convert_to('key-' || g, 'UTF8'), 1, g * 1024, NULL, 1,
                0, 9000000000000, NULL, 0, 9000000000000
         FROM generate_series(1, $1) AS g"
    )))
    .bind(ROWS)
    .execute(&mut *conn)
    .await
    .unwrap();
    let analysed: bool = sqlx::query_scalar(
        "SELECT reltuples >= 0 FROM pg_class WHERE oid = to_regclass(quote_ident($1))",
    )
    .bind(&table)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!(!analysed, "the table must not have been analysed yet");
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        mode, "force_generic_plan",
        "the store's sessions plan each statement once, from its text"
    );

    for (name, statement, params) in record_statements(&pg.sql[0]) {
        let plan = generic_plan(&mut conn, statement, params).await;
        assert!(
            !plan.contains(&format!("Seq Scan on {table}")),
            "{name} scans the table:\n{plan}"
        );
        if name == "sweep" {
            // The batch is found through the expiry index and deleted by
            // address, without a second pass over the expired rows.
            assert!(
                plan.contains("Tid Scan") && plan.contains(&format!("{table}_expires")),
                "the sweep does not delete its batch by address:\n{plan}"
            );
        } else {
            assert!(
                plan.contains(&format!("{table}_pkey")),
                "{name} does not use the primary key:\n{plan}"
            );
        }
    }
    drop(conn);

    let median = median_renewal(&store).await;
    eprintln!("PostgreSQL: median renewal on {ROWS} rows: {median:?}");
    assert!(
        median < Duration::from_millis(50),
        "a renewal took {median:?}"
    );
    drop_tables(&store, &url, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_single_key_statements_use_the_primary_key() {
    let url = mysql_url();
    let Some((store, mut conn)) = mysql_store("plans").await else {
        return;
    };
    let my = mysql(&store);
    let table = store.tables().name(0).to_string();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO `{table}` (ns, k, state, token, fp, attempts, started_at, lease_until,
                               outcome, completed_at, expires_at)
         SELECT 'plans', CONCAT('key-', seq), 1, seq * 1024, NULL, 1,
                0, 9000000000000, NULL, 0, 9000000000000
         FROM seq_1_to_{ROWS}"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    // The statements read the clock from this session variable.
    sqlx::raw_sql("SET @idem_now = CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)")
        .execute(&mut *conn)
        .await
        .unwrap();

    let key = row_key(4242);
    let other = row_key(77_777);
    let token = FencingToken::new(4242 * 1024);
    let begin = BeginItem {
        key: key.clone(),
        fingerprint: None,
        lease: Lease::from_secs(30),
    };
    let complete = |key: &Key| CompleteItem {
        key: key.clone(),
        token,
        outcome: Some(vec![7; 100].into()),
        retention: Duration::from_secs(60),
    };
    let (one, two) = (complete(&key), complete(&other));

    let mut plans: Vec<(&str, Vec<PlanRow>)> = Vec::new();
    let [_, _, begin_read] = my.begin_statements(0, &[&begin], 0, 1);
    plans.push((
        "begin (read back)",
        explain_text(&mut conn, &begin_read).await,
    ));
    let [_, extend, _] = my.extend_statements(0, &key, token, Lease::from_secs(30), 0);
    plans.push(("extend", explain_text(&mut conn, &extend).await));
    let mut q = QueryBuilder::new("EXPLAIN ");
    my.push_complete(&mut q, 0, &[&one]);
    plans.push(("complete", explain(&mut conn, q).await));
    let mut q = QueryBuilder::new("EXPLAIN ");
    my.push_complete(&mut q, 0, &[&one, &two]);
    plans.push(("complete of two keys", explain(&mut conn, q).await));
    let mut q = QueryBuilder::new("EXPLAIN ");
    my.push_complete_read(&mut q, 0, &[&one, &two]);
    plans.push(("complete (read back)", explain(&mut conn, q).await));
    let ns = "plans".as_bytes();
    let k = &key.bytes()[..];
    let rows = sqlx::query(AssertSqlSafe(format!("EXPLAIN {}", my.release[0])))
        .bind(1000_i64)
        .bind(ns)
        .bind(k)
        .bind(4242_i64 * 1024)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    plans.push(("release", rows.iter().map(PlanRow::of).collect()));
    let rows = sqlx::query(AssertSqlSafe(format!("EXPLAIN {}", my.get[0])))
        .bind(ns)
        .bind(k)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    plans.push(("get", rows.iter().map(PlanRow::of).collect()));

    for (name, plan) in &plans {
        let on_table: Vec<&PlanRow> = plan
            .iter()
            .filter(|r| r.table.as_deref().is_some_and(|t| t == table || t == "r"))
            .collect();
        assert!(
            !on_table.is_empty(),
            "{name}: no plan row for the table: {plan:?}"
        );
        for row in on_table {
            assert!(
                row.key.as_deref() == Some("PRIMARY")
                    && matches!(row.access.as_str(), "const" | "eq_ref" | "ref" | "range")
                    && row.rows.is_some_and(|n| n <= 10),
                "{name} does not find its rows through the primary key: {plan:?}"
            );
        }
    }
    drop(conn);

    let median = median_renewal(&store).await;
    eprintln!("MySQL: median renewal on {ROWS} rows: {median:?}");
    assert!(
        median < Duration::from_millis(50),
        "a renewal took {median:?}"
    );
    drop_tables(&store, &url, &table).await;
}

/// The namespaces of the tier tables, in encoded order (`b` before `aa`),
/// which is not the primary key's order (`aa` before `b`).
const TIER_NAMESPACES: [&str; 2] = ["b", "aa"];

/// Every key of a tier table, as `completed_keys` must list them.
fn tier_keys() -> Vec<Key> {
    let mut keys: Vec<Key> = (1..=ROWS)
        .map(|g| {
            let ns = TIER_NAMESPACES[usize::from(g % 2 == 0)];
            Key::new(ns, format!("key-{g}")).unwrap()
        })
        .collect();
    keys.sort_by_key(Key::encode);
    keys
}

/// Pages through every completed key of `store`, checking each page's
/// order; returns them and how long it took.
async fn page_through(store: &SqlStore, page: usize) -> (Vec<Key>, Duration) {
    use idem_core::tier::Tier;
    let start = Instant::now();
    let mut all: Vec<Key> = Vec::new();
    loop {
        let keys = store.completed_keys(all.last(), page).await.unwrap();
        if keys.is_empty() {
            break;
        }
        assert!(keys.len() <= page);
        all.extend(keys);
    }
    (all, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tier_statements_walk_the_primary_key() {
    let url = postgres_url();
    let Some((store, mut conn)) = unanalysed_postgres("tierplans").await else {
        return;
    };
    let pg = postgres(&store);
    let table = store.tables().name(0).to_string();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at)
         SELECT convert_to(CASE WHEN g % 2 = 0 THEN $2 ELSE $3 END, 'UTF8'),
                convert_to('key-' || g, 'UTF8'), 2, g * 1024, NULL, 1,
                0, 0, NULL, 0, 9000000000000
         FROM generate_series(1, $1) AS g"
    )))
    .bind(ROWS)
    .bind(TIER_NAMESPACES[1])
    .bind(TIER_NAMESPACES[0])
    .execute(&mut *conn)
    .await
    .unwrap();

    let sql = &pg.sql[0];
    for (name, statement, params) in [
        ("import", &sql.import, 8),
        ("namespaces", &sql.namespaces, 0),
        ("completed keys", &sql.completed_page, 3),
    ] {
        let plan = generic_plan(&mut conn, statement, params).await;
        eprintln!("PostgreSQL plan of {name}:\n{plan}");
        assert!(
            !plan.contains(&format!("Seq Scan on {table} ")),
            "{name} scans the table:\n{plan}"
        );
        let on_key = match name {
            "import" => format!("Conflict Arbiter Indexes: {table}_pkey"),
            "namespaces" => format!("Index Only Scan using {table}_pkey"),
            _ => format!("Index Scan using {table}_pkey"),
        };
        assert!(
            plan.contains(&on_key),
            "{name} does not use the primary key:\n{plan}"
        );
        if name == "completed keys" {
            assert!(
                !plan.contains("Sort"),
                "the page is not read in key order:\n{plan}"
            );
        }
    }
    drop(conn);

    let (listed, took) = page_through(&store, 10_000).await;
    eprintln!("PostgreSQL: completed_keys paged through {ROWS} rows in {took:?}");
    assert!(
        listed == tier_keys(),
        "keys out of encoded order or missing"
    );
    drop_tables(&store, &url, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_tier_statements_walk_the_primary_key() {
    let url = mysql_url();
    let Some((store, mut conn)) = mysql_store("tierplans").await else {
        return;
    };
    let my = mysql(&store);
    let table = store.tables().name(0).to_string();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO `{table}` (ns, k, state, token, fp, attempts, started_at, lease_until,
                               outcome, completed_at, expires_at)
         SELECT IF(seq % 2 = 0, ?, ?), CONCAT('key-', seq), 2, seq * 1024, NULL, 1,
                0, 0, NULL, 0, 9000000000000
         FROM seq_1_to_{ROWS}"
    )))
    .bind(TIER_NAMESPACES[1])
    .bind(TIER_NAMESPACES[0])
    .execute(&mut *conn)
    .await
    .unwrap();

    let rows = sqlx::query(AssertSqlSafe(format!("EXPLAIN {}", my.next_namespace[0])))
        .bind(TIER_NAMESPACES[1].as_bytes())
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let namespaces: Vec<PlanRow> = rows.iter().map(PlanRow::of).collect();
    let rows = sqlx::query(AssertSqlSafe(format!("EXPLAIN {}", my.completed_page[0])))
        .bind(TIER_NAMESPACES[0].as_bytes())
        .bind(&b"key-5"[..])
        .bind(1000_i64)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let page: Vec<PlanRow> = rows.iter().map(PlanRow::of).collect();
    let items: Vec<idem_core::tier::ImportItem> = [row_key(1), row_key(2)]
        .into_iter()
        .map(|key| idem_core::tier::ImportItem {
            key,
            record: idem_core::Completed {
                token: FencingToken::new(1),
                fingerprint: None,
                outcome: None,
                completed_at: idem_core::Timestamp::from_millis(1),
                expires_at: idem_core::Timestamp::from_millis(2),
            },
        })
        .collect();
    let refs: Vec<&idem_core::tier::ImportItem> = items.iter().collect();
    let mut q = QueryBuilder::new("EXPLAIN ");
    my.push_import_read(&mut q, 0, &refs, 1);
    let read_back = explain(&mut conn, q).await;
    drop(conn);
    for (name, plan) in [
        ("namespaces", &namespaces),
        ("completed keys", &page),
        ("import (read back)", &read_back),
    ] {
        eprintln!("MariaDB plan of {name}: {plan:?}");
        let row = plan
            .iter()
            .find(|r| r.table.as_deref().is_some_and(|t| t == table || t == "r"))
            .unwrap_or_else(|| panic!("{name}: no plan row for the table: {plan:?}"));
        assert!(
            row.key.as_deref() == Some("PRIMARY")
                && matches!(row.access.as_str(), "range" | "ref" | "const" | "eq_ref")
                && !row.extra.contains("filesort"),
            "{name} does not walk the primary key: {plan:?}"
        );
    }

    let (listed, took) = page_through(&store, 10_000).await;
    eprintln!("MySQL: completed_keys paged through {ROWS} rows in {took:?}");
    assert!(
        listed == tier_keys(),
        "keys out of encoded order or missing"
    );
    drop_tables(&store, &url, &table).await;
}

/// One row of MariaDB's `EXPLAIN`.
#[derive(Debug)]
pub(super) struct PlanRow {
    pub(super) table: Option<String>,
    pub(super) access: String,
    pub(super) key: Option<String>,
    pub(super) rows: Option<u64>,
    pub(super) extra: String,
}

impl PlanRow {
    pub(super) fn of(row: &sqlx::mysql::MySqlRow) -> Self {
        Self {
            table: row.try_get("table").unwrap(),
            access: row
                .try_get::<Option<String>, _>("type")
                .unwrap()
                .unwrap_or_default(),
            key: row.try_get("key").unwrap(),
            extra: row
                .try_get::<Option<String>, _>("Extra")
                .unwrap()
                .unwrap_or_default(),
            // MariaDB answers the estimate as text.
            rows: row
                .try_get::<Option<String>, _>("rows")
                .unwrap()
                .and_then(|n| n.parse().ok()),
        }
    }
}

async fn explain_text(conn: &mut sqlx::MySqlConnection, statement: &str) -> Vec<PlanRow> {
    let rows = sqlx::raw_sql(AssertSqlSafe(format!("EXPLAIN {statement}")))
        .fetch_all(conn)
        .await
        .unwrap();
    rows.iter().map(PlanRow::of).collect()
}

async fn explain(
    conn: &mut sqlx::MySqlConnection,
    mut q: QueryBuilder<sqlx::MySql>,
) -> Vec<PlanRow> {
    let rows = q.build().fetch_all(conn).await.unwrap();
    rows.iter().map(PlanRow::of).collect()
}

pub(super) async fn drop_tables(store: &SqlStore, url: &str, table: &str) {
    let schema = format!("{}_schema", store.tables().prefix());
    let tokens = format!("{}_tokens", store.tables().prefix());
    let q = if url.starts_with("postgres") {
        '"'
    } else {
        '`'
    };
    for name in [table, &tokens, &schema] {
        let sql = format!("DROP TABLE IF EXISTS {q}{name}{q}");
        match &store.records().db {
            Db::Postgres(pg) => sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&pg.pool)
                .await
                .map(drop),
            Db::MySql(my) => sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&my.pool)
                .await
                .map(drop),
        }
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statements_planned_on_an_empty_table_stay_on_the_primary_key() {
    let url = postgres_url();
    let Some((store, mut conn)) = unanalysed_postgres("emptyplans").await else {
        return;
    };
    let pg = postgres(&store);
    let table = store.tables().name(0).to_string();
    // A session plans a statement once, on the table as it is then: for a
    // store's first statements that is an empty table, which the planner
    // takes for ten pages whatever is inserted later.
    let sql = &pg.sql[0];
    let tier = [
        ("import", &sql.import, 8),
        ("namespaces", &sql.namespaces, 0),
        ("completed keys", &sql.completed_page, 3),
    ];
    for (name, statement, params) in record_statements(sql).into_iter().chain(tier) {
        let plan = generic_plan(&mut conn, statement, params).await;
        assert!(
            !plan.contains(&format!("Seq Scan on {table} ")),
            "{name} scans the new table:\n{plan}"
        );
        let on_key = match name {
            "sweep" => format!("{table}_expires"),
            "import" => format!("Conflict Arbiter Indexes: {table}_pkey"),
            _ => format!("{table}_pkey"),
        };
        assert!(
            plan.contains(&on_key),
            "{name} does not find its rows through the index:\n{plan}"
        );
    }
    drop(conn);
    drop_tables(&store, &url, &table).await;
}

/// The table's sequential and index scans so far, as the server's
/// statistics count them.
async fn table_scans(conn: &mut PgConnection, table: &str) -> (i64, i64) {
    sqlx::raw_sql("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_user_tables
         WHERE relid = to_regclass(quote_ident($1))",
    )
    .bind(table)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Every operation of the store once, on keys of its own (`task`, `round`).
async fn every_operation(store: &SqlStore, task: usize, round: usize) {
    use idem_core::tier::{ImportItem, Tier};
    let key = |what: &str| Key::new("ops", format!("{what}-{task}-{round}")).unwrap();
    let lease = Lease::from_secs(30);
    let retention = Duration::from_secs(60);
    let Begin::Acquired(claim) = store.begin(&key("e"), None, lease).await.unwrap() else {
        panic!("a fresh key is acquired")
    };
    assert!(
        !store
            .extend(&key("e"), claim.token, lease)
            .await
            .unwrap()
            .is_stale()
    );
    assert!(
        !store
            .release(&key("e"), claim.token)
            .await
            .unwrap()
            .is_stale()
    );
    let items: Vec<BeginItem> = ["m1", "m2"]
        .map(|w| BeginItem {
            key: key(w),
            fingerprint: None,
            lease,
        })
        .into();
    let begun = store.begin_many(&items).await.unwrap();
    let done: Vec<CompleteItem> = begun
        .iter()
        .zip(&items)
        .map(|(b, item)| {
            let Begin::Acquired(claim) = b else {
                panic!("fresh keys are acquired")
            };
            CompleteItem {
                key: item.key.clone(),
                token: claim.token,
                outcome: None,
                retention,
            }
        })
        .collect();
    let completed = store.complete_many(&done).await.unwrap();
    assert!(completed.iter().all(|c| !c.is_stale()));
    assert!(store.get(&key("m1")).await.unwrap().is_some());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let imported = store
        .import_many(&[ImportItem {
            key: key("i"),
            record: idem_core::Completed {
                token: FencingToken::new(1),
                fingerprint: None,
                outcome: None,
                completed_at: idem_core::Timestamp::from_millis(now),
                expires_at: idem_core::Timestamp::from_millis(now + 60_000),
            },
        }])
        .await
        .unwrap();
    assert_eq!(imported.len(), 1);
    store.token_high_water().await.unwrap();
    store.completed_keys(Some(&key("i")), 10).await.unwrap();
    store.sweep().await.unwrap();
}

/// `begin` then `complete` on fresh keys (of `round`) from `tasks` tasks;
/// cycles a second.
async fn cycles(store: &SqlStore, round: usize, tasks: usize, per_task: usize) -> f64 {
    let start = Instant::now();
    let runs: Vec<_> = (0..tasks)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let key = Key::new("cycles", format!("{round}-{t}-{i}")).unwrap();
                    let Begin::Acquired(claim) =
                        store.begin(&key, None, Lease::from_secs(30)).await.unwrap()
                    else {
                        panic!("a fresh key is acquired")
                    };
                    let done = store
                        .complete(&key, claim.token, None, Duration::from_secs(60))
                        .await
                        .unwrap();
                    assert!(!done.is_stale());
                }
            })
        })
        .collect();
    for run in runs {
        run.await.unwrap();
    }
    (tasks * per_task) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_on_a_new_table_never_scans_it() {
    use sqlx::Connection as _;
    const TASKS: usize = 64;
    let url = postgres_url();
    let Some((store, conn)) = unanalysed_postgres("newtable").await else {
        return;
    };
    drop(conn);
    let table = store.tables().name(0).to_string();
    let prefix = store.tables().prefix().to_string();
    let mut own = PgConnection::connect(&url).await.unwrap();

    // The store's sessions plan their statements on the empty table.
    let warm: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move { every_operation(&store, t, 0).await })
        })
        .collect();
    for w in warm {
        w.await.unwrap();
    }
    let first = cycles(&store, 0, TASKS, 2).await;
    eprintln!("PostgreSQL: {first:.0} begin+complete cycles/s, {TASKS} tasks, empty table");

    // Then the table fills, and nothing analyses it.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at)
         SELECT convert_to('filled', 'UTF8'), convert_to('key-' || g, 'UTF8'), 2, g * 1024, NULL,
                1, 0, 0, NULL, 0, 9000000000000
         FROM generate_series(1, $1) AS g"
    )))
    .bind(ROWS)
    .execute(&mut own)
    .await
    .unwrap();
    let rate = cycles(&store, 1, TASKS, 100).await;
    eprintln!(
        "PostgreSQL: {rate:.0} begin+complete cycles/s, {TASKS} tasks, new table of {ROWS} rows"
    );
    let after: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move { every_operation(&store, t, 1).await })
        })
        .collect();
    for a in after {
        a.await.unwrap();
    }

    // A session's counts reach the statistics when it ends, at the latest.
    let pool = &postgres(&store).pool;
    let mut held = Vec::new();
    let mut pids: Vec<i32> = Vec::new();
    for _ in 0..pool.size() {
        let mut c = pool.acquire().await.unwrap();
        pids.push(
            sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *c)
                .await
                .unwrap(),
        );
        held.push(c);
    }
    drop(held);
    pool.close().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&pids)
                .fetch_one(&mut own)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store's sessions did not end"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (seq, idx) = table_scans(&mut own, &table).await;
    // Building an index reads the table once, and counts as a scan.
    let built: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass(quote_ident($1))",
    )
    .bind(&table)
    .fetch_one(&mut own)
    .await
    .unwrap();
    let analysed: bool = sqlx::query_scalar(
        "SELECT reltuples >= 0 FROM pg_class WHERE oid = to_regclass(quote_ident($1))",
    )
    .bind(&table)
    .fetch_one(&mut own)
    .await
    .unwrap();
    for name in [
        table.clone(),
        format!("{prefix}_tokens"),
        format!("{prefix}_schema"),
    ] {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{name}\"")))
            .execute(&mut own)
            .await
            .unwrap();
    }
    assert!(!analysed, "the table must not have been analysed");
    assert!(
        idx > 2 * (TASKS * 100) as i64,
        "only {idx} index scans counted"
    );
    assert_eq!(
        seq - built,
        0,
        "besides building its indexes, the store scanned the table {} times",
        seq - built
    );
}
