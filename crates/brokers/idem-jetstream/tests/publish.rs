//! The stream itself drops a republish with the same `Nats-Msg-Id` inside
//! its duplicate window; a header NATS cannot carry is refused, not sent.

mod support;

use support::Fixture;

#[tokio::test]
async fn republishing_a_message_id_within_the_window_is_dropped_by_the_stream() {
    let Some(f) = Fixture::new("publish").await else {
        return;
    };
    // Connecting declares the stream.
    let _source = f.source(f.config()).await;
    f.publish("paid", "order-1", &[], "first").await;
    f.publish("paid", "order-2", &[], "second").await;
    assert_eq!(f.stored().await, 2);

    let again = f
        .publisher
        .publish(
            &format!("{}.paid", f.prefix),
            "order-1",
            &[],
            "first, again",
        )
        .await
        .unwrap();
    assert!(again.duplicate, "the stream reports the duplicate");
    assert_eq!(again.sequence, 1, "the answer names the first copy");
    assert_eq!(again.stream, f.stream);
    assert_eq!(f.stored().await, 2, "the duplicate was not stored");
}

#[tokio::test]
async fn a_header_nats_cannot_carry_is_an_error_not_a_panic() {
    let Some(f) = Fixture::new("publishbad").await else {
        return;
    };
    let _source = f.source(f.config()).await;
    let subject = format!("{}.paid", f.prefix);
    let line_break = f
        .publisher
        .publish(&subject, "order-1", &[("detail", "a\r\nb")], "{}")
        .await;
    let err = line_break.expect_err("a value with CR/LF is refused");
    assert!(
        err.to_string().contains("detail"),
        "names the header: {err}"
    );
    let bad_name = f
        .publisher
        .publish(&subject, "order-1", &[("a:b", "x")], "{}")
        .await;
    assert!(bad_name.is_err(), "a name with `:` is refused");
    let bad_id = f.publisher.publish(&subject, "order\n1", &[], "{}").await;
    assert!(bad_id.is_err(), "an id with LF is refused");
    assert_eq!(f.stored().await, 0, "nothing was published");
}
