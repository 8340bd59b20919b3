//! A handler longer than AckWait is kept alive with progress acks, and a
//! shutdown lets a slow handler finish and ack before `run` returns.

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use support::{Effects, Fixture, guard, spawn, wait_settled, wait_until};

#[tokio::test]
async fn a_handler_longer_than_ack_wait_is_not_redelivered_meanwhile() {
    let Some(f) = Fixture::new("progress").await else {
        return;
    };
    let source = f.source(f.config().ack_wait(Duration::from_secs(1))).await;
    assert_eq!(source.ack_wait(), Duration::from_secs(1));
    f.publish("paid", "order-1", &[], "{}").await;
    let effects = Effects::default();
    let handler = effects.handler(Duration::from_secs(3));
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        handler,
    ));
    wait_until(Duration::from_secs(10), "the handler to finish", || async {
        effects.applied("order-1") == 1
    })
    .await;
    wait_settled(&source).await;
    // A redelivery would show as a second (parked, then duplicate) copy.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let info = source.consumer_info().await.unwrap();
    let report = running.stop().await;

    assert_eq!(effects.calls("order-1"), 1, "one handler run");
    assert_eq!(effects.attempts("order-1"), [1]);
    assert_eq!(info.num_redelivered, 0, "the server never redelivered it");
    assert_eq!(info.delivered.stream_sequence, 1);
    assert_eq!((report.handled, report.duplicates), (1, 0), "{report:?}");
}

#[tokio::test]
async fn messages_wait_at_the_server_not_in_the_client_while_handlers_are_busy() {
    let Some(f) = Fixture::new("nobuffer").await else {
        return;
    };
    let source = f
        .source(f.config().ack_wait(Duration::from_secs(1)).concurrency(2))
        .await;
    let effects = Effects::default();
    let handler = effects.handler(Duration::from_millis(2000));
    let running =
        spawn(Runner::new(guard(Duration::from_secs(10)), source.clone(), handler).concurrency(2));
    f.publish("paid", "order-1", &[], "{}").await;
    wait_until(Duration::from_secs(10), "the first handler", || async {
        effects.started("order-1")
    })
    .await;
    // Two more while one handler slot is free: one is taken, the other must
    // stay at the server until a slot frees, past its AckWait.
    f.publish("paid", "order-2", &[], "{}").await;
    f.publish("paid", "order-3", &[], "{}").await;
    wait_until(Duration::from_secs(15), "all three handled", || async {
        effects.applied_total() == 3
    })
    .await;
    wait_settled(&source).await;
    let info = source.consumer_info().await.unwrap();
    let report = running.stop().await;

    // A message pulled ahead into the client while both handlers worked
    // would have outlived its AckWait there and come back redelivered.
    for key in ["order-1", "order-2", "order-3"] {
        assert_eq!(effects.attempts(key), [1], "{key}: its first delivery");
    }
    assert_eq!(info.num_redelivered, 0);
    assert_eq!((report.handled, report.duplicates), (3, 0), "{report:?}");
}

#[tokio::test]
async fn shutdown_lets_a_slow_handler_finish_and_ack() {
    let Some(f) = Fixture::new("shutdown").await else {
        return;
    };
    let source = f.source(f.config()).await;
    f.publish("paid", "order-1", &[], "{}").await;
    let effects = Effects::default();
    let handler = effects.handler(Duration::from_millis(1500));
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler)
            .shutdown_grace(Duration::from_secs(10)),
    );
    wait_until(Duration::from_secs(10), "the handler to start", || async {
        effects.started("order-1")
    })
    .await;
    let report = running.stop().await;

    assert_eq!(effects.applied("order-1"), 1, "the handler finished");
    assert_eq!((report.handled, report.requeued), (1, 0), "{report:?}");
    let info = source.consumer_info().await.unwrap();
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "acked before run returned"
    );
    wait_settled(&source).await;
}

#[tokio::test]
async fn a_handler_past_the_shutdown_grace_is_handed_back_for_immediate_redelivery() {
    let Some(f) = Fixture::new("handback").await else {
        return;
    };
    let source = f.source(f.config()).await;
    assert_eq!(source.ack_wait(), Duration::from_secs(30));
    f.publish("paid", "order-1", &[], "{}").await;
    let store = idem_core::MemoryStore::new();
    let lease = idem_core::Lease::new(Duration::from_secs(10));
    let stuck = Effects::default();
    let running = spawn(
        Runner::new(
            idem_core::Guard::new(store.clone()).lease(lease),
            source.clone(),
            stuck.handler(Duration::from_secs(60)),
        )
        .shutdown_grace(Duration::from_millis(200)),
    );
    wait_until(Duration::from_secs(10), "the handler to start", || async {
        stuck.started("order-1")
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.requeued, 1, "{report:?}");

    // The next consumer gets it at once, not after the 30 s AckWait, and
    // the released claim lets it run.
    let effects = Effects::default();
    let running = spawn(Runner::new(
        idem_core::Guard::new(store).lease(lease),
        source.clone(),
        effects.handler(Duration::ZERO),
    ));
    wait_until(Duration::from_secs(5), "the redelivery", || async {
        effects.applied("order-1") == 1
    })
    .await;
    wait_settled(&source).await;
    running.stop().await;
    assert_eq!(
        stuck.applied("order-1"),
        0,
        "the first handler never finished"
    );
    // The server may roll a nak'd last delivery back, so the hand-back
    // need not count as an attempt.
    assert_eq!(
        effects.calls("order-1"),
        1,
        "handled once, by the next consumer"
    );
}
