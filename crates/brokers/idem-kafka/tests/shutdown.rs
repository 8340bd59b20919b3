//! Shutdown does not wait for messages handed back: their offsets stay
//! uncommitted, so they come again after a restart, but closing goes ahead
//! without them.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem_consumer::{HandlerError, Message, Runner, Source};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use support::{Fixture, Running, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_back_message_does_not_hold_shutdown_and_comes_again() {
    let Some(f) = Fixture::new("shutdown", 2).await else {
        return;
    };
    // One key on two partitions: while the first is handled (3 s), the
    // second waits in place for the key, and is handed back at shutdown.
    f.publish("same", Some(0), "{}").await;
    f.publish("same", Some(1), "{}").await;
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        move |_m: Message, _c: ClaimHandle| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let source = f.source("&retry=blocking").await;
    let running = Running::start(
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).retry_in_place(true),
    );
    wait_until("the first handler", Duration::from_secs(30), || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let report = running.stop().await;
    source.close().await;
    let took = started.elapsed();
    assert_eq!(report.requeued, 1, "{report:?}");
    assert!(
        took < Duration::from_secs(10),
        "shutdown took {took:?}, waiting for a message handed back"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let committed = f.committed().await;
    assert_eq!(committed.len(), 1, "one partition finished: {committed:?}");
    let handed_back = 1 - committed.keys().next().unwrap();

    // After a restart, the message handed back comes again.
    let source = f.source("&retry=blocking").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = Vec::new();
    while again.is_empty() && Instant::now() < deadline {
        again = source.fetch(10).await.unwrap();
    }
    let got: Vec<(i32, i64)> = again
        .iter()
        .map(|d| (d.receipt.partition(), d.receipt.offset()))
        .collect();
    assert_eq!(got, [(handed_back, 0)]);
    for d in again {
        source.requeue(d).await.unwrap();
    }
    source.close().await;
}
