//! Connecting declares what is missing, reuses what is there, and refuses
//! what cannot work with an error saying what to change.

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use idem_jetstream::{ConnectError, JetStreamConfig, JetStreamSource};
use support::{Fixture, unique};

fn config(url: &str) -> JetStreamConfig {
    JetStreamConfig::from_url(url).unwrap()
}

/// The error connecting with `config` gives, and its text.
async fn refusal(config: JetStreamConfig) -> (ConnectError, String) {
    let e = JetStreamSource::connect(config)
        .await
        .err()
        .expect("connecting is refused");
    let text = e.to_string();
    (e, text)
}

#[tokio::test]
async fn an_unreachable_server_is_named_without_the_password() {
    let e = JetStreamSource::connect(config(
        "nats://idem:s3cret@127.0.0.1:1?stream=S&consumer=c&subject=s.>",
    ))
    .await
    .err()
    .expect("nothing listens on port 1");
    let text = e.to_string();
    assert!(matches!(e, ConnectError::Unreachable { .. }), "{text}");
    assert!(text.contains("unreachable at 127.0.0.1:1"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn connecting_twice_reuses_the_stream_and_raises_the_consumer_to_the_concurrency() {
    let Some(f) = Fixture::new("redeclare").await else {
        return;
    };
    let first = f.source(f.config().concurrency(4)).await;
    let info = first.consumer_info().await.unwrap();
    assert_eq!(
        info.config.max_ack_pending, 1000,
        "room for every process sharing the consumer"
    );
    assert_eq!(info.config.ack_policy, AckPolicy::Explicit);
    assert_eq!(
        info.config.max_deliver, -1,
        "the runner decides dead-lettering"
    );
    assert_eq!(info.config.filter_subject, format!("{}.>", f.prefix));
    assert_eq!(info.config.ack_wait, Duration::from_secs(30));
    f.publish("paid", "order-1", &[], "{}").await;

    let second = f
        .source(
            f.config()
                .concurrency(2000)
                .ack_wait(Duration::from_secs(45)),
        )
        .await;
    let info = second.consumer_info().await.unwrap();
    assert_eq!(
        info.config.max_ack_pending, 2000,
        "raised to the concurrency"
    );
    assert_eq!(info.config.ack_wait, Duration::from_secs(45));
    assert_eq!(info.num_pending, 1, "the consumer kept its place");
    assert_eq!(f.stored().await, 1, "the stream kept its messages");
    assert_eq!(
        second.dead_letter_subject(),
        format!("{}.dead-letter", f.stream)
    );
    let dead =
        f.js.stream_by_subject(second.dead_letter_subject())
            .await
            .unwrap();
    assert_eq!(dead, format!("{}_dead-letter", f.stream));
}

#[tokio::test]
async fn a_missing_stream_without_a_subject_asks_for_one() {
    let Some(f) = Fixture::new("nostream").await else {
        return;
    };
    let url = format!("{}?stream={}&consumer=c", f.url, f.stream);
    let (e, text) = refusal(config(&url)).await;
    assert!(matches!(e, ConnectError::StreamMissing { .. }), "{text}");
    assert!(text.contains("&subject="), "{text}");
}

#[tokio::test]
async fn a_stream_that_does_not_capture_the_subject_is_refused() {
    let Some(f) = Fixture::new("othersubject").await else {
        return;
    };
    f.create_stream(format!("{}.eu.*", f.prefix)).await;
    let (e, text) = refusal(f.config()).await;
    assert!(matches!(e, ConnectError::Incompatible { .. }), "{text}");
    assert!(text.contains(&format!("not `{}.>`", f.prefix)), "{text}");
    assert!(text.contains("nats stream edit"), "{text}");
}

#[tokio::test]
async fn a_consumer_with_limited_deliveries_is_refused_with_the_fix() {
    let Some(f) = Fixture::new("maxdeliver").await else {
        return;
    };
    let s = f.create_stream(format!("{}.>", f.prefix)).await;
    s.create_consumer(pull::Config {
        durable_name: Some(f.consumer.clone()),
        ack_policy: AckPolicy::Explicit,
        max_deliver: 5,
        filter_subject: format!("{}.>", f.prefix),
        ..Default::default()
    })
    .await
    .unwrap();
    let (e, text) = refusal(f.config()).await;
    assert!(matches!(e, ConnectError::Incompatible { .. }), "{text}");
    assert!(text.contains("MaxDeliver is 5"), "{text}");
    assert!(text.contains("nats consumer rm"), "{text}");
}

#[tokio::test]
async fn a_dead_letter_subject_inside_the_stream_is_refused() {
    let Some(f) = Fixture::new("deadloop").await else {
        return;
    };
    let config = f.config().dead_letter(format!("{}.dead", f.prefix));
    let (e, text) = refusal(config).await;
    assert!(matches!(e, ConnectError::Incompatible { .. }), "{text}");
    assert!(text.contains("would be consumed again"), "{text}");
}

#[tokio::test]
async fn an_ack_wait_shorter_than_the_lease_is_warned_about() {
    let Some(f) = Fixture::new("ackwait").await else {
        return;
    };
    let logs = Arc::new(parking_lot::Mutex::new(Vec::<u8>::new()));
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || Writer(sink.clone()))
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    // The current-thread test runtime polls the connect on this thread.
    let _default = tracing::subscriber::set_default(subscriber);
    let config = f
        .config()
        .ack_wait(Duration::from_secs(5))
        .lease(Duration::from_secs(30));
    let _source = f.source(config).await;
    let text = String::from_utf8(logs.lock().clone()).unwrap();
    assert!(text.contains("WARN"), "{text}");
    assert!(
        text.contains("AckWait is shorter than the guard's lease"),
        "{text}"
    );
    assert!(text.contains("ack_wait"), "{text}");

    logs.lock().clear();
    let _source = f.source(f.config().lease(Duration::from_secs(5))).await;
    assert!(
        logs.lock().is_empty(),
        "no warning when AckWait covers the lease"
    );
}

struct Writer(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_server_without_jetstream_is_named() {
    if !idem_testkit::services::program("nats-server") {
        return;
    }
    let port = 20000 + (std::process::id() % 20000) as u16;
    let mut server = tokio::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nats-server starts");
    let url = format!(
        "nats://127.0.0.1:{port}?stream={}&consumer=c&subject=s.>",
        unique("NOJS")
    );
    let mut outcome = None;
    for _ in 0..50 {
        match JetStreamSource::connect(config(&url)).await {
            Err(ConnectError::Unreachable { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => {
                outcome = Some(other);
                break;
            }
        }
    }
    let _ = server.kill().await;
    let e = outcome.expect("the server came up").err().unwrap();
    assert!(matches!(e, ConnectError::JetStreamDisabled { .. }), "{e}");
    assert!(e.to_string().contains("-js"), "{e}");
}
