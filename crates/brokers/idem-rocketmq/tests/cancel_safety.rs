//! A fetch dropped mid-way (the runner drops it at shutdown) loses
//! nothing: the messages the listener hands over meanwhile wait for the
//! next fetch, without being sent back to the broker.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use idem_consumer::Source;
use support::Fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_dropped_while_waiting_loses_no_message() {
    let Some(f) = Fixture::new("fetchdrop").await else {
        return;
    };
    let source = f.source(f.config()).await;
    // Dropped while waiting on the empty topic.
    let dropped = tokio::time::timeout(Duration::from_millis(200), source.fetch(8)).await;
    assert!(dropped.is_err(), "nothing to fetch yet");
    // A first message fetched whole: the consumer has its queues and pulls.
    f.publish("warm-up", &[], "{}").await;
    let warm_up = fetch_one(&source).await;
    source.ack(warm_up).await.expect("the ack is taken");

    let sent: BTreeSet<String> = (1..=5).map(|n| format!("order-{n}")).collect();
    // Fetches keep being dropped, some mid-way, while the messages arrive
    // (within milliseconds of their publish) and for a while after.
    let dropping = {
        let source = source.clone();
        tokio::spawn(async move {
            let mut fetched = Vec::new();
            let until = tokio::time::Instant::now() + Duration::from_secs(2);
            while tokio::time::Instant::now() < until {
                if let Ok(batch) =
                    tokio::time::timeout(Duration::from_millis(1), source.fetch(8)).await
                {
                    fetched.extend(batch.expect("fetch answers"));
                }
            }
            fetched
        })
    };
    for key in &sent {
        f.publish(key, &[], "{}").await;
    }
    let fetched = dropping.await.unwrap();

    let mut received = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut batch = fetched;
    loop {
        for d in batch {
            // A message a dropped fetch had taken would come back from the
            // retry topic, its reconsume count raised.
            assert_eq!(d.message.attempt, 1, "{:?} was not sent back", d.message.id);
            received.push(d.message.id.clone().unwrap_or_default());
            source.ack(d).await.expect("the ack is taken");
        }
        if received.len() >= sent.len() || tokio::time::Instant::now() > deadline {
            break;
        }
        batch = source.fetch(8).await.expect("fetch answers");
    }
    let got: BTreeSet<String> = received.iter().cloned().collect();
    assert_eq!(got, sent, "every message arrives");
    assert_eq!(received.len(), sent.len(), "each once: {received:?}");
    f.wait_drained().await;
    source.shutdown().await;
}

async fn fetch_one(
    source: &idem_rocketmq::RocketMqSource,
) -> idem_consumer::Delivery<idem_rocketmq::Receipt> {
    for _ in 0..30 {
        if let Some(d) = source.fetch(1).await.expect("fetch answers").pop() {
            return d;
        }
    }
    panic!("no message within 30 s");
}
