//! idem for high volume (docs/high-volume.md): a pre-filter that answers
//! "certainly new" without touching storage, and a tiered store.

#![warn(missing_docs)]

pub mod filter;
mod tiered;

pub use tiered::{
    Acknowledgement, ColdChecks, DEFAULT_HOT_RETENTION, MIN_HOT_RETENTION, TieredStore,
    TieredStoreBuilder, WriteBehindStats,
};
