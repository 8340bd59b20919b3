//! The inbox: the keys of consumed messages, written in the caller's own
//! transaction (docs/contract.md §3–§4, "claim and business write in one
//! transaction").
//!
//! The guard keeps a record beside the business data, so a handler that
//! crashes between its effect and the guard's `complete` runs again. The
//! inbox closes that gap for effects that live in the same database: the
//! key is inserted by the transaction that makes the business write, so
//! both commit together or neither does.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Key;
#[cfg(feature = "mysql")]
use sqlx::mysql::MySqlConnection;
use sqlx::postgres::PgConnection;
use sqlx::{Acquire, AssertSqlSafe, Database};

use crate::{Dialect, MAX_KEY_BYTES, MAX_PREFIX_BYTES, Tables};

use self::sealed::{Conn, Sealed};

/// Rows one [`Inbox::sweep`] statement deletes at most, unless set with
/// [`Inbox::sweep_batch`].
pub const DEFAULT_SWEEP_BATCH: u32 = 1000;

/// The consumed-messages table ("local message table"): a message's key is
/// inserted by the transaction that makes its business write, so the write
/// and the record that the message was handled commit together or not at
/// all. A redelivery finds the key and is answered [`Claimed::Duplicate`].
///
/// One `Inbox` works on PostgreSQL and on MySQL/MariaDB: [`claim`](Inbox::claim)
/// takes the connection inside the caller's transaction, `&mut *tx` for a
/// `sqlx::Transaction<'_, Postgres>` or `<'_, MySql>`.
///
/// The table (`idem_inbox` by default) has the columns `namespace`, `key`
/// (`bytea` / `VARBINARY(1024)`) and `consumed_at` (the database's clock,
/// UTC), with the primary key `(namespace, key)`.
///
/// ```no_run
/// use idem_core::Key;
/// use idem_sql::{Claimed, Inbox};
///
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = Inbox::default();
/// inbox.install(&pool).await?; // once, or run Inbox::ddl in your migrations
///
/// let key = Key::new("orders", "message-42")?;
/// let mut tx = pool.begin().await?;
/// match inbox.claim(&mut *tx, &key).await? {
///     Claimed::New => {
///         sqlx::query("INSERT INTO shipments (order_id) VALUES ($1)")
///             .bind(42_i64)
///             .execute(&mut *tx)
///             .await?;
///         tx.commit().await?; // the shipment and the key, together
///     }
///     // Handled before: ack the message. Dropping `tx` rolls back nothing
///     // of note.
///     Claimed::Duplicate => {}
/// }
/// # Ok(()) }
/// ```
///
/// A claim holds the key's row locked until its transaction ends, and a
/// redelivery's claim waits on that lock: a holder that stops inside its
/// transaction (a paused VM, a process stopped, a handler stuck on a
/// remote call) holds up its message's redelivery for as long as its
/// session lives. Let the server end such sessions — PostgreSQL's
/// `idle_in_transaction_session_timeout`, MariaDB's
/// `idle_transaction_timeout`, set on the pool's connections to about the
/// guard's lease — and the stopped holder's commit fails when it wakes,
/// while the redelivery claims the key. `idem-chaos --runner inbox --fault
/// zombie` runs exactly that.
///
/// Rows are kept until [`sweep`](Inbox::sweep) deletes them: a duplicate
/// that arrives after its key was swept is no longer caught, so keep them
/// longer than the broker can redeliver.
#[derive(Clone, Debug)]
pub struct Inbox {
    table: Ident,
    sweep_batch: u32,
    postgres: Statements,
    #[cfg(feature = "mysql")]
    mysql: Statements,
}

#[derive(Clone, Debug)]
struct Statements {
    claim: Arc<str>,
    sweep: Arc<str>,
}

/// What [`Inbox::claim`] found.
#[must_use = "a duplicate must not run the business write again"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// First delivery: the key is recorded in the caller's transaction. Make
    /// the business write in the same transaction and commit both.
    New,
    /// The key was recorded by a committed transaction before: the message
    /// was handled, acknowledge it. The caller's transaction is still usable.
    Duplicate,
}

impl Default for Inbox {
    /// The inbox in the table `idem_inbox`.
    fn default() -> Self {
        Self::new("idem_inbox").expect("the default table name is valid")
    }
}

impl Inbox {
    /// The inbox in the table `table`: 1 to 40 characters of `a-z`, `0-9`
    /// and `_`, starting with a letter or `_` (the rule of [`Tables`]).
    pub fn new(table: &str) -> Result<Self, InvalidIdentifier> {
        let table = Ident::new("inbox table", table)?;
        let statements = |d: Dialect| {
            let t = table.quoted(d);
            let (claim, sweep) = match d {
                Dialect::Postgres => (
                    format!(
                        r#"INSERT INTO {t} ("namespace", "key", "consumed_at") VALUES ($1, $2, now()) ON CONFLICT DO NOTHING"#
                    ),
                    // By physical address, the oldest first through the index
                    // on consumed_at: no join back over the table.
                    format!(
                        r#"DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} WHERE "consumed_at" < now() - $1 * interval '1 microsecond' ORDER BY "consumed_at" LIMIT $2 FOR UPDATE SKIP LOCKED))"#
                    ),
                ),
                // No INSERT IGNORE: it would turn every error (a truncated
                // value, a bad column) into a warning. The duplicate key
                // error rolls back this statement only.
                Dialect::MySql => (
                    format!(
                        "INSERT INTO {t} (`namespace`, `key`, `consumed_at`) VALUES (?, ?, UTC_TIMESTAMP(6))"
                    ),
                    format!(
                        "DELETE FROM {t} WHERE `consumed_at` < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND ORDER BY `consumed_at` LIMIT ?"
                    ),
                ),
            };
            Statements {
                claim: claim.into(),
                sweep: sweep.into(),
            }
        };
        Ok(Self {
            postgres: statements(Dialect::Postgres),
            #[cfg(feature = "mysql")]
            mysql: statements(Dialect::MySql),
            table,
            sweep_batch: DEFAULT_SWEEP_BATCH,
        })
    }

    /// Most rows one sweep statement deletes (default
    /// [`DEFAULT_SWEEP_BATCH`], at least 1): smaller batches hold locks for
    /// less time.
    pub fn sweep_batch(mut self, rows: u32) -> Self {
        self.sweep_batch = rows.max(1);
        self
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        self.table.as_str()
    }

    /// The statements that create the table and its index, for `dialect`;
    /// each is idempotent (`IF NOT EXISTS`). [`install`](Inbox::install)
    /// runs them; a schema managed by migrations can run them instead.
    pub fn ddl(&self, dialect: Dialect) -> Vec<String> {
        let t = self.table.quoted(dialect);
        let index = Ident::derived(&self.table, "consumed_at").quoted(dialect);
        match dialect {
            Dialect::Postgres => vec![
                format!(
                    r#"CREATE TABLE IF NOT EXISTS {t} (
    "namespace" varchar(64) NOT NULL,
    "key" bytea NOT NULL,
    "consumed_at" timestamptz NOT NULL,
    PRIMARY KEY ("namespace", "key")
)"#
                ),
                format!(r#"CREATE INDEX IF NOT EXISTS {index} ON {t} ("consumed_at")"#),
            ],
            // Binary collation: namespaces and keys compare byte for byte,
            // as everywhere else in idem. InnoDB: the claim is transactional.
            Dialect::MySql => vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (
    `namespace` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key` VARBINARY({MAX_KEY_BYTES}) NOT NULL,
    `consumed_at` DATETIME(6) NOT NULL,
    PRIMARY KEY (`namespace`, `key`),
    KEY {index} (`consumed_at`)
) ENGINE=InnoDB"
            )],
        }
    }

    /// Creates the table and its index if they do not exist, on a pool
    /// (`&pool`), a connection or a transaction.
    ///
    /// Run it once when deploying: two processes creating the same
    /// PostgreSQL table at the same moment can make one of them fail.
    ///
    /// # Cancel safety
    ///
    /// Each statement is idempotent: a dropped call leaves the table
    /// created or not, and calling again finishes the work.
    pub async fn install<'a, A>(&self, db: A) -> Result<(), InboxError>
    where
        A: Acquire<'a>,
        <A::Database as Database>::Connection: SqlConnection,
    {
        let mut conn = db
            .acquire()
            .await
            .map_err(|e| self.failed("connecting", e))?;
        let conn: &mut <A::Database as Database>::Connection = &mut conn;
        for statement in self.ddl(conn.dialect()) {
            run_ddl(conn, statement)
                .await
                .map_err(|e| self.failed("creating the table", e))?;
        }
        Ok(())
    }

    /// Records `key` as consumed in the caller's transaction: pass
    /// `&mut *tx`. [`Claimed::New`] the first time; [`Claimed::Duplicate`]
    /// when a committed transaction recorded it before. Either way the
    /// transaction stays usable: a duplicate is an answer, not an error.
    ///
    /// When another transaction has recorded the key and not yet finished,
    /// the claim waits for it: `Duplicate` if it commits, `New` if it rolls
    /// back. Never a second `New` for one key.
    ///
    /// - PostgreSQL: `INSERT … ON CONFLICT DO NOTHING` and the rows it
    ///   inserted. Under `REPEATABLE READ` or `SERIALIZABLE` a key committed
    ///   after the transaction's snapshot is a serialization failure, an
    ///   [`InboxError::Database`] that [`is_transient`](InboxError::is_transient).
    /// - MySQL/MariaDB: a plain `INSERT`; its duplicate-key error (1062)
    ///   rolls back that statement only and is answered `Duplicate`. When the
    ///   first holder rolls back while several waited, InnoDB may pick one
    ///   waiter as a deadlock victim (1213, transient): its whole
    ///   transaction is rolled back, so retry the message.
    ///
    /// Every other failure is an error, never a `Duplicate`. On PostgreSQL a
    /// database error aborts the transaction: roll it back.
    ///
    /// # Errors
    ///
    /// [`InboxError::KeyTooLong`] before any SQL runs when the key is over
    /// [`MAX_KEY_BYTES`]; [`InboxError::MissingTable`] when the table
    /// was not installed; [`InboxError::Database`] otherwise.
    ///
    /// # Cancel safety
    ///
    /// The key is recorded only when the caller's transaction commits. A
    /// dropped claim leaves the transaction in an unknown state: drop the
    /// transaction too (it is rolled back, nothing is recorded), and the
    /// redelivery claims the key as new.
    pub async fn claim<C: SqlConnection>(
        &self,
        conn: &mut C,
        key: &Key,
    ) -> Result<Claimed, InboxError> {
        let len = key.bytes().len();
        if len > MAX_KEY_BYTES {
            return Err(InboxError::KeyTooLong {
                namespace: key.namespace().to_string(),
                len,
                max: MAX_KEY_BYTES,
            });
        }
        let namespace = key.namespace().as_str();
        let bytes: &[u8] = key.bytes();
        match conn.conn() {
            Conn::Postgres(c) => {
                let done = sqlx::query(AssertSqlSafe(self.postgres.claim.clone()))
                    .bind(namespace)
                    .bind(bytes)
                    .execute(c)
                    .await
                    .map_err(|e| self.failed("claiming a key", e))?;
                Ok(if done.rows_affected() == 1 {
                    Claimed::New
                } else {
                    Claimed::Duplicate
                })
            }
            #[cfg(feature = "mysql")]
            Conn::MySql(c) => {
                let done = sqlx::query(AssertSqlSafe(self.mysql.claim.clone()))
                    .bind(namespace)
                    .bind(bytes)
                    .execute(c)
                    .await;
                match done {
                    Ok(_) => Ok(Claimed::New),
                    // The table has one unique key, the primary key: a
                    // duplicate entry is this key, recorded before.
                    Err(e) if mysql_error_number(&e) == Some(ER_DUP_ENTRY) => {
                        Ok(Claimed::Duplicate)
                    }
                    Err(e) => Err(self.failed("claiming a key", e)),
                }
            }
        }
    }

    /// Deletes the keys consumed more than `older_than` ago (by the
    /// database's clock), in statements of at most
    /// [`sweep_batch`](Inbox::sweep_batch) rows, on a pool (`&pool`), a
    /// connection or a transaction; returns how many.
    ///
    /// A duplicate delivered after its key was swept is no longer caught
    /// and runs again: keep keys longer than the broker can redeliver (its
    /// retention, plus the longest retry delay and dead-letter replay).
    ///
    /// # Cancel safety
    ///
    /// Each batch commits on its own (outside a transaction): a dropped
    /// sweep has deleted some old keys, and the next sweep deletes the rest.
    pub async fn sweep<'a, A>(&self, db: A, older_than: Duration) -> Result<u64, InboxError>
    where
        A: Acquire<'a>,
        <A::Database as Database>::Connection: SqlConnection,
    {
        // Beyond a century nothing can be old enough; capping keeps the
        // interval arithmetic of both databases in range.
        let micros = older_than
            .min(Duration::from_secs(100 * 365 * 24 * 3600))
            .as_micros() as i64;
        let batch = i64::from(self.sweep_batch);
        let mut conn = db
            .acquire()
            .await
            .map_err(|e| self.failed("connecting", e))?;
        let conn: &mut <A::Database as Database>::Connection = &mut conn;
        let mut total = 0;
        loop {
            let deleted = match conn.conn() {
                Conn::Postgres(c) => sqlx::query(AssertSqlSafe(self.postgres.sweep.clone()))
                    .bind(micros)
                    .bind(batch)
                    .execute(c)
                    .await
                    .map(|r| r.rows_affected()),
                #[cfg(feature = "mysql")]
                Conn::MySql(c) => sqlx::query(AssertSqlSafe(self.mysql.sweep.clone()))
                    .bind(micros)
                    .bind(batch)
                    .execute(c)
                    .await
                    .map(|r| r.rows_affected()),
            }
            .map_err(|e| self.failed("sweeping old keys", e))?;
            total += deleted;
            if deleted < self.sweep_batch as u64 {
                return Ok(total);
            }
        }
    }

    fn failed(&self, action: &'static str, source: sqlx::Error) -> InboxError {
        match fault(&source) {
            Fault::MissingTable => InboxError::MissingTable {
                table: self.table.to_string(),
                source,
            },
            _ => InboxError::Database {
                action,
                table: self.table.to_string(),
                source,
            },
        }
    }
}

/// Why the inbox could not claim, install or sweep.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The key is longer than the `key` column; nothing ran.
    #[error(
        "a key in namespace {namespace} is {len} bytes; the inbox holds keys of up to {max} bytes (hash longer keys, e.g. with SHA-256, before claiming)"
    )]
    KeyTooLong {
        /// The key's namespace.
        namespace: String,
        /// Its length in bytes.
        len: usize,
        /// [`MAX_KEY_BYTES`].
        max: usize,
    },
    /// The table does not exist.
    #[error(
        "the inbox table {table} does not exist: create it with Inbox::install, or run the statements of Inbox::ddl in your migrations ({source})"
    )]
    MissingTable {
        /// The table's name.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// The database failed. On PostgreSQL the caller's transaction is
    /// aborted: roll it back, and retry when
    /// [`is_transient`](InboxError::is_transient).
    #[error("{action} in the inbox table {table} failed: {source}")]
    Database {
        /// What the inbox was doing.
        action: &'static str,
        /// The table's name.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
}

impl InboxError {
    /// Whether another try may succeed: the database was unreachable or
    /// busy, or chose this transaction as a deadlock or serialization
    /// victim. Retry the message with its whole transaction then; the other
    /// errors need a fix (a longer key column, the table installed).
    pub fn is_transient(&self) -> bool {
        match self {
            InboxError::Database { source, .. } => fault(source) == Fault::Transient,
            _ => false,
        }
    }
}

// What the inbox and the status transitions share: the connections they
// run on, identifiers, and what a database error means.

/// A connection the inbox and the status transitions run on:
/// `PgConnection` or `MySqlConnection`, which is what `&mut *tx` gives for a
/// `sqlx::Transaction`. Sealed: those are the databases whose behaviour
/// under concurrent transactions the tests prove.
pub trait SqlConnection: Sealed + Send {
    /// The connection's SQL dialect.
    fn dialect(&mut self) -> Dialect {
        match self.conn() {
            Conn::Postgres(_) => Dialect::Postgres,
            #[cfg(feature = "mysql")]
            Conn::MySql(_) => Dialect::MySql,
        }
    }
}

impl SqlConnection for PgConnection {}
#[cfg(feature = "mysql")]
impl SqlConnection for MySqlConnection {}

pub(crate) mod sealed {
    #[cfg(feature = "mysql")]
    use sqlx::mysql::MySqlConnection;
    use sqlx::postgres::PgConnection;

    /// The concrete connection behind a [`SqlConnection`](super::SqlConnection).
    pub enum Conn<'a> {
        Postgres(&'a mut PgConnection),
        #[cfg(feature = "mysql")]
        MySql(&'a mut MySqlConnection),
    }

    pub trait Sealed {
        fn conn(&mut self) -> Conn<'_>;
    }

    impl Sealed for PgConnection {
        fn conn(&mut self) -> Conn<'_> {
            Conn::Postgres(self)
        }
    }

    #[cfg(feature = "mysql")]
    impl Sealed for MySqlConnection {
        fn conn(&mut self) -> Conn<'_> {
            Conn::MySql(self)
        }
    }
}

/// Runs one DDL statement (simple protocol: nothing to prepare).
pub(crate) async fn run_ddl<C: SqlConnection>(
    conn: &mut C,
    statement: String,
) -> Result<(), sqlx::Error> {
    let sql = sqlx::raw_sql(AssertSqlSafe(statement));
    match conn.conn() {
        Conn::Postgres(c) => sql.execute(c).await.map(drop),
        #[cfg(feature = "mysql")]
        Conn::MySql(c) => sql.execute(c).await.map(drop),
    }
}

/// A table or column name the inbox or the status transitions refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {name:?} is not allowed: use 1 to {MAX_PREFIX_BYTES} characters of a-z, 0-9 and _, starting with a letter or _"
)]
pub struct InvalidIdentifier {
    what: &'static str,
    name: String,
}

/// A checked table or column name: only `a-z`, `0-9` and `_` (the rule of
/// [`Tables`]), so quoting it is enough to put it in SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ident(String);

impl Ident {
    pub(crate) fn new(what: &'static str, name: &str) -> Result<Self, InvalidIdentifier> {
        match Tables::new(name, 1) {
            Ok(tables) => Ok(Self(tables.prefix().to_owned())),
            Err(_) => Err(InvalidIdentifier {
                what,
                name: name.chars().take(80).collect(),
            }),
        }
    }

    /// `base_suffix`, for an index: at most 40 + 1 + the suffix characters,
    /// within both databases' identifier limits for the suffixes used here.
    pub(crate) fn derived(base: &Ident, suffix: &'static str) -> Self {
        Self(format!("{}_{suffix}", base.0))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for `dialect`: a name that is a reserved word
    /// (`order`, `key`) works too.
    pub(crate) fn quoted(&self, dialect: Dialect) -> String {
        match dialect {
            Dialect::Postgres => format!("\"{}\"", self.0),
            Dialect::MySql => format!("`{}`", self.0),
        }
    }
}

impl std::fmt::Display for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(feature = "mysql")]
/// MySQL's duplicate-key error.
const ER_DUP_ENTRY: u16 = 1062;
/// MySQL's lock wait timeout (its SQLSTATE, HY000, says nothing).
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

fn mysql_error_number(e: &sqlx::Error) -> Option<u16> {
    crate::error::mysql_number(e.as_database_error()?)
}

/// What a database error means for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The table does not exist.
    MissingTable,
    /// A column does not exist.
    MissingColumn,
    /// Another try may succeed.
    Transient,
    /// Anything else.
    Other,
}

pub(crate) fn fault(e: &sqlx::Error) -> Fault {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => Fault::Transient,
        sqlx::Error::Database(db) => {
            if mysql_error_number(e) == Some(ER_LOCK_WAIT_TIMEOUT) {
                return Fault::Transient;
            }
            let state = db.code().unwrap_or_default();
            match &*state {
                // PostgreSQL, MySQL.
                "42P01" | "42S02" => Fault::MissingTable,
                "42703" | "42S22" => Fault::MissingColumn,
                // Serialization failure / deadlock (both), PostgreSQL's
                // deadlock, lock not available, a session the server ended
                // for idling inside its transaction
                // (`idle_in_transaction_session_timeout`: the holder was
                // paused; a new transaction goes on), and connection,
                // resource and shutdown classes.
                "40001" | "40P01" | "55P03" | "25P03" => Fault::Transient,
                s if s.starts_with("08") || s.starts_with("53") || s.starts_with("57P") => {
                    Fault::Transient
                }
                _ => Fault::Other,
            }
        }
        _ => Fault::Other,
    }
}
