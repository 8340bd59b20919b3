//! The record statements on MySQL and MariaDB.
//!
//! Neither server returns rows from an `INSERT … ON DUPLICATE KEY UPDATE`
//! (MySQL has no `RETURNING`), so `begin` sends one round trip of three
//! statements in autocommit: read the server's clock into a session
//! variable, upsert, read the rows back. The upsert takes an absent,
//! released or lapsed key and stamps it with a random number of its own
//! (`claim`); a row read back carrying that stamp is this call's claim,
//! any other row is what the call found. No transaction spans the
//! statements, so a statement that fails leaves no transaction open on
//! the connection.
//!
//! `complete`, which carries outcomes, and the single-key statements
//! (`get`, `release`, `scan`, `sweep`) are prepared statements with bound
//! values: an outcome travels as its bytes, not as text twice its size.
//! `begin` and `extend` keep their one round trip as text, with keys as
//! hexadecimal literals written here from typed values, never as text
//! from the caller; table names come from a checked prefix.
//!
//! A key is matched as `ns = … AND k = …`, several keys as `ns = … AND k
//! IN (…)` for each namespace (ORed), which MariaDB resolves through the
//! primary key; it does not for a row constructor `(ns, k) IN ((…))` in an
//! `UPDATE`, which scans and, under REPEATABLE READ, locks every row of
//! the table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::TryStreamExt;
use idem_core::tier::ImportItem;
use idem_core::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Key, Lease, Record, ScanQuery,
    StoreError, Timestamp,
};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Either, QueryBuilder, Row};

use crate::migrate::tokens_table;
use crate::row::{ScanFilter, StoredRow, import_token, millis_column, ms, token_column};
use crate::store::Forget;
use crate::table::Tables;

/// The server's clock in milliseconds.
pub(crate) const NOW: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// The columns a [`StoredRow`] is read from.
const ROW: &str =
    "state, token, fp, attempts, started_at, lease_until, outcome, completed_at, expires_at";

/// The MySQL side of a store: its pool and its table names.
pub(crate) struct MySql {
    pub pool: MySqlPool,
    /// Quoted table names, by shard.
    pub(crate) tables: Vec<String>,
    pub(crate) get: Vec<String>,
    pub(crate) scan: Vec<String>,
    pub(crate) release: Vec<String>,
    pub(crate) reopen: Vec<String>,
    pub(crate) sweep: Vec<String>,
    pub(crate) next_namespace: Vec<String>,
    pub(crate) completed_page: Vec<String>,
    /// The server's clock in milliseconds.
    pub(crate) clock: String,
    /// Raises a table's token high-water mark: token, then table.
    pub(crate) raise_high_water: String,
    /// The server's clock and the largest high-water mark.
    pub(crate) high_water: String,
    /// Most bytes of values one batch statement carries, within the
    /// server's `max_allowed_packet`.
    pub statement_bytes: usize,
    /// Most bytes one import statement carries: as much as the server's
    /// `max_allowed_packet` takes, since a cold tier's batches are large.
    pub import_bytes: usize,
}

/// Writes `bytes` as a hexadecimal literal.
fn hex_literal(out: &mut String, bytes: &[u8]) {
    out.push_str("X'");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
}

fn ns(key: &Key) -> &[u8] {
    key.namespace().as_str().as_bytes()
}

/// A number no other statement uses: the mark of this statement's claims.
fn claim_stamp() -> i64 {
    static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let h = SEED.get_or_init(Default::default).hash_one(n);
    // Positive and never zero, the column's default.
    ((h >> 1) | 1) as i64
}

/// `(ns = … AND k = …)` for one key, as literals.
fn key_match(out: &mut String, key: &Key) {
    out.push_str("(ns = ");
    hex_literal(out, ns(key));
    out.push_str(" AND k = ");
    hex_literal(out, key.bytes());
    out.push(')');
}

/// `keys` in runs of one namespace each (one run a namespace when the keys
/// come in primary-key order).
fn by_namespace<'a, 'k>(keys: &'a [&'k Key]) -> impl Iterator<Item = &'a [&'k Key]> {
    keys.chunk_by(|a, b| ns(a) == ns(b))
}

/// `(ns = … AND k IN (…)) OR …` for `keys`, as literals: a namespace and
/// its keys for each run of one namespace.
///
/// MariaDB finds these rows through the primary key, and tests each row
/// found against its namespace's `IN` list by a binary search. Keys ORed
/// one by one, `(ns = … AND k = …) OR …`, are found the same way, but each
/// row found is then tested against the whole list: a read of 256 keys
/// cost the server three times the CPU.
fn key_list(out: &mut String, keys: &[&Key]) {
    out.push('(');
    for (i, run) in by_namespace(keys).enumerate() {
        if i > 0 {
            out.push_str(" OR ");
        }
        out.push_str("(ns = ");
        hex_literal(out, ns(run[0]));
        out.push_str(" AND k IN (");
        for (j, key) in run.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            hex_literal(out, key.bytes());
        }
        out.push_str("))");
    }
    out.push(')');
}

/// [`key_list`] with its values bound.
fn bind_key_list(q: &mut QueryBuilder<sqlx::MySql>, keys: &[&Key]) {
    q.push("(");
    for (i, run) in by_namespace(keys).enumerate() {
        if i > 0 {
            q.push(" OR ");
        }
        q.push("(ns = ");
        q.push_bind(ns(run[0]));
        q.push(" AND k IN (");
        let mut values = q.separated(",");
        for key in run {
            values.push_bind(&key.bytes()[..]);
        }
        q.push("))");
    }
    q.push(")");
}

impl MySql {
    pub fn new(pool: MySqlPool, tables: &Tables, max_allowed_packet: usize) -> Self {
        let tokens = format!("`{}`", tokens_table(tables));
        let tables: Vec<String> = tables.all().map(|t| format!("`{t}`")).collect();
        Self {
            pool,
            // One probe of the primary key. `SELECT DISTINCT ns` would make
            // one loose scan of it only once the table's statistics say
            // that pays, and read every row of a table filled since.
            next_namespace: tables
                .iter()
                .map(|t| format!("SELECT ns FROM {t} WHERE ns > ? ORDER BY ns LIMIT 1"))
                .collect(),
            // As on PostgreSQL, the page walks the primary key and says
            // which rows are live completed records.
            completed_page: tables
                .iter()
                .map(|t| {
                    format!(
                        "SELECT k, state = 2 AND expires_at > {NOW} AS live FROM {t}
                        WHERE ns = ? AND k > ? ORDER BY k LIMIT ?"
                    )
                })
                .collect(),
            clock: format!("SELECT {NOW}"),
            raise_high_water: format!(
                "UPDATE {tokens} SET high_water = GREATEST(high_water, ?) WHERE record_table = ?"
            ),
            high_water: format!(
                "SELECT {NOW} AS now, (SELECT MAX(high_water) FROM {tokens}) AS high_water"
            ),
            get: tables
                .iter()
                .map(|t| format!("SELECT {NOW} AS now, {ROW} FROM {t} WHERE ns = ? AND k = ?"))
                .collect(),
            scan: tables
                .iter()
                .map(|t| {
                    format!(
                        "SELECT {NOW} AS now, k, {ROW} FROM {t}
                        WHERE ns = ? AND k > ?
                          AND (state = 1 OR (state = 2 AND expires_at > {NOW}))
                          AND (? IS NULL OR state = ?)
                          AND (? IS NULL OR IF(state = 1, started_at, completed_at) < ?)
                        ORDER BY k LIMIT ?"
                    )
                })
                .collect(),
            release: tables
                .iter()
                .map(|t| {
                    format!(
                        "UPDATE {t} SET state = 0, fp = NULL, outcome = NULL, attempts = 0,
                          lease_until = 0, expires_at = {NOW} + ?
                        WHERE ns = ? AND k = ? AND token = ? AND state = 1 AND lease_until > {NOW}"
                    )
                })
                .collect(),
            reopen: tables
                .iter()
                .map(|t| {
                    format!(
                        "UPDATE {t} SET state = 0, fp = NULL, outcome = NULL, attempts = 0,
                          lease_until = 0, expires_at = {NOW} + ?
                        WHERE ns = ? AND k = ? AND token = ? AND state = 2 AND expires_at > {NOW}"
                    )
                })
                .collect(),
            sweep: tables
                .iter()
                .map(|t| {
                    format!("DELETE FROM {t} WHERE expires_at <= {NOW} ORDER BY expires_at LIMIT ?")
                })
                .collect(),
            tables,
            statement_bytes: crate::store::OUTCOME_BYTES_PER_STATEMENT
                .min(max_allowed_packet.saturating_sub(crate::builder::PACKET_OVERHEAD))
                .max(1),
            import_bytes: max_allowed_packet
                .saturating_sub(crate::builder::PACKET_OVERHEAD)
                .max(1),
        }
    }

    /// The statements of `begin` for `items`, sent in one round trip:
    /// read the clock, upsert, read the rows back.
    pub(crate) fn begin_statements(
        &self,
        shard: u16,
        items: &[&BeginItem],
        abandoned_ms: i64,
        stamp: i64,
    ) -> [String; 3] {
        let table = &self.tables[usize::from(shard)];
        let mut upsert = String::with_capacity(600 + items.len() * 160);
        let _ = write!(
            upsert,
            "INSERT INTO {table} (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at, claim) VALUES "
        );
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                upsert.push(',');
            }
            let lease = crate::row::millis(item.lease.duration());
            upsert.push('(');
            hex_literal(&mut upsert, ns(&item.key));
            upsert.push(',');
            hex_literal(&mut upsert, item.key.bytes());
            upsert.push_str(", 1, @idem_now * 1024, ");
            match item.fingerprint {
                Some(fp) => hex_literal(&mut upsert, &fp.to_bytes()),
                None => upsert.push_str("NULL"),
            }
            let _ = write!(
                upsert,
                ", 1, @idem_now, @idem_now + {lease}, NULL, 0, @idem_now + {}, {stamp})",
                lease.saturating_add(abandoned_ms)
            );
        }
        // Assignments run left to right: `claim` is decided first from the
        // row as found, and every later one asks whether it was taken.
        let taken = "claim = VALUES(claim)";
        let _ = write!(
            upsert,
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
        );
        let mut read = format!(
            "SELECT ns, k, claim = {stamp} AS mine, @idem_now AS now, {ROW} FROM {table} WHERE "
        );
        let keys: Vec<&Key> = items.iter().map(|i| &i.key).collect();
        key_list(&mut read, &keys);
        [format!("SET @idem_now = {NOW}"), upsert, read]
    }

    /// `begin` for items of one shard, no key twice. An answer is `None`
    /// when the item's row changed between the statements: try it again.
    pub async fn begin(
        &self,
        shard: u16,
        items: &[&BeginItem],
        abandoned_ms: i64,
    ) -> Result<Vec<Option<Begin>>, StoreError> {
        let sql = self
            .begin_statements(shard, items, abandoned_ms, claim_stamp())
            .join(";\n");
        let rows = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let index: HashMap<(&[u8], &[u8]), usize> = items
            .iter()
            .enumerate()
            .map(|(i, item)| ((ns(&item.key), &item.key.bytes()[..]), i))
            .collect();
        let mut answers: Vec<Option<Begin>> = vec![None; items.len()];
        for row in rows {
            let (ns, k): (Vec<u8>, Vec<u8>) = (get(&row, "ns")?, get(&row, "k")?);
            let Some(&i) = index.get(&(&ns[..], &k[..])) else {
                continue;
            };
            let mine: i64 = get(&row, "mine")?;
            let now: i64 = get(&row, "now")?;
            let stored = stored_row(&row)?;
            answers[i] = if mine == 1 {
                Some(stored.claim())
            } else {
                stored.answer_begin(items[i].fingerprint, now)?
            };
        }
        Ok(answers)
    }

    /// Pushes `complete`'s update for `items` onto `q`, values bound.
    pub(crate) fn push_complete(
        &self,
        update: &mut QueryBuilder<sqlx::MySql>,
        shard: u16,
        items: &[&CompleteItem],
    ) {
        let table = &self.tables[usize::from(shard)];
        if let [item] = items {
            // One key: the plain single-table form, matched by primary key.
            // Assignments run left to right; none reads a column written
            // before it.
            update.push(format_args!("UPDATE {table} SET outcome = "));
            update.push_bind(item.outcome.as_deref());
            update.push(format_args!(
                ", completed_at = {NOW}, expires_at = {NOW} + "
            ));
            update.push_bind(crate::row::millis(item.retention));
            update.push(", lease_until = 0, state = 2 WHERE ns = ");
            update.push_bind(ns(&item.key));
            update.push(" AND k = ");
            update.push_bind(&item.key.bytes()[..]);
            update.push(" AND token = ");
            update.push_bind(token_column(item.token));
            update.push(format_args!(" AND state = 1 AND lease_until > {NOW}"));
        } else {
            // The server writes these rows into a temporary table before
            // the join reads them. MariaDB types a bound string there as a
            // BLOB, which its in-memory temporary tables cannot hold, so
            // every statement made, filled and dropped a temporary table
            // on disk. Cast to BINARY, a value is a VARBINARY of its own
            // length, as a literal is, and the table stays in memory
            // (unless an outcome is too large for it). The cast is typed
            // again at each execution: a longer value in a later batch is
            // not cut.
            update.push(format_args!("UPDATE {table} r JOIN ("));
            for (i, item) in items.iter().enumerate() {
                update.push(if i == 0 {
                    "SELECT "
                } else {
                    " UNION ALL SELECT "
                });
                update.push("CAST(");
                update.push_bind(ns(&item.key));
                update.push(" AS BINARY) AS ns, CAST(");
                update.push_bind(&item.key.bytes()[..]);
                update.push(" AS BINARY) AS k, ");
                update.push_bind(token_column(item.token));
                update.push(" AS token, CAST(");
                update.push_bind(item.outcome.as_deref());
                update.push(" AS BINARY) AS outcome, ");
                update.push_bind(crate::row::millis(item.retention));
                update.push(" AS retention");
            }
            // Multiple-table updates assign in no set order: no assignment
            // reads a column another one writes. NOW() is the statement's
            // start, the same in every expression.
            update.push(format_args!(
                ") i ON r.ns = i.ns AND r.k = i.k AND r.token = i.token
                SET r.outcome = i.outcome, r.completed_at = {NOW},
                    r.expires_at = {NOW} + i.retention, r.lease_until = 0, r.state = 2
                WHERE r.state = 1 AND r.lease_until > {NOW}"
            ));
        }
    }

    /// Pushes the read that follows `complete`'s update when an item did
    /// not take its row.
    pub(crate) fn push_complete_read(
        &self,
        read: &mut QueryBuilder<sqlx::MySql>,
        shard: u16,
        items: &[&CompleteItem],
    ) {
        let table = &self.tables[usize::from(shard)];
        read.push(format_args!(
            "SELECT ns, k, token, state, expires_at, {NOW} AS now FROM {table} WHERE "
        ));
        let keys: Vec<&Key> = items.iter().map(|i| &i.key).collect();
        bind_key_list(read, &keys);
    }

    /// `complete` for items of one shard, no key twice.
    ///
    /// The update takes in-progress rows held by each item's token. When it
    /// took fewer rows than there are items, a read answers `Ok` for every
    /// row completed by its item's token, which also covers a retried call
    /// whose first answer was lost.
    pub async fn complete(
        &self,
        shard: u16,
        items: &[&CompleteItem],
    ) -> Result<Vec<Fenced>, StoreError> {
        let mut update = QueryBuilder::<sqlx::MySql>::new("");
        self.push_complete(&mut update, shard, items);
        let taken = update
            .build()
            .execute(&self.pool)
            .await
            .map_err(crate::error::store)?
            .rows_affected();
        // Every item took its row: the common case needs no read.
        if usize::try_from(taken).is_ok_and(|n| n == items.len()) {
            return Ok(vec![Fenced::Ok(()); items.len()]);
        }
        let mut read = QueryBuilder::<sqlx::MySql>::new("");
        self.push_complete_read(&mut read, shard, items);
        let rows = read
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let index: HashMap<(&[u8], &[u8]), usize> = items
            .iter()
            .enumerate()
            .map(|(i, item)| ((ns(&item.key), &item.key.bytes()[..]), i))
            .collect();
        let mut answers = vec![Fenced::Stale; items.len()];
        for row in rows {
            let (ns, k): (Vec<u8>, Vec<u8>) = (get(&row, "ns")?, get(&row, "k")?);
            let Some(&i) = index.get(&(&ns[..], &k[..])) else {
                continue;
            };
            let state: i8 = get(&row, "state")?;
            let (tok, expires_at, now): (i64, i64, i64) = (
                get(&row, "token")?,
                get(&row, "expires_at")?,
                get(&row, "now")?,
            );
            if i16::from(state) == crate::row::COMPLETED
                && tok == token_column(items[i].token)
                && expires_at > now
            {
                answers[i] = Fenced::Ok(());
            }
        }
        Ok(answers)
    }

    /// `release` or `reopen`: the record owned by `held` (a live claim, or
    /// a live completion) becomes a tombstone.
    pub async fn forget(
        &self,
        shard: u16,
        key: &Key,
        held: FencingToken,
        what: Forget,
        tombstone_ms: i64,
    ) -> Result<Fenced, StoreError> {
        let statements = match what {
            Forget::Claim => &self.release,
            Forget::Completion => &self.reopen,
        };
        let done = sqlx::query(AssertSqlSafe(&*statements[usize::from(shard)]))
            .bind(tombstone_ms)
            .bind(ns(key))
            .bind(&key.bytes()[..])
            .bind(token_column(held))
            .execute(&self.pool)
            .await
            .map_err(crate::error::store)?;
        Ok(if done.rows_affected() >= 1 {
            Fenced::Ok(())
        } else {
            Fenced::Stale
        })
    }

    /// The statements of `extend`, sent in one round trip: read the clock,
    /// update the row held by `held`, answer the new lease's end.
    pub(crate) fn extend_statements(
        &self,
        shard: u16,
        key: &Key,
        held: FencingToken,
        lease: Lease,
        abandoned_ms: i64,
    ) -> [String; 3] {
        let table = &self.tables[usize::from(shard)];
        let lease = crate::row::millis(lease.duration());
        let mut update = format!(
            "UPDATE {table} SET lease_until = @idem_now + {lease}, expires_at = @idem_now + {}
            WHERE token = {} AND state = 1 AND lease_until > @idem_now AND ",
            lease.saturating_add(abandoned_ms),
            token_column(held),
        );
        key_match(&mut update, key);
        [
            format!("SET @idem_now = {NOW}"),
            update,
            format!("SELECT @idem_now + {lease} AS until"),
        ]
    }

    pub async fn extend(
        &self,
        shard: u16,
        key: &Key,
        held: FencingToken,
        lease: Lease,
        abandoned_ms: i64,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        let sql = self
            .extend_statements(shard, key, held, lease, abandoned_ms)
            .join(";\n");
        let mut results = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&self.pool);
        let mut matched = 0;
        let mut until = None;
        while let Some(step) = results.try_next().await.map_err(crate::error::store)? {
            match step {
                Either::Left(done) => matched += done.rows_affected(),
                Either::Right(row) => until = Some(get::<i64>(&row, "until")?),
            }
        }
        match until {
            Some(until) if matched >= 1 => Ok(Fenced::Ok(ms(until))),
            _ => Ok(Fenced::Stale),
        }
    }

    pub async fn get(&self, shard: u16, key: &Key) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(&*self.get[usize::from(shard)]))
            .bind(ns(key))
            .bind(&key.bytes()[..])
            .fetch_optional(&self.pool)
            .await
            .map_err(crate::error::store)?;
        match row {
            Some(row) => {
                let now: i64 = get(&row, "now")?;
                stored_row(&row)?.record(now)
            }
            None => Ok(None),
        }
    }

    /// One shard's part of a scan, in key order.
    pub async fn scan(&self, shard: u16, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let filter = ScanFilter::of(query);
        let rows = sqlx::query(AssertSqlSafe(&*self.scan[usize::from(shard)]))
            .bind(query.namespace.as_str().as_bytes())
            .bind(query.after.as_deref().unwrap_or(&[]))
            .bind(filter.state)
            .bind(filter.state)
            .bind(filter.older_than)
            .bind(filter.older_than)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let (now, k): (i64, Vec<u8>) = (get(&row, "now")?, get(&row, "k")?);
            out.extend(stored_row(&row)?.entry(&query.namespace, k, now)?);
        }
        Ok(out)
    }

    /// Deletes up to `batch` expired rows of one shard; returns how many.
    pub async fn sweep(&self, shard: u16, batch: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(AssertSqlSafe(&*self.sweep[usize::from(shard)]))
            .bind(batch)
            .execute(&self.pool)
            .await
            .map_err(crate::error::store)?;
        Ok(done.rows_affected())
    }
}

/// Values one imported record binds in the upsert.
pub(crate) const IMPORT_BINDS: usize = 9;

/// The tier statements (docs/contract.md §2, "Tiers").
impl MySql {
    /// Pushes the upsert of `import` for `items`, values bound: each key
    /// whose row is not a live completed record at `now` takes the item,
    /// stamped with `stamp` in `claim`; a live completed row keeps
    /// everything, its stamp included.
    pub(crate) fn push_import(
        &self,
        upsert: &mut QueryBuilder<sqlx::MySql>,
        shard: u16,
        items: &[&ImportItem],
        tokens: &[i64],
        now: i64,
        stamp: i64,
    ) {
        let table = &self.tables[usize::from(shard)];
        upsert.push(format_args!(
            "INSERT INTO {table} (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at, claim) "
        ));
        upsert.push_values(items.iter().zip(tokens), |mut row, (item, &token)| {
            let r = &item.record;
            row.push_bind(ns(&item.key))
                .push_bind(&item.key.bytes()[..])
                .push("2")
                .push_bind(token)
                .push_bind(r.fingerprint.map(|f| f.to_bytes().to_vec()))
                .push("1")
                .push_bind(millis_column(r.completed_at))
                .push("0")
                .push_bind(r.outcome.as_deref())
                .push_bind(millis_column(r.completed_at))
                .push_bind(millis_column(r.expires_at))
                .push_bind(stamp);
        });
        // As in `begin`: assignments run left to right, `claim` is decided
        // first from the row as found, and every later one asks whether it
        // was taken.
        let taken = "claim = VALUES(claim)";
        upsert.push(" ON DUPLICATE KEY UPDATE claim = IF(state = 2 AND expires_at > ");
        upsert.push_bind(now);
        upsert.push(format_args!(
            ", claim, VALUES(claim)),
              token = IF({taken}, VALUES(token), token),
              fp = IF({taken}, VALUES(fp), fp),
              attempts = IF({taken}, 1, attempts),
              started_at = IF({taken}, VALUES(started_at), started_at),
              lease_until = IF({taken}, 0, lease_until),
              outcome = IF({taken}, VALUES(outcome), outcome),
              completed_at = IF({taken}, VALUES(completed_at), completed_at),
              expires_at = IF({taken}, VALUES(expires_at), expires_at),
              state = IF({taken}, 2, state)"
        ));
    }

    /// Pushes the read of the rows `import`'s upsert stamped with `stamp`:
    /// the keys as a derived table joined on the primary key, one lookup
    /// each. (Keys ORed in the `WHERE`, as the other reads match them, are
    /// found through the primary key too, but MariaDB then tests every row
    /// found against the whole list: a read of thousands of keys took
    /// seconds.)
    pub(crate) fn push_import_read(
        &self,
        read: &mut QueryBuilder<sqlx::MySql>,
        shard: u16,
        items: &[&ImportItem],
        stamp: i64,
    ) {
        let table = &self.tables[usize::from(shard)];
        read.push("SELECT r.ns, r.k, r.token FROM (");
        for (i, item) in items.iter().enumerate() {
            read.push(if i == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            });
            // Cast to BINARY to stay in an in-memory temporary table, as
            // in `push_complete`.
            read.push("CAST(");
            read.push_bind(ns(&item.key));
            read.push(" AS BINARY) AS ns, CAST(");
            read.push_bind(&item.key.bytes()[..]);
            read.push(" AS BINARY) AS k");
        }
        read.push(format_args!(
            ") i JOIN {table} r ON r.ns = i.ns AND r.k = i.k WHERE r.claim = "
        ));
        read.push_bind(stamp);
    }

    /// `import_many` for items of one shard, no key twice: whether each
    /// item was written.
    ///
    /// An upsert returns no rows here (MySQL has no `RETURNING`, and
    /// MariaDB's does not cover `ON DUPLICATE KEY UPDATE`), and its count of
    /// affected rows is one number for the whole statement. So the upsert
    /// stamps each row it writes with a number no other statement uses,
    /// and a read in the same transaction finds the stamped rows: those
    /// are the items written. The transaction holds the written rows'
    /// locks until it commits, so nothing changes them between the upsert
    /// and the read, and it raises the table's high-water mark with them:
    /// the records and the mark commit together.
    pub async fn import(
        &self,
        shard: u16,
        items: &[&ImportItem],
        record_table: &str,
    ) -> Result<Vec<bool>, StoreError> {
        let tokens: Vec<i64> = items
            .iter()
            .map(|i| import_token(i))
            .collect::<Result<_, _>>()?;
        let mut written = vec![false; items.len()];
        let mut tx = self.pool.begin().await.map_err(crate::error::store)?;
        let now: i64 = sqlx::query_scalar(AssertSqlSafe(&*self.clock))
            .fetch_one(&mut *tx)
            .await
            .map_err(crate::error::store)?;
        // A record already expired is not written.
        let live: Vec<usize> = (0..items.len())
            .filter(|&i| millis_column(items[i].record.expires_at) > now)
            .collect();
        if live.is_empty() {
            tx.rollback().await.map_err(crate::error::store)?;
            return Ok(written);
        }
        let live_items: Vec<&ImportItem> = live.iter().map(|&i| items[i]).collect();
        let live_tokens: Vec<i64> = live.iter().map(|&i| tokens[i]).collect();
        let stamp = claim_stamp();
        // Not kept prepared: the text changes with the number of items,
        // and would push the store's own statements out of the cache.
        let mut upsert = QueryBuilder::<sqlx::MySql>::new("");
        self.push_import(&mut upsert, shard, &live_items, &live_tokens, now, stamp);
        upsert
            .build()
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(crate::error::store)?;
        let mut read = QueryBuilder::<sqlx::MySql>::new("");
        self.push_import_read(&mut read, shard, &live_items, stamp);
        let rows = read
            .build()
            .persistent(false)
            .fetch_all(&mut *tx)
            .await
            .map_err(crate::error::store)?;
        let index: HashMap<(&[u8], &[u8]), usize> = live
            .iter()
            .map(|&i| ((ns(&items[i].key), &items[i].key.bytes()[..]), i))
            .collect();
        let mut high_water = None;
        for row in rows {
            let (ns, k): (Vec<u8>, Vec<u8>) = (get(&row, "ns")?, get(&row, "k")?);
            if let Some(&i) = index.get(&(&ns[..], &k[..])) {
                written[i] = true;
                high_water = high_water.max(Some(get::<i64>(&row, "token")?));
            }
        }
        if let Some(token) = high_water {
            sqlx::query(AssertSqlSafe(&*self.raise_high_water))
                .bind(token)
                .bind(record_table)
                .execute(&mut *tx)
                .await
                .map_err(crate::error::store)?;
        }
        tx.commit().await.map_err(crate::error::store)?;
        Ok(written)
    }

    /// The namespaces of one shard's table, one probe each.
    pub async fn namespaces(&self, shard: u16) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut found: Vec<Vec<u8>> = Vec::new();
        loop {
            let next: Option<Vec<u8>> =
                sqlx::query_scalar(AssertSqlSafe(&*self.next_namespace[usize::from(shard)]))
                    .bind(found.last().map_or(&[][..], |n| &n[..]))
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(crate::error::store)?;
            match next {
                Some(ns) => found.push(ns),
                None => return Ok(found),
            }
        }
    }

    /// The next `limit` keys of one namespace in one shard's table, after
    /// `after`, in order, each with whether it holds a live completed
    /// record.
    pub async fn completed_page(
        &self,
        shard: u16,
        namespace: &[u8],
        after: &[u8],
        limit: i64,
    ) -> Result<Vec<(Vec<u8>, bool)>, StoreError> {
        sqlx::query_as(AssertSqlSafe(&*self.completed_page[usize::from(shard)]))
            .bind(namespace)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)
    }
}

fn get<'r, T>(row: &'r MySqlRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
{
    row.try_get(column).map_err(crate::error::store)
}

fn stored_row(row: &MySqlRow) -> Result<StoredRow, StoreError> {
    let state: i8 = get(row, "state")?;
    Ok(StoredRow {
        state: i16::from(state),
        token: get(row, "token")?,
        fingerprint: get(row, "fp")?,
        attempts: get(row, "attempts")?,
        started_at: get(row, "started_at")?,
        lease_until: get(row, "lease_until")?,
        outcome: get(row, "outcome")?,
        completed_at: get(row, "completed_at")?,
        expires_at: get(row, "expires_at")?,
    })
}
