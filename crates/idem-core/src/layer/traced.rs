//! A `tracing` span around every store operation.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::Instrument;

use super::{StoreLayer, StoreWrapper, TierOperation, TierWrapper};
use crate::tier::Tier;
use crate::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Record,
    ScanQuery, Store, StoreError, Timestamp,
};

/// Runs each operation in a debug-level span named `store` with its
/// `operation`, its `key` (escaped: a key's bytes are untrusted and never
/// reach a log line raw) or batch `items`, and, once it ends, its
/// `outcome` class: `ok`, `stale` (a fenced call whose token no longer owns
/// the key), `refused` (input over a limit) or `failed` (a store error,
/// also logged at debug level inside the span). Never an outcome's bytes.
///
/// A store traced as a tier of a tiered store ([`Traced::in_tier`]) adds
/// its `tier` (`hot`, `cold`) to each span, and traces its [`Tier`]
/// operations as well (`operation` is `import_many`, `shorten`, …). A
/// store traced with [`Traced::new`] has no `tier` field, and the tier
/// operations of such a store go through untraced.
#[derive(Clone, Debug)]
pub struct Traced<S> {
    inner: S,
    tier: Option<Arc<str>>,
}

impl<S: Store> Traced<S> {
    /// Traces calls to `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner, tier: None }
    }

    /// Traces calls to `inner`, the `tier` tier of a tiered store (`hot`,
    /// `cold`): its store operations and its tier operations.
    pub fn in_tier(inner: S, tier: &str) -> Self {
        Self {
            inner,
            tier: Some(tier.into()),
        }
    }

    /// The `tier` field of this store's spans: none outside a tiered store.
    fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }
}

async fn logged<T>(
    call: impl Future<Output = Result<T, StoreError>>,
    stale: impl FnOnce(&T) -> bool,
) -> Result<T, StoreError> {
    let answer = call.await;
    let span = tracing::Span::current();
    let outcome = match &answer {
        Ok(v) if stale(v) => "stale",
        Ok(_) => "ok",
        Err(StoreError::Invalid(_)) => "refused",
        Err(_) => "failed",
    };
    span.record("outcome", outcome);
    if let Err(e) = &answer {
        tracing::debug!(error = %e, "store call failed");
    }
    answer
}

fn never<T>(_: &T) -> bool {
    false
}

impl<S: Store> StoreWrapper for Traced<S> {
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
        let span = tracing::debug_span!("store", operation = "begin", tier = self.tier(), %key, outcome = tracing::field::Empty);
        logged(self.inner.begin(key, fingerprint, lease), never).instrument(span)
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let span = tracing::debug_span!("store", operation = "complete", tier = self.tier(), %key, token = token.get(), outcome = tracing::field::Empty);
        logged(
            self.inner.complete(key, token, outcome, retention),
            Fenced::is_stale,
        )
        .instrument(span)
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let span = tracing::debug_span!("store", operation = "release", tier = self.tier(), %key, token = token.get(), outcome = tracing::field::Empty);
        logged(self.inner.release(key, token), Fenced::is_stale).instrument(span)
    }

    fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let span = tracing::debug_span!("store", operation = "reopen", tier = self.tier(), %key, token = token.get(), outcome = tracing::field::Empty);
        logged(self.inner.reopen(key, token), Fenced::is_stale).instrument(span)
    }

    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> impl Future<Output = Result<Fenced<Timestamp>, StoreError>> + Send {
        let span = tracing::debug_span!("store", operation = "extend", tier = self.tier(), %key, token = token.get(), outcome = tracing::field::Empty);
        logged(self.inner.extend(key, token, lease), Fenced::is_stale).instrument(span)
    }

    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        let span = tracing::debug_span!("store", operation = "get", tier = self.tier(), %key, outcome = tracing::field::Empty);
        logged(self.inner.get(key), never).instrument(span)
    }

    fn begin_many(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Result<Vec<Begin>, StoreError>> + Send {
        let span = tracing::debug_span!(
            "store",
            operation = "begin_many",
            tier = self.tier(),
            items = items.len(),
            outcome = tracing::field::Empty
        );
        logged(self.inner.begin_many(items), never).instrument(span)
    }

    fn complete_many(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Result<Vec<Fenced>, StoreError>> + Send {
        let span = tracing::debug_span!(
            "store",
            operation = "complete_many",
            tier = self.tier(),
            items = items.len(),
            outcome = tracing::field::Empty
        );
        logged(self.inner.complete_many(items), never).instrument(span)
    }

    fn scan(
        &self,
        query: &ScanQuery,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        let span = tracing::debug_span!("store", operation = "scan", tier = self.tier(), namespace = %query.namespace, outcome = tracing::field::Empty);
        logged(self.inner.scan(query), never).instrument(span)
    }
}

/// A traced tier traces its tier operations too, when it was traced as a
/// tier ([`Traced::in_tier`]).
impl<S: Tier> TierWrapper for Traced<S> {
    async fn around<T: Send>(
        &self,
        operation: TierOperation,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let Some(tier) = self.tier() else {
            return call.await;
        };
        let span = tracing::debug_span!(
            "store",
            operation = operation.name(),
            tier,
            outcome = tracing::field::Empty
        );
        logged(call, never).instrument(span).await
    }
}

/// Wraps a store in [`Traced`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Trace;

impl<S: Store> StoreLayer<S> for Trace {
    type Store = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced::new(inner)
    }
}
