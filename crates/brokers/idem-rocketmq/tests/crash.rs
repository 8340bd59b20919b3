//! A consumer that dies mid-handler, without acking: the next consumer of
//! the group starts from the committed offset, gets the message, and it is
//! handled once (the first claim is waited out).

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use idem_consumer::testing::die_mid_handler;
use idem_core::{Guard, Lease, MemoryStore};
use idem_rocketmq::RocketMqSource;
use support::{Effects, Fixture, spawn, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_consumer_died_is_redelivered_and_handled_once() {
    let Some(f) = Fixture::new("crash").await else {
        return;
    };
    let store = MemoryStore::new();
    let lease = Duration::from_secs(2);
    let config = f.config().lease(lease);
    f.publish("order-1", &[], "{}").await;

    // The first consumer runs on a runtime of its own and dies with it
    // while its handler works.
    let first_config = config.clone();
    die_mid_handler(
        Guard::new(store.clone()).lease(Lease::new(lease)),
        move || async move { RocketMqSource::connect(first_config).await.unwrap() },
        Duration::from_secs(30),
    )
    .await;

    let source = f.source(config).await;
    let effects = Effects::default();
    let handler = effects.handler(Duration::ZERO);
    let guard = Guard::new(store).lease(Lease::new(lease));
    let running = spawn(Runner::new(guard, source.clone(), handler));
    wait_until(
        Duration::from_secs(60),
        "the redelivery to be handled",
        || async { effects.applied("order-1") == 1 },
    )
    .await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;

    assert_eq!(effects.calls("order-1"), 1, "handled once after the crash");
    assert_eq!(report.handled, 1, "{report:?}");
}
