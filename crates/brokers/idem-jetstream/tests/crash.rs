//! A consumer that dies mid-handler, without acking: the server redelivers
//! the message after AckWait, and it is handled once.

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use idem_consumer::testing::die_mid_handler;
use idem_core::{Guard, Lease, MemoryStore};
use support::{Effects, Fixture, spawn, wait_settled, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_consumer_died_is_redelivered_and_handled_once() {
    let Some(f) = Fixture::new("crash").await else {
        return;
    };
    let store = MemoryStore::new();
    let lease = Duration::from_secs(2);
    let config = f.config().ack_wait(Duration::from_secs(1)).lease(lease);
    // Declares the stream and the consumer; pulls only once run.
    let source = f.source(config.clone()).await;
    f.publish("paid", "order-1", &[], "{}").await;

    // The first consumer runs on a runtime of its own (its connection too),
    // and dies with it while its handler works.
    let first_config = config.clone();
    die_mid_handler(
        Guard::new(store.clone()).lease(Lease::new(lease)),
        move || async move {
            idem_jetstream::JetStreamSource::connect(first_config)
                .await
                .unwrap()
        },
        Duration::from_secs(10),
    )
    .await;

    let effects = Effects::default();
    let handler = effects.handler(Duration::ZERO);
    let guard = Guard::new(store).lease(Lease::new(lease));
    let running = spawn(Runner::new(guard, source.clone(), handler));
    wait_until(
        Duration::from_secs(15),
        "the redelivery to be handled",
        || async { effects.applied("order-1") == 1 },
    )
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    assert_eq!(effects.calls("order-1"), 1, "handled once after the crash");
    let attempt = effects.attempts("order-1")[0];
    assert!(
        attempt >= 2,
        "the lost delivery counts as an attempt: {attempt}"
    );
    assert_eq!(report.handled, 1, "{report:?}");
}
