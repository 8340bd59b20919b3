//! A consumer that dies mid-handler, without acking: the next consumer of
//! the group starts from the committed offset, gets the message, and it is
//! handled once (the first claim is waited out).

mod support;

use std::sync::mpsc;
use std::time::Duration;

use idem_consumer::Runner;
use idem_core::{Guard, Lease, MemoryStore};
use idem_rocketmq::RocketMqSource;
use support::{Effects, Fixture, done, spawn, wait_until};
use tokio_util::sync::CancellationToken;

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
    let (started_tx, started_rx) = mpsc::channel();
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let first_store = store.clone();
    let first_config = config.clone();
    doomed.spawn(async move {
        let source = RocketMqSource::connect(first_config).await.unwrap();
        let handler = move |_m: idem_consumer::Message, _claim: support::Claim| {
            let started = started_tx.clone();
            async move {
                started.send(()).unwrap();
                std::future::pending::<()>().await;
                done()
            }
        };
        let guard = Guard::new(first_store).lease(Lease::new(lease));
        let _ = Runner::new(guard, source, handler)
            .run(CancellationToken::new())
            .await;
    });
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the first handler starts");
    doomed.shutdown_background();

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
