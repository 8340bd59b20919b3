//! A dead letter is always publishable: idem's header values are made
//! single-line whatever the handler answered, and the original's NATS
//! control headers travel as `idem-original-<name>` instead of acting on
//! the dead-letter stream.

mod support;

use std::time::Duration;

use idem_consumer::{HandlerError, Runner};
use support::{Effects, Fixture, done, guard, spawn, wait_settled, wait_until};

#[tokio::test]
async fn a_multi_line_error_is_dead_lettered_single_line_and_consumption_goes_on() {
    let Some(f) = Fixture::new("deadlines").await else {
        return;
    };
    let source = f.source(f.config()).await;
    f.publish("paid", "order-1", &[], "{}").await;
    f.publish("paid", "order-2", &[], "{}").await;
    f.publish("paid", "order-3", &[], "{}").await;
    // A pretty-printed problem body, as an HTTP handler's 422 answers.
    let problem = "{\r\n  \"title\": \"unprocessable\",\n  \"detail\": \"bad\u{1}field\"\n}";
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |m: idem_consumer::Message, _claim: support::Claim| {
        let effects = seen.clone();
        async move {
            let key = m.id.clone().unwrap();
            effects.called(&key, m.attempt);
            if key == "order-1" {
                return Err(HandlerError::permanent(problem));
            }
            effects.apply(&key);
            done()
        }
    };
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        handler,
    ));
    wait_until(Duration::from_secs(10), "the messages after it", || async {
        effects.applied("order-2") == 1 && effects.applied("order-3") == 1
    })
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(report.handled, 2, "{report:?}");
    let dead = f.dead_letters().await;
    assert_eq!(dead.len(), 1, "the refused message is dead-lettered");
    let last = dead[0]
        .headers
        .get_last("idem-last-error")
        .expect("idem-last-error is set")
        .as_str()
        .to_owned();
    assert!(!last.chars().any(char::is_control), "single-line: {last:?}");
    assert!(
        last.contains(r#"{\r\n  "title": "unprocessable",\n  "detail": "bad\u{1}field"\n}"#),
        "the body, escaped: {last}"
    );
}

#[tokio::test]
async fn a_dead_letter_keeps_nats_control_headers_as_idem_original() {
    let Some(f) = Fixture::new("deadcontrol").await else {
        return;
    };
    let source = f.source(f.config()).await;
    f.publish("paid", "order-1", &[], "{}").await;
    // Valid when published: the stream's last sequence is 1. On the
    // dead-letter stream, whose last sequence is 0, the same expectation
    // would refuse every publish.
    f.publish(
        "paid",
        "order-2",
        &[("Nats-Expected-Last-Sequence", "1"), ("tenant", "acme")],
        "{}",
    )
    .await;
    let handler = |m: idem_consumer::Message, _claim: support::Claim| async move {
        if m.id.as_deref() == Some("order-2") {
            return Err(HandlerError::permanent("malformed order"));
        }
        done()
    };
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        handler,
    ));
    wait_until(Duration::from_secs(10), "the dead letter", || async {
        f.js.get_stream(format!("{}_dead-letter", f.stream))
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages
            == 1
    })
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let dead = f.dead_letters().await;
    let h = |name: &str| {
        dead[0]
            .headers
            .get_last(name)
            .map(|v| v.as_str().to_owned())
    };
    assert_eq!(
        h("idem-original-Nats-Expected-Last-Sequence").as_deref(),
        Some("1"),
        "kept, renamed"
    );
    assert_eq!(
        h("Nats-Expected-Last-Sequence"),
        None,
        "not sent as a control"
    );
    assert_eq!(h("tenant").as_deref(), Some("acme"));
    // The documented id handling holds beside the renaming.
    assert_eq!(h("idem-message-id").as_deref(), Some("order-2"));
    assert_eq!(h("idem-original-Nats-Msg-Id"), None);
    assert_eq!(h("Nats-Msg-Id"), Some(format!("{}:2", f.stream)));
}
