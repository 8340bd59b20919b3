//! The operator's view of an SQL store (docs/contract.md §2, "Operations
//! for operators"): one aggregate over the primary key's namespace range
//! per table for `stats`, deletes in batches of the primary key's order for
//! `purge`, and the tables' own size for `size`. Every statement binds the
//! namespace; only validated table names are written into the text.

use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_core::admin::{Admin, Finding, NamespaceStats, Purge, Severity, StoreSize};
use idem_core::{Namespace, StoreError, Timestamp};
use sqlx::AssertSqlSafe;

use crate::SqlStore;
use crate::store::{Db, Inner, retrying};

/// Rows one purge statement deletes: small enough that a statement holds
/// its row locks briefly, large enough that a million rows take seconds.
const PURGE_BATCH: i64 = 5000;

/// One table's counts: live, abandoned, completed, expired, oldest start.
type Counts = (i64, i64, i64, i64, Option<i64>);

impl Admin for SqlStore {
    fn namespaces(&self) -> BoxFuture<'_, Result<Vec<Namespace>, StoreError>> {
        async move {
            let raw = self.records().namespaces().await?;
            let mut out: Vec<Namespace> = raw
                .iter()
                .filter_map(|n| std::str::from_utf8(n).ok())
                .filter_map(|n| Namespace::new(n).ok())
                .collect();
            out.sort();
            out.dedup();
            Ok(out)
        }
        .boxed()
    }

    fn stats<'a>(
        &'a self,
        namespace: &'a Namespace,
    ) -> BoxFuture<'a, Result<NamespaceStats, StoreError>> {
        counted(self, namespace, None).boxed()
    }

    /// Each count runs with a statement timeout of `within` on the server
    /// (PostgreSQL's `statement_timeout` for its transaction, MariaDB's
    /// `SET STATEMENT max_statement_time … FOR`, MySQL's
    /// `MAX_EXECUTION_TIME` hint), so a caller who stops waiting leaves no
    /// count running.
    fn stats_within<'a>(
        &'a self,
        namespace: &'a Namespace,
        within: Duration,
    ) -> BoxFuture<'a, Result<NamespaceStats, StoreError>> {
        counted(self, namespace, Some(within)).boxed()
    }

    fn size(&self) -> BoxFuture<'_, Result<Option<StoreSize>, StoreError>> {
        async move {
            let inner = self.records();
            let mut bytes = 0;
            for shard in 0..inner.tables.shards() {
                bytes += count(retrying(|| table_bytes(inner, shard)).await?);
            }
            let what = match inner.tables.shards() {
                1 => "the records table and its indexes".to_owned(),
                n => format!("the {n} records tables and their indexes"),
            };
            Ok(Some(StoreSize { bytes, what }))
        }
        .boxed()
    }

    fn findings(&self) -> BoxFuture<'_, Result<Vec<Finding>, StoreError>> {
        async move {
            let inner = self.records();
            let mut out = vec![Finding::new(
                Severity::Ok,
                "schema",
                format!(
                    "tables at schema version {}, as this idem needs",
                    crate::SCHEMA_VERSION
                ),
                None,
            )];
            match &inner.db {
                Db::Postgres(pg) => {
                    for (setting, risky, severity, why) in [
                        ("fsync", "off", Severity::Fail, "a crash of the server can corrupt or lose committed records"),
                        ("synchronous_commit", "off", Severity::Warn, "a crash of the server loses the completions of its last moments, and their work runs again"),
                    ] {
                        let value: String = sqlx::query_scalar(AssertSqlSafe(format!(
                            "SELECT current_setting('{setting}')"
                        )))
                        .fetch_one(&pg.pool)
                        .await
                        .map_err(crate::error::store)?;
                        out.push(if value == risky {
                            Finding::new(
                                severity,
                                setting,
                                format!("{setting} is {value}: {why}"),
                                Some(format!("ALTER SYSTEM SET {setting} = on; SELECT pg_reload_conf();")),
                            )
                        } else {
                            Finding::new(Severity::Ok, setting, format!("{setting} is {value}"), None)
                        });
                    }
                }
                #[cfg(feature = "mysql")]
                Db::MySql(my) => {
                    let flush: i64 = sqlx::query_scalar(
                        "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)",
                    )
                    .fetch_one(&my.pool)
                    .await
                    .map_err(crate::error::store)?;
                    out.push(if flush == 1 {
                        Finding::new(
                            Severity::Ok,
                            "durability",
                            "innodb_flush_log_at_trx_commit is 1",
                            None,
                        )
                    } else {
                        Finding::new(
                            Severity::Warn,
                            "durability",
                            format!("innodb_flush_log_at_trx_commit is {flush}: a crash loses the completions of about the last second, and their work runs again"),
                            Some("SET GLOBAL innodb_flush_log_at_trx_commit = 1 (and in the server's configuration)".into()),
                        )
                    });
                }
            }
            Ok(out)
        }
        .boxed()
    }

    fn purge<'a>(
        &'a self,
        namespace: &'a Namespace,
        what: Purge,
        progress: &'a (dyn Fn(u64) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        async move {
            let inner = self.records();
            let mut removed = 0;
            for shard in 0..inner.tables.shards() {
                loop {
                    let went = retrying(|| purge(inner, shard, namespace, what)).await?;
                    removed += went;
                    progress(removed);
                    if went < PURGE_BATCH as u64 {
                        break;
                    }
                }
            }
            Ok(removed)
        }
        .boxed()
    }
}

/// A namespace's records, counted table by table, each count given up by
/// the server after `within`.
async fn counted(
    store: &SqlStore,
    namespace: &Namespace,
    within: Option<Duration>,
) -> Result<NamespaceStats, StoreError> {
    let inner = store.records();
    let mut out = NamespaceStats::default();
    for shard in 0..inner.tables.shards() {
        let (live, abandoned, completed, expired, oldest) =
            retrying(|| stats(inner, shard, namespace, within)).await?;
        out.in_progress += count(live);
        out.abandoned += count(abandoned);
        out.completed += count(completed);
        out.expired += count(expired);
        if let Some(o) = oldest.map(|o| Timestamp::from_millis(count(o))) {
            out.oldest_in_progress = Some(out.oldest_in_progress.map_or(o, |p| p.min(o)));
        }
    }
    Ok(out)
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

async fn stats(
    inner: &Inner,
    shard: u16,
    namespace: &Namespace,
    within: Option<Duration>,
) -> Result<Counts, StoreError> {
    let t = inner.tables.name(shard);
    let ns = namespace.as_str().as_bytes();
    let row = match &inner.db {
        Db::Postgres(pg) => {
            let sql = format!(
                "WITH c AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now)
                SELECT count(*) FILTER (WHERE r.state = 1 AND r.lease_until > c.now) AS live,
                  count(*) FILTER (WHERE r.state = 1 AND r.lease_until <= c.now
                                   AND r.expires_at > c.now) AS abandoned,
                  count(*) FILTER (WHERE r.state = 2 AND r.expires_at > c.now) AS completed,
                  count(*) FILTER (WHERE r.state <> 0 AND r.expires_at <= c.now) AS expired,
                  min(r.started_at) FILTER (WHERE r.state = 1 AND r.expires_at > c.now) AS oldest
                FROM \"{t}\" r CROSS JOIN c WHERE r.ns = $1"
            );
            let query = sqlx::query_as::<_, Counts>(AssertSqlSafe(sql)).bind(ns);
            match within {
                None => query.fetch_one(&pg.pool).await,
                Some(within) => {
                    // The setting ends with the transaction, however it
                    // ends (a dropped transaction rolls back).
                    let mut tx = pg.pool.begin().await.map_err(crate::error::store)?;
                    sqlx::query("SELECT set_config('statement_timeout', $1, true)")
                        .bind(within.as_millis().max(1).to_string())
                        .execute(&mut *tx)
                        .await
                        .map_err(crate::error::store)?;
                    let row = query.fetch_one(&mut *tx).await;
                    tx.commit().await.map_err(crate::error::store)?;
                    row
                }
            }
        }
        #[cfg(feature = "mysql")]
        Db::MySql(my) => {
            let sum = |cond: &str| format!("CAST(COALESCE(SUM({cond}), 0) AS SIGNED)");
            let select = |hint: &str| {
                format!(
                    "SELECT {hint}{} AS live, {} AS abandoned, {} AS completed, {} AS expired,
                      MIN(CASE WHEN r.state = 1 AND r.expires_at > c.now THEN r.started_at END) AS oldest
                    FROM `{t}` r CROSS JOIN (SELECT {} AS now) c WHERE r.ns = ?",
                    sum("r.state = 1 AND r.lease_until > c.now"),
                    sum("r.state = 1 AND r.lease_until <= c.now AND r.expires_at > c.now"),
                    sum("r.state = 2 AND r.expires_at > c.now"),
                    sum("r.state <> 0 AND r.expires_at <= c.now"),
                    crate::mysql::NOW,
                )
            };
            let sql = match within {
                None => select(""),
                // Both bound the one statement, and no other.
                Some(within) if mariadb(&my.pool).await? => format!(
                    "SET STATEMENT max_statement_time = {:.3} FOR {}",
                    within.as_secs_f64().max(0.001),
                    select("")
                ),
                Some(within) => select(&format!(
                    "/*+ MAX_EXECUTION_TIME({}) */ ",
                    within.as_millis().max(1)
                )),
            };
            sqlx::query_as::<_, Counts>(AssertSqlSafe(sql))
                .bind(ns)
                .fetch_one(&my.pool)
                .await
        }
    };
    row.map_err(crate::error::store)
}

/// Whether the server is MariaDB (its statement timeout is
/// `max_statement_time`; MySQL's is the `MAX_EXECUTION_TIME` hint).
#[cfg(feature = "mysql")]
async fn mariadb(pool: &sqlx::MySqlPool) -> Result<bool, StoreError> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await
        .map_err(crate::error::store)?;
    Ok(version.to_ascii_lowercase().contains("mariadb"))
}

async fn table_bytes(inner: &Inner, shard: u16) -> Result<i64, StoreError> {
    let t = inner.tables.name(shard).to_string();
    match &inner.db {
        Db::Postgres(pg) => {
            sqlx::query_scalar("SELECT pg_total_relation_size(quote_ident($1)::regclass)::int8")
                .bind(t)
                .fetch_one(&pg.pool)
                .await
        }
        #[cfg(feature = "mysql")]
        Db::MySql(my) => {
            sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED)
                FROM information_schema.TABLES
                WHERE table_schema = DATABASE() AND table_name = ?",
            )
            .bind(t)
            .fetch_one(&my.pool)
            .await
        }
    }
    .map_err(crate::error::store)
}

/// Deletes up to [`PURGE_BATCH`] rows of one table (in key order, or the
/// earliest expired first):
/// every row of the namespace, or only those past their retention.
async fn purge(
    inner: &Inner,
    shard: u16,
    namespace: &Namespace,
    what: Purge,
) -> Result<u64, StoreError> {
    let t = inner.tables.name(shard);
    let ns = namespace.as_str().as_bytes();
    let done = match &inner.db {
        Db::Postgres(pg) => {
            // The rows by their physical address, as the sweep deletes
            // them (see `pg.rs`): no second pass over the namespace per
            // batch. Expired rows are found through the expiry index.
            let (filter, order) = match what {
                Purge::Expired => ("AND r.expires_at <= c.now", "r.expires_at"),
                Purge::All => ("", "r.k"),
            };
            let sql = format!(
                "WITH c AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now)
                DELETE FROM \"{t}\" USING (SELECT tid FROM unnest(ARRAY(
                  SELECT r.ctid FROM \"{t}\" r CROSS JOIN c WHERE r.ns = $1 {filter}
                  ORDER BY {order} LIMIT $2 FOR UPDATE OF r)) AS d(tid) LIMIT $2) AS d
                WHERE \"{t}\".ctid = d.tid"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(ns)
                .bind(PURGE_BATCH)
                .execute(&pg.pool)
                .await
                .map(|d| d.rows_affected())
        }
        #[cfg(feature = "mysql")]
        Db::MySql(my) => sqlx::query(AssertSqlSafe(mysql_purge(&t.to_string(), what)))
            .bind(ns)
            .bind(PURGE_BATCH)
            .execute(&my.pool)
            .await
            .map(|d| d.rows_affected()),
    };
    done.map_err(crate::error::store)
}

/// MySQL's and MariaDB's statement deleting a batch of table `t`'s rows of
/// a namespace (bound first, then the batch's size): every row in key
/// order, or those past their retention, earliest first, found through
/// the expiry index.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_purge(t: &str, what: Purge) -> String {
    let filter = match what {
        Purge::Expired => format!(
            "AND expires_at <= {} ORDER BY expires_at",
            crate::mysql::NOW
        ),
        Purge::All => "ORDER BY k".into(),
    };
    format!("DELETE FROM `{t}` WHERE ns = ? {filter} LIMIT ?")
}
