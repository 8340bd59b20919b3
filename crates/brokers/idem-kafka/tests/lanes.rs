//! A paused lane (a partition) hands out nothing until it is resumed, the
//! other partitions go on, and its messages then come in order: a message
//! waiting in place does not let the messages behind it take the runner's
//! room.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_consumer::{Delivery, HandlerError, Message, Runner, Source};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use idem_kafka::{KafkaSource, Receipt};
use parking_lot::Mutex;
use support::{Fixture, Running, wait_until};

/// Fetches for `for_at_least`, or until `enough` messages came.
async fn fetch_for(
    source: &KafkaSource,
    for_at_least: Duration,
    enough: usize,
) -> Vec<Delivery<Receipt>> {
    let started = Instant::now();
    let mut got = Vec::new();
    while got.len() < enough && started.elapsed() < for_at_least {
        got.extend(source.fetch(100).await.unwrap());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_lane_is_held_back_and_comes_in_order_when_resumed() {
    let Some(f) = Fixture::new("lanes", 4).await else {
        return;
    };
    let source = f.source("&retry=blocking&lanes=partition").await;
    wait_until("the four partitions", Duration::from_secs(30), || {
        source.assignment().len() == 4
    })
    .await;
    let lane = Bytes::from(format!("{}/0", f.topic));
    source.pause_lane(&lane);
    for i in 0..5 {
        for p in 0..4 {
            f.publish(&format!("p{p}-{i}"), Some(p), "{}").await;
        }
    }
    // Fetch past the 15 of partitions 1–3, to see that none of 0 comes.
    let first = fetch_for(&source, Duration::from_secs(3), usize::MAX).await;
    let partitions: Vec<i32> = first.iter().map(|d| d.receipt.partition()).collect();
    assert_eq!(first.len(), 15, "{partitions:?}");
    assert!(!partitions.contains(&0), "{partitions:?}");

    source.resume_lane(&lane);
    let then = fetch_for(&source, Duration::from_secs(20), 5).await;
    let offsets: Vec<(i32, i64)> = then
        .iter()
        .map(|d| (d.receipt.partition(), d.receipt.offset()))
        .collect();
    assert_eq!(offsets, [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]);
    for d in first.into_iter().chain(then) {
        source.ack(d).await.unwrap();
    }
    source.close().await;
}

/// With one message always failing in partition 0, retried in place, the
/// other partitions' messages are all handled, at the rate of a runner
/// with nothing held: the messages behind the failing one wait at the
/// broker, not in the runner's permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_retried_in_place_does_not_slow_the_other_partitions() {
    let Some(f) = Fixture::new("lanes-e2e", 4).await else {
        return;
    };
    f.publish("always-0", Some(0), "{}").await;
    for i in 0..20 {
        f.publish(&format!("behind-{i}"), Some(0), "{}").await;
    }
    let total = 10_000;
    let fixture = &f;
    for chunk in (0..total).collect::<Vec<i32>>().chunks(1000) {
        futures_util::future::join_all(chunk.iter().map(|i| async move {
            fixture
                .publish(&format!("m-{i}"), Some(1 + i % 3), "{}")
                .await
        }))
        .await;
    }
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let calls = calls.clone();
        move |m: Message, _c: ClaimHandle| {
            let id = m.id.clone().unwrap();
            *calls.lock().entry(id.clone()).or_default() += 1;
            let r = if id.starts_with("always") {
                Err(HandlerError::transient("not now"))
            } else {
                Ok(Bytes::new())
            };
            std::future::ready(r)
        }
    };
    let source = f.source("&retry=blocking").await;
    let running = Running::start(
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
            .concurrency(8)
            .ordered(true)
            .retry_in_place(true)
            .max_attempts(1000)
            .backoff(idem_consumer::Backoff {
                initial: Duration::from_millis(200),
                max: Duration::from_millis(200),
                jitter: 0.0,
            }),
    );
    let started = Instant::now();
    let handled = || {
        calls
            .lock()
            .keys()
            .filter(|id| id.starts_with("m-"))
            .count()
    };
    wait_until(
        "the other partitions' messages",
        Duration::from_secs(120),
        || handled() == total as usize,
    )
    .await;
    let took = started.elapsed();
    let behind = calls
        .lock()
        .keys()
        .filter(|id| id.starts_with("behind"))
        .count();
    running.stop().await;
    source.close().await;
    assert_eq!(behind, 0, "the messages behind the failing one waited");
    assert!(
        took < Duration::from_secs(30),
        "{total} messages took {took:?}"
    );
}
