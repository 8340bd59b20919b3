//! The store contract (docs/contract.md §2).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Limits,
    Record, ScanQuery, StoreError, Timestamp,
};

/// Where idempotency records live (docs/contract.md §2).
///
/// Every operation is atomic and linearizable per key. Every store checks its
/// [`Limits`] first, so refused input changes nothing, and runs the
/// conformance kit (`idem-testkit`) unchanged.
///
/// # Cancel safety
///
/// Every operation is cancellation-safe: if its future is dropped after it
/// was first polled (a client left, a timeout fired), it has taken full
/// effect or none, and every key stays usable. An effect already on its way
/// (a command sent to a server, a record handed to a committer) may land
/// after the drop, as if only its answer had been lost; a claim nobody heard
/// of ends with its lease, and a holder's retried `complete` settles a
/// completion whose answer was lost. Each store's methods say what a drop
/// leaves behind; the conformance kit drops every operation after one poll
/// and at random points.
///
/// Stores are cheap to clone (a handle to shared state), so a guard or an
/// adapter can keep one per task.
pub trait Store: Send + Sync + 'static {
    /// Claims `key`: `Acquired` when absent, expired, or in progress with an
    /// expired lease (a takeover: new token, `attempts + 1`); `InProgress`
    /// while another holder's lease is live; `Completed` with the stored
    /// outcome; `Mismatch` when a live record has a different fingerprint.
    fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Stores the outcome and keeps the record for `retention`, if `token`
    /// holds a live lease on the key. Answers `Ok` again, changing nothing,
    /// when the record was already completed by this `token` (a retried
    /// call whose first answer was lost); otherwise `Stale` and nothing
    /// changes.
    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Deletes the record if `token` owns it, so that a redelivery runs again;
    /// otherwise `Stale`. The key's token counter is kept.
    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Deletes the record if it is `completed` by `token` and still within
    /// its retention, so that the key runs again on its next `begin`;
    /// otherwise `Stale` and nothing changes. The key's token counter is
    /// kept, as by `release`. Because a key's tokens only grow, a caller
    /// that read the record (with [`get`](Store::get)) and decided from its
    /// outcome reopens exactly that completion, never a later one. The
    /// consumer runner reopens a key it recorded as dead-lettered when an
    /// operator replays the dead letter (docs/contract.md §2).
    fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Pushes the lease out to `lease` from now if `token` owns the key, and
    /// returns the new expiry; otherwise `Stale`.
    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> impl Future<Output = Result<Fenced<Timestamp>, StoreError>> + Send;

    /// The record, for inspection. Expired completed records are absent.
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// `begin` for each item in one round trip; answers in order, as if the
    /// items had been begun one after another. A batch the store cannot
    /// take (input over a limit, no room) is refused whole.
    fn begin_many(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Result<Vec<Begin>, StoreError>> + Send;

    /// `complete` for each item in one round trip; answers in order, each as
    /// `complete` would.
    fn complete_many(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Result<Vec<Fenced>, StoreError>> + Send;

    /// Lists records of one namespace in key order, for operations: e.g.
    /// `in_progress` records older than an hour are stuck work.
    fn scan(
        &self,
        query: &ScanQuery,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send;

    /// The limits this store enforces.
    fn limits(&self) -> &Limits;
}

/// A store chosen at run time: itself a [`Store`].
pub type SharedStore = Arc<dyn DynStore>;

/// [`Store`] with boxed futures, for choosing a store at run time:
/// `Arc<dyn DynStore>` ([`SharedStore`]) is itself a `Store`. Import
/// `Store`, not this, to call the operations.
#[allow(missing_docs)]
pub trait DynStore: Send + Sync + 'static {
    fn begin<'a>(
        &'a self,
        key: &'a Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> BoxFuture<'a, Result<Begin, StoreError>>;
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>>;
    fn release<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>>;
    fn reopen<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>>;
    fn extend<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        lease: Lease,
    ) -> BoxFuture<'a, Result<Fenced<Timestamp>, StoreError>>;
    fn get<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
    fn begin_many<'a>(
        &'a self,
        items: &'a [BeginItem],
    ) -> BoxFuture<'a, Result<Vec<Begin>, StoreError>>;
    fn complete_many<'a>(
        &'a self,
        items: &'a [CompleteItem],
    ) -> BoxFuture<'a, Result<Vec<Fenced>, StoreError>>;
    fn scan<'a>(&'a self, query: &'a ScanQuery) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>>;
    fn limits(&self) -> &Limits;
}

impl<S: Store> DynStore for S {
    fn begin<'a>(
        &'a self,
        key: &'a Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> BoxFuture<'a, Result<Begin, StoreError>> {
        Box::pin(Store::begin(self, key, fingerprint, lease))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(Store::complete(self, key, token, outcome, retention))
    }
    fn release<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(Store::release(self, key, token))
    }
    fn reopen<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(Store::reopen(self, key, token))
    }
    fn extend<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        lease: Lease,
    ) -> BoxFuture<'a, Result<Fenced<Timestamp>, StoreError>> {
        Box::pin(Store::extend(self, key, token, lease))
    }
    fn get<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(Store::get(self, key))
    }
    fn begin_many<'a>(
        &'a self,
        items: &'a [BeginItem],
    ) -> BoxFuture<'a, Result<Vec<Begin>, StoreError>> {
        Box::pin(Store::begin_many(self, items))
    }
    fn complete_many<'a>(
        &'a self,
        items: &'a [CompleteItem],
    ) -> BoxFuture<'a, Result<Vec<Fenced>, StoreError>> {
        Box::pin(Store::complete_many(self, items))
    }
    fn scan<'a>(&'a self, query: &'a ScanQuery) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>> {
        Box::pin(Store::scan(self, query))
    }
    fn limits(&self) -> &Limits {
        Store::limits(self)
    }
}

/// The store behind a `dyn DynStore`, so that [`SharedStore`] (an `Arc` of
/// it) is a [`Store`] like any other shared store.
impl Store for dyn DynStore {
    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        DynStore::begin(self, key, fingerprint, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        DynStore::complete(self, key, token, outcome, retention).await
    }
    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        DynStore::release(self, key, token).await
    }
    async fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        DynStore::reopen(self, key, token).await
    }
    async fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        DynStore::extend(self, key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        DynStore::get(self, key).await
    }
    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        DynStore::begin_many(self, items).await
    }
    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        DynStore::complete_many(self, items).await
    }
    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        DynStore::scan(self, query).await
    }
    fn limits(&self) -> &Limits {
        DynStore::limits(self)
    }
}
