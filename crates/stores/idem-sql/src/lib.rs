//! idem's SQL stores: the record in PostgreSQL or MySQL/MariaDB
//! (docs/contract.md §1–§2), with the database's clock deciding leases and
//! expiry, tables hash-sharded by key, and an expiry sweeper.
#![deny(missing_docs)]

mod table;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use table::{InvalidTable, Tables};
