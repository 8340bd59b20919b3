//! The consumer lag of each partition: messages after the committed
//! offset, from librdkafka's statistics.

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use idem_core::{Guard, MemoryStore};
use support::{Effects, Fixture, Running, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_counts_messages_after_the_committed_offset() {
    let Some(f) = Fixture::new("lag", 1).await else {
        return;
    };
    for i in 0..30 {
        f.publish(&format!("m-{i}"), Some(0), "{}").await;
    }
    let source = f.source("&retry=blocking").await;
    let effects = Effects::default();
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        effects.handler(),
    ));
    wait_until("30 effects", Duration::from_secs(30), || {
        effects.count() == 30
    })
    .await;
    let topic = f.topic.clone();
    wait_until("a lag of 0", Duration::from_secs(20), || {
        source.lag() == [(topic.clone(), 0, 0)]
    })
    .await;
    running.stop().await;

    // The runner is gone; the member stays and reads 20 more it never
    // finishes.
    for i in 30..50 {
        f.publish(&format!("m-{i}"), Some(0), "{}").await;
    }
    wait_until("a lag of 20", Duration::from_secs(20), || {
        source.lag() == [(topic.clone(), 0, 20)]
    })
    .await;
    source.close().await;
}
