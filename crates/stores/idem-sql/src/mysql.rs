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
//! Values go into these statements as integers and hexadecimal literals
//! written here from typed values, never as text from the caller; table
//! names come from a checked prefix.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::TryStreamExt;
use idem_core::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Key, Lease, Record, ScanQuery,
    StoreError, Timestamp,
};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Either, Row};

use crate::row::{ScanFilter, StoredRow, ms, token_column};
use crate::table::Tables;

/// The server's clock in milliseconds.
const NOW: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)";

/// The columns a [`StoredRow`] is read from.
const ROW: &str =
    "state, token, fp, attempts, started_at, lease_until, outcome, completed_at, expires_at";

/// The MySQL side of a store: its pool and its table names.
pub(crate) struct MySql {
    pub pool: MySqlPool,
    /// Quoted table names, by shard.
    tables: Vec<String>,
    get: Vec<String>,
    scan: Vec<String>,
    release: Vec<String>,
    sweep: Vec<String>,
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

/// `WHERE (ns, k) IN (…)` for `keys`.
fn key_list<'a>(out: &mut String, keys: impl Iterator<Item = &'a Key>) {
    out.push_str("(ns, k) IN (");
    for (i, key) in keys.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('(');
        hex_literal(out, ns(key));
        out.push(',');
        hex_literal(out, key.bytes());
        out.push(')');
    }
    out.push(')');
}

impl MySql {
    pub fn new(pool: MySqlPool, tables: &Tables) -> Self {
        let tables: Vec<String> = tables.all().map(|t| format!("`{t}`")).collect();
        Self {
            pool,
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
            sweep: tables
                .iter()
                .map(|t| {
                    format!("DELETE FROM {t} WHERE expires_at <= {NOW} ORDER BY expires_at LIMIT ?")
                })
                .collect(),
            tables,
        }
    }

    /// `begin` for items of one shard, no key twice. An answer is `None`
    /// when the item's row changed between the statements: try it again.
    pub async fn begin(
        &self,
        shard: u16,
        items: &[&BeginItem],
        abandoned_ms: i64,
    ) -> Result<Vec<Option<Begin>>, StoreError> {
        let table = &self.tables[usize::from(shard)];
        let stamp = claim_stamp();
        let mut sql = String::with_capacity(600 + items.len() * 160);
        let _ = write!(
            sql,
            "SET @idem_now = {NOW};
            INSERT INTO {table} (ns, k, state, token, fp, attempts, started_at, lease_until,
                                 outcome, completed_at, expires_at, claim) VALUES "
        );
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                sql.push(',');
            }
            let lease = crate::row::millis(item.lease.duration());
            sql.push('(');
            hex_literal(&mut sql, ns(&item.key));
            sql.push(',');
            hex_literal(&mut sql, item.key.bytes());
            sql.push_str(", 1, @idem_now * 1024, ");
            match item.fingerprint {
                Some(fp) => hex_literal(&mut sql, &fp.to_bytes()),
                None => sql.push_str("NULL"),
            }
            let _ = write!(
                sql,
                ", 1, @idem_now, @idem_now + {lease}, NULL, 0, @idem_now + {}, {stamp})",
                lease.saturating_add(abandoned_ms)
            );
        }
        // Assignments run left to right: `claim` is decided first from the
        // row as found, and every later one asks whether it was taken.
        let taken = "claim = VALUES(claim)";
        let _ = write!(
            sql,
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
              state = IF({taken}, 1, state);
            SELECT ns, k, claim = {stamp} AS mine, @idem_now AS now, {ROW} FROM {table} WHERE "
        );
        key_list(&mut sql, items.iter().map(|i| &i.key));
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
        let table = &self.tables[usize::from(shard)];
        let size: usize = items
            .iter()
            .map(|i| 160 + 2 * i.outcome.as_ref().map_or(0, |o| o.len()))
            .sum();
        let mut sql = String::with_capacity(600 + size);
        let _ = write!(
            sql,
            "SET @idem_now = {NOW};
            UPDATE {table} r JOIN ("
        );
        for (i, item) in items.iter().enumerate() {
            sql.push_str(if i == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            });
            hex_literal(&mut sql, ns(&item.key));
            sql.push_str(" AS ns, ");
            hex_literal(&mut sql, item.key.bytes());
            let _ = write!(sql, " AS k, {} AS token, ", token_column(item.token));
            match &item.outcome {
                Some(o) => hex_literal(&mut sql, o),
                None => sql.push_str("NULL"),
            }
            let _ = write!(
                sql,
                " AS outcome, {} AS retention",
                crate::row::millis(item.retention)
            );
        }
        // Multiple-table updates assign in no set order: no assignment
        // reads a column another one writes.
        sql.push_str(
            ") i ON r.ns = i.ns AND r.k = i.k AND r.token = i.token
            SET r.outcome = i.outcome, r.completed_at = @idem_now,
                r.expires_at = @idem_now + i.retention, r.lease_until = 0, r.state = 2
            WHERE r.state = 1 AND r.lease_until > @idem_now",
        );
        // The read that follows runs on the same connection, for its
        // session's clock.
        let mut conn = self.pool.acquire().await.map_err(crate::error::store)?;
        let mut taken = 0;
        {
            let mut results = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(&mut *conn);
            while let Some(step) = results.try_next().await.map_err(crate::error::store)? {
                if let Either::Left(done) = step {
                    taken = done.rows_affected();
                }
            }
        }
        // Every item took its row: the common case needs no read.
        if usize::try_from(taken).is_ok_and(|n| n == items.len()) {
            return Ok(vec![Fenced::Ok(()); items.len()]);
        }
        let mut sql = String::with_capacity(100 + items.len() * 80);
        let _ = write!(
            sql,
            "SELECT ns, k, token, state, expires_at, @idem_now AS now FROM {table} WHERE "
        );
        key_list(&mut sql, items.iter().map(|i| &i.key));
        let rows = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
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

    pub async fn release(
        &self,
        shard: u16,
        key: &Key,
        held: FencingToken,
        tombstone_ms: i64,
    ) -> Result<Fenced, StoreError> {
        let done = sqlx::query(AssertSqlSafe(&*self.release[usize::from(shard)]))
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

    pub async fn extend(
        &self,
        shard: u16,
        key: &Key,
        held: FencingToken,
        lease: Lease,
        abandoned_ms: i64,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        let table = &self.tables[usize::from(shard)];
        let lease = crate::row::millis(lease.duration());
        let mut sql = format!(
            "SET @idem_now = {NOW};
            UPDATE {table} SET lease_until = @idem_now + {lease}, expires_at = @idem_now + {}
            WHERE token = {} AND state = 1 AND lease_until > @idem_now AND ",
            lease.saturating_add(abandoned_ms),
            token_column(held),
        );
        key_list(&mut sql, std::iter::once(key));
        sql.push_str("; SELECT @idem_now + ");
        let _ = write!(sql, "{lease} AS until");
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
