//! What a copy (a retry, a dead letter) carries: it goes only where idem
//! sends it, whatever routing the original asked for, and idem's headers
//! are single-line text.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_amqp::AmqpSource;
use idem_consumer::{HandlerError, Runner};
use idem_core::{Guard, MemoryStore};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use support::{Calls, Inspect, Running, broker, config, eventually, recording, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_not_routed_by_the_originals_cc_header_and_keeps_it_as_idem_original() {
    let Some(url) = broker().await else { return };
    let queue = unique("cc");
    let elsewhere = unique("cc-elsewhere");
    let config = config(&url, &queue);
    let source = AmqpSource::connect(config.clone()).await.unwrap();
    let inspect = Inspect::new(&url).await;
    inspect.declare(&elsewhere).await;
    let routes =
        AMQPValue::FieldArray(vec![AMQPValue::LongString(elsewhere.as_str().into())].into());
    let mut headers = FieldTable::default();
    headers.insert("CC".into(), routes.clone());
    let props = BasicProperties::default()
        .with_message_id("cc-1".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    inspect.publish_raw(&queue, b"{}", props).await;
    // The original itself went to both queues: the producer asked for it.
    assert!(
        inspect.get(&elsewhere).await.is_some(),
        "CC routes the original"
    );

    let calls: Calls = Arc::default();
    let handler = recording(&calls, |_, _| {
        Err(HandlerError::permanent(
            "ledger refused the entry:\nline two\r\nline three",
        ))
    });
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler);
    let running = Running::start(runner);
    let dead = config.dead_letter_queue();
    let parked = eventually(Duration::from_secs(15), || async {
        inspect.ready(&dead).await == 1
    })
    .await;
    let report = running.stop().await;
    source.close().await;

    assert!(parked, "{report:?}");
    assert_eq!(
        inspect.ready(&elsewhere).await,
        0,
        "the dead letter went only to the dead-letter queue"
    );
    let got = inspect.get(&dead).await.unwrap();
    let headers = got.delivery.properties.headers().clone().unwrap();
    let headers = headers.inner();
    assert_eq!(headers.get("CC"), None, "no routing header on the copy");
    assert_eq!(
        headers.get("idem-original-CC"),
        Some(&routes),
        "kept for whoever reads the dead letter, with its type"
    );
    let last_error = match headers.get("idem-last-error") {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("idem-last-error: {other:?}"),
    };
    assert!(!last_error.chars().any(char::is_control), "{last_error:?}");
    assert!(
        last_error.contains(r"entry:\nline two\r\nline three"),
        "{last_error:?}"
    );
    inspect.delete(&queue).await;
    inspect.delete_one(&elsewhere).await;
    inspect.close().await;
}
