//! Messages per second consumed from Kafka: a bare rdkafka consumer that
//! stores each offset after a no-op handler (committed every second, the
//! usual at-least-once loop), then the runner on [`KafkaSource`] with the
//! memory and Redis stores (the Redis store twice: each fetched batch's
//! completions in one call, the default, and each completion on its own).
//! Each side reads a fresh 4-partition topic with
//! the same pre-published messages (one record per batch, for the test
//! broker: see docs/design.md), as a fresh group. Each rate runs from the
//! first message handled to the last, leaving the group join out.
//!
//! `cargo bench -p idem-kafka --bench throughput`
//! (`IDEM_BENCH_MESSAGES`, default 20 000, `IDEM_BENCH_CONCURRENCY`,
//! default 64; `IDEM_BENCH_CASES=bare,memory,memory-alone,redis,redis-alone` runs only
//! those; the broker from `IDEM_TEST_KAFKA_URL`, Redis from
//! `IDEM_TEST_REDIS_URL`.)

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idem_consumer::{HandlerError, Runner, Timed};
use idem_core::{Bytes, ClaimHandle, Guard, Store};
use idem_kafka::{KafkaConfig, KafkaPublisher, KafkaSource};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;

fn env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh topic holding `n` messages (ids `m-0` …), its name.
async fn prepare(brokers: &str, tag: &str, n: usize) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!(
        "bench-{tag}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    // One record per batch: tansu 0.6 returns nothing to a fetch that
    // starts inside a multi-record batch, as a fetch after a pause does.
    let publisher = KafkaPublisher::with_properties(
        brokers,
        &[("linger.ms", "0"), ("batch.num.messages", "1")],
    )
    .unwrap();
    let body = br#"{"order":"o","amount":12}"#;
    for chunk in (0..n).collect::<Vec<_>>().chunks(2000) {
        let sends = chunk.iter().map(|i| {
            let id = format!("m-{i}");
            let publisher = publisher.clone();
            let topic = topic.clone();
            async move {
                publisher
                    .publish(&topic, None, Some(id.as_bytes()), &id, &[], body)
                    .await
                    .expect("published")
            }
        });
        futures_util::future::join_all(sends).await;
    }
    topic
}

/// The usual at-least-once loop: receive, handle (no-op), store the offset;
/// librdkafka commits the stored offsets every second.
async fn bare(brokers: &str, n: usize) -> f64 {
    let topic = prepare(brokers, "bare", n).await;
    eprintln!("published {n} to {topic}");
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{topic}-group"))
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let joining = Instant::now();
    let mut first = None;
    for _ in 0..n {
        let m = consumer.recv().await.expect("a message");
        first.get_or_insert_with(Instant::now);
        std::hint::black_box(rdkafka::Message::payload(&m));
        consumer.store_offset_from_message(&m).unwrap();
    }
    let first = first.unwrap();
    eprintln!(
        "bare: the first message came {:?} after subscribing",
        first - joining
    );
    let rate = n as f64 / first.elapsed().as_secs_f64();
    consumer
        .commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        .ok();
    rate
}

async fn through_runner<S: Store + Clone>(
    store: S,
    brokers: &str,
    tag: &str,
    n: usize,
    concurrency: usize,
    completion_linger: Duration,
) -> f64 {
    let topic = prepare(brokers, tag, n).await;
    eprintln!("published {n} to {topic}");
    let config = KafkaConfig::from_url(&format!(
        "kafka://{brokers}?topic={topic}&group={topic}-group"
    ))
    .unwrap()
    .concurrency(concurrency);
    let inner = KafkaSource::connect(config).await.unwrap();
    let source = Timed::new(inner.clone());
    let times = source.times();
    let first = Arc::new(OnceLock::new());
    let handler = {
        let first = first.clone();
        move |m: idem_consumer::Message, _claim: ClaimHandle| {
            first.get_or_init(Instant::now);
            std::hint::black_box(&m.body);
            std::future::ready(Ok::<_, HandlerError>(Bytes::new()))
        }
    };
    let guard = Guard::new(store).retention(Duration::from_secs(600));
    let shutdown = CancellationToken::new();
    let joining = Instant::now();
    let run = tokio::spawn(
        Runner::new(guard, source, handler)
            .concurrency(concurrency)
            .completion_linger(completion_linger)
            .run(shutdown.clone()),
    );
    times.wait_for(n).await;
    let first = *first.get().unwrap();
    eprintln!(
        "{tag}: the first message came {:?} after connecting",
        first - joining
    );
    let rate = n as f64 / first.elapsed().as_secs_f64();
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.handled as usize, n, "{report:?}");
    inner.close().await;
    rate
}

fn main() {
    let n = env("IDEM_BENCH_MESSAGES", 20_000);
    let concurrency = env("IDEM_BENCH_CONCURRENCY", 64);
    let brokers = idem_testkit::services::url("IDEM_TEST_KAFKA_URL", "127.0.0.1:9092");
    let redis = idem_testkit::services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // IDEM_BENCH_CASES=bare,redis runs only those (for a profile of one).
    let only = std::env::var("IDEM_BENCH_CASES").unwrap_or_default();
    let wanted = |case: &str| only.is_empty() || only.split(',').any(|c| c == case);
    rt.block_on(async {
        let gathered = Duration::from_millis(1);
        let mut bare_rate = f64::NAN;
        if wanted("bare") {
            bare_rate = bare(&brokers, n).await;
        }
        let mut memory = f64::NAN;
        if wanted("memory") {
            let store = idem_core::MemoryStore::new();
            memory = through_runner(store, &brokers, "memory", n, concurrency, gathered).await;
        }
        let mut memory_alone = f64::NAN;
        if wanted("memory-alone") {
            let store = idem_core::MemoryStore::new();
            let linger = Duration::ZERO;
            memory_alone =
                through_runner(store, &brokers, "memory-alone", n, concurrency, linger).await;
        }
        let store = idem_redis::RedisStore::connect(&redis)
            .await
            .expect("Redis");
        let (mut redis_rate, mut redis_alone) = (f64::NAN, f64::NAN);
        if wanted("redis") {
            redis_rate =
                through_runner(store.clone(), &brokers, "redis", n, concurrency, gathered).await;
        }
        if wanted("redis-alone") {
            let linger = Duration::ZERO;
            redis_alone =
                through_runner(store, &brokers, "redis-alone", n, concurrency, linger).await;
        }
        let bare = bare_rate;
        println!(
            "\n{n} messages, {PARTITIONS} partitions, concurrency {concurrency}, broker {brokers}\n"
        );
        println!("| consumer | msgs/s | ratio to bare |\n|---|---:|---:|");
        for (name, rate) in [
            ("bare rdkafka consumer, offsets stored after a no-op", bare),
            ("runner + MemoryStore", memory),
            (
                "runner + MemoryStore, each completion on its own",
                memory_alone,
            ),
            ("runner + RedisStore", redis_rate),
            (
                "runner + RedisStore, each completion on its own",
                redis_alone,
            ),
        ] {
            println!("| {name} | {rate:.0} | {:.2} |", rate / bare);
        }
    });
}
