//! The runner's own cost per message, without a broker: the in-memory
//! source drained by a bare loop (fetch, no-op, ack) against the runner with
//! the memory store (claim, handler, completion, ack).
//!
//! `cargo bench -p idem-consumer --bench overhead`

use std::time::{Duration, Instant};

use idem_consumer::{HandlerError, MemorySource, Message, Runner, Source};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use tokio_util::sync::CancellationToken;

const MESSAGES: usize = 100_000;
const CONCURRENCY: usize = 64;

fn filled(name: &str) -> MemorySource {
    let source = MemorySource::new(name);
    for i in 0..MESSAGES {
        let mut m = Message::new(Bytes::from_static(b"{}"));
        m.id = Some(format!("m-{i}"));
        source.push(m);
    }
    source
}

async fn bare() -> Duration {
    let source = filled("bare");
    let started = Instant::now();
    let mut done = 0;
    while done < MESSAGES {
        for delivery in source.fetch(CONCURRENCY).await.unwrap() {
            source.ack(delivery).await.unwrap();
            done += 1;
        }
    }
    started.elapsed()
}

async fn runner() -> Duration {
    let source = filled("runner");
    let handler = |_m: Message, _c: ClaimHandle| async { Ok::<_, HandlerError>(Bytes::new()) };
    let stop = CancellationToken::new();
    let probe = source.clone();
    let watcher = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while probe.acked_count() < MESSAGES {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            stop.cancel();
        })
    };
    let started = Instant::now();
    Runner::new(Guard::new(MemoryStore::new()), source, handler)
        .concurrency(CONCURRENCY)
        .run(stop)
        .await
        .unwrap();
    let elapsed = started.elapsed();
    watcher.await.unwrap();
    elapsed
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("{MESSAGES} messages, concurrency {CONCURRENCY}, 2 worker threads");
    println!("{:<28} {:>12} {:>14}", "", "messages/s", "µs/message");
    for round in 0..3 {
        for (name, took) in [
            ("bare loop (fetch, ack)", rt.block_on(bare())),
            ("runner + memory store", rt.block_on(runner())),
        ] {
            let rate = MESSAGES as f64 / took.as_secs_f64();
            println!(
                "{:<28} {:>12.0} {:>14.2}{}",
                name,
                rate,
                took.as_secs_f64() * 1e6 / MESSAGES as f64,
                if round == 0 { "  (warm-up)" } else { "" }
            );
        }
    }
}
