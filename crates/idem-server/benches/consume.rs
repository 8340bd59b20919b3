//! `idem consume` against bare consumers, per broker: messages per second
//! through a trivial handler that answers at once.
//!
//! - **bare**: the broker's idem source with no guard and no HTTP: fetch up
//!   to 64, ack each (concurrently), fetch again;
//! - **bare + HTTP**: the same, POSTing each message to the handler and
//!   acking on 2xx (no guard): the sidecar's HTTP hop without the guard;
//! - **bare + HTTP batches**: the same, POSTing each fetched batch as one
//!   JSON array and acking its messages on 2xx;
//! - **idem consume**: the release binary, 64 at a time, on the memory
//!   store, the Redis store and the tiered store (a memory hot tier over a
//!   file cold tier, with the key filter); then `--batch 64` (concurrency
//!   128, the default for that batch) on the memory and Redis stores.
//!
//! The guard's own cost is the ratio of a sidecar to the bare + HTTP row of
//! its kind; the ratio to bare adds the HTTP hop. Each side gets its own
//! queue, stream or topic with the same pre-published messages.
//! `cargo bench -p idem-server --bench consume` (IDEM_BENCH_MESSAGES,
//! default 20 000; IDEM_BENCH_BROKERS=amqp,nats,redis-streams,kafka,rocketmq
//! to run some; IDEM_BENCH_BIN, the path of another build of `idem` to run
//! as the sidecar, e.g. to compare two versions against the same bare rate;
//! the IDEM_TEST_*_URL variables).

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_consumer::{BoxSource, Delivery, Message, Source};
use tokio::io::{AsyncBufReadExt, BufReader};

const CONCURRENCY: usize = 64;
/// `--batch` of the batched rows.
const BATCH: usize = 64;

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

/// Fetches `n` messages through `source`, up to 64 at a time, and hands
/// each batch to `settle`; the rate, timed from the first batch's arrival.
async fn drain<S: Source>(
    source: &S,
    n: usize,
    mut settle: impl AsyncFnMut(Vec<Delivery<S::Receipt>>),
) -> f64 {
    let mut started = None;
    let mut done = 0;
    while done < n {
        let batch = source.fetch(CONCURRENCY).await.expect("fetch");
        started.get_or_insert_with(Instant::now);
        done += batch.len();
        settle(batch).await;
    }
    n as f64 / started.expect("a batch").elapsed().as_secs_f64()
}

/// Acks every delivery of `batch`, concurrently.
async fn ack_all<S: Source>(source: &S, batch: Vec<Delivery<S::Receipt>>) {
    for r in join_all(batch.into_iter().map(|d| source.ack(d))).await {
        r.expect("ack");
    }
}

/// Fetches and acks `n` messages through `source`, no guard.
async fn bare<S: Source>(source: S, n: usize) -> f64 {
    drain(&source, n, async |batch| ack_all(&source, batch).await).await
}

/// The trivial handler: `/handle` takes one message, `/batch` a JSON
/// array of them and answers each done. Counts what it got; answers its
/// URL's base and the count.
async fn handler() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let one = seen.clone();
    let many = seen.clone();
    let app = axum::Router::new()
        .route(
            "/handle",
            axum::routing::post(move || {
                one.fetch_add(1, Ordering::Relaxed);
                std::future::ready("")
            }),
        )
        .route(
            "/batch",
            axum::routing::post(move |body: Bytes| {
                let items: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
                many.fetch_add(items.len(), Ordering::Relaxed);
                let results: Vec<_> = items
                    .iter()
                    .map(|i| serde_json::json!({ "key": i["key"], "status": 200 }))
                    .collect();
                std::future::ready(axum::Json(serde_json::json!({ "results": results })))
            }),
        );
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, seen, server)
}

/// Fetches `n` messages through `source`, POSTs each to the handler (or
/// each fetched batch as one JSON array, with `batched`), and acks them on
/// 2xx; no guard. Timed from the first batch's arrival.
async fn bare_http<S: Source>(source: S, n: usize, batched: bool) -> f64 {
    let (base, _, server) = handler().await;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let post = async |path: &str, body: Bytes, batch: Option<usize>| {
        let mut request =
            http::Request::post(format!("{base}{path}")).header("content-type", "application/json");
        if let Some(count) = batch {
            request = request.header("idem-batch", count);
        }
        let response = client
            .request(request.body(Full::new(body)).unwrap())
            .await
            .expect("the handler answers");
        assert!(response.status().is_success());
        response.into_body().collect().await.unwrap();
    };
    let rate = drain(&source, n, async |batch| {
        if batched {
            // The fields a batch item carries, as the sidecar sends them.
            let items: Vec<_> = batch
                .iter()
                .map(|d| {
                    let m = &d.message;
                    serde_json::json!({
                        "key": m.id, "token": 1, "attempt": m.attempt,
                        "content_type": m.content_type, "headers": {},
                        "body": serde_json::from_slice::<serde_json::Value>(&m.body).unwrap(),
                    })
                })
                .collect();
            let body = Bytes::from(serde_json::to_vec(&items).unwrap());
            post("/batch", body, Some(items.len())).await;
            ack_all(&source, batch).await;
        } else {
            let acks = batch.into_iter().map(|d| async {
                post("/handle", d.message.body.clone(), None).await;
                source.ack(d).await
            });
            for r in join_all(acks).await {
                r.expect("ack");
            }
        }
    })
    .await;
    server.abort();
    rate
}

/// Runs `idem consume --from url ARGS…` until the trivial handler saw `n`
/// messages (`/batch` when ARGS hold `--batch`); timed from the first
/// message's arrival, so that the consumer's start (a Kafka group join and
/// first fetch take about a second) stays out of the rate.
async fn sidecar(from: &str, args: &[String], n: usize) -> f64 {
    let (base, seen, server) = handler().await;
    let path = if args.iter().any(|a| a == "--batch") {
        "/batch"
    } else {
        "/handle"
    };
    let to = format!("{base}{path}");
    let bin = std::env::var("IDEM_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_idem").into());
    let mut child = tokio::process::Command::new(bin)
        .args(["consume", "--from", from, "--to", &to])
        .args(args)
        .args(["--log", "warn"])
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
        "{from} with {}: the first message came {:?} after the ready line",
        args.join(" "),
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

/// One broker's figures, messages per second.
struct Row {
    broker: &'static str,
    bare: f64,
    bare_http: f64,
    bare_http_batches: f64,
    memory: f64,
    redis: f64,
    tiered: f64,
    memory_batched: f64,
    redis_batched: f64,
}

/// The sidecar's arguments: `--store URL` and `extra`, one message per
/// request at concurrency 64, or batches of 64 at concurrency 128.
fn sidecar_args(store: &[&str], batched: bool) -> Vec<String> {
    let mut args: Vec<String> = store.iter().map(|s| s.to_string()).collect();
    if batched {
        args.extend(["--batch".into(), BATCH.to_string()]);
    } else {
        args.extend(["--concurrency".into(), CONCURRENCY.to_string()]);
    }
    args
}

/// Every side of one broker. `prepare(tag, keep)` makes a fresh queue,
/// stream or topic holding the messages and answers its `--from` URL and,
/// with `keep`, a source on it (else it closes the source it made).
async fn row(
    broker: &'static str,
    n: usize,
    redis: &str,
    prepare: impl AsyncFn(&str, bool) -> (String, Option<BoxSource>),
) -> Row {
    let kept = async |tag: &str| prepare(tag, true).await.1.expect("a kept source");
    let bare_rate = bare(kept("bench-bare").await, n).await;
    let http_rate = bare_http(kept("bench-http").await, n, false).await;
    let http_batches_rate = bare_http(kept("bench-http-batch").await, n, true).await;
    let run = async |tag: &str, store: &[&str], batched: bool| {
        let (url, _) = prepare(tag, false).await;
        sidecar(&url, &sidecar_args(store, batched), n).await
    };
    let memory = run("bench-mem", &["--store", "memory://"], false).await;
    let redis_rate = run("bench-redis", &["--store", redis], false).await;
    // The tiered store: a memory hot tier over a file cold tier in a
    // directory of its own, with the key filter.
    let cold = tempfile::tempdir().unwrap();
    let cold_url = format!("file://{}", cold.path().join("cold").display());
    let tiered_store = [
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &cold_url,
    ];
    let tiered = run("bench-tiered", &tiered_store, false).await;
    let memory_batched = run("bench-mem-batch", &["--store", "memory://"], true).await;
    let redis_batched = run("bench-redis-batch", &["--store", redis], true).await;
    Row {
        broker,
        bare: bare_rate,
        bare_http: http_rate,
        bare_http_batches: http_batches_rate,
        memory,
        redis: redis_rate,
        tiered,
        memory_batched,
        redis_batched,
    }
}

async fn amqp(n: usize, redis: &str) -> Row {
    use idem_amqp::{AmqpConfig, AmqpPublisher, AmqpSource};
    let base = std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let prepare = async |tag: &str, keep: bool| {
        let url = format!("{base}?queue={}", unique(tag));
        let config = AmqpConfig::from_url(&url).unwrap().concurrency(CONCURRENCY);
        let source = AmqpSource::connect(config.clone()).await.expect("RabbitMQ");
        let publisher = AmqpPublisher::connect(&config).await.unwrap();
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(256, |m| {
                let publisher = &publisher;
                async move { publisher.publish(&m).await.unwrap() }
            })
            .await;
        if keep {
            return (url, Some(BoxSource::new(source)));
        }
        source.close().await;
        (url, None)
    };
    row("RabbitMQ", n, redis, prepare).await
}

async fn nats(n: usize, redis: &str) -> Row {
    use idem_jetstream::{JetStreamConfig, JetStreamPublisher, JetStreamSource};
    let server =
        std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let prepare = async |tag: &str, keep: bool| {
        let name = unique(tag);
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
        (url, keep.then(|| BoxSource::new(source)))
    };
    row("NATS JetStream", n, redis, prepare).await
}

async fn redis_streams(n: usize, redis: &str) -> Row {
    use idem_redis_streams::{RedisStreamConfig, RedisStreamPublisher, RedisStreamSource};
    let prepare = async |tag: &str, keep: bool| {
        let url = format!("{redis}?stream={}&group=idem", unique(tag));
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
        (url, keep.then(|| BoxSource::new(source)))
    };
    row("Redis Streams", n, redis, prepare).await
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
    let prepare = async |tag: &str, keep: bool| {
        let name = unique(tag);
        let url = format!("kafka://{brokers}?topic={name}&group={name}-group&partitions=4");
        let config = KafkaConfig::from_url(&url)
            .unwrap()
            .concurrency(CONCURRENCY);
        let source = KafkaSource::connect(config).await.expect("Kafka");
        futures_util::stream::iter(messages(n))
            .for_each_concurrent(1000, |m| {
                let (publisher, name) = (&publisher, &name);
                async move {
                    let id = m.id.unwrap();
                    publisher
                        .publish(name, None, Some(id.as_bytes()), &id, &[], &m.body)
                        .await
                        .unwrap();
                }
            })
            .await;
        if keep {
            return (url, Some(BoxSource::new(source)));
        }
        source.close().await;
        (url, None)
    };
    row("Kafka (tansu)", n, redis, prepare).await
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
    let prepare = async |tag: &str, keep: bool| {
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
        let url = format!("{base}?topic={topic}&group={topic}_group");
        if !keep {
            return (url, None);
        }
        let config = RocketMqConfig::from_url(&url)
            .unwrap()
            .concurrency(CONCURRENCY);
        let source = RocketMqSource::connect(config).await.expect("RocketMQ");
        (url, Some(BoxSource::new(source)))
    };
    let row = row("RocketMQ (rocketmq-rust)", n, redis, prepare).await;
    publisher.shutdown().await;
    row
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
    println!("{n} messages a side; messages/s");
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
    table(
        &format!("One message per request, concurrency {CONCURRENCY}"),
        &[
            "bare + HTTP",
            "idem consume, memory",
            "idem consume, Redis",
            "idem consume, tiered (memory over file)",
        ],
        &rows,
        |r| (r.bare_http, vec![r.memory, r.redis, r.tiered]),
    );
    table(
        &format!(
            "Batches of {BATCH} (`--batch {BATCH}`, concurrency {})",
            2 * BATCH
        ),
        &[
            "bare + HTTP batches",
            "idem consume --batch, memory",
            "idem consume --batch, Redis",
        ],
        &rows,
        |r| (r.bare_http_batches, vec![r.memory_batched, r.redis_batched]),
    );
}

/// One table: each broker's bare rate, the HTTP baseline `columns[0]` and
/// the sidecars after it, each with its ratio to bare and to the baseline.
fn table(title: &str, columns: &[&str], rows: &[Row], pick: impl Fn(&Row) -> (f64, Vec<f64>)) {
    println!();
    println!("{title} (messages/s; ratio to bare; to {}):", columns[0]);
    println!();
    println!("| broker | bare | {} |", columns.join(" | "));
    println!("| --- |{}", " ---: |".repeat(columns.len() + 1));
    for r in rows {
        let (baseline, sidecars) = pick(r);
        let cells: Vec<String> = sidecars
            .iter()
            .map(|x| format!("{x:.0} ({:.2}; {:.2})", x / r.bare, x / baseline))
            .collect();
        println!(
            "| {} | {:.0} | {baseline:.0} | {} |",
            r.broker,
            r.bare,
            cells.join(" | ")
        );
    }
}
