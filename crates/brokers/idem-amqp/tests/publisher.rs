//! The publish helper and the errors a misconfigured source reports.

mod support;

use idem_amqp::{AmqpConfig, AmqpPublisher, AmqpSource, ConnectError};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use std::time::{Duration, Instant};

use support::{Inspect, Stall, broker, config, message, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_publish_carries_the_message_id_content_type_and_headers() {
    let Some(url) = broker().await else { return };
    let queue = unique("publish");
    let publisher = AmqpPublisher::connect(&config(&url, &queue)).await.unwrap();
    let mut m = message("order-1");
    m.headers.push(("tenant".into(), "acme".into()));
    publisher.publish(&m).await.unwrap();
    // Confirmed means the broker has it: visible at once.
    let inspect = Inspect::new(&url).await;
    assert_eq!(inspect.ready(&queue).await, 1);
    let got = inspect
        .get(&queue)
        .await
        .expect("the message is in the queue");
    let props = &got.delivery.properties;
    assert_eq!(props.message_id().as_ref().unwrap().as_str(), "order-1");
    assert_eq!(
        props.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert_eq!(props.delivery_mode(), &Some(2), "persistent");
    let headers = props.headers().as_ref().unwrap();
    assert!(
        matches!(headers.inner().get("tenant"), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"acme")
    );
    assert_eq!(got.delivery.data, m.body.to_vec());
    publisher.close().await;
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_named_by_address_without_the_password() {
    // Nothing listens on port 1.
    let config = AmqpConfig::from_url("amqp://guest:s3cret@127.0.0.1:1/%2f?queue=orders").unwrap();
    let e = AmqpSource::connect(config)
        .await
        .err()
        .expect("no broker there");
    let text = e.to_string();
    assert!(matches!(e, ConnectError::Unreachable { .. }), "{e:?}");
    assert!(text.contains("unreachable at 127.0.0.1:1"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_as_access_refused() {
    let Some(url) = broker().await else { return };
    let mut parsed = url::Url::parse(&url).unwrap();
    parsed.set_password(Some("not-the-password")).unwrap();
    let e = AmqpSource::connect(config(parsed.as_str(), "orders"))
        .await
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(
        matches!(e, ConnectError::AccessRefused { .. }),
        "{e:?}: {text}"
    );
    assert!(!text.contains("not-the-password"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_declared_with_other_arguments_is_named_with_the_fix() {
    let Some(url) = broker().await else { return };
    let queue = unique("args");
    let inspect = Inspect::new(&url).await;
    {
        let c = lapin::Connection::connect(&url, Default::default())
            .await
            .unwrap();
        let ch = c.create_channel().await.unwrap();
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(10));
        ch.queue_declare(
            format!("{queue}.dead-letter").as_str().into(),
            QueueDeclareOptions::durable(),
            args,
        )
        .await
        .unwrap();
        let _ = c.close(200, "OK".into()).await;
    }
    let e = AmqpSource::connect(config(&url, &queue))
        .await
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(matches!(e, ConnectError::QueueArguments { .. }), "{e:?}");
    assert!(text.contains(&format!("`{queue}.dead-letter`")), "{text}");
    assert!(text.contains("delete it"), "{text}");
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test]
async fn a_classic_dead_letter_queue_of_an_older_version_is_refused_with_how_to_migrate() {
    let Some(url) = broker().await else { return };
    let queue = unique("classic-dlq");
    let inspect = Inspect::new(&url).await;
    {
        let c = lapin::Connection::connect(&url, Default::default())
            .await
            .unwrap();
        let ch = c.create_channel().await.unwrap();
        ch.queue_declare(
            format!("{queue}.dead-letter").as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let _ = c.close(200, "OK".into()).await;
    }
    let e = AmqpSource::connect(config(&url, &queue))
        .await
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(matches!(e, ConnectError::QueueArguments { .. }), "{e:?}");
    assert!(text.contains(&format!("`{queue}.dead-letter`")), "{text}");
    assert!(
        text.contains("quorum") && text.contains("move its messages"),
        "{text}"
    );
    inspect.delete(&queue).await;
    inspect.close().await;
}

/// A link that stalls without closing (a frozen broker, a dead switch): a
/// publish waits for its confirm at most the answer timeout and then fails,
/// rather than hold its caller (and, in the source, the message and its
/// permit) until the heartbeat notices a minute or more later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_on_a_stalled_link_fails_within_the_answer_timeout() {
    let Some(url) = broker().await else { return };
    let stall = Stall::before(&url).await;
    let queue = unique("stalled");
    let config = config(&stall.url, &queue).answer_timeout(Duration::from_secs(1));
    let publisher = AmqpPublisher::connect(&config).await.unwrap();
    publisher.publish(&message("before")).await.unwrap();
    stall.stall();
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        publisher.publish(&message("during")),
    )
    .await;
    let e = r
        .expect("the publish gave up by itself")
        .expect_err("no confirm can come through a stalled link");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(e.to_string().contains("answer_timeout_ms"), "{e}");
    let inspect = Inspect::new(&url).await;
    inspect.delete(&queue).await;
    inspect.close().await;
}
