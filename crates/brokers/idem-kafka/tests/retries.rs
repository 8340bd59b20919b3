//! Retries through the retry topics without blocking the partition, dead
//! letters to `<topic>-dlt` with idem's headers, and blocking retries that
//! keep the partition's order.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{Backoff, HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use parking_lot::Mutex;
use support::{Fixture, Running, wait_until};

fn quick() -> Backoff {
    Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(200),
        jitter: 0.0,
    }
}

/// Calls per message id, with each call's attempt, in order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<(String, u32)>>>);

impl Calls {
    fn of(&self, id: &str) -> Vec<u32> {
        self.0
            .lock()
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, a)| *a)
            .collect()
    }
    fn order(&self) -> Vec<String> {
        self.0.lock().iter().map(|(i, _)| i.clone()).collect()
    }
}

/// `fail2-*` fail twice, `always-*` always, `bad-*` permanently.
fn flaky(
    calls: Calls,
) -> impl Fn(Message, ClaimHandle) -> std::future::Ready<Result<Bytes, HandlerError>> + Send + Sync + Clone
{
    move |m: Message, _c: ClaimHandle| {
        let id = m.id.clone().unwrap();
        calls.0.lock().push((id.clone(), m.attempt));
        let r = if id.starts_with("fail2") && m.attempt <= 2 || id.starts_with("always") {
            Err(HandlerError::transient("not now"))
        } else if id.starts_with("bad") {
            Err(HandlerError::permanent("refused"))
        } else {
            Ok(Bytes::new())
        };
        std::future::ready(r)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_go_through_retry_topics_and_dead_letters_to_the_dlt() {
    let Some(f) = Fixture::new("retries", 1).await else {
        return;
    };
    for id in ["fail2-a", "ok-b", "always-c", "bad-d", "ok-e"] {
        f.publish(id, Some(0), "{}").await;
    }
    let calls = Calls::default();
    let source = f.source("&retry-delays-ms=200,400").await;
    let running = Running::start(
        Runner::new(
            Guard::new(MemoryStore::new()),
            source.clone(),
            flaky(calls.clone()),
        )
        .backoff(quick())
        .max_attempts(3),
    );
    wait_until("fail2-a's third attempt", Duration::from_secs(30), || {
        calls.of("fail2-a").len() == 3
    })
    .await;
    let dead = f.read(&format!("{}-dlt", f.topic), 2).await;
    let report = running.stop().await;
    source.close().await;

    assert_eq!(
        calls.of("fail2-a"),
        [1, 2, 3],
        "attempts count up through the retry topics"
    );
    assert_eq!(
        calls.of("always-c"),
        [1, 2, 3],
        "three attempts, then the dead letter"
    );
    assert_eq!(calls.of("bad-d"), [1], "a permanent failure is not retried");
    let order = calls.order();
    let pos = |id: &str| order.iter().position(|i| i == id).unwrap();
    assert!(
        pos("ok-e") < order.iter().rposition(|i| i == "fail2-a").unwrap(),
        "the retried message did not hold the partition: {order:?}"
    );
    let retried = f.read(&format!("{}-retry-0", f.topic), 2).await;
    assert!(
        !retried.is_empty(),
        "the first retries went to the first retry topic"
    );
    assert_eq!(
        retried[0].headers.get("idem-attempts").map(String::as_str),
        Some("1")
    );
    assert!(retried[0].headers.contains_key("idem-due"));
    assert_eq!(
        retried[0].key.as_deref(),
        Some(retried[0].headers["message-id"].as_bytes()),
        "the copy keeps the record key"
    );

    let by_key: HashMap<&str, &support::Record> = dead
        .iter()
        .map(|r| (r.headers["idem-key"].as_str(), r))
        .collect();
    assert_eq!(dead.len(), 2, "{dead:?}");
    let always = by_key["always-c"];
    assert_eq!(always.headers["idem-attempts"], "3");
    assert!(always.headers["idem-last-error"].contains("not now"));
    assert_eq!(always.headers["idem-origin"], format!("{}/0/2", f.topic));
    assert_eq!(always.headers["message-id"], "always-c");
    assert_eq!(always.body, b"{}");
    let bad = by_key["bad-d"];
    assert_eq!(bad.headers["idem-attempts"], "1");
    assert!(bad.headers["idem-last-error"].contains("refused"));
    assert_eq!(report.dead_lettered, 2, "{report:?}");
    // Everything finished: the commits reach the end of every topic.
    assert_eq!(f.committed().await.get(&0), Some(&5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_retries_keep_the_partition_in_order() {
    let Some(f) = Fixture::new("blocking", 1).await else {
        return;
    };
    for id in ["ok-1", "fail2-2", "ok-3", "ok-4"] {
        f.publish(id, Some(0), "{}").await;
    }
    let calls = Calls::default();
    let source = f.source("&retry=blocking").await;
    let running = Running::start(
        Runner::new(
            Guard::new(MemoryStore::new()),
            source.clone(),
            flaky(calls.clone()),
        )
        .backoff(quick())
        .ordered(true)
        .retry_in_place(true),
    );
    wait_until("all four", Duration::from_secs(30), || {
        calls.of("ok-4").len() == 1
    })
    .await;
    f.wait_committed(&[(0, 4)].into()).await;
    running.stop().await;
    source.close().await;
    assert_eq!(
        calls.order(),
        ["ok-1", "fail2-2", "fail2-2", "fail2-2", "ok-3", "ok-4"]
    );
    assert_eq!(calls.of("fail2-2"), [1, 2, 3]);
    let retry_topics = f.read(&format!("{}-retry-0", f.topic), 1).await;
    assert!(
        retry_topics.is_empty(),
        "blocking mode writes no retry copies"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_carries_idem_headers_on_one_capped_line() {
    let Some(f) = Fixture::new("dead-letter-headers", 1).await else {
        return;
    };
    // A record that claims an origin over several lines, and a handler
    // whose error body spans lines and runs long.
    f.publisher
        .publish(
            &f.topic,
            Some(0),
            Some(b"k"),
            "multi",
            &[("idem-origin", b"elsewhere\r\nx-forged: 1")],
            b"{}",
        )
        .await
        .unwrap();
    let error = format!(
        "{{\n  \"title\": \"refused\",\n  \"detail\": \"{}\"\n}}",
        "y".repeat(5000)
    );
    let handler = move |_m: Message, _c: ClaimHandle| {
        std::future::ready(Err::<Bytes, _>(HandlerError::permanent(error.clone())))
    };
    let source = f.source("").await;
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        handler,
    ));
    let dead = f.read(&format!("{}-dlt", f.topic), 1).await;
    running.stop().await;
    source.close().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let headers = &dead[0].headers;
    let last_error = &headers["idem-last-error"];
    assert!(
        last_error.starts_with("{\\n  \"title\": \"refused\""),
        "{last_error}"
    );
    assert!(!last_error.contains(['\n', '\r']), "{last_error}");
    assert!(last_error.len() <= 1024, "{} bytes", last_error.len());
    assert_eq!(headers["idem-origin"], "elsewhere\\r\\nx-forged: 1");
    assert!(!headers.contains_key("x-forged"));
}
