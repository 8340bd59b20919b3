//! Prometheus-style metrics for every store operation.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::{Counter, Histogram, Label};

use super::{StoreLayer, StoreWrapper, TierOperation, TierWrapper};
use crate::tier::Tier;
use crate::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Record,
    ScanQuery, Store, StoreError, Timestamp,
};

/// The store operations, in the order of [`Handles`]' arrays.
const OPERATIONS: [&str; 9] = [
    "begin",
    "complete",
    "release",
    "extend",
    "get",
    "begin_many",
    "complete_many",
    "scan",
    "reopen",
];
const BEGIN: usize = 0;
const COMPLETE: usize = 1;
const RELEASE: usize = 2;
const EXTEND: usize = 3;
const GET: usize = 4;
const BEGIN_MANY: usize = 5;
const COMPLETE_MANY: usize = 6;
const SCAN: usize = 7;
const REOPEN: usize = 8;

/// How a call ended, in the order of [`Handles`]' arrays.
const OUTCOMES: [&str; 4] = ["ok", "stale", "refused", "failed"];

/// The metric handles of `N` operations, made once: looking a metric up by
/// name and labels on every call would cost more than many a store
/// operation.
struct Handles<const N: usize> {
    calls: [[Counter; OUTCOMES.len()]; N],
    seconds: [Histogram; N],
}

impl<const N: usize> Handles<N> {
    /// The handles of `operations`, each labelled `labels` first.
    fn new(operations: [&'static str; N], labels: &[Label]) -> Self {
        let with = |more: &[Label]| -> Vec<Label> { labels.iter().chain(more).cloned().collect() };
        Self {
            calls: operations.map(|op| {
                OUTCOMES.map(|outcome| {
                    let labels =
                        with(&[Label::new("operation", op), Label::new("outcome", outcome)]);
                    metrics::counter!("idem_store_calls_total", labels)
                })
            }),
            seconds: operations.map(|op| {
                let labels = with(&[Label::new("operation", op)]);
                metrics::histogram!("idem_store_call_seconds", labels)
            }),
        }
    }

    async fn timed<T>(
        &self,
        op: usize,
        call: impl Future<Output = Result<T, StoreError>>,
        stale: impl FnOnce(&T) -> bool,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let answer = call.await;
        self.seconds[op].record(start.elapsed());
        let outcome = match &answer {
            Ok(v) if stale(v) => 1,
            Ok(_) => 0,
            Err(StoreError::Invalid(_)) => 2,
            Err(_) => 3,
        };
        self.calls[op][outcome].increment(1);
        answer
    }
}

/// The handles of a measured store: its store operations', and, for a
/// store measured as a tier, its tier operations'.
struct Meters {
    store: Handles<{ OPERATIONS.len() }>,
    tier: Option<Handles<{ TierOperation::ALL.len() }>>,
}

/// Counts each operation by how it ended and times it:
/// `idem_store_calls_total{store, operation, outcome}` (`outcome` is `ok`,
/// `stale` for a fenced call whose token no longer owns the key, `refused`
/// for input over a limit, `failed` for a store error) and
/// `idem_store_call_seconds{store, operation}`.
///
/// A store measured as a tier of a tiered store ([`Measured::in_tier`])
/// carries a `tier` label as well (`tier="hot"`, `tier="cold"`), and its
/// [`Tier`] operations are counted and timed too (`operation` is
/// `import_many`, `shorten`, …: [`TierOperation::name`]). A store measured
/// with [`Measured::new`] has no `tier` label, and the tier operations of
/// such a store go through uncounted.
///
/// A call dropped before it finished is counted nowhere.
#[derive(Clone)]
pub struct Measured<S> {
    inner: S,
    meters: Arc<Meters>,
}

impl<S: Store> Measured<S> {
    /// Measures `inner`, labelled `store="name"`.
    pub fn new(inner: S, name: &str) -> Self {
        let labels = [Label::new("store", name.to_owned())];
        Self {
            inner,
            meters: Arc::new(Meters {
                store: Handles::new(OPERATIONS, &labels),
                tier: None,
            }),
        }
    }

    /// Measures `inner` as the `tier` tier of a tiered store (`hot`,
    /// `cold`), labelled `store="name", tier="tier"`: its store operations
    /// and its tier operations.
    pub fn in_tier(inner: S, name: &str, tier: &str) -> Self {
        let labels = [
            Label::new("store", name.to_owned()),
            Label::new("tier", tier.to_owned()),
        ];
        Self {
            inner,
            meters: Arc::new(Meters {
                store: Handles::new(OPERATIONS, &labels),
                tier: Some(Handles::new(
                    TierOperation::ALL.map(TierOperation::name),
                    &labels,
                )),
            }),
        }
    }

    fn timed<T>(
        &self,
        op: usize,
        call: impl Future<Output = Result<T, StoreError>>,
        stale: impl FnOnce(&T) -> bool,
    ) -> impl Future<Output = Result<T, StoreError>> {
        self.meters.store.timed(op, call, stale)
    }
}

fn never<T>(_: &T) -> bool {
    false
}

impl<S: Store> StoreWrapper for Measured<S> {
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
        self.timed(BEGIN, self.inner.begin(key, fingerprint, lease), never)
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        let call = self.inner.complete(key, token, outcome, retention);
        self.timed(COMPLETE, call, Fenced::is_stale)
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        self.timed(RELEASE, self.inner.release(key, token), Fenced::is_stale)
    }

    fn reopen(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send {
        self.timed(REOPEN, self.inner.reopen(key, token), Fenced::is_stale)
    }

    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> impl Future<Output = Result<Fenced<Timestamp>, StoreError>> + Send {
        let call = self.inner.extend(key, token, lease);
        self.timed(EXTEND, call, Fenced::is_stale)
    }

    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        self.timed(GET, self.inner.get(key), never)
    }

    fn begin_many(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Result<Vec<Begin>, StoreError>> + Send {
        self.timed(BEGIN_MANY, self.inner.begin_many(items), never)
    }

    fn complete_many(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Result<Vec<Fenced>, StoreError>> + Send {
        self.timed(COMPLETE_MANY, self.inner.complete_many(items), never)
    }

    fn scan(
        &self,
        query: &ScanQuery,
    ) -> impl Future<Output = Result<Vec<Entry>, StoreError>> + Send {
        self.timed(SCAN, self.inner.scan(query), never)
    }
}

/// A measured tier counts and times its tier operations too, when it was
/// measured as a tier ([`Measured::in_tier`]).
impl<S: Tier> TierWrapper for Measured<S> {
    async fn around<T: Send>(
        &self,
        operation: TierOperation,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        match &self.meters.tier {
            Some(tier) => tier.timed(operation as usize, call, never).await,
            None => call.await,
        }
    }
}

/// Wraps a store in [`Measured`].
#[derive(Clone, Debug)]
pub struct Measure(Arc<str>);

impl Measure {
    /// Labels the metrics `store="name"` (a name you chose, such as the
    /// store's kind: `redis`, `file`). A tier of a tiered store is
    /// measured with [`Measured::in_tier`].
    pub fn named(name: &str) -> Self {
        Self(name.into())
    }
}

impl<S: Store> StoreLayer<S> for Measure {
    type Store = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured::new(inner, &self.0)
    }
}
