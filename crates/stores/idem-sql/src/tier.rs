//! The SQL store as a tier (docs/contract.md §2, "Tiers"), usually the
//! cold one: completed history, written in large batches.
//!
//! Tokens here are each key's last token plus one, at least the database's
//! time in milliseconds × 1024, so the clock is the store-wide floor: every
//! token issued after it passes a value exceeds that value. Imported
//! tokens and raised floors may run ahead of the clock; the largest of them
//! is kept per record table in `PREFIX_tokens`, raised in the same
//! transaction as the records that carry it.
//!
//! Keys are listed in [`Key::encode`] order, `[namespace length][namespace]
//! [key]`, which is not the tables' primary key order `(ns, k)` across
//! namespaces of different lengths (`b` sorts before `aa` encoded, after it
//! in the table). So `completed_keys` lists the namespaces (one probe of the
//! primary key each), orders them as encoded, and walks each in primary
//! key order, `ns = $1 AND k > $2 ORDER BY k LIMIT $3` (the keyset form of
//! `(ns, k) > ($1, $2)` within a namespace), the statement saying which rows
//! are live completed records: every read walks the primary key, and pages
//! come out in encoded order.

use std::cmp::Ordering;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem_core::tier::{CompletedKey, ImportItem, Imported, SoleFront, Tier};
use idem_core::{FencingToken, Key, Namespace, StoreError, Timestamp};
use sqlx::AssertSqlSafe;

use crate::error::FloorAheadOfClock;
#[cfg(feature = "mysql")]
use crate::mysql::IMPORT_BINDS;
use crate::row::{COMPLETED, token_in_range};
use crate::store::{Db, Inner, SqlStore, in_row_order, key_bytes, retrying, rounds, statements};

/// Tokens per millisecond of the database's clock.
const TOKENS_PER_MS: i64 = 1024;

/// How long `raise_token_floor` waits for the database's clock to pass a
/// floor.
const FLOOR_WAIT: Duration = Duration::from_secs(1);

/// Most bytes of values one PostgreSQL import statement carries: its
/// records travel as arrays, one statement for a whole batch of small
/// outcomes.
const PG_IMPORT_BYTES: usize = 16 << 20;

#[cfg(feature = "mysql")]
/// Most placeholders in one MySQL statement.
const MYSQL_PLACEHOLDERS: usize = 65_535;

/// The bytes one record takes in an import statement, beside its key and
/// outcome: the fingerprint, the other values and their framing.
const IMPORT_ROW_BYTES: usize = 96;

/// `$body` with `$side` bound to the store's PostgreSQL or MySQL side: for
/// a statement that reads the same on both, each with its own text.
macro_rules! on_either {
    ($db:expr, $side:ident => $body:expr) => {
        match $db {
            Db::Postgres($side) => $body,
            #[cfg(feature = "mysql")]
            Db::MySql($side) => $body,
        }
    };
}

impl Db {
    /// Most records, and bytes, per import statement.
    fn import_limits(&self) -> (usize, usize) {
        match self {
            Db::Postgres(_) => (usize::MAX, PG_IMPORT_BYTES),
            // One placeholder is the upsert's clock.
            #[cfg(feature = "mysql")]
            Db::MySql(my) => ((MYSQL_PLACEHOLDERS - 1) / IMPORT_BINDS, my.import_bytes),
        }
    }

    /// The server's clock, in milliseconds.
    async fn clock(&self) -> Result<i64, StoreError> {
        on_either!(self, side => sqlx::query_scalar(AssertSqlSafe(&*side.clock))
            .fetch_one(&side.pool)
            .await)
        .map_err(crate::error::store)
    }
}

/// Namespaces in encoded order: shorter first, then bytewise.
fn encoded_order(a: &[u8], b: &[u8]) -> Ordering {
    (a.len(), a).cmp(&(b.len(), b))
}

impl Inner {
    /// `import_many`, its items already checked against the limits: one
    /// statement per table and round (a key given twice goes in a later
    /// round, so the second answers as if it came after the first).
    async fn import_items(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        let mut answers = vec![Imported::Kept; items.len()];
        let (per_statement, budget) = self.db.import_limits();
        for round in rounds(items.iter().map(|i| &i.key)) {
            let mut by_shard: std::collections::HashMap<u16, Vec<usize>> = Default::default();
            for i in round {
                by_shard
                    .entry(self.shard(&items[i].key))
                    .or_default()
                    .push(i);
            }
            // Tables in parallel; one table's statements one after another,
            // since two transactions inserting next to each other in one
            // index wait for each other's gap locks.
            let tables = by_shard.into_iter().map(|(shard, mut idx)| async move {
                // Rows locked in one order by every statement cannot
                // deadlock each other.
                idx.sort_by(|&a, &b| in_row_order(&items[a].key, &items[b].key));
                let chunks = statements(&idx, per_statement, budget, |i| {
                    let item = &items[i];
                    key_bytes(&item.key)
                        + item.record.outcome.as_ref().map_or(0, |o| o.len())
                        + IMPORT_ROW_BYTES
                });
                let table = self.tables.name(shard).to_string();
                let mut done = Vec::with_capacity(chunks.len());
                for chunk in chunks {
                    let refs: Vec<&ImportItem> = chunk.iter().map(|&i| &items[i]).collect();
                    let written = retrying(|| async {
                        on_either!(&self.db, side => side.import(shard, &refs, &table).await)
                    })
                    .await?;
                    done.push((chunk, written));
                }
                Ok::<_, StoreError>(done)
            });
            let mut failed = None;
            for table in join_all(tables).await {
                match table {
                    Ok(done) => {
                        for (chunk, written) in done {
                            for (i, w) in chunk.into_iter().zip(written) {
                                if w {
                                    answers[i] = Imported::Written;
                                }
                            }
                        }
                    }
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(answers)
    }

    /// Waits (at most [`FLOOR_WAIT`]) for the database's clock to pass
    /// `floor`, then records it as the first table's high-water mark.
    async fn raise_token_floor(&self, floor: u64) -> Result<(), StoreError> {
        let started = Instant::now();
        loop {
            let now = retrying(|| self.db.clock()).await?;
            // Milliseconds until now × 1024 exceeds the floor.
            let ahead_ms = i64::try_from(floor)
                .map(|f| f / TOKENS_PER_MS + 1 - now)
                .unwrap_or(i64::MAX);
            if ahead_ms <= 0 {
                return self
                    .record_high_water(i64::try_from(floor).expect("below the clock"))
                    .await;
            }
            let wait = Duration::from_millis(ahead_ms.unsigned_abs());
            if started.elapsed() + wait > FLOOR_WAIT {
                return Err(StoreError::unavailable(FloorAheadOfClock {
                    floor,
                    clock_tokens: now.saturating_mul(TOKENS_PER_MS),
                    ahead_ms: ahead_ms.unsigned_abs(),
                    waited_ms: FLOOR_WAIT.as_millis() as u64,
                }));
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Raises the first table's high-water mark to `token`.
    async fn record_high_water(&self, token: i64) -> Result<(), StoreError> {
        let table = self.tables.name(0).to_string();
        retrying(|| async {
            on_either!(&self.db, side => sqlx::query(AssertSqlSafe(&*side.raise_high_water))
                .bind(token)
                .bind(&table)
                .execute(&side.pool)
                .await
                .map(drop))
            .map_err(crate::error::store)
        })
        .await
    }

    /// The largest high-water mark, or the clock's tokens, whichever is
    /// larger: every token issued so far is at most the clock's last
    /// millisecond × 1024 + 1023, unless it continued from an imported one.
    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        let (now, high_water): (i64, Option<i64>) = retrying(|| async {
            on_either!(&self.db, side => sqlx::query_as(AssertSqlSafe(&*side.high_water))
                .fetch_one(&side.pool)
                .await)
            .map_err(crate::error::store)
        })
        .await?;
        let clock = now
            .saturating_mul(TOKENS_PER_MS)
            .saturating_add(TOKENS_PER_MS - 1);
        let top = clock.max(high_water.unwrap_or(0));
        Ok(FencingToken::new(u64::try_from(top).unwrap_or(0)))
    }

    /// The latest retention end of a completed row, in any table.
    async fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        let mut latest = None;
        for table in self.tables.all() {
            let sql = match &self.db {
                Db::Postgres(_) => {
                    format!("SELECT MAX(expires_at) FROM \"{table}\" WHERE state = {COMPLETED}")
                }
                #[cfg(feature = "mysql")]
                Db::MySql(_) => {
                    format!("SELECT MAX(expires_at) FROM `{table}` WHERE state = {COMPLETED}")
                }
            };
            let (max,): (Option<i64>,) = retrying(|| async {
                on_either!(&self.db, side => sqlx::query_as(AssertSqlSafe(sql.as_str()))
                    .fetch_one(&side.pool)
                    .await)
                .map_err(crate::error::store)
            })
            .await?;
            latest = latest.max(max);
        }
        Ok(latest.map(|ms| Timestamp::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    /// Up to `limit` live completed records completed at or after `since`,
    /// after `after`: table by table, each in `(completed_at, ns, k)`
    /// order (on PostgreSQL the completion index, sorted on within equal
    /// times; on MySQL a scan on the server).
    async fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Vec<CompletedKey>, StoreError> {
        let mut out = Vec::new();
        let (first, mut from) = match after {
            Some(a) => (
                self.tables.shard_of(&a.key),
                (
                    millis(a.at),
                    a.key.namespace().as_str().as_bytes().to_vec(),
                    a.key.bytes().to_vec(),
                ),
            ),
            None => (0, (millis(since), Vec::new(), Vec::new())),
        };
        for shard in first..self.tables.shards() {
            if out.len() == limit {
                break;
            }
            if shard != first {
                from = (millis(since), Vec::new(), Vec::new());
            }
            let n = i64::try_from(limit - out.len()).unwrap_or(i64::MAX);
            let since = millis(since);
            let table = self.tables.name(shard);
            let sql = match &self.db {
                Db::Postgres(_) => format!(
                    "SELECT ns, k, completed_at FROM \"{table}\"
                     WHERE state = {COMPLETED} AND completed_at >= $1
                       AND (completed_at, ns, k) > ($2, $3, $4)
                       AND expires_at > floor(extract(epoch FROM clock_timestamp()) * 1000)::int8
                     ORDER BY completed_at, ns, k LIMIT $5"
                ),
                #[cfg(feature = "mysql")]
                Db::MySql(_) => format!(
                    "SELECT ns, k, completed_at FROM `{table}`
                     WHERE state = {COMPLETED} AND completed_at >= ?
                       AND (completed_at, ns, k) > (?, ?, ?)
                       AND expires_at > {}
                     ORDER BY completed_at, ns, k LIMIT ?",
                    crate::mysql::NOW
                ),
            };
            let rows: Vec<(Vec<u8>, Vec<u8>, i64)> = retrying(|| {
                let (sql, from) = (sql.as_str(), &from);
                async move {
                    on_either!(&self.db, side => sqlx::query_as(AssertSqlSafe(sql))
                        .bind(since)
                        .bind(from.0)
                        .bind(&from.1)
                        .bind(&from.2)
                        .bind(n)
                        .fetch_all(&side.pool)
                        .await)
                    .map_err(crate::error::store)
                }
            })
            .await?;
            for (ns, k, at) in rows {
                let key = std::str::from_utf8(&ns)
                    .ok()
                    .and_then(|n| Key::new(n, k).ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "a row's key in namespace {:?} is not one idem writes",
                            ns.escape_ascii().to_string()
                        ))
                    })?;
                out.push(CompletedKey {
                    at: Timestamp::from_millis(u64::try_from(at).unwrap_or(0)),
                    key,
                });
            }
        }
        Ok(out)
    }

    /// Every table's namespaces, in encoded order.
    pub(crate) async fn namespaces(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let lists = join_all((0..self.tables.shards()).map(|shard| {
            retrying(
                move || async move { on_either!(&self.db, side => side.namespaces(shard).await) },
            )
        }))
        .await;
        let mut all = Vec::new();
        for list in lists {
            all.extend(list?);
        }
        all.sort_by(|a, b| encoded_order(a, b));
        all.dedup();
        Ok(all)
    }

    /// Up to `limit` keys of live completed records of `namespace` after
    /// `after`, from every table, in key order. Each table is walked on
    /// its own until it has given `limit` such keys or has no more.
    async fn completed_in(
        &self,
        namespace: &[u8],
        after: &[u8],
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let tables = join_all((0..self.tables.shards()).map(|shard| async move {
            let mut live = Vec::new();
            let mut from = after.to_vec();
            loop {
                let page = retrying(|| async {
                    on_either!(&self.db, side => side.completed_page(shard, namespace, &from, n).await)
                })
                .await?;
                let last_page = page.len() < limit;
                for (k, is_live) in page {
                    if is_live {
                        live.push(k.clone());
                    }
                    from = k;
                }
                if last_page || live.len() >= limit {
                    return Ok::<_, StoreError>(live);
                }
            }
        }))
        .await;
        let mut keys = Vec::new();
        for live in tables {
            keys.extend(live?);
        }
        keys.sort();
        keys.truncate(limit);
        Ok(keys)
    }

    /// Keys of live completed records after `after`, in encoded order. The
    /// namespaces are listed only when the page reaches past `after`'s own.
    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        if let Some(after) = after {
            let ns = after.namespace();
            let keys = self
                .completed_in(ns.as_str().as_bytes(), after.bytes(), limit)
                .await?;
            push_keys(&mut out, ns, keys)?;
            if out.len() == limit {
                return Ok(out);
            }
        }
        let from_ns = after.map(|a| a.namespace().as_str().as_bytes());
        for ns in self.namespaces().await? {
            // The key cannot be empty, so every key of a later namespace is
            // after the empty one.
            if from_ns.is_some_and(|a| encoded_order(&ns, a) != Ordering::Greater) {
                continue;
            }
            let keys = self.completed_in(&ns, &[], limit - out.len()).await?;
            if keys.is_empty() {
                continue;
            }
            let namespace = std::str::from_utf8(&ns)
                .ok()
                .and_then(|n| Namespace::new(n).ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "a row's namespace {:?} is not one idem writes",
                        ns.escape_ascii().to_string()
                    ))
                })?;
            push_keys(&mut out, &namespace, keys)?;
            if out.len() == limit {
                break;
            }
        }
        Ok(out)
    }
}

/// Appends the keys `keys` of `namespace` to `out`.
fn push_keys(
    out: &mut Vec<Key>,
    namespace: &Namespace,
    keys: Vec<Vec<u8>>,
) -> Result<(), StoreError> {
    for k in keys {
        out.push(
            Key::in_namespace(namespace.clone(), k)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        );
    }
    Ok(())
}

/// The SQL store as a tier. Its tokens follow the database's clock, so
/// `raise_token_floor` waits up to a second for that clock to pass the
/// floor and fails beyond; `completed_keys` lists keys in encoded order,
/// namespace by namespace, each read walking the primary key.
impl Tier for SqlStore {
    async fn import_many(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        let inner = self.records();
        inner.limits.check_import_items(items)?;
        inner.import_items(items).await
    }

    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        self.records().raise_token_floor(floor.get()).await
    }

    /// Only stores the mark: raising the floor may wait for the clock.
    async fn record_high_water(&self, token: FencingToken) -> Result<(), StoreError> {
        let token = token_in_range(token, "the high-water mark to record")?;
        self.records().record_high_water(token).await
    }

    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        self.records().token_high_water().await
    }

    /// `MAX(expires_at)` of each table's completed rows: the expiry index,
    /// read from its end.
    async fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        self.records().latest_expiry().await
    }

    /// A session-level advisory lock on the store's tables, on a
    /// connection of its own held for the life of the answer.
    async fn hold_sole_front(&self) -> Result<SoleFront, StoreError> {
        self.records().hold_sole_front().await
    }

    async fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Option<Vec<CompletedKey>>, StoreError> {
        self.records()
            .completed_since(since, after, limit)
            .await
            .map(Some)
    }

    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.records().completed_keys(after, limit).await
    }
}

/// A timestamp as the tables keep it.
fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}
