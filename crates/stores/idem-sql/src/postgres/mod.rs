//! The PostgreSQL store.
