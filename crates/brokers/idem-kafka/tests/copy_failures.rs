//! A retry copy or dead letter that cannot be written is kept by the
//! source and written again with a growing delay, holding its message's
//! offset: the handler is not run again for it, and the failure is counted.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use parking_lot::Mutex;
use support::recorder::recorder;
use support::{Fixture, Running, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_too_large_to_write_is_held_not_handled_again() {
    let Some(f) = Fixture::new("copy-too-large", 1).await else {
        return;
    };
    let metrics = recorder();
    // 990 bytes of body fit the test's publisher, but not the source's
    // producer (at most 1000 bytes a record) once idem's headers are on.
    f.publish("big", Some(0), &"x".repeat(990)).await;
    f.publish("small", Some(0), "{}").await;
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let calls = calls.clone();
        move |m: Message, _c: ClaimHandle| {
            let id = m.id.clone().unwrap();
            *calls.lock().entry(id.clone()).or_default() += 1;
            let r = if id == "big" {
                Err(HandlerError::permanent("refused"))
            } else {
                Ok(Bytes::new())
            };
            std::future::ready(r)
        }
    };
    let source = f.source("&message.max.bytes=1000").await;
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        handler,
    ));
    wait_until("both handled", Duration::from_secs(30), || {
        calls.lock().len() == 2
    })
    .await;
    let labels = format!("kind=permanent,topic={}-dlt", f.topic);
    wait_until("the failure counted", Duration::from_secs(10), || {
        metrics.counter("idem_kafka_copy_failures_total", &labels) >= 1
    })
    .await;
    // Written again after 1 s, 2 s, 4 s…: a few tries in 6 s, not a loop.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let failures = metrics.counter("idem_kafka_copy_failures_total", &labels);
    assert_eq!(calls.lock()["big"], 1, "the handler ran again for it");
    assert!(
        (2..=4).contains(&failures),
        "{failures} failed writes in about 6 s"
    );
    assert_eq!(
        f.committed().await.get(&0),
        None,
        "the offset stays before the message whose dead letter is not written"
    );
    let started = Instant::now();
    running.stop().await;
    source.close().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "closing waited {:?} for the copy held back",
        started.elapsed()
    );
}
