//! Messages per second through a Redis stream, and the latency each adds
//! from the moment a read answers to the moment its ack is done: a bare
//! `XREADGROUP`/`XACK` consumer, then the runner on the memory, file and
//! Redis stores. Every run reads the same number of pre-published entries
//! from a fresh stream, at the same concurrency, with a handler that does
//! nothing.
//!
//! `cargo bench -p idem-redis-streams --bench throughput`
//! (`IDEM_TEST_REDIS_URL` picks the Redis; `IDEM_BENCH_MESSAGES` the count.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_consumer::{HandlerError, Latencies, Message, Runner, Timed};
use idem_core::{Bytes, ClaimHandle, Guard, Store};
use idem_redis_streams::{RedisStreamConfig, RedisStreamSource};
use tokio_util::sync::CancellationToken;

const CONCURRENCY: usize = 64;

/// One row of the table.
struct Row {
    name: &'static str,
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

fn row(name: &'static str, n: usize, elapsed: Duration, lat: Latencies) -> Row {
    let at = |q: f64| lat.quantile(q);
    Row {
        name,
        per_second: n as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// A fresh stream holding `n` entries, published in pipelined batches.
async fn fresh_stream(
    server: &str,
    label: &str,
    n: usize,
) -> (String, redis::aio::MultiplexedConnection) {
    let stream = format!("idem-bench.{label}.{:08x}", fastrand::u32(..));
    let client = redis::Client::open(server).expect("the bench Redis URL parses");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("the bench Redis answers");
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("message-id")
                .arg(format!("m-{i:08}"))
                .arg("body")
                .arg("{\"amount\":1}")
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    (stream, conn)
}

async fn drop_keys(conn: &mut redis::aio::MultiplexedConnection, stream: &str) {
    let _: Result<(), _> = redis::cmd("DEL")
        .arg(stream)
        .arg(format!("{stream}.retry"))
        .arg(format!("{stream}.dead-letter"))
        .query_async(conn)
        .await;
}

/// A consumer without idem: read a batch, ack it in one `XACK`.
async fn bare(server: &str, n: usize) -> Row {
    let (stream, mut conn) = fresh_stream(server, "bare", n).await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("g")
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(CONCURRENCY)
            .arg("BLOCK")
            .arg(100)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut conn)
            .await
            .unwrap();
        let read_at = Instant::now();
        let ids: Vec<String> = reply
            .keys
            .into_iter()
            .flat_map(|k| k.ids.into_iter().map(|e| e.id))
            .collect();
        if ids.is_empty() {
            continue;
        }
        let _: i64 = redis::cmd("XACK")
            .arg(&stream)
            .arg("g")
            .arg(&ids)
            .query_async(&mut conn)
            .await
            .unwrap();
        let took = read_at.elapsed();
        lat.extend(std::iter::repeat_n(took, ids.len()));
        done += ids.len();
    }
    let elapsed = started.elapsed();
    drop_keys(&mut conn, &stream).await;
    row(
        "bare XREADGROUP/XACK",
        n,
        elapsed,
        lat.into_iter().collect(),
    )
}

/// The runner on `guard`'s store over a fresh stream of `n` entries.
async fn through_runner<S: Store + Clone>(
    server: &str,
    name: &'static str,
    guard: Guard<S>,
    n: usize,
) -> Row {
    let (stream, mut conn) = fresh_stream(server, "runner", n).await;
    let url = format!("{server}?stream={stream}&group=idem");
    let config = RedisStreamConfig::from_url(&url)
        .unwrap()
        .concurrency(CONCURRENCY);
    let source = Timed::new(RedisStreamSource::connect(config).await.unwrap());
    let times = source.times();
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let handled = handled.clone();
        move |_: Message, _: ClaimHandle| {
            handled.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, HandlerError>(Bytes::new()) }
        }
    };
    let stop = CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(
        Runner::new(guard, source, handler)
            .concurrency(CONCURRENCY)
            .run(stop.clone()),
    );
    times.wait_for(n).await;
    let elapsed = started.elapsed();
    stop.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.handled as usize, n, "{report:?}");
    drop_keys(&mut conn, &stream).await;
    row(name, n, elapsed, times.latencies())
}

fn main() {
    let server = idem_testkit::services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let n: usize = std::env::var("IDEM_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rows = rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let file = idem_file::FileStore::open(dir.path()).expect("opens a file store");
        let redis_store = idem_redis::RedisStore::connect(&server)
            .await
            .expect("connects the Redis store");
        vec![
            bare(&server, n).await,
            through_runner(
                &server,
                "runner + MemoryStore",
                Guard::new(idem_core::MemoryStore::new()),
                n,
            )
            .await,
            through_runner(&server, "runner + FileStore", Guard::new(file), n).await,
            through_runner(&server, "runner + RedisStore", Guard::new(redis_store), n).await,
        ]
    });
    println!(
        "{n} entries, concurrency {CONCURRENCY}, no-op handler; latency = read answered -> ack done\n"
    );
    println!("| consumer | msg/s | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.0} | {:.2} ms | {:.2} ms |",
            r.name,
            r.per_second,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3
        );
    }
}
