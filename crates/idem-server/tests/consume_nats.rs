//! `idem consume --from nats://…` against the real JetStream server: the
//! shared scenarios (crash and duplicates, retries and dead letters, busy
//! keys, SIGTERM).

mod support;

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream;
use idem_jetstream::{JetStreamConfig, JetStreamPublisher, JetStreamSource};
use support::consume::{self, Broker, unique};

/// A stream, subject and consumer of the test's own; the stream and its
/// dead-letter stream are deleted on drop.
struct Nats {
    url: String,
    stream: String,
    prefix: String,
    js: jetstream::Context,
    publisher: JetStreamPublisher,
}

impl Nats {
    async fn new(test: &str) -> Option<Self> {
        let url = idem_testkit::services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
        let client = match async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(url.as_str())
            .await
        {
            Ok(c) => c,
            Err(e) => return idem_testkit::services::absent("NATS", &url, e),
        };
        let publisher = match JetStreamPublisher::connect(&url).await {
            Ok(p) => p,
            Err(e) => return idem_testkit::services::absent("NATS JetStream", &url, e),
        };
        let stream = unique(&format!("IDEMCONSUME_{test}")).replace('-', "_");
        let prefix = stream.to_lowercase();
        let js = jetstream::new(client);
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .expect("the stream is created");
        Some(Self {
            url,
            stream,
            prefix,
            js,
            publisher,
        })
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let url = self.url.clone();
        let names = [self.stream.clone(), format!("{}_dead-letter", self.stream)];
        // Drop cannot await; a thread with a runtime (and a connection) of
        // its own can.
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

impl Broker for Nats {
    type Source = JetStreamSource;

    fn source_url(&self) -> String {
        // AckWait above the 2 s lease the crash scenario uses, and short
        // enough that the killed process's messages come back soon.
        format!(
            "{}?stream={}&consumer=idem&subject={}.%3E&ack_wait=5s",
            self.url, self.stream, self.prefix
        )
    }

    fn name(&self) -> String {
        self.stream.clone()
    }

    async fn library_source(&self) -> JetStreamSource {
        let config = JetStreamConfig::from_url(&self.source_url())
            .unwrap()
            .concurrency(16);
        JetStreamSource::connect(config)
            .await
            .expect("the source connects")
    }

    async fn publish(&self, messages: &[(String, Vec<u8>)]) {
        let subject = format!("{}.orders", self.prefix);
        for (id, body) in messages {
            // A copy with the same id inside the duplicate window is
            // dropped by the stream itself (`duplicate` in the answer).
            self.publisher
                .publish(&subject, id, &[], body.clone())
                .await
                .expect("the stream acknowledges the message");
        }
    }

    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        let Ok(mut stream) = self
            .js
            .get_stream(format!("{}_dead-letter", self.stream))
            .await
        else {
            return Vec::new();
        };
        let count = stream.info().await.unwrap().state.messages;
        let mut out = Vec::new();
        for seq in 1..=count {
            let m = stream.get_raw_message(seq).await.unwrap();
            let headers = m
                .headers
                .iter()
                .filter_map(|(name, values)| {
                    Some((name.to_string().to_lowercase(), values.last()?.to_string()))
                })
                .collect();
            out.push((headers, m.payload.to_vec()));
        }
        out
    }

    async fn drained(&self) -> bool {
        let Ok(stream) = self.js.get_stream(&self.stream).await else {
            return false;
        };
        match stream.consumer_info("idem").await {
            Ok(info) => info.num_pending == 0 && info.num_ack_pending == 0,
            Err(_) => false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_crash_and_duplicates_take_effect_once() {
    let Some(nats) = Nats::new("crash").await else {
        return;
    };
    consume::crash_and_duplicates(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_retries_then_dead_letters_with_headers() {
    let Some(nats) = Nats::new("dead").await else {
        return;
    };
    consume::retries_and_dead_letters(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_busy_keys_are_retried_after_the_lease() {
    let Some(nats) = Nats::new("busy").await else {
        return;
    };
    consume::busy_keys_are_retried_later(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_sigterm_finishes_work_in_flight() {
    let Some(nats) = Nats::new("sigterm").await else {
        return;
    };
    consume::sigterm_finishes_work_in_flight(nats).await;
}
