//! Prometheus-style metrics for every store operation.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::{Counter, Histogram};

use super::{StoreLayer, StoreWrapper};
use crate::{
    Begin, BeginItem, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key, Lease, Record,
    ScanQuery, Store, StoreError, Timestamp,
};

/// The operations, in the order of [`Handles`]' arrays.
const OPERATIONS: [&str; 8] = [
    "begin",
    "complete",
    "release",
    "extend",
    "get",
    "begin_many",
    "complete_many",
    "scan",
];
const BEGIN: usize = 0;
const COMPLETE: usize = 1;
const RELEASE: usize = 2;
const EXTEND: usize = 3;
const GET: usize = 4;
const BEGIN_MANY: usize = 5;
const COMPLETE_MANY: usize = 6;
const SCAN: usize = 7;

/// How a call ended, in the order of [`Handles`]' arrays.
const OUTCOMES: [&str; 4] = ["ok", "stale", "refused", "failed"];

/// The metric handles, made once: looking a metric up by name and labels
/// on every call would cost more than many a store operation.
struct Handles {
    calls: [[Counter; OUTCOMES.len()]; OPERATIONS.len()],
    seconds: [Histogram; OPERATIONS.len()],
}

/// Counts each operation by how it ended and times it:
/// `idem_store_calls_total{store, operation, outcome}` (`outcome` is `ok`,
/// `stale` for a fenced call whose token no longer owns the key, `refused`
/// for input over a limit, `failed` for a store error) and
/// `idem_store_call_seconds{store, operation}`.
///
/// A call dropped before it finished is counted nowhere.
#[derive(Clone)]
pub struct Measured<S> {
    inner: S,
    handles: Arc<Handles>,
}

impl<S: Store> Measured<S> {
    /// Measures `inner`, labelled `store="name"`.
    pub fn new(inner: S, name: &str) -> Self {
        let name: Arc<str> = name.into();
        let handles = Handles {
            calls: OPERATIONS.map(|op| {
                OUTCOMES.map(|outcome| {
                    metrics::counter!("idem_store_calls_total", "store" => name.to_string(), "operation" => op, "outcome" => outcome)
                })
            }),
            seconds: OPERATIONS.map(|op| {
                metrics::histogram!("idem_store_call_seconds", "store" => name.to_string(), "operation" => op)
            }),
        };
        Self {
            inner,
            handles: Arc::new(handles),
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
        self.handles.seconds[op].record(start.elapsed());
        let outcome = match &answer {
            Ok(v) if stale(v) => 1,
            Ok(_) => 0,
            Err(StoreError::Invalid(_)) => 2,
            Err(_) => 3,
        };
        self.handles.calls[op][outcome].increment(1);
        answer
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

/// Wraps a store in [`Measured`].
#[derive(Clone, Debug)]
pub struct Measure(Arc<str>);

impl Measure {
    /// Labels the metrics `store="name"` (a name you chose, such as the
    /// store's kind or role: `redis`, `hot`).
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
