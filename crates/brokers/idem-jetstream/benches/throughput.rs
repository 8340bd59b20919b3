//! Messages per second through a JetStream pull consumer: a bare async-nats
//! consumer that acks after a no-op handler, then the runner with the
//! memory, file and Redis stores; the same concurrency and the same number
//! of pre-published messages for each. Latency is per message, from the
//! consumer taking it to the server confirming its ack; "added" is over the
//! bare consumer's.
//!
//! `cargo bench -p idem-jetstream --bench throughput`
//! (`IDEM_BENCH_MESSAGES`, `IDEM_BENCH_CONCURRENCY` to change the sizes;
//! the servers from `IDEM_TEST_NATS_URL` and `IDEM_TEST_REDIS_URL`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use idem_consumer::{HandlerError, Latencies, Runner, Timed};
use idem_core::{Bytes, ClaimHandle, Guard, Store};
use idem_jetstream::{JetStreamConfig, JetStreamSource};
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

fn env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Per-message latencies and the time the last ack landed.
#[derive(Default)]
struct Clock {
    latencies: Mutex<Vec<Duration>>,
    acked: AtomicUsize,
    all_acked: Notify,
}

impl Clock {
    fn acked(&self, taken: Instant, total: usize) {
        self.latencies.lock().push(taken.elapsed());
        if self.acked.fetch_add(1, Ordering::AcqRel) + 1 == total {
            self.all_acked.notify_one();
        }
    }
}

struct Row {
    name: &'static str,
    rate: f64,
    p50: Duration,
    p99: Duration,
}

fn row(name: &'static str, n: usize, elapsed: Duration, l: Latencies) -> Row {
    let at = |q: f64| l.quantile(q);
    Row {
        name,
        rate: n as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// A fresh stream with `n` messages (ids `m-0` ...), its consume URL.
async fn prepare(js: &jetstream::Context, url: &str, tag: &str, n: usize) -> (String, String) {
    let stream = format!("IDEMBENCH_{tag}_{}", std::process::id());
    let subject = stream.to_lowercase();
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(format!("{stream}_dead-letter")).await;
    js.create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{subject}.>")],
        ..Default::default()
    })
    .await
    .expect("the stream is created");
    let body = Bytes::from_static(br#"{"order":"o","amount":12}"#);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for i in chunk {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("m-{i}").as_str());
            acks.push(
                js.publish_with_headers(format!("{subject}.paid"), headers, body.clone())
                    .await
                    .expect("published"),
            );
        }
        for ack in acks {
            ack.await.expect("stored");
        }
    }
    let consume = format!("{url}?stream={stream}&consumer=bench&subject={subject}.%3E");
    (stream, consume)
}

async fn bare(js: &jetstream::Context, url: &str, n: usize, concurrency: usize) -> Row {
    let (stream, consume) = prepare(js, url, "bare", n).await;
    // Declared the way the source declares it, then read without it.
    let source = JetStreamSource::connect(
        JetStreamConfig::from_url(&consume)
            .unwrap()
            .concurrency(concurrency),
    )
    .await
    .unwrap();
    drop(source);
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream(&stream)
        .await
        .unwrap()
        .get_consumer("bench")
        .await
        .unwrap();
    let clock = Arc::new(Clock::default());
    let permits = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(concurrency)
        .messages()
        .await
        .unwrap();
    let all = {
        let clock = clock.clone();
        async move { clock.all_acked.notified().await }
    };
    let pull = async {
        while let Some(m) = messages.next().await {
            let m = m.unwrap();
            let permit = permits.clone().acquire_owned().await.unwrap();
            let taken = Instant::now();
            let clock = clock.clone();
            tokio::spawn(async move {
                // The no-op handler.
                std::hint::black_box(&m.payload);
                m.double_ack().await.unwrap();
                clock.acked(taken, n);
                drop(permit);
            });
        }
    };
    tokio::select! {
        () = all => {}
        () = pull => panic!("the pull ended"),
    }
    let elapsed = started.elapsed();
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(format!("{stream}_dead-letter")).await;
    let latencies = clock.latencies.lock().iter().copied().collect();
    row("bare async-nats pull consumer", n, elapsed, latencies)
}

async fn through_runner<S: Store + Clone>(
    name: &'static str,
    tag: &str,
    store: S,
    js: &jetstream::Context,
    url: &str,
    n: usize,
    concurrency: usize,
) -> Row {
    let (stream, consume) = prepare(js, url, tag, n).await;
    let inner = JetStreamSource::connect(
        JetStreamConfig::from_url(&consume)
            .unwrap()
            .concurrency(concurrency),
    )
    .await
    .unwrap();
    let source = Timed::new(inner);
    let times = source.times();
    let handler = |m: idem_consumer::Message, _claim: ClaimHandle| async move {
        std::hint::black_box(&m.body);
        Ok::<_, HandlerError>(Bytes::new())
    };
    let guard = Guard::new(store).retention(Duration::from_secs(600));
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(
        Runner::new(guard, source, handler)
            .concurrency(concurrency)
            .run(shutdown.clone()),
    );
    times.wait_for(n).await;
    let elapsed = started.elapsed();
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.handled as usize, n, "{report:?}");
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(format!("{stream}_dead-letter")).await;
    row(name, n, elapsed, times.latencies())
}

fn main() {
    let n = env("IDEM_BENCH_MESSAGES", 20_000);
    let concurrency = env("IDEM_BENCH_CONCURRENCY", 64);
    let url = idem_testkit::services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
    let redis = idem_testkit::services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = async_nats::connect(url.as_str())
            .await
            .expect("the NATS server is reachable");
        let js = jetstream::new(client);
        let mut rows = vec![bare(&js, &url, n, concurrency).await];
        rows.push(
            through_runner(
                "runner + MemoryStore",
                "memory",
                idem_core::MemoryStore::new(),
                &js,
                &url,
                n,
                concurrency,
            )
            .await,
        );
        let dir = tempfile::tempdir().unwrap();
        let file = idem_file::FileStore::open(dir.path()).expect("the file store opens");
        rows.push(
            through_runner("runner + FileStore", "file", file, &js, &url, n, concurrency).await,
        );
        match idem_redis::RedisStore::connect(&redis).await {
            Ok(store) => rows.push(
                through_runner("runner + RedisStore", "redis", store, &js, &url, n, concurrency)
                    .await,
            ),
            Err(e) => eprintln!("skipping the Redis store: {e}"),
        }
        println!("\n{n} messages, concurrency {concurrency}, nats-server at {url}\n");
        println!(
            "| consumer | msgs/s | p50 | p99 | added p50 | added p99 |\n|---|---:|---:|---:|---:|---:|"
        );
        let (b50, b99) = (rows[0].p50, rows[0].p99);
        for r in &rows {
            println!(
                "| {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
                r.name,
                r.rate,
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.p50.saturating_sub(b50).as_secs_f64() * 1e3,
                r.p99.saturating_sub(b99).as_secs_f64() * 1e3,
            );
        }
    });
}
