//! The runner under handlers and sources that misbehave: panics, a handler
//! that cannot take messages, a lane held by a failing message, deliveries
//! held past a broker's timer. Each test names the guarantee it proves.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use idem_consumer::{
    Backoff, Capabilities, DeadLetter, Delivery, HandlerError, MemorySource, Message, RetryReason,
    Runner, Source, SourceError,
};
use idem_core::{Begin, Bytes, ClaimHandle, Guard, Key, Lease, MemoryStore, Store};
use parking_lot::Mutex;

mod support;

use support::run_until;

fn message(id: &str, body: &str) -> Message {
    let mut m = Message::new(body.to_owned());
    m.id = Some(id.to_owned());
    m
}

fn in_lane(id: &str, lane: &str) -> Message {
    let mut m = message(id, id);
    m.lane = Some(Bytes::from(lane.to_owned()));
    m
}

fn quick() -> Backoff {
    Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(80),
        jitter: 0.0,
    }
}

/// The in-memory source with what real brokers add: a keep-alive timer
/// (counted per message id), capabilities, lane pausing (recorded), and an
/// ack that panics once for one message id.
#[derive(Clone)]
struct Broker {
    inner: MemorySource,
    capabilities: Capabilities,
    keep_alive_every: Option<Duration>,
    keep_alives: Arc<Mutex<HashMap<String, u32>>>,
    receipts: Arc<Mutex<HashMap<u64, String>>>,
    lanes: Arc<Mutex<Vec<(String, bool)>>>,
    panic_on_ack: Arc<Mutex<Option<String>>>,
}

impl Broker {
    fn new(inner: &MemorySource) -> Self {
        Self {
            inner: inner.clone(),
            capabilities: Capabilities::default(),
            keep_alive_every: None,
            keep_alives: Arc::default(),
            receipts: Arc::default(),
            lanes: Arc::default(),
            panic_on_ack: Arc::default(),
        }
    }

    fn keep_alives_of(&self, id: &str) -> u32 {
        self.keep_alives.lock().get(id).copied().unwrap_or(0)
    }
}

impl Source for Broker {
    type Receipt = u64;

    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<u64>>, SourceError> {
        let got = self.inner.fetch(max).await?;
        let mut receipts = self.receipts.lock();
        for d in &got {
            receipts.insert(d.receipt, d.message.id.clone().unwrap_or_default());
        }
        Ok(got)
    }

    async fn ack(&self, delivery: Delivery<u64>) -> Result<(), SourceError> {
        let id = delivery.message.id.clone();
        let panics = {
            let mut once = self.panic_on_ack.lock();
            once.is_some() && *once == id && once.take().is_some()
        };
        if panics {
            panic!("the broker client panicked acking {id:?}");
        }
        self.inner.ack(delivery).await
    }

    async fn retry(
        &self,
        delivery: Delivery<u64>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        self.inner.retry(delivery, delay, reason).await
    }

    async fn dead_letter(
        &self,
        delivery: Delivery<u64>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        self.inner.dead_letter(delivery, why).await
    }

    async fn requeue(&self, delivery: Delivery<u64>) -> Result<(), SourceError> {
        self.inner.requeue(delivery).await
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        self.keep_alive_every
    }

    async fn keep_alive(&self, receipt: &u64) -> Result<(), SourceError> {
        let id = self
            .receipts
            .lock()
            .get(receipt)
            .cloned()
            .unwrap_or_default();
        *self.keep_alives.lock().entry(id).or_default() += 1;
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn pause_lane(&self, lane: &Bytes) {
        let lane = String::from_utf8_lossy(lane).into_owned();
        self.lanes.lock().push((lane, true));
    }

    fn resume_lane(&self, lane: &Bytes) {
        let lane = String::from_utf8_lossy(lane).into_owned();
        self.lanes.lock().push((lane, false));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_retried_then_dead_lettered_and_its_key_stays_usable() {
    let queue = MemorySource::new("orders");
    queue.push(message("k", "boom"));
    queue.push(message("other", "fine"));
    let handler = |m: Message, _c: ClaimHandle| async move {
        if m.body == "boom" {
            panic!("handler bug\non two lines");
        }
        Ok::<_, HandlerError>(Bytes::new())
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), Broker::new(&queue), handler)
        .max_attempts(3)
        .backoff(quick())
        .concurrency(1);
    let probe = queue.clone();
    let report = run_until(runner, move || {
        probe.dead_letters().len() == 1 && probe.acked_count() == 1
    })
    .await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(report.retried_failed, 2, "{report:?}");
    assert_eq!(report.panics, 3, "{report:?}");
    let (_, why) = &queue.dead_letters()[0];
    assert!(
        why.last_error.contains("the handler panicked: handler bug"),
        "{why:?}"
    );
    let headers = why.headers();
    assert!(!headers[2].1.contains('\n'), "{headers:?}");

    // The key was released each time: a corrected message runs.
    queue.push(message("k", "fine"));
    let runner = Runner::new(
        Guard::new(MemoryStore::new()),
        Broker::new(&queue),
        |_m: Message, _c: ClaimHandle| async { Ok::<_, HandlerError>(Bytes::new()) },
    );
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 2).await;
    assert_eq!(report.handled, 1, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_call_that_panics_frees_its_room_and_the_messages_behind_it() {
    let queue = MemorySource::new("orders");
    // Two copies of one key: the second waits behind the first, whose ack
    // panics. Then enough messages to need the one place of concurrency
    // many times over.
    queue.push(message("k", "first"));
    queue.push(message("k", "second"));
    for i in 0..50 {
        queue.push(message(&format!("m-{i}"), "x"));
    }
    let broker = Broker::new(&queue);
    *broker.panic_on_ack.lock() = Some("k".into());
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |_m: Message, _c: ClaimHandle| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, HandlerError>(Bytes::new()) }
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), broker, handler).concurrency(1);
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 51).await;
    assert_eq!(report.panics, 1, "{report:?}");
    // The second copy was settled as a duplicate of the first's stored
    // outcome, and every other message ran.
    assert_eq!(queue.acked_count(), 51, "{report:?}");
    assert_eq!(report.duplicates, 1, "{report:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 51);
    // The panicked delivery was never settled: the broker redelivers it.
    assert_eq!(queue.unsettled(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_cannot_take_messages_pauses_consumption_and_dead_letters_nothing() {
    let queue = MemorySource::new("orders");
    for i in 0..5 {
        queue.push(message(&format!("m-{i}"), "x"));
    }
    let refusals = Arc::new(AtomicU32::new(0));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let not_ready_seen = Arc::new(AtomicBool::new(false));
    let handler = {
        let refusals = refusals.clone();
        let attempts = attempts.clone();
        move |m: Message, _c: ClaimHandle| {
            let refused = refusals.fetch_add(1, Ordering::SeqCst) < 4;
            attempts
                .lock()
                .push((m.id.clone().unwrap(), m.attempt, refused));
            async move {
                if refused {
                    Err(HandlerError::pause("401 Unauthorized: the token expired"))
                } else {
                    Ok::<_, HandlerError>(Bytes::new())
                }
            }
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), Broker::new(&queue), handler)
        .max_attempts(2)
        .backoff(quick())
        .concurrency(1);
    let readiness = runner.readiness();
    let probe = queue.clone();
    let seen = not_ready_seen.clone();
    let report = run_until(runner, move || {
        if !readiness.is_ready() {
            seen.store(true, Ordering::SeqCst);
        }
        probe.acked_count() == 5
    })
    .await;
    assert!(
        not_ready_seen.load(Ordering::SeqCst),
        "not ready while paused"
    );
    assert_eq!(report.handled, 5, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert!(queue.dead_letters().is_empty());
    // Four refusals in a row with max_attempts 2, and no attempt counted.
    assert!(
        attempts.lock().iter().all(|(_, attempt, _)| *attempt == 1),
        "{:?}",
        attempts.lock()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_waiting_behind_a_failing_lane_leave_the_room_to_other_lanes() {
    let queue = MemorySource::new("orders");
    for i in 0..4 {
        queue.push(in_lane(&format!("a-{i}"), "a"));
    }
    for i in 0..200 {
        queue.push(in_lane(&format!("b-{i}"), "b"));
    }
    let broker = Broker::new(&queue);
    let a0_done = Arc::new(AtomicBool::new(false));
    let b_before_a0 = Arc::new(AtomicU32::new(0));
    let failures = Arc::new(AtomicU32::new(0));
    let handler = {
        let (a0_done, b_before_a0, failures) =
            (a0_done.clone(), b_before_a0.clone(), failures.clone());
        move |m: Message, _c: ClaimHandle| {
            let id = m.id.clone().unwrap();
            let result = if id == "a-0" && failures.fetch_add(1, Ordering::SeqCst) < 6 {
                Err(HandlerError::transient("downstream down"))
            } else {
                if id == "a-0" {
                    a0_done.store(true, Ordering::SeqCst);
                }
                if id.starts_with("b-") && !a0_done.load(Ordering::SeqCst) {
                    b_before_a0.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Bytes::new())
            };
            std::future::ready(result)
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), broker.clone(), handler)
        .ordered(true)
        .retry_in_place(true)
        .backoff(Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(100),
            jitter: 0.0,
        })
        .concurrency(2);
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 204).await;
    assert_eq!(report.handled, 204, "{report:?}");
    assert_eq!(
        b_before_a0.load(Ordering::SeqCst),
        200,
        "lane b ran while a-0 waited"
    );
    let lanes = broker.lanes.lock().clone();
    assert_eq!(
        lanes,
        vec![("a".to_owned(), true), ("a".to_owned(), false)],
        "lane a paused at the source once while a-0 waited, then resumed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_waiting_in_place_or_behind_their_group_are_kept_alive() {
    let queue = MemorySource::new("orders");
    queue.push(in_lane("a-0", "a"));
    queue.push(in_lane("a-1", "a"));
    let mut broker = Broker::new(&queue);
    broker.keep_alive_every = Some(Duration::from_millis(20));
    let failures = Arc::new(AtomicU32::new(0));
    let handler = {
        let failures = failures.clone();
        move |m: Message, _c: ClaimHandle| {
            let fail =
                m.id.as_deref() == Some("a-0") && failures.fetch_add(1, Ordering::SeqCst) < 3;
            std::future::ready(if fail {
                Err(HandlerError::transient("not yet"))
            } else {
                Ok(Bytes::new())
            })
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), broker.clone(), handler)
        .ordered(true)
        .retry_in_place(true)
        .backoff(Backoff {
            initial: Duration::from_millis(150),
            max: Duration::from_millis(150),
            jitter: 0.0,
        })
        .concurrency(2);
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 2).await;
    assert_eq!(report.handled, 2, "{report:?}");
    // About 450 ms of waiting at one keep-alive per 20 ms.
    assert!(
        broker.keep_alives_of("a-0") >= 10,
        "{:?}",
        broker.keep_alives
    );
    assert!(
        broker.keep_alives_of("a-1") >= 10,
        "{:?}",
        broker.keep_alives
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_waits_in_place_where_the_broker_counts_retries() {
    let queue = MemorySource::new("orders");
    queue.push(message("k", "x"));
    let mut broker = Broker::new(&queue);
    broker.capabilities = Capabilities::default().busy_retry_uses_attempt(true);
    broker.keep_alive_every = Some(Duration::from_millis(50));
    let store = MemoryStore::new();
    let key = Key::new("orders", "k").unwrap();
    // A consumer that died holding the key: its lease runs 400 ms.
    let held = store
        .begin(&key, None, Lease::from_millis(400))
        .await
        .unwrap();
    assert!(matches!(held, Begin::Acquired(_)));
    let (calls, handler) = counting();
    let runner = Runner::new(Guard::new(store), broker.clone(), handler);
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 1).await;
    assert_eq!(report.handled, 1, "{report:?}");
    assert!(report.retried_busy >= 1, "{report:?}");
    waited_in_place(&queue, &broker, &calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_place_longer_than_the_broker_allows_goes_to_the_broker() {
    let queue = MemorySource::new("orders");
    queue.push(message("k", "x"));
    let mut broker = Broker::new(&queue);
    broker.capabilities = Capabilities::default().max_hold(Duration::from_millis(100));
    let failures = Arc::new(AtomicU32::new(0));
    let handler = {
        let failures = failures.clone();
        move |_m: Message, _c: ClaimHandle| {
            let fail = failures.fetch_add(1, Ordering::SeqCst) < 1;
            std::future::ready(if fail {
                Err(HandlerError::transient("not yet"))
            } else {
                Ok(Bytes::new())
            })
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), broker, handler)
        .retry_in_place(true)
        .backoff(Backoff {
            initial: Duration::from_millis(300),
            max: Duration::from_millis(300),
            jitter: 0.0,
        });
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 1).await;
    assert_eq!(report.handled, 1, "{report:?}");
    assert_eq!(
        queue.retries(),
        vec![(Duration::from_millis(300), RetryReason::Failed)],
        "the 300 ms wait outlasts the 100 ms hold: retried at the broker"
    );
}

/// Where the broker counts every retry (NATS, RocketMQ), a store that
/// cannot be reached for a while makes the message wait in place, kept
/// alive: no retry goes to the broker, so an outage longer than the
/// attempts' backoff never uses them up and dead-letters the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_waits_in_place_where_the_broker_counts_retries() {
    let queue = MemorySource::new("orders");
    queue.push(message("k", "x"));
    let mut broker = Broker::new(&queue);
    broker.capabilities = Capabilities::default().busy_retry_uses_attempt(true);
    broker.keep_alive_every = Some(Duration::from_millis(20));
    let store = idem_testkit::faults::Switchable::new(MemoryStore::new());
    store.set_down(true);
    let back = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        back.set_down(false);
    });
    let (calls, handler) = counting();
    let runner = Runner::new(Guard::new(store), broker.clone(), handler)
        .max_attempts(2)
        .backoff(Backoff {
            initial: Duration::from_millis(150),
            max: Duration::from_millis(150),
            jitter: 0.0,
        });
    let probe = queue.clone();
    let report = run_until(runner, move || probe.acked_count() == 1).await;
    assert_eq!(report.handled, 1, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    waited_in_place(&queue, &broker, &calls);
}

/// What a handler that succeeds at once answers.
type Answer = std::future::Ready<Result<Bytes, HandlerError>>;

/// A handler that counts its calls and succeeds.
fn counting() -> (Arc<AtomicU32>, impl Fn(Message, ClaimHandle) -> Answer) {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = move |_m: Message, _c: ClaimHandle| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, HandlerError>(Bytes::new()))
    };
    (calls, handler)
}

/// Message `k` waited in the runner, kept alive, and ran once: no retry
/// went to the broker.
fn waited_in_place(queue: &MemorySource, broker: &Broker, calls: &AtomicU32) {
    assert!(
        queue.retries().is_empty(),
        "no retry went to the broker: {:?}",
        queue.retries()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        broker.keep_alives_of("k") >= 3,
        "kept alive while it waited"
    );
}
