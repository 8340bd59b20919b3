//! What the source tells the runner about RabbitMQ: a delivery is held
//! unsettled for less than the broker's consumer timeout, past which the
//! broker would close the channel and redeliver everything on it.

mod support;

use std::time::Duration;

use idem_amqp::AmqpSource;
use idem_consumer::Source;
use idem_testkit::services;
use support::{Inspect, broker, config, unique};

#[tokio::test]
async fn deliveries_are_held_less_than_the_brokers_consumer_timeout() {
    let Some(url) = broker().await else { return };
    let queue = unique("hold");
    let source = AmqpSource::connect(config(&url, &queue)).await.unwrap();
    let hold = source.capabilities().max_hold.expect("a limit is set");
    if services::program("rabbitmqctl") {
        let timeout = consumer_timeout().await;
        assert!(
            hold < timeout,
            "held {hold:?}, the broker's timeout is {timeout:?}"
        );
    }
    assert_eq!(hold, Duration::from_secs(25 * 60), "the default");
    source.close().await;

    let shorter = config(&url, &queue).max_hold(Duration::from_secs(90));
    let source = AmqpSource::connect(shorter).await.unwrap();
    assert_eq!(
        source.capabilities().max_hold,
        Some(Duration::from_secs(90))
    );
    source.close().await;
    let inspect = Inspect::new(&url).await;
    inspect.delete(&queue).await;
    inspect.close().await;
}

/// The broker's `consumer_timeout`, as `rabbitmqctl environment` shows it
/// (30 minutes when unset).
async fn consumer_timeout() -> Duration {
    let out = tokio::process::Command::new("rabbitmqctl")
        .arg("environment")
        .output()
        .await
        .expect("rabbitmqctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("{consumer_timeout,")
        .nth(1)
        .and_then(|rest| rest.split('}').next()?.trim().parse().ok())
        .map_or(Duration::from_secs(30 * 60), Duration::from_millis)
}
