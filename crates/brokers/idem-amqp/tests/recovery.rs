//! Connection loss: the source reconnects and the queue drains with each
//! effect once; a consumer that dies mid-handler uses up an attempt, so a
//! message that kills the process each time is dead-lettered eventually.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_amqp::AmqpSource;
use idem_consumer::{HandlerError, Message, Runner, Source};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use parking_lot::Mutex;
use support::{
    Effects, Inspect, Running, Vhost, applying, broker, config, drain, eventually, message,
    publish, repeated,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_broker_closes_every_connection_the_queue_drains_with_each_effect_once() {
    let Some(url) = broker().await else { return };
    let Some(vhost) = Vhost::create(&url).await else {
        return;
    };
    let queue = "orders";
    let config = config(&vhost.url, queue).concurrency(16);
    const N: usize = 300;
    publish(&config, (0..N).map(|i| message(&format!("order-{i}")))).await;

    let effects = Effects::default();
    let handler = applying(&effects, Duration::from_millis(10));
    let source = AmqpSource::connect(config).await.unwrap();
    let runner =
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).concurrency(16);
    let running = Running::start(runner);
    for at in [60, 160] {
        assert!(
            eventually(Duration::from_secs(20), || async {
                effects.lock().len() >= at
            })
            .await
        );
        vhost.close_all_connections().await;
    }
    let inspect = Inspect::new(&vhost.url).await;
    let (drained, report) = drain(
        running,
        &source,
        &inspect,
        queue,
        &effects,
        N,
        Duration::from_secs(40),
    )
    .await;

    assert!(drained, "{report:?}");
    assert_eq!(repeated(&effects), [], "effects applied twice");
    assert!(
        report.fetch_errors >= 2,
        "both losses were seen and recovered from: {report:?}"
    );
    assert_eq!(report.handled, N as u64, "{report:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(inspect.ready(queue).await, 0, "nothing left unacked");
    inspect.close().await;
    vhost.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_consumer_each_time_uses_an_attempt_per_death_and_is_dead_lettered()
 {
    let Some(url) = broker().await else { return };
    let Some(vhost) = Vhost::create(&url).await else {
        return;
    };
    let queue = "orders";
    let config = config(&vhost.url, queue);
    publish(&config, [message("poison")]).await;

    // Three consumers take the message and die before settling it.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let source = AmqpSource::connect(config.clone()).await.unwrap();
        // A redelivery is first counted (republished), so it may take a
        // few fetches to come through.
        let mut got = Vec::new();
        for _ in 0..20 {
            got = source.fetch(1).await.unwrap();
            if !got.is_empty() {
                break;
            }
        }
        assert_eq!(got.len(), 1, "the message came back");
        seen.push(got[0].message.attempt);
        vhost.close_all_connections().await;
        drop(got);
    }
    assert_eq!(seen, [1, 2, 3], "each death counted one attempt");

    let calls = Arc::new(Mutex::new(0));
    let handler = {
        let calls = calls.clone();
        move |_m: Message, _c: ClaimHandle| {
            *calls.lock() += 1;
            async { Ok::<_, HandlerError>(Bytes::new()) }
        }
    };
    let source = AmqpSource::connect(config).await.unwrap();
    let runner =
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).max_attempts(3);
    let running = Running::start(runner);
    let inspect = Inspect::new(&vhost.url).await;
    let parked = eventually(Duration::from_secs(10), || async {
        inspect.ready("orders.dead-letter").await == 1
    })
    .await;
    let report = running.stop().await;
    source.close().await;
    assert!(parked, "{report:?}");
    assert_eq!(*calls.lock(), 0, "not handled a fourth time");
    assert_eq!(inspect.ready(queue).await, 0);
    inspect.close().await;
    vhost.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_broker_refuses_connections_the_source_keeps_trying_then_resumes() {
    let Some(url) = broker().await else { return };
    let Some(vhost) = Vhost::create(&url).await else {
        return;
    };
    let queue = "orders";
    let config = config(&vhost.url, queue);
    const N: usize = 60;
    publish(&config, (0..N).map(|i| message(&format!("order-{i}")))).await;

    let effects = Effects::default();
    let handler = applying(&effects, Duration::from_millis(20));
    let source = AmqpSource::connect(config.concurrency(4)).await.unwrap();
    let runner =
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).concurrency(4);
    let running = Running::start(runner);
    assert!(
        eventually(Duration::from_secs(20), || async {
            effects.lock().len() >= 10
        })
        .await
    );
    // The broker is away: connections closed and new ones refused.
    vhost.permit(false).await;
    vhost.close_all_connections().await;
    let during = effects.lock().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_pause = effects.lock().len();
    vhost.permit(true).await;
    let inspect = Inspect::new(&vhost.url).await;
    let (drained, report) = drain(
        running,
        &source,
        &inspect,
        queue,
        &effects,
        N,
        Duration::from_secs(30),
    )
    .await;

    assert!(drained, "{report:?}");
    assert!(
        after_pause <= during + 4,
        "no work while away, beyond what was in hand"
    );
    assert!(
        report.fetch_errors >= 3,
        "kept trying with backoff: {report:?}"
    );
    assert_eq!(repeated(&effects), [], "effects applied twice");
    assert_eq!(inspect.ready(queue).await, 0);
    inspect.close().await;
    vhost.delete().await;
}
