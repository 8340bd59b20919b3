//! idem's Redis store.
//!
//! Every operation of the store contract is one atomic Lua script call
//! (`EVALSHA`, reloaded on `NOSCRIPT`), on Redis's clock (`TIME`), with
//! Redis's own key expiry for leases and retention. Batches are one
//! pipelined round trip, and single `begin`s and `complete`s made at the
//! same time are sent together as one many-item call (see
//! [`RedisStoreBuilder::coalesce`]). Needs Redis 6.2 or later (or Valkey);
//! on 7.0 and later a first claim is a single `SET … NX GET`. `rediss://`
//! URLs speak TLS (feature `tls`, on by default), with the system's roots
//! or a CA of your own, and a client certificate where Redis asks for one
//! ([`RedisStoreBuilder::tls_ca`],
//! [`RedisStoreBuilder::tls_client_certificate`]).
//!
//! ```no_run
//! use idem_core::{Guard, Key};
//! use idem_redis::RedisStore;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let guard = Guard::new(store);
//! let key = Key::new("orders", "o-1")?;
//! let n: u32 = guard.run(&key, None, |_| async { Ok::<_, std::io::Error>(1) }).await?;
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! For key `K` in namespace `N`: one string at `idem:{N:K}:r`, the record
//! packed in 30 bytes plus fingerprint and outcome (layout in
//! `scripts/record.lua`), expiring with the lease (plus
//! `abandoned_retention`) or the retention. One key per record: nothing else
//! to leak or to pay memory for. Beside the records, one key for the whole
//! store, `idem:token-high-water`, kept when the store serves as a tier of
//! a tiered store (see [`RedisStore`]'s `Tier` implementation).
//!
//! # Fencing tokens
//!
//! A token is the last token the record remembers plus one, raised to at
//! least `TIME in ms × 1024`. So tokens keep increasing after a record
//! expired or was released, and after Redis lost its data (a restart without
//! persistence): the clock has moved on, and with it the floor. This holds
//! as long as Redis's clock does not step backwards and one key is not
//! acquired more than 1 024 times in a millisecond. A released key keeps its
//! token for `tombstone_ttl` (1 hour by default), which covers small clock
//! steps between a release and the next acquisition.
//!
//! As a tier, the store also takes completed records with their own tokens
//! and raises its token floor by waiting for Redis's clock to pass it (see
//! [`RedisStore`]'s `Tier` implementation).
//!
//! # When a call fails
//!
//! Each item gets its own answer. Single calls gathered into one batch, and
//! the items of `begin_many` and `complete_many`, go out as one script call
//! per hash slot (per lease or retention); when one call fails (its master
//! down, its slot moving, a script error on one node), only its items get
//! the error and every other item its own answer. `begin_many` then
//! answers with the error and releases the claims it did make, since its
//! caller gets no tokens to complete them; in `complete_many`, the items
//! that were done stay done. (A master that stops answering altogether is
//! another matter: the cluster client holds every call while it looks for
//! the cluster's new shape, so calls to healthy masters can time out
//! meanwhile.)
//!
//! A call that fails after it was sent (a timeout, a lost connection) may
//! have run on Redis or not; the store cannot tell, and answers
//! `Unavailable`. A `begin` that did run holds the key for its lease, then
//! a redelivery takes it over (`attempt` counts it). A `complete` that did
//! run answers `Ok` when sent again with the same token, so retrying it is
//! always safe. An `extend` sent again extends again; a `release` sent
//! again answers `Stale` once the first one ran (the key is free either
//! way).
//!
//! A Redis that cannot persist a write refuses it: with `appendfsync
//! always` it exits at the first append-only write its disk refuses,
//! before answering it, and with `everysec` it answers `MISCONF` to every
//! write until it can write again. The store answers `Unavailable` either
//! way, and works again once Redis does (`tests/disk_full.rs`).
//!
//! # Cancel safety
//!
//! Every operation takes full effect or none when its future is dropped,
//! and leaves its key usable: a single call still queued for the next
//! batch is not sent; one already sent runs in full on Redis (a claim a
//! batched `begin` made for a caller who left is released when the answer
//! comes). [`RedisStore`]'s `# Cancel safety` section says, per operation,
//! what it leaves behind.
#![deny(missing_docs)]

mod admin;
mod builder;
mod cluster;
mod conn;
mod filter;
mod layout;
mod lock;
mod reply;
mod script;
mod store;
mod tier;

pub use self::builder::RedisStoreBuilder;
#[cfg(feature = "tls")]
pub use self::conn::install_crypto_provider;
pub use self::conn::{ConnectError, redacted};
pub use self::lock::{Lock, LockGuard};
pub use self::store::RedisStore;
