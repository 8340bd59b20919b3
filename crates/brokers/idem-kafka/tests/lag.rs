//! The consumer lag of each partition: messages after the committed
//! offset, from librdkafka's statistics.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_consumer::Runner;
use idem_core::{Guard, MemoryStore};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use support::recorder::recorder;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_no_longer_reports_lag() {
    let Some(f) = Fixture::new("lag-revoked", 2).await else {
        return;
    };
    let metrics = recorder();
    for i in 0..20 {
        f.publish(&format!("m-{i}"), Some(i % 2), "{}").await;
    }
    let source = f
        .source("&session.timeout.ms=6000&heartbeat.interval.ms=500")
        .await;
    let effects = Effects::default();
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        effects.handler(),
    ));
    f.wait_committed(&[(0, 10), (1, 10)].into()).await;
    running.stop().await;
    // The member stays and reads 5 more per partition it never finishes.
    for i in 20..30 {
        f.publish(&format!("m-{i}"), Some(i % 2), "{}").await;
    }
    let gauge = |p: i32| {
        metrics.gauge(
            "idem_kafka_consumer_lag",
            &format!("group={},partition={p},topic={}", f.group, f.topic),
        )
    };
    wait_until(
        "a lag of 5 on each partition",
        Duration::from_secs(20),
        || gauge(0) == Some(5.0) && gauge(1) == Some(5.0),
    )
    .await;

    // Another member joins and takes one partition.
    let stop = Arc::new(AtomicBool::new(false));
    let other = {
        let (brokers, group, topic, stop) = (
            f.brokers.clone(),
            f.group.clone(),
            f.topic.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .set("enable.auto.commit", "false")
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500")
                .create()
                .unwrap();
            consumer.subscribe(&[&topic]).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(100));
            }
        })
    };
    let mut held = Vec::new();
    wait_until("one partition each", Duration::from_secs(60), || {
        held = source.assignment();
        held.retain(|(t, _)| *t == f.topic);
        held.len() == 1
    })
    .await;
    let kept = held[0].1;
    let given = 1 - kept;
    // Statistics come every 500 ms: give the gauges time to be reported.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        gauge(given),
        Some(0.0),
        "partition {given} is the other member's; this one reports no lag for it"
    );
    let mut lag = source.lag();
    lag.retain(|(t, _, _)| *t == f.topic);
    assert_eq!(lag, [(f.topic.clone(), kept, 5)]);
    stop.store(true, Ordering::Relaxed);
    other.join().unwrap();
    source.close().await;
}
