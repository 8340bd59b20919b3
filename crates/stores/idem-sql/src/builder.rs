//! Opening a store: its URL and settings, the pool, the migrations, and
//! what can go wrong on the way.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::coalesce::StoreBatches;
use idem_core::{DEFAULT_ABANDONED_RETENTION, Limits};
#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::idle;
use crate::migrate::{self, Dialect, Migrated};
#[cfg(feature = "mysql")]
use crate::mysql::MySql;
use crate::pg::Postgres;
use crate::store::{Db, Inner, Records, SqlStore};
use crate::sweep;
use crate::table::{InvalidTable, Tables};

/// Most items one statement carries; a larger batch is cut into several.
pub(crate) const ITEMS_PER_STATEMENT: usize = 512;

/// Why a store could not be opened. Messages never show a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL or a setting is not one idem can use.
    #[error("{0}")]
    Config(String),
    /// The table prefix or shard count was refused.
    #[error(transparent)]
    Table(#[from] InvalidTable),
    /// The server could not be reached, refused the login, or has no such
    /// database.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// What went wrong, and what to check.
        reason: String,
    },
    /// The database user may not do what the store needs.
    #[error("{0}")]
    Rights(String),
    /// The schema could not be brought up to date, or is not.
    #[error("{0}")]
    Migrate(String),
    /// Another database error while opening.
    #[error("the database failed while opening the store: {0}")]
    Database(#[source] sqlx::Error),
}

impl OpenError {
    /// Sorts a database error met while opening: missing rights and
    /// connection failures get a message that says what to do.
    pub(crate) fn database(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            let rights = match crate::error::mysql_number(db.as_ref()) {
                // ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED, ER_SPECIFIC_ACCESS_DENIED.
                Some(n) => matches!(n, 1044 | 1142 | 1227),
                // insufficient_privilege
                None => db.code().as_deref() == Some("42501"),
            };
            if rights {
                return OpenError::Rights(format!(
                    "the database user lacks a right the store needs ({}): grant it CREATE, SELECT, INSERT, UPDATE and DELETE \
                     on the store's tables, or run `idem migrate --store URL` once as a user who may create tables",
                    db.message()
                ));
            }
        }
        OpenError::Database(e)
    }
}

/// Configures a [`SqlStore`]; see [`SqlStore::builder`].
#[derive(Clone, Debug)]
pub struct SqlStoreBuilder {
    url: String,
    prefix: String,
    shards: u16,
    pool_size: u32,
    timeout: Duration,
    limits: Limits,
    abandoned_retention: Duration,
    tombstone_ttl: Duration,
    sweep_interval: Option<Duration>,
    sweep_batch: u32,
    migrate: bool,
    coalesce: bool,
    lock_timeout: Duration,
    /// A URL setting idem could not read, reported by `connect`.
    bad_param: Option<String>,
}

/// The settings idem reads from a store URL's query, and strips before the
/// URL goes to the driver.
const IDEM_PARAMS: &[&str] = &["shards", "table", "pool_size", "lock_timeout"];

/// How long a statement waits for a row lock another transaction holds,
/// unless set with [`SqlStoreBuilder::lock_timeout`].
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(feature = "mysql")]
/// Bytes a MySQL statement needs beside the outcome it carries: the
/// statement's text, the namespace and key (up to 1 024 bytes), the other
/// values and the protocol's framing.
pub(crate) const PACKET_OVERHEAD: usize = 8 * 1024;

impl SqlStoreBuilder {
    pub(crate) fn new(url: &str) -> Self {
        let mut builder = Self {
            url: url.to_owned(),
            prefix: "idem_records".into(),
            shards: 1,
            pool_size: 16,
            timeout: Duration::from_secs(5),
            limits: Limits::default(),
            abandoned_retention: DEFAULT_ABANDONED_RETENTION,
            tombstone_ttl: Duration::from_secs(3600),
            sweep_interval: Some(Duration::from_secs(30)),
            sweep_batch: 1000,
            migrate: true,
            coalesce: true,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            bad_param: None,
        };
        builder.read_params();
        builder
    }

    /// Takes `shards`, `table`, `pool_size` and `lock_timeout` out of the
    /// URL's query.
    fn read_params(&mut self) {
        let Some((base, query)) = self.url.split_once('?') else {
            return;
        };
        let mut kept = Vec::new();
        let base = base.to_owned();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !IDEM_PARAMS.contains(&name) {
                kept.push(pair.to_owned());
                continue;
            }
            let bad = |what: &str| Some(format!("the store URL's {name}={value:?} is not {what}"));
            match name {
                "shards" => match value.parse() {
                    Ok(n) => self.shards = n,
                    Err(_) => self.bad_param = bad("a number of shards (1 to 256)"),
                },
                "pool_size" => match value.parse() {
                    Ok(n) if n > 0 => self.pool_size = n,
                    _ => self.bad_param = bad("a number of connections (1 or more)"),
                },
                "lock_timeout" => match parse_duration(value) {
                    Some(d) => self.lock_timeout = d.max(Duration::from_millis(1)),
                    None => {
                        self.bad_param =
                            bad("a duration such as 5s or 500ms (whole seconds on MySQL)")
                    }
                },
                _ => self.prefix = value.to_owned(),
            }
        }
        self.url = if kept.is_empty() {
            base
        } else {
            format!("{base}?{}", kept.join("&"))
        };
    }

    /// The table prefix (default `idem_records`; `?table=` in the URL).
    pub fn table(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How many tables the records are split into by a hash of the key
    /// (default 1; `?shards=` in the URL). Fixed when the tables are made:
    /// opening them with another count is refused.
    pub fn shards(mut self, n: u16) -> Self {
        self.shards = n;
        self
    }

    /// Most connections held open (default 16; `?pool_size=` in the URL).
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// The limit on connecting and on waiting for a free connection
    /// (default 5 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// The limits to enforce. Keys longer than [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES)
    /// do not fit the key column and are refused when the store opens.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How long an `in_progress` record whose lease ran out is kept before
    /// the sweeper may delete it (default 1 h).
    pub fn abandoned_retention(mut self, d: Duration) -> Self {
        self.abandoned_retention = d;
        self
    }

    /// How long a released key remembers its token (default 1 h), so the
    /// next acquisition continues above it even if the clock steps back.
    pub fn tombstone_ttl(mut self, d: Duration) -> Self {
        self.tombstone_ttl = d;
        self
    }

    /// How often the background sweeper deletes expired rows (default
    /// 30 s); `None` runs none: call [`SqlStore::sweep`] or `idem sweep`.
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// Most rows one sweeping statement deletes (default 1 000), so it
    /// never holds many locks for long.
    pub fn sweep_batch(mut self, rows: u32) -> Self {
        self.sweep_batch = rows.max(1);
        self
    }

    /// Whether opening brings the tables up to date (default yes). With
    /// `false`, opening fails unless `idem migrate` has been run.
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// How long a statement waits for a row lock another transaction holds
    /// before the call fails as unavailable (default 5 s; `?lock_timeout=5s`
    /// or `500ms` in the URL): PostgreSQL's `lock_timeout`, MySQL's
    /// `innodb_lock_wait_timeout` (whole seconds, rounded up), set on each
    /// of the store's sessions. Without it a call waits as long as the
    /// holder (MySQL's default is 50 s), and so does a cancelled call's
    /// connection before the pool may lend it again.
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// Whether single `begin`s and `complete`s issued together travel as
    /// one statement (default yes).
    pub fn coalesce(mut self, yes: bool) -> Self {
        self.coalesce = yes;
        self
    }

    fn dialect(&self) -> Result<Dialect, OpenError> {
        let scheme = self.url.split_once("://").map_or("", |(s, _)| s);
        match scheme {
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => Ok(Dialect::MySql),
            #[cfg(not(feature = "mysql"))]
            "mysql" | "mariadb" => Err(OpenError::Config(crate::error::no_mysql())),
            _ => Err(OpenError::Config(format!(
                "{} is not an SQL store URL: use postgres://USER@HOST:PORT/DB or mysql://USER@HOST:PORT/DB",
                redacted(&self.url)
            ))),
        }
    }

    fn check(&self) -> Result<(Dialect, Tables), OpenError> {
        if let Some(bad) = &self.bad_param {
            return Err(OpenError::Config(bad.clone()));
        }
        let dialect = self.dialect()?;
        let tables = Tables::new(&self.prefix, self.shards)?;
        if self.limits.max_key_bytes > crate::MAX_KEY_BYTES {
            return Err(OpenError::Config(format!(
                "max_key_bytes is {}; the SQL stores' key column holds at most {} bytes",
                self.limits.max_key_bytes,
                crate::MAX_KEY_BYTES
            )));
        }
        Ok((dialect, tables))
    }

    fn connect_error(&self, e: sqlx::Error) -> OpenError {
        let reason = match &e {
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default().into_owned();
                let number = crate::error::mysql_number(db.as_ref());
                match (code.as_str(), number) {
                    ("28P01" | "28000", _) | (_, Some(1045)) => format!(
                        "the server refused the login ({}); check the user and password",
                        db.message()
                    ),
                    ("3D000", _) | (_, Some(1049)) => format!(
                        "{}; create the database or name one that exists",
                        db.message()
                    ),
                    _ => return OpenError::database(e),
                }
            }
            sqlx::Error::Io(io) => format!("{io}; is the server running, and on that port?"),
            sqlx::Error::PoolTimedOut => format!(
                "no answer within {:?}; is the server running and reachable?",
                self.timeout
            ),
            sqlx::Error::Tls(tls) => format!("TLS failed: {tls}"),
            sqlx::Error::Configuration(c) => format!("the URL is not valid: {c}"),
            other => other.to_string(),
        };
        OpenError::Connect {
            url: redacted(&self.url),
            reason,
        }
    }

    /// Brings the tables up to date and returns what was applied, without
    /// opening a store: what `idem migrate` runs.
    ///
    /// # Cancel safety
    ///
    /// On PostgreSQL a dropped call applies every missing version or none
    /// (one transaction). On MySQL schema changes commit one by one; the
    /// next run finishes what a dropped one began.
    pub async fn run_migrations(self) -> Result<Migrated, OpenError> {
        let (dialect, tables) = self.check()?;
        match dialect {
            Dialect::Postgres => {
                let pool = self.pg_pool(1).await?;
                let mut conn = pool.acquire().await.map_err(|e| self.connect_error(e))?;
                migrate::run_pg(&mut conn, &tables, true).await
            }
            #[cfg(not(feature = "mysql"))]
            Dialect::MySql => Err(OpenError::Config(crate::error::no_mysql())),
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                let pool = self.mysql_pool(1).await?;
                let mut conn = pool.acquire().await.map_err(|e| self.connect_error(e))?;
                migrate::run_mysql(&mut conn, &tables, true).await
            }
        }
    }

    /// Opens one connection first, so that a server that is down or
    /// refuses the login is reported as such at once, not as a pool that
    /// found no connection in time.
    async fn try_connect<C>(&self, options: &C) -> Result<(), OpenError>
    where
        C: sqlx::ConnectOptions,
        C::Connection: Sized,
    {
        use sqlx::Connection as _;
        match tokio::time::timeout(self.timeout, options.connect()).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(e)) => Err(self.connect_error(e)),
            Err(_) => Err(self.connect_error(sqlx::Error::PoolTimedOut)),
        }
    }

    /// The PostgreSQL driver's options for the URL and settings.
    fn pg_options(&self) -> Result<PgConnectOptions, OpenError> {
        Ok(PgConnectOptions::from_str(&self.url)
            .map_err(|e| self.connect_error(e))?
            // Every statement a store may run stays prepared.
            .statement_cache_capacity(statement_cache(self.shards))
            .options([
                // A generic plan is chosen once from the statement alone, so
                // it stays on the primary key whatever the statistics say (a
                // table filled but not yet analysed planned sequential
                // scans), and the statement is not planned five times first.
                ("plan_cache_mode", "force_generic_plan".to_owned()),
                (
                    "lock_timeout",
                    format!("{}ms", self.lock_timeout.as_millis()),
                ),
            ]))
    }

    async fn pg_pool(&self, size: u32) -> Result<sqlx::PgPool, OpenError> {
        let options = self.pg_options()?;
        self.try_connect(&options).await?;
        PgPoolOptions::new()
            .max_connections(size)
            // sqlx checks a connection as it goes back to the pool; a
            // second check on the way out would cost every call a round
            // trip. Only a connection that may have broken while idle (a
            // server restart) is checked: crate::idle.
            .test_before_acquire(false)
            .before_acquire(idle::check)
            .acquire_timeout(self.timeout)
            .connect_with(options)
            .await
            .map_err(|e| self.connect_error(e))
    }

    /// The MySQL driver's options for the URL and settings.
    #[cfg(feature = "mysql")]
    fn mysql_options(&self) -> Result<MySqlConnectOptions, OpenError> {
        Ok(MySqlConnectOptions::from_str(&self.url)
            .map_err(|e| self.connect_error(e))?
            // Affected rows count the rows an update matched.
            .found_rows(true)
            // The clock is read as UNIX_TIMESTAMP(NOW(3)), which goes
            // through the session's zone: in one with daylight saving it
            // steps back an hour once a year. UTC never does, whatever
            // `?timezone=` says.
            .timezone(Some("+00:00".to_owned())))
    }

    #[cfg(feature = "mysql")]
    async fn mysql_pool(&self, size: u32) -> Result<sqlx::MySqlPool, OpenError> {
        let options = self.mysql_options()?;
        let lock_wait_secs = self.lock_timeout.as_secs_f64().ceil().max(1.0) as u64;
        self.try_connect(&options).await?;
        MySqlPoolOptions::new()
            .max_connections(size)
            // sqlx checks a connection as it goes back to the pool; a
            // second check on the way out would cost every call a round
            // trip. Only a connection that may have broken while idle (a
            // server restart) is checked: crate::idle.
            .test_before_acquire(false)
            .before_acquire(idle::check)
            .acquire_timeout(self.timeout)
            // The upserts need MySQL's left-to-right assignments, which
            // MariaDB's SIMULTANEOUS_ASSIGNMENT mode would turn off; each
            // statement must commit on its own, whatever the server's
            // `init_connect` chose; a row lock is waited for a bounded time.
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    sqlx::query(
                        "SET SESSION sql_mode = TRIM(BOTH ',' FROM REPLACE(CONCAT(',', @@SESSION.sql_mode, ','), ',SIMULTANEOUS_ASSIGNMENT,', ',')), \
                         autocommit = 1, innodb_lock_wait_timeout = ?",
                    )
                    .bind(lock_wait_secs)
                    .persistent(false)
                    .execute(&mut *conn)
                    .await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| self.connect_error(e))
    }

    /// Connects, brings the tables up to date (unless told not to) and
    /// starts the sweeper on the current Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves the connections it opened, which
    /// close, and at most a migration the next open finishes.
    pub async fn connect(self) -> Result<SqlStore, OpenError> {
        let (dialect, tables) = self.check()?;
        let db = match dialect {
            Dialect::Postgres => {
                let pool = self.pg_pool(self.pool_size).await?;
                let mut conn = pool.acquire().await.map_err(|e| self.connect_error(e))?;
                migrate::run_pg(&mut conn, &tables, self.migrate).await?;
                drop(conn);
                Db::Postgres(Postgres::new(pool, &tables))
            }
            #[cfg(not(feature = "mysql"))]
            Dialect::MySql => return Err(OpenError::Config(crate::error::no_mysql())),
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                let pool = self.mysql_pool(self.pool_size).await?;
                let mut conn = pool.acquire().await.map_err(|e| self.connect_error(e))?;
                migrate::run_mysql(&mut conn, &tables, self.migrate).await?;
                let packet: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(OpenError::database)?;
                let packet = usize::try_from(packet).unwrap_or(0);
                check_packet(self.limits.max_outcome_bytes, packet)?;
                drop(conn);
                Db::MySql(MySql::new(pool, &tables, packet))
            }
        };
        let description = format!(
            "{} store at {} (tables {}{})",
            match dialect {
                Dialect::Postgres => "PostgreSQL",
                Dialect::MySql => "MySQL",
            },
            redacted(&self.url),
            tables.prefix(),
            match tables.shards() {
                1 => String::new(),
                n => format!("_00 to _{:02}", n - 1),
            }
        );
        let inner = Arc::new(Inner {
            db,
            tables,
            limits: self.limits,
            abandoned_ms: crate::row::millis(self.abandoned_retention),
            tombstone_ms: crate::row::millis(self.tombstone_ttl).max(1),
            sweep_batch: i64::from(self.sweep_batch),
            description,
        });
        let batches = Arc::new(StoreBatches::start(
            inner.clone(),
            self.coalesce,
            ITEMS_PER_STATEMENT,
        ));
        let sweeper = self
            .sweep_interval
            .map(|every| sweep::spawn(Arc::downgrade(&inner), every));
        Ok(SqlStore::new(Records {
            inner,
            batches,
            _sweeper: sweeper.map(Arc::new),
        }))
    }
}

/// What idem reads from a store URL, checked as [`SqlStoreBuilder::connect`]
/// checks it, without connecting.
#[derive(Debug)]
pub struct StoreUrl {
    /// The URL handed to the driver: idem's settings taken out.
    pub driver_url: String,
    /// The URL as idem shows it: [`redacted`].
    pub shown: String,
    /// The tables the records go to.
    pub tables: Tables,
    /// Most connections held open.
    pub pool_size: u32,
    /// How long a statement waits for a row lock.
    pub lock_timeout: Duration,
}

/// Reads `url` as [`SqlStore::builder`] and `connect` do, up to the
/// driver's connect options, and stops before connecting: the settings
/// idem takes out of it, or why it is refused.
pub fn read_store_url(url: &str) -> Result<StoreUrl, OpenError> {
    let builder = SqlStoreBuilder::new(url);
    let (dialect, tables) = builder.check()?;
    match dialect {
        Dialect::Postgres => drop(builder.pg_options()?),
        #[cfg(feature = "mysql")]
        Dialect::MySql => drop(builder.mysql_options()?),
        #[cfg(not(feature = "mysql"))]
        Dialect::MySql => return Err(OpenError::Config(crate::error::no_mysql())),
    }
    Ok(StoreUrl {
        shown: redacted(&builder.url),
        driver_url: builder.url,
        tables,
        pool_size: builder.pool_size,
        lock_timeout: builder.lock_timeout,
    })
}

#[cfg(feature = "mysql")]
/// Refuses an outcome limit that a statement within the MySQL server's
/// `max_allowed_packet` cannot carry: every `complete` of an outcome near
/// the limit would fail, every time.
fn check_packet(max_outcome_bytes: usize, packet: usize) -> Result<(), OpenError> {
    let fits = packet.saturating_sub(PACKET_OVERHEAD);
    if max_outcome_bytes > fits {
        return Err(OpenError::Config(format!(
            "max_outcome_bytes is {max_outcome_bytes}, but the server's max_allowed_packet is {packet} bytes, \
             which carries outcomes of at most {fits} bytes: raise max_allowed_packet on the server \
             to at least {} (SET GLOBAL max_allowed_packet, and in its configuration file) or lower max_outcome_bytes to {fits}",
            max_outcome_bytes.saturating_add(PACKET_OVERHEAD)
        )));
    }
    Ok(())
}

/// The statements a store of `shards` tables prepares: ten per table (seven
/// for the records, three for the tier), and room for the few others.
fn statement_cache(shards: u16) -> usize {
    (11 * usize::from(shards) + 16).max(100)
}

/// `5s`, `500ms` or a bare number of seconds.
fn parse_duration(value: &str) -> Option<Duration> {
    if let Some(ms) = value.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    value
        .strip_suffix('s')
        .unwrap_or(value)
        .parse()
        .ok()
        .map(Duration::from_secs)
}

/// `url` with every credential the drivers accept replaced by `***`: the
/// password in `user:password@`, and query parameters that carry a secret
/// (`password=`, `sslpassword=`, `sslkey=` and their spellings, also
/// percent-encoded, as the drivers decode them). Use it wherever a store
/// URL is shown: logs, errors, command output. A user name without a
/// password is shown ([`idem_core::text::redacted_url_keeping_user`]).
pub fn redacted(url: &str) -> String {
    idem_core::text::redacted_url_keeping_user(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idem_settings_come_out_of_the_url() {
        let b = SqlStoreBuilder::new(
            "postgres://u:pw@h:5432/db?sslmode=require&shards=16&table=orders_seen&pool_size=4",
        );
        assert_eq!(b.url, "postgres://u:pw@h:5432/db?sslmode=require");
        assert_eq!(
            (b.shards, b.prefix.as_str(), b.pool_size),
            (16, "orders_seen", 4)
        );
        let b = SqlStoreBuilder::new("mysql://root@h/test?shards=x");
        assert!(matches!(b.check(), Err(OpenError::Config(m)) if m.contains("shards")));
        let b = SqlStoreBuilder::new("mysql://root@h/test?table=Bad-Name");
        assert!(matches!(b.check(), Err(OpenError::Table(_))));
        let b = SqlStoreBuilder::new("sqlite://x");
        assert!(matches!(b.check(), Err(OpenError::Config(_))));
    }

    #[test]
    fn the_lock_timeout_comes_out_of_the_url() {
        let b = SqlStoreBuilder::new("mysql://root@h/test?lock_timeout=2s&ssl-mode=DISABLED");
        assert_eq!(b.lock_timeout, Duration::from_secs(2));
        assert_eq!(b.url, "mysql://root@h/test?ssl-mode=DISABLED");
        let b = SqlStoreBuilder::new("postgres://u@h/db?lock_timeout=250ms");
        assert_eq!(b.lock_timeout, Duration::from_millis(250));
        assert_eq!(
            SqlStoreBuilder::new("postgres://u@h/db").lock_timeout,
            DEFAULT_LOCK_TIMEOUT
        );
        let b = SqlStoreBuilder::new("postgres://u@h/db?lock_timeout=soon");
        assert!(matches!(b.check(), Err(OpenError::Config(m)) if m.contains("lock_timeout")));
    }

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redacted("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redacted("mysql://root@h/test"), "mysql://root@h/test");
        assert_eq!(redacted("mysql://:pw@h/test"), "mysql://:***@h/test");
        assert_eq!(
            redacted("postgres://app@db/x?password=s3cret&sslmode=require"),
            "postgres://app@db/x?password=***&sslmode=require"
        );
        assert_eq!(
            redacted("postgres://db?user=app&Password=s3cret"),
            "postgres://db?user=app&Password=***"
        );
        assert_eq!(
            redacted(
                "postgres://a:b@db/x?sslpassword=k1&sslkey=/k.pem&ssl-key=/k2.pem&ssl-key-password=k3&sslrootcert=/ca.pem"
            ),
            "postgres://a:***@db/x?sslpassword=***&sslkey=***&ssl-key=***&ssl-key-password=***&sslrootcert=/ca.pem"
        );
        // A password holding '@' or '/' as the drivers take it, undecoded.
        assert_eq!(
            redacted("mysql://app:p@ss/w@db:3306/test"),
            "mysql://app:***@db:3306/test"
        );
    }

    #[test]
    fn a_password_holding_a_question_mark_is_never_shown() {
        assert_eq!(
            redacted("mysql://app:s3?cret@db:3306/test?ssl-mode=DISABLED"),
            "mysql://app:***@db:3306/test?ssl-mode=DISABLED"
        );
        assert_eq!(redacted("mysql://:\u{1})%?R@?"), "mysql://:***@?");
        assert_eq!(
            redacted("postgres://db/x?password=ab?cd&sslmode=require"),
            "postgres://db/x?password=***&sslmode=require"
        );
        assert_eq!(
            redacted("postgres://app:pw@db/x?application_name=a@b&sslmode=require"),
            "postgres://app:***@db/x?application_name=a@b&sslmode=require"
        );
        // An '@' in a query value and no user information: the query's
        // secrets are hidden still, also one that reads as user information.
        assert_eq!(
            redacted("mysql://h?password=x:y@tail&ssl-mode=DISABLED"),
            "mysql://h?password=***&ssl-mode=DISABLED"
        );
        assert_eq!(
            redacted("postgres://db/x?user=app@corp&password=s3cret"),
            "postgres://db/x?user=app@corp&password=***"
        );
    }

    #[test]
    fn a_mistyped_url_shows_no_password_either() {
        assert_eq!(
            redacted("postgres:/db?password=s3cret"),
            "postgres:/db?password=***"
        );
        assert_eq!(redacted("app:s3cret@db/x"), "app:***@db/x");
        assert_eq!(
            redacted("postgres:/db?password=s3://cret"),
            "postgres:/db?password=***"
        );
        assert_eq!(redacted("sqlite::memory:"), "sqlite::memory:");
        let refused = SqlStoreBuilder::new("postgres:/db?password=s3cret").check();
        assert!(matches!(refused, Err(OpenError::Config(m)) if !m.contains("s3cret")));
    }

    #[test]
    fn a_percent_encoded_password_parameter_is_never_shown() {
        assert_eq!(
            redacted("postgres://app@db/x?pass%77ord=s3cret&%73slkey=/k.pem"),
            "postgres://app@db/x?pass%77ord=***&%73slkey=***"
        );
    }
}
