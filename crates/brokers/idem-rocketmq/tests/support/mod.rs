//! What the RocketMQ tests share: a topic and a group of the test's own on
//! the test broker, a publisher, the group's backlog, a reader of its dead
//! letters, and waits.
// Each test binary uses some of what is here.
#![allow(dead_code, unused_imports)]

use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{Message, Source};
use idem_rocketmq::{RocketMqConfig, RocketMqMonitor, RocketMqPublisher, RocketMqSource};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

pub use idem_consumer::testing::{
    Claim, Effects, Running, done, guard, header, spawn, unique, wait_until,
};

/// The name server's URL (`IDEM_TEST_ROCKETMQ_URL`, default loopback).
pub fn server_url() -> String {
    idem_testkit::services::url("IDEM_TEST_ROCKETMQ_URL", "rocketmq://127.0.0.1:9876")
}

/// A topic and a group of the test's own.
pub struct Fixture {
    pub url: String,
    pub topic: String,
    pub group: String,
    pub publisher: RocketMqPublisher,
    pub monitor: RocketMqMonitor,
}

impl Fixture {
    /// `None` (after printing why) when the broker is not there and
    /// services are not required.
    pub async fn new(test: &str) -> Option<Self> {
        let url = server_url();
        let publisher = match RocketMqPublisher::connect(&url).await {
            Ok(p) => p,
            Err(e) => return idem_testkit::services::absent("RocketMQ", &url, e),
        };
        let monitor = RocketMqMonitor::connect(&url)
            .await
            .expect("the admin client starts");
        // The topic exists before any consumer subscribes, so each is
        // assigned its queues at once.
        let topic = unique(&format!("idemtest_{test}"));
        publisher
            .create_topic(&topic, 4)
            .await
            .expect("the topic is created");
        Some(Self {
            url,
            topic,
            group: unique(&format!("idemtest_{test}_group")),
            publisher,
            monitor,
        })
    }

    /// The consume URL for this fixture's topic and group.
    pub fn consume_url(&self) -> String {
        format!("{}?topic={}&group={}", self.url, self.topic, self.group)
    }

    pub fn config(&self) -> RocketMqConfig {
        RocketMqConfig::from_url(&self.consume_url()).expect("the test URL parses")
    }

    pub async fn source(&self, config: RocketMqConfig) -> RocketMqSource {
        RocketMqSource::connect(config)
            .await
            .expect("the source connects")
    }

    /// Publishes `body` to the fixture's topic with key `key`.
    pub async fn publish(&self, key: &str, properties: &[(&str, &str)], body: &str) {
        self.publisher
            .publish(&self.topic, key, properties, body.to_owned())
            .await
            .expect("publish is acknowledged");
    }

    /// Messages of the group's topics not yet committed as consumed.
    pub async fn backlog(&self) -> u64 {
        self.monitor.backlog(&self.group).await.unwrap_or(u64::MAX)
    }

    /// Waits until the group has committed every message (the client
    /// commits every 5 s).
    pub async fn wait_drained(&self) {
        wait_until(
            Duration::from_secs(30),
            "every message committed",
            || async { self.backlog().await == 0 },
        )
        .await;
    }

    /// Starts reading the dead-letter topic `%DLQ%GROUP` in a group of its
    /// own. A marker published first makes sure the topic exists before
    /// the reader subscribes (a consumer of a missing topic waits 20 s for
    /// its next rebalance). The first publish to a topic that does not
    /// exist yet can be refused while the broker creates it, so the marker
    /// is retried for up to 10 s.
    pub async fn dead_letter_reader(&self) -> DeadLetters {
        let topic = format!("%DLQ%{}", self.group);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.publisher.publish(&topic, MARKER, &[], "marker").await {
                Ok(_) => break,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    eprintln!("the dead-letter marker was refused, retrying: {e:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the dead-letter topic takes a marker: {e:?}"),
            }
        }
        let url = format!(
            "{}?topic={}&group={}_reader",
            self.url,
            topic.replace('%', "%25"),
            self.group
        );
        let source = RocketMqSource::connect(RocketMqConfig::from_url(&url).unwrap())
            .await
            .expect("the dead-letter reader connects");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let seen = seen.clone();
            let source = source.clone();
            tokio::spawn(async move {
                loop {
                    let Ok(batch) = source.fetch(16).await else {
                        return;
                    };
                    for d in batch {
                        if d.message.id.as_deref() != Some(MARKER) {
                            seen.lock().push(d.message.clone());
                        }
                        let _ = source.ack(d).await;
                    }
                }
            })
        };
        DeadLetters { seen, source, task }
    }
}

const MARKER: &str = "idem-test-marker";

/// What a dead-letter reader has read so far.
pub struct DeadLetters {
    seen: Arc<Mutex<Vec<Message>>>,
    source: RocketMqSource,
    task: JoinHandle<()>,
}

impl DeadLetters {
    pub fn read(&self) -> Vec<Message> {
        self.seen.lock().clone()
    }

    pub async fn wait_for(&self, n: usize) -> Vec<Message> {
        wait_until(Duration::from_secs(30), "the dead letters", || async {
            self.seen.lock().len() >= n
        })
        .await;
        self.read()
    }

    pub async fn stop(self) {
        self.task.abort();
        self.source.shutdown().await;
    }
}
