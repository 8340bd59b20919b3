//! A dead letter carries idem's fields once each, one line each, whatever
//! the handler answered and whatever fields the entry already had.

mod support;

use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle};
use support::{Fixture, Running, eventually, guard, message};

/// Refuses every message with `error`.
fn refusing(
    error: &'static str,
) -> impl Fn(
    Message,
    ClaimHandle,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Bytes, HandlerError>> + Send>>
+ Send
+ Sync
+ 'static {
    move |_m: Message, _| Box::pin(async move { Err(HandlerError::permanent(error)) })
}

/// Publishes `sent`, refuses it with `error`, and gives the dead letter's
/// fields.
async fn dead_letter_of(
    fx: &Fixture,
    sent: &Message,
    error: &'static str,
) -> Vec<(String, String)> {
    fx.publisher().await.publish(sent).await.unwrap();
    let runner = Runner::new(guard(10_000), fx.source().await, refusing(error));
    let running = Running::start(runner);
    eventually(Duration::from_secs(10), "dead-lettered", || async {
        fx.dead_letter_fields().len() == 1 && fx.backlog().await.is_drained()
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    fx.dead_letter_fields().remove(0)
}

fn values<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_line_error_arrives_on_one_line() {
    let Some(fx) = Fixture::new("dead-multiline") else {
        return;
    };
    let fields = dead_letter_of(
        &fx,
        &message("m-1"),
        "{\r\n  \"title\": \"unprocessable\"\n}",
    )
    .await;

    let last = values(&fields, "idem-last-error");
    assert_eq!(last.len(), 1, "{fields:?}");
    assert!(!last[0].chars().any(char::is_control), "one line: {last:?}");
    assert!(
        last[0].contains(r#"{\r\n  "title": "unprocessable"\n}"#),
        "{last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_letter_dead_lettered_again_carries_only_the_new_idem_fields() {
    let Some(fx) = Fixture::new("dead-replayed") else {
        return;
    };
    // A dead letter published back to the stream keeps its idem fields.
    let mut sent = message("r-1");
    sent.headers = vec![
        ("tenant".into(), Bytes::from("t9")),
        ("idem-last-error".into(), Bytes::from("the old error")),
        ("IDEM-KEY".into(), Bytes::from("the old key")),
    ];
    let fields = dead_letter_of(&fx, &sent, "the new error").await;

    assert_eq!(values(&fields, "tenant"), ["t9"], "its own fields are kept");
    assert_eq!(values(&fields, "idem-last-error"), ["the new error"]);
    assert_eq!(values(&fields, "idem-key"), ["r-1"]);
    assert!(values(&fields, "IDEM-KEY").is_empty(), "{fields:?}");
    assert_eq!(values(&fields, "idem-attempts"), ["1"]);
}
