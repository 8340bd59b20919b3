//! The stream itself drops a republish with the same `Nats-Msg-Id` inside
//! its duplicate window.

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
