//! A fetched batch's completions are stored with one `complete_many`, and
//! each message is acked only after its own completion is stored: proven
//! against the in-memory source through a store that counts and delays its
//! calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_consumer::{Backoff, HandlerError, MemorySource, Message, Report, Runner};
use idem_core::layer::StoreWrapper;
use idem_core::{
    Bytes, ClaimHandle, CompleteItem, Fenced, FencingToken, Guard, InvalidInput, Key, MemoryStore,
    RecordState, Store, StoreError,
};
use parking_lot::Mutex;
use tokio::time::Instant;

mod support;

use support::run_until;

fn message(id: &str) -> Message {
    let mut m = Message::new(format!("{{\"id\":\"{id}\"}}"));
    m.id = Some(id.to_owned());
    m
}

/// How the counting store treats batches of completions.
#[derive(Clone, Copy, Default)]
enum Batches {
    #[default]
    Store,
    /// Refused whole, as a store refuses a batch over one of its limits.
    Refuse,
}

/// A memory store that counts completions, one by one and in batches, and
/// can hold each batch of completions for a while before storing it.
#[derive(Clone, Default)]
struct Counting {
    inner: MemoryStore,
    singles: Arc<AtomicU64>,
    batches: Arc<Mutex<Vec<usize>>>,
    delay: Duration,
    mode: Batches,
}

impl Counting {
    fn batch_sizes(&self) -> Vec<usize> {
        self.batches.lock().clone()
    }
}

impl StoreWrapper for Counting {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        Store::complete(&self.inner, key, token, outcome, retention).await
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.batches.lock().push(items.len());
        if let Batches::Refuse = self.mode {
            return Err(StoreError::Invalid(InvalidInput::BatchTooLarge {
                len: items.len(),
                limit: 0,
            }));
        }
        tokio::time::sleep(self.delay).await;
        Store::complete_many(&self.inner, items).await
    }
}

/// A handler that counts its calls per message and answers after the
/// delay `slow` gives for each message id.
fn handler(
    calls: Calls,
    slow: impl Fn(&str) -> Option<Duration> + Send + Sync + 'static,
) -> impl Fn(
    Message,
    ClaimHandle,
) -> futures_util::future::BoxFuture<'static, Result<Bytes, HandlerError>>
+ Send
+ Sync
+ 'static {
    move |m: Message, _claim: ClaimHandle| {
        let id = m.id.clone().unwrap();
        *calls.lock().entry(id.clone()).or_default() += 1;
        let wait = slow(&id);
        Box::pin(async move {
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            Ok(Bytes::from_static(b"done"))
        })
    }
}

type Calls = Arc<Mutex<HashMap<String, u32>>>;

/// Runs `n` messages through a runner on `store` with `concurrency`, and
/// `linger` for completions when given, until all are acked.
async fn handle_all(
    n: usize,
    store: &Counting,
    concurrency: usize,
    linger: Option<Duration>,
) -> (Report, Calls) {
    let source = MemorySource::new("orders");
    for i in 0..n {
        source.push(message(&format!("m-{i}")));
    }
    let calls = Calls::default();
    let mut runner = Runner::new(
        Guard::new(store.clone()),
        source.clone(),
        handler(calls.clone(), |_| None),
    )
    .concurrency(concurrency);
    if let Some(linger) = linger {
        runner = runner.completion_linger(linger);
    }
    let probe = source.clone();
    let report = run_until(runner, move || probe.acked_count() == n).await;
    assert!(source.dead_letters().is_empty());
    assert_eq!(source.acked_count(), n);
    (report, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetched_batch_is_completed_with_one_call() {
    let store = Counting::default();
    let (report, calls) = handle_all(1_000, &store, 64, None).await;

    assert_eq!(report.handled, 1_000, "{report:?}");
    assert_eq!(calls.lock().len(), 1_000);
    assert!(calls.lock().values().all(|&n| n == 1), "each handled once");
    let sizes = store.batch_sizes();
    assert_eq!(
        store.singles.load(Ordering::SeqCst),
        0,
        "no completion went on its own"
    );
    assert_eq!(
        sizes.iter().sum::<usize>(),
        1_000,
        "every completion stored"
    );
    // Batches are as large as the fetches: most calls carry many items.
    assert!(
        sizes.len() <= 1_000 / 8,
        "{} calls for 1 000 completions: {sizes:?}",
        sizes.len()
    );
    for i in 0..1_000 {
        let key = Key::new("orders", format!("m-{i}")).unwrap();
        let record = Store::get(&store.inner, &key)
            .await
            .unwrap()
            .expect("a record");
        assert_eq!(record.state(), RecordState::Completed, "m-{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_is_acked_before_its_completion_is_stored() {
    let source = MemorySource::new("orders");
    for i in 0..16 {
        source.push(message(&format!("m-{i}")));
    }
    let store = Counting {
        delay: Duration::from_millis(600),
        ..Counting::default()
    };
    let calls = Calls::default();
    let runner = Runner::new(
        Guard::new(store.clone()),
        source.clone(),
        handler(calls.clone(), |_| None),
    )
    .concurrency(16);
    let probe = source.clone();
    let started = Instant::now();
    let run = tokio::spawn(run_until(runner, move || probe.acked_count() == 16));

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(calls.lock().len(), 16, "every handler has run");
    assert_eq!(
        source.acked_count(),
        0,
        "acks wait for the batch of completions still being stored"
    );
    let report = run.await.unwrap();
    assert_eq!(report.handled, 16);
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(store.batch_sizes(), vec![16]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_holds_the_others_no_longer_than_the_linger() {
    let source = MemorySource::new("orders");
    for i in 0..8 {
        source.push(message(&format!("m-{i}")));
    }
    let store = Counting::default();
    let calls = Calls::default();
    let slow = |id: &str| (id == "m-3").then_some(Duration::from_secs(2));
    let runner = Runner::new(
        Guard::new(store.clone()),
        source.clone(),
        handler(calls.clone(), slow),
    )
    .concurrency(8)
    .completion_linger(Duration::from_millis(50));
    let probe = source.clone();
    let run = tokio::spawn(run_until(runner, move || probe.acked_count() == 8));

    let started = Instant::now();
    while source.acked_count() < 7 {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the fast messages were held by the slow one"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let slow_acked = source
        .acked()
        .iter()
        .any(|m| m.id.as_deref() == Some("m-3"));
    assert!(!slow_acked, "the slow one is still running");

    let report = run.await.unwrap();
    assert_eq!(report.handled, 8, "{report:?}");
    assert_eq!(
        store.batch_sizes(),
        vec![7, 1],
        "the slow one came on its own"
    );
    assert_eq!(store.singles.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_panics_in_a_batch_leave_it_at_once() {
    let source = MemorySource::new("orders");
    for i in 0..10 {
        source.push(message(&format!("m-{i}")));
    }
    let store = Counting::default();
    let tries = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let handler = {
        let tries = tries.clone();
        move |m: Message, _claim: ClaimHandle| {
            let id = m.id.clone().unwrap();
            let n = {
                let mut tries = tries.lock();
                let n = tries.entry(id.clone()).or_default();
                *n += 1;
                *n
            };
            async move {
                match (id.as_str(), n) {
                    ("m-1", 1) => Err(HandlerError::transient("not yet")),
                    ("m-2", 1) => panic!("a handler bug"),
                    ("m-4", _) => Err(HandlerError::permanent("never")),
                    _ => Ok(Bytes::new()),
                }
            }
        }
    };
    // A linger far longer than the test: only members leaving lets the
    // batch be stored.
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler)
        .concurrency(10)
        .completion_linger(Duration::from_secs(60))
        .backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(20),
            jitter: 0.0,
        });
    let probe = source.clone();
    let started = Instant::now();
    let report = run_until(runner, move || {
        probe.acked_count() == 9 && probe.dead_letters().len() == 1
    })
    .await;

    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the batch waited for members that had left: {:?}",
        started.elapsed()
    );
    assert_eq!(report.handled, 9, "{report:?}");
    assert_eq!(report.dead_lettered, 1);
    assert_eq!(report.panics, 1);
    let stored: usize = store.batch_sizes().iter().sum();
    assert_eq!(stored, 9, "the retried ones came back in later batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_whole_is_completed_item_by_item() {
    let store = Counting {
        mode: Batches::Refuse,
        ..Counting::default()
    };
    let (report, calls) = handle_all(32, &store, 32, None).await;
    assert_eq!(report.handled, 32, "{report:?}");
    assert!(calls.lock().values().all(|&n| n == 1), "each handled once");
    assert_eq!(store.singles.load(Ordering::SeqCst), 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_linger_completes_each_message_on_its_own() {
    let store = Counting::default();
    let (report, _) = handle_all(64, &store, 64, Some(Duration::ZERO)).await;
    assert_eq!(report.handled, 64);
    assert_eq!(store.singles.load(Ordering::SeqCst), 64);
    assert!(store.batch_sizes().is_empty());
}
