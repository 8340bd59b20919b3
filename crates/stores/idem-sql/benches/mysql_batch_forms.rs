//! The MySQL/MariaDB batch statements of `begin_many` and `complete_many`
//! in several forms, side by side on the tests' server
//! (`IDEM_TEST_MYSQL_URL`): the same 256-key upsert, read-back and
//! completion, with their values written into the statement's text as
//! literals or bound to a prepared statement, the read-back matching its
//! keys one by one (`(ns = … AND k = …) OR …`) or as one `IN` list, and
//! the completion's bound byte strings plain or cast to `BINARY`.
//!
//! Each cell runs 16 tasks, each doing `begin` then `complete` of 256
//! fresh keys in the cell's forms, for `IDEM_BENCH_SECS` (5) seconds, from
//! a table emptied and filled with 100 000 completed rows. Every run goes
//! through all cells in turn, `IDEM_BENCH_RUNS` (3) runs, so the forms
//! alternate. Beside each rate: the server's CPU per item (mariadbd's or
//! mysqld's utime + stime from /proc) and, per statement, the temporary
//! tables the server made and how many of them went to disk.
//!
//! `cargo bench -p idem-sql --bench mysql_batch_forms`;
//! `IDEM_BENCH_ONLY` runs the cells whose label holds it.

use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use futures_util::future::join_all;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Either, MySqlPool, QueryBuilder, Row};

const TABLE: &str = "idem_bench_forms";
const NS: &[u8] = b"bench";
const BATCH: usize = 256;
const TASKS: usize = 16;
const LEASE_MS: i64 = 30_000;
const ABANDONED_MS: i64 = 86_400_000;
const RETENTION_MS: i64 = 86_400_000;
const OUTCOME: &[u8] = b"ok";
/// The server's clock in milliseconds, as the store reads it.
const NOW: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// How a statement carries its values.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    /// Written into the text as hexadecimal and integer literals, sent
    /// as a plain query (the text protocol).
    Literal,
    /// `?` placeholders of a prepared statement, values bound.
    Bound,
    /// Bound, each byte string read as `CAST(? AS BINARY)`: typed as
    /// `VARBINARY` of its length rather than as a parameter's `BLOB`.
    Cast,
}

/// How `begin`'s read-back matches its keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Read {
    /// `(ns = … AND k = …) OR …`, a key at a time.
    Or,
    /// `ns = … AND k IN (…)`, the store's form.
    In,
}

fn env_or<T: FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn hex(out: &mut String, bytes: &[u8]) {
    out.push_str("X'");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
}

/// splitmix64 keys, different for every task and run.
struct Keys(u64);

impl Keys {
    fn next(&mut self) -> Vec<u8> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        format!("k{}", z % 9_000_000_000_000_000_000 + 1).into_bytes()
    }
}

/// The upsert's `ON DUPLICATE KEY UPDATE`, as the store writes it.
fn on_duplicate() -> String {
    let taken = "claim = VALUES(claim)";
    format!(
        " ON DUPLICATE KEY UPDATE
          claim = IF(state = 0 OR expires_at <= @idem_now
                     OR (state = 1 AND lease_until <= @idem_now), VALUES(claim), claim),
          token = IF({taken}, GREATEST(token + 1, VALUES(token)), token),
          fp = IF({taken}, VALUES(fp), fp),
          attempts = IF({taken}, IF(state = 1 AND expires_at > @idem_now, attempts + 1, 1), attempts),
          started_at = IF({taken}, VALUES(started_at), started_at),
          outcome = IF({taken}, NULL, outcome),
          completed_at = IF({taken}, 0, completed_at),
          lease_until = IF({taken}, VALUES(lease_until), lease_until),
          expires_at = IF({taken}, VALUES(expires_at), expires_at),
          state = IF({taken}, 1, state)"
    )
}

const UPSERT_HEAD: &str = "INSERT INTO idem_bench_forms (ns, k, state, token, fp, attempts, \
     started_at, lease_until, outcome, completed_at, expires_at, claim) VALUES ";

/// `begin` of `keys`: the clock into `@idem_now`, the stamped upsert, the
/// read of the rows; answers each key's token, all of them claims.
async fn begin(
    pool: &MySqlPool,
    form: Form,
    match_keys: Read,
    keys: &[Vec<u8>],
    stamp: i64,
) -> Vec<i64> {
    let read_head = format!("SELECT ns, k, claim = {stamp} AS mine, token FROM {TABLE} WHERE ");
    let rows: Vec<MySqlRow> = match form {
        Form::Literal => {
            // The store's form: three statements in one round trip.
            let mut sql = format!("SET @idem_now = {NOW};\n{UPSERT_HEAD}");
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push('(');
                hex(&mut sql, NS);
                sql.push(',');
                hex(&mut sql, k);
                let _ = write!(
                    sql,
                    ", 1, @idem_now * 1024, NULL, 1, @idem_now, @idem_now + {LEASE_MS}, NULL, 0, @idem_now + {}, {stamp})",
                    LEASE_MS + ABANDONED_MS
                );
            }
            sql.push_str(&on_duplicate());
            sql.push_str(";\n");
            sql.push_str(&read_head);
            match match_keys {
                Read::Or => {
                    sql.push('(');
                    for (i, k) in keys.iter().enumerate() {
                        if i > 0 {
                            sql.push_str(" OR ");
                        }
                        sql.push_str("(ns = ");
                        hex(&mut sql, NS);
                        sql.push_str(" AND k = ");
                        hex(&mut sql, k);
                        sql.push(')');
                    }
                    sql.push(')');
                }
                Read::In => {
                    sql.push_str("ns = ");
                    hex(&mut sql, NS);
                    sql.push_str(" AND k IN (");
                    for (i, k) in keys.iter().enumerate() {
                        if i > 0 {
                            sql.push(',');
                        }
                        hex(&mut sql, k);
                    }
                    sql.push(')');
                }
            }
            sqlx::raw_sql(AssertSqlSafe(sql))
                .fetch_all(pool)
                .await
                .expect("begin, literal")
        }
        Form::Bound | Form::Cast => {
            // Prepared statements cannot be sent together: three round
            // trips on one connection, for its session variable.
            let mut conn = pool.acquire().await.expect("a connection");
            sqlx::raw_sql(AssertSqlSafe(format!("SET @idem_now = {NOW}")))
                .execute(&mut *conn)
                .await
                .expect("SET");
            let mut upsert = QueryBuilder::<sqlx::MySql>::new(UPSERT_HEAD);
            for (i, k) in keys.iter().enumerate() {
                upsert.push(if i == 0 { "(" } else { ",(" });
                upsert.push_bind(NS);
                upsert.push(",");
                upsert.push_bind(&k[..]);
                upsert.push(", 1, @idem_now * 1024, ");
                upsert.push_bind(None::<&[u8]>);
                upsert.push(", 1, @idem_now, @idem_now + ");
                upsert.push_bind(LEASE_MS);
                upsert.push(", NULL, 0, @idem_now + ");
                upsert.push_bind(LEASE_MS + ABANDONED_MS);
                upsert.push(", ");
                upsert.push_bind(stamp);
                upsert.push(")");
            }
            upsert.push(on_duplicate());
            upsert
                .build()
                .execute(&mut *conn)
                .await
                .expect("begin's upsert, bound");
            let mut read = QueryBuilder::<sqlx::MySql>::new(read_head);
            match match_keys {
                Read::Or => {
                    read.push("(");
                    for (i, k) in keys.iter().enumerate() {
                        if i > 0 {
                            read.push(" OR ");
                        }
                        read.push("(ns = ");
                        read.push_bind(NS);
                        read.push(" AND k = ");
                        read.push_bind(&k[..]);
                        read.push(")");
                    }
                    read.push(")");
                }
                Read::In => {
                    read.push("ns = ");
                    read.push_bind(NS);
                    read.push(" AND k IN (");
                    let mut values = read.separated(",");
                    for k in keys {
                        values.push_bind(&k[..]);
                    }
                    read.push(")");
                }
            }
            read.build()
                .fetch_all(&mut *conn)
                .await
                .expect("begin's read, bound")
        }
    };
    assert_eq!(rows.len(), keys.len(), "every key read back");
    let mut tokens = Vec::with_capacity(keys.len());
    let index: std::collections::HashMap<Vec<u8>, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), i))
        .collect();
    tokens.resize(keys.len(), 0);
    for row in rows {
        let k: Vec<u8> = row.get("k");
        let mine: i64 = row.get("mine");
        assert_eq!(mine, 1, "a fresh key was not claimed");
        tokens[index[&k]] = row.get("token");
    }
    tokens
}

/// `complete` of `keys` held by `tokens`, one statement: the items as a
/// derived table of `SELECT … UNION ALL` rows joined to the records.
async fn complete(pool: &MySqlPool, form: Form, keys: &[Vec<u8>], tokens: &[i64]) {
    let tail = format!(
        ") i ON r.ns = i.ns AND r.k = i.k AND r.token = i.token
        SET r.outcome = i.outcome, r.completed_at = {NOW},
            r.expires_at = {NOW} + i.retention, r.lease_until = 0, r.state = 2
        WHERE r.state = 1 AND r.lease_until > {NOW}"
    );
    let head = format!("UPDATE {TABLE} r JOIN (");
    let taken = match form {
        Form::Literal => {
            let mut sql = head;
            for (i, (k, t)) in keys.iter().zip(tokens).enumerate() {
                sql.push_str(if i == 0 {
                    "SELECT "
                } else {
                    " UNION ALL SELECT "
                });
                hex(&mut sql, NS);
                sql.push_str(" AS ns, ");
                hex(&mut sql, k);
                let _ = write!(sql, " AS k, {t} AS token, ");
                hex(&mut sql, OUTCOME);
                let _ = write!(sql, " AS outcome, {RETENTION_MS} AS retention");
            }
            sql.push_str(&tail);
            let mut taken = 0;
            let mut results = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(pool);
            while let Some(step) = results.try_next().await.expect("complete, literal") {
                if let Either::Left(done) = step {
                    taken += done.rows_affected();
                }
            }
            taken
        }
        Form::Bound | Form::Cast => {
            let (open, close) = if form == Form::Cast {
                ("CAST(", " AS BINARY)")
            } else {
                ("", "")
            };
            let mut q = QueryBuilder::<sqlx::MySql>::new(head);
            for (i, (k, t)) in keys.iter().zip(tokens).enumerate() {
                q.push(if i == 0 {
                    "SELECT "
                } else {
                    " UNION ALL SELECT "
                });
                q.push(open);
                q.push_bind(NS);
                q.push(close);
                q.push(" AS ns, ");
                q.push(open);
                q.push_bind(&k[..]);
                q.push(close);
                q.push(" AS k, ");
                q.push_bind(*t);
                q.push(" AS token, ");
                q.push(open);
                q.push_bind(Some(OUTCOME));
                q.push(close);
                q.push(" AS outcome, ");
                q.push_bind(RETENTION_MS);
                q.push(" AS retention");
            }
            q.push(tail);
            q.build()
                .execute(pool)
                .await
                .expect("complete, bound")
                .rows_affected()
        }
    };
    assert_eq!(taken, keys.len() as u64, "every key completed");
}

/// `begin` + `complete` of `BATCH` fresh keys in `forms` until `deadline`
/// (once at least); answers how many keys.
async fn cycles(
    pool: Arc<MySqlPool>,
    task: usize,
    deadline: Instant,
    forms: (Form, Read, Form),
) -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut keys = Keys((task as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed);
    // Stamps of different tasks never meet: the task in the high bits.
    let mut stamp = ((task as i64 + 1) << 40) | ((seed as i64 & 0xff_ffff) << 8);
    let mut n = 0u64;
    while n == 0 || Instant::now() < deadline {
        let mut batch: Vec<Vec<u8>> = (0..BATCH).map(|_| keys.next()).collect();
        // In primary-key order, as the store locks them.
        batch.sort();
        stamp += 2;
        let tokens = begin(&pool, forms.0, forms.1, &batch, stamp | 1).await;
        complete(&pool, forms.2, &batch, &tokens).await;
        n += BATCH as u64;
    }
    n
}

/// One cell: a form for `begin`, its read-back and `complete`.
struct Cell {
    label: String,
    begin: Form,
    read: Read,
    complete: Form,
    rates: Vec<f64>,
    server_us: Vec<f64>,
    tmp_tables: Vec<f64>,
    disk_tables: Vec<f64>,
}

/// CPU seconds the server's process has used (utime + stime).
fn server_cpu() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|s| s.contains(" (mariadbd) ") || s.contains(" (mysqld) "))
        .map(|s| {
            let (_, rest) = s.rsplit_once(") ").unwrap_or_default();
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse::<f64>().ok())
                .sum::<f64>()
                / 100.0
        })
        .sum()
}

/// The server's counts of temporary tables made, and of those on disk.
async fn tmp_tables(admin: &MySqlPool) -> (f64, f64) {
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Created_tmp_tables', 'Created_tmp_disk_tables')",
    )
    .fetch_all(admin)
    .await
    .expect("SHOW GLOBAL STATUS");
    let mut out = (0.0, 0.0);
    for row in rows {
        let (name, value): (String, String) = (row.get(0), row.get(1));
        let v = value.parse().unwrap_or(0.0);
        if name == "Created_tmp_tables" {
            out.0 = v;
        } else {
            out.1 = v;
        }
    }
    out
}

/// Empties the table and fills it with `rows` completed records.
async fn reset(admin: &MySqlPool, rows: usize) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "TRUNCATE TABLE {TABLE};
         INSERT INTO {TABLE} (ns, k, state, token, fp, attempts, started_at, lease_until,
                              outcome, completed_at, expires_at)
           SELECT 'bench', CONCAT('r', seq), 2, {}, NULL, 1, {now_ms}, 0, 'ok', {now_ms}, {}
           FROM seq_1_to_{rows};
         ANALYZE TABLE {TABLE}",
        now_ms * 1024,
        now_ms + RETENTION_MS
    )))
    .execute(admin)
    .await
    .expect("reset");
}

fn main() {
    let secs: f64 = env_or("IDEM_BENCH_SECS", 5.0);
    let runs: usize = env_or("IDEM_BENCH_RUNS", 3);
    let rows: usize = env_or("IDEM_BENCH_ROWS", 100_000);
    let only: String = env_or("IDEM_BENCH_ONLY", String::new());
    let url = std::env::var("IDEM_TEST_MYSQL_URL")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The store makes the table, with its columns and keys.
        drop(
            idem_sql::SqlStore::builder(&url)
                .table(TABLE)
                .sweep_interval(None)
                .connect()
                .await
                .expect("the store"),
        );
        let options = MySqlConnectOptions::from_str(&url)
            .expect("the URL")
            .found_rows(true)
            .timezone(Some("+00:00".to_owned()));
        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .expect("a connection");
        // Each pair of neighbours differs in one thing.
        let mut cells: Vec<Cell> = [
            (Form::Literal, Read::Or, Form::Literal),
            (Form::Literal, Read::Or, Form::Bound),
            (Form::Literal, Read::In, Form::Bound),
            (Form::Literal, Read::In, Form::Cast),
            (Form::Bound, Read::In, Form::Cast),
        ]
        .into_iter()
        .map(|(begin, read, complete)| Cell {
            label: format!(
                "begin {}, read {}, complete {}",
                format!("{begin:?}").to_lowercase(),
                format!("{read:?}").to_uppercase(),
                format!("{complete:?}").to_lowercase()
            ),
            begin,
            read,
            complete,
            rates: Vec::new(),
            server_us: Vec::new(),
            tmp_tables: Vec::new(),
            disk_tables: Vec::new(),
        })
        .filter(|c| c.label.contains(&only))
        .collect();
        println!(
            "{TASKS} tasks, begin + complete of {BATCH} fresh keys, {secs} s a cell, {runs} runs"
        );
        for run in 1..=runs {
            for cell in cells.iter_mut() {
                let pool = MySqlPoolOptions::new()
                    .max_connections(TASKS as u32)
                    .test_before_acquire(false)
                    .connect_with(options.clone())
                    .await
                    .expect("a pool");
                reset(&admin, rows).await;
                let pool = Arc::new(pool);
                let forms = (cell.begin, cell.read, cell.complete);
                // One untimed cycle a task opens the connections and
                // prepares the statements.
                let now = Instant::now();
                join_all((0..TASKS).map(|t| tokio::spawn(cycles(pool.clone(), t, now, forms))))
                    .await;
                let (tmp0, disk0) = tmp_tables(&admin).await;
                let cpu0 = server_cpu();
                let started = Instant::now();
                let deadline = started + Duration::from_secs_f64(secs);
                let items: u64 = join_all(
                    (0..TASKS).map(|t| tokio::spawn(cycles(pool.clone(), t, deadline, forms))),
                )
                .await
                .into_iter()
                .map(|r| r.expect("a task"))
                .sum();
                let took = started.elapsed().as_secs_f64();
                let cpu = server_cpu() - cpu0;
                let (tmp1, disk1) = tmp_tables(&admin).await;
                pool.close().await;
                let statements = 2.0 * items as f64 / BATCH as f64;
                let rate = items as f64 / took;
                let us = cpu * 1e6 / items as f64;
                eprintln!(
                    "run {run}: {}: {rate:.0} items/s, server {us:.1} µs/item, {:.2} temporary tables a statement, {:.2} on disk",
                    cell.label,
                    (tmp1 - tmp0) / statements,
                    (disk1 - disk0) / statements
                );
                cell.rates.push(rate);
                cell.server_us.push(us);
                cell.tmp_tables.push((tmp1 - tmp0) / statements);
                cell.disk_tables.push((disk1 - disk0) / statements);
            }
        }
        println!("\n| forms | items/s, each run | median | server CPU µs / item, each run | median | temporary tables / statement | on disk / statement |");
        println!("| --- | --- | ---: | --- | ---: | ---: | ---: |");
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let list = |v: &[f64], digits: usize| {
            v.iter()
                .map(|x| format!("{x:.digits$}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for c in &cells {
            println!(
                "| {} | {} | **{:.0}** | {} | **{:.1}** | {:.2} | {:.2} |",
                c.label,
                list(&c.rates, 0),
                median(&c.rates),
                list(&c.server_us, 1),
                median(&c.server_us),
                median(&c.tmp_tables),
                median(&c.disk_tables)
            );
        }
        // The store's tables: the records, its token marks, its versions.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {TABLE}, {TABLE}_tokens, {TABLE}_schema"
        )))
            .execute(&admin)
            .await
            .expect("DROP TABLE");
    });
}
