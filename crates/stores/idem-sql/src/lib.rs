//! idem's SQL stores: the record in PostgreSQL or MySQL/MariaDB
//! (docs/contract.md §1–§2), in tables hash-sharded by key.
//!
//! This crate now holds what both stores share: table names from a checked
//! prefix, and the stable hash that picks a key's shard.
#![deny(missing_docs)]

mod inbox;
mod table;
mod transition;

pub use inbox::{
    Claimed, DEFAULT_SWEEP_BATCH, Dialect, Inbox, InboxError, InvalidIdentifier,
    MAX_INBOX_KEY_BYTES, SqlConnection,
};
pub use table::{InvalidTable, MAX_PREFIX_BYTES, MAX_SHARDS, TableName, Tables};
pub use transition::{
    EntityId, InvalidTransitions, MAX_ENTITY_ID_BYTES, MAX_STATUS_BYTES, StatusChange,
    StatusColumn, TransitionError, Transitions,
};
