//! A consumer that dies leaves its entries to the others; one that shuts
//! down finishes or hands back what it holds.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner, Source};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use idem_redis_streams::RedisStreamSource;
use parking_lot::Mutex;
use support::{Effects, Fixture, Running, eventually, guard, message};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A handler that reports each start with its attempt, then never ends.
fn hangs(started: mpsc::UnboundedSender<u32>) -> impl idem_consumer::Handler {
    move |m: Message, _: ClaimHandle| {
        let started = started.clone();
        async move {
            let _ = started.send(m.attempt);
            std::future::pending::<Result<Bytes, HandlerError>>().await
        }
    }
}

/// A handler that records its effect after `work`.
fn works(effects: Effects, work: Duration) -> impl idem_consumer::Handler {
    move |m: Message, _: ClaimHandle| {
        let effects = effects.clone();
        async move {
            tokio::time::sleep(work).await;
            effects.record(&m);
            Ok::<_, HandlerError>(Bytes::new())
        }
    }
}

/// Runs a consumer named `consumer` on a runtime of its own until its
/// handler starts, then shuts that runtime down: every task of the consumer
/// stops at once, as in a crash (no ack, no release, no keep-alive).
/// Answers the attempt the handler saw.
async fn die_while_handling(fx: &Fixture, guard: &Guard<MemoryStore>, consumer: &str) -> u32 {
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let config = fx.config().consumer(consumer);
    let guard = guard.clone();
    doomed.spawn(async move {
        let source = RedisStreamSource::connect(config).await.unwrap();
        Runner::new(guard, source, hangs(started_tx))
            .max_attempts(2)
            .run(CancellationToken::new())
            .await
    });
    let attempt = tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("the doomed consumer starts the handler")
        .unwrap();
    // Long enough for a keep-alive, which must not save the entry.
    tokio::time::sleep(Duration::from_millis(300)).await;
    doomed.shutdown_background();
    assert!(
        started.try_recv().is_err(),
        "the doomed consumer ran the handler once"
    );
    attempt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_consumers_is_dead_lettered_after_max_attempts() {
    let Some(fx) = Fixture::new("poison") else {
        return;
    };
    fx.publisher().await.publish(&message("x-1")).await.unwrap();
    let guard = guard(1_000);
    assert_eq!(die_while_handling(&fx, &guard, "a").await, 1);
    assert_eq!(
        die_while_handling(&fx, &guard, "b").await,
        2,
        "the claim from the dead consumer counts an attempt"
    );

    let effects = Effects::default();
    let c = fx.source_with(fx.config().consumer("c")).await;
    let running = Running::start(
        Runner::new(guard, c, works(effects.clone(), Duration::ZERO)).max_attempts(2),
    );
    eventually(Duration::from_secs(15), "dead-lettered", || async {
        fx.dead_letters().len() == 1 && fx.backlog().await.is_drained()
    })
    .await;
    let report = running.stop().await;

    assert_eq!(effects.total(), 0, "not run a third time");
    assert_eq!(report.dead_lettered, 1);
    let dead = &fx.dead_letters()[0];
    assert_eq!(dead.get("idem-attempts").map(String::as_str), Some("3"));
    assert_eq!(dead.get("message-id").map(String::as_str), Some("x-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_dies_mid_handler_is_claimed_after_the_idle_time_and_counted() {
    let Some(fx) = Fixture::new("dies") else {
        return;
    };
    fx.publisher().await.publish(&message("c-1")).await.unwrap();
    let guard = guard(1_000);

    let first = die_while_handling(&fx, &guard, "a").await;
    assert_eq!(first, 1);
    assert_eq!(fx.backlog().await.pending, 1, "A died holding the entry");

    let effects = Effects::default();
    let b = fx.source_with(fx.config().consumer("b")).await;
    let running = Running::start(Runner::new(
        guard,
        b,
        works(effects.clone(), Duration::ZERO),
    ));
    eventually(
        Duration::from_secs(10),
        "B handles the entry A left",
        || async { effects.total() == 1 && fx.backlog().await.is_drained() },
    )
    .await;
    running.stop().await;

    assert_eq!(
        effects.of("c-1"),
        [2],
        "the delivery to the dead consumer counts as an attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_a_slow_handler_finish_and_acks_it() {
    let Some(fx) = Fixture::new("graceful") else {
        return;
    };
    fx.publisher().await.publish(&message("g-1")).await.unwrap();
    let effects = Effects::default();
    let started = Arc::new(Mutex::new(false));
    let handler = {
        let (effects, started) = (effects.clone(), started.clone());
        move |m: Message, _: ClaimHandle| {
            let (effects, started) = (effects.clone(), started.clone());
            async move {
                *started.lock() = true;
                tokio::time::sleep(Duration::from_millis(800)).await;
                effects.record(&m);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let running = Running::start(Runner::new(guard(10_000), fx.source().await, handler));
    eventually(Duration::from_secs(10), "the handler started", || async {
        *started.lock()
    })
    .await;
    let report = running.stop().await;

    assert_eq!(effects.of("g-1"), [1], "the slow handler finished");
    assert_eq!(report.handled, 1);
    assert_eq!(report.requeued, 0);
    assert!(
        fx.backlog().await.is_drained(),
        "the finished message was acked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_unfinished_at_shutdown_is_handed_back_at_once_without_using_an_attempt() {
    let Some(fx) = Fixture::new("hand-back") else {
        return;
    };
    fx.publisher().await.publish(&message("h-1")).await.unwrap();
    // Claims from dead consumers wait 30 s: only a hand-back brings the
    // message back within this test.
    let config = fx.config().claim_idle(Duration::from_secs(30));
    let guard = guard(10_000);
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let first = Running::start(
        Runner::new(
            guard.clone(),
            fx.source_with(config.clone()).await,
            hangs(started_tx),
        )
        .shutdown_grace(Duration::from_millis(200)),
    );
    tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("the handler starts");
    let report = first.stop().await;
    assert_eq!(report.requeued, 1);

    let effects = Effects::default();
    let second = Running::start(Runner::new(
        guard,
        fx.source_with(config).await,
        works(effects.clone(), Duration::ZERO),
    ));
    eventually(
        Duration::from_secs(5),
        "the handed-back copy is handled",
        || async { effects.total() == 1 && fx.backlog().await.is_drained() },
    )
    .await;
    second.stop().await;
    assert_eq!(effects.of("h-1"), [1], "a hand-back uses no attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_dropped_while_blocked_hands_back_what_it_read() {
    let Some(fx) = Fixture::new("dropped-fetch") else {
        return;
    };
    // Only a hand-back can bring the entry back within this test.
    let source = fx
        .source_with(fx.config().claim_idle(Duration::from_secs(30)))
        .await;
    let publisher = fx.publisher().await;
    let blocked = tokio::time::timeout(Duration::from_millis(50), source.fetch(10)).await;
    assert!(blocked.is_err(), "the read was blocked and is dropped");
    // The read is still blocked at Redis: this entry goes to it.
    publisher.publish(&message("f-1")).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let got = loop {
        let got = source.fetch(10).await.unwrap();
        if !got.is_empty() || tokio::time::Instant::now() > deadline {
            break got;
        }
    };
    assert_eq!(
        got.len(),
        1,
        "the entry read for the dropped fetch came back"
    );
    assert_eq!(got[0].message.id.as_deref(), Some("f-1"));
    assert_eq!(got[0].message.attempt, 1, "a hand-back uses no attempt");
}
