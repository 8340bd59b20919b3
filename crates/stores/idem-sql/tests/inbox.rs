//! The inbox on real PostgreSQL and MariaDB: a message's key is recorded by
//! the transaction that makes its business write, so however the message is
//! delivered (after a failure, many times at once, through the consumer
//! runner) the write happens once, and no error passes for a duplicate.
//!
//! The business tables here have no unique key: a second write would show
//! as a second row.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod servers;
mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{Backoff, HandlerError, MemorySource, Message, Runner};
use idem_core::{Bytes, ClaimHandle, Key};
use idem_sql::{Claimed, Dialect, Inbox, InboxError, MAX_KEY_BYTES, SqlConnection};
use servers::{Sql, on_both, table};
use sqlx::{Database, Pool};
use tokio_util::sync::CancellationToken;

/// An installed inbox and a business table (`message`, `note`), named for
/// one test.
struct Setup {
    inbox: Inbox,
    business: String,
}

impl Setup {
    async fn new<DB>(pool: &Pool<DB>, name: &str) -> Self
    where
        DB: Database,
        DB::Connection: Sql,
    {
        let inbox = Inbox::new(&table(&format!("{name}_inbox"))).unwrap();
        let business = table(&format!("{name}_business"));
        // Twice: installing is idempotent.
        inbox.install(pool).await.unwrap();
        inbox.install(pool).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        conn.run(&format!("DROP TABLE IF EXISTS {business}")).await;
        conn.run(&format!(
            "CREATE TABLE {business} (message VARCHAR(64) NOT NULL, note VARCHAR(64) NOT NULL)"
        ))
        .await;
        Self { inbox, business }
    }

    /// The business write for `message`.
    fn write(&self, message: &str) -> String {
        format!(
            "INSERT INTO {} (message, note) VALUES ('{message}', 'shipped')",
            self.business
        )
    }

    async fn counts<C: Sql>(&self, conn: &mut C) -> (i64, i64) {
        let business = conn
            .count(&format!("SELECT COUNT(*) FROM {}", self.business))
            .await;
        let keys = conn
            .count(&format!("SELECT COUNT(*) FROM {}", self.inbox.table()))
            .await;
        (business, keys)
    }

    async fn drop_tables<C: Sql>(self, conn: &mut C) {
        for t in [self.inbox.table(), &self.business] {
            conn.run(&format!("DROP TABLE IF EXISTS {t}")).await;
        }
    }
}

fn key(id: &str) -> Key {
    Key::new("orders", id.to_owned()).unwrap()
}

on_both!(
    a_handler_failing_after_its_write_leaves_neither_the_write_nor_the_key,
    4
);
async fn a_handler_failing_after_its_write_leaves_neither_the_write_nor_the_key<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_fail").await;
    {
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(
            s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap(),
            Claimed::New
        );
        tx.run(&s.write("m-1")).await;
        // The handler fails here: its transaction is dropped, not committed.
    }
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(s.counts(&mut *conn).await, (0, 0), "rolled back together");

    // The redelivery runs as new, and this time commits.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap(),
        Claimed::New
    );
    tx.run(&s.write("m-1")).await;
    tx.commit().await.unwrap();
    assert_eq!(s.counts(&mut *conn).await, (1, 1));

    // Another copy is a duplicate.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap(),
        Claimed::Duplicate
    );
    drop(tx);
    assert_eq!(s.counts(&mut *conn).await, (1, 1));
    s.drop_tables(&mut *conn).await;
}

on_both!(
    concurrent_copies_make_one_write_and_the_losers_stay_usable,
    20
);
/// 16 copies of one message, each in its own transaction, claim at once.
async fn concurrent_copies_make_one_write_and_the_losers_stay_usable<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    const COPIES: usize = 16;
    let s = Arc::new(Setup::new(&pool, "ib_race").await);
    let audit = table("ib_race_audit");
    {
        let mut conn = pool.acquire().await.unwrap();
        conn.run(&format!("DROP TABLE IF EXISTS {audit}")).await;
        conn.run(&format!("CREATE TABLE {audit} (copy INT NOT NULL)"))
            .await;
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(COPIES));
    let copies: Vec<_> = (0..COPIES)
        .map(|copy| {
            let (pool, s, barrier, audit) =
                (pool.clone(), s.clone(), barrier.clone(), audit.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                barrier.wait().await;
                let claimed = s.inbox.claim(&mut *tx, &key("m-race")).await.unwrap();
                match claimed {
                    Claimed::New => tx.run(&s.write("m-race")).await,
                    // The duplicate left the transaction usable: it can
                    // write and commit.
                    Claimed::Duplicate => {
                        tx.run(&format!("INSERT INTO {audit} (copy) VALUES ({copy})"))
                            .await
                    }
                };
                tx.commit().await.unwrap();
                claimed
            })
        })
        .collect();
    let mut answers = Vec::new();
    for copy in copies {
        answers.push(copy.await.unwrap());
    }
    let new = answers.iter().filter(|&&c| c == Claimed::New).count();
    assert_eq!(new, 1, "exactly one copy is new: {answers:?}");
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(s.counts(&mut *conn).await, (1, 1), "one business write");
    assert_eq!(
        conn.count(&format!("SELECT COUNT(*) FROM {audit}")).await,
        COPIES as i64 - 1,
        "every duplicate's transaction committed its own write"
    );
    conn.run(&format!("DROP TABLE {audit}")).await;
    Arc::into_inner(s).unwrap().drop_tables(&mut *conn).await;
}

on_both!(a_copy_waiting_on_a_transaction_that_rolls_back_is_new, 4);
async fn a_copy_waiting_on_a_transaction_that_rolls_back_is_new<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Arc::new(Setup::new(&pool, "ib_wait").await);
    let mut first = pool.begin().await.unwrap();
    assert_eq!(
        s.inbox.claim(&mut *first, &key("m-1")).await.unwrap(),
        Claimed::New
    );
    first.run(&s.write("m-1")).await;
    let waiter = {
        let (pool, s) = (pool.clone(), s.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let claimed = s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap();
            if claimed == Claimed::New {
                tx.run(&s.write("m-1")).await;
            }
            tx.commit().await.unwrap();
            claimed
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the second copy waits while the first holder's transaction is open"
    );
    first.rollback().await.unwrap();
    assert_eq!(
        waiter.await.unwrap(),
        Claimed::New,
        "the first holder rolled back: the waiting copy does the work"
    );
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(s.counts(&mut *conn).await, (1, 1));
    Arc::into_inner(s).unwrap().drop_tables(&mut *conn).await;
}

on_both!(errors_other_than_a_duplicate_are_not_swallowed, 4);
async fn errors_other_than_a_duplicate_are_not_swallowed<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_errors").await;
    let mut tx = pool.begin().await.unwrap();
    let dialect = tx.dialect();

    // Too long: refused before any SQL runs, so even PostgreSQL's
    // transaction is still usable.
    let long = Key::new("orders", vec![b'k'; MAX_KEY_BYTES + 1]).unwrap();
    let e = s.inbox.claim(&mut *tx, &long).await.unwrap_err();
    assert!(
        matches!(e, InboxError::KeyTooLong { len, .. } if len == MAX_KEY_BYTES + 1),
        "{e}"
    );
    assert!(e.to_string().contains("up to 1024 bytes"), "{e}");
    let longest = Key::new("orders", vec![b'k'; MAX_KEY_BYTES]).unwrap();
    assert_eq!(
        s.inbox.claim(&mut *tx, &longest).await.unwrap(),
        Claimed::New
    );
    tx.commit().await.unwrap();

    // No table: said so, with the fix.
    let missing = Inbox::new(&table("ib_no_such_table")).unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = missing.claim(&mut *tx, &key("m-1")).await.unwrap_err();
    assert!(matches!(e, InboxError::MissingTable { .. }), "{e}");
    assert!(e.to_string().contains("Inbox::install"), "{e}");
    assert!(!e.is_transient());
    drop(tx);

    // A value the column cannot hold is an error, not a duplicate (what
    // MySQL's INSERT IGNORE would have made of it: a warning, a truncated
    // namespace, and a claim that looks fine).
    let narrow = Inbox::new(&table("ib_narrow")).unwrap();
    let mut conn = pool.acquire().await.unwrap();
    conn.run(&format!("DROP TABLE IF EXISTS {}", narrow.table()))
        .await;
    let create = &narrow.ddl(dialect)[0];
    let (wide, two) = match dialect {
        Dialect::Postgres => ("varchar(64)", "varchar(2)"),
        _ => ("VARCHAR(64)", "VARCHAR(2)"),
    };
    assert!(create.contains(wide), "{create}");
    conn.run(&create.replacen(wide, two, 1)).await;
    let mut tx = pool.begin().await.unwrap();
    let e = narrow.claim(&mut *tx, &key("m-1")).await.unwrap_err();
    assert!(matches!(e, InboxError::Database { .. }), "{e}");
    assert!(!e.is_transient(), "{e}");
    drop(tx);
    assert_eq!(
        conn.count(&format!("SELECT COUNT(*) FROM {}", narrow.table()))
            .await,
        0
    );
    conn.run(&format!("DROP TABLE {}", narrow.table())).await;
    s.drop_tables(&mut *conn).await;
}

on_both!(sweep_removes_only_keys_older_than_the_retention, 4);
async fn sweep_removes_only_keys_older_than_the_retention<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_sweep").await;
    let inbox = s.inbox.clone().sweep_batch(2);
    let mut tx = pool.begin().await.unwrap();
    for (namespace, id) in [
        ("old", "a"),
        ("old", "b"),
        ("old", "c"),
        ("old", "d"),
        ("old", "e"),
        ("new", "a"),
        ("new", "b"),
    ] {
        let key = Key::new(namespace, id).unwrap();
        assert_eq!(inbox.claim(&mut *tx, &key).await.unwrap(), Claimed::New);
    }
    tx.commit().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // Consumed two hours ago, by the database's clock.
    let aged = conn
        .run(&format!(
            "UPDATE {} SET consumed_at = consumed_at - INTERVAL '2' HOUR WHERE namespace = 'old'",
            inbox.table()
        ))
        .await;
    assert_eq!(aged, 5);

    let swept = inbox.sweep(&pool, Duration::from_secs(3600)).await.unwrap();
    assert_eq!(swept, 5, "in batches of 2: 2, 2, 1");
    assert_eq!(
        conn.count(&format!(
            "SELECT COUNT(*) FROM {} WHERE namespace = 'new'",
            inbox.table()
        ))
        .await,
        2,
        "recent keys stay"
    );
    assert_eq!(s.counts(&mut *conn).await.1, 2);
    assert_eq!(
        inbox.sweep(&pool, Duration::from_secs(3600)).await.unwrap(),
        0
    );

    // What the retention means: a copy after it is no longer caught.
    let mut tx = pool.begin().await.unwrap();
    let old = Key::new("old", "a").unwrap();
    let recent = Key::new("new", "a").unwrap();
    assert_eq!(inbox.claim(&mut *tx, &old).await.unwrap(), Claimed::New);
    assert_eq!(
        inbox.claim(&mut *tx, &recent).await.unwrap(),
        Claimed::Duplicate
    );
    drop(tx);
    s.drop_tables(&mut *conn).await;
}

on_both!(
    the_runner_without_claims_and_the_inbox_write_each_message_once,
    20
);
/// Two consumer processes (runners without claims) share one queue with
/// copies of every other message; some handlers fail after their write on
/// the first attempt. Each message is written once.
async fn the_runner_without_claims_and_the_inbox_write_each_message_once<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    const MESSAGES: usize = 40;
    let s = Arc::new(Setup::new(&pool, "ib_runner").await);
    let source = MemorySource::new("orders");
    let mut pushed = 0;
    let mut push = |i: usize| {
        let mut m = Message::new(format!("{{\"order\":{i}}}"));
        m.id = Some(format!("m-{i}"));
        source.push(m);
        pushed += 1;
    };
    (0..MESSAGES).for_each(&mut push);
    (0..MESSAGES).step_by(2).for_each(&mut push);
    (0..MESSAGES).step_by(5).for_each(&mut push);
    let handler = {
        let (pool, s) = (pool.clone(), s.clone());
        move |m: Message, _claim: ClaimHandle| {
            let (pool, s) = (pool.clone(), s.clone());
            async move {
                let id = String::from_utf8(m.key.clone().unwrap().to_vec()).unwrap();
                let mut tx = pool.begin().await.map_err(HandlerError::transient)?;
                match s.inbox.claim(&mut *tx, &key(&id)).await {
                    Ok(Claimed::New) => {}
                    Ok(Claimed::Duplicate) => return Ok(Bytes::new()),
                    Err(e) if e.is_transient() => return Err(HandlerError::transient(e)),
                    Err(e) => return Err(HandlerError::permanent(e)),
                }
                tx.run(&s.write(&id)).await;
                if m.attempt == 1 && id.ends_with('4') {
                    // After the write, before the commit: rolled back.
                    return Err(HandlerError::transient("the payment service timed out"));
                }
                tx.commit().await.map_err(HandlerError::transient)?;
                Ok(Bytes::new())
            }
        }
    };
    let quick = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(50),
        jitter: 0.0,
    };
    let runners = [0, 1].map(|_| {
        Runner::unguarded(source.clone(), handler.clone())
            .concurrency(8)
            .backoff(quick)
    });
    drop(handler);
    let stop = CancellationToken::new();
    let watcher = {
        let (stop, source) = (stop.clone(), source.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while (source.acked_count() < pushed || source.unsettled() > 0)
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop.cancel();
        })
    };
    let [a, b] = runners;
    let (a, b) = tokio::join!(a.run(stop.clone()), b.run(stop.clone()));
    watcher.await.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(source.acked_count(), pushed, "{a:?} {b:?}");
    assert!(
        source.dead_letters().is_empty(),
        "{:?}",
        source.dead_letters()
    );
    assert!(
        a.retried_failed + b.retried_failed >= 4,
        "m-4, m-14, m-24, m-34 failed once: {a:?} {b:?}"
    );
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        s.counts(&mut *conn).await,
        (MESSAGES as i64, MESSAGES as i64),
        "each message written once"
    );
    assert_eq!(
        conn.count(&format!(
            "SELECT COUNT(DISTINCT message) FROM {}",
            s.business
        ))
        .await,
        MESSAGES as i64
    );
    Arc::into_inner(s).unwrap().drop_tables(&mut *conn).await;
}

on_both!(
    under_snapshot_isolation_a_key_committed_later_is_never_new,
    3
);
/// A transaction whose snapshot predates another's commit of the key.
async fn under_snapshot_isolation_a_key_committed_later_is_never_new<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_snapshot").await;
    let mut late = pool.begin().await.unwrap();
    let dialect = late.dialect();
    if dialect == Dialect::Postgres {
        late.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await;
    } // MySQL/MariaDB: REPEATABLE READ is the default.
    let seen = late
        .count(&format!("SELECT COUNT(*) FROM {}", s.inbox.table()))
        .await;
    assert_eq!(seen, 0, "the snapshot is taken");

    let mut first = pool.begin().await.unwrap();
    assert_eq!(
        s.inbox.claim(&mut *first, &key("m-1")).await.unwrap(),
        Claimed::New
    );
    first.commit().await.unwrap();

    let claimed = s.inbox.claim(&mut *late, &key("m-1")).await;
    match dialect {
        // The conflicting row is not in the snapshot: PostgreSQL refuses
        // with a serialization failure, to retry.
        Dialect::Postgres => {
            let e = claimed.unwrap_err();
            assert!(matches!(e, InboxError::Database { .. }), "{e}");
            assert!(e.is_transient(), "{e}");
        }
        // InnoDB checks a unique key against the latest committed rows.
        Dialect::MySql => assert_eq!(claimed.unwrap(), Claimed::Duplicate),
    }
    drop(late);
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(s.counts(&mut *conn).await.1, 1);
    s.drop_tables(&mut *conn).await;
}

on_both!(a_claim_dropped_at_any_point_records_nothing, 4);
/// Cancel safety: a claim dropped after its first poll, or later, with its
/// transaction.
async fn a_claim_dropped_at_any_point_records_nothing<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_dropped").await;
    for (i, micros) in [0, 10, 50, 100, 200, 500, 1000, 2000, 5000]
        .into_iter()
        .enumerate()
    {
        let key = key(&format!("m-{i}"));
        let mut tx = pool.begin().await.unwrap();
        let claim = s.inbox.claim(&mut *tx, &key);
        let _ = tokio::time::timeout(Duration::from_micros(micros), claim).await;
        drop(tx);
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(
            s.inbox.claim(&mut *tx, &key).await.unwrap(),
            Claimed::New,
            "dropped after {micros} µs: the redelivery is new"
        );
    }
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(s.counts(&mut *conn).await, (0, 0));
    s.drop_tables(&mut *conn).await;
}

on_both!(
    a_session_the_server_ended_for_idling_in_its_transaction_is_retried,
    2
);
/// A holder paused inside its transaction past the server's idle timeout
/// (PostgreSQL's `idle_in_transaction_session_timeout`, MariaDB's
/// `idle_transaction_timeout`, as the inbox's documentation advises) finds
/// its session ended when it wakes: a failure to retry with a new
/// transaction, never one that refuses the message for good.
async fn a_session_the_server_ended_for_idling_in_its_transaction_is_retried<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_idle").await;
    let mut conn = pool.acquire().await.unwrap();
    let (set, pause) = match conn.dialect() {
        Dialect::Postgres => (
            "SET idle_in_transaction_session_timeout = 200",
            Duration::from_millis(600),
        ),
        // MariaDB counts whole seconds.
        Dialect::MySql => (
            "SET SESSION idle_transaction_timeout = 1",
            Duration::from_millis(2500),
        ),
    };
    conn.run(set).await;
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    tx.run(&s.write("m-1")).await;
    tokio::time::sleep(pause).await;
    let e = s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap_err();
    assert!(e.is_transient(), "an ended session is retried: {e}");
    drop(tx);
    drop(conn);

    // The retry, in a new transaction, records the key.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap(),
        Claimed::New
    );
    tx.commit().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    s.drop_tables(&mut *conn).await;
}

on_both!(
    a_session_an_administrator_ended_mid_transaction_is_retried,
    3
);
/// `pg_terminate_backend` or `KILL CONNECTION` while a holder's transaction
/// is open: its next claim fails as a failure to retry.
async fn a_session_an_administrator_ended_mid_transaction_is_retried<DB>(pool: Pool<DB>)
where
    DB: Database,
    DB::Connection: Sql,
{
    let s = Setup::new(&pool, "ib_killed").await;
    let mut conn = pool.acquire().await.unwrap();
    let dialect = conn.dialect();
    let id = match dialect {
        Dialect::Postgres => conn.count("SELECT pg_backend_pid()::int8").await,
        Dialect::MySql => conn.count("SELECT CAST(CONNECTION_ID() AS SIGNED)").await,
    };
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    tx.run(&s.write("m-1")).await;
    let mut admin = pool.acquire().await.unwrap();
    match dialect {
        Dialect::Postgres => {
            admin
                .count(&format!("SELECT COUNT(pg_terminate_backend({id}))"))
                .await;
        }
        Dialect::MySql => {
            admin.run(&format!("KILL CONNECTION {id}")).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let e = s.inbox.claim(&mut *tx, &key("m-1")).await.unwrap_err();
    assert!(e.is_transient(), "an ended session is retried: {e}");
    drop(tx);
    drop(conn);
    s.drop_tables(&mut *admin).await;
}
