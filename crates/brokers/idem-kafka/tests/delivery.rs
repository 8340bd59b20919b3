//! Every message handled once, duplicates acked, and the offsets committed
//! to the end of each partition only once the effects are recorded.

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use idem_core::{Guard, MemoryStore};
use support::{Effects, Fixture, Running, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_is_handled_once_and_its_offset_committed_after() {
    let Some(f) = Fixture::new("delivery", 3).await else {
        return;
    };
    // 300 messages and 30 second copies of them, spread over 3 partitions.
    for i in 0..300 {
        f.publish(&format!("m-{i}"), None, "{}").await;
    }
    for i in (0..300).step_by(10) {
        f.publish(&format!("m-{i}"), None, "{}").await;
    }
    let source = f.source("").await;
    let effects = Effects::default();
    let running = Running::start(
        Runner::new(
            Guard::new(MemoryStore::new()),
            source.clone(),
            effects.handler(),
        )
        .concurrency(16),
    );
    wait_until("300 effects", Duration::from_secs(60), || {
        effects.count() == 300
    })
    .await;
    let ends = f.ends().await;
    assert_eq!(ends.values().sum::<i64>(), 330);
    // Commits go out every 100 ms; wait until they cover every partition.
    f.wait_committed(&ends).await;
    let report = running.stop().await;
    source.close().await;
    assert_eq!(
        effects.total(),
        300,
        "no effect twice: {:?}",
        effects.doubled()
    );
    assert_eq!(report.handled + report.duplicates, 330, "{report:?}");
    assert_eq!(report.duplicates, 30, "{report:?}");
    let lanes: std::collections::HashSet<i32> = f
        .read(&f.topic, 330)
        .await
        .iter()
        .map(|r| r.partition)
        .collect();
    assert_eq!(
        lanes.len(),
        3,
        "the messages were spread over the partitions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sets_the_key_and_the_message_id_header() {
    let Some(f) = Fixture::new("publish", 1).await else {
        return;
    };
    let published = f
        .publisher
        .publish(
            &f.topic,
            None,
            Some(b"customer-7"),
            "order-1",
            &[("trace", b"abc")],
            b"{\"n\":1}",
        )
        .await
        .unwrap();
    assert_eq!(published.partition, 0);
    let records = f.read(&f.topic, 1).await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.offset, published.offset);
    assert_eq!(r.key.as_deref(), Some(&b"customer-7"[..]));
    assert_eq!(
        r.headers.get("message-id").map(String::as_str),
        Some("order-1")
    );
    assert_eq!(r.headers.get("trace").map(String::as_str), Some("abc"));
    assert_eq!(r.body, b"{\"n\":1}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_an_id_is_known_by_its_origin() {
    let Some(f) = Fixture::new("origin", 1).await else {
        return;
    };
    f.publisher
        .publish(&f.topic, Some(0), None, "", &[], b"x")
        .await
        .unwrap();
    let source = f.source("").await;
    let mut got = Vec::new();
    for _ in 0..40 {
        got = idem_consumer::Source::fetch(&source, 10).await.unwrap();
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(got.len(), 1);
    let m = &got[0].message;
    assert_eq!(m.id.as_deref(), Some(format!("{}/0/0", f.topic).as_str()));
    assert_eq!(m.lane.as_deref(), Some(format!("{}/0", f.topic).as_bytes()));
    assert_eq!(m.attempt, 1);
    let delivery = got.pop().unwrap();
    idem_consumer::Source::ack(&source, delivery).await.unwrap();
    source.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_dropped_while_it_waits_loses_nothing() {
    let Some(f) = Fixture::new("dropped-fetch", 1).await else {
        return;
    };
    let source = f.source("").await;
    // Nothing published yet: the fetch waits, and is dropped mid-wait.
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        idem_consumer::Source::fetch(&source, 10),
    )
    .await;
    assert!(dropped.is_err(), "the fetch was still waiting when dropped");
    f.publish("after-drop", Some(0), "{}").await;
    let mut got = Vec::new();
    for _ in 0..40 {
        got = idem_consumer::Source::fetch(&source, 10).await.unwrap();
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(
        got.len(),
        1,
        "the message polled after the drop is handed out"
    );
    assert_eq!(got[0].message.id.as_deref(), Some("after-drop"));
    let delivery = got.pop().unwrap();
    idem_consumer::Source::ack(&source, delivery).await.unwrap();
    source.close().await;
    assert_eq!(
        f.committed().await.get(&0),
        Some(&1),
        "acked and committed at close"
    );
}
