//! Messages per second consumed from RocketMQ: the bare client's push
//! consumer answering `ConsumeSuccess` after a no-op, then the runner with
//! `RocketMqSource` and the memory and Redis stores; the same concurrency
//! and the same number of pre-published messages (a fresh topic and group
//! each). The rate is over the time from the first message's arrival to
//! the last ack (the consumer's start and rebalance left out). Latency is
//! per message, from the runner taking it to its ack (the runner rows
//! only: the bare listener has no separate ack).
//!
//! `cargo bench -p idem-rocketmq --bench throughput`
//! (`IDEM_BENCH_MESSAGES`, `IDEM_BENCH_CONCURRENCY` to change the sizes;
//! the servers from `IDEM_TEST_ROCKETMQ_URL` and `IDEM_TEST_REDIS_URL`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idem_consumer::{HandlerError, Latencies, Runner, Timed};
use idem_core::{Bytes, ClaimHandle, Guard, Store};
use idem_rocketmq::{RocketMqConfig, RocketMqPublisher, RocketMqSource};
use rocketmq_client_rust::{
    ClientConfig, ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyStatus,
    DefaultMQPushConsumer, MQPushConsumer,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

fn env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    name: &'static str,
    rate: f64,
    latency: Option<(Duration, Duration)>,
}

fn row(name: &'static str, n: usize, elapsed: Duration, l: Latencies) -> Row {
    let at = |q: f64| l.quantile(q);
    Row {
        name,
        rate: n as f64 / elapsed.as_secs_f64(),
        latency: (l.count() > 0).then(|| (at(0.50), at(0.99))),
    }
}

/// A fresh topic with `n` messages (keys `m-0` ...), and a fresh group.
async fn prepare(publisher: &RocketMqPublisher, tag: &str, n: usize) -> (String, String) {
    let topic = format!("idembench_{tag}_{}_{}", std::process::id(), now());
    let group = format!("{topic}_group");
    let body = Bytes::from_static(br#"{"order":"o","amount":12}"#);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (publisher, topic, body, next) =
            (publisher.clone(), topic.clone(), body.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                publisher
                    .publish(&topic, &format!("m-{i}"), &[], body.clone())
                    .await
                    .expect("published");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (topic, group)
}

fn now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

async fn bare(publisher: &RocketMqPublisher, namesrv: &str, n: usize, concurrency: usize) -> Row {
    let (topic, group) = prepare(publisher, "bare", n).await;
    // The client's runtime sized as the source sizes it: its default
    // blocking lane runs 4 listener calls at once on 2 cores.
    let threads = concurrency + 16;
    let mut config = RuntimeConfig::for_parallelism("bench", 2)
        .with_max_blocking_threads(threads)
        .unwrap();
    config.blocking_lane_policies.metadata_io.max_concurrency = threads;
    config.blocking_lane_policies.metadata_io.max_queue_depth = threads * 4;
    let owner = RuntimeOwner::plan(config).unwrap().build().unwrap();
    let runtime = ClientRuntime::try_new(
        owner.root_context().component("client"),
        ClientRuntimeConfig::default(),
        rocketmq_observability::TelemetryHandle::noop(),
    )
    .unwrap();
    let elapsed = run_bare(runtime, namesrv, &topic, &group, n, concurrency).await;
    owner.shutdown_background();
    row(
        "bare client push consumer",
        n,
        elapsed,
        Latencies::default(),
    )
}

/// Consumes `n` messages with a listener that answers at once; the time
/// from the consumer's start to the last answer.
async fn run_bare(
    runtime: Arc<ClientRuntime>,
    namesrv: &str,
    topic: &str,
    group: &str,
    n: usize,
    concurrency: usize,
) -> Duration {
    let consumed = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(Notify::new());
    let mut config = ClientConfig::new();
    config.set_instance_name(format!("bench-{}", now()).into());
    let mut consumer = DefaultMQPushConsumer::builder(runtime)
        .client_config(config)
        .name_server_addr(namesrv.to_owned())
        .consumer_group(group.to_owned())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .consume_thread_min(concurrency as u32)
        .consume_thread_max(concurrency as u32)
        .build();
    consumer.subscribe(topic.to_owned(), "*").await.unwrap();
    let first = Arc::new(OnceLock::new());
    let (c, a, f) = (consumed.clone(), all.clone(), first.clone());
    consumer.register_message_listener_concurrently(
        move |msgs: &[&MessageExt], _: &rocketmq_client_rust::ConsumeConcurrentlyContext| {
            f.get_or_init(Instant::now);
            // The no-op handler.
            std::hint::black_box(msgs);
            if c.fetch_add(msgs.len(), Ordering::AcqRel) + msgs.len() >= n {
                a.notify_one();
            }
            Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
        },
    );
    consumer.start().await.unwrap();
    all.notified().await;
    let elapsed = first.get().unwrap().elapsed();
    consumer.shutdown().await;
    elapsed
}

async fn through_runner<S: Store + Clone>(
    name: &'static str,
    tag: &str,
    store: S,
    publisher: &RocketMqPublisher,
    url: &str,
    n: usize,
    concurrency: usize,
) -> Row {
    let (topic, group) = prepare(publisher, tag, n).await;
    let inner = RocketMqSource::connect(
        RocketMqConfig::from_url(&format!("{url}?topic={topic}&group={group}"))
            .unwrap()
            .concurrency(concurrency),
    )
    .await
    .unwrap();
    let source = Timed::new(inner.clone());
    let times = source.times();
    let first = Arc::new(OnceLock::new());
    let f = first.clone();
    let handler = move |m: idem_consumer::Message, _claim: ClaimHandle| {
        f.get_or_init(Instant::now);
        async move {
            std::hint::black_box(&m.body);
            Ok::<_, HandlerError>(Bytes::new())
        }
    };
    let guard = Guard::new(store).retention(Duration::from_secs(600));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(guard, source, handler)
            .concurrency(concurrency)
            .run(shutdown.clone()),
    );
    times.wait_for(n).await;
    let elapsed = first.get().unwrap().elapsed();
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    inner.shutdown().await;
    assert_eq!(report.handled as usize, n, "{report:?}");
    row(name, n, elapsed, times.latencies())
}

fn main() {
    let n = env("IDEM_BENCH_MESSAGES", 20_000);
    let concurrency = env("IDEM_BENCH_CONCURRENCY", 64);
    let url = idem_testkit::services::url("IDEM_TEST_ROCKETMQ_URL", "rocketmq://127.0.0.1:9876");
    let redis = idem_testkit::services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let namesrv = url
        .trim_start_matches("rocketmq://")
        .split(['?', '/'])
        .next()
        .unwrap()
        .replace(',', ";");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let publisher = RocketMqPublisher::connect(&url)
            .await
            .expect("the RocketMQ name server is reachable");
        let mut rows = vec![bare(&publisher, &namesrv, n, concurrency).await];
        rows.push(
            through_runner(
                "runner + MemoryStore",
                "memory",
                idem_core::MemoryStore::new(),
                &publisher,
                &url,
                n,
                concurrency,
            )
            .await,
        );
        match idem_redis::RedisStore::connect(&redis).await {
            Ok(store) => rows.push(
                through_runner(
                    "runner + RedisStore",
                    "redis",
                    store,
                    &publisher,
                    &url,
                    n,
                    concurrency,
                )
                .await,
            ),
            Err(e) => eprintln!("skipping the Redis store: {e}"),
        }
        publisher.shutdown().await;
        println!("\n{n} messages, concurrency {concurrency}, rocketmq-rust 1.0.0 at {url}\n");
        println!("| consumer | msgs/s | ratio to bare | p50 | p99 |\n|---|---:|---:|---:|---:|");
        let bare = rows[0].rate;
        for r in &rows {
            let (p50, p99) = r.latency.map_or(("–".into(), "–".into()), |(a, b)| {
                (
                    format!("{:.2} ms", a.as_secs_f64() * 1e3),
                    format!("{:.2} ms", b.as_secs_f64() * 1e3),
                )
            });
            println!(
                "| {} | {:.0} | {:.2} | {p50} | {p99} |",
                r.name,
                r.rate,
                r.rate / bare
            );
        }
    });
}
