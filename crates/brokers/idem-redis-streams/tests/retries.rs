//! Failed and busy messages come back later through the retry set, counted
//! as the attempt rule says; exhausted ones land in the dead-letter stream.

mod support;

use std::time::Duration;

use idem_consumer::{Backoff, HandlerError, Message, Runner};
use idem_core::{Begin, Bytes, ClaimHandle, Key, Lease, Store};
use parking_lot::Mutex;
use std::sync::Arc;
use support::{Effects, Fixture, Running, eventually, guard, message};
use tokio::time::Instant;

/// A handler that fails while `fails(attempt)` and records the attempts it
/// saw, and when each came.
fn flaky(
    calls: Arc<Mutex<Vec<(u32, Instant)>>>,
    effects: Effects,
    fails: fn(u32) -> bool,
) -> impl Fn(
    Message,
    ClaimHandle,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Bytes, HandlerError>> + Send>>
+ Send
+ Sync
+ 'static {
    move |m: Message, _| {
        let (calls, effects) = (calls.clone(), effects.clone());
        Box::pin(async move {
            calls.lock().push((m.attempt, Instant::now()));
            if fails(m.attempt) {
                return Err(HandlerError::transient("card declined"));
            }
            effects.record(&m);
            Ok(Bytes::new())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_twice_is_applied_once_after_backoff_through_the_retry_set() {
    let Some(fx) = Fixture::new("fail-twice") else {
        return;
    };
    fx.publisher().await.publish(&message("p-1")).await.unwrap();
    let (calls, effects) = (Arc::default(), Effects::default());
    let backoff = Backoff {
        initial: Duration::from_millis(300),
        max: Duration::from_secs(5),
        jitter: 0.0,
    };
    let handler = flaky(Arc::clone(&calls), effects.clone(), |attempt| attempt < 3);
    let runner = Runner::new(guard(10_000), fx.source().await, handler).backoff(backoff);
    let running = Running::start(runner);
    eventually(
        Duration::from_secs(5),
        "the failed copy parked in the retry set",
        || async { fx.backlog().await.delayed == 1 },
    )
    .await;
    eventually(Duration::from_secs(10), "applied", || async {
        effects.total() == 1 && fx.backlog().await.is_drained()
    })
    .await;
    let report = running.stop().await;

    let calls = calls.lock().clone();
    let attempts: Vec<u32> = calls.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, [1, 2, 3], "each failure counts one attempt");
    assert_eq!(effects.of("p-1"), [3]);
    let (first, second) = (calls[1].1 - calls[0].1, calls[2].1 - calls[1].1);
    // Redis's clock sets the due time; allow it a few ms of disagreement.
    assert!(
        first >= Duration::from_millis(280),
        "first retry after {first:?}"
    );
    assert!(
        second >= Duration::from_millis(580),
        "second retry after {second:?}"
    );
    assert_eq!(report.retried_failed, 2);
    assert_eq!(report.handled, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_failing_message_is_dead_lettered_after_max_attempts_with_its_headers() {
    let Some(fx) = Fixture::new("dead-letter") else {
        return;
    };
    let mut sent = message("d-1");
    sent.content_type = Some("text/plain".into());
    sent.headers = vec![("tenant".into(), Bytes::from("t9"))];
    fx.publisher().await.publish(&sent).await.unwrap();
    let (calls, effects) = (Arc::default(), Effects::default());
    let handler = flaky(Arc::clone(&calls), effects.clone(), |_| true);
    let runner = Runner::new(guard(10_000), fx.source().await, handler)
        .max_attempts(3)
        .backoff(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(100),
            jitter: 0.0,
        });
    let running = Running::start(runner);
    eventually(Duration::from_secs(10), "dead-lettered", || async {
        fx.dead_letters().len() == 1 && fx.backlog().await.is_drained()
    })
    .await;
    let report = running.stop().await;

    let attempts: Vec<u32> = calls.lock().iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(effects.total(), 0);
    assert_eq!(report.dead_lettered, 1);
    let dead = &fx.dead_letters()[0];
    let field = |name: &str| dead.get(name).map(String::as_str);
    assert_eq!(field("message-id"), Some("d-1"));
    assert_eq!(field("body"), Some("body of d-1"));
    assert_eq!(field("content-type"), Some("text/plain"));
    assert_eq!(field("tenant"), Some("t9"));
    assert_eq!(field("idem-key"), Some("d-1"));
    assert_eq!(field("idem-attempts"), Some("3"));
    assert!(
        field("idem-last-error").is_some_and(|e| e.contains("card declined")),
        "{dead:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_by_another_consumer_is_retried_later_without_spinning() {
    let Some(fx) = Fixture::new("busy") else {
        return;
    };
    let guard = guard(10_000);
    let key = Key::new(fx.stream.as_str(), "b-1").unwrap();
    let held_at = Instant::now();
    let held = guard
        .store()
        .begin(&key, None, Lease::from_millis(800))
        .await
        .unwrap();
    assert!(matches!(held, Begin::Acquired(_)), "{held:?}");
    fx.publisher().await.publish(&message("b-1")).await.unwrap();
    let (calls, effects) = (Arc::default(), Effects::default());
    let handler = flaky(Arc::clone(&calls), effects.clone(), |_| false);
    let running = Running::start(Runner::new(guard, fx.source().await, handler));
    eventually(
        Duration::from_secs(10),
        "handled once the lease ran out",
        || async { effects.total() == 1 && fx.backlog().await.is_drained() },
    )
    .await;
    let report = running.stop().await;

    let calls = calls.lock().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, 1, "waiting for a busy key uses no attempt");
    assert!(
        calls[0].1 - held_at >= Duration::from_millis(750),
        "ran while the key was held"
    );
    assert!(
        (1..=10).contains(&report.retried_busy),
        "busy retries: {} (a spin makes hundreds)",
        report.retried_busy
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_copies_come_back_once_when_two_consumers_move_them() {
    use idem_consumer::{RetryReason, Source};
    let Some(fx) = Fixture::new("promote-race") else {
        return;
    };
    const N: usize = 100;
    let publisher = fx.publisher().await;
    for i in 0..N {
        publisher
            .publish(&message(&format!("r-{i}")))
            .await
            .unwrap();
    }
    let config = fx.config().concurrency(N);
    let a = fx.source_with(config.clone().consumer("a")).await;
    let b = fx.source_with(config.consumer("b")).await;
    let mut read = 0;
    while read < N {
        for d in a.fetch(N).await.unwrap() {
            read += 1;
            a.retry(d, Duration::from_millis(300), RetryReason::Busy)
                .await
                .unwrap();
        }
    }
    assert_eq!(fx.backlog().await.delayed, N as u64);

    let take = |source: idem_redis_streams::RedisStreamSource| async move {
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            for d in source.fetch(N).await.unwrap() {
                got.push((d.message.id.clone().unwrap(), d.message.attempt));
                source.ack(d).await.unwrap();
            }
        }
        got
    };
    let (from_a, from_b) = tokio::join!(take(a), take(b));
    let mut ids: Vec<_> = from_a
        .iter()
        .chain(&from_b)
        .map(|(id, _)| id.clone())
        .collect();
    let all = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(
        all,
        N,
        "every copy came back exactly once (a {}, b {})",
        from_a.len(),
        from_b.len()
    );
    assert_eq!(ids.len(), N);
    assert!(
        from_a
            .iter()
            .chain(&from_b)
            .all(|(_, attempt)| *attempt == 1),
        "a busy retry uses no attempt"
    );
    assert!(fx.backlog().await.is_drained());
}
