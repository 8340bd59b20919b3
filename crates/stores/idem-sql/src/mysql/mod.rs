//! The MySQL and MariaDB store.
