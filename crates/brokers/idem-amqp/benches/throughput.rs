//! Messages per second through RabbitMQ: a bare lapin consumer acking after
//! a no-op handler, then the runner over `AmqpSource` with the memory, file
//! and Redis stores (Redis twice: each fetched batch's completions in one
//! call, the default, and each completion on its own); same prefetch, same pre-published messages. Latency is
//! per message, from the consumer receiving it to its ack completing.
//!
//! `cargo bench -p idem-amqp --bench throughput`
//! (IDEM_BENCH_MESSAGES, IDEM_BENCH_CONCURRENCY, IDEM_TEST_AMQP_URL,
//! IDEM_TEST_REDIS_URL change the defaults).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem_amqp::{AmqpConfig, AmqpSource};
use idem_consumer::{HandlerError, Latencies, Message, Runner, Timed};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore, Store};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Outcome {
    per_second: f64,
    latencies: Latencies,
}

impl Outcome {
    fn percentile(&self, p: f64) -> Duration {
        self.latencies.quantile(p)
    }
}

async fn prepublish(url: &str, queue: &str, n: usize) {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("RabbitMQ reachable");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for i in 0..n {
        let props = BasicProperties::default()
            .with_message_id(format!("m-{i}").into())
            .with_delivery_mode(2);
        let body = format!("{{\"order\":{i}}}");
        // Confirms are awaited per thousand below.
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await
            .unwrap();
        drop(confirm);
        if i % 1000 == 999 {
            ch.wait_for_confirms().await.unwrap();
        }
    }
    ch.wait_for_confirms().await.unwrap();
    let _ = conn.close(200, "OK".into()).await;
}

async fn delete_queues(url: &str, queue: &str) {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    for q in [queue.to_owned(), format!("{queue}.dead-letter")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = conn.close(200, "OK".into()).await;
}

/// (a) lapin alone: consume with prefetch, ack each after a no-op handler,
/// up to the prefetch at once.
async fn bare(url: &str, queue: &str, n: usize, concurrency: usize) -> Outcome {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(concurrency as u16, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Acks go out concurrently, up to the prefetch, as the runner's do.
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let started = Instant::now();
    consumer
        .by_ref()
        .take(n)
        .for_each_concurrent(concurrency, |d| {
            let latencies = latencies.clone();
            async move {
                let d = d.unwrap();
                let got = Instant::now();
                std::hint::black_box(&d.data);
                d.ack(BasicAckOptions::default()).await.unwrap();
                latencies.lock().push(got.elapsed());
            }
        })
        .await;
    let latencies = std::mem::take(&mut *latencies.lock());
    let per_second = n as f64 / started.elapsed().as_secs_f64();
    let _ = conn.close(200, "OK".into()).await;
    Outcome {
        per_second,
        latencies: latencies.into_iter().collect(),
    }
}

/// (b)–(e) the runner with `store`, completions gathered for
/// `completion_linger`.
async fn runner<S: Store + Clone>(
    url: &str,
    queue: &str,
    n: usize,
    concurrency: usize,
    store: S,
    completion_linger: Duration,
) -> Outcome {
    let config = AmqpConfig::from_url(&format!("{url}?queue={queue}"))
        .unwrap()
        .concurrency(concurrency);
    let amqp = AmqpSource::connect(config).await.unwrap();
    let source = Timed::new(amqp.clone());
    let times = source.times();
    let handler = |m: Message, _c: ClaimHandle| async move {
        std::hint::black_box(&m.body);
        Ok::<_, HandlerError>(Bytes::new())
    };
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(
        Runner::new(Guard::new(store), source, handler)
            .concurrency(concurrency)
            .completion_linger(completion_linger)
            .run(stop.clone()),
    );
    times.wait_for(n).await;
    let per_second = n as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.handled, n as u64, "{report:?}");
    amqp.close().await;
    Outcome {
        per_second,
        latencies: times.latencies(),
    }
}

#[tokio::main]
async fn main() {
    let url = std::env::var("IDEM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let redis =
        std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let n = env_or("IDEM_BENCH_MESSAGES", 20_000);
    let concurrency = env_or("IDEM_BENCH_CONCURRENCY", 64);
    let run_id = format!("{:08x}", fastrand::u32(..));
    println!("{n} pre-published messages, prefetch and concurrency {concurrency}");
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "consumer", "msgs/s", "p50", "p99", "p50 added", "p99 added"
    );
    let mut baseline: Option<(Duration, Duration)> = None;
    // The runner's default: a fetched batch's completions in one call.
    let linger = Duration::from_millis(1);
    for case in [
        "bare lapin",
        "runner + MemoryStore",
        "runner + FileStore",
        "runner + RedisStore",
        "runner + RedisStore (completions alone)",
    ] {
        let queue = format!(
            "idem-bench-{run_id}-{}",
            case.replace(|c: char| !c.is_ascii_alphanumeric(), "")
        );
        prepublish(&url, &queue, n).await;
        let outcome = match case {
            "bare lapin" => bare(&url, &queue, n, concurrency).await,
            "runner + MemoryStore" => {
                runner(&url, &queue, n, concurrency, MemoryStore::new(), linger).await
            }
            "runner + FileStore" => {
                let dir = tempfile::tempdir().unwrap();
                let store = idem_file::FileStore::open(dir.path().join("idem")).unwrap();
                runner(&url, &queue, n, concurrency, store, linger).await
            }
            _ => match idem_redis::RedisStore::connect(&redis).await {
                Ok(store) => {
                    let linger = if case.ends_with("(completions alone)") {
                        Duration::ZERO
                    } else {
                        linger
                    };
                    runner(&url, &queue, n, concurrency, store, linger).await
                }
                Err(e) => {
                    println!("{case:<24} skipped: Redis at {redis}: {e}");
                    delete_queues(&url, &queue).await;
                    continue;
                }
            },
        };
        delete_queues(&url, &queue).await;
        let (p50, p99) = (outcome.percentile(0.50), outcome.percentile(0.99));
        let (b50, b99) = *baseline.get_or_insert((p50, p99));
        println!(
            "{case:<24} {:>10.0} {:>10.2?} {:>10.2?} {:>14.2?} {:>14.2?}",
            outcome.per_second,
            p50,
            p99,
            p50.saturating_sub(b50),
            p99.saturating_sub(b99),
        );
    }
}
