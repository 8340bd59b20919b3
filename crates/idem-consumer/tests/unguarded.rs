//! A runner without claims (`Runner::unguarded`): the handler's own
//! transaction is the dedup, and the runner keeps everything else (acks
//! after success, retries, dead letters, copies in flight waiting, shutdown).
//! The proof with a real inbox table is in idem-sql's `tests/inbox.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_consumer::{Backoff, HandlerError, MemorySource, Message, Runner};
use idem_core::{Bytes, ClaimHandle};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_reaches_the_handler_without_a_token_and_is_acked_after_it() {
    let source = MemorySource::new("orders");
    for i in 0..30 {
        source.push(message(&format!("m-{i}")));
        if i % 3 == 0 {
            source.push(message(&format!("m-{i}")));
        }
    }
    let calls = Arc::new(AtomicU32::new(0));
    let in_flight = Arc::new(Mutex::new(HashSet::new()));
    let handler = {
        let (calls, in_flight) = (calls.clone(), in_flight.clone());
        move |m: Message, claim: ClaimHandle| {
            let (calls, in_flight) = (calls.clone(), in_flight.clone());
            async move {
                assert_eq!(claim.token(), None, "nothing was claimed");
                assert!(!claim.is_lost());
                let key = m.key.clone().expect("the runner sets the key");
                assert!(
                    in_flight.lock().insert(key.clone()),
                    "copies of a key in flight wait for each other"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
                in_flight.lock().remove(&key);
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let runner = Runner::unguarded(source.clone(), handler).concurrency(16);
    let probe = source.clone();
    let report = run_until(runner, move || probe.acked_count() == 40).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        40,
        "no store remembers keys: each copy runs the handler, whose transaction dedups"
    );
    assert_eq!(report.handled, 40, "{report:?}");
    assert_eq!(report.duplicates, 0);
    assert_eq!(source.unsettled(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered_and_permanent_ones_at_once() {
    let source = MemorySource::new("orders");
    source.push(message("flaky"));
    source.push(message("poison"));
    source.push(message("invalid"));
    let flaky_calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let flaky_calls = flaky_calls.clone();
        move |m: Message, _c: ClaimHandle| {
            let n = match m.id.as_deref() {
                Some("flaky") => flaky_calls.fetch_add(1, Ordering::SeqCst) + 1,
                _ => 0,
            };
            async move {
                match m.id.as_deref() {
                    Some("flaky") if n <= 2 => Err(HandlerError::transient("deadlock")),
                    Some("flaky") => Ok(Bytes::new()),
                    Some("poison") => Err(HandlerError::transient("always fails")),
                    _ => Err(HandlerError::permanent("no such order")),
                }
            }
        }
    };
    let runner = Runner::unguarded(source.clone(), handler)
        .backoff(quick())
        .max_attempts(3);
    let probe = source.clone();
    let report = run_until(runner, move || {
        probe.acked_count() == 1 && probe.dead_letters().len() == 2
    })
    .await;
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        source.acked()[0].attempt,
        3,
        "attempts counted by the source"
    );
    let dead = source.dead_letters();
    let poison = dead
        .iter()
        .find(|(m, _)| m.id.as_deref() == Some("poison"))
        .expect("poison dead-lettered");
    assert_eq!(poison.1.attempts, 3);
    let invalid = dead
        .iter()
        .find(|(m, _)| m.id.as_deref() == Some("invalid"))
        .expect("a permanent failure is dead-lettered");
    assert_eq!(invalid.1.attempts, 1, "at once");
    assert_eq!(report.retried_failed, 4, "{report:?}");
    assert_eq!(report.dead_lettered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_past_the_grace_drops_the_handler_and_hands_the_message_back() {
    let source = MemorySource::new("orders");
    source.push(message("stuck"));
    source.push(message("stuck"));
    let dropped = Arc::new(AtomicU32::new(0));
    struct CountDrop(Arc<AtomicU32>);
    impl Drop for CountDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let handler = {
        let dropped = dropped.clone();
        move |_m: Message, _c: ClaimHandle| {
            // Stands for the handler's open transaction: dropped, it rolls back.
            let transaction = CountDrop(dropped.clone());
            async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                drop(transaction);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let runner =
        Runner::unguarded(source.clone(), handler).shutdown_grace(Duration::from_millis(100));
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
    }
    let report = runner.run(stop).await.unwrap();
    assert_eq!(report.requeued, 2, "the stuck one and its copy: {report:?}");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the running handler was dropped"
    );
    assert_eq!(source.unsettled(), 2, "handed back, none lost");
    assert_eq!(source.acked_count(), 0);
}
