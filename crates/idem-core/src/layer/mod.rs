//! Store layers: a store wrapped in another that adds one concern (limits,
//! metrics, tracing, fault injection, a tier in front) and forwards the
//! rest, in the spirit of `tower::Layer`.
//!
//! A wrapper implements [`StoreWrapper`]: it names the store it wraps and
//! overrides only the operations it changes; every other operation goes
//! straight through, and the wrapper is a [`Store`] by that alone. A
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
