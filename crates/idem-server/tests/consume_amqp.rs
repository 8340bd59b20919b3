//! `idem consume --from amqp://…` against the test RabbitMQ, through the
//! shared scenarios (tests/support/consume.rs), plus what it reports when
//! the broker is away.
#![cfg(feature = "amqp")]

mod support;

use std::collections::HashMap;

use idem_amqp::{AmqpConfig, AmqpPublisher, AmqpSource};
use idem_consumer::Message;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use support::consume::{self, Broker};
use support::unique;

const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

struct Rabbit {
    url: String,
    queue: String,
}

impl Rabbit {
    /// A queue of the test's own on the test broker; `None` when RabbitMQ
    /// is away and not required.
    async fn new(what: &str) -> Option<Self> {
        let url = idem_testkit::services::url("IDEM_TEST_AMQP_URL", DEFAULT_URL);
        match Connection::connect(&url, ConnectionProperties::default()).await {
            Ok(c) => {
                let _ = c.close(200, "OK".into()).await;
            }
            Err(e) => return idem_testkit::services::absent("RabbitMQ", &url, e),
        }
        Some(Self {
            url,
            queue: unique(&format!("idem-consume-{what}")),
        })
    }

    /// Deletes the queue and those the source made for it.
    async fn delete(url: String, queue: String) {
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let names = AmqpConfig::from_url(&format!("{url}?queue={queue}"))
            .unwrap()
            .queues();
        for name in names {
            // A missing queue closes the channel: one channel per queue.
            let channel = connection.create_channel().await.unwrap();
            let _ = channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = connection.close(200, "OK".into()).await;
    }

    fn config(&self) -> AmqpConfig {
        AmqpConfig::from_url(&self.source_url()).unwrap()
    }

    /// Ready messages in `queue`, 0 when it does not exist.
    async fn ready(&self, connection: &Connection, queue: &str) -> u32 {
        let channel = connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        // A missing queue closes the channel: one channel per question.
        let n = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map_or(0, |q| q.message_count());
        let _ = channel.close(200, "OK".into()).await;
        n
    }

    /// Unacknowledged deliveries of the work queue, from `rabbitmqctl` when
    /// it runs here (the AMQP protocol cannot tell); 0 otherwise.
    async fn unacked(&self) -> u32 {
        let Ok(out) = tokio::process::Command::new("rabbitmqctl")
            .args([
                "list_queues",
                "-q",
                "--no-table-headers",
                "name",
                "messages_unacknowledged",
            ])
            .output()
            .await
        else {
            return 0;
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut cols = l.split_whitespace();
                (cols.next()? == self.queue).then(|| cols.next()?.parse::<u32>().ok())?
            })
            .sum()
    }
}

impl Broker for Rabbit {
    type Source = AmqpSource;

    fn source_url(&self) -> String {
        format!("{}?queue={}", self.url, self.queue)
    }

    fn name(&self) -> String {
        self.queue.clone()
    }

    async fn library_source(&self) -> AmqpSource {
        AmqpSource::connect(self.config().concurrency(16))
            .await
            .unwrap()
    }

    async fn publish(&self, messages: &[(String, Vec<u8>)]) {
        let publisher = AmqpPublisher::connect(&self.config()).await.unwrap();
        for (id, body) in messages {
            let mut m = Message::new(body.clone());
            m.id = Some(id.clone());
            m.content_type = Some("application/json".into());
            publisher.publish(&m).await.unwrap();
        }
        publisher.close().await;
    }

    async fn dead_letters(&self) -> Vec<(HashMap<String, String>, Vec<u8>)> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let queue = format!("{}.dead-letter", self.queue);
        let mut out = Vec::new();
        // Taken without acks, and put back when the connection closes.
        while let Ok(Some(got)) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
            .await
        {
            let mut headers = HashMap::new();
            if let Some(table) = got.delivery.properties.headers() {
                for (name, value) in table.inner() {
                    if let AMQPValue::LongString(s) = value {
                        headers.insert(
                            name.as_str().to_lowercase(),
                            String::from_utf8_lossy(s.as_bytes()).into_owned(),
                        );
                    }
                }
            }
            out.push((headers, got.delivery.data.clone()));
        }
        let _ = connection.close(200, "OK".into()).await;
        out
    }

    async fn drained(&self) -> bool {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .unwrap();
        let mut waiting = 0;
        let dead_letter = self.config().dead_letter_queue();
        for queue in self.config().queues() {
            if queue != dead_letter {
                waiting += self.ready(&connection, &queue).await;
            }
        }
        let _ = connection.close(200, "OK".into()).await;
        waiting == 0 && self.unacked().await == 0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_duplicates() {
    let Some(rabbit) = Rabbit::new("crash").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::crash_and_duplicates(rabbit).await;
    Rabbit::delete(url, queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_dead_letters() {
    let Some(rabbit) = Rabbit::new("retries").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::retries_and_dead_letters(rabbit).await;
    Rabbit::delete(url, queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_counts_waiting_messages() {
    let Some(rabbit) = Rabbit::new("lag").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::lag_counts_waiting_messages(rabbit).await;
    Rabbit::delete(url, queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_after_a_fix() {
    let Some(rabbit) = Rabbit::new("dlq").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::dead_letters_replay_after_a_fix(rabbit).await;
    Rabbit::delete(url, queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_keys_are_retried_later() {
    let Some(rabbit) = Rabbit::new("busy").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::busy_keys_are_retried_later(rabbit).await;
    Rabbit::delete(url, queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_work_in_flight() {
    let Some(rabbit) = Rabbit::new("sigterm").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::sigterm_finishes_work_in_flight(rabbit).await;
    Rabbit::delete(url, queue).await;
}

#[test]
fn an_unreachable_broker_exits_1_with_one_line_naming_it_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let (code, _, err) = support::run(
        &[
            "consume",
            "--from",
            "amqp://guest:s3cret@127.0.0.1:1/%2f?queue=orders",
            "--to",
            "http://127.0.0.1:9/handle",
            "--store",
            &store,
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("unreachable at 127.0.0.1:1"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_answers_late_bodies_problems_and_refusals() {
    let Some(rabbit) = Rabbit::new("answers").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::handler_answers(rabbit).await;
    Rabbit::delete(url, queue).await;
}
