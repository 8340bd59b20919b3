//! idem's SQL store beside each database's own dedup statement, on real
//! servers (the tests' URLs: `IDEM_TEST_POSTGRES_URL`,
//! `IDEM_TEST_MYSQL_URL`):
//!
//! - **PostgreSQL**: `pgbench` running `INSERT … ON CONFLICT DO NOTHING`
//!   of a fresh random key (`benches/pgbench/insert.sql`; 256 keys a
//!   statement in `insert_256.sql`), then idem's `begin` + `complete` on
//!   fresh keys: single calls (coalesced, and one statement each) and
//!   `begin_many` + `complete_many` of 256.
//! - **MySQL/MariaDB**: an `INSERT IGNORE` loop (autocommit; one key or 256
//!   a statement), then the same idem cycles.
//! - **Why a claim**, on both: a transaction that holds `SELECT … FOR
//!   UPDATE` on the message's row through a 1 ms handler, then `UPDATE`,
//!   `COMMIT` (the pessimistic pattern), against `begin`, the same handler,
//!   `complete`: fresh keys, and 8 deliveries of each key at once. Where
//!   the pessimistic delivery waits for the row's lock, idem's hands the
//!   message back, as its consumer runner does, and is delivered again
//!   after the first pass.
//!
//! Each cell starts from tables emptied, then filled with 100 000 rows the
//! planner has read (PostgreSQL also checkpoints), and one untimed round
//! per task that opens the connections; every run goes through all cells,
//! baselines beside idem, and a figure is the median of the runs. Beside
//! each rate, what an item cost: commits, log flushes and log bytes
//! (server-wide counters), CPU of the server's processes and of this one
//! (with pgbench): read them from a quiet machine.
//!
//! `cargo bench -p idem-sql --bench sql [-- postgres|mysql cycles|why]`;
//! `IDEM_BENCH_SECS` (5) a timed cell, `IDEM_BENCH_RUNS` (3),
//! `IDEM_BENCH_DELIVERIES` (16 000) a "why" cell, `IDEM_BENCH_ROWS`
//! (100 000), `IDEM_BENCH_ONLY` (the cells whose label holds it),
//! `PGBENCH` (else found under /usr/lib/postgresql).

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use idem_core::{Begin, BeginItem, CompleteItem, Fenced, Key, Lease, Store};
use idem_sql::SqlStore;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool, Row};

/// Every connection this bench opens says so, to tell when all are gone.
const APP: &str = "idem_bench";
/// idem's record tables.
const RECORDS: &str = "idem_bench";
/// The baselines' dedup table.
const DEDUP: &str = "idem_bench_dedup";
/// The pessimistic pattern's business rows.
const ORDERS: &str = "idem_bench_orders";
const LEASE: Lease = Lease::from_secs(30);
const RETENTION: Duration = Duration::from_secs(86_400);
/// The handler of the "why" cells.
const HANDLER: Duration = Duration::from_millis(1);
/// Keys a batch (`begin_many`, a baseline statement).
const BATCH: usize = 256;
/// Connections of every pool: the store's default.
const POOL: u32 = 16;
/// A deadline already passed: each task does one round, untimed, which
/// opens the connections before the clock starts.
const WARM_UP: f64 = 0.0;

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// Random message ids like pgbench's `'k' || random(1, 9e18)`.
struct Ids(u64);

impl Ids {
    fn new(task: usize) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Ids(nanos ^ (task as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// splitmix64.
    fn next(&mut self) -> String {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        format!("k{}", z % 9_000_000_000_000_000_000 + 1)
    }

    fn key(&mut self) -> Key {
        Key::new("bench", self.next()).unwrap()
    }
}

/// What the server counted over a cell, and the CPU both sides used.
#[derive(Clone, Copy, Default)]
struct Counts {
    commits: f64,
    flushes: f64,
    log_bytes: f64,
    /// CPU seconds of the server's processes.
    server_cpu: f64,
    /// CPU seconds of this process and the children it waited for
    /// (pgbench).
    client_cpu: f64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            commits: self.commits - o.commits,
            flushes: self.flushes - o.flushes,
            log_bytes: self.log_bytes - o.log_bytes,
            server_cpu: self.server_cpu - o.server_cpu,
            client_cpu: self.client_cpu - o.client_cpu,
        }
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.commits += o.commits;
        self.flushes += o.flushes;
        self.log_bytes += o.log_bytes;
        self.server_cpu += o.server_cpu;
        self.client_cpu += o.client_cpu;
    }
}

/// CPU seconds used so far by the processes named `comm` (with the
/// children they reaped: PostgreSQL's ended backends), read from /proc;
/// zero for a server on another machine.
fn cpu_of(comm: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            stat.split_once(" (")
                .is_some_and(|(_, r)| r.starts_with(&format!("{comm})")))
        })
        .map(|stat| stat_cpu(&stat))
        .sum()
}

/// utime + stime + cutime + cstime of a /proc stat line, in seconds
/// (Linux counts 100 ticks a second).
fn stat_cpu(stat: &str) -> f64 {
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0.0;
    };
    // After the name: state is field 3; utime … cstime are fields 14–17.
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<f64>().ok())
        .sum::<f64>()
        / 100.0
}

fn own_cpu() -> f64 {
    std::fs::read_to_string("/proc/self/stat").map_or(0.0, |s| stat_cpu(&s))
}

/// One server, with a connection of the bench's own for setup and counts.
enum Server {
    Postgres {
        url: String,
        admin: PgPool,
        pgbench: PathBuf,
    },
    MySql {
        url: String,
        admin: MySqlPool,
    },
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Postgres { url, .. } => with_param(url, &format!("application_name={APP}")),
            Server::MySql { url, .. } => url.clone(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Server::Postgres { .. } => "PostgreSQL",
            Server::MySql { .. } => "MariaDB",
        }
    }

    async fn exec(&self, sql: &str) {
        let done = match self {
            Server::Postgres { admin, .. } => sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(admin)
                .await
                .map(drop),
            Server::MySql { admin, .. } => sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(admin)
                .await
                .map(drop),
        };
        done.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The settings that decide what a commit costs, as found.
    async fn settings(&self) -> String {
        match self {
            Server::Postgres { admin, .. } => {
                let mut out = Vec::new();
                for name in [
                    "server_version",
                    "synchronous_commit",
                    "fsync",
                    "wal_sync_method",
                    "commit_delay",
                    "full_page_writes",
                    "shared_buffers",
                ] {
                    let row = sqlx::query(AssertSqlSafe(format!("SHOW {name}")))
                        .fetch_one(admin)
                        .await
                        .expect("SHOW");
                    out.push(format!("{name}={}", row.get::<String, _>(0)));
                }
                out.join(", ")
            }
            Server::MySql { admin, .. } => {
                let row = sqlx::query(
                    "SELECT CAST(@@version AS CHAR), CAST(@@innodb_flush_log_at_trx_commit AS CHAR),
                            CAST(@@log_bin AS CHAR), CAST(@@sync_binlog AS CHAR),
                            CAST(@@innodb_flush_method AS CHAR),
                            CAST(@@innodb_buffer_pool_size AS CHAR), CAST(@@tx_isolation AS CHAR)",
                )
                .fetch_one(admin)
                .await
                .expect("settings");
                let names = [
                    "version",
                    "innodb_flush_log_at_trx_commit",
                    "log_bin",
                    "sync_binlog",
                    "innodb_flush_method",
                    "innodb_buffer_pool_size",
                    "tx_isolation",
                ];
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("{n}={}", row.get::<String, _>(i)))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        }
    }

    /// Commits, log flushes, log bytes and CPU so far, server-wide. A
    /// PostgreSQL backend publishes its counts at least once a second while
    /// busy, and all of them when it exits: `ended` waits until the cell's
    /// connections are gone.
    async fn counts(&self, ended: bool) -> Counts {
        match self {
            Server::Postgres { admin, .. } => {
                let started = Instant::now();
                while ended && started.elapsed() < Duration::from_secs(10) {
                    let left: i64 = sqlx::query(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    )
                    .bind(APP)
                    .fetch_one(admin)
                    .await
                    .expect("pg_stat_activity")
                    .get(0);
                    if left == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let row = sqlx::query(
                    "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())::float8,
                            (SELECT wal_sync FROM pg_stat_wal)::float8,
                            (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8",
                )
                .fetch_one(admin)
                .await
                .expect("pg_stat_wal");
                Counts {
                    commits: row.get(0),
                    flushes: row.get(1),
                    log_bytes: row.get(2),
                    server_cpu: cpu_of("postgres"),
                    client_cpu: own_cpu(),
                }
            }
            Server::MySql { admin, .. } => {
                let rows = sqlx::query(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN
                     ('Handler_commit', 'Innodb_data_fsyncs', 'Innodb_os_log_written')",
                )
                .fetch_all(admin)
                .await
                .expect("SHOW GLOBAL STATUS");
                let mut c = Counts {
                    server_cpu: cpu_of("mariadbd").max(cpu_of("mysqld")),
                    client_cpu: own_cpu(),
                    ..Counts::default()
                };
                for row in rows {
                    let (name, value): (String, String) = (row.get(0), row.get(1));
                    let v: f64 = value.parse().unwrap_or(0.0);
                    match name.as_str() {
                        "Handler_commit" => c.commits = v,
                        "Innodb_data_fsyncs" => c.flushes = v,
                        _ => c.log_bytes = v,
                    }
                }
                c
            }
        }
    }

    /// The baselines' tables, made if missing.
    async fn create_tables(&self) {
        match self {
            Server::Postgres { .. } => {
                self.exec(&format!(
                    "CREATE TABLE IF NOT EXISTS {DEDUP} (k text PRIMARY KEY,
                       seen_at timestamptz NOT NULL DEFAULT now());
                     CREATE TABLE IF NOT EXISTS {ORDERS} (k text PRIMARY KEY,
                       done boolean NOT NULL DEFAULT false)"
                ))
                .await
            }
            Server::MySql { .. } => {
                self.exec(&format!(
                    "CREATE TABLE IF NOT EXISTS {DEDUP} (k VARCHAR(255) NOT NULL PRIMARY KEY,
                       seen_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB;
                     CREATE TABLE IF NOT EXISTS {ORDERS} (k VARCHAR(255) NOT NULL PRIMARY KEY,
                       done BOOLEAN NOT NULL DEFAULT FALSE) ENGINE=InnoDB"
                ))
                .await
            }
        }
    }

    /// Empties every table the cells write, then fills each with `rows`
    /// rows that look like a running system's (completed records, seen
    /// ids, orders done) and has the planner read them, so every cell
    /// starts alike from a table with statistics; adds `orders` orders
    /// `o0` … not done yet, for the pessimistic pattern. With no rows at
    /// all the tables stay empty and without statistics, as just made.
    async fn reset(&self, rows: usize, orders: usize) {
        let pg = matches!(self, Server::Postgres { .. });
        for t in [RECORDS, DEDUP, ORDERS] {
            self.exec(&format!("TRUNCATE TABLE {t}")).await;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let bytes = |b: &[u8]| {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            if pg {
                format!("'\\x{hex}'::bytea")
            } else {
                format!("X'{hex}'")
            }
        };
        let mut ids = Ids::new(usize::MAX);
        for start in (0..rows).step_by(1000) {
            let chunk = start..(start + 1000).min(rows);
            let records: Vec<String> = chunk
                .clone()
                .map(|_| {
                    format!(
                        "({}, {}, 2, {}, NULL, 1, {now_ms}, 0, {}, {now_ms}, {})",
                        bytes(b"bench"),
                        bytes(ids.next().as_bytes()),
                        now_ms * 1024,
                        bytes(b"ok"),
                        now_ms + 86_400_000
                    )
                })
                .collect();
            let seen: Vec<String> = chunk
                .clone()
                .map(|_| format!("('{}')", ids.next()))
                .collect();
            let done: Vec<String> = chunk.map(|i| format!("('p{i}', TRUE)")).collect();
            self.exec(&format!(
                "INSERT INTO {RECORDS} (ns, k, state, token, fp, attempts, started_at,
                   lease_until, outcome, completed_at, expires_at) VALUES {};
                 INSERT INTO {DEDUP} (k) VALUES {};
                 INSERT INTO {ORDERS} (k, done) VALUES {}",
                records.join(","),
                seen.join(","),
                done.join(",")
            ))
            .await;
        }
        for start in (0..orders).step_by(1000) {
            let values: Vec<String> = (start..(start + 1000).min(orders))
                .map(|i| format!("('o{i}')"))
                .collect();
            self.exec(&format!(
                "INSERT INTO {ORDERS} (k) VALUES {}",
                values.join(",")
            ))
            .await;
        }
        if rows + orders > 0 {
            self.exec(&format!(
                "ANALYZE {}{RECORDS}, {DEDUP}, {ORDERS}",
                if pg { "" } else { "TABLE " }
            ))
            .await;
        }
        if pg {
            // Every cell starts with the same WAL ahead of it.
            self.exec("CHECKPOINT").await;
        }
    }

    /// A plain pool of `POOL` connections, all open.
    async fn plain(&self) -> Plain {
        let pool = match self {
            Server::Postgres { .. } => Plain::Postgres(
                PgPoolOptions::new()
                    .max_connections(POOL)
                    .connect(&self.url())
                    .await
                    .expect("PostgreSQL pool"),
            ),
            Server::MySql { url, .. } => Plain::MySql(
                MySqlPoolOptions::new()
                    .max_connections(POOL)
                    .connect(url)
                    .await
                    .expect("MySQL pool"),
            ),
        };
        match &pool {
            Plain::Postgres(p) => drop(join_all((0..POOL).map(|_| p.acquire())).await),
            Plain::MySql(p) => drop(join_all((0..POOL).map(|_| p.acquire())).await),
        }
        pool
    }

    async fn store(&self, coalesce: bool) -> SqlStore {
        SqlStore::builder(&self.url())
            .table(RECORDS)
            .pool_size(POOL)
            .sweep_interval(None)
            .coalesce(coalesce)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", self.name()))
    }
}

/// What a cell does.
#[derive(Clone, Copy)]
enum Work {
    /// pgbench with a script of `keys` keys a transaction.
    Pgbench {
        script: &'static str,
        clients: usize,
        keys: usize,
    },
    /// The dedup statement of `keys` fresh keys, from `tasks` tasks on
    /// the client stack idem uses (sqlx, Tokio).
    Statement { tasks: usize, keys: usize },
    /// `begin` + `complete`, one key a call.
    Single {
        tasks: usize,
        coalesce: bool,
        /// Starts from empty tables without statistics, as just made.
        cold: bool,
    },
    /// `begin_many` + `complete_many` of `BATCH` keys.
    Batched { tasks: usize },
    /// `N` deliveries, each key `per_key` times: the pessimistic pattern.
    Pessimistic { tasks: usize, per_key: usize },
    /// The same deliveries through `begin`, handler, `complete`.
    Claim { tasks: usize, per_key: usize },
}

/// One row of a table: a cell measured once per run.
struct Cell {
    label: String,
    work: Work,
    unit: &'static str,
    /// The row this one is a ratio to.
    vs: Option<usize>,
    /// What the ratio or rate should reach.
    target: Option<&'static str>,
    rates: Vec<f64>,
    items: f64,
    counts: Counts,
}

impl Cell {
    fn new(label: &str, work: Work, unit: &'static str) -> Self {
        Self {
            label: label.into(),
            work,
            unit,
            vs: None,
            target: None,
            rates: Vec::new(),
            items: 0.0,
            counts: Counts::default(),
        }
    }

    fn vs(mut self, row: usize, target: Option<&'static str>) -> Self {
        self.vs = Some(row);
        self.target = target;
        self
    }

    fn median(&self) -> f64 {
        let mut r = self.rates.clone();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    }
}

/// Runs `tasks` copies of `one` (given its task number) until `secs`
/// have passed; each returns how many items it did. Answers items and
/// seconds.
async fn timed<F, Fut>(tasks: usize, secs: f64, one: F) -> (u64, f64)
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(one(t, deadline))).collect();
    let mut n = 0;
    for h in handles {
        n += h.await.expect("a task of the cell");
    }
    (n, started.elapsed().as_secs_f64())
}

async fn single_cycles(store: SqlStore, task: usize, deadline: Instant) -> u64 {
    let mut ids = Ids::new(task);
    let mut n = 0;
    while n == 0 || Instant::now() < deadline {
        let key = ids.key();
        let Begin::Acquired(claim) = store.begin(&key, None, LEASE).await.expect("begin") else {
            panic!("a fresh key was not acquired");
        };
        let done = store
            .complete(
                &key,
                claim.token,
                Some(Bytes::from_static(b"ok")),
                RETENTION,
            )
            .await
            .expect("complete");
        assert_eq!(done, Fenced::Ok(()));
        n += 1;
    }
    n
}

async fn batched_cycles(store: SqlStore, task: usize, deadline: Instant) -> u64 {
    let mut ids = Ids::new(task);
    let mut n = 0;
    while n == 0 || Instant::now() < deadline {
        let items: Vec<BeginItem> = (0..BATCH)
            .map(|_| BeginItem {
                key: ids.key(),
                fingerprint: None,
                lease: LEASE,
            })
            .collect();
        let answers = store.begin_many(&items).await.expect("begin_many");
        let completes: Vec<CompleteItem> = items
            .into_iter()
            .zip(answers)
            .map(|(item, answer)| {
                let Begin::Acquired(claim) = answer else {
                    panic!("a fresh key was not acquired");
                };
                CompleteItem {
                    key: item.key,
                    token: claim.token,
                    outcome: Some(Bytes::from_static(b"ok")),
                    retention: RETENTION,
                }
            })
            .collect();
        let done = store
            .complete_many(&completes)
            .await
            .expect("complete_many");
        assert!(done.iter().all(|d| *d == Fenced::Ok(())));
        n += BATCH as u64;
    }
    n
}

/// The dedup statement of `keys` fresh keys, in autocommit, until the
/// deadline: `INSERT … ON CONFLICT DO NOTHING` on PostgreSQL, `INSERT
/// IGNORE` on MySQL.
async fn dedup_statements(pool: Arc<Plain>, keys: usize, task: usize, deadline: Instant) -> u64 {
    let mut ids = Ids::new(task);
    let mut n = 0;
    macro_rules! run {
        ($pool:expr, $sql:expr) => {{
            let sql = $sql;
            while n == 0 || Instant::now() < deadline {
                let mut q = sqlx::query(AssertSqlSafe(&*sql));
                for _ in 0..keys {
                    q = q.bind(ids.next());
                }
                q.execute($pool).await.expect("the dedup statement");
                n += keys as u64;
            }
        }};
    }
    match &*pool {
        Plain::Postgres(p) => run!(
            p,
            format!(
                "INSERT INTO {DEDUP} (k) VALUES {} ON CONFLICT DO NOTHING",
                (1..=keys)
                    .map(|i| format!("(${i})"))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        ),
        Plain::MySql(p) => run!(
            p,
            format!(
                "INSERT IGNORE INTO {DEDUP} (k) VALUES {}",
                vec!["(?)"; keys].join(",")
            )
        ),
    }
    n
}

/// Which key the `n`th delivery carries: `per_key` deliveries in a row
/// share one, and arrive together.
fn order(n: usize, per_key: usize) -> String {
    format!("o{}", n / per_key)
}

/// How a delivery ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// The handler ran.
    Ran,
    /// The message was handled before.
    Done,
    /// Another delivery holds the message: handed back, to come again.
    Later,
}

/// The pessimistic pattern, one delivery: lock the message's row (waiting
/// for whoever holds it), run the handler unless it is done, mark it done,
/// commit.
async fn pessimistic(pool: &Plain, key: &str) -> Settled {
    macro_rules! deliver {
        ($pool:expr, $select:expr, $update:expr) => {{
            let mut tx = $pool.begin().await.expect("BEGIN");
            let done: bool = sqlx::query($select)
                .bind(key)
                .fetch_one(&mut *tx)
                .await
                .expect("SELECT … FOR UPDATE")
                .get(0);
            if !done {
                tokio::time::sleep(HANDLER).await;
                sqlx::query($update)
                    .bind(key)
                    .execute(&mut *tx)
                    .await
                    .expect("UPDATE");
            }
            tx.commit().await.expect("COMMIT");
            if done { Settled::Done } else { Settled::Ran }
        }};
    }
    match pool {
        Plain::Postgres(pool) => deliver!(
            pool,
            "SELECT done FROM idem_bench_orders WHERE k = $1 FOR UPDATE",
            "UPDATE idem_bench_orders SET done = TRUE WHERE k = $1"
        ),
        Plain::MySql(pool) => deliver!(
            pool,
            "SELECT done FROM idem_bench_orders WHERE k = ? FOR UPDATE",
            "UPDATE idem_bench_orders SET done = TRUE WHERE k = ?"
        ),
    }
}

/// A plain connection pool, for the baselines.
enum Plain {
    Postgres(PgPool),
    MySql(MySqlPool),
}

impl Plain {
    async fn close(&self) {
        match self {
            Plain::Postgres(p) => p.close().await,
            Plain::MySql(p) => p.close().await,
        }
    }
}

/// idem, one delivery: claim, handler, complete. A key another delivery
/// holds is handed back, as idem's consumer runner does (the broker
/// redelivers it after the holder's lease).
async fn claim(store: &SqlStore, key: &str) -> Settled {
    let key = Key::new("bench", key.to_owned()).unwrap();
    match store.begin(&key, None, LEASE).await.expect("begin") {
        Begin::Acquired(claim) => {
            tokio::time::sleep(HANDLER).await;
            let done = store
                .complete(
                    &key,
                    claim.token,
                    Some(Bytes::from_static(b"ok")),
                    RETENTION,
                )
                .await
                .expect("complete");
            assert_eq!(done, Fenced::Ok(()));
            Settled::Ran
        }
        Begin::Completed { .. } => Settled::Done,
        Begin::InProgress { .. } => Settled::Later,
        Begin::Mismatch => unreachable!("no fingerprints here"),
    }
}

/// Runs `deliveries` deliveries from `tasks` tasks, then the ones handed
/// back, again, until every one is settled (the redeliveries come after
/// the first pass: by then the broker's delay would have passed); answers
/// deliveries and seconds, after checking the handler ran once per key.
async fn deliveries<F, Fut>(tasks: usize, deliveries: usize, per_key: usize, one: F) -> (u64, f64)
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Settled> + Send,
{
    let one = Arc::new(one);
    let ran = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut keys: Vec<String> = (0..deliveries).map(|n| order(n, per_key)).collect();
    while !keys.is_empty() {
        let pass = Arc::new(keys);
        let next = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (one, next, ran, pass) = (one.clone(), next.clone(), ran.clone(), pass.clone());
                tokio::spawn(async move {
                    let mut later = Vec::new();
                    while let Some(key) = pass.get(next.fetch_add(1, Ordering::Relaxed)) {
                        match one(key.clone()).await {
                            Settled::Ran => drop(ran.fetch_add(1, Ordering::Relaxed)),
                            Settled::Done => {}
                            Settled::Later => later.push(key.clone()),
                        }
                    }
                    later
                })
            })
            .collect();
        keys = join_all(handles)
            .await
            .into_iter()
            .flat_map(|later| later.expect("a delivery task"))
            .collect();
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        ran.load(Ordering::Relaxed),
        deliveries.div_ceil(per_key) as u64,
        "the handler ran once per key"
    );
    (deliveries as u64, secs)
}

/// Runs `pgbench` with `script` for `secs`; answers transactions/s.
fn pgbench(pgbench: &PathBuf, url: &str, script: &str, clients: usize, secs: f64) -> f64 {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("benches/pgbench")
        .join(script);
    let out = Command::new(pgbench)
        .env("PGAPPNAME", APP)
        .args(["-n", "-M", "prepared", "-f"])
        .arg(&script)
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .args(["-T", &(secs as u64).to_string()])
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", pgbench.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {text}"))
}

/// Measures `work` once on `server`: warm-up, empty tables, the run;
/// answers items, seconds and what the server counted.
async fn measure(
    server: &Server,
    work: Work,
    secs: f64,
    n: usize,
    rows: usize,
) -> (u64, f64, Counts) {
    match work {
        Work::Pgbench {
            script,
            clients,
            keys,
        } => {
            let Server::Postgres {
                url, pgbench: bin, ..
            } = server
            else {
                unreachable!()
            };
            server.reset(rows, 0).await;
            let before = server.counts(false).await;
            let (bin, url) = (bin.clone(), url.clone());
            let secs = secs.round().max(1.0);
            let tps =
                tokio::task::spawn_blocking(move || pgbench(&bin, &url, script, clients, secs))
                    .await
                    .unwrap();
            let counts = server.counts(true).await - before;
            let items = tps * secs * keys as f64;
            (items as u64, secs, counts)
        }
        Work::Statement { tasks, keys } => {
            let pool = Arc::new(server.plain().await);
            let p = pool.clone();
            timed(tasks, WARM_UP, move |t, d| {
                dedup_statements(p.clone(), keys, t, d)
            })
            .await;
            server.reset(rows, 0).await;
            let before = server.counts(false).await;
            let p = pool.clone();
            let (items, took) = timed(tasks, secs, move |t, d| {
                dedup_statements(p.clone(), keys, t, d)
            })
            .await;
            pool.close().await;
            (items, took, server.counts(true).await - before)
        }
        Work::Single {
            tasks,
            coalesce,
            cold,
        } => {
            let store = server.store(coalesce).await;
            warm_up(&store, tasks).await;
            server.reset(if cold { 0 } else { rows }, 0).await;
            let before = server.counts(false).await;
            let s = store.clone();
            let (items, took) =
                timed(tasks, secs, move |t, d| single_cycles(s.clone(), t, d)).await;
            drop(store);
            (items, took, server.counts(true).await - before)
        }
        Work::Claim { tasks, per_key } => {
            let store = server.store(true).await;
            warm_up(&store, tasks).await;
            server.reset(rows, 0).await;
            let before = server.counts(false).await;
            let s = store.clone();
            let (items, took) = deliveries(tasks, n, per_key, move |k| {
                let s = s.clone();
                async move { claim(&s, &k).await }
            })
            .await;
            drop(store);
            (items, took, server.counts(true).await - before)
        }
        Work::Batched { tasks } => {
            let store = server.store(true).await;
            let s = store.clone();
            timed(tasks, WARM_UP, move |t, d| batched_cycles(s.clone(), t, d)).await;
            server.reset(rows, 0).await;
            let before = server.counts(false).await;
            let s = store.clone();
            let (items, took) =
                timed(tasks, secs, move |t, d| batched_cycles(s.clone(), t, d)).await;
            drop(store);
            (items, took, server.counts(true).await - before)
        }
        Work::Pessimistic { tasks, per_key } => {
            let pool = server.plain().await;
            server.reset(rows, n.div_ceil(per_key)).await;
            let before = server.counts(false).await;
            let pool = Arc::new(pool);
            let p = pool.clone();
            let (items, took) = deliveries(tasks, n, per_key, move |k| {
                let p = p.clone();
                async move { pessimistic(&p, &k).await }
            })
            .await;
            pool.close().await;
            (items, took, server.counts(true).await - before)
        }
    }
}

/// Opens the store's connections before the clock starts.
async fn warm_up(store: &SqlStore, tasks: usize) {
    let s = store.clone();
    timed(tasks, WARM_UP, move |t, d| single_cycles(s.clone(), t, d)).await;
}

/// Rows 0–4 are the baselines the idem rows are compared with: one key a
/// statement at 1, 16 and 64 clients, then 256 keys a statement at 1 and
/// 16.
fn cycle_cells(server: &Server) -> Vec<Cell> {
    let statement = |label: &str, tasks, keys| {
        let unit = if keys == 1 { "inserts/s" } else { "keys/s" };
        Cell::new(label, Work::Statement { tasks, keys }, unit)
    };
    let mut cells = match server {
        Server::Postgres { .. } => {
            let pgbench = |label: &str, script, clients, keys| {
                let unit = if keys == 1 { "inserts/s" } else { "keys/s" };
                let work = Work::Pgbench {
                    script,
                    clients,
                    keys,
                };
                Cell::new(label, work, unit)
            };
            vec![
                pgbench("pgbench insert.sql, 1 client", "insert.sql", 1, 1),
                pgbench("pgbench insert.sql, 16 clients", "insert.sql", 16, 1),
                pgbench("pgbench insert.sql, 64 clients", "insert.sql", 64, 1),
                pgbench(
                    "pgbench insert_256.sql, 1 client",
                    "insert_256.sql",
                    1,
                    BATCH,
                ),
                pgbench(
                    "pgbench insert_256.sql, 16 clients",
                    "insert_256.sql",
                    16,
                    BATCH,
                ),
                statement("the same INSERT from sqlx (idem's client), 1 task", 1, 1),
                statement("the same INSERT from sqlx (idem's client), 16 tasks", 16, 1),
            ]
        }
        Server::MySql { .. } => vec![
            statement("INSERT IGNORE, 1 task", 1, 1),
            statement("INSERT IGNORE, 16 tasks", 16, 1),
            statement("INSERT IGNORE, 64 tasks", 64, 1),
            statement("INSERT IGNORE of 256 keys, 1 task", 1, BATCH),
            statement("INSERT IGNORE of 256 keys, 16 tasks", 16, BATCH),
        ],
    };
    let single = |label: &str, tasks, coalesce| {
        let work = Work::Single {
            tasks,
            coalesce,
            cold: false,
        };
        Cell::new(label, work, "cycles/s")
    };
    let batched = |label: &str, tasks| Cell::new(label, Work::Batched { tasks }, "cycles/s");
    cells.extend([
        single("idem begin+complete, 1 task", 1, true).vs(0, None),
        single("idem begin+complete, 16 tasks (coalesced)", 16, true).vs(1, Some("≥ 0.7×")),
        single("idem begin+complete, 16 tasks, a statement each", 16, false).vs(1, None),
        single("idem begin+complete, 64 tasks (coalesced)", 64, true).vs(2, None),
        batched("idem begin_many+complete_many of 256, 1 task", 1).vs(3, Some("≥ 50 k/s")),
        batched("idem begin_many+complete_many of 256, 16 tasks", 16).vs(4, Some("≥ 50 k/s")),
    ]);
    if let Server::Postgres { .. } = server {
        let work = Work::Single {
            tasks: 16,
            coalesce: true,
            cold: true,
        };
        let label =
            "idem begin+complete, 16 tasks (coalesced), on a just-made table (no statistics)";
        cells.push(Cell::new(label, work, "cycles/s").vs(1, None));
    }
    cells
}

fn why_cells() -> Vec<Cell> {
    let mut cells = Vec::new();
    for (what, tasks, per_key) in [
        ("fresh keys, 16 tasks", 16, 1),
        ("fresh keys, 64 tasks", 64, 1),
        ("8 deliveries a key at once, 16 tasks", 16, 8),
        ("8 deliveries a key at once, 64 tasks", 64, 8),
    ] {
        let row = cells.len();
        cells.push(Cell::new(
            &format!("SELECT … FOR UPDATE through the handler, {what}"),
            Work::Pessimistic { tasks, per_key },
            "deliveries/s",
        ));
        cells.push(
            Cell::new(
                &format!("idem begin, handler, complete, {what}"),
                Work::Claim { tasks, per_key },
                "deliveries/s",
            )
            .vs(row, None),
        );
    }
    cells
}

fn print_table(server: &str, title: &str, cells: &[Cell], per: &str) {
    println!("\n### {server}: {title}\n");
    let runs = cells.iter().map(|c| c.rates.len()).max().unwrap_or(0);
    let heads: Vec<String> = (1..=runs).map(|r| format!("run {r}")).collect();
    println!(
        "| what | unit | {} | median | ratio | commits / {per} | log flushes / {per} | log bytes / {per} | server CPU µs / {per} | client CPU µs / {per} |",
        heads.join(" | ")
    );
    println!("|{}", " --- |".repeat(9 + runs));
    for c in cells.iter().filter(|c| !c.rates.is_empty()) {
        let runs: Vec<String> = c.rates.iter().map(|r| format!("{r:.0}")).collect();
        let ratio = match c.vs.filter(|&v| !cells[v].rates.is_empty()) {
            Some(v) => {
                let r = c.median() / cells[v].median();
                match c.target {
                    Some(t) => format!("{r:.2}× (target {t})"),
                    None => format!("{r:.2}×"),
                }
            }
            None => String::new(),
        };
        let per_item = |x: f64| if c.items > 0.0 { x / c.items } else { 0.0 };
        println!(
            "| {} | {} | {} | **{:.0}** | {} | {:.3} | {:.3} | {:.0} | {:.1} | {:.1} |",
            c.label,
            c.unit,
            runs.join(" | "),
            c.median(),
            ratio,
            per_item(c.counts.commits),
            per_item(c.counts.flushes),
            per_item(c.counts.log_bytes),
            per_item(c.counts.server_cpu) * 1e6,
            per_item(c.counts.client_cpu) * 1e6,
        );
    }
}

async fn open(service: &str, url: &str) -> Server {
    let fail = |e: sqlx::Error| -> ! {
        panic!("{service} at {url} cannot be used ({e}); start it or set its URL")
    };
    if service == "PostgreSQL" {
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .unwrap_or_else(|e| fail(e));
        let pgbench = std::env::var_os("PGBENCH")
            .map(PathBuf::from)
            .or_else(|| {
                let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
                    .ok()?
                    .filter_map(|d| Some(d.ok()?.path().join("bin/pgbench")))
                    .filter(|p| p.exists())
                    .collect();
                found.sort();
                found.pop()
            })
            .unwrap_or_else(|| PathBuf::from("pgbench"));
        Server::Postgres {
            url: url.to_owned(),
            admin,
            pgbench,
        }
    } else {
        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .unwrap_or_else(|e| fail(e));
        Server::MySql {
            url: url.to_owned(),
            admin,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |word: &str, group: &[&str]| {
        args.iter().any(|a| a == word) || !args.iter().any(|a| group.contains(&a.as_str()))
    };
    let dbs = ["postgres", "mysql"];
    let parts = ["cycles", "why"];
    let secs: f64 = env_or("IDEM_BENCH_SECS", 5.0);
    let runs: usize = env_or("IDEM_BENCH_RUNS", 3);
    let n: usize = env_or("IDEM_BENCH_DELIVERIES", 16_000);
    let only: String = env_or("IDEM_BENCH_ONLY", String::new());
    let rows: usize = env_or("IDEM_BENCH_ROWS", 100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{} cores; {secs} s a timed cell, {n} deliveries a \"why\" cell, {runs} runs, median shown",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (db, service, var, default) in [
        (
            "postgres",
            "PostgreSQL",
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        ),
        (
            "mysql",
            "MariaDB",
            "IDEM_TEST_MYSQL_URL",
            "mysql://root@127.0.0.1:3306/test",
        ),
    ] {
        if !wants(db, &dbs) {
            continue;
        }
        let url = std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_owned());
        rt.block_on(async {
            let server = open(service, &url).await;
            println!("\n{service} at {url}: {}", server.settings().await);
            server.create_tables().await;
            // Makes idem's tables before the first reset.
            drop(server.store(true).await);
            let mut tables = Vec::new();
            if wants("cycles", &parts) {
                tables.push(("begin+complete on fresh keys", cycle_cells(&server), "item"));
            }
            if wants("why", &parts) {
                tables.push((
                    "why a claim: the pessimistic pattern against idem, 1 ms handler",
                    why_cells(),
                    "delivery",
                ));
            }
            for run in 0..runs {
                for (_, cells, _) in tables.iter_mut() {
                    for cell in cells.iter_mut().filter(|c| c.label.contains(&only)) {
                        let (items, took, counts) =
                            measure(&server, cell.work, secs, n, rows).await;
                        let rate = items as f64 / took;
                        eprintln!(
                            "run {}: {service}, {}: {rate:.0} {}",
                            run + 1,
                            cell.label,
                            cell.unit
                        );
                        cell.rates.push(rate);
                        cell.items += items as f64;
                        cell.counts += counts;
                    }
                }
            }
            for (title, cells, per) in &tables {
                print_table(service, title, cells, per);
            }
        });
    }
}
