//! Guarded status transitions on real PostgreSQL and MariaDB: a row's status
//! moves only along declared edges, each move is applied once however many
//! times (and however concurrently) it is asked for, and its log row commits
//! or rolls back with it.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod servers;
mod support;

use std::sync::Arc;

use idem_sql::{
    Dialect, InvalidTransitions, SqlConnection, StatusChange, StatusColumn, TransitionError,
    Transitions,
};
use servers::{Sql, on_both, table};
use sqlx::{Database, Pool};

fn orders_graph() -> Transitions {
    Transitions::new()
        .edge("unpaid", "paid")
        .edge("paid", "shipped")
        .edge("paid", "refunded")
}

/// An `orders` table (`id BIGINT` primary key, `status`) and an installed
/// log, named for one test.
struct Orders {
    orders: StatusColumn,
    table: String,
    log: String,
}

impl Orders {
    async fn new<DB>(pool: &Pool<DB>, name: &str) -> Self
    where
        DB: Database,
        DB::Connection: Sql,
    {
        let table = table(&format!("{name}_orders"));
        let log = table_log(name);
        let orders = orders_graph()
            .bind(&table, "id", "status")
            .unwrap()
            .log_table(&log)
            .unwrap();
        orders.install(pool).await.unwrap();
        orders.install(pool).await.unwrap(); // idempotent
        let mut conn = pool.acquire().await.unwrap();
        conn.run(&format!("DROP TABLE IF EXISTS {table}")).await;
        conn.run(&format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, status VARCHAR(32) NOT NULL)"
        ))
        .await;
        Self { orders, table, log }
    }

    async fn insert<C: Sql>(&self, conn: &mut C, id: i64, status: &str) {
        conn.run(&format!(
            "INSERT INTO {} (id, status) VALUES ({id}, '{status}')",
            self.table
        ))
        .await;
    }

    async fn status<C: Sql>(&self, conn: &mut C, id: i64) -> Option<String> {
        conn.text(&format!(
            "SELECT status FROM {} WHERE id = {id}",
            self.table
        ))
        .await
    }

    async fn logged<C: Sql>(&self, conn: &mut C, id: i64) -> i64 {
        conn.count(&format!(
            "SELECT COUNT(*) FROM {} WHERE table_name = '{}' AND entity_id = '{id}'",
            self.log, self.table
        ))
        .await
    }

    async fn drop_tables<C: Sql>(self, conn: &mut C) {
        for t in [&self.table, &self.log] {
            conn.run(&format!("DROP TABLE IF EXISTS {t}")).await;
        }
    }
}

fn table_log(name: &str) -> String {
    table(&format!("{name}_log"))
}

#[test]
fn the_graph_and_the_names_are_checked_when_bound() {
    let g = orders_graph();
    assert!(g.allows("unpaid", "paid"));
    assert!(!g.allows("paid", "unpaid"), "edges have a direction");
    assert!(!g.allows("shipped", "refunded"), "undeclared");
    assert_eq!(g.after("paid").collect::<Vec<_>>(), ["refunded", "shipped"]);

    let e = Transitions::new()
        .edge("paid", "paid")
        .bind("orders", "id", "status")
        .unwrap_err();
    assert!(matches!(e, InvalidTransitions::SelfLoop { .. }), "{e}");
    let e = Transitions::new()
        .edge("", "paid")
        .bind("orders", "id", "status")
        .unwrap_err();
    assert!(
        matches!(e, InvalidTransitions::Status { len: 0, .. }),
        "{e}"
    );
    let e = Transitions::new()
        .edge("unpaid", "p".repeat(256))
        .bind("orders", "id", "status")
        .unwrap_err();
    assert!(
        matches!(e, InvalidTransitions::Status { len: 256, .. }),
        "{e}"
    );

    for (table, id, status) in [
        ("orders; DROP TABLE orders", "id", "status"),
        ("orders", "Id", "status"),
        ("orders", "id", "status\""),
        ("orders", "id", ""),
    ] {
        let e = orders_graph().bind(table, id, status).unwrap_err();
        assert!(matches!(e, InvalidTransitions::Identifier(_)), "{e}");
        assert!(e.to_string().contains("a-z, 0-9 and _"), "{e}");
    }
    let bound = orders_graph().bind("order", "id", "status").unwrap();
    assert!(bound.log_table("log`x").is_err());
}

on_both!(undeclared_moves_are_illegal_before_any_sql_runs, 2);
async fn undeclared_moves_are_illegal_before_any_sql_runs<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    // Bound to a table that does not exist: any SQL would fail, and on
    // PostgreSQL abort the transaction.
    let orders = orders_graph()
        .bind(&table("tr_no_such_orders"), "id", "status")
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    for (from, to, allowed) in [
        ("paid", "unpaid", &["refunded", "shipped"][..]),
        ("unpaid", "shipped", &["paid"][..]),
        ("shipped", "refunded", &[][..]),
        ("lost", "paid", &[][..]),
    ] {
        match orders.transition(&mut *tx, 1_i64, from, to).await {
            Err(TransitionError::Illegal {
                from: f,
                to: t,
                allowed: a,
                ..
            }) => {
                assert_eq!((f.as_str(), t.as_str()), (from, to));
                assert_eq!(a, allowed);
            }
            other => panic!("{from} → {to}: {other:?}"),
        }
    }
    let e = orders
        .transition(&mut *tx, 1_i64, "shipped", "refunded")
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("no transition from \"shipped\" is declared"),
        "{e}"
    );
    // The first SQL that runs is this declared move's: the transaction was
    // still clean, so the error is the missing table's.
    let e = orders
        .transition(&mut *tx, 1_i64, "unpaid", "paid")
        .await
        .unwrap_err();
    assert!(matches!(e, TransitionError::MissingTable { .. }), "{e}");
}

on_both!(a_repeated_move_is_already_in_target_and_logged_once, 2);
async fn a_repeated_move_is_already_in_target_and_logged_once<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_again").await;
    let mut conn = pool.acquire().await.unwrap();
    o.insert(&mut *conn, 1, "unpaid").await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        let mut tx = pool.begin().await.unwrap();
        answers.push(
            o.orders
                .transition(&mut *tx, 1_i64, "unpaid", "paid")
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    assert_eq!(
        answers,
        [
            StatusChange::Applied,
            StatusChange::AlreadyInTarget,
            StatusChange::AlreadyInTarget
        ]
    );
    assert_eq!(o.status(&mut *conn, 1).await.as_deref(), Some("paid"));
    assert_eq!(o.logged(&mut *conn, 1).await, 1);
    o.drop_tables(&mut *conn).await;
}

on_both!(a_move_from_a_status_the_row_has_left_is_a_conflict, 2);
async fn a_move_from_a_status_the_row_has_left_is_a_conflict<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_conflict").await;
    let mut conn = pool.acquire().await.unwrap();
    o.insert(&mut *conn, 7, "shipped").await;
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        o.orders
            .transition(&mut *tx, 7_i64, "paid", "refunded")
            .await
            .unwrap(),
        StatusChange::Conflict {
            current: "shipped".into()
        },
        "refunding a shipped order is refused with where it is"
    );
    assert_eq!(
        o.orders
            .transition(&mut *tx, 7_i64, "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::Conflict {
            current: "shipped".into()
        }
    );
    tx.commit().await.unwrap();
    assert_eq!(o.status(&mut *conn, 7).await.as_deref(), Some("shipped"));
    assert_eq!(o.logged(&mut *conn, 7).await, 0, "nothing written");
    o.drop_tables(&mut *conn).await;
}

on_both!(a_move_of_a_missing_row_is_not_found, 2);
async fn a_move_of_a_missing_row_is_not_found<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_missing").await;
    let mut conn = pool.acquire().await.unwrap();
    o.insert(&mut *conn, 1, "unpaid").await;
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        o.orders
            .transition(&mut *tx, 999_i64, "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::NotFound
    );
    tx.commit().await.unwrap();
    assert_eq!(o.logged(&mut *conn, 999).await, 0);
    assert_eq!(o.status(&mut *conn, 1).await.as_deref(), Some("unpaid"));
    o.drop_tables(&mut *conn).await;
}

on_both!(the_log_row_commits_and_rolls_back_with_the_move, 3);
async fn the_log_row_commits_and_rolls_back_with_the_move<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_log").await;
    let mut conn = pool.acquire().await.unwrap();
    let dialect = conn.dialect();
    o.insert(&mut *conn, 5, "unpaid").await;

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        o.orders
            .transition(&mut *tx, 5_i64, "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::Applied
    );
    assert_eq!(o.logged(&mut *tx, 5).await, 1, "in the transaction");
    assert_eq!(o.status(&mut *tx, 5).await.as_deref(), Some("paid"));
    assert_eq!(o.logged(&mut *conn, 5).await, 0, "not outside it yet");
    tx.rollback().await.unwrap();
    assert_eq!(o.status(&mut *conn, 5).await.as_deref(), Some("unpaid"));
    assert_eq!(
        o.logged(&mut *conn, 5).await,
        0,
        "rolled back with the move"
    );

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        o.orders
            .transition(&mut *tx, 5_i64, "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::Applied
    );
    tx.commit().await.unwrap();
    assert_eq!(o.status(&mut *conn, 5).await.as_deref(), Some("paid"));
    let recent = match dialect {
        Dialect::Postgres => "now() - INTERVAL '1' MINUTE",
        Dialect::MySql => "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE",
    };
    assert_eq!(
        conn.count(&format!(
            "SELECT COUNT(*) FROM {} WHERE table_name = '{}' AND entity_id = '5' \
             AND from_status = 'unpaid' AND to_status = 'paid' AND at > {recent}",
            o.log, o.table
        ))
        .await,
        1,
        "table, id, from, to, and the database's clock (UTC)"
    );
    o.drop_tables(&mut *conn).await;
}

on_both!(text_ids_and_reserved_words_as_names_work, 2);
async fn text_ids_and_reserved_words_as_names_work<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let table = table("tr_text_orders");
    let log = table_log("tr_text");
    let mut conn = pool.acquire().await.unwrap();
    let dialect = conn.dialect();
    let q = |name: &str| match dialect {
        Dialect::Postgres => format!("\"{name}\""),
        Dialect::MySql => format!("`{name}`"),
    };
    // `key` and `order` are reserved words: quoting makes them work.
    let (key, order) = (q("key"), q("order"));
    conn.run(&format!("DROP TABLE IF EXISTS {table}")).await;
    conn.run(&format!(
        "CREATE TABLE {table} ({key} VARCHAR(64) PRIMARY KEY, {order} VARCHAR(32) NOT NULL)"
    ))
    .await;
    conn.run(&format!(
        "INSERT INTO {table} ({key}, {order}) VALUES ('order-7', 'unpaid')"
    ))
    .await;
    let orders = orders_graph()
        .bind(&table, "key", "order")
        .unwrap()
        .log_table(&log)
        .unwrap();
    orders.install(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        orders
            .transition(&mut *tx, "order-7", "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::Applied
    );
    assert_eq!(
        orders
            .transition(&mut *tx, String::from("order-7"), "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::AlreadyInTarget
    );
    assert_eq!(
        orders
            .transition(&mut *tx, "order-8", "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::NotFound
    );
    tx.commit().await.unwrap();
    assert_eq!(
        conn.count(&format!(
            "SELECT COUNT(*) FROM {log} WHERE entity_id = 'order-7' AND to_status = 'paid'"
        ))
        .await,
        1
    );
    for t in [&table, &log] {
        conn.run(&format!("DROP TABLE {t}")).await;
    }
}

on_both!(schema_mistakes_are_errors_that_say_what_is_wrong, 3);
async fn schema_mistakes_are_errors_that_say_what_is_wrong<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_schema").await;
    let mut conn = pool.acquire().await.unwrap();
    o.insert(&mut *conn, 1, "unpaid").await;

    // A status column that is not there.
    let wrong = orders_graph()
        .bind(&o.table, "id", "state")
        .unwrap()
        .log_table(&o.log)
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = wrong
        .transition(&mut *tx, 1_i64, "unpaid", "paid")
        .await
        .unwrap_err();
    assert!(matches!(e, TransitionError::MissingColumn { .. }), "{e}");
    assert!(!e.is_transient());
    drop(tx);

    // The log table not installed: the move's own transaction fails, and
    // rolled back nothing moved.
    let unlogged = orders_graph()
        .bind(&o.table, "id", "status")
        .unwrap()
        .log_table(&table_log("tr_schema_none"))
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = unlogged
        .transition(&mut *tx, 1_i64, "unpaid", "paid")
        .await
        .unwrap_err();
    assert!(matches!(e, TransitionError::MissingTable { .. }), "{e}");
    assert!(e.to_string().contains("StatusColumn::install"), "{e}");
    drop(tx);
    assert_eq!(o.status(&mut *conn, 1).await.as_deref(), Some("unpaid"));

    // An id column that is not unique.
    let loose = table("tr_schema_loose");
    conn.run(&format!("DROP TABLE IF EXISTS {loose}")).await;
    conn.run(&format!(
        "CREATE TABLE {loose} (id BIGINT NOT NULL, status VARCHAR(32))"
    ))
    .await;
    conn.run(&format!(
        "INSERT INTO {loose} (id, status) VALUES (1, 'unpaid'), (1, 'unpaid'), (2, NULL)"
    ))
    .await;
    let loose_orders = orders_graph()
        .bind(&loose, "id", "status")
        .unwrap()
        .log_table(&o.log)
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = loose_orders
        .transition(&mut *tx, 1_i64, "unpaid", "paid")
        .await
        .unwrap_err();
    assert!(
        matches!(e, TransitionError::NotUnique { rows: 2, .. }),
        "{e}"
    );
    drop(tx);
    // A NULL status.
    let mut tx = pool.begin().await.unwrap();
    let e = loose_orders
        .transition(&mut *tx, 2_i64, "unpaid", "paid")
        .await
        .unwrap_err();
    assert!(matches!(e, TransitionError::NullStatus { .. }), "{e}");
    drop(tx);
    conn.run(&format!("DROP TABLE {loose}")).await;
    o.drop_tables(&mut *conn).await;
}

on_both!(concurrent_identical_moves_apply_exactly_once, 34);
/// THE RACE: 32 transactions move one order `unpaid → paid` at once.
async fn concurrent_identical_moves_apply_exactly_once<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    const MOVES: usize = 32;
    let o = Arc::new(Orders::new(&pool, "tr_race").await);
    let mut conn = pool.acquire().await.unwrap();
    o.insert(&mut *conn, 1, "unpaid").await;
    let barrier = Arc::new(tokio::sync::Barrier::new(MOVES));
    let moves: Vec<_> = (0..MOVES)
        .map(|_| {
            let (pool, o, barrier) = (pool.clone(), o.clone(), barrier.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                // The handler reads the order first, as handlers do: under
                // MySQL's REPEATABLE READ this fixes the transaction's
                // snapshot, which a plain (not locking) read would return
                // after the winner has moved on.
                assert_eq!(o.status(&mut *tx, 1).await.as_deref(), Some("unpaid"));
                barrier.wait().await;
                let change = o
                    .orders
                    .transition(&mut *tx, 1_i64, "unpaid", "paid")
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                change
            })
        })
        .collect();
    let mut answers = Vec::new();
    for m in moves {
        answers.push(m.await.unwrap());
    }
    let applied = answers
        .iter()
        .filter(|c| **c == StatusChange::Applied)
        .count();
    let already = answers
        .iter()
        .filter(|c| **c == StatusChange::AlreadyInTarget)
        .count();
    assert_eq!((applied, already), (1, MOVES - 1), "{answers:?}");
    assert_eq!(o.status(&mut *conn, 1).await.as_deref(), Some("paid"));
    assert_eq!(o.logged(&mut *conn, 1).await, 1, "one log row");
    Arc::into_inner(o).unwrap().drop_tables(&mut *conn).await;
}

on_both!(
    under_snapshot_isolation_a_lost_race_is_never_applied_twice,
    3
);
/// A transaction whose snapshot predates another's move of the row.
async fn under_snapshot_isolation_a_lost_race_is_never_applied_twice<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_snapshot").await;
    let mut conn = pool.acquire().await.unwrap();
    o.insert(&mut *conn, 1, "unpaid").await;
    let mut late = pool.begin().await.unwrap();
    let dialect = late.dialect();
    if dialect == Dialect::Postgres {
        late.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await;
    } // MySQL/MariaDB: REPEATABLE READ is the default.
    assert_eq!(o.status(&mut *late, 1).await.as_deref(), Some("unpaid"));

    let mut first = pool.begin().await.unwrap();
    assert_eq!(
        o.orders
            .transition(&mut *first, 1_i64, "unpaid", "paid")
            .await
            .unwrap(),
        StatusChange::Applied
    );
    first.commit().await.unwrap();

    let change = o
        .orders
        .transition(&mut *late, 1_i64, "unpaid", "paid")
        .await;
    match dialect {
        // PostgreSQL will not update a row changed since the snapshot: a
        // serialization failure, to retry.
        Dialect::Postgres => {
            let e = change.unwrap_err();
            assert!(matches!(e, TransitionError::Database { .. }), "{e}");
            assert!(e.is_transient(), "{e}");
        }
        // InnoDB's update and locking read see the latest committed row.
        Dialect::MySql => assert_eq!(change.unwrap(), StatusChange::AlreadyInTarget),
    }
    drop(late);
    assert_eq!(o.logged(&mut *conn, 1).await, 1);
    o.drop_tables(&mut *conn).await;
}

on_both!(a_move_dropped_at_any_point_changes_nothing, 3);
/// Cancel safety: a move dropped after its first poll, or later, with its
/// transaction.
async fn a_move_dropped_at_any_point_changes_nothing<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let o = Orders::new(&pool, "tr_dropped").await;
    let mut conn = pool.acquire().await.unwrap();
    let delays = [0, 10, 50, 100, 200, 500, 1000, 2000, 5000];
    for id in 0..delays.len() as i64 {
        o.insert(&mut *conn, id, "unpaid").await;
    }
    for (id, micros) in delays.into_iter().enumerate() {
        let id = id as i64;
        let mut tx = pool.begin().await.unwrap();
        let change = o.orders.transition(&mut *tx, id, "unpaid", "paid");
        let _ = tokio::time::timeout(std::time::Duration::from_micros(micros), change).await;
        drop(tx);
        assert_eq!(
            o.status(&mut *conn, id).await.as_deref(),
            Some("unpaid"),
            "dropped after {micros} µs"
        );
        assert_eq!(o.logged(&mut *conn, id).await, 0);
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(
            o.orders
                .transition(&mut *tx, id, "unpaid", "paid")
                .await
                .unwrap(),
            StatusChange::Applied,
            "the retry finds the row as it was"
        );
        tx.commit().await.unwrap();
    }
    o.drop_tables(&mut *conn).await;
}
