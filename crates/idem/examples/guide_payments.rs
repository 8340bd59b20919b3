//! Payments (docs/guide.md): a payment provider's "payment succeeded" event,
//! delivered many times, pays its order once.
//!
//! Duplicates come from the provider retrying a webhook it thinks failed,
//! from a queue redelivering, and from two different events about one
//! payment. Each delivery runs one PostgreSQL transaction that records the
//! event's id in the inbox (`idem::sql::Inbox`), moves the order from
//! `unpaid` to `paid` (`idem::sql::StatusColumn::transition`) and writes
//! the ledger row: all three commit together or not at all. A repeated
//! event id is a duplicate; a second event for a paid order finds it paid;
//! a handler that dies before its commit leaves nothing, and its
//! redelivery pays.
//!
//! ```sh
//! cargo run -p idem --example guide_payments --features sql
//! ```
//!
//! PostgreSQL from `IDEM_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). The tables are named for
//! this run and dropped at the end. Exits non-zero when an order was paid
//! twice or not at all.

use std::sync::Arc;
use std::time::Instant;

use idem::Key;
use idem::sql::{Claimed, Inbox, StatusChange, StatusColumn, Transitions};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

type Error = Box<dyn std::error::Error + Send + Sync>;

const ORDERS: i64 = 300;
/// Deliveries handled at once, as a webhook endpoint with several workers.
const CONCURRENCY: usize = 16;
/// Attempts per delivery before the example gives up on it.
const MAX_ATTEMPTS: u32 = 5;

/// One event from the provider: its own id, and the order it pays.
#[derive(Clone, Debug)]
struct Event {
    id: String,
    order: i64,
}

/// One delivery of an event.
struct Delivery {
    event: Event,
    attempt: u32,
    /// The handler dies before its commit on this delivery's first attempt.
    crashes: bool,
}

/// What a delivery's handler did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handled {
    /// This event paid the order: ledger row, status and key committed.
    Paid,
    /// Another event had paid the order: only this event's key committed.
    AlreadyPaid,
    /// This event id was handled before: nothing written.
    Duplicate,
}

/// The business tables, the inbox and the order status graph, named for
/// this run.
struct Payments {
    pool: PgPool,
    orders: String,
    ledger: String,
    inbox: Inbox,
    status: StatusColumn,
    transition_log: String,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = PgPoolOptions::new()
        .max_connections(CONCURRENCY as u32)
        .connect(&url)
        .await
        .map_err(|e| {
            format!("cannot reach PostgreSQL at {url} ({e}); set IDEM_TEST_POSTGRES_URL")
        })?;
    let payments = Arc::new(Payments::install(pool, &run_suffix()).await?);

    let deliveries = deliveries();
    let distinct_events = {
        let mut ids: Vec<&str> = deliveries.iter().map(|d| d.event.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    };
    let delivered = deliveries.len();
    let started = Instant::now();
    let (tally, crashed) = deliver_all(&payments, deliveries).await?;
    let took = started.elapsed();

    let p = &payments;
    let ledger_rows = p
        .count(&format!("SELECT count(*) FROM {}", p.ledger))
        .await?;
    let paid_orders = p
        .count(&format!(
            "SELECT count(DISTINCT order_id) FROM {}",
            p.ledger
        ))
        .await?;
    let status_paid = p
        .count(&format!(
            "SELECT count(*) FROM {} WHERE status = 'paid'",
            p.orders
        ))
        .await?;
    let keys = p
        .count(&format!("SELECT count(*) FROM {}", p.inbox.table()))
        .await?;
    let moves = p
        .count(&format!("SELECT count(*) FROM {}", p.transition_log))
        .await?;
    let charged = p
        .count(&format!(
            "SELECT coalesce(sum(amount_cents), 0)::bigint FROM {}",
            p.ledger
        ))
        .await?;
    let expected_charge: i64 = (1..=ORDERS).map(amount_cents).sum();

    println!(
        "deliveries: {delivered} of {distinct_events} distinct events for {ORDERS} orders, {CONCURRENCY} at a time, in {:.2} s",
        took.as_secs_f64()
    );
    println!(
        "handled: {} paid, {} already paid by another event, {} duplicate event ids; {crashed} handlers died before their commit and were redelivered",
        tally.paid, tally.already_paid, tally.duplicates
    );
    println!(
        "database: {ledger_rows} ledger rows for {paid_orders} orders, {status_paid} orders paid, {moves} moves unpaid -> paid logged, {keys} event ids in the inbox, {charged} cents charged"
    );

    assert_eq!(tally.paid, ORDERS as usize, "each order paid by one event");
    assert_eq!(
        tally.paid + tally.already_paid,
        distinct_events,
        "each event id handled once"
    );
    assert_eq!(
        tally.paid + tally.already_paid + tally.duplicates,
        delivered
    );
    assert_eq!(ledger_rows, ORDERS, "one ledger row per order");
    assert_eq!(paid_orders, ORDERS);
    assert_eq!(status_paid, ORDERS);
    assert_eq!(moves, ORDERS, "one logged move per order");
    assert_eq!(keys, distinct_events as i64, "one inbox key per event id");
    assert_eq!(
        charged, expected_charge,
        "each order charged its amount once"
    );
    payments.drop_tables().await?;
    println!("ok: {ORDERS} orders paid once each from {delivered} deliveries");
    Ok(())
}

/// The handler: one transaction per delivery.
async fn on_payment_succeeded(
    p: &Payments,
    event: &Event,
    crashes: bool,
) -> Result<Handled, Error> {
    let mut tx = p.pool.begin().await?;
    let key = Key::new("payments", event.id.clone())?;
    if p.inbox.claim(&mut *tx, &key).await? == Claimed::Duplicate {
        return Ok(Handled::Duplicate); // handled before: ack
    }
    let handled = match p
        .status
        .transition(&mut *tx, event.order, "unpaid", "paid")
        .await?
    {
        StatusChange::Applied => {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (order_id, event_id, amount_cents) VALUES ($1, $2, $3)",
                p.ledger
            )))
            .bind(event.order)
            .bind(&event.id)
            .bind(amount_cents(event.order))
            .execute(&mut *tx)
            .await?;
            Handled::Paid
        }
        // Another event for this order paid it: keep this event's key, so
        // its own redeliveries are duplicates, and write nothing else.
        StatusChange::AlreadyInTarget => Handled::AlreadyPaid,
        StatusChange::Conflict { current } => {
            return Err(format!("order {} is {current}, not unpaid", event.order).into());
        }
        StatusChange::NotFound => return Err(format!("no order {}", event.order).into()),
    };
    if crashes {
        // Dropping the transaction rolls back the key, the status and the
        // ledger row together, as a crash before the commit would.
        drop(tx);
        return Err("the handler died before its commit".into());
    }
    tx.commit().await?;
    Ok(handled)
}

#[derive(Default)]
struct Tally {
    paid: usize,
    already_paid: usize,
    duplicates: usize,
}

/// Runs every delivery, `CONCURRENCY` at a time; a failed one is delivered
/// again in the next round, as a provider or a queue would. Returns the
/// tally and how many attempts failed.
async fn deliver_all(
    payments: &Arc<Payments>,
    mut pending: Vec<Delivery>,
) -> Result<(Tally, usize), Error> {
    let mut tally = Tally::default();
    let mut failed = 0;
    let room = Arc::new(Semaphore::new(CONCURRENCY));
    while !pending.is_empty() {
        let mut tasks = JoinSet::new();
        for delivery in pending.drain(..) {
            let (payments, room) = (payments.clone(), room.clone());
            tasks.spawn(async move {
                let _place = room.acquire_owned().await;
                let crashes = delivery.crashes && delivery.attempt == 1;
                let result = on_payment_succeeded(&payments, &delivery.event, crashes).await;
                (delivery, result)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (mut delivery, result) = done?;
            match result {
                Ok(Handled::Paid) => tally.paid += 1,
                Ok(Handled::AlreadyPaid) => tally.already_paid += 1,
                Ok(Handled::Duplicate) => tally.duplicates += 1,
                Err(e) if delivery.attempt < MAX_ATTEMPTS => {
                    failed += 1;
                    if !delivery.crashes || delivery.attempt > 1 {
                        eprintln!("event {} failed, delivered again: {e}", delivery.event.id);
                    }
                    delivery.attempt += 1;
                    pending.push(delivery);
                }
                Err(e) => {
                    return Err(format!(
                        "event {} failed {MAX_ATTEMPTS} times: {e}",
                        delivery.event.id
                    )
                    .into());
                }
            }
        }
    }
    Ok((tally, failed))
}

/// Every order's "payment succeeded" event, delivered one to three times;
/// every tenth order also gets a second event with its own id (say, a
/// "charge succeeded" beside the "payment intent succeeded"); one delivery
/// in forty dies before its commit. Shuffled, as retries arrive.
fn deliveries() -> Vec<Delivery> {
    let mut events = Vec::new();
    for order in 1..=ORDERS {
        let intent = Event {
            id: format!("evt_{order:04}_intent"),
            order,
        };
        for _ in 0..1 + order % 3 {
            events.push(intent.clone());
        }
        if order % 10 == 0 {
            let charge = Event {
                id: format!("evt_{order:04}_charge"),
                order,
            };
            events.push(charge.clone());
            if order % 20 == 0 {
                events.push(charge);
            }
        }
    }
    let mut deliveries: Vec<Delivery> = events
        .into_iter()
        .enumerate()
        .map(|(n, event)| Delivery {
            event,
            attempt: 1,
            crashes: n % 40 == 3,
        })
        .collect();
    shuffle(&mut deliveries, 0x9e37_79b9_7f4a_7c15);
    deliveries
}

fn amount_cents(order: i64) -> i64 {
    1_000 + order
}

impl Payments {
    /// Creates this run's tables: orders (all unpaid), the ledger, the
    /// inbox and the transition log.
    async fn install(pool: PgPool, suffix: &str) -> Result<Self, Error> {
        let orders = format!("guide_orders_{suffix}");
        let ledger = format!("guide_ledger_{suffix}");
        let inbox = Inbox::new(&format!("guide_inbox_{suffix}"))?;
        let transition_log = format!("guide_transitions_{suffix}");
        let status = Transitions::new()
            .edge("unpaid", "paid")
            .edge("paid", "refunded")
            .bind(&orders, "id", "status")?
            .log_table(&transition_log)?;
        for ddl in [
            format!(
                "CREATE TABLE {orders} (id bigint PRIMARY KEY, status text NOT NULL, amount_cents bigint NOT NULL)"
            ),
            format!(
                "CREATE TABLE {ledger} (id bigserial PRIMARY KEY, order_id bigint NOT NULL, event_id text NOT NULL, amount_cents bigint NOT NULL)"
            ),
        ] {
            sqlx::query(AssertSqlSafe(ddl)).execute(&pool).await?;
        }
        inbox.install(&pool).await?;
        status.install(&pool).await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {orders} (id, status, amount_cents) SELECT n, 'unpaid', 1000 + n FROM generate_series(1, $1::bigint) AS n"
        )))
        .bind(ORDERS)
        .execute(&pool)
        .await?;
        Ok(Self {
            pool,
            orders,
            ledger,
            inbox,
            status,
            transition_log,
        })
    }

    async fn count(&self, sql: &str) -> Result<i64, Error> {
        Ok(sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn drop_tables(&self) -> Result<(), Error> {
        let tables = [
            self.orders.as_str(),
            &self.ledger,
            self.inbox.table(),
            &self.transition_log,
        ];
        for table in tables {
            sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }
}

/// A suffix no other run uses at the same time: the process id and the
/// clock.
fn run_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}_{nanos:x}", std::process::id())
}

/// Fisher–Yates with a xorshift generator: the same order every run.
fn shuffle<T>(items: &mut [T], mut state: u64) {
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}
