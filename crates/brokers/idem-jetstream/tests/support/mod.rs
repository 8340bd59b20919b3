//! What the JetStream tests share: a stream of their own on the test server
//! (deleted at the end, also when the test fails), a publisher, and waits.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use idem_consumer::{HandlerError, Message, Report, Runner};
use idem_core::{Bytes, ClaimHandle, Guard, Lease, MemoryStore};
use idem_jetstream::{JetStreamConfig, JetStreamPublisher, JetStreamSource};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The test server's URL (`IDEM_TEST_NATS_URL`, default loopback).
pub fn server_url() -> String {
    idem_testkit::services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222")
}

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A stream name, consumer name and subject of the test's own; the streams
/// it leads to (the stream and its dead-letter stream) are deleted on drop.
pub struct Fixture {
    pub url: String,
    pub stream: String,
    pub consumer: String,
    /// Messages go to `<prefix>.<anything>`.
    pub prefix: String,
    pub js: jetstream::Context,
    pub publisher: JetStreamPublisher,
}

impl Fixture {
    /// `None` (after printing why) when the server is not there and
    /// services are not required.
    pub async fn new(test: &str) -> Option<Self> {
        let url = server_url();
        let client = match async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(url.as_str())
            .await
        {
            Ok(c) => c,
            Err(e) => return idem_testkit::services::absent("NATS", &url, e),
        };
        let js = jetstream::new(client);
        let publisher = match JetStreamPublisher::connect(&url).await {
            Ok(p) => p,
            Err(e) => return idem_testkit::services::absent("NATS JetStream", &url, e),
        };
        let stream = unique(&format!("IDEMTEST_{test}"));
        let prefix = stream.to_lowercase();
        Some(Self {
            url,
            consumer: "idem".into(),
            prefix,
            stream,
            js,
            publisher,
        })
    }

    /// The consume URL for this fixture's stream, consumer and subject.
    pub fn consume_url(&self) -> String {
        format!(
            "{}?stream={}&consumer={}&subject={}.%3E",
            self.url, self.stream, self.consumer, self.prefix
        )
    }

    pub fn config(&self) -> JetStreamConfig {
        JetStreamConfig::from_url(&self.consume_url()).expect("the test URL parses")
    }

    pub async fn source(&self, config: JetStreamConfig) -> JetStreamSource {
        JetStreamSource::connect(config)
            .await
            .expect("the source connects")
    }

    /// Publishes `body` to `<prefix>.<suffix>` with message id `id`.
    pub async fn publish(&self, suffix: &str, id: &str, headers: &[(&str, &str)], body: &str) {
        let published = self
            .publisher
            .publish(
                &format!("{}.{suffix}", self.prefix),
                id,
                headers,
                body.to_owned(),
            )
            .await
            .expect("publish is acknowledged");
        assert!(!published.duplicate, "message id {id} was used before");
    }

    /// Messages stored in the dead-letter stream, in order.
    pub async fn dead_letters(&self) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let name = format!("{}_dead-letter", self.stream);
        let mut stream = self
            .js
            .get_stream(&name)
            .await
            .expect("the dead-letter stream exists");
        let count = stream.info().await.unwrap().state.messages;
        let mut out = Vec::new();
        for seq in 1..=count {
            out.push(
                stream
                    .get_raw_message(seq)
                    .await
                    .expect("dead letter is readable"),
            );
        }
        out
    }

    /// Creates the fixture's stream capturing `subject`, before the source
    /// does.
    pub async fn create_stream(&self, subject: String) -> jetstream::stream::Stream {
        self.js
            .create_stream(jetstream::stream::Config {
                name: self.stream.clone(),
                subjects: vec![subject],
                ..Default::default()
            })
            .await
            .expect("the stream is created")
    }

    /// Number of messages in the stream.
    pub async fn stored(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.stream).await.unwrap();
        stream.info().await.unwrap().state.messages
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let url = self.url.clone();
        let names = [self.stream.clone(), format!("{}_dead-letter", self.stream)];
        // Drop cannot await; a thread with a runtime (and a connection) of
        // its own can, while the test's runtime is blocked here.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok(client) = async_nats::connect(url.as_str()).await else {
                    return;
                };
                let js = jetstream::new(client);
                for name in names {
                    let _ = js.delete_stream(&name).await;
                }
            });
        })
        .join();
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
    started: HashMap<String, tokio::time::Instant>,
}

impl Effects {
    /// Records a handler call for `key` at `attempt`.
    pub fn called(&self, key: &str, attempt: u32) {
        let mut e = self.inner.lock();
        *e.calls.entry(key.into()).or_default() += 1;
        e.attempts.entry(key.into()).or_default().push(attempt);
        e.started
            .entry(key.into())
            .or_insert_with(tokio::time::Instant::now);
    }
    /// Records the effect for `key`.
    pub fn apply(&self, key: &str) {
        *self.inner.lock().applied.entry(key.into()).or_default() += 1;
    }
    pub fn calls(&self, key: &str) -> u32 {
        self.inner.lock().calls.get(key).copied().unwrap_or(0)
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
    pub fn started(&self, key: &str) -> bool {
        self.inner.lock().started.contains_key(key)
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
pub fn spawn<H: idem_consumer::Handler>(
    runner: Runner<MemoryStore, JetStreamSource, H>,
) -> Running {
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
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the consumer has nothing pending and nothing unacknowledged.
pub async fn wait_settled(source: &JetStreamSource) {
    wait_until(Duration::from_secs(10), "every message acked", || async {
        let info = source.consumer_info().await.unwrap();
        info.num_pending == 0 && info.num_ack_pending == 0
    })
    .await;
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
