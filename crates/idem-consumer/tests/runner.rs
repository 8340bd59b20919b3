//! The runner's outcome-to-action table, proven against the in-memory source
//! and store: each test names the guarantee it proves.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_consumer::dlq::{REPLAYED_FROM_HEADER, is_dead_lettered};
use idem_consumer::{Backoff, HandlerError, KeyFrom, MemorySource, Message, RetryReason, Runner};
use idem_core::{Begin, Bytes, ClaimHandle, Guard, Key, Lease, MemoryStore, Record, Store};
use idem_testkit::faults::Switchable;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

mod support;

use support::run_until;

fn message(id: &str) -> Message {
    let mut m = Message::new(format!("{{\"id\":\"{id}\"}}"));
    m.id = Some(id.to_owned());
    m
}

fn quick() -> Backoff {
    Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(80),
        jitter: 0.0,
    }
}

/// A handler that succeeds and counts its calls.
fn counting(
    calls: Arc<AtomicU32>,
) -> impl Fn(Message, ClaimHandle) -> std::future::Ready<Result<Bytes, HandlerError>> + Send + Sync
{
    move |_m, _c| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Bytes::new()))
    }
}

/// Counts effects per key.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<HashMap<String, u32>>>);

impl Sink {
    fn apply(&self, m: &Message) {
        *self.0.lock().entry(m.id.clone().unwrap()).or_default() += 1;
    }
    fn counts(&self) -> HashMap<String, u32> {
        self.0.lock().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_acked_without_running_the_handler_again() {
    let source = MemorySource::new("orders");
    for i in 0..200 {
        source.push(message(&format!("m-{i}")));
        if i % 10 == 0 {
            // Some copies land in the same batch, some later.
            source.push(message(&format!("m-{i}")));
        }
    }
    for i in (0..200).step_by(10) {
        source.push(message(&format!("m-{i}")));
    }
    let sink = Sink::default();
    let handler = {
        let sink = sink.clone();
        move |m: Message, _claim: ClaimHandle| {
            let sink = sink.clone();
            async move {
                assert_eq!(
                    m.key.as_deref(),
                    m.id.as_deref().map(str::as_bytes),
                    "the handler gets the key"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
                sink.apply(&m);
                Ok::<_, HandlerError>(Bytes::from_static(b"true"))
            }
        }
    };
    let runner =
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).concurrency(32);
    let probe = source.clone();
    let report = run_until(runner, move || {
        probe.unsettled() == 0 && probe.acked().len() == 240
    })
    .await;
    let counts = sink.counts();
    assert_eq!(counts.len(), 200, "every message's effect");
    assert!(
        counts.values().all(|&n| n == 1),
        "no effect twice: {counts:?}"
    );
    assert_eq!(source.acked().len(), 240);
    assert_eq!(report.handled, 200);
    assert_eq!(report.duplicates, 40);
    assert_eq!(
        report.retried_busy, 0,
        "copies in flight wait locally: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_failing_twice_is_applied_once_after_backoff() {
    let source = MemorySource::new("orders");
    source.push(message("flaky"));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |_m: Message, _c: ClaimHandle| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n <= 2 {
                    Err(HandlerError::transient(format!("failure {n}")))
                } else {
                    Ok(Bytes::from_static(b"\"done\""))
                }
            }
        }
    };
    let store = MemoryStore::new();
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler).backoff(quick());
    let probe = source.clone();
    let started = tokio::time::Instant::now();
    let report = run_until(runner, move || probe.acked().len() == 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(report.retried_failed, 2);
    assert_eq!(report.handled, 1);
    let retries = source.retries();
    assert_eq!(
        retries,
        vec![
            (Duration::from_millis(20), RetryReason::Failed),
            (Duration::from_millis(40), RetryReason::Failed)
        ],
        "exponential backoff"
    );
    assert!(started.elapsed() >= Duration::from_millis(60));
    assert_eq!(
        source.acked()[0].attempt,
        3,
        "attempts counted by the source"
    );
    let key = Key::new("orders", "flaky").unwrap();
    assert!(matches!(
        store.begin(&key, None, Lease::from_secs(1)).await.unwrap(),
        Begin::Completed { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_always_fails_is_dead_lettered_after_max_attempts() {
    let source = MemorySource::new("orders");
    source.push(message("poison"));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |_m: Message, _c: ClaimHandle| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<Bytes, _>(HandlerError::transient("database is down")) }
        }
    };
    let store = MemoryStore::new();
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler)
        .backoff(quick())
        .max_attempts(4);
    let probe = source.clone();
    let report = run_until(runner, move || probe.dead_letters().len() == 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(report.dead_lettered, 1);
    let (m, why) = &source.dead_letters()[0];
    assert_eq!(m.id.as_deref(), Some("poison"));
    assert_eq!(why.key.as_deref(), Some("poison"));
    assert_eq!(why.attempts, 4);
    assert!(why.last_error.contains("database is down"), "{why:?}");
    assert_eq!(source.unsettled(), 0);
    // The key is not stuck: it is recorded as dead-lettered.
    let key = Key::new("orders", "poison").unwrap();
    match store.get(&key).await.unwrap() {
        Some(Record::Completed(c)) => assert!(is_dead_lettered(c.outcome.as_deref()), "{c:?}"),
        other => panic!("expected the dead-lettered record, got {other:?}"),
    }
}

/// A replayed dead letter: the header `idem dlq replay` puts on it.
fn replayed(id: &str) -> Message {
    let mut m = message(id);
    m.headers.push((
        REPLAYED_FROM_HEADER.into(),
        Bytes::from("orders.dead-letter/1"),
    ));
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_key_acks_its_copies_until_its_dead_letter_is_replayed() {
    let source = MemorySource::new("orders");
    source.push(message("refused"));
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let (broken, calls) = (broken.clone(), calls.clone());
        move |_m: Message, _c: ClaimHandle| {
            calls.fetch_add(1, Ordering::SeqCst);
            let broken = broken.load(Ordering::SeqCst);
            async move {
                if broken {
                    Err(HandlerError::permanent("a bug in the handler"))
                } else {
                    Ok(Bytes::from_static(b"shipped"))
                }
            }
        }
    };
    let store = MemoryStore::new();
    let runner = |h| Runner::new(Guard::new(store.clone()), source.clone(), h).backoff(quick());
    let probe = source.clone();
    let report = run_until(runner(handler.clone()), move || {
        probe.dead_letters().len() == 1
    })
    .await;
    assert_eq!((report.dead_lettered, calls.load(Ordering::SeqCst)), (1, 1));

    // The bug is fixed, and the producer sends the message again: a copy,
    // acked without a call and not parked again.
    broken.store(false, Ordering::SeqCst);
    source.push(message("refused"));
    let probe = source.clone();
    let report = run_until(runner(handler.clone()), move || probe.acked().len() == 1).await;
    assert_eq!((report.duplicates, report.handled), (1, 0));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a copy never runs");
    assert_eq!(source.dead_letters().len(), 1, "nor is it parked again");

    // The operator replays the dead letter: it reopens the key and runs,
    // and a second replay of it is a duplicate.
    source.push(replayed("refused"));
    source.push(replayed("refused"));
    let probe = source.clone();
    let report = run_until(runner(handler.clone()), move || probe.acked().len() == 3).await;
    assert_eq!((report.handled, report.duplicates), (1, 1), "{report:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the replay ran once");
    let key = Key::new("orders", "refused").unwrap();
    match store.get(&key).await.unwrap() {
        Some(Record::Completed(c)) => assert_eq!(c.outcome, Some(Bytes::from("shipped"))),
        other => panic!("expected the replay's outcome, got {other:?}"),
    }
    assert_eq!(source.dead_letters().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_remembering_dead_letters_a_copy_runs_again() {
    let source = MemorySource::new("orders");
    source.push(message("refused"));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |_m: Message, _c: ClaimHandle| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<Bytes, _>(HandlerError::permanent("refused")) }
        }
    };
    let store = MemoryStore::new();
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler)
        .remember_dead_letters(false);
    let probe = source.clone();
    source.push(message("refused"));
    let report = run_until(runner, move || probe.dead_letters().len() == 2).await;
    assert_eq!(report.dead_lettered, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let key = Key::new("orders", "refused").unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None, "the key is left free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failures_and_missing_keys_are_dead_lettered_at_once() {
    let source = MemorySource::new("orders");
    source.push(message("bad-request"));
    source.push(Message::new("no id at all"));
    let handler = |_m: Message, _c: ClaimHandle| async {
        Err::<Bytes, _>(HandlerError::permanent("amount is negative"))
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler);
    let probe = source.clone();
    let report = run_until(runner, move || probe.dead_letters().len() == 2).await;
    assert_eq!(report.dead_lettered, 2);
    assert_eq!(report.retried_failed, 0);
    let dead = source.dead_letters();
    let errors: Vec<_> = dead.iter().map(|(_, why)| why.last_error.clone()).collect();
    assert!(
        errors.iter().any(|e| e.contains("amount is negative")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("no message id")),
        "{errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_elsewhere_is_retried_after_the_lease_not_spun_on() {
    let store = MemoryStore::new();
    let key = Key::new("orders", "busy").unwrap();
    let Begin::Acquired(_) = store
        .begin(&key, None, Lease::from_millis(400))
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    let source = MemorySource::new("orders");
    source.push(message("busy"));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(calls.clone());
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler);
    let probe = source.clone();
    let report = run_until(runner, move || probe.acked().len() == 1).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "taken over once the lease ran out"
    );
    let retries = source.retries();
    assert!(
        !retries.is_empty() && retries.len() <= 3,
        "retried a few times, not spun on: {retries:?}"
    );
    assert!(retries.iter().all(|(_, r)| *r == RetryReason::Busy));
    assert!(
        retries[0].0 >= Duration::from_millis(300),
        "waits for the lease: {retries:?}"
    );
    assert_eq!(report.retried_busy as usize, retries.len());
    assert_eq!(source.acked()[0].attempt, 1, "busy retries use no attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_fails_closed_and_nothing_runs_until_it_is_back() {
    let store = Switchable::new(MemoryStore::new());
    store.set_down(true);
    let source = MemorySource::new("orders");
    source.push(message("m"));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = counting(calls.clone());
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler).backoff(quick());
    let probe = source.clone();
    let switch = store.clone();
    let report = run_until(runner, move || {
        if probe.retries().len() >= 3 {
            switch.set_down(false);
        }
        probe.acked().len() == 1
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(report.retried_unavailable >= 3, "{report:?}");
    assert!(
        source
            .retries()
            .iter()
            .all(|(_, r)| *r == RetryReason::Unavailable)
    );
    assert_eq!(source.acked()[0].attempt, 1, "store outages use no attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_runs_the_handler_unguarded_when_the_store_is_down() {
    let store = Switchable::new(MemoryStore::new());
    store.set_down(true);
    let source = MemorySource::new("orders");
    source.push(message("m"));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let tokens = tokens.clone();
        move |_m: Message, c: ClaimHandle| {
            tokens.lock().push(c.token());
            async { Ok::<_, HandlerError>(Bytes::new()) }
        }
    };
    let runner = Runner::new(Guard::new(store).fail_open(true), source.clone(), handler);
    let probe = source.clone();
    run_until(runner, move || probe.acked().len() == 1).await;
    assert_eq!(*tokens.lock(), vec![None], "ran once, without a token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_handlers_in_flight_finish_and_acks_them() {
    let source = MemorySource::new("orders");
    source.push(message("slow"));
    let finished = Arc::new(AtomicU32::new(0));
    let handler = {
        let finished = finished.clone();
        move |_m: Message, _c: ClaimHandle| {
            let finished = finished.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler);
    let stop = CancellationToken::new();
    let canceller = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        })
    };
    let report = runner.run(stop).await.unwrap();
    canceller.await.unwrap();
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    assert_eq!(report.handled, 1);
    assert_eq!(source.acked().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_past_the_grace_releases_claims_and_hands_messages_back() {
    let store = MemoryStore::new();
    let source = MemorySource::new("orders");
    source.push(message("stuck"));
    source.push(message("waiting"));
    source.push(message("waiting"));
    let handler = |_m: Message, _c: ClaimHandle| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, HandlerError>(Bytes::new())
    };
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler)
        .shutdown_grace(Duration::from_millis(100));
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
    }
    let started = tokio::time::Instant::now();
    let report = runner.run(stop).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(report.requeued, 3, "{report:?}");
    assert_eq!(source.unsettled(), 3, "all handed back, none lost");
    for id in ["stuck", "waiting"] {
        let key = Key::new("orders", id).unwrap();
        assert!(
            matches!(
                store.begin(&key, None, Lease::from_secs(1)).await.unwrap(),
                Begin::Acquired(_)
            ),
            "{id}: a redelivery runs at once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_lanes_are_handled_one_after_another_in_order() {
    let source = MemorySource::new("orders");
    for i in 0..60 {
        let mut m = message(&format!("m-{i}"));
        m.lane = Some(Bytes::from(format!("lane-{}", i % 3)));
        source.push(m);
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(Mutex::new(HashMap::<Bytes, bool>::new()));
    let handler = {
        let seen = seen.clone();
        let running = running.clone();
        move |m: Message, _c: ClaimHandle| {
            let seen = seen.clone();
            let running = running.clone();
            async move {
                let lane = m.lane.clone().unwrap();
                assert!(
                    !running.lock().insert(lane.clone(), true).unwrap_or(false),
                    "two at once in one lane"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
                seen.lock().push((lane.clone(), m.id.clone().unwrap()));
                running.lock().insert(lane, false);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
        .ordered(true)
        .concurrency(16);
    let probe = source.clone();
    run_until(runner, move || probe.acked().len() == 60).await;
    let seen = seen.lock().clone();
    for lane in 0..3 {
        let ids: Vec<u32> = seen
            .iter()
            .filter(|(l, _)| *l == format!("lane-{lane}"))
            .map(|(_, id)| id[2..].parse().unwrap())
            .collect();
        assert_eq!(ids.len(), 20);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "lane {lane} out of order: {ids:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_in_place_hold_the_lane_until_the_failing_message_succeeds() {
    let source = MemorySource::new("orders");
    for i in 0..8 {
        let mut m = message(&format!("m-{i}"));
        m.lane = Some(Bytes::from(format!("lane-{}", i % 2)));
        source.push(m);
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(AtomicU32::new(0));
    let handler = {
        let seen = seen.clone();
        let failures = failures.clone();
        move |m: Message, _c: ClaimHandle| {
            let seen = seen.clone();
            let failures = failures.clone();
            async move {
                let id = m.id.clone().unwrap();
                seen.lock().push((id.clone(), m.attempt));
                // m-2 (lane 0) fails on its first two attempts.
                if id == "m-2" && failures.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(HandlerError::transient("not yet"));
                }
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
        .ordered(true)
        .retry_in_place(true)
        .backoff(quick())
        .concurrency(4);
    let probe = source.clone();
    let report = run_until(runner, move || probe.acked().len() == 8).await;
    assert_eq!(report.handled, 8, "{report:?}");
    assert_eq!(report.retried_failed, 2, "{report:?}");
    assert!(
        source.retries().is_empty(),
        "nothing went back to the broker: {:?}",
        source.retries()
    );
    let seen = seen.lock().clone();
    let lane0: Vec<(String, u32)> = seen
        .iter()
        .filter(|(id, _)| id[2..].parse::<u32>().unwrap() % 2 == 0)
        .cloned()
        .collect();
    let expected: Vec<(String, u32)> = [
        ("m-0", 1),
        ("m-2", 1),
        ("m-2", 2),
        ("m-2", 3),
        ("m-4", 1),
        ("m-6", 1),
    ]
    .iter()
    .map(|(id, a)| (id.to_string(), *a))
    .collect();
    assert_eq!(
        lane0, expected,
        "lane 0 waits for m-2, whose attempts count up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_a_json_field_and_fingerprints_catch_reused_keys() {
    let source = MemorySource::new("orders");
    let mut a = Message::new(r#"{"order":"o-1","amount":5}"#);
    a.id = Some("x".into());
    let mut b = Message::new(r#"{"order":"o-1","amount":7}"#);
    b.id = Some("y".into());
    source.push(a);
    let handler = |_m: Message, _c: ClaimHandle| async { Ok::<_, HandlerError>(Bytes::new()) };
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
        .key(KeyFrom::Json("/order".into()))
        .fingerprint(true);
    let probe = source.clone();
    let pusher = source.clone();
    let report = run_until(runner, move || {
        if probe.acked().len() == 1 && probe.unsettled() == 0 && probe.dead_letters().is_empty() {
            pusher.push(b.clone());
        }
        probe.dead_letters().len() == 1
    })
    .await;
    assert_eq!(report.handled, 1);
    let (m, why) = &source.dead_letters()[0];
    assert_eq!(m.id.as_deref(), Some("y"));
    assert_eq!(why.key.as_deref(), Some("o-1"));
    assert!(why.last_error.contains("fingerprint mismatch"), "{why:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_mid_handler_runs_once_the_lease_ends() {
    // A first runner takes the message and "dies": its task is aborted
    // mid-handler, the claim stays until the lease ends, the broker
    // redelivers.
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone()).lease(Lease::from_millis(300));
    let source = MemorySource::new("orders");
    source.push(message("m"));
    let calls = Arc::new(AtomicU32::new(0));
    let make = |calls: Arc<AtomicU32>, hang: bool| {
        move |_m: Message, _c: ClaimHandle| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    // The first consumer runs on a runtime of its own, shut down mid-handler
    // as a process dies: its tasks stop, nothing settles the message.
    let first = Runner::new(guard.clone(), source.clone(), make(calls.clone(), true));
    let process = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    process.spawn(first.run(CancellationToken::new()));
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    process.shutdown_background();
    source.redeliver_unsettled();
    let second = Runner::new(guard, source.clone(), make(calls.clone(), false));
    let probe = source.clone();
    let report = run_until(second, move || probe.acked().len() == 1).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "ran again after the crash, once"
    );
    assert_eq!(report.handled, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_source_records_one_latency_per_ack() {
    let source = MemorySource::new("orders");
    for i in 0..20 {
        source.push(message(&format!("m-{i}")));
    }
    source.push(message("m-0"));
    let timed = idem_consumer::Timed::new(source.clone());
    let times = timed.times();
    let handler = |_m: Message, _c: ClaimHandle| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok::<_, HandlerError>(Bytes::new())
    };
    let stop = CancellationToken::new();
    let run =
        tokio::spawn(Runner::new(Guard::new(MemoryStore::new()), timed, handler).run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), times.wait_for(21))
        .await
        .expect("every message acked");
    stop.cancel();
    run.await.unwrap().unwrap();
    let latencies = times.latencies();
    assert_eq!(latencies.count(), 21, "handled and duplicate acks alike");
    // 20 of 21 waited for their handler: the 5th percentile and above.
    assert!(
        latencies.quantile(0.05) >= Duration::from_millis(5),
        "each handled message waited for its handler: {latencies:?}"
    );
    assert_eq!(source.acked().len(), 21);
}
