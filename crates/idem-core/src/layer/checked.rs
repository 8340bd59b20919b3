//! The limits every store enforces, checked once for all of them.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use super::{StoreLayer, StoreWrapper};
use crate::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Record,
    ScanQuery, Store, StoreError, Timestamp,
};

/// Refuses input beyond the wrapped store's [`Limits`](crate::Limits) before the store
/// sees it, so a refused call changes nothing (docs/contract.md §2). Each
/// store is built as `Checked` around its own operations, so the checks
/// are written once for all of them.
#[derive(Clone, Debug)]
pub struct Checked<S> {
    inner: S,
}

impl<S: Store> Checked<S> {
    /// Checks calls to `inner` against `inner`'s limits.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: Store> StoreWrapper for Checked<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let checked = self.inner.limits().check_begin(key, lease);
        async move {
            checked?;
            self.inner.begin(key, fingerprint, lease).await
        }
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let checked = self
            .inner
            .limits()
            .check_complete(key, outcome.as_ref(), retention);
        async move {
            checked?;
            self.inner.complete(key, token, outcome, retention).await
        }
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let checked = self.inner.limits().check_key(key);
        async move {
            checked?;
            self.inner.release(key, token).await
        }
    }

    fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let checked = self.inner.limits().check_key(key);
        async move {
            checked?;
            self.inner.reopen(key, token).await
        }
    }

    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> impl Future<Output = Result<Fenced<Timestamp>, StoreError>> + Send {
        let checked = self.inner.limits().check_begin(key, lease);
        async move {
            checked?;
            self.inner.extend(key, token, lease).await
        }
    }

    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        let checked = self.inner.limits().check_key(key);
        async move {
            checked?;
            self.inner.get(key).await
        }
    }

    fn begin_many(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Result<Vec<Begin>, StoreError>> + Send {
        let checked = self.inner.limits().check_begin_items(items);
        async move {
            checked?;
            self.inner.begin_many(items).await
        }
    }

    fn complete_many(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Result<Vec<Fenced>, StoreError>> + Send {
        let checked = self.inner.limits().check_complete_items(items);
        async move {
            checked?;
            self.inner.complete_many(items).await
        }
    }

    fn scan(
        &self,
        query: &ScanQuery,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        self.inner.scan(query)
    }
}

/// Wraps a store in [`Checked`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckLimits;

impl<S: Store> StoreLayer<S> for CheckLimits {
    type Store = Checked<S>;

    fn layer(&self, inner: S) -> Checked<S> {
        Checked::new(inner)
    }
}
