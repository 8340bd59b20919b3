//! `idem consume` against the bare consumer, per broker: messages per second
//! when a no-op handler acks each message.
//!
//! - **bare**: the broker's idem source with no guard: fetch up to 64, ack
//!   each (concurrently), fetch again;
//! - **idem consume**: the release binary on the memory store, then on the
//!   Redis store, then on the tiered store (a memory hot tier over a file
//!   cold tier, with the key filter), POSTing each message to a trivial HTTP handler in this
//!   process, 64 at a time.
//!
//! Each side gets its own queue, stream or topic with the same pre-published
//! messages. `cargo bench -p idem-server --bench consume`
//! (IDEM_BENCH_MESSAGES, default 20 000; IDEM_BENCH_BROKERS=amqp,nats,
//! redis-streams,kafka,rocketmq to run some; IDEM_BENCH_BIN, the path of
//! another build of `idem` to run as the sidecar, e.g. to compare two
//! versions against the same bare rate; the IDEM_TEST_*_URL variables).

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use idem_consumer::{Message, Source};
use tokio::io::{AsyncBufReadExt, BufReader};

const CONCURRENCY: usize = 64;

fn messages(n: usize) -> impl Iterator<Item = Message> {
    (0..n).map(|i| {
        let mut m = Message::new(format!("{{\"order\":{i}}}"));
        m.id = Some(format!("m-{i}"));
        m.content_type = Some("application/json".into());
        m
    })
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000)
}

/// Fetches and acks `n` messages through `source`, no guard; timed from
/// the first batch's arrival.
async fn bare<S: Source>(source: S, n: usize) -> f64 {
    let mut started = None;
    let mut done = 0;
    while done < n {
        let batch = source.fetch(CONCURRENCY).await.expect("fetch");
        started.get_or_insert_with(Instant::now);
        done += batch.len();
        for r in join_all(batch.into_iter().map(|d| source.ack(d))).await {
            r.expect("ack");
        }
    }
    n as f64 / started.expect("a batch").elapsed().as_secs_f64()
}

/// Runs `idem consume --from url --store store` until the trivial handler
/// saw `n` messages; timed from the first message's arrival, so that the
/// consumer's start (a Kafka group join and first fetch take about a
/// second) stays out of the rate.
async fn sidecar(from: &str, store: &[String], n: usize) -> f64 {
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = format!("http://{}/handle", listener.local_addr().unwrap());
    let counter = seen.clone();
    let app = axum::Router::new().route(
        "/handle",
        axum::routing::post(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            std::future::ready("")
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let bin = std::env::var("IDEM_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_idem").into());
    let mut child = tokio::process::Command::new(bin)
        .args(["consume", "--from", from, "--to", &to])
        .args(store)
        .args(["--concurrency", &CONCURRENCY.to_string(), "--log", "warn"])
        .env_remove("IDEM_CONFIG")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the idem binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    lines.next_line().await.unwrap().expect("a ready line");
    let ready = Instant::now();
    while seen.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    eprintln!(
        "{from} on {}: the first message came {:?} after the ready line",
        store.join(" "),
        started - ready
    );
    while seen.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status();
    let _ = child.wait().await;
    server.abort();
    rate
}

struct Row {
    broker: &'static str,
    bare: f64,
    memory: f64,
    redis: f64,
    tiered: f64,
}

/// `--store URL`.
fn store(url: &str) -> Vec<String> {
    vec!["--store".into(), url.into()]
}

/// Runs the sidecar from `url` on the tiered store: a memory hot tier over
/// a file cold tier in a directory of its own, with the key filter.
async fn tiered(url: &str, n: usize) -> f64 {
    let cold = tempfile::tempdir().unwrap();
    let args = [
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &format!("file://{}", cold.path().join("cold").display()),
    ]
    .map(String::from);
    sidecar(url, &args, n).await
}

async fn amqp(n: usize, redis: &str) -> Row {
    use idem_amqp::{AmqpConfig, AmqpPublisher, AmqpSource};
    let base = std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let prepare = async |name: &str| {
        let url = format!("{base}?queue={name}");
        let config = AmqpConfig::from_url(&url).unwrap().concurrency(CONCURRENCY);
        let source = AmqpSource::connect(config.clone()).await.expect("RabbitMQ");
        let publisher = AmqpPublisher::connect(&config).await.unwrap();
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(256, |m| {
                let publisher = &publisher;
                async move { publisher.publish(&m).await.unwrap() }
            })
            .await;
        (url, source)
    };
    let (_, source) = prepare(&unique("bench-bare")).await;
    let bare = bare(source, n).await;
    let (url, source) = prepare(&unique("bench-mem")).await;
    source.close().await;
    let memory = sidecar(&url, &store("memory://"), n).await;
    let (url, source) = prepare(&unique("bench-redis")).await;
    source.close().await;
    let redis = sidecar(&url, &store(redis), n).await;
    let (url, source) = prepare(&unique("bench-tiered")).await;
    source.close().await;
    let tiered = tiered(&url, n).await;
    Row {
        broker: "RabbitMQ",
        bare,
        memory,
        redis,
        tiered,
    }
}

async fn nats(n: usize, redis: &str) -> Row {
    use idem_jetstream::{JetStreamConfig, JetStreamPublisher, JetStreamSource};
    let server =
        std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let prepare = async |name: &str| {
        let subject = name.to_lowercase().replace('-', "_");
        let url = format!(
            "{server}?stream={}&consumer=idem&subject={subject}.>",
            name.to_uppercase().replace('-', "_")
        );
        let config = JetStreamConfig::from_url(&url)
            .unwrap()
            .concurrency(CONCURRENCY);
        let source = JetStreamSource::connect(config)
            .await
            .expect("NATS JetStream");
        let publisher = JetStreamPublisher::connect(&server).await.unwrap();
        let subject = format!("{subject}.new");
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(256, |m| {
                let (publisher, subject) = (&publisher, &subject);
                async move {
                    publisher
                        .publish(subject, m.id.as_deref().unwrap(), &[], m.body)
                        .await
                        .unwrap();
                }
            })
            .await;
        (url, source)
    };
    let (_, source) = prepare(&unique("bench-bare")).await;
    let bare = bare(source, n).await;
    let (url, _) = prepare(&unique("bench-mem")).await;
    let memory = sidecar(&url, &store("memory://"), n).await;
    let (url, _) = prepare(&unique("bench-redis")).await;
    let redis = sidecar(&url, &store(redis), n).await;
    let (url, _) = prepare(&unique("bench-tiered")).await;
    let tiered = tiered(&url, n).await;
    Row {
        broker: "NATS JetStream",
        bare,
        memory,
        redis,
        tiered,
    }
}

async fn redis_streams(n: usize, redis: &str) -> Row {
    use idem_redis_streams::{RedisStreamConfig, RedisStreamPublisher, RedisStreamSource};
    let prepare = async |name: &str| {
        let url = format!("{redis}?stream={name}&group=idem");
        let config = RedisStreamConfig::from_url(&url)
            .unwrap()
            .concurrency(CONCURRENCY);
        let source = RedisStreamSource::connect(config.clone())
            .await
            .expect("Redis");
        let publisher = RedisStreamPublisher::connect(&config).await.unwrap();
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(256, |m| {
                let publisher = &publisher;
                async move {
                    publisher.publish(&m).await.unwrap();
                }
            })
            .await;
        (url, source)
    };
    let (_, source) = prepare(&unique("bench-bare")).await;
    let bare = bare(source, n).await;
    let (url, _) = prepare(&unique("bench-mem")).await;
    let memory = sidecar(&url, &store("memory://"), n).await;
    let (url, _) = prepare(&unique("bench-redis")).await;
    let redis_rate = sidecar(&url, &store(redis), n).await;
    let (url, _) = prepare(&unique("bench-tiered")).await;
    let tiered = tiered(&url, n).await;
    Row {
        broker: "Redis Streams",
        bare,
        memory,
        redis: redis_rate,
        tiered,
    }
}

async fn kafka(n: usize, redis: &str) -> Row {
    use idem_kafka::{KafkaConfig, KafkaPublisher, KafkaSource};
    let brokers = std::env::var("IDEM_TEST_KAFKA_URL").unwrap_or_else(|_| "127.0.0.1:9092".into());
    // One record per batch, for the test broker (docs/design.md, "Kafka").
    let publisher = KafkaPublisher::with_properties(
        &brokers,
        &[("linger.ms", "0"), ("batch.num.messages", "1")],
    )
    .unwrap();
    // A fresh 4-partition topic with the messages; the source creates it.
    let prepare = async |name: &str| {
        let url = format!("kafka://{brokers}?topic={name}&group={name}-group&partitions=4");
        let config = KafkaConfig::from_url(&url)
            .unwrap()
            .concurrency(CONCURRENCY);
        let source = KafkaSource::connect(config).await.expect("Kafka");
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(1000, |m| {
                let publisher = &publisher;
                async move {
                    let id = m.id.unwrap();
                    publisher
                        .publish(name, None, Some(id.as_bytes()), &id, &[], &m.body)
                        .await
                        .unwrap();
                }
            })
            .await;
        (url, source)
    };
    let (_, source) = prepare(&unique("bench-bare")).await;
    let bare = bare(source.clone(), n).await;
    source.close().await;
    let (url, source) = prepare(&unique("bench-mem")).await;
    source.close().await;
    let memory = sidecar(&url, &store("memory://"), n).await;
    let (url, source) = prepare(&unique("bench-redis")).await;
    source.close().await;
    let redis = sidecar(&url, &store(redis), n).await;
    let (url, source) = prepare(&unique("bench-tiered")).await;
    source.close().await;
    let tiered = tiered(&url, n).await;
    Row {
        broker: "Kafka (tansu)",
        bare,
        memory,
        redis,
        tiered,
    }
}

async fn rocketmq(n: usize, redis: &str) -> Row {
    use idem_rocketmq::{RocketMqConfig, RocketMqPublisher, RocketMqSource};
    let base = std::env::var("IDEM_TEST_ROCKETMQ_URL")
        .unwrap_or_else(|_| "rocketmq://127.0.0.1:9876".into());
    let publisher = RocketMqPublisher::connect(&base)
        .await
        .expect("the RocketMQ name server is reachable");
    // A fresh topic (the broker's default 4 queues) with the messages, and
    // a fresh group.
    let prepare = async |tag: &str| {
        let topic = unique(tag).replace('-', "_");
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(32, |m| {
                let (publisher, topic) = (&publisher, &topic);
                async move {
                    let key = m.id.unwrap();
                    publisher.publish(topic, &key, &[], m.body).await.unwrap();
                }
            })
            .await;
        format!("{base}?topic={topic}&group={topic}_group")
    };
    let url = prepare("bench_bare").await;
    let config = RocketMqConfig::from_url(&url)
        .unwrap()
        .concurrency(CONCURRENCY);
    let source = RocketMqSource::connect(config).await.expect("RocketMQ");
    let bare = bare(source.clone(), n).await;
    source.shutdown().await;
    let url = prepare("bench_mem").await;
    let memory = sidecar(&url, &store("memory://"), n).await;
    let url = prepare("bench_redis").await;
    let redis = sidecar(&url, &store(redis), n).await;
    let url = prepare("bench_tiered").await;
    let tiered = tiered(&url, n).await;
    publisher.shutdown().await;
    Row {
        broker: "RocketMQ (rocketmq-rust)",
        bare,
        memory,
        redis,
        tiered,
    }
}

fn main() {
    let n: usize = std::env::var("IDEM_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let redis =
        std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("{n} messages a side, concurrency {CONCURRENCY}; messages/s (ratio to bare)");
    println!(
        "| broker | bare source | idem consume, memory store | idem consume, Redis store | \
         idem consume, tiered store (memory over file) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    // IDEM_BENCH_BROKERS=amqp,kafka runs only those.
    let only = std::env::var("IDEM_BENCH_BROKERS").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|b| b == name);
    let mut rows = Vec::new();
    if wanted("amqp") {
        rows.push(rt.block_on(amqp(n, &redis)));
    }
    if wanted("nats") {
        rows.push(rt.block_on(nats(n, &redis)));
    }
    if wanted("redis-streams") {
        rows.push(rt.block_on(redis_streams(n, &redis)));
    }
    if wanted("kafka") {
        rows.push(rt.block_on(kafka(n, &redis)));
    }
    if wanted("rocketmq") {
        rows.push(rt.block_on(rocketmq(n, &redis)));
    }
    for row in rows {
        println!(
            "| {} | {:.0} | {:.0} ({:.2}) | {:.0} ({:.2}) | {:.0} ({:.2}) |",
            row.broker,
            row.bare,
            row.memory,
            row.memory / row.bare,
            row.redis,
            row.redis / row.bare,
            row.tiered,
            row.tiered / row.bare
        );
    }
}
