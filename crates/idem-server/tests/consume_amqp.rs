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

    /// The keys of the messages in `queue`, in the order it holds them
    /// (each read and put back, which counts a delivery on a quorum queue).
    async fn queue_order(&self, queue: &str) -> Vec<String> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let mut keys = Vec::new();
        while let Some(m) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
        {
            let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
            keys.push(body["id"].as_str().unwrap().to_owned());
        }
        let _ = channel.close(200, "OK".into()).await;
        let _ = connection.close(200, "OK".into()).await;
        keys
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

/// The deliveries each dead letter has had: its key and `x-delivery-count`,
/// as `idem dlq ls --json` shows them, by id.
fn deliveries(out: &str) -> Vec<(String, String, u64)> {
    out.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let count = v["headers"]["x-delivery-count"]
                .as_str()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let key = v["key"].as_str().unwrap().to_owned();
            (v["id"].as_str().unwrap().to_owned(), key, count)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_reads_no_further_than_its_letter_and_the_queue_has_no_delivery_limit() {
    let Some(rabbit) = Rabbit::new("show").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    let dead = format!("{queue}.dead-letter");
    let Some(dlq) = consume::park(&rabbit, 5).await else {
        return;
    };
    // `ls` lists by when each letter was parked, which need not be the
    // order the queue holds them in: five handled at once are parked in
    // whatever order their handlers finished.
    let order = rabbit.queue_order(&dead).await;
    assert_eq!(order.len(), 5, "{order:?}");
    let (code, out, err) = dlq(&["ls", "--json"]);
    assert_eq!(code, 0, "{err}");
    let before = deliveries(&out);
    assert_eq!(before.len(), 5);
    let id_of = |key: &str| {
        before
            .iter()
            .find(|(_, k, _)| k == key)
            .map(|(id, _, _)| id.clone())
            .expect("listed")
    };
    // Each letter read and put back counts one delivery on a quorum queue:
    // showing the second in the queue reads the first two, and no further.
    let (code, _, err) = dlq(&["show", &id_of(&order[1])]);
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = dlq(&["ls", "--json"]);
    let after = deliveries(&out);
    let added: Vec<u64> = order
        .iter()
        .map(|key| {
            let id = id_of(key);
            let n = before.iter().find(|(i, _, _)| *i == id).unwrap().2;
            let (_, _, m) = after
                .iter()
                .find(|(i, _, _)| *i == id)
                .expect("still parked, same id");
            m - n
        })
        .collect();
    assert_eq!(
        added,
        [2, 2, 1, 1, 1],
        "show, then ls, in queue order {order:?}: {before:?} → {after:?}"
    );
    // The dead-letter queue declares a limit no queue reaches (RabbitMQ 4
    // would set 20 and then drop the letter).
    let listed = std::process::Command::new("rabbitmqctl")
        .args(["list_queues", "name", "arguments", "--formatter", "json"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let queues: serde_json::Value = serde_json::from_str(&listed).unwrap_or_default();
    if let Some(q) = queues
        .as_array()
        .and_then(|all| all.iter().find(|q| q["name"] == dead))
    {
        // [[name, type, value], …]
        let argument = |name: &str| {
            q["arguments"]
                .as_array()
                .and_then(|all| all.iter().find(|a| a[0] == name))
                .map(|a| a[2].clone())
                .unwrap_or_default()
        };
        assert_eq!(argument("x-delivery-limit"), i64::from(i32::MAX), "{q}");
        assert_eq!(argument("x-queue-type"), "quorum", "{q}");
    } else if std::env::var_os("CI").is_some() {
        panic!("rabbitmqctl did not list {dead}: {listed}");
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_settle_each_message_by_its_own_result() {
    let Some(rabbit) = Rabbit::new("batches").await else {
        return;
    };
    let (url, queue) = (rabbit.url.clone(), rabbit.queue.clone());
    consume::batches(rabbit).await;
    Rabbit::delete(url, queue).await;
}
