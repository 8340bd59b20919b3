//! The topics the source creates (the topic when missing, its retry
//! topics, its dead-letter topic) get the configured replication, so that a
//! copy whose original is committed is as durable as the topic it left.

mod support;

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use support::{Fixture, unique};

/// Replicas per partition of `topic`, as the brokers report them.
fn replicas(brokers: &str, topic: &str) -> Vec<usize> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the broker answers Metadata");
    metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.replicas().len()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_topics_get_the_configured_replication() {
    let Some(f) = Fixture::new("topics", 1).await else {
        return;
    };
    // A topic the source creates itself, with its retry and dead-letter
    // topics.
    let topic = unique("created");
    let url = format!(
        "kafka://{}?topic={topic}&group={topic}-g&partitions=2&replication=1&retry-delays-ms=100",
        f.brokers
    );
    let source = idem_kafka::KafkaSource::connect(idem_kafka::KafkaConfig::from_url(&url).unwrap())
        .await
        .expect("the source connects");
    source.close().await;
    let brokers = f.brokers.clone();
    let (main, retry, dead) = tokio::task::spawn_blocking(move || {
        (
            replicas(&brokers, &topic),
            replicas(&brokers, &format!("{topic}-retry-0")),
            replicas(&brokers, &format!("{topic}-dlt")),
        )
    })
    .await
    .unwrap();
    assert_eq!(main, [1, 1]);
    assert_eq!(retry, [1, 1]);
    assert_eq!(dead, [1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_created_topics_get_the_brokers_replication() {
    let Some(f) = Fixture::new("topics-default", 1).await else {
        return;
    };
    // Asked for with replication -1: the brokers' default.
    let source = f.source("").await;
    source.close().await;
    let brokers = f.brokers.clone();
    let dead = format!("{}-dlt", f.topic);
    let dead = tokio::task::spawn_blocking(move || replicas(&brokers, &dead))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "the dead-letter topic exists");
    assert!(dead[0] >= 1, "{dead:?}");
}
