//! Helpers for testing a [`Source`] against a real broker (feature
//! `test-util`): a handler that records what it did, a runner started and
//! stopped, a consumer that dies mid-handler, and waits.
//!
//! Every broker crate's tests use these, so that each adapter is held to the
//! same checks the same way.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idem_core::{ClaimHandle, Guard, Lease, MemoryStore, Store};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{Handler, HandlerError, Message, Report, Runner, Source};

/// The claim a handler is given, under a shorter name for test handlers.
pub type Claim = ClaimHandle;

/// A name no other test, nor another run, uses: queues, streams, topics
/// and groups outlive a test on a shared broker.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits until `check` answers true, polling every 50 ms.
///
/// # Panics
///
/// After `limit`, naming `what` it waited for.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {limit:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A message's header as text (empty when absent).
pub fn header(m: &Message, name: &str) -> String {
    m.header(name)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// A handler's empty success.
pub fn done() -> Result<Bytes, HandlerError> {
    Ok(Bytes::new())
}

/// A guard on a fresh memory store with `lease`.
pub fn guard(lease: Duration) -> Guard<MemoryStore> {
    Guard::new(MemoryStore::new()).lease(Lease::new(lease))
}

/// What a handler did, per key: its calls, the attempt of each, when the
/// first began, and the effects it applied. Clones share one record.
#[derive(Clone, Default)]
pub struct Effects {
    inner: Arc<Mutex<Record>>,
}

#[derive(Default)]
struct Record {
    calls: HashMap<String, u32>,
    applied: HashMap<String, u32>,
    attempts: HashMap<String, Vec<u32>>,
    started: HashMap<String, tokio::time::Instant>,
}

impl Effects {
    /// Records a handler call for `key` at `attempt`.
    pub fn called(&self, key: &str, attempt: u32) {
        let mut r = self.inner.lock();
        *r.calls.entry(key.into()).or_default() += 1;
        r.attempts.entry(key.into()).or_default().push(attempt);
        r.started
            .entry(key.into())
            .or_insert_with(tokio::time::Instant::now);
    }

    /// Records the effect for `key`.
    pub fn apply(&self, key: &str) {
        *self.inner.lock().applied.entry(key.into()).or_default() += 1;
    }

    /// How many times the handler was called for `key`.
    pub fn calls(&self, key: &str) -> u32 {
        self.inner.lock().calls.get(key).copied().unwrap_or(0)
    }

    /// How many handler calls there were, over every key.
    pub fn calls_total(&self) -> u32 {
        self.inner.lock().calls.values().sum()
    }

    /// How many times the effect for `key` was applied.
    pub fn applied(&self, key: &str) -> u32 {
        self.inner.lock().applied.get(key).copied().unwrap_or(0)
    }

    /// How many effects were applied, over every key.
    pub fn applied_total(&self) -> u32 {
        self.inner.lock().applied.values().sum()
    }

    /// The attempt numbers the handler saw for `key`, in call order.
    pub fn attempts(&self, key: &str) -> Vec<u32> {
        self.inner
            .lock()
            .attempts
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Whether the handler has been called for `key`.
    pub fn started(&self, key: &str) -> bool {
        self.inner.lock().started.contains_key(key)
    }

    /// The keys whose effect was applied more than once, with their counts.
    pub fn repeated(&self) -> Vec<(String, u32)> {
        let mut twice: Vec<_> = self
            .inner
            .lock()
            .applied
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        twice.sort();
        twice
    }

    /// A handler keyed by message id that records the call, works for
    /// `pause`, then applies the effect.
    pub fn handler(&self, pause: Duration) -> impl Handler + use<> {
        let effects = self.clone();
        move |m: Message, _claim: ClaimHandle| {
            let effects = effects.clone();
            async move {
                let key = m.id.clone().unwrap_or_default();
                effects.called(&key, m.attempt);
                tokio::time::sleep(pause).await;
                effects.apply(&key);
                done()
            }
        }
    }
}

/// A runner running on its own task: [`Running::stop`] shuts it down and
/// gives its report.
pub struct Running {
    /// Cancelled to shut the runner down.
    pub shutdown: CancellationToken,
    /// The runner's task.
    pub done: JoinHandle<Report>,
}

impl Running {
    /// Runs `runner` on a task of its own; the same as [`spawn`].
    pub fn start<S, Src, H>(runner: Runner<S, Src, H>) -> Self
    where
        S: Store + Clone + 'static,
        Src: Source + 'static,
        H: Handler + 'static,
    {
        spawn(runner)
    }

    /// Shuts the runner down and waits (at most 30 s) for its report.
    ///
    /// # Panics
    ///
    /// When the runner does not stop in time, or panicked.
    pub async fn stop(self) -> Report {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("the runner stops within 30 s")
            .expect("the runner does not panic")
    }
}

/// Runs `runner` on a task of its own.
///
/// # Panics
///
/// The task panics when the runner cannot start.
pub fn spawn<S, Src, H>(runner: Runner<S, Src, H>) -> Running
where
    S: Store + Clone + 'static,
    Src: Source + 'static,
    H: Handler + 'static,
{
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let done = tokio::spawn(async move { runner.run(token).await.expect("the runner starts") });
    Running { shutdown, done }
}

/// A consumer that dies with its process while its handler works: the
/// source `connect` opens is run with a handler that never finishes, on a
/// runtime of its own (its connections too), and that runtime is dropped
/// as soon as the handler has started. Nothing is acked, released or
/// closed, as after `kill -9`.
///
/// # Panics
///
/// When the handler has not started within `limit`.
pub async fn die_mid_handler<S, Src, F, Fut>(guard: Guard<S>, connect: F, limit: Duration)
where
    S: Store + Clone + 'static,
    Src: Source + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Src> + Send + 'static,
{
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the doomed consumer");
    doomed.spawn(async move {
        let source = connect().await;
        let handler = move |_m: Message, _claim: ClaimHandle| {
            let started = started_tx.clone();
            async move {
                let _ = started.send(());
                std::future::pending::<()>().await;
                done()
            }
        };
        let _ = Runner::new(guard, source, handler)
            .run(CancellationToken::new())
            .await;
    });
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(limit))
        .await
        .expect("the waiting thread does not panic")
        .expect("the doomed consumer's handler starts");
    doomed.shutdown_background();
}
