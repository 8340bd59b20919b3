//! Guarded status transitions: a business row's status moves only along
//! declared edges, and each move happens once however often it is asked
//! for (docs/contract.md §4, "guarded state transitions").
//!
//! The move is a conditional `UPDATE … WHERE id = ? AND status = from` in
//! the caller's transaction: of any number of concurrent requests for one
//! move, the database lets exactly one match. The others learn that the
//! row is already where they wanted it, or where it went instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

#[cfg(feature = "mysql")]
use sqlx::MySql;
use sqlx::encode::Encode;
use sqlx::types::Type;
use sqlx::{Acquire, AssertSqlSafe, Database, Postgres, Row};

use crate::inbox::sealed::Conn;
use crate::inbox::{Fault, Ident, fault, run_ddl};
use crate::{Dialect, InvalidIdentifier, SqlConnection};

/// Longest entity id the transition log holds, in bytes of its text form
/// (`entity_id` is `VARCHAR(255)`).
pub const MAX_ENTITY_ID_BYTES: usize = 255;

/// Longest status name, in bytes (`from_status` and `to_status` of the log
/// are `VARCHAR(255)`).
pub const MAX_STATUS_BYTES: usize = 255;

/// The declared status graph: which status may follow which. Anything not
/// declared is illegal, refunds and cancellations included, until an edge
/// says otherwise.
///
/// ```
/// use idem_sql::Transitions;
///
/// let orders = Transitions::new()
///     .edge("unpaid", "paid")
///     .edge("paid", "shipped")
///     .edge("paid", "refunded");
/// assert!(orders.allows("paid", "refunded"));
/// assert!(!orders.allows("shipped", "refunded")); // not declared
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transitions {
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Transitions {
    /// A graph with no edges: every transition is illegal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares that `to` may follow `from`. Checked by
    /// [`bind`](Transitions::bind): the names must differ, and be 1 to
    /// [`MAX_STATUS_BYTES`] bytes.
    pub fn edge(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.edges.entry(from.into()).or_default().insert(to.into());
        self
    }

    /// Whether `to` may follow `from`.
    pub fn allows(&self, from: &str, to: &str) -> bool {
        self.edges.get(from).is_some_and(|tos| tos.contains(to))
    }

    /// The statuses that may follow `from`, in name order.
    pub fn after(&self, from: &str) -> impl Iterator<Item = &str> {
        self.edges
            .get(from)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// Binds the graph to a business table: `table`'s row is found by
    /// `id_column` (unique, usually the primary key), its status is the text
    /// in `status_column` (`text`/`varchar`, not null). The names follow the
    /// rule of [`Tables`](crate::Tables) and are quoted in SQL, so reserved
    /// words such as `order` work.
    pub fn bind(
        self,
        table: &str,
        id_column: &str,
        status_column: &str,
    ) -> Result<StatusColumn, InvalidTransitions> {
        for (from, tos) in &self.edges {
            for status in std::iter::once(from).chain(tos) {
                if status.is_empty() || status.len() > MAX_STATUS_BYTES {
                    return Err(InvalidTransitions::Status {
                        status: status.chars().take(80).collect(),
                        len: status.len(),
                    });
                }
            }
            if tos.contains(from) {
                return Err(InvalidTransitions::SelfLoop {
                    status: from.clone(),
                });
            }
        }
        let names = Names {
            table: Ident::new("business table", table)?,
            id_column: Ident::new("id column", id_column)?,
            status_column: Ident::new("status column", status_column)?,
            log: Ident::new("transition log table", "idem_transitions")?,
        };
        Ok(StatusColumn {
            transitions: self,
            postgres: Statements::new(&names, Dialect::Postgres),
            mysql: Statements::new(&names, Dialect::MySql),
            names,
        })
    }
}

/// A business table's status column, changed only along the declared
/// [`Transitions`], each change written to a log table (`idem_transitions`
/// by default) in the same transaction.
///
/// ```no_run
/// use idem_sql::{StatusChange, Transitions};
///
/// # async fn example(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// let orders = Transitions::new()
///     .edge("unpaid", "paid")
///     .edge("paid", "shipped")
///     .edge("paid", "refunded")
///     .bind("orders", "id", "status")?;
/// orders.install(&pool).await?; // the log table: once, or StatusColumn::ddl in migrations
///
/// let mut tx = pool.begin().await?;
/// match orders.transition(&mut *tx, 42_i64, "unpaid", "paid").await? {
///     StatusChange::Applied => {
///         // First time: book the payment in the same transaction.
///         tx.commit().await?;
///     }
///     StatusChange::AlreadyInTarget => {} // a duplicate: already paid
///     StatusChange::Conflict { current } => println!("order 42 is {current}"),
///     StatusChange::NotFound => println!("no order 42"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct StatusColumn {
    transitions: Transitions,
    names: Names,
    postgres: Arc<Statements>,
    mysql: Arc<Statements>,
}

/// The checked names the statements are written with.
#[derive(Clone, Debug)]
struct Names {
    table: Ident,
    id_column: Ident,
    status_column: Ident,
    log: Ident,
}

/// One dialect's statements, written once.
#[derive(Debug)]
struct Statements {
    update: Arc<str>,
    log: Arc<str>,
    read: Arc<str>,
}

impl Statements {
    fn new(names: &Names, d: Dialect) -> Arc<Self> {
        let (t, id, status, log) = (
            names.table.quoted(d),
            names.id_column.quoted(d),
            names.status_column.quoted(d),
            names.log.quoted(d),
        );
        let (update, insert, read) = match d {
            Dialect::Postgres => (
                format!("UPDATE {t} SET {status} = $1 WHERE {id} = $2 AND {status} = $3"),
                format!(
                    r#"INSERT INTO {log} ("table_name", "entity_id", "from_status", "to_status", "at") VALUES ($1, $2, $3, $4, now())"#
                ),
                format!("SELECT {status} FROM {t} WHERE {id} = $1 FOR SHARE"),
            ),
            Dialect::MySql => (
                format!("UPDATE {t} SET {status} = ? WHERE {id} = ? AND {status} = ?"),
                format!(
                    "INSERT INTO {log} (`table_name`, `entity_id`, `from_status`, `to_status`, `at`) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))"
                ),
                // A locking read sees the latest committed row; a plain
                // SELECT under REPEATABLE READ could see the transaction's
                // older snapshot.
                format!("SELECT {status} FROM {t} WHERE {id} = ? LOCK IN SHARE MODE"),
            ),
        };
        Arc::new(Self {
            update: update.into(),
            log: insert.into(),
            read: read.into(),
        })
    }
}

/// What [`StatusColumn::transition`] did.
#[must_use = "only `Applied` means this call made the change"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusChange {
    /// This call moved the row from `from` to `to` and logged it, in the
    /// caller's transaction: commit it with the rest of the work.
    Applied,
    /// The row already has status `to`: a duplicate of a move that was
    /// applied (or the row got there another way). Nothing was written.
    AlreadyInTarget,
    /// The row has another status: nothing was written.
    Conflict {
        /// The row's status now.
        current: String,
    },
    /// No row has this id: nothing was written.
    NotFound,
}

impl StatusColumn {
    /// Logs transitions to `table` instead of `idem_transitions`.
    pub fn log_table(mut self, table: &str) -> Result<Self, InvalidIdentifier> {
        self.names.log = Ident::new("transition log table", table)?;
        self.postgres = Statements::new(&self.names, Dialect::Postgres);
        self.mysql = Statements::new(&self.names, Dialect::MySql);
        Ok(self)
    }

    /// The declared graph.
    pub fn transitions(&self) -> &Transitions {
        &self.transitions
    }

    /// The business table's name.
    pub fn table(&self) -> &str {
        self.names.table.as_str()
    }

    /// The statements that create the log table and its index, for
    /// `dialect`; each is idempotent (`IF NOT EXISTS`). The business table
    /// is yours.
    pub fn ddl(&self, dialect: Dialect) -> Vec<String> {
        let log = self.names.log.quoted(dialect);
        let index = Ident::derived(&self.names.log, "entity").quoted(dialect);
        match dialect {
            Dialect::Postgres => vec![
                format!(
                    r#"CREATE TABLE IF NOT EXISTS {log} (
    "id" bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    "table_name" varchar(64) NOT NULL,
    "entity_id" varchar({MAX_ENTITY_ID_BYTES}) NOT NULL,
    "from_status" varchar({MAX_STATUS_BYTES}) NOT NULL,
    "to_status" varchar({MAX_STATUS_BYTES}) NOT NULL,
    "at" timestamptz NOT NULL
)"#
                ),
                format!(
                    r#"CREATE INDEX IF NOT EXISTS {index} ON {log} ("table_name", "entity_id", "id")"#
                ),
            ],
            Dialect::MySql => vec![format!(
                "CREATE TABLE IF NOT EXISTS {log} (
    `id` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    `table_name` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `entity_id` VARCHAR({MAX_ENTITY_ID_BYTES}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `from_status` VARCHAR({MAX_STATUS_BYTES}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `to_status` VARCHAR({MAX_STATUS_BYTES}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `at` DATETIME(6) NOT NULL,
    KEY {index} (`table_name`, `entity_id`, `id`)
) ENGINE=InnoDB"
            )],
        }
    }

    /// Creates the log table and its index if they do not exist, on a pool
    /// (`&pool`), a connection or a transaction. Run it once when deploying.
    ///
    /// # Cancel safety
    ///
    /// Each statement is idempotent: a dropped call leaves the table
    /// created or not, and calling again finishes the work.
    pub async fn install<'a, A>(&self, db: A) -> Result<(), TransitionError>
    where
        A: Acquire<'a>,
        <A::Database as Database>::Connection: SqlConnection,
    {
        let mut conn = db
            .acquire()
            .await
            .map_err(|e| self.failed("connecting", &self.names.log, e))?;
        let conn: &mut <A::Database as Database>::Connection = &mut conn;
        for statement in self.ddl(conn.dialect()) {
            run_ddl(conn, statement)
                .await
                .map_err(|e| self.failed("creating the log table", &self.names.log, e))?;
        }
        Ok(())
    }

    /// Moves the row whose id is `id` from status `from` to `to`, in the
    /// caller's transaction (pass `&mut *tx`):
    ///
    /// 1. `from → to` not declared: [`TransitionError::Illegal`], before any
    ///    SQL runs.
    /// 2. `UPDATE table SET status = to WHERE id = ? AND status = from`.
    ///    One row: a log row (table, id, from, to, the database's clock) is
    ///    inserted, [`StatusChange::Applied`].
    /// 3. No row: the status is read with a locking read (`FOR SHARE` on
    ///    PostgreSQL, `LOCK IN SHARE MODE` on MySQL/MariaDB), which sees the
    ///    latest committed value: `to` is [`StatusChange::AlreadyInTarget`],
    ///    another status [`StatusChange::Conflict`], no row
    ///    [`StatusChange::NotFound`].
    ///
    /// Concurrent calls for one move wait for each other on the row's lock:
    /// exactly one is `Applied`, and once it commits the others are
    /// `AlreadyInTarget` (if it rolls back, one of them applies instead).
    /// Under PostgreSQL's `REPEATABLE READ` or `SERIALIZABLE` a row changed
    /// by a concurrent transaction is a serialization failure instead, an
    /// error that [`is_transient`](TransitionError::is_transient): retry
    /// the whole transaction.
    ///
    /// `NotFound` means no committed row with this id was visible to the
    /// locking read; a row another transaction is inserting is not seen
    /// until it commits.
    ///
    /// The id is bound as its own type (an `i64` for a `bigint` column, a
    /// `&str` or `String` for a text one) and logged as its text.
    ///
    /// # Errors
    ///
    /// `Illegal` and [`TransitionError::EntityIdTooLong`] before any SQL
    /// runs; [`TransitionError::MissingTable`] or
    /// [`TransitionError::MissingColumn`] when the schema does not match;
    /// [`TransitionError::NotUnique`] when the update changed several rows
    /// (roll back); [`TransitionError::NullStatus`];
    /// [`TransitionError::Database`]. On PostgreSQL a database error aborts
    /// the transaction: roll it back.
    ///
    /// # Cancel safety
    ///
    /// The change and its log row exist only when the caller's transaction
    /// commits. A dropped call leaves the transaction in an unknown state:
    /// drop the transaction too (it is rolled back, nothing changes), and a
    /// retry finds the row as it was.
    pub async fn transition<C, I>(
        &self,
        conn: &mut C,
        id: I,
        from: &str,
        to: &str,
    ) -> Result<StatusChange, TransitionError>
    where
        C: SqlConnection,
        I: EntityId,
    {
        if !self.transitions.allows(from, to) {
            return Err(TransitionError::Illegal {
                table: self.names.table.to_string(),
                from: from.to_owned(),
                to: to.to_owned(),
                allowed: self.transitions.after(from).map(str::to_owned).collect(),
            });
        }
        let logged_id = id.to_string();
        if logged_id.len() > MAX_ENTITY_ID_BYTES {
            return Err(TransitionError::EntityIdTooLong {
                len: logged_id.len(),
                max: MAX_ENTITY_ID_BYTES,
            });
        }
        // A second round only when the row went back to `from` between the
        // update and the read (possible under READ COMMITTED); the locking
        // read now holds it, so the second update cannot miss.
        for round in 0..2 {
            match self.update(conn, &id, from, to).await? {
                0 => {}
                1 => {
                    self.log_move(conn, &logged_id, from, to).await?;
                    return Ok(StatusChange::Applied);
                }
                rows => {
                    return Err(TransitionError::NotUnique {
                        table: self.names.table.to_string(),
                        column: self.names.id_column.to_string(),
                        rows,
                    });
                }
            }
            match self.read(conn, &id).await? {
                None => return Ok(StatusChange::NotFound),
                Some(None) => {
                    return Err(TransitionError::NullStatus {
                        table: self.names.table.to_string(),
                        id: logged_id,
                    });
                }
                Some(Some(current)) if current == to => return Ok(StatusChange::AlreadyInTarget),
                Some(Some(current)) if current == from && round == 0 => {}
                Some(Some(current)) => return Ok(StatusChange::Conflict { current }),
            }
        }
        Ok(StatusChange::Conflict {
            current: from.to_owned(),
        })
    }

    async fn update<C: SqlConnection, I: EntityId>(
        &self,
        conn: &mut C,
        id: &I,
        from: &str,
        to: &str,
    ) -> Result<u64, TransitionError> {
        match conn.conn() {
            Conn::Postgres(c) => sqlx::query(AssertSqlSafe(self.postgres.update.clone()))
                .bind(to)
                .bind(id)
                .bind(from)
                .execute(c)
                .await
                .map(|r| r.rows_affected()),
            // sqlx asks MySQL for rows matched (CLIENT_FOUND_ROWS), and
            // `from` differs from `to`: matched is changed.
            #[cfg(feature = "mysql")]
            Conn::MySql(c) => sqlx::query(AssertSqlSafe(self.mysql.update.clone()))
                .bind(to)
                .bind(id)
                .bind(from)
                .execute(c)
                .await
                .map(|r| r.rows_affected()),
        }
        .map_err(|e| self.failed("changing the status", &self.names.table, e))
    }

    async fn log_move<C: SqlConnection>(
        &self,
        conn: &mut C,
        id: &str,
        from: &str,
        to: &str,
    ) -> Result<(), TransitionError> {
        let table = self.names.table.as_str();
        match conn.conn() {
            Conn::Postgres(c) => sqlx::query(AssertSqlSafe(self.postgres.log.clone()))
                .bind(table)
                .bind(id)
                .bind(from)
                .bind(to)
                .execute(c)
                .await
                .map(drop),
            #[cfg(feature = "mysql")]
            Conn::MySql(c) => sqlx::query(AssertSqlSafe(self.mysql.log.clone()))
                .bind(table)
                .bind(id)
                .bind(from)
                .bind(to)
                .execute(c)
                .await
                .map(drop),
        }
        .map_err(|e| self.failed("logging the transition", &self.names.log, e))
    }

    /// The row's status: `None` without a row, `Some(None)` when it is NULL.
    async fn read<C: SqlConnection, I: EntityId>(
        &self,
        conn: &mut C,
        id: &I,
    ) -> Result<Option<Option<String>>, TransitionError> {
        match conn.conn() {
            Conn::Postgres(c) => sqlx::query(AssertSqlSafe(self.postgres.read.clone()))
                .bind(id)
                .fetch_optional(c)
                .await
                .and_then(|row| row.map(|r| r.try_get(0)).transpose()),
            #[cfg(feature = "mysql")]
            Conn::MySql(c) => sqlx::query(AssertSqlSafe(self.mysql.read.clone()))
                .bind(id)
                .fetch_optional(c)
                .await
                .and_then(|row| row.map(|r| r.try_get(0)).transpose()),
        }
        .map_err(|e| self.failed("reading the status", &self.names.table, e))
    }

    fn failed(&self, action: &'static str, table: &Ident, source: sqlx::Error) -> TransitionError {
        let table = table.to_string();
        match fault(&source) {
            Fault::MissingTable => TransitionError::MissingTable { table, source },
            Fault::MissingColumn => TransitionError::MissingColumn { table, source },
            _ => TransitionError::Database {
                action,
                table,
                source,
            },
        }
    }
}

/// An entity id [`StatusColumn::transition`] can bind on both databases
/// and log as text: `i64`, `i32`, `&str`, `String`, and any type with
/// sqlx's `Encode` and `Type` for PostgreSQL and MySQL (with the `mysql`
/// feature) and a `Display`.
pub trait EntityId:
    BindsOnMySql + for<'q> Encode<'q, Postgres> + Type<Postgres> + fmt::Display + Send + Sync
{
}

impl<T> EntityId for T where
    T: BindsOnMySql + for<'q> Encode<'q, Postgres> + Type<Postgres> + fmt::Display + Send + Sync
{
}

/// A value sqlx binds on MySQL; every type, in a build without the
/// `mysql` feature.
#[cfg(feature = "mysql")]
pub trait BindsOnMySql: for<'q> Encode<'q, MySql> + Type<MySql> {}

#[cfg(feature = "mysql")]
impl<T: for<'q> Encode<'q, MySql> + Type<MySql>> BindsOnMySql for T {}

/// A value sqlx binds on MySQL; every type, in a build without the
/// `mysql` feature.
#[cfg(not(feature = "mysql"))]
pub trait BindsOnMySql {}

#[cfg(not(feature = "mysql"))]
impl<T: ?Sized> BindsOnMySql for T {}

/// A graph or table binding that [`Transitions::bind`] refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTransitions {
    /// A table or column name breaks the identifier rule.
    #[error(transparent)]
    Identifier(#[from] InvalidIdentifier),
    /// An edge from a status to itself: the update would match every time,
    /// so the move could not happen once.
    #[error(
        "the edge {status:?} → {status:?} goes nowhere and could be applied any number of times; remove it"
    )]
    SelfLoop {
        /// The status.
        status: String,
    },
    /// A status name is empty or too long.
    #[error(
        "status {status:?} is {len} bytes; status names are 1 to {MAX_STATUS_BYTES} bytes (the log's columns)"
    )]
    Status {
        /// The status (its first 80 characters).
        status: String,
        /// Its length in bytes.
        len: usize,
    },
}

/// Why [`StatusColumn::transition`] or [`StatusColumn::install`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// The move is not a declared edge; nothing ran.
    #[error(
        "{from:?} → {to:?} is not a declared transition of {table}; {}",
        declared(from, allowed)
    )]
    Illegal {
        /// The business table.
        table: String,
        /// The status asked to move from.
        from: String,
        /// The status asked to move to.
        to: String,
        /// The declared statuses after `from`.
        allowed: Vec<String>,
    },
    /// The id's text is longer than the log's `entity_id` column; nothing
    /// ran.
    #[error("the entity id is {len} bytes as text; the transition log holds up to {max}")]
    EntityIdTooLong {
        /// Its length in bytes.
        len: usize,
        /// [`MAX_ENTITY_ID_BYTES`].
        max: usize,
    },
    /// The business table or the log table does not exist.
    #[error(
        "table {table} does not exist: create the log table with StatusColumn::install (or the statements of StatusColumn::ddl), and check the business table's name ({source})"
    )]
    MissingTable {
        /// The table.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// A column named in [`Transitions::bind`] is not in the table.
    #[error(
        "a column of {table} does not exist: check the names given to Transitions::bind ({source})"
    )]
    MissingColumn {
        /// The table.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// The update changed several rows: the id column is not unique. The
    /// changes are in the caller's transaction: roll it back.
    #[error(
        "the update changed {rows} rows of {table}: {column} is not unique; roll the transaction back and bind a unique column (the primary key)"
    )]
    NotUnique {
        /// The business table.
        table: String,
        /// The id column.
        column: String,
        /// How many rows changed.
        rows: u64,
    },
    /// The row's status is NULL: no edge leads from it.
    #[error(
        "the status of {table} row {id} is NULL; give it a status (and make the column NOT NULL)"
    )]
    NullStatus {
        /// The business table.
        table: String,
        /// The row's id, as text.
        id: String,
    },
    /// The database failed. On PostgreSQL the caller's transaction is
    /// aborted: roll it back, and retry when
    /// [`is_transient`](TransitionError::is_transient).
    #[error("{action} in {table} failed: {source}")]
    Database {
        /// What was being done.
        action: &'static str,
        /// The table.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
}

impl TransitionError {
    /// Whether another try may succeed: the database was unreachable or
    /// busy, or chose this transaction as a deadlock or serialization
    /// victim. Retry the whole transaction then.
    pub fn is_transient(&self) -> bool {
        match self {
            TransitionError::Database { source, .. } => fault(source) == Fault::Transient,
            _ => false,
        }
    }
}

fn declared(from: &str, allowed: &[String]) -> String {
    if allowed.is_empty() {
        format!("no transition from {from:?} is declared")
    } else {
        format!("from {from:?} the declared ones lead to {allowed:?}")
    }
}
