//! What the RocketMQ tests share: a topic and a group of the test's own on
//! the test broker, a publisher, the group's backlog, a reader of its dead
//! letters, and waits.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_consumer::{HandlerError, Message, Report, Runner, Source};
use idem_core::{Bytes, ClaimHandle, Guard, Lease, MemoryStore};
use idem_rocketmq::{RocketMqConfig, RocketMqMonitor, RocketMqPublisher, RocketMqSource};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The name server's URL (`IDEM_TEST_ROCKETMQ_URL`, default loopback).
pub fn server_url() -> String {
    idem_testkit::services::url("IDEM_TEST_ROCKETMQ_URL", "rocketmq://127.0.0.1:9876")
}

/// A name no other test (or run) uses: topics and groups outlive a test.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
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
    /// its next rebalance).
    pub async fn dead_letter_reader(&self) -> DeadLetters {
        let topic = format!("%DLQ%{}", self.group);
        self.publisher
            .publish(&topic, MARKER, &[], "marker")
            .await
            .expect("the dead-letter topic takes a marker");
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

/// What a handler did: calls and effects per key, and the attempts seen.
#[derive(Clone, Default)]
pub struct Effects {
    inner: Arc<Mutex<EffectsInner>>,
}

#[derive(Default)]
struct EffectsInner {
    calls: HashMap<String, u32>,
    applied: HashMap<String, u32>,
    attempts: HashMap<String, Vec<u32>>,
}

impl Effects {
    pub fn called(&self, key: &str, attempt: u32) {
        let mut e = self.inner.lock();
        *e.calls.entry(key.into()).or_default() += 1;
        e.attempts.entry(key.into()).or_default().push(attempt);
    }
    pub fn apply(&self, key: &str) {
        *self.inner.lock().applied.entry(key.into()).or_default() += 1;
    }
    pub fn calls(&self, key: &str) -> u32 {
        self.inner.lock().calls.get(key).copied().unwrap_or(0)
    }
    pub fn calls_total(&self) -> u32 {
        self.inner.lock().calls.values().sum()
    }
    pub fn applied(&self, key: &str) -> u32 {
        self.inner.lock().applied.get(key).copied().unwrap_or(0)
    }
    pub fn attempts(&self, key: &str) -> Vec<u32> {
        self.inner
            .lock()
            .attempts
            .get(key)
            .cloned()
            .unwrap_or_default()
    }
    pub fn applied_total(&self) -> u32 {
        self.inner.lock().applied.values().sum()
    }

    /// A handler keyed by message id that records the call, works for
    /// `pause`, then applies the effect.
    pub fn handler(&self, pause: Duration) -> impl idem_consumer::Handler {
        let effects = self.clone();
        move |m: Message, _claim: ClaimHandle| {
            let effects = effects.clone();
            async move {
                let key = m.id.clone().unwrap_or_default();
                effects.called(&key, m.attempt);
                tokio::time::sleep(pause).await;
                effects.apply(&key);
                done()
            }
        }
    }
}

/// A guard on a fresh memory store with `lease`.
pub fn guard(lease: Duration) -> Guard<MemoryStore> {
    Guard::new(MemoryStore::new()).lease(Lease::new(lease))
}

/// A running runner: cancel `shutdown` and await `done` for its report.
pub struct Running {
    pub shutdown: CancellationToken,
    pub done: JoinHandle<Report>,
}

impl Running {
    pub async fn stop(self) -> Report {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("the runner stops")
            .expect("the runner does not panic")
    }
}

/// Spawns `runner`.
pub fn spawn<H: idem_consumer::Handler>(runner: Runner<MemoryStore, RocketMqSource, H>) -> Running {
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let done = tokio::spawn(async move { runner.run(token).await.expect("the runner starts") });
    Running { shutdown, done }
}

/// Waits until `check` answers true, for at most `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {limit:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A message's text header.
pub fn header(m: &Message, name: &str) -> String {
    m.header(name)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// `Ok(empty)` from a handler.
pub fn done() -> Result<Bytes, HandlerError> {
    Ok(Bytes::new())
}

pub type Claim = ClaimHandle;
