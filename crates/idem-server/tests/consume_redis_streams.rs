//! `idem consume --from redis://…?stream=…&group=…` against the real Redis,
//! through the shared scenarios (crash mid-run, duplicates, retries, dead
//! letters, busy keys, SIGTERM).
#![cfg(feature = "redis-streams")]

mod support;

use std::collections::HashMap;

use idem_consumer::Message;
use idem_redis_streams::{RedisStreamConfig, RedisStreamPublisher, RedisStreamSource};
use redis::AsyncCommands;
use support::consume::{self, Broker};

/// A stream of its own on the test Redis, deleted with its side keys at
/// the end.
struct RedisStreams {
    server: String,
    stream: String,
    conn: redis::aio::MultiplexedConnection,
    publisher: RedisStreamPublisher,
    /// Reads nothing: it made the group, and tells what is left.
    observer: RedisStreamSource,
}

impl RedisStreams {
    async fn new() -> Option<Self> {
        let server = support::redis().await?;
        let stream = support::unique("idem-consume-streams");
        let client = redis::Client::open(server.as_str()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let config =
            RedisStreamConfig::from_url(&format!("{server}?stream={stream}&group=idem")).unwrap();
        let publisher = RedisStreamPublisher::connect(&config).await.unwrap();
        // The group exists before anything is published, as it would for
        // a deployed consumer.
        let observer = RedisStreamSource::connect(config).await.unwrap();
        Some(Self {
            server,
            stream,
            conn,
            publisher,
            observer,
        })
    }

    fn config(&self) -> RedisStreamConfig {
        RedisStreamConfig::from_url(&self.source_url()).unwrap()
    }
}

impl Drop for RedisStreams {
    fn drop(&mut self) {
        let keys = [
            self.stream.clone(),
            format!("{}.retry", self.stream),
            format!("{}.dead-letter", self.stream),
        ];
        // A blocking connection: the test's runtime is about to stop.
        let client = redis::Client::open(self.server.as_str());
        if let Ok(mut conn) = client.and_then(|c| c.get_connection()) {
            let _: Result<(), _> = redis::Commands::del(&mut conn, &keys[..]);
        }
    }
}

impl Broker for RedisStreams {
    type Source = RedisStreamSource;

    fn source_url(&self) -> String {
        format!("{}?stream={}&group=idem", self.server, self.stream)
    }

    fn name(&self) -> String {
        self.stream.clone()
    }

    async fn library_source(&self) -> RedisStreamSource {
        // The same lease as the sidecar's, so both claim a dead consumer's
        // entries after it.
        let config = self.config().lease(std::time::Duration::from_millis(2000));
        RedisStreamSource::connect(config).await.unwrap()
    }

    async fn publish(&self, messages: &[(String, Vec<u8>)]) {
        for (id, body) in messages {
            let mut m = Message::new(body.clone());
            m.id = Some(id.clone());
            m.content_type = Some("application/json".into());
            self.publisher.publish(&m).await.unwrap();
        }
    }

    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        let reply: redis::streams::StreamRangeReply = self
            .conn
            .clone()
            .xrange_all(format!("{}.dead-letter", self.stream))
            .await
            .unwrap();
        reply
            .ids
            .into_iter()
            .map(|e| {
                let mut headers = HashMap::new();
                let mut body = Vec::new();
                for (name, value) in e.map {
                    let value: Vec<u8> = redis::from_redis_value(value).unwrap();
                    if name == "body" {
                        body = value;
                    } else {
                        headers.insert(
                            name.to_lowercase(),
                            String::from_utf8_lossy(&value).into_owned(),
                        );
                    }
                }
                (headers, body)
            })
            .collect()
    }

    async fn drained(&self) -> bool {
        self.observer.backlog().await.unwrap().is_drained()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_duplicates_take_effect_once() {
    if let Some(b) = RedisStreams::new().await {
        consume::crash_and_duplicates(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered_with_headers() {
    if let Some(b) = RedisStreams::new().await {
        consume::retries_and_dead_letters(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_counts_waiting_messages() {
    if let Some(b) = RedisStreams::new().await {
        consume::lag_counts_waiting_messages(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_after_a_fix() {
    if let Some(b) = RedisStreams::new().await {
        consume::dead_letters_replay_after_a_fix(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_keys_are_retried_after_the_lease() {
    if let Some(b) = RedisStreams::new().await {
        consume::busy_keys_are_retried_later(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_handler_in_flight_and_acks() {
    if let Some(b) = RedisStreams::new().await {
        consume::sigterm_finishes_work_in_flight(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_answers_late_bodies_problems_and_refusals() {
    if let Some(b) = RedisStreams::new().await {
        consume::handler_answers(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_settle_each_message_by_its_own_result() {
    if let Some(b) = RedisStreams::new().await {
        consume::batches(b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_duplicates_in_batches_take_effect_once() {
    if let Some(b) = RedisStreams::new().await {
        consume::crash_and_duplicates_in_batches(b).await;
    }
}
