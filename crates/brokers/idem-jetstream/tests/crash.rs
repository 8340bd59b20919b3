//! A consumer that dies mid-handler, without acking: the server redelivers
//! the message after AckWait, and it is handled once.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use idem_consumer::Runner;
use idem_core::{Guard, Lease, MemoryStore};
use support::{Effects, Fixture, done, spawn, wait_settled, wait_until};
use tokio_util::sync::CancellationToken;

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
    let (started_tx, started_rx) = mpsc::channel();
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let first_store = store.clone();
    let first_config = config.clone();
    doomed.spawn(async move {
        let source = idem_jetstream::JetStreamSource::connect(first_config)
            .await
            .unwrap();
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
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the first handler starts");
    doomed.shutdown_background();

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
