//! However often RabbitMQ carries a message, its effect happens once, and
//! every copy ends acked.

mod support;

use std::time::Duration;

use idem_amqp::{AmqpPublisher, AmqpSource};
use idem_consumer::Runner;
use idem_core::{Guard, MemoryStore};
use support::{
    Effects, Inspect, Running, applying, broker, config, drain, message, repeated, unique,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_id_takes_effect_once_and_every_copy_is_acked() {
    let Some(url) = broker().await else { return };
    let queue = unique("dups");
    let config = config(&url, &queue).concurrency(32);
    let publisher = AmqpPublisher::connect(&config).await.unwrap();
    const N: usize = 500;
    let mut published = 0;
    for i in 0..N {
        let m = message(&format!("order-{i}"));
        publisher.publish(&m).await.unwrap();
        published += 1;
        // Every tenth twice in a row: the copy arrives while the first is
        // being handled.
        if i % 10 == 0 {
            publisher.publish(&m).await.unwrap();
            published += 1;
        }
    }
    // And a few again at the end, after the first copies completed.
    for i in (5..N).step_by(50) {
        publisher
            .publish(&message(&format!("order-{i}")))
            .await
            .unwrap();
        published += 1;
    }
    publisher.close().await;

    let effects = Effects::default();
    let handler = applying(&effects, Duration::from_millis(3));
    let source = AmqpSource::connect(config).await.unwrap();
    let runner =
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).concurrency(32);
    let running = Running::start(runner);
    let inspect = Inspect::new(&url).await;
    let (drained, report) = drain(
        running,
        &source,
        &inspect,
        &queue,
        &effects,
        N,
        Duration::from_secs(40),
    )
    .await;

    assert!(drained, "all ids handled and the queue drained: {report:?}");
    assert_eq!(effects.lock().len(), N);
    assert_eq!(repeated(&effects), [], "effects applied more than once");
    assert_eq!(report.handled, N as u64, "{report:?}");
    assert_eq!(
        report.handled + report.duplicates,
        published as u64,
        "every copy acked: {report:?}"
    );
    assert_eq!(report.source_errors, 0, "{report:?}");
    // After the close, anything left unacked would be back in the queue.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(inspect.ready(&queue).await, 0, "nothing left unacked");
    inspect.delete(&queue).await;
    inspect.close().await;
}
