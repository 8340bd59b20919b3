//! Connecting fails with a reason a person can act on, and never shows the
//! password.

mod support;

use idem_redis_streams::{ConnectError, RedisStreamConfig, RedisStreamSource};
use redis::Commands;
use support::Fixture;

#[tokio::test]
async fn an_unreachable_redis_is_named_without_its_password() {
    let config =
        RedisStreamConfig::from_url("redis://app:hunter2@127.0.0.1:1?stream=s&group=g").unwrap();
    let Err(e) = RedisStreamSource::connect(config).await else {
        panic!("nothing listens on port 1");
    };
    assert!(matches!(e, ConnectError::Unreachable { .. }), "{e:?}");
    let shown = e.to_string();
    assert!(
        shown.starts_with("Redis is unreachable at redis://app:***@127.0.0.1:1"),
        "{shown}"
    );
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test]
async fn a_stream_name_holding_another_type_is_refused_with_its_type() {
    let Some(fx) = Fixture::new("wrongtype") else {
        return;
    };
    let client = redis::Client::open(fx.server.as_str()).unwrap();
    let _: () = client
        .get_connection()
        .unwrap()
        .set(&fx.stream, "not a stream")
        .unwrap();
    let Err(e) = RedisStreamSource::connect(fx.config()).await else {
        panic!("a string key is not a stream");
    };
    let shown = e.to_string();
    assert!(
        shown.contains(&format!("key `{}`", fx.stream))
            && shown.contains("holds a string, not a stream"),
        "{shown}"
    );
}

#[tokio::test]
async fn connecting_twice_finds_the_group_it_created() {
    let Some(fx) = Fixture::new("idempotent") else {
        return;
    };
    let first = RedisStreamSource::connect(fx.config()).await.unwrap();
    let again = RedisStreamSource::connect(fx.config()).await;
    assert!(again.is_ok(), "{:?}", again.err());
    assert_ne!(
        first.consumer(),
        again.unwrap().consumer(),
        "consumer names are unique per start"
    );
    assert_eq!(fx.backlog().await.pending, 0);
}
