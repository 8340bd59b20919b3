//! Retries wait at the broker (retry queues), not in the consumer: failed
//! handlers come back after their backoff, exhausted ones are dead-lettered
//! with their story, busy keys are retried a handful of times.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_amqp::AmqpSource;
use idem_consumer::{Backoff, HandlerError, Runner};
use idem_core::{Begin, Bytes, Guard, Key, Lease, MemoryStore, Store};
use lapin::types::AMQPValue;
use support::{
    Calls, Inspect, Running, broker, config, eventually, message, publish, recording, unique,
};
use tokio::time::Instant;

fn backoff(initial_ms: u64) -> Backoff {
    Backoff {
        initial: Duration::from_millis(initial_ms),
        max: Duration::from_secs(2),
        jitter: 0.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_fails_twice_is_applied_once_after_the_backoff_delays() {
    let Some(url) = broker().await else { return };
    let queue = unique("flaky");
    let config = config(&url, &queue);
    publish(&config, [message("flaky")]).await;

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |_, attempt| {
        if attempt < 3 {
            Err(HandlerError::transient("payment service timed out"))
        } else {
            Ok(Bytes::new())
        }
    });
    let source = AmqpSource::connect(config).await.unwrap();
    let store = MemoryStore::new();
    let runner =
        Runner::new(Guard::new(store.clone()), source.clone(), handler).backoff(backoff(300));
    let running = Running::start(runner);
    let inspect = Inspect::new(&url).await;
    let done = eventually(Duration::from_secs(15), || async {
        calls.lock().len() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = running.stop().await;
    source.close().await;

    assert!(done, "{report:?}");
    let calls = calls.lock().clone();
    let attempts: Vec<u32> = calls.iter().map(|c| c.1).collect();
    assert_eq!(
        attempts,
        [1, 2, 3],
        "attempts counted through the retry queue"
    );
    // 300 ms then 600 ms of backoff, rounded up to the 500 ms and 1 s buckets.
    assert!(
        calls[1].2 - calls[0].2 >= Duration::from_millis(300),
        "{calls:?}"
    );
    assert!(
        calls[2].2 - calls[1].2 >= Duration::from_millis(600),
        "{calls:?}"
    );
    assert_eq!(report.retried_failed, 2, "{report:?}");
    assert_eq!(report.handled, 1, "{report:?}");
    let key = Key::new(queue.as_str(), "flaky").unwrap();
    assert!(matches!(
        store.begin(&key, None, Lease::from_secs(1)).await.unwrap(),
        Begin::Completed { .. }
    ));
    assert_eq!(inspect.ready(&queue).await, 0);
    assert_eq!(inspect.ready(&format!("{queue}.retry-v2.500ms")).await, 0);
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_always_fails_is_dead_lettered_with_body_headers_and_story() {
    let Some(url) = broker().await else { return };
    let queue = unique("poison");
    let config = config(&url, &queue);
    let mut m = message("poison-1");
    m.headers.push(("tenant".into(), "acme".into()));
    publish(&config, [m.clone()]).await;

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |_, _| {
        Err(HandlerError::transient("ledger refuses the entry"))
    });
    let source = AmqpSource::connect(config).await.unwrap();
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
        .backoff(backoff(20))
        .max_attempts(3);
    let running = Running::start(runner);
    let inspect = Inspect::new(&url).await;
    let dead = format!("{queue}.dead-letter");
    let parked = eventually(Duration::from_secs(15), || async {
        inspect.ready(&dead).await == 1
    })
    .await;
    let report = running.stop().await;
    source.close().await;

    assert!(parked, "{report:?}");
    assert_eq!(calls.lock().len(), 3, "three attempts, then parked");
    assert_eq!(report.dead_lettered, 1);
    let got = inspect.get(&dead).await.unwrap();
    assert_eq!(got.delivery.data, m.body.to_vec(), "original body");
    let props = &got.delivery.properties;
    assert_eq!(props.message_id().as_ref().unwrap().as_str(), "poison-1");
    assert_eq!(
        props.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert_eq!(
        props.expiration(),
        &None,
        "a parked message does not expire"
    );
    let headers = props.headers().clone().unwrap();
    let text = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("header {name}: {other:?}"),
    };
    assert_eq!(text("tenant"), "acme", "original headers kept");
    assert_eq!(text("idem-key"), "poison-1");
    assert_eq!(text("idem-attempts"), "3");
    assert!(text("idem-last-error").contains("ledger refuses the entry"));
    assert_eq!(inspect.ready(&queue).await, 0);
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_retry_is_not_held_behind_a_long_one() {
    let Some(url) = broker().await else { return };
    let queue = unique("buckets");
    let config = config(&url, &queue);
    publish(&config, [message("slow"), message("fast")]).await;

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |id, attempt| match (id, attempt) {
        // Asks for a long wait: the 20 s bucket.
        ("slow", 1) => {
            Err(HandlerError::transient("rate limited").retry_after(Duration::from_secs(20)))
        }
        ("fast", 1) => Err(HandlerError::transient("blip")),
        _ => Ok(Bytes::new()),
    });
    let source = AmqpSource::connect(config).await.unwrap();
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler)
        .backoff(backoff(100))
        .concurrency(1);
    let running = Running::start(runner);
    let inspect = Inspect::new(&url).await;
    let fast_back = eventually(Duration::from_secs(5), || async {
        calls.lock().iter().any(|c| c.0 == "fast" && c.1 == 2)
    })
    .await;
    let report = running.stop().await;
    source.close().await;

    let calls = calls.lock().clone();
    assert!(
        fast_back,
        "the short retry came back while the long one waits: {calls:?}"
    );
    let first = calls.iter().find(|c| c.0 == "fast").unwrap().2;
    let second = calls.iter().find(|c| c.0 == "fast" && c.1 == 2).unwrap().2;
    assert!(second - first < Duration::from_secs(3), "{calls:?}");
    assert!(
        !calls.iter().any(|c| c.0 == "slow" && c.1 == 2),
        "{calls:?}"
    );
    assert_eq!(
        inspect.ready(&format!("{queue}.retry-v2.20s")).await,
        1,
        "{report:?}"
    );
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_elsewhere_is_retried_a_handful_of_times_then_handled() {
    let Some(url) = broker().await else { return };
    let queue = unique("busy");
    let config = config(&url, &queue);
    let store = MemoryStore::new();
    let key = Key::new(queue.as_str(), "held").unwrap();
    let Begin::Acquired(_) = store
        .begin(&key, None, Lease::from_millis(1500))
        .await
        .unwrap()
    else {
        panic!("a fresh key")
    };
    publish(&config, [message("held")]).await;

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |_, _| Ok(Bytes::new()));
    let source = AmqpSource::connect(config).await.unwrap();
    let started = Instant::now();
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), handler);
    let running = Running::start(runner);
    let inspect = Inspect::new(&url).await;
    let handled = eventually(Duration::from_secs(15), || async {
        !calls.lock().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = running.stop().await;
    source.close().await;

    assert!(handled, "not dropped: {report:?}");
    let calls = calls.lock().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, 1, "busy retries use no attempt");
    assert!(
        calls[0].2 - started >= Duration::from_millis(1000),
        "waited for the lease"
    );
    assert!(
        (1..=5).contains(&report.retried_busy),
        "retried a handful of times, not spun on: {report:?}"
    );
    assert_eq!(report.handled, 1);
    assert_eq!(inspect.ready(&queue).await, 0);
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_deleted_while_running_is_declared_again_and_nothing_is_lost() {
    let Some(url) = broker().await else { return };
    let queue = unique("lost-dlq");
    let config = config(&url, &queue);
    publish(&config, [message("refused")]).await;
    let source = AmqpSource::connect(config).await.unwrap();
    let inspect = Inspect::new(&url).await;
    let dead = format!("{queue}.dead-letter");
    // Deleted after the source declared it.
    inspect.delete_one(&dead).await;

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |_, _| {
        Err(HandlerError::permanent("amount is negative"))
    });
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler);
    let running = Running::start(runner);
    let parked = eventually(Duration::from_secs(15), || async {
        inspect.ready_or_zero(&dead).await == 1
    })
    .await;
    let report = running.stop().await;
    source.close().await;

    assert!(parked, "{report:?}");
    assert_eq!(report.source_errors, 1, "the first park failed: {report:?}");
    assert_eq!(report.dead_lettered, 2, "{report:?}");
    assert_eq!(inspect.ready(&queue).await, 0, "not left behind");
    inspect.delete(&queue).await;
    inspect.close().await;
}
