//! Fault injection: a store that can be switched to fail as an unreachable
//! one would, to test what callers do when the store is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_core::layer::StoreWrapper;
use idem_core::tier::{
    CompletedKey, FilterProbe, Handover, ImportItem, Imported, SharedFilter, SoleFront, Tier,
};
use idem_core::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Record,
    ScanQuery, Store, StoreError, Timestamp,
};

/// Wraps a store; while [`set_down`](Switchable::set_down) is on, every call
/// fails with [`StoreError::Unavailable`] before reaching it.
#[derive(Clone, Debug)]
pub struct Switchable<S> {
    inner: S,
    down: Arc<AtomicBool>,
    failing_completes: Arc<AtomicU32>,
    calls: Arc<Counts>,
}

/// How often each single-key operation was called on a [`Switchable`],
/// failed calls included.
#[derive(Debug, Default)]
pub struct Counts {
    /// `begin`.
    pub begin: AtomicU32,
    /// `complete`.
    pub complete: AtomicU32,
    /// `release`.
    pub release: AtomicU32,
    /// `extend`.
    pub extend: AtomicU32,
    /// `get`.
    pub get: AtomicU32,
    /// `import_many` (a [`Tier`]'s).
    pub import_many: AtomicU32,
}

impl Counts {
    fn count(n: &AtomicU32) {
        n.fetch_add(1, Ordering::SeqCst);
    }
}

impl<S: Store> Switchable<S> {
    /// Wraps `inner`, up.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            down: Arc::default(),
            failing_completes: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// How often each operation has been called so far.
    pub fn calls(&self) -> &Counts {
        &self.calls
    }

    /// Makes the next `n` calls of `complete` fail as an unreachable store
    /// would (a transient failure), before reaching the store.
    pub fn fail_next_completes(&self, n: u32) {
        self.failing_completes.store(n, Ordering::SeqCst);
    }

    /// Takes the store down (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("the store is switched off"));
        }
        Ok(())
    }
}

impl<S: Store> StoreWrapper for Switchable<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        Counts::count(&self.calls.begin);
        self.check()?;
        self.inner.begin(key, fingerprint, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        Counts::count(&self.calls.complete);
        self.check()?;
        let failing =
            self.failing_completes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(StoreError::unavailable("complete failed (injected)"));
        }
        self.inner.complete(key, token, outcome, retention).await
    }
    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        Counts::count(&self.calls.release);
        self.check()?;
        self.inner.release(key, token).await
    }
    async fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.check()?;
        self.inner.reopen(key, token).await
    }
    async fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        Counts::count(&self.calls.extend);
        self.check()?;
        self.inner.extend(key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        Counts::count(&self.calls.get);
        self.check()?;
        self.inner.get(key).await
    }
    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        self.check()?;
        self.inner.begin_many(items).await
    }
    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.check()?;
        self.inner.complete_many(items).await
    }
    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        self.check()?;
        self.inner.scan(query).await
    }
}

/// A switchable tier fails as its store would when down.
impl<S: Tier> Tier for Switchable<S> {
    const VOLATILE: bool = S::VOLATILE;

    async fn import_many(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        Counts::count(&self.calls.import_many);
        self.check()?;
        self.inner.import_many(items).await
    }

    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        self.check()?;
        self.inner.raise_token_floor(floor).await
    }

    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        self.check()?;
        self.inner.token_high_water().await
    }

    async fn record_high_water(&self, token: FencingToken) -> Result<(), StoreError> {
        self.check()?;
        self.inner.record_high_water(token).await
    }

    async fn hold_sole_front(&self) -> Result<SoleFront, StoreError> {
        self.check()?;
        self.inner.hold_sole_front().await
    }

    const KEEPS_HANDOVERS: bool = S::KEEPS_HANDOVERS;

    const SHARES_FILTER: bool = S::SHARES_FILTER;

    async fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        self.check()?;
        self.inner.latest_expiry().await
    }

    async fn agree_filter(&self, proposed: &SharedFilter) -> Result<SharedFilter, StoreError> {
        self.check()?;
        self.inner.agree_filter(proposed).await
    }

    async fn filter_insert(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<(), StoreError> {
        self.check()?;
        self.inner.filter_insert(filter, probes).await
    }

    async fn filter_check(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<Vec<bool>, StoreError> {
        self.check()?;
        self.inner.filter_check(filter, probes).await
    }

    async fn filter_ready(&self, filter: &SharedFilter) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.filter_ready(filter).await
    }

    async fn filter_mark_ready(&self, filter: &SharedFilter) -> Result<(), StoreError> {
        self.check()?;
        self.inner.filter_mark_ready(filter).await
    }

    async fn filter_rebuild_lease(
        &self,
        filter: &SharedFilter,
        holder: &str,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.filter_rebuild_lease(filter, holder, hold).await
    }

    async fn shorten(&self, items: &[Handover], keep: Duration) -> Result<(), StoreError> {
        self.check()?;
        self.inner.shorten(items, keep).await
    }

    async fn list_handovers(&self, list: &str, items: &[Handover]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.list_handovers(list, items).await
    }

    async fn due_handovers(
        &self,
        list: &str,
        listed_for: Duration,
        limit: usize,
    ) -> Result<Vec<Handover>, StoreError> {
        self.check()?;
        self.inner.due_handovers(list, listed_for, limit).await
    }

    async fn unlist_handovers(&self, list: &str, items: &[Handover]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.unlist_handovers(list, items).await
    }

    async fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Option<Vec<CompletedKey>>, StoreError> {
        self.check()?;
        self.inner.completed_since(since, after, limit).await
    }

    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.check()?;
        self.inner.completed_keys(after, limit).await
    }
}
