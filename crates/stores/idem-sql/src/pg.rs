//! The record statements on PostgreSQL.
//!
//! Each operation is one statement, run in autocommit (on MySQL it takes
//! more; see `mysql.rs`): `begin` is an
//! `INSERT … ON CONFLICT DO UPDATE … WHERE` that takes an absent, released
//! or lapsed key and leaves a live one alone, and reads back what it found
//! in the same statement. Batches pass their items as arrays (`unnest`), so
//! a batch is one statement too. The clock is the server's
//! (`clock_timestamp()`, in milliseconds), read once per statement.

use idem_core::tier::ImportItem;
use idem_core::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Key, Lease, Record, ScanQuery,
    StoreError, Timestamp,
};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{AssertSqlSafe, Row};

use crate::migrate::tokens_table;
use crate::row::{ScanFilter, StoredRow, import_token, millis_column, ms, token_column};
use crate::store::Forget;
use crate::table::{TableName, Tables};

/// The server's clock in milliseconds, read once per statement.
const NOW: &str = "c AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now)";

/// The columns a [`StoredRow`] is read from, prefixed by `r.`.
const ROW: &str = "r.state, r.token, r.fp, r.attempts, r.started_at, r.lease_until, r.outcome, r.completed_at, r.expires_at";

/// The statements of one table, written once when the store opens.
pub(crate) struct TableSql {
    pub(crate) begin: String,
    pub(crate) complete: String,
    pub(crate) release: String,
    pub(crate) reopen: String,
    pub(crate) extend: String,
    pub(crate) get: String,
    pub(crate) scan: String,
    pub(crate) sweep: String,
    pub(crate) import: String,
    pub(crate) namespaces: String,
    pub(crate) completed_page: String,
}

impl TableSql {
    fn new(table: TableName<'_>, tokens: &str) -> Self {
        let t = format!("\"{table}\"");
        Self {
            begin: format!(
                "WITH {NOW},
                i AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::int8[])
                      WITH ORDINALITY AS u(ns, k, fp, lease, n)),
                a AS (
                  INSERT INTO {t} AS r (ns, k, state, token, fp, attempts, started_at, lease_until,
                                        outcome, completed_at, expires_at)
                  SELECT i.ns, i.k, 1, c.now * 1024, i.fp, 1, c.now, c.now + i.lease,
                         NULL, 0, c.now + i.lease + $5
                  FROM i CROSS JOIN c ORDER BY i.ns, i.k
                  ON CONFLICT (ns, k) DO UPDATE SET
                    token = GREATEST(r.token + 1, EXCLUDED.token),
                    fp = EXCLUDED.fp,
                    attempts = CASE WHEN r.state = 1 AND r.expires_at > EXCLUDED.started_at
                                    THEN r.attempts + 1 ELSE 1 END,
                    started_at = EXCLUDED.started_at,
                    lease_until = EXCLUDED.lease_until,
                    outcome = NULL,
                    completed_at = 0,
                    expires_at = EXCLUDED.expires_at,
                    state = 1
                  WHERE r.state = 0
                     OR r.expires_at <= EXCLUDED.started_at
                     OR (r.state = 1 AND r.lease_until <= EXCLUDED.started_at)
                  RETURNING r.ns, r.k, r.token, r.attempts, r.lease_until
                )
                SELECT i.n, c.now, TRUE AS taken, 1::int2 AS state, a.token, NULL::bytea AS fp,
                       a.attempts, 0::int8 AS started_at, a.lease_until, NULL::bytea AS outcome,
                       0::int8 AS completed_at, 0::int8 AS expires_at
                FROM i JOIN a ON a.ns = i.ns AND a.k = i.k CROSS JOIN c
                UNION ALL
                SELECT i.n, c.now, FALSE, {ROW}
                FROM i JOIN {t} r ON r.ns = i.ns AND r.k = i.k CROSS JOIN c
                WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.ns = i.ns AND a.k = i.k)"
            ),
            // A retry by the completing token matches the completed row and
            // writes back what it holds, so it answers `Ok` and changes
            // nothing; `UPDATE` re-reads a row another statement just
            // changed, so that retry sees a completion still committing.
            // `LIMIT $6` (the number of items, so it drops none) makes the
            // planner expect a row or so from the arrays rather than ten:
            // planned on a table just created, which it takes for ten
            // pages, ten items made one pass over the table cheaper than
            // ten probes of the primary key, and the session kept that
            // plan, a sequential scan per call, as the table grew.
            complete: format!(
                "WITH {NOW},
                i AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bytea[], $5::int8[])
                      WITH ORDINALITY AS u(ns, k, token, outcome, retention, n) LIMIT $6)
                UPDATE {t} AS r SET
                  outcome = CASE WHEN r.state = 1 THEN i.outcome ELSE r.outcome END,
                  completed_at = CASE WHEN r.state = 1 THEN c.now ELSE r.completed_at END,
                  expires_at = CASE WHEN r.state = 1 THEN c.now + i.retention ELSE r.expires_at END,
                  lease_until = 0,
                  state = 2
                FROM i CROSS JOIN c
                WHERE r.ns = i.ns AND r.k = i.k AND r.token = i.token
                  AND ((r.state = 1 AND r.lease_until > c.now) OR (r.state = 2 AND r.expires_at > c.now))
                RETURNING i.n"
            ),
            release: format!(
                "WITH {NOW}
                UPDATE {t} AS r SET state = 0, fp = NULL, outcome = NULL, attempts = 0,
                  lease_until = 0, expires_at = c.now + $4
                FROM c
                WHERE r.ns = $1 AND r.k = $2 AND r.token = $3 AND r.state = 1 AND r.lease_until > c.now"
            ),
            reopen: format!(
                "WITH {NOW}
                UPDATE {t} AS r SET state = 0, fp = NULL, outcome = NULL, attempts = 0,
                  lease_until = 0, expires_at = c.now + $4
                FROM c
                WHERE r.ns = $1 AND r.k = $2 AND r.token = $3 AND r.state = 2 AND r.expires_at > c.now"
            ),
            extend: format!(
                "WITH {NOW}
                UPDATE {t} AS r SET lease_until = c.now + $4, expires_at = c.now + $4 + $5
                FROM c
                WHERE r.ns = $1 AND r.k = $2 AND r.token = $3 AND r.state = 1 AND r.lease_until > c.now
                RETURNING r.lease_until"
            ),
            get: format!(
                "WITH {NOW} SELECT c.now, {ROW} FROM c JOIN {t} r ON r.ns = $1 AND r.k = $2"
            ),
            scan: format!(
                "WITH {NOW}
                SELECT c.now, r.k, {ROW} FROM {t} r CROSS JOIN c
                WHERE r.ns = $1 AND r.k > $2
                  AND (r.state = 1 OR (r.state = 2 AND r.expires_at > c.now))
                  AND ($3::int2 IS NULL OR r.state = $3)
                  AND ($4::int8 IS NULL
                       OR (CASE WHEN r.state = 1 THEN r.started_at ELSE r.completed_at END) < $4)
                ORDER BY r.k LIMIT $5"
            ),
            // Locks only rows nobody else holds, after checking they are
            // still expired (a row changed since the snapshot is checked
            // again as it is locked), then deletes exactly those by their
            // physical address: no second pass over the expired rows, which
            // made each batch cost as much as the whole backlog. The
            // addresses are probed one by one: `LIMIT $1` (the batch, so it
            // drops none) has the planner expect about one, where it
            // expected ten for `ctid = ANY(…)` and, on a table just created
            // (ten pages to it), chose to read the whole table instead, a
            // plan the session then kept as the table grew.
            sweep: format!(
                "WITH {NOW}
                DELETE FROM {t} USING (SELECT tid FROM unnest(ARRAY(
                  SELECT r.ctid FROM {t} r WHERE r.expires_at <= (SELECT now FROM c)
                  ORDER BY r.expires_at LIMIT $1 FOR UPDATE OF r SKIP LOCKED)) AS d(tid)
                  LIMIT $1) AS d
                WHERE {t}.ctid = d.tid"
            ),
            // Writes each record unless the key holds a live completed
            // one, and raises the table's high-water mark to the largest
            // token written, in the same statement (so the same
            // transaction). Answers the items written.
            import: format!(
                "WITH {NOW},
                i AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bytea[],
                                           $5::bytea[], $6::int8[], $7::int8[])
                      WITH ORDINALITY AS u(ns, k, token, fp, outcome, completed_at, expires_at, n)),
                w AS (
                  INSERT INTO {t} AS r (ns, k, state, token, fp, attempts, started_at, lease_until,
                                        outcome, completed_at, expires_at)
                  SELECT i.ns, i.k, 2, i.token, i.fp, 1, i.completed_at, 0,
                         i.outcome, i.completed_at, i.expires_at
                  FROM i CROSS JOIN c WHERE i.expires_at > c.now ORDER BY i.ns, i.k
                  ON CONFLICT (ns, k) DO UPDATE SET
                    state = 2,
                    token = EXCLUDED.token,
                    fp = EXCLUDED.fp,
                    attempts = 1,
                    started_at = EXCLUDED.started_at,
                    lease_until = 0,
                    outcome = EXCLUDED.outcome,
                    completed_at = EXCLUDED.completed_at,
                    expires_at = EXCLUDED.expires_at
                  WHERE r.state <> 2 OR r.expires_at <= (SELECT now FROM c)
                  RETURNING r.ns, r.k, r.token
                ),
                h AS (
                  UPDATE \"{tokens}\" AS h SET high_water = m.token
                  FROM (SELECT max(token) AS token FROM w) AS m
                  WHERE h.record_table = $8 AND m.token > h.high_water
                )
                SELECT i.n FROM i JOIN w ON w.ns = i.ns AND w.k = i.k"
            ),
            // The table's namespaces, one probe of the primary key each
            // (PostgreSQL has no skip scan of its own).
            namespaces: format!(
                "WITH RECURSIVE n AS (
                  (SELECT ns FROM {t} ORDER BY ns LIMIT 1)
                  UNION ALL
                  SELECT (SELECT r.ns FROM {t} r WHERE r.ns > n.ns ORDER BY r.ns LIMIT 1)
                  FROM n WHERE n.ns IS NOT NULL
                )
                SELECT ns FROM n WHERE ns IS NOT NULL"
            ),
            // Walks the primary key and says which rows are live completed
            // records, rather than filtering them in the statement: with
            // the filter, a table not yet analysed is estimated to hold
            // few such rows, and the plan reads every row of the namespace
            // through a bitmap and sorts them, however small the page.
            completed_page: format!(
                "WITH {NOW}
                SELECT r.k, (r.state = 2 AND r.expires_at > c.now) AS live
                FROM (SELECT k, state, expires_at FROM {t}
                      WHERE ns = $1 AND k > $2 ORDER BY k LIMIT $3) AS r
                CROSS JOIN c"
            ),
        }
    }
}

/// The PostgreSQL side of a store: its pool and its statements.
pub(crate) struct Postgres {
    pub pool: PgPool,
    pub(crate) sql: Vec<TableSql>,
    /// The server's clock in milliseconds.
    pub(crate) clock: String,
    /// Raises a table's token high-water mark: `$1` token, `$2` table.
    pub(crate) raise_high_water: String,
    /// The largest high-water mark of the store's tables, and the clock.
    pub(crate) high_water: String,
}

fn ns(key: &Key) -> &[u8] {
    key.namespace().as_str().as_bytes()
}

impl Postgres {
    pub fn new(pool: PgPool, tables: &Tables) -> Self {
        let tokens = tokens_table(tables);
        Self {
            pool,
            sql: tables.all().map(|t| TableSql::new(t, &tokens)).collect(),
            clock: format!("WITH {NOW} SELECT now FROM c"),
            raise_high_water: format!(
                "UPDATE \"{tokens}\" SET high_water = GREATEST(high_water, $1)
                 WHERE record_table = $2"
            ),
            high_water: format!(
                "WITH {NOW} SELECT c.now, (SELECT max(high_water) FROM \"{tokens}\") AS high_water FROM c"
            ),
        }
    }

    /// `begin` for items of one shard, no key twice. An answer is `None`
    /// when the item's row changed under the statement: try it again.
    pub async fn begin(
        &self,
        shard: u16,
        items: &[&BeginItem],
        abandoned_ms: i64,
    ) -> Result<Vec<Option<Begin>>, StoreError> {
        let mut nss = Vec::with_capacity(items.len());
        let mut ks = Vec::with_capacity(items.len());
        let mut fps = Vec::with_capacity(items.len());
        let mut leases = Vec::with_capacity(items.len());
        for item in items {
            nss.push(ns(&item.key));
            ks.push(&item.key.bytes()[..]);
            fps.push(item.fingerprint.map(|f| f.to_bytes().to_vec()));
            leases.push(crate::row::millis(item.lease.duration()));
        }
        let rows = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].begin))
            .bind(nss)
            .bind(ks)
            .bind(fps)
            .bind(leases)
            .bind(abandoned_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let mut answers: Vec<Option<Begin>> = vec![None; items.len()];
        for row in rows {
            let n: i64 = row.try_get("n").map_err(crate::error::store)?;
            let i = usize::try_from(n - 1).unwrap_or(usize::MAX);
            let Some(item) = items.get(i) else {
                return Err(StoreError::Corrupt(format!(
                    "the begin statement answered item {n}"
                )));
            };
            let now: i64 = row.try_get("now").map_err(crate::error::store)?;
            let taken: bool = row.try_get("taken").map_err(crate::error::store)?;
            let stored = stored_row(&row)?;
            answers[i] = if taken {
                Some(stored.claim())
            } else {
                stored.answer_begin(item.fingerprint, now)?
            };
        }
        Ok(answers)
    }

    /// `complete` for items of one shard, no key twice.
    pub async fn complete(
        &self,
        shard: u16,
        items: &[&CompleteItem],
    ) -> Result<Vec<Fenced>, StoreError> {
        let mut nss = Vec::with_capacity(items.len());
        let mut ks = Vec::with_capacity(items.len());
        let mut tokens = Vec::with_capacity(items.len());
        let mut outcomes = Vec::with_capacity(items.len());
        let mut retentions = Vec::with_capacity(items.len());
        for item in items {
            nss.push(ns(&item.key));
            ks.push(&item.key.bytes()[..]);
            tokens.push(token_column(item.token));
            outcomes.push(item.outcome.as_deref());
            retentions.push(crate::row::millis(item.retention));
        }
        let rows = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].complete))
            .bind(nss)
            .bind(ks)
            .bind(tokens)
            .bind(outcomes)
            .bind(retentions)
            .bind(items.len() as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let mut answers = vec![Fenced::Stale; items.len()];
        for row in rows {
            let n: i64 = row.try_get(0).map_err(crate::error::store)?;
            if let Some(a) = answers.get_mut(usize::try_from(n - 1).unwrap_or(usize::MAX)) {
                *a = Fenced::Ok(());
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
        let sql = &self.sql[usize::from(shard)];
        let statement = match what {
            Forget::Claim => &sql.release,
            Forget::Completion => &sql.reopen,
        };
        let done = sqlx::query(AssertSqlSafe(&**statement))
            .bind(ns(key))
            .bind(&key.bytes()[..])
            .bind(token_column(held))
            .bind(tombstone_ms)
            .execute(&self.pool)
            .await
            .map_err(crate::error::store)?;
        Ok(if done.rows_affected() == 1 {
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
        let row = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].extend))
            .bind(ns(key))
            .bind(&key.bytes()[..])
            .bind(token_column(held))
            .bind(crate::row::millis(lease.duration()))
            .bind(abandoned_ms)
            .fetch_optional(&self.pool)
            .await
            .map_err(crate::error::store)?;
        match row {
            Some(row) => Ok(Fenced::Ok(ms(row
                .try_get(0)
                .map_err(crate::error::store)?))),
            None => Ok(Fenced::Stale),
        }
    }

    pub async fn get(&self, shard: u16, key: &Key) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].get))
            .bind(ns(key))
            .bind(&key.bytes()[..])
            .fetch_optional(&self.pool)
            .await
            .map_err(crate::error::store)?;
        match row {
            Some(row) => {
                let now: i64 = row.try_get("now").map_err(crate::error::store)?;
                stored_row(&row)?.record(now)
            }
            None => Ok(None),
        }
    }

    /// One shard's part of a scan, in key order.
    pub async fn scan(&self, shard: u16, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let filter = ScanFilter::of(query);
        let rows = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].scan))
            .bind(query.namespace.as_str().as_bytes())
            .bind(query.after.as_deref().unwrap_or(&[]))
            .bind(filter.state)
            .bind(filter.older_than)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let (now, k): (i64, Vec<u8>) = (
                row.try_get("now").map_err(crate::error::store)?,
                row.try_get("k").map_err(crate::error::store)?,
            );
            out.extend(stored_row(&row)?.entry(&query.namespace, k, now)?);
        }
        Ok(out)
    }

    /// Deletes up to `batch` expired rows of one shard; returns how many.
    pub async fn sweep(&self, shard: u16, batch: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].sweep))
            .bind(batch)
            .execute(&self.pool)
            .await
            .map_err(crate::error::store)?;
        Ok(done.rows_affected())
    }
}

/// The tier statements (docs/contract.md §2, "Tiers").
impl Postgres {
    /// `import_many` for items of one shard, no key twice, in one
    /// statement: whether each item was written.
    pub async fn import(
        &self,
        shard: u16,
        items: &[&ImportItem],
        record_table: &str,
    ) -> Result<Vec<bool>, StoreError> {
        let mut nss = Vec::with_capacity(items.len());
        let mut ks = Vec::with_capacity(items.len());
        let mut tokens = Vec::with_capacity(items.len());
        let mut fps = Vec::with_capacity(items.len());
        let mut outcomes = Vec::with_capacity(items.len());
        let mut completed = Vec::with_capacity(items.len());
        let mut expires = Vec::with_capacity(items.len());
        for item in items {
            let r = &item.record;
            nss.push(ns(&item.key));
            ks.push(&item.key.bytes()[..]);
            tokens.push(import_token(item)?);
            fps.push(r.fingerprint.map(|f| f.to_bytes().to_vec()));
            outcomes.push(r.outcome.as_deref());
            completed.push(millis_column(r.completed_at));
            expires.push(millis_column(r.expires_at));
        }
        let rows = sqlx::query(AssertSqlSafe(&*self.sql[usize::from(shard)].import))
            .bind(nss)
            .bind(ks)
            .bind(tokens)
            .bind(fps)
            .bind(outcomes)
            .bind(completed)
            .bind(expires)
            .bind(record_table)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)?;
        let mut written = vec![false; items.len()];
        for row in rows {
            let n: i64 = row.try_get(0).map_err(crate::error::store)?;
            if let Some(w) = written.get_mut(usize::try_from(n - 1).unwrap_or(usize::MAX)) {
                *w = true;
            }
        }
        Ok(written)
    }

    /// The namespaces of one shard's table.
    pub async fn namespaces(&self, shard: u16) -> Result<Vec<Vec<u8>>, StoreError> {
        sqlx::query_scalar(AssertSqlSafe(&*self.sql[usize::from(shard)].namespaces))
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)
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
        sqlx::query_as(AssertSqlSafe(&*self.sql[usize::from(shard)].completed_page))
            .bind(namespace)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(crate::error::store)
    }
}

fn stored_row(row: &PgRow) -> Result<StoredRow, StoreError> {
    let get = |e| crate::error::store(e);
    Ok(StoredRow {
        state: row.try_get("state").map_err(get)?,
        token: row.try_get("token").map_err(get)?,
        fingerprint: row.try_get("fp").map_err(get)?,
        attempts: row.try_get("attempts").map_err(get)?,
        started_at: row.try_get("started_at").map_err(get)?,
        lease_until: row.try_get("lease_until").map_err(get)?,
        outcome: row.try_get("outcome").map_err(get)?,
        completed_at: row.try_get("completed_at").map_err(get)?,
        expires_at: row.try_get("expires_at").map_err(get)?,
    })
}
