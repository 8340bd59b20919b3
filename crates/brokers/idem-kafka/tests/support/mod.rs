//! The Kafka tests' fixture: a topic and group of the test's own on the
//! broker at `IDEM_TEST_KAFKA_URL` (default `127.0.0.1:9092`), a
//! publisher, and readers of topics and committed offsets.
#![allow(dead_code)]

pub mod recorder;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_consumer::{Handler, HandlerError, Message, Report, Runner};
use idem_core::{Bytes, ClaimHandle, Store};
use idem_kafka::{KafkaConfig, KafkaPublisher, KafkaSource};
use parking_lot::Mutex;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

pub type Claim = ClaimHandle;

/// A record read back from a topic.
#[derive(Clone, Debug)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

pub struct Fixture {
    pub brokers: String,
    pub topic: String,
    pub group: String,
    pub partitions: i32,
    pub publisher: KafkaPublisher,
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}-{}-{:x}",
        std::process::id(),
        nanos & 0xff_ffff_ffff
    )
}

impl Fixture {
    /// A fresh topic with `partitions` partitions, or `None` (skipped) when
    /// no broker answers and services are not required.
    pub async fn new(test: &str, partitions: i32) -> Option<Self> {
        let brokers = idem_testkit::services::url("IDEM_TEST_KAFKA_URL", "127.0.0.1:9092");
        let brokers = brokers.trim_start_matches("kafka://").to_owned();
        if let Err(e) = tokio::net::TcpStream::connect(brokers.split(',').next().unwrap()).await {
            return idem_testkit::services::absent("Kafka", &brokers, e);
        }
        let topic = unique(test);
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        let created = admin
            .create_topics(
                &[NewTopic::new(
                    &topic,
                    partitions,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new(),
            )
            .await
            .expect("the broker creates topics");
        assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
        // One record per produce batch: the test broker (tansu 0.6) returns
        // nothing to a consumer whose committed offset falls inside a
        // multi-record batch (docs/design.md, "Kafka").
        let publisher = KafkaPublisher::with_properties(
            &brokers,
            &[("linger.ms", "0"), ("batch.num.messages", "1")],
        )
        .unwrap();
        Some(Self {
            brokers,
            group: format!("{topic}-group"),
            topic,
            partitions,
            publisher,
        })
    }

    /// The source URL, with `extra` parameters (`&a=b…`), which replace
    /// the fixture's own of the same name.
    pub fn url(&self, extra: &str) -> String {
        let mut url = format!(
            "kafka://{}?topic={}&group={}",
            self.brokers, self.topic, self.group
        );
        // One record per batch for the source's own retry and dead-letter
        // copies too (see `new`).
        for default in [
            "commit-interval-ms=100",
            "statistics.interval.ms=500",
            "batch.num.messages=1",
            "linger.ms=0",
        ] {
            let name = default.split('=').next().unwrap();
            if !extra.contains(&format!("&{name}=")) {
                url.push('&');
                url.push_str(default);
            }
        }
        url + extra
    }

    pub fn config(&self, extra: &str) -> KafkaConfig {
        KafkaConfig::from_url(&self.url(extra)).unwrap()
    }

    pub async fn source(&self, extra: &str) -> KafkaSource {
        KafkaSource::connect(self.config(extra))
            .await
            .expect("the source connects")
    }

    /// Publishes `body` with message id `id`, keyed by the id (or to
    /// `partition`).
    pub async fn publish(&self, id: &str, partition: Option<i32>, body: &str) {
        self.publisher
            .publish(
                &self.topic,
                partition,
                Some(id.as_bytes()),
                id,
                &[],
                body.as_bytes(),
            )
            .await
            .expect("the broker takes the record");
    }

    /// Every record of `topic`, read from the start until `expected` are
    /// read, 10 s pass, or none comes for a second.
    pub async fn read(&self, topic: &str, expected: usize) -> Vec<Record> {
        let brokers = self.brokers.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, expected))
            .await
            .unwrap()
    }

    /// The group's committed offset per partition of the topic (absent:
    /// none committed).
    pub async fn committed(&self) -> HashMap<i32, i64> {
        self.committed_in(&self.topic).await
    }

    /// The group's committed offset per partition of `topic`, which has as
    /// many partitions as the fixture's topic.
    pub async fn committed_in(&self, topic: &str) -> HashMap<i32, i64> {
        let (brokers, group, topic, n) = (
            self.brokers.clone(),
            self.group.clone(),
            topic.to_owned(),
            self.partitions,
        );
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .create()
                .unwrap();
            let mut tpl = TopicPartitionList::new();
            for p in 0..n {
                tpl.add_partition(&topic, p);
            }
            let committed = consumer
                .committed_offsets(tpl, Duration::from_secs(10))
                .expect("the broker answers OffsetFetch");
            committed
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect()
        })
        .await
        .unwrap()
    }

    /// The topic's end offset per partition.
    pub async fn ends(&self) -> HashMap<i32, i64> {
        self.ends_in(&self.topic).await
    }

    /// The end offset per partition of `topic`, which has as many
    /// partitions as the fixture's topic; partitions never written to are
    /// left out.
    pub async fn ends_in(&self, topic: &str) -> HashMap<i32, i64> {
        let (brokers, topic, n) = (self.brokers.clone(), topic.to_owned(), self.partitions);
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .create()
                .unwrap();
            (0..n)
                .map(|p| {
                    let (_, high) = consumer
                        .fetch_watermarks(&topic, p, Duration::from_secs(10))
                        .expect("the broker answers ListOffsets");
                    (p, high)
                })
                .filter(|&(_, high)| high > 0)
                .collect()
        })
        .await
        .unwrap()
    }
}

fn read_topic(brokers: &str, topic: &str, expected: usize) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let Ok(metadata) = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) else {
        return Vec::new();
    };
    let mut tpl = TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.error().is_none()) {
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                .unwrap();
        }
    }
    if tpl.count() == 0 {
        return Vec::new();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = Instant::now();
    let quiet = |read: usize| Duration::from_secs(if read == 0 { 5 } else { 1 });
    while out.len() < expected && Instant::now() < deadline && last.elapsed() < quiet(out.len()) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            last = Instant::now();
            let headers = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Record {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                headers,
                body: m.payload().unwrap_or_default().to_vec(),
            });
        }
    }
    out
}

/// A runner on a Kafka source, running until stopped.
pub struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<Report, idem_consumer::RunError>>,
}

impl Running {
    pub fn start<S, H>(runner: Runner<S, KafkaSource, H>) -> Self
    where
        S: Store + Clone,
        H: Handler,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(runner.run(stop.clone()));
        Self { stop, task }
    }

    /// Shuts the runner down gracefully; its report.
    pub async fn stop(self) -> Report {
        self.stop.cancel();
        self.task.await.unwrap().unwrap()
    }
}

impl Fixture {
    /// Waits (up to 20 s) until the group's committed offsets of the topic
    /// are `expected`.
    pub async fn wait_committed(&self, expected: &HashMap<i32, i64>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let committed = self.committed().await;
            if committed == *expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "committed {committed:?}, expected {expected:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every partition's commit reaches its end.
    pub async fn wait_committed_to_end(&self) {
        let ends = self.ends().await;
        self.wait_committed(&ends).await;
    }
}

/// Waits until `done` holds, panicking after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Effects per message id, as a sink would record them.
#[derive(Clone, Default)]
pub struct Effects(pub Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    pub fn count(&self) -> usize {
        self.0.lock().len()
    }
    pub fn total(&self) -> u32 {
        self.0.lock().values().sum()
    }
    pub fn doubled(&self) -> Vec<String> {
        self.0
            .lock()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, _)| k.clone())
            .collect()
    }
    /// A handler that records one effect per call.
    pub fn handler(
        &self,
    ) -> impl Fn(Message, Claim) -> std::future::Ready<Result<Bytes, HandlerError>>
    + Send
    + Sync
    + Clone
    + use<> {
        let effects = self.clone();
        move |m: Message, _c: Claim| {
            *effects.0.lock().entry(m.id.clone().unwrap()).or_default() += 1;
            std::future::ready(Ok(Bytes::new()))
        }
    }
}
