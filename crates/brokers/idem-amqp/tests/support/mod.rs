//! What the RabbitMQ tests share: the broker's URL (skipping when it is
//! away), unique queue names, a raw look at queues, and running the runner
//! until a condition holds.
#![allow(dead_code)]

use std::time::Duration;

use idem_amqp::AmqpConfig;
use idem_consumer::{Handler, Message, Report, Runner};
use idem_core::Store;
use idem_testkit::services;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Retry queue suffixes the source may create (see the crate docs).
const RETRY_SUFFIXES: [&str; 17] = [
    "100ms", "250ms", "500ms", "1s", "2s", "5s", "10s", "20s", "30s", "1m", "2m", "5m", "10m",
    "20m", "30m", "1h", "long",
];

/// The test broker's URL, or `None` (test skipped) when it is away.
pub async fn broker() -> Option<String> {
    let url = services::url("IDEM_TEST_AMQP_URL", DEFAULT_URL);
    match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(c) => {
            let _ = c.close(200, "OK".into()).await;
            Some(url)
        }
        Err(e) => services::absent("RabbitMQ", &url, e),
    }
}

/// A queue name no other test uses.
pub fn unique(what: &str) -> String {
    format!("idem-test-{what}-{:016x}", fastrand::u64(..))
}

/// The source configuration for `queue` on the broker at `url`.
pub fn config(url: &str, queue: &str) -> AmqpConfig {
    let sep = if url.contains('?') { '&' } else { '?' };
    AmqpConfig::from_url(&format!("{url}{sep}queue={queue}")).expect("test URL parses")
}

/// A message with id `id` and a small JSON body.
pub fn message(id: &str) -> Message {
    let mut m = Message::new(format!("{{\"id\":\"{id}\"}}"));
    m.id = Some(id.to_owned());
    m.content_type = Some("application/json".into());
    m
}

/// A plain connection to look at queues, as an operator would.
pub struct Inspect {
    connection: Connection,
    channel: Channel,
}

impl Inspect {
    pub async fn new(url: &str) -> Self {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("broker reachable");
        let channel = connection.create_channel().await.unwrap();
        Self {
            connection,
            channel,
        }
    }

    /// Messages ready in `queue` (not counting those delivered and unacked).
    pub async fn ready(&self, queue: &str) -> u32 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("queue {queue} exists: {e}"))
            .message_count()
    }

    /// Takes one message from `queue`, acked.
    pub async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }

    /// Deletes `queue` and the queues the source made for it.
    pub async fn delete(&self, queue: &str) {
        let mut names = vec![queue.to_owned(), format!("{queue}.dead-letter")];
        names.extend(RETRY_SUFFIXES.iter().map(|s| format!("{queue}.retry.{s}")));
        for name in names {
            let _ = self
                .channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "OK".into()).await;
    }
}

/// A runner running in a task of its own.
pub struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<Report, idem_consumer::RunError>>,
}

impl Running {
    pub fn start<S, Src, H>(runner: Runner<S, Src, H>) -> Self
    where
        S: Store + Clone,
        Src: idem_consumer::Source,
        H: Handler,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(runner.run(stop.clone()));
        Self { stop, task }
    }

    /// Cancels the runner and waits for its graceful end.
    pub async fn stop(self) -> Report {
        self.stop.cancel();
        self.task.await.unwrap().expect("runner starts")
    }
}

/// Polls `check` every 20 ms until it holds or `limit` passes; whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
