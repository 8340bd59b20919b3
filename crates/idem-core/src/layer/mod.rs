//! Store layers: a store wrapped in another that adds one concern (limits,
//! metrics, tracing, fault injection, a tier in front) and forwards the
//! rest, in the spirit of `tower::Layer`.
//!
//! A wrapper implements [`StoreWrapper`]: it names the store it wraps and
//! overrides only the operations it changes; every other operation goes
//! straight through, and the wrapper is a [`Store`] by that alone. A
//! wrapper that also implements [`TierWrapper`] is a [`Tier`] when the
//! store it wraps is one: [`Measured`] and [`Traced`] around each tier of a
//! tiered store tell its hot tier's calls from its cold tier's. A
//! [`StoreLayer`] builds the wrapper around any store, so layers stack:
//!
//! ```
//! use idem_core::layer::{Measure, StoreExt, Trace};
//! use idem_core::{MemoryStore, SharedStore};
//!
//! let store: SharedStore = MemoryStore::new()
//!     .layer(Trace)
//!     .layer(Measure::named("orders"))
//!     .shared();
//! ```
//!
//! # Cancel safety
//!
//! A layer adds no await point of its own between the checks it makes and
//! the call it forwards, so each operation is as cancellation-safe as the
//! wrapped store's (see [`Store`]).

mod checked;
mod measured;
mod traced;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use checked::{CheckLimits, Checked};
pub use measured::{Measure, Measured};
pub use traced::{Trace, Traced};

use crate::tier::{
    CompletedKey, FilterProbe, Handover, ImportItem, Imported, SharedFilter, SoleFront, Tier,
};
use crate::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Limits,
    Record, ScanQuery, SharedStore, Store, StoreError, Timestamp,
};

/// A store built around another: every operation it does not override is
/// forwarded to [`inner`](StoreWrapper::inner), and every `StoreWrapper` is
/// a [`Store`].
///
/// ```
/// use idem_core::layer::StoreWrapper;
/// use idem_core::{Begin, Fingerprint, Key, Lease, MemoryStore, StoreError};
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// /// Counts claims; everything else goes straight through.
/// struct CountBegins<S> { inner: S, begins: AtomicU64 }
///
/// impl<S: idem_core::Store> StoreWrapper for CountBegins<S> {
///     type Inner = S;
///     fn inner(&self) -> &S { &self.inner }
///     async fn begin(&self, key: &Key, fingerprint: Option<Fingerprint>, lease: Lease)
///         -> Result<Begin, StoreError> {
///         self.begins.fetch_add(1, Ordering::Relaxed);
///         self.inner.begin(key, fingerprint, lease).await
///     }
/// }
/// ```
pub trait StoreWrapper: Send + Sync + 'static {
    /// The wrapped store.
    type Inner: Store + ?Sized;

    /// The wrapped store.
    fn inner(&self) -> &Self::Inner;

    /// [`Store::begin`].
    fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        self.inner().begin(key, fingerprint, lease)
    }

    /// [`Store::complete`].
    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        self.inner().complete(key, token, outcome, retention)
    }

    /// [`Store::release`].
    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        self.inner().release(key, token)
    }

    /// [`Store::reopen`].
    fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        self.inner().reopen(key, token)
    }

    /// [`Store::extend`].
    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> impl Future<Output = Result<Fenced<Timestamp>, StoreError>> + Send {
        self.inner().extend(key, token, lease)
    }

    /// [`Store::get`].
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        self.inner().get(key)
    }

    /// [`Store::begin_many`].
    fn begin_many(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Result<Vec<Begin>, StoreError>> + Send {
        self.inner().begin_many(items)
    }

    /// [`Store::complete_many`].
    fn complete_many(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Result<Vec<Fenced>, StoreError>> + Send {
        self.inner().complete_many(items)
    }

    /// [`Store::scan`].
    fn scan(
        &self,
        query: &ScanQuery,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        self.inner().scan(query)
    }

    /// [`Store::limits`].
    fn limits(&self) -> &Limits {
        self.inner().limits()
    }
}

impl<W: StoreWrapper> Store for W {
    fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        StoreWrapper::begin(self, key, fingerprint, lease)
    }
    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        StoreWrapper::complete(self, key, token, outcome, retention)
    }
    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        StoreWrapper::release(self, key, token)
    }
    fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        StoreWrapper::reopen(self, key, token)
    }
    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> impl Future<Output = Result<Fenced<Timestamp>, StoreError>> + Send {
        StoreWrapper::extend(self, key, token, lease)
    }
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        StoreWrapper::get(self, key)
    }
    fn begin_many(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Result<Vec<Begin>, StoreError>> + Send {
        StoreWrapper::begin_many(self, items)
    }
    fn complete_many(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Result<Vec<Fenced>, StoreError>> + Send {
        StoreWrapper::complete_many(self, items)
    }
    fn scan(
        &self,
        query: &ScanQuery,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        StoreWrapper::scan(self, query)
    }
    fn limits(&self) -> &Limits {
        StoreWrapper::limits(self)
    }
}

/// A shared store is the store it points to.
impl<S: Store + ?Sized> StoreWrapper for Arc<S> {
    type Inner = S;
    fn inner(&self) -> &S {
        self
    }
}

/// The operations of [`Tier`], as a [`TierWrapper`] sees them go by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TierOperation {
    /// [`Tier::import_many`].
    ImportMany,
    /// [`Tier::raise_token_floor`].
    RaiseTokenFloor,
    /// [`Tier::record_high_water`].
    RecordHighWater,
    /// [`Tier::token_high_water`].
    TokenHighWater,
    /// [`Tier::shorten`].
    Shorten,
    /// [`Tier::list_handovers`].
    ListHandovers,
    /// [`Tier::due_handovers`].
    DueHandovers,
    /// [`Tier::unlist_handovers`].
    UnlistHandovers,
    /// [`Tier::agree_filter`].
    AgreeFilter,
    /// [`Tier::filter_insert`].
    FilterInsert,
    /// [`Tier::filter_check`].
    FilterCheck,
    /// [`Tier::filter_ready`].
    FilterReady,
    /// [`Tier::filter_mark_ready`].
    FilterMarkReady,
    /// [`Tier::filter_rebuild_lease`].
    FilterRebuildLease,
    /// [`Tier::hold_sole_front`].
    HoldSoleFront,
    /// [`Tier::latest_expiry`].
    LatestExpiry,
    /// [`Tier::completed_since`].
    CompletedSince,
    /// [`Tier::completed_keys`].
    CompletedKeys,
}

impl TierOperation {
    /// Every tier operation, in declaration order.
    pub const ALL: [TierOperation; 18] = [
        Self::ImportMany,
        Self::RaiseTokenFloor,
        Self::RecordHighWater,
        Self::TokenHighWater,
        Self::Shorten,
        Self::ListHandovers,
        Self::DueHandovers,
        Self::UnlistHandovers,
        Self::AgreeFilter,
        Self::FilterInsert,
        Self::FilterCheck,
        Self::FilterReady,
        Self::FilterMarkReady,
        Self::FilterRebuildLease,
        Self::HoldSoleFront,
        Self::LatestExpiry,
        Self::CompletedSince,
        Self::CompletedKeys,
    ];

    /// The method's name: `import_many`, `shorten`, … (the `operation`
    /// label of a measured tier's calls).
    pub fn name(self) -> &'static str {
        match self {
            Self::ImportMany => "import_many",
            Self::RaiseTokenFloor => "raise_token_floor",
            Self::RecordHighWater => "record_high_water",
            Self::TokenHighWater => "token_high_water",
            Self::Shorten => "shorten",
            Self::ListHandovers => "list_handovers",
            Self::DueHandovers => "due_handovers",
            Self::UnlistHandovers => "unlist_handovers",
            Self::AgreeFilter => "agree_filter",
            Self::FilterInsert => "filter_insert",
            Self::FilterCheck => "filter_check",
            Self::FilterReady => "filter_ready",
            Self::FilterMarkReady => "filter_mark_ready",
            Self::FilterRebuildLease => "filter_rebuild_lease",
            Self::HoldSoleFront => "hold_sole_front",
            Self::LatestExpiry => "latest_expiry",
            Self::CompletedSince => "completed_since",
            Self::CompletedKeys => "completed_keys",
        }
    }
}

/// A [`StoreWrapper`] around a [`Tier`] is a tier too: every tier
/// operation goes to the wrapped tier, by way of
/// [`around`](TierWrapper::around), and the capabilities
/// ([`VOLATILE`](Tier::VOLATILE), [`KEEPS_HANDOVERS`](Tier::KEEPS_HANDOVERS),
/// [`SHARES_FILTER`](Tier::SHARES_FILTER)) are the wrapped tier's. None of
/// `Tier`'s default bodies stands in for the wrapped tier's own methods: a
/// wrapped tier does what the bare one does.
///
/// ```
/// use idem_core::layer::{Measured, Traced};
/// use idem_core::tier::Tier;
/// use idem_core::MemoryStore;
///
/// let hot = Traced::in_tier(Measured::in_tier(MemoryStore::new(), "memory", "hot"), "hot");
/// assert!(<Traced<Measured<MemoryStore>> as Tier>::VOLATILE);
/// # let _ = hot;
/// ```
pub trait TierWrapper: StoreWrapper<Inner: Tier> {
    /// Runs `call`, the wrapped tier's `operation`; by default, just that.
    fn around<T: Send>(
        &self,
        operation: TierOperation,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        let _ = operation;
        call
    }
}

impl<W: TierWrapper> Tier for W {
    const VOLATILE: bool = <W::Inner as Tier>::VOLATILE;
    const KEEPS_HANDOVERS: bool = <W::Inner as Tier>::KEEPS_HANDOVERS;
    const SHARES_FILTER: bool = <W::Inner as Tier>::SHARES_FILTER;

    fn import_many(
        &self,
        items: &[ImportItem],
    ) -> impl Future<Output = Result<Vec<Imported>, StoreError>> + Send {
        self.around(TierOperation::ImportMany, self.inner().import_many(items))
    }
    fn raise_token_floor(
        &self,
        floor: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let call = self.inner().raise_token_floor(floor);
        self.around(TierOperation::RaiseTokenFloor, call)
    }
    fn record_high_water(
        &self,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let call = self.inner().record_high_water(token);
        self.around(TierOperation::RecordHighWater, call)
    }
    fn token_high_water(&self) -> impl Future<Output = Result<FencingToken, StoreError>> + Send {
        let call = self.inner().token_high_water();
        self.around(TierOperation::TokenHighWater, call)
    }
    fn shorten(
        &self,
        items: &[Handover],
        keep: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.around(TierOperation::Shorten, self.inner().shorten(items, keep))
    }
    fn list_handovers(
        &self,
        list: &str,
        items: &[Handover],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let call = self.inner().list_handovers(list, items);
        self.around(TierOperation::ListHandovers, call)
    }
    fn due_handovers(
        &self,
        list: &str,
        listed_for: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Handover>, StoreError>> + Send {
        let call = self.inner().due_handovers(list, listed_for, limit);
        self.around(TierOperation::DueHandovers, call)
    }
    fn unlist_handovers(
        &self,
        list: &str,
        items: &[Handover],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let call = self.inner().unlist_handovers(list, items);
        self.around(TierOperation::UnlistHandovers, call)
    }
    fn agree_filter(
        &self,
        proposed: &SharedFilter,
    ) -> impl Future<Output = Result<SharedFilter, StoreError>> + Send {
        let call = self.inner().agree_filter(proposed);
        self.around(TierOperation::AgreeFilter, call)
    }
    fn filter_insert(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let call = self.inner().filter_insert(filter, probes);
        self.around(TierOperation::FilterInsert, call)
    }
    fn filter_check(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        let call = self.inner().filter_check(filter, probes);
        self.around(TierOperation::FilterCheck, call)
    }
    fn filter_ready(
        &self,
        filter: &SharedFilter,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let call = self.inner().filter_ready(filter);
        self.around(TierOperation::FilterReady, call)
    }
    fn filter_mark_ready(
        &self,
        filter: &SharedFilter,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let call = self.inner().filter_mark_ready(filter);
        self.around(TierOperation::FilterMarkReady, call)
    }
    fn filter_rebuild_lease(
        &self,
        filter: &SharedFilter,
        holder: &str,
        hold: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let call = self.inner().filter_rebuild_lease(filter, holder, hold);
        self.around(TierOperation::FilterRebuildLease, call)
    }
    fn hold_sole_front(&self) -> impl Future<Output = Result<SoleFront, StoreError>> + Send {
        let call = self.inner().hold_sole_front();
        self.around(TierOperation::HoldSoleFront, call)
    }
    fn latest_expiry(&self) -> impl Future<Output = Result<Option<Timestamp>, StoreError>> + Send {
        let call = self.inner().latest_expiry();
        self.around(TierOperation::LatestExpiry, call)
    }
    fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Option<Vec<CompletedKey>>, StoreError>> + Send {
        let call = self.inner().completed_since(since, after, limit);
        self.around(TierOperation::CompletedSince, call)
    }
    fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Key>, StoreError>> + Send {
        let call = self.inner().completed_keys(after, limit);
        self.around(TierOperation::CompletedKeys, call)
    }
}

/// Builds a wrapper around a store: `tower::Layer` for stores.
pub trait StoreLayer<S> {
    /// The wrapped store.
    type Store: Store;

    /// Wraps `inner`.
    fn layer(&self, inner: S) -> Self::Store;
}

/// Layers applied to stores.
pub trait StoreExt: Store + Sized {
    /// `layer.layer(self)`: wraps this store. In a chain of these, the
    /// layer added last is the one a call meets first.
    fn layer<L: StoreLayer<Self>>(self, layer: L) -> L::Store {
        layer.layer(self)
    }

    /// This store, chosen at run time: a [`SharedStore`].
    fn shared(self) -> SharedStore {
        Arc::new(self)
    }
}

impl<S: Store> StoreExt for S {}

#[cfg(test)]
mod tests {
    use super::TierOperation;

    #[test]
    fn every_tier_operation_is_listed_once_in_declaration_order() {
        for (n, op) in TierOperation::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, n, "{op:?}");
        }
    }
}
