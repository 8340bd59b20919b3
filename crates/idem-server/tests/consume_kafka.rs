//! `idem consume --from kafka://…` against the Kafka-protocol broker: the
//! shared scenarios (crash and duplicates, retries and dead letters, busy
//! keys, SIGTERM), and a sidecar killed between its effects and its commit.
#![cfg(feature = "kafka")]

mod support;
// The Kafka crate's own test fixture: a topic and group of the test's own.
#[path = "../../brokers/idem-kafka/tests/support/mod.rs"]
mod kafka_support;

use std::collections::HashMap;

use idem_kafka::{KafkaConfig, KafkaSource};
use kafka_support::Fixture;
use support::consume::{self, Broker};

struct Kafka(Fixture);

impl Kafka {
    async fn new(test: &str) -> Option<Self> {
        Some(Self(Fixture::new(&format!("consume-{test}"), 4).await?))
    }

    /// A short session: a killed member's partitions move on soon. Short
    /// retry topics for the scenarios' quick backoff.
    fn url(&self, extra: &str) -> String {
        self.0.url(&format!(
            "&session.timeout.ms=6000&heartbeat.interval.ms=500&retry-delays-ms=100,200,400,1000{extra}"
        ))
    }

    fn topics(&self) -> Vec<String> {
        let mut topics = vec![self.0.topic.clone()];
        topics.extend((0..4).map(|level| format!("{}-retry-{level}", self.0.topic)));
        topics
    }
}

impl Broker for Kafka {
    type Source = KafkaSource;

    fn source_url(&self) -> String {
        self.url("")
    }

    fn name(&self) -> String {
        self.0.topic.clone()
    }

    async fn library_source(&self) -> KafkaSource {
        let config = KafkaConfig::from_url(&self.source_url())
            .unwrap()
            .concurrency(16);
        KafkaSource::connect(config)
            .await
            .expect("the source connects")
    }

    async fn publish(&self, messages: &[(String, Vec<u8>)]) {
        for chunk in messages.chunks(200) {
            let sends = chunk.iter().map(|(id, body)| {
                self.0.publisher.publish(
                    &self.0.topic,
                    None,
                    Some(id.as_bytes()),
                    id,
                    &[("content-type", b"application/json")],
                    body,
                )
            });
            for r in futures_util::future::join_all(sends).await {
                r.expect("the broker takes the record");
            }
        }
    }

    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        self.0
            .read(&format!("{}-dlt", self.0.topic), usize::MAX)
            .await
            .into_iter()
            .map(|r| {
                let headers = r
                    .headers
                    .into_iter()
                    .map(|(k, v)| (k.to_lowercase(), v))
                    .collect();
                (headers, r.body)
            })
            .collect()
    }

    async fn drained(&self) -> bool {
        for topic in self.topics() {
            if self.0.committed_in(&topic).await != self.0.ends_in(&topic).await {
                return false;
            }
        }
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_duplicates_take_effect_once() {
    if let Some(b) = Kafka::new("crash").await {
        consume::crash_and_duplicates(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered_with_headers() {
    if let Some(b) = Kafka::new("retries").await {
        consume::retries_and_dead_letters(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_counts_waiting_messages() {
    if let Some(b) = Kafka::new("lag").await {
        consume::lag_counts_waiting_messages(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_after_a_fix() {
    if let Some(b) = Kafka::new("dlq").await {
        consume::dead_letters_replay_after_a_fix(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_keys_are_retried_after_the_lease() {
    if let Some(b) = Kafka::new("busy").await {
        consume::busy_keys_are_retried_later(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_handler_in_flight_and_acks() {
    if let Some(b) = Kafka::new("sigterm").await {
        consume::sigterm_finishes_work_in_flight(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_before_its_commit_replays_and_the_guard_absorbs_it() {
    if let Some(b) = Kafka::new("replay").await {
        let never_commit = b.url("&commit-interval-ms=600000");
        consume::killed_before_commit_replays_as_duplicates(b, &never_commit).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_answers_late_bodies_problems_and_refusals() {
    if let Some(b) = Kafka::new("answers").await {
        consume::handler_answers(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_dead_letters_creates_no_topic_and_a_replay_makes_its_log() {
    let Some(kafka) = Kafka::new("dlq-topics").await else {
        return;
    };
    let Some(dlq) = consume::park(&kafka, 3).await else {
        return;
    };
    let log = format!("{}-dlt.replayed", kafka.0.topic);
    let exists = |topic: &str| {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka.0.brokers.as_str())
            .create()
            .unwrap();
        let metadata = consumer
            .fetch_metadata(None, std::time::Duration::from_secs(10))
            .unwrap();
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none())
    };
    // park listed the letters over and over: a reader needs no right to
    // write, and wrote nothing.
    assert!(!exists(&log), "ls created {log}");
    let (code, out, err) = dlq(&["replay", "--all", "--yes", "--no-store-check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(exists(&log), "the replay records itself in {log}");
    let (code, out, _) = dlq(&["ls", "--json"]);
    assert_eq!((code, out.lines().count()), (0, 0), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_settle_each_message_by_its_own_result() {
    if let Some(b) = Kafka::new("batches").await {
        consume::batches(b).await;
    }
}
