//! The source's buffer is bounded: a runner that stops fetching does not
//! make the source hold every message published meanwhile.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use support::{Fixture, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_buffer_stays_bounded_when_nothing_fetches() {
    let Some(f) = Fixture::new("buffer", 4).await else {
        return;
    };
    // Concurrency 16: slow polling from 256 buffered, paused from 320.
    let (high_water, bound) = (256, 320);
    let source = f.source("").await;
    let fixture = &f;
    for chunk in (0..10_000).collect::<Vec<i32>>().chunks(1000) {
        join_all(chunk.iter().map(|i| {
            let id = format!("m-{i}");
            async move { fixture.publish(&id, Some(i % 4), "{}").await }
        }))
        .await;
    }
    wait_until("the buffer to fill", Duration::from_secs(30), || {
        source.buffered() >= high_water
    })
    .await;
    // Polling one message per 100 ms past the high-water mark reaches the
    // bound in 6.4 s; watch well past that.
    let mut most = 0;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(12) {
        most = most.max(source.buffered());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        most <= bound,
        "{most} messages buffered; the bound is {bound}"
    );
    source.close().await;
}
