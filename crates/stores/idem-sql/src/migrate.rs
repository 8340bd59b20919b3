//! Versioned migrations of the record tables.
//!
//! The tables' names come from the store's prefix and shard count, so the
//! statements are written per store rather than kept as fixed files. The
//! versions applied are kept in `PREFIX_schema`, a table of idem's own, so
//! they never meet an application's migration history in the same
//! database. Migrations run under a database-wide lock (an advisory lock on
//! PostgreSQL, `GET_LOCK` on MySQL), so stores starting together apply each
//! version once.

use sqlx::{AssertSqlSafe, Connection, Executor, Row};

use crate::builder::OpenError;
use crate::table::Tables;

/// Which server a store talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    MySql,
}

/// One schema version: what it does, and its statements for a dialect.
struct Migration {
    version: i32,
    description: &'static str,
    statements: fn(Dialect, &Tables) -> Vec<String>,
}

/// Every version, in order. A released version is never edited: a change
/// is a new version.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "record tables, with an index on expiry for the sweeper",
        statements: record_tables,
    },
    Migration {
        version: 2,
        description: "token high-water marks, one row per record table",
        statements: high_water_table,
    },
    Migration {
        version: 3,
        description: "an index on completion time of completed records (PostgreSQL)",
        statements: completion_index,
    },
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 3;

/// What was completed since a time (`Tier::completed_since`, which catches
/// a key filter loaded from its snapshot up): a partial index of completed
/// rows on PostgreSQL, which claims never touch. MySQL has no partial
/// index, and one on every row would cost each claim a second index write:
/// there the rare catch-up scans the table on the server instead.
fn completion_index(dialect: Dialect, tables: &Tables) -> Vec<String> {
    match dialect {
        Dialect::Postgres => tables
            .all()
            .map(|t| {
                format!(
                    "CREATE INDEX IF NOT EXISTS \"{t}_completed\" ON \"{t}\" (completed_at)
                     WHERE state = 2"
                )
            })
            .collect(),
        Dialect::MySql => Vec::new(),
    }
}

/// The table of token high-water marks: `PREFIX_tokens`.
pub(crate) fn tokens_table(tables: &Tables) -> String {
    format!("{}_tokens", tables.prefix())
}

/// The largest token each record table has imported or been told to stay
/// above (`Tier::raise_token_floor`): tokens there otherwise follow the
/// clock, which the mark may run ahead of. One row per record table, so
/// imports into different tables never wait for each other's row lock.
fn high_water_table(dialect: Dialect, tables: &Tables) -> Vec<String> {
    let t = tokens_table(tables);
    let mut out = Vec::new();
    match dialect {
        Dialect::Postgres => {
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS \"{t}\" (
                  record_table text PRIMARY KEY,
                  high_water int8 NOT NULL)"
            ));
            for r in tables.all() {
                out.push(format!(
                    "INSERT INTO \"{t}\" (record_table, high_water) VALUES ('{r}', 0)
                     ON CONFLICT (record_table) DO NOTHING"
                ));
            }
        }
        Dialect::MySql => {
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS `{t}` (
                  record_table VARCHAR(64) NOT NULL PRIMARY KEY,
                  high_water BIGINT NOT NULL
                ) ENGINE=InnoDB"
            ));
            for r in tables.all() {
                out.push(format!(
                    "INSERT IGNORE INTO `{t}` (record_table, high_water) VALUES ('{r}', 0)"
                ));
            }
        }
    }
    out
}

fn record_tables(dialect: Dialect, tables: &Tables) -> Vec<String> {
    let mut out = Vec::new();
    for t in tables.all() {
        match dialect {
            Dialect::Postgres => {
                out.push(format!(
                    "CREATE TABLE IF NOT EXISTS \"{t}\" (
                      ns bytea NOT NULL,
                      k bytea NOT NULL,
                      state int2 NOT NULL,
                      token int8 NOT NULL,
                      fp bytea,
                      attempts int4 NOT NULL,
                      started_at int8 NOT NULL,
                      lease_until int8 NOT NULL,
                      outcome bytea,
                      completed_at int8 NOT NULL,
                      expires_at int8 NOT NULL,
                      PRIMARY KEY (ns, k))"
                ));
                out.push(format!(
                    "CREATE INDEX IF NOT EXISTS \"{t}_expires\" ON \"{t}\" (expires_at)"
                ));
            }
            Dialect::MySql => out.push(format!(
                "CREATE TABLE IF NOT EXISTS `{t}` (
                  ns VARBINARY(64) NOT NULL,
                  k VARBINARY({}) NOT NULL,
                  state TINYINT NOT NULL,
                  token BIGINT NOT NULL,
                  fp VARBINARY(16) NULL,
                  attempts INT NOT NULL,
                  started_at BIGINT NOT NULL,
                  lease_until BIGINT NOT NULL,
                  outcome LONGBLOB NULL,
                  completed_at BIGINT NOT NULL,
                  expires_at BIGINT NOT NULL,
                  claim BIGINT NOT NULL DEFAULT 0,
                  PRIMARY KEY (ns, k),
                  KEY `{t}_expires` (expires_at)
                ) ENGINE=InnoDB",
                crate::MAX_KEY_BYTES
            )),
        }
    }
    out
}

/// What `migrate` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// The versions applied now, in order (empty when the schema was
    /// already current).
    pub applied: Vec<i32>,
    /// The schema version now.
    pub version: i32,
}

/// The schema table's name.
fn schema_table(tables: &Tables) -> String {
    format!("{}_schema", tables.prefix())
}

/// Brings the tables of `tables` up to [`SCHEMA_VERSION`] on `conn`, or
/// with `apply` false only checks that they are.
pub(crate) async fn run_pg(
    conn: &mut sqlx::PgConnection,
    tables: &Tables,
    apply: bool,
) -> Result<Migrated, OpenError> {
    let schema = schema_table(tables);
    let mut tx = conn.begin().await.map_err(OpenError::database)?;
    // One lock per prefix: other prefixes migrate independently.
    let lock = i64::from_ne_bytes(
        xxhash_rust::xxh3::xxh3_64(format!("idem-migrate:{}", tables.prefix()).as_bytes())
            .to_ne_bytes(),
    );
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock)
        .execute(&mut *tx)
        .await
        .map_err(OpenError::database)?;
    let exists: bool = sqlx::query("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("\"{schema}\""))
        .fetch_one(&mut *tx)
        .await
        .map_err(OpenError::database)?
        .get(0);
    let applied = if exists {
        versions(
            sqlx::query(AssertSqlSafe(format!(
                "SELECT version, shards FROM \"{schema}\" ORDER BY version"
            )))
            .fetch_all(&mut *tx)
            .await
            .map_err(OpenError::database)?,
        )
    } else {
        Vec::new()
    };
    let plan = plan(&applied, tables, apply)?;
    if plan.is_empty() {
        return Ok(Migrated {
            applied: Vec::new(),
            version: current(&applied),
        });
    }
    tx.execute(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS \"{schema}\" (
          version int4 PRIMARY KEY,
          description text NOT NULL,
          shards int4 NOT NULL,
          applied_at timestamptz NOT NULL DEFAULT now())"
    )))
    .await
    .map_err(OpenError::database)?;
    for m in &plan {
        for statement in (m.statements)(Dialect::Postgres, tables) {
            tx.execute(AssertSqlSafe(statement))
                .await
                .map_err(OpenError::database)?;
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{schema}\" (version, description, shards) VALUES ($1, $2, $3)"
        )))
        .bind(m.version)
        .bind(m.description)
        .bind(i32::from(tables.shards()))
        .execute(&mut *tx)
        .await
        .map_err(OpenError::database)?;
    }
    tx.commit().await.map_err(OpenError::database)?;
    Ok(Migrated {
        applied: plan.iter().map(|m| m.version).collect(),
        version: SCHEMA_VERSION,
    })
}

/// As [`run_pg`], on MySQL or MariaDB, whose schema changes commit as they
/// go: each version's row is written after its statements, which are all
/// `IF NOT EXISTS`, so a migration cut short is finished by the next run.
#[cfg(feature = "mysql")]
pub(crate) async fn run_mysql(
    conn: &mut sqlx::MySqlConnection,
    tables: &Tables,
    apply: bool,
) -> Result<Migrated, OpenError> {
    let schema = schema_table(tables);
    let lock = format!("idem-migrate:{}", tables.prefix());
    let got: Option<i64> = sqlx::query("SELECT GET_LOCK(?, 60)")
        .bind(&lock)
        .fetch_one(&mut *conn)
        .await
        .map_err(OpenError::database)?
        .get(0);
    if got != Some(1) {
        return Err(OpenError::Migrate(format!(
            "another process held the migration lock {lock:?} for 60 s; try again when it is done"
        )));
    }
    let result = migrate_mysql_locked(conn, tables, &schema, apply).await;
    let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(&lock)
        .execute(&mut *conn)
        .await;
    result
}

#[cfg(feature = "mysql")]
async fn migrate_mysql_locked(
    conn: &mut sqlx::MySqlConnection,
    tables: &Tables,
    schema: &str,
    apply: bool,
) -> Result<Migrated, OpenError> {
    let exists: i64 = sqlx::query(
        "SELECT COUNT(*) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(schema)
    .fetch_one(&mut *conn)
    .await
    .map_err(OpenError::database)?
    .get(0);
    let applied = if exists > 0 {
        versions(
            sqlx::query(AssertSqlSafe(format!(
                "SELECT version, shards FROM `{schema}` ORDER BY version"
            )))
            .fetch_all(&mut *conn)
            .await
            .map_err(OpenError::database)?,
        )
    } else {
        Vec::new()
    };
    let plan = plan(&applied, tables, apply)?;
    if plan.is_empty() {
        return Ok(Migrated {
            applied: Vec::new(),
            version: current(&applied),
        });
    }
    conn.execute(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS `{schema}` (
          version INT NOT NULL PRIMARY KEY,
          description VARCHAR(200) NOT NULL,
          shards INT NOT NULL,
          applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ) ENGINE=InnoDB"
    )))
    .await
    .map_err(OpenError::database)?;
    for m in &plan {
        for statement in (m.statements)(Dialect::MySql, tables) {
            conn.execute(AssertSqlSafe(statement))
                .await
                .map_err(OpenError::database)?;
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{schema}` (version, description, shards) VALUES (?, ?, ?)"
        )))
        .bind(m.version)
        .bind(m.description)
        .bind(i32::from(tables.shards()))
        .execute(&mut *conn)
        .await
        .map_err(OpenError::database)?;
    }
    Ok(Migrated {
        applied: plan.iter().map(|m| m.version).collect(),
        version: SCHEMA_VERSION,
    })
}

/// `(version, shards)` of each applied version.
fn versions<R: Row>(rows: Vec<R>) -> Vec<(i32, i32)>
where
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    rows.iter()
        .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
        .collect()
}

fn current(applied: &[(i32, i32)]) -> i32 {
    applied.iter().map(|(v, _)| *v).max().unwrap_or(0)
}

/// The versions still to apply, after checking that what is there was made
/// for the same shard count and by a build that is not newer.
fn plan(
    applied: &[(i32, i32)],
    tables: &Tables,
    apply: bool,
) -> Result<Vec<&'static Migration>, OpenError> {
    let prefix = tables.prefix();
    if let Some((_, shards)) = applied
        .iter()
        .find(|(_, s)| *s != i32::from(tables.shards()))
    {
        return Err(OpenError::Migrate(format!(
            "the tables with prefix {prefix:?} were made with {shards} shard(s), and this store asks for {}; \
             open it with shards={shards} (a different count would look for keys in the wrong tables), \
             or choose another table prefix",
            tables.shards()
        )));
    }
    let version = current(applied);
    if version > SCHEMA_VERSION {
        return Err(OpenError::Migrate(format!(
            "the tables with prefix {prefix:?} are at schema version {version}, newer than this idem knows ({SCHEMA_VERSION}); upgrade idem"
        )));
    }
    let todo: Vec<&'static Migration> = MIGRATIONS
        .iter()
        .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
        .collect();
    if !todo.is_empty() && !apply {
        return Err(OpenError::Migrate(format!(
            "the tables with prefix {prefix:?} are at schema version {version}, and this idem needs {SCHEMA_VERSION}; \
             run `idem migrate --store URL`, or let the store migrate when it opens"
        )));
    }
    Ok(todo)
}
