//! The brokers a run can use: for each, a fresh queue, stream or topic, the
//! `--from` URL that `idem consume` reads it with, and a producer.
//!
//! Every message's body is `{"key":"k-17","copy":0}` and the consumers take
//! their key from it (`--key json:/key`), so a producer duplicate is the
//! same key under a new message id: the broker's own duplicate window (NATS
//! `Nats-Msg-Id`) does not absorb it, and idem has to.

use std::fmt;
use std::time::Duration;

use clap::ValueEnum;

use idem_amqp::{AmqpConfig, AmqpPublisher, AmqpSource};
use idem_consumer::Message;
use idem_jetstream::JetStreamPublisher;
use idem_kafka::KafkaPublisher;
use idem_redis_streams::{RedisStreamConfig, RedisStreamPublisher};
use idem_rocketmq::RocketMqPublisher;

use idem_testkit::services;

use crate::store::{shell, start_daemon, wait_port};
use crate::toxic::Toxic;

/// A broker idem consumes from (as named on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Broker {
    RedisStreams,
    Amqp,
    Nats,
    Kafka,
    #[value(name = "rocketmq")]
    RocketMq,
    /// Not a broker: HTTP clients through `idem proxy` (the gateway run).
    Proxy,
    /// Not a broker: HTTP clients of `idem serve`'s API (the service run).
    Serve,
}

impl Broker {
    /// The name in the report.
    pub fn title(self) -> &'static str {
        match self {
            Broker::RedisStreams => "Redis Streams",
            Broker::Amqp => "RabbitMQ",
            Broker::Nats => "NATS JetStream",
            Broker::Kafka => "Kafka (tansu)",
            Broker::RocketMq => "RocketMQ",
            Broker::Proxy => "HTTP clients → idem proxy",
            Broker::Serve => "HTTP clients → idem serve",
        }
    }

    /// What this test broker cannot do, printed with its rows.
    pub fn limits(self) -> Option<&'static str> {
        match self {
            Broker::Kafka => Some(
                "tansu 0.6 has no transactions and never gives a dead member's partitions to \
                 another member: the consumers join with static membership \
                 (`group.instance.id`), so a killed consumer's restart takes its partitions back",
            ),
            Broker::RocketMq => Some(
                "the RocketMQ client cannot set a delay per message: retries wait out the \
                 broker's delay levels",
            ),
            _ => None,
        }
    }
}

impl Broker {
    /// Why the consumers cannot reach it through a fault proxy, if they
    /// cannot.
    pub fn unproxied(self) -> Option<&'static str> {
        match self {
            Broker::Kafka | Broker::RocketMq => Some(
                "the broker tells clients its own address: connections would go around a proxy",
            ),
            _ => None,
        }
    }

    /// Why the run cannot restart it, if it cannot.
    pub fn unrestartable(self) -> Option<&'static str> {
        match self {
            Broker::RedisStreams => Some(
                "the stream lives in the test Redis, which keeps nothing on disk: a restart \
                 loses the messages before idem sees them",
            ),
            _ => None,
        }
    }

    /// Stops the broker and starts it again, its messages kept on disk
    /// (RabbitMQ `stop_app` and `start_app`, the NATS server and the
    /// RocketMQ broker stopped and started, and the run's own Kafka-protocol
    /// broker: see [`own_kafka_start`]).
    pub async fn restart(self) -> Result<(), String> {
        match self {
            Broker::Amqp => {
                shell("rabbitmqctl", &["stop_app"]).await?;
                shell("rabbitmqctl", &["start_app"]).await?;
                wait_port(5672).await
            }
            Broker::Nats => {
                shell(
                    "start-stop-daemon",
                    &[
                        "--stop",
                        "--oknodo",
                        "--retry",
                        "10",
                        "--exec",
                        "/usr/sbin/nats-server",
                    ],
                )
                .await?;
                start_daemon(
                    "/usr/sbin/nats-server",
                    &[
                        "-a",
                        "127.0.0.1",
                        "-p",
                        "4222",
                        "-js",
                        "-sd",
                        "/var/lib/nats-server",
                        "-l",
                        "/var/log/nats-server.log",
                    ],
                )
                .await?;
                wait_port(4222).await
            }
            Broker::Kafka => {
                own_kafka_stop().await?;
                own_kafka_start().await
            }
            Broker::RocketMq => {
                // The project's script: the broker stopped (SIGTERM), the
                // name server left up, the broker started on its store.
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/rocketmq");
                shell(script, &["restart-broker"]).await?;
                wait_port(10911).await
            }
            _ => Err(self.unrestartable().unwrap_or("no broker").to_owned()),
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.to_possible_value().expect("no variant is skipped");
        f.write_str(value.get_name())
    }
}

/// A fresh queue, stream or topic on one broker, and a producer for it.
pub struct Channel {
    /// `idem consume --from` for it.
    pub from: String,
    /// RabbitMQ: the server and the queues the run made, deleted by
    /// [`Channel::close`] (a broker restart recovers every queue it has,
    /// and each run makes nineteen).
    queues: Option<(String, Vec<String>)>,
    /// The URL idem's own source reads the consumers' dead letters with.
    dead_letters: String,
    producer: Producer,
    /// The queue, stream or topic's name.
    name: String,
}

// One a run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Producer {
    /// A RabbitMQ restart closes the publisher's connection: the producer
    /// opens a new one with the config.
    Amqp(tokio::sync::RwLock<AmqpPublisher>, AmqpConfig),
    Nats(JetStreamPublisher, String),
    RedisStreams(RedisStreamPublisher),
    Kafka(KafkaPublisher, String),
    RocketMq(RocketMqPublisher, String),
}

impl Channel {
    /// Sends the consumers' broker connections through a fault proxy.
    pub async fn through_proxy(&mut self, broker: Broker) -> Result<Toxic, String> {
        let default = match broker {
            Broker::Amqp => 5672,
            Broker::Nats => 4222,
            _ => 6379,
        };
        let (routed, toxic) = Toxic::before(&self.from, default).await?;
        self.from = routed;
        Ok(toxic)
    }

    /// Makes the queue, stream or topic `name` (letters, digits and `_`),
    /// empty, ready to publish to before any consumer starts. A run that
    /// restarts its broker gets a Kafka-protocol broker of its own that
    /// keeps its records on disk.
    pub async fn open(broker: Broker, name: &str, restarted: bool) -> Result<Self, String> {
        match broker {
            Broker::Amqp => {
                let base = services::url(
                    "IDEM_TEST_AMQP_URL",
                    "amqp://guest:guest@127.0.0.1:5672/%2f",
                );
                let from = format!("{base}?queue={name}");
                let config = AmqpConfig::from_url(&from).map_err(|e| e.to_string())?;
                // The source declares the queue (and idem's retry and
                // dead-letter queues) as `idem consume` will.
                let source = AmqpSource::connect(config.clone())
                    .await
                    .map_err(|e| format!("RabbitMQ: {e}"))?;
                source.close().await;
                let publisher = AmqpPublisher::connect(&config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Self {
                    dead_letters: format!("{base}?queue={}", config.dead_letter_queue()),
                    from,
                    queues: Some((base, config.queues())),
                    producer: Producer::Amqp(tokio::sync::RwLock::new(publisher), config),
                    name: name.to_owned(),
                })
            }
            Broker::Nats => {
                let server = services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
                let subject = name.to_lowercase();
                // AckWait 5 s (the default is 30 s): a killed consumer's
                // messages come back that much sooner, and stay at least
                // a lease away (the runs' leases are 2 s).
                let from = format!(
                    "{server}?stream={}&consumer=idem&subject={subject}.>&ack_wait=5s",
                    name.to_uppercase()
                );
                let config =
                    idem_jetstream::JetStreamConfig::from_url(&from).map_err(|e| e.to_string())?;
                // Dead letters are kept in a stream of their own, named
                // after their subject.
                let dead = config.dead_letter_subject().replace('.', "_");
                // Connecting makes the stream and the durable consumer.
                idem_jetstream::JetStreamSource::connect(config)
                    .await
                    .map_err(|e| format!("NATS at {server}: {e}"))?;
                let publisher = JetStreamPublisher::connect(&server)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Self {
                    dead_letters: format!("{server}?stream={dead}&consumer=reader"),
                    from,
                    queues: None,
                    producer: Producer::Nats(publisher, format!("{subject}.new")),
                    name: name.to_uppercase(),
                })
            }
            Broker::RedisStreams => {
                let redis = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
                // Entries a killed consumer left are claimed after 5 s (the
                // default is 30 s), still more than the runs' 2 s leases.
                let from = format!("{redis}?stream={name}&group=idem&claim-idle-ms=5000");
                let config = RedisStreamConfig::from_url(&from).map_err(|e| e.to_string())?;
                // Connecting makes the group, from the stream's start.
                idem_redis_streams::RedisStreamSource::connect(config.clone())
                    .await
                    .map_err(|e| format!("Redis at {redis}: {e}"))?;
                let publisher = RedisStreamPublisher::connect(&config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Self {
                    dead_letters: format!("{redis}?stream={name}.dead-letter&group=reader"),
                    from,
                    queues: None,
                    producer: Producer::RedisStreams(publisher),
                    name: name.to_owned(),
                })
            }
            Broker::Kafka => {
                let brokers = if restarted {
                    own_kafka_start().await?;
                    format!("127.0.0.1:{OWN_KAFKA_PORT}")
                } else {
                    services::url("IDEM_TEST_KAFKA_URL", "127.0.0.1:9092")
                };
                let from =
                    format!("kafka://{brokers}?topic={name}&group={name}_group&partitions=4");
                let config = idem_kafka::KafkaConfig::from_url(&from).map_err(|e| e.to_string())?;
                // Connecting makes the topic and its retry topics.
                let source = idem_kafka::KafkaSource::connect(config)
                    .await
                    .map_err(|e| format!("Kafka at {brokers}: {e}"))?;
                source.close().await;
                // One record per batch, for the test broker.
                let publisher = KafkaPublisher::with_properties(
                    &brokers,
                    &[
                        ("linger.ms", "0"),
                        ("batch.num.messages", "1"),
                        ("message.timeout.ms", "10000"),
                    ],
                )
                .map_err(|e| e.to_string())?;
                Ok(Self {
                    dead_letters: format!(
                        "kafka://{brokers}?topic={name}-dlt&group={name}_reader&partitions=4"
                    ),
                    from,
                    queues: None,
                    producer: Producer::Kafka(publisher, name.to_owned()),
                    name: name.to_owned(),
                })
            }
            Broker::Proxy | Broker::Serve => Err("the HTTP runs have no broker".into()),
            Broker::RocketMq => {
                let base = services::url("IDEM_TEST_ROCKETMQ_URL", "rocketmq://127.0.0.1:9876");
                let publisher = RocketMqPublisher::connect(&base)
                    .await
                    .map_err(|e| format!("RocketMQ at {base}: {e}"))?;
                // Dead letters go to a topic of the run's own: the broker's
                // `%DLQ%` topics cannot be consumed from.
                let dead = format!("{name}_dead");
                for topic in [name, dead.as_str()] {
                    publisher
                        .create_topic(topic, 4)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok(Self {
                    from: format!("{base}?topic={name}&group={name}_group&dead_letter={dead}"),
                    dead_letters: format!("{base}?topic={dead}&group={name}_reader"),
                    queues: None,
                    producer: Producer::RocketMq(publisher, name.to_owned()),
                    name: name.to_owned(),
                })
            }
        }
    }

    /// What the broker itself says is left at the end of a run, read with
    /// its own tools rather than idem's (`rabbitmqctl`, `XINFO GROUPS`, the
    /// JetStream API, the Kafka group's committed offsets against each
    /// partition's end, read with librdkafka, and the RocketMQ group's
    /// progress with the RocketMQ client's admin): every message delivered
    /// and acknowledged, nothing waiting, nothing unacknowledged. Answers
    /// the problems, or `None` for the HTTP runs, which have no broker.
    pub async fn leftovers(&self, broker: Broker) -> Result<Option<Vec<String>>, String> {
        let mut problems = Vec::new();
        match broker {
            Broker::Amqp => {
                let Some((_, queues)) = &self.queues else {
                    return Ok(None);
                };
                let listed = shell(
                    "rabbitmqctl",
                    &[
                        "list_queues",
                        "-q",
                        "--no-table-headers",
                        "name",
                        "messages_ready",
                        "messages_unacknowledged",
                    ],
                )
                .await?;
                for line in listed.lines() {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let [queue, ready, unacked] = fields[..] else {
                        continue;
                    };
                    if queues.iter().any(|q| q == queue) && (ready != "0" || unacked != "0") {
                        problems.push(format!(
                            "RabbitMQ queue {queue}: {ready} messages ready, {unacked} unacknowledged at the end"
                        ));
                    }
                }
            }
            Broker::RedisStreams => {
                let redis = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
                let info =
                    shell("redis-cli", &["-u", &redis, "XINFO", "GROUPS", &self.name]).await?;
                let lines: Vec<&str> = info.lines().map(str::trim).collect();
                let field = |name: &str| {
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1).copied())
                        .unwrap_or("?")
                };
                let (pending, lag) = (field("pending"), field("lag"));
                if pending != "0" || lag != "0" {
                    problems.push(format!(
                        "Redis stream {}: {pending} entries pending, lag {lag} at the end",
                        self.name
                    ));
                }
            }
            Broker::Nats => {
                let server = services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
                let client = async_nats::connect(&server)
                    .await
                    .map_err(|e| format!("NATS at {server}: {e}"))?;
                let js = async_nats::jetstream::new(client);
                let stream = js
                    .get_stream(&self.name)
                    .await
                    .map_err(|e| format!("the stream {}: {e}", self.name))?;
                let info = stream
                    .consumer_info("idem")
                    .await
                    .map_err(|e| format!("the consumer idem of {}: {e}", self.name))?;
                if info.num_pending != 0 || info.num_ack_pending != 0 {
                    problems.push(format!(
                        "NATS stream {}: {} messages pending, {} unacknowledged at the end",
                        self.name, info.num_pending, info.num_ack_pending
                    ));
                }
            }
            Broker::Kafka => {
                let (brokers, _) = kafka_parts(&self.from)?;
                let config =
                    idem_kafka::KafkaConfig::from_url(&self.from).map_err(|e| e.to_string())?;
                let group = config.group().to_owned();
                let mut topics = vec![config.topic().to_owned()];
                topics.extend((0..).map_while(|level| config.retry_topic(level)));
                let lag = tokio::task::spawn_blocking(move || {
                    crate::kafka::group_lag(&brokers, &group, &topics)
                })
                .await
                .map_err(|e| e.to_string())??;
                problems.extend(lag);
            }
            Broker::RocketMq => {
                let config = idem_rocketmq::RocketMqConfig::from_url(&self.from)
                    .map_err(|e| e.to_string())?;
                problems.extend(
                    crate::rocketmq::group_backlog(
                        config.name_servers(),
                        config.group(),
                        crate::rocketmq::COMMIT_WAIT,
                    )
                    .await?,
                );
            }
            Broker::Proxy | Broker::Serve => return Ok(None),
        }
        Ok(Some(problems))
    }

    /// Publishes copy `copy` of the message with key `key` and waits for
    /// the broker to take it.
    pub async fn publish(&self, key: &str, copy: u32) -> Result<(), String> {
        let id = format!("{key}/{copy}");
        let body = format!(r#"{{"key":"{key}","copy":{copy}}}"#);
        let message = || {
            let mut m = Message::new(body.clone());
            m.id = Some(id.clone());
            m.content_type = Some("application/json".into());
            m
        };
        match &self.producer {
            Producer::Amqp(p, config) => {
                if p.read().await.publish(&message()).await.is_ok() {
                    return Ok(());
                }
                // Once under the write lock: another publish may have
                // opened a new connection meanwhile.
                let mut p = p.write().await;
                if p.publish(&message()).await.is_ok() {
                    return Ok(());
                }
                *p = AmqpPublisher::connect(config)
                    .await
                    .map_err(|e| e.to_string())?;
                p.publish(&message()).await.map_err(|e| e.to_string())
            }
            Producer::Nats(p, subject) => p
                .publish(subject, &id, &[], body.clone())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Producer::RedisStreams(p) => p
                .publish(&message())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Producer::Kafka(p, topic) => p
                .publish(topic, None, Some(key.as_bytes()), &id, &[], body.as_bytes())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Producer::RocketMq(p, topic) => p
                .publish(topic, &id, &[], body.clone())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }

    /// The keys of the dead letters the consumers wrote, read with the
    /// broker's own client where one is at hand (RabbitMQ with `lapin`,
    /// taking each; the Redis stream with `XRANGE`; the JetStream stream
    /// message by message; the Kafka topic from its beginning with a plain
    /// librdkafka consumer; the RocketMQ topic whole with the RocketMQ
    /// client's pull consumer; all five leaving idem's code out). Waits up
    /// to `wait` for at least `expected`.
    pub async fn dead_letters(
        &self,
        broker: Broker,
        expected: usize,
        wait: Duration,
    ) -> Result<Vec<String>, String> {
        let url = &self.dead_letters;
        let deadline = tokio::time::Instant::now() + wait;
        let read = async {
            match broker {
                Broker::Amqp => {
                    let mut keys = Vec::new();
                    loop {
                        keys.extend(amqp_take(url).await?);
                        if keys.len() >= expected || tokio::time::Instant::now() >= deadline {
                            return Ok(keys);
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                Broker::RedisStreams => loop {
                    let keys = redis_stream_keys(url).await?;
                    if keys.len() >= expected || tokio::time::Instant::now() >= deadline {
                        return Ok(keys);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                },
                Broker::Nats => loop {
                    let keys = jetstream_keys(url).await?;
                    if keys.len() >= expected || tokio::time::Instant::now() >= deadline {
                        return Ok(keys);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                },
                Broker::Kafka => loop {
                    let (brokers, topic) = kafka_parts(url)?;
                    let keys = tokio::task::spawn_blocking(move || {
                        crate::kafka::read_all(&brokers, &topic, key_in)
                    })
                    .await
                    .map_err(|e| e.to_string())??;
                    if keys.len() >= expected || tokio::time::Instant::now() >= deadline {
                        return Ok(keys);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                },
                Broker::RocketMq => loop {
                    let config =
                        idem_rocketmq::RocketMqConfig::from_url(url).map_err(|e| e.to_string())?;
                    let keys =
                        crate::rocketmq::read_all(config.name_servers(), config.topic(), key_in)
                            .await?;
                    if keys.len() >= expected || tokio::time::Instant::now() >= deadline {
                        return Ok(keys);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                },
                Broker::Proxy | Broker::Serve => Err("the HTTP runs have no broker".into()),
            }
        };
        read.await
            .map_err(|e: String| format!("reading the dead letters at {url}: {e}"))
    }

    pub async fn close(self) {
        if let Producer::RocketMq(p, _) = self.producer {
            p.shutdown().await;
        }
        if let Some((url, queues)) = self.queues {
            delete_queues(&url, &queues).await;
        }
    }
}

/// Deletes `queues` on the RabbitMQ at `url`, as far as it can: a queue
/// left behind costs only time at the broker's next restart.
async fn delete_queues(url: &str, queues: &[String]) {
    use lapin::options::QueueDeleteOptions;
    let Ok(connection) =
        lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await
    else {
        return;
    };
    if let Ok(channel) = connection.create_channel().await {
        for q in queues {
            let _ = channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
    let _ = connection.close(0, "done".into()).await;
}

/// The brokers and the topic of a `kafka://BROKERS?topic=NAME&…` URL.
fn kafka_parts(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("kafka://")
        .ok_or_else(|| format!("{url} is not a kafka:// URL"))?;
    let (brokers, query) = rest.split_once('?').unwrap_or((rest, ""));
    let topic = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("topic="))
        .ok_or_else(|| format!("{url} names no topic"))?;
    Ok((brokers.to_owned(), topic.to_owned()))
}

/// The run's key in a message body, or what the body is instead.
fn key_in(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("key")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("(a body that is not a run's message: {} bytes)", body.len()))
}

/// Takes every message waiting in the RabbitMQ queue the URL `url` names
/// (`…?queue=NAME`), with `lapin`; answers their keys.
async fn amqp_take(url: &str) -> Result<Vec<String>, String> {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    let (server, queue) = url
        .split_once("?queue=")
        .ok_or_else(|| format!("no queue in {url}"))?;
    let connection = lapin::Connection::connect(server, lapin::ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let mut keys = Vec::new();
    while let Some(got) = channel
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .map_err(|e| e.to_string())?
    {
        keys.push(key_in(&got.delivery.data));
        got.delivery
            .ack(BasicAckOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    }
    let _ = connection.close(0, "read".into()).await;
    Ok(keys)
}

/// The server and the `stream=` of a URL `scheme://server?stream=NAME&…`.
fn server_and_stream(url: &str) -> Result<(&str, &str), String> {
    let (server, query) = url
        .split_once('?')
        .ok_or_else(|| format!("no stream in {url}"))?;
    let stream = query
        .split('&')
        .find_map(|p| p.strip_prefix("stream="))
        .ok_or_else(|| format!("no stream in {url}"))?;
    Ok((server, stream))
}

/// The keys of every entry of the Redis stream the URL `url` names
/// (`redis://…?stream=NAME&…`), read with `XRANGE` (which takes nothing).
async fn redis_stream_keys(url: &str) -> Result<Vec<String>, String> {
    let (server, stream) = server_and_stream(url)?;
    let out = shell(
        "redis-cli",
        &["-u", server, "--no-raw", "XRANGE", stream, "-", "+"],
    )
    .await?;
    // Each entry's fields come as name and value lines: the value after
    // a `body` line is the message.
    let lines: Vec<&str> = out.lines().collect();
    let mut keys = Vec::new();
    for pair in lines.windows(2) {
        if pair[0].trim_end().ends_with("\"body\"") {
            let quoted = pair[1].split_once(") ").map_or(pair[1], |(_, v)| v).trim();
            let body: String = serde_json::from_str(quoted).unwrap_or_else(|_| quoted.to_owned());
            keys.push(key_in(body.as_bytes()));
        }
    }
    Ok(keys)
}

/// The keys of every message of the JetStream stream the URL `url` names
/// (`nats://…?stream=NAME&…`), fetched one by one by sequence with the
/// NATS client (which takes nothing).
async fn jetstream_keys(url: &str) -> Result<Vec<String>, String> {
    let (server, name) = server_and_stream(url)?;
    let client = async_nats::connect(server)
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(client);
    let mut stream = match js.get_stream(name).await {
        Ok(s) => s,
        // No dead letter was ever written: no stream.
        Err(e) if e.to_string().contains("not found") => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    };
    let state = stream
        .info()
        .await
        .map_err(|e| e.to_string())?
        .state
        .clone();
    let mut keys = Vec::new();
    for seq in state.first_sequence..=state.last_sequence {
        if state.messages == 0 {
            break;
        }
        if let Ok(m) = stream.get_raw_message(seq).await {
            keys.push(key_in(&m.payload));
        }
    }
    Ok(keys)
}

/// The port of the run's own Kafka-protocol broker.
const OWN_KAFKA_PORT: u16 = 9192;

/// Where the run's own Kafka-protocol broker keeps its records and pid.
const OWN_KAFKA_DIR: &str = "/tmp/idem-chaos-kafka";

/// Starts, unless it is up, a Kafka-protocol broker of the runs' own on
/// 127.0.0.1:9192: the project's tansu (`scripts/kafka-broker` builds it)
/// keeping its records in SQLite, so that a restart keeps them (the shared
/// test broker keeps them in memory).
pub async fn own_kafka_start() -> Result<(), String> {
    if tokio::net::TcpStream::connect(("127.0.0.1", OWN_KAFKA_PORT))
        .await
        .is_ok()
    {
        return Ok(());
    }
    let tools = std::env::var("IDEM_TOOLS").unwrap_or_else(|_| "/var/cache/idem-tools".into());
    let tansu = format!("{tools}/bin/tansu");
    if !std::path::Path::new(&tansu).exists() {
        return Err(format!(
            "{tansu} is missing: `scripts/kafka-broker install` builds it"
        ));
    }
    std::fs::create_dir_all(OWN_KAFKA_DIR).map_err(|e| format!("{OWN_KAFKA_DIR}: {e}"))?;
    let listener = format!("tcp://127.0.0.1:{OWN_KAFKA_PORT}");
    let pidfile = format!("{OWN_KAFKA_DIR}/tansu.pid");
    shell(
        "start-stop-daemon",
        &[
            "--start",
            "--background",
            "--make-pidfile",
            "--pidfile",
            &pidfile,
            "--chdir",
            OWN_KAFKA_DIR,
            "--output",
            &format!("{OWN_KAFKA_DIR}/tansu.log"),
            "--exec",
            &tansu,
            "--",
            "broker",
            "--listener-url",
            &listener,
            "--advertised-listener-url",
            &listener,
            // Relative to the directory above.
            "--storage-engine",
            "sqlite://tansu.db",
        ],
    )
    .await?;
    wait_port(OWN_KAFKA_PORT).await
}

/// Stops the runs' own Kafka-protocol broker (SIGTERM, then SIGKILL after
/// 10 s).
async fn own_kafka_stop() -> Result<(), String> {
    let pidfile = format!("{OWN_KAFKA_DIR}/tansu.pid");
    shell(
        "start-stop-daemon",
        &[
            "--stop",
            "--oknodo",
            "--retry",
            "TERM/10/KILL/5",
            "--pidfile",
            &pidfile,
        ],
    )
    .await
    .map(drop)
}
