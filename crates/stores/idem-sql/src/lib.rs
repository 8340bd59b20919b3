//! idem's SQL store: the record (docs/contract.md §1–§2) in PostgreSQL or
//! MySQL/MariaDB tables, optionally hash-sharded by key. MySQL and MariaDB
//! need the `mysql` feature (on by default; sqlx's MySQL driver): without
//! it a `mysql://` URL is refused with a message that names the feature.
//!
//! ```no_run
//! use idem_core::{Begin, Key, Lease, Store};
//! use idem_sql::SqlStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Or mysql://root@127.0.0.1:3306/test; add ?shards=16 to split the table.
//! let store = SqlStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! let key = Key::new("payments", "charge-42")?;
//! if let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(30)).await? {
//!     // … the effect …
//!     let _ = store
//!         .complete(&key, claim.token, Some("done".into()), std::time::Duration::from_secs(86_400))
//!         .await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - **One write statement per operation**, decided by the database:
//!   `begin` is an `INSERT … ON CONFLICT DO UPDATE … WHERE` (PostgreSQL) or
//!   `INSERT … ON DUPLICATE KEY UPDATE` with conditional assignments
//!   (MySQL/MariaDB) that takes an absent, released or lapsed key and
//!   leaves a live one alone. Never a read, then a write. PostgreSQL reads
//!   the answer in the same statement; MySQL, which returns no rows from a
//!   write, reads it with a second statement (in the same round trip for
//!   `begin` and `extend`, only when needed for `complete`).
//! - **The database's clock** decides leases and retention, so hosts with
//!   skewed clocks agree.
//! - **Fencing tokens** are the key's last token plus one, at least the
//!   database's time in milliseconds × 1024: they keep increasing across
//!   release (the row stays as a tombstone for a while), takeover, and the
//!   sweeping of expired rows.
//! - **Batches** (`begin_many`, `complete_many`, and single calls issued
//!   together) travel as one statement per shard.
//! - **Migrations** are versioned and run when the store opens, or on
//!   demand with `idem migrate --store URL`.
//! - **The sweeper** deletes expired rows in bounded batches, in the
//!   background and with `idem sweep --store URL`.
//! - **A tier** ([`Tier`](idem_core::tier::Tier)), usually the cold one
//!   behind a memory store: `import_many` writes a batch as one statement
//!   per table (bound values; on MySQL in a transaction with a read of
//!   what it wrote), a token high-water mark per table in `PREFIX_tokens`
//!   is raised in the same transaction, and `completed_keys` walks the
//!   primary key namespace by namespace, in encoded-key order.
//!
//!
//! Beside the store, two tools work inside the caller's own transaction, so
//! that the business write and the record of it commit or roll back
//! together:
//! - [`Inbox`]: the consumed-messages table. `inbox.claim(&mut *tx, &key)`
//!   answers [`Claimed::New`] or [`Claimed::Duplicate`] without aborting the
//!   transaction; exactly one effect per key within that database, no lease.
//! - [`Transitions`]: a declared status graph bound to a business table;
//!   `transition(&mut *tx, id, from, to)` is a conditional `UPDATE` plus a
//!   row in a transition log, answering [`StatusChange`].
//!
//! `docs/design.md` in the repository explains the tables and statements.
#![deny(missing_docs)]

mod admin;
mod builder;
mod error;
mod idle;
mod inbox;
mod migrate;
#[cfg(feature = "mysql")]
mod mysql;
mod pg;
mod row;
mod sole;
mod store;
mod sweep;
mod table;
// The tests look at both databases: they need the `mysql` feature (on by
// default).
#[cfg(all(test, feature = "mysql"))]
mod tests;
mod tier;
mod transition;

pub use builder::{DEFAULT_LOCK_TIMEOUT, OpenError, SqlStoreBuilder, redacted};
pub use inbox::{
    Claimed, DEFAULT_SWEEP_BATCH, Inbox, InboxError, InvalidIdentifier, SqlConnection,
};
pub use migrate::{Dialect, Migrated, SCHEMA_VERSION};
pub use store::SqlStore;
pub use table::{InvalidTable, MAX_PREFIX_BYTES, MAX_SHARDS, TableName, Tables};
pub use transition::{
    EntityId, InvalidTransitions, MAX_ENTITY_ID_BYTES, MAX_STATUS_BYTES, StatusChange,
    StatusColumn, TransitionError, Transitions,
};

/// What idem reads from a store URL before the driver gets it, for the
/// fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod decode {
    pub use crate::builder::{StoreUrl, read_store_url};
}

/// The longest key the key column holds, in bytes: the most
/// [`Limits::max_key_bytes`](idem_core::Limits) may be set to.
pub const MAX_KEY_BYTES: usize = 1024;
