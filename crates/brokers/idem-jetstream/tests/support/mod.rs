//! What the JetStream tests share: a stream of their own on the test server
//! (deleted at the end, also when the test fails), a publisher, and waits.
// Each test binary uses some of what is here.
#![allow(dead_code, unused_imports)]

use std::time::Duration;

use async_nats::jetstream;
use idem_jetstream::{JetStreamConfig, JetStreamPublisher, JetStreamSource};

pub use idem_consumer::testing::{
    Claim, Effects, Running, done, guard, header, spawn, unique, wait_until,
};

/// The test server's URL (`IDEM_TEST_NATS_URL`, default loopback).
pub fn server_url() -> String {
    idem_testkit::services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222")
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

/// Waits until the consumer has nothing pending and nothing unacknowledged.
pub async fn wait_settled(source: &JetStreamSource) {
    wait_until(Duration::from_secs(10), "every message acked", || async {
        let info = source.consumer_info().await.unwrap();
        info.num_pending == 0 && info.num_ack_pending == 0
    })
    .await;
}
