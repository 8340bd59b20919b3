//! `rediss://`: consuming over TLS from a Redis of the test's own that asks
//! for a client certificate, its certificate signed by a CA the test makes.
#![cfg(feature = "tls")]

mod support;

use idem_consumer::Source;
use idem_redis_streams::{
    ConnectError, RedisStreamConfig, RedisStreamPublisher, RedisStreamSource,
};
use idem_testkit::tls_redis::TlsRedis;
use support::message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_read_and_acked_over_tls() {
    let Some(redis) = TlsRedis::start(false).await else {
        return;
    };
    let config = RedisStreamConfig::from_url(&format!("{}?stream=orders&group=idem", redis.url))
        .unwrap()
        .tls_ca(redis.ca.clone())
        .tls_client_certificate(redis.client_cert.clone(), redis.client_key.clone());
    let source = RedisStreamSource::connect(config.clone()).await.unwrap();
    let publisher = RedisStreamPublisher::connect(&config).await.unwrap();
    publisher.publish(&message("t-1")).await.unwrap();

    let got = source.fetch(10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id.as_deref(), Some("t-1"));
    let d = got.into_iter().next().unwrap();
    source.ack(d).await.unwrap();
    assert!(source.fetch(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_unknown_ca_is_refused() {
    let Some(redis) = TlsRedis::start(false).await else {
        return;
    };
    // The client certificate, but not the CA: the system's roots do not
    // know it.
    let config = RedisStreamConfig::from_url(&format!("{}?stream=orders&group=idem", redis.url))
        .unwrap()
        .tls_client_certificate(redis.client_cert.clone(), redis.client_key.clone());
    let Err(e) = RedisStreamSource::connect(config).await else {
        panic!("an unknown CA must not be trusted");
    };
    assert!(matches!(e, ConnectError::Unreachable { .. }), "{e:?}");
}
