//! idem's core: the idempotency record and its state machine, the [`Store`]
//! contract every store honours, the [`Guard`] that runs a handler once per
//! key, and the [`MemoryStore`].
//!
//! A record moves `begin` → `in_progress` (with a lease and a fencing token)
//! → `completed` (with the stored outcome), or is released on failure so a
//! redelivery runs again; an expired lease can be taken over with a larger
//! token. `docs/design.md` in the repository explains the whole contract.
#![deny(missing_docs)]

pub mod admin;
pub mod coalesce;
mod error;
mod fingerprint;
mod guard;
mod key;
pub mod layer;
mod limits;
pub mod machine;
mod memory;
pub mod periodic;
mod record;
mod store;
pub mod text;
pub mod tier;
mod time;

pub use error::{BoxError, StoreError};
pub use fingerprint::Fingerprint;
pub use guard::{ClaimHandle, Codec, Disposition, Failure, Guard, GuardError, Json, Raw};
pub use key::{Key, MAX_NAMESPACE_BYTES, Namespace};
pub use limits::{InvalidInput, Limits};
pub use memory::{DEFAULT_ABANDONED_RETENTION, MemoryStore, MemoryStoreBuilder};
pub use record::{
    Begin, BeginItem, Claim, CompleteItem, Completed, Entry, Fenced, FencingToken, InProgress,
    Lease, Record, RecordState, ScanQuery,
};
pub use store::{DynStore, SharedStore, Store};
pub use time::{Clock, ManualClock, SharedClock, SystemClock, Timestamp};

pub use bytes::Bytes;
