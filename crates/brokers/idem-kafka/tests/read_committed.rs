//! `isolation.level=read_committed`: records of an aborted transaction are
//! never handled; those of a committed one are.

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use idem_core::{Guard, MemoryStore};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use support::{Effects, Fixture, Running, wait_until};

fn send(producer: &BaseProducer, topic: &str, id: &str) {
    let headers = OwnedHeaders::new().insert(Header {
        key: "message-id",
        value: Some(id),
    });
    producer
        .send(
            BaseRecord::to(topic)
                .key(id)
                .payload("{}")
                .partition(0)
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a broker with transactions (EndTxn): run with IDEM_TEST_KAFKA_URL at Apache Kafka and --ignored"]
async fn aborted_transactional_writes_are_never_handled() {
    let Some(f) = Fixture::new("txn", 1).await else {
        return;
    };
    let (brokers, topic) = (f.brokers.clone(), f.topic.clone());
    tokio::task::spawn_blocking(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("transactional.id", format!("{topic}-tx"))
            .create()
            .unwrap();
        let t = Duration::from_secs(10);
        producer
            .init_transactions(t)
            .expect("the broker supports transactions");
        producer.begin_transaction().unwrap();
        for i in 0..5 {
            send(&producer, &topic, &format!("aborted-{i}"));
        }
        producer.flush(t).unwrap();
        producer.abort_transaction(t).unwrap();
        producer.begin_transaction().unwrap();
        for i in 0..5 {
            send(&producer, &topic, &format!("committed-{i}"));
        }
        producer.commit_transaction(t).unwrap();
    })
    .await
    .unwrap();
    f.publish("after", Some(0), "{}").await;

    let source = f.source("").await;
    let effects = Effects::default();
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        effects.handler(),
    ));
    wait_until("the last record", Duration::from_secs(30), || {
        effects.0.lock().contains_key("after")
    })
    .await;
    running.stop().await;
    source.close().await;
    let mut handled: Vec<String> = effects.0.lock().keys().cloned().collect();
    handled.sort();
    assert_eq!(
        handled,
        [
            "after",
            "committed-0",
            "committed-1",
            "committed-2",
            "committed-3",
            "committed-4"
        ]
    );
}
