//! `rediss://`: the store and the lock over TLS, on a Redis and on a
//! one-node Redis Cluster of the test's own, both asking for client
//! certificates (Redis's default once TLS is on) and both signed by a CA
//! the test makes; and what a wrong setup is told.
#![cfg(feature = "tls")]

use std::time::{Duration, Instant};

use idem_core::{Begin, Key, Lease, ScanQuery, Store};
use idem_redis::{RedisStore, RedisStoreBuilder};
use idem_testkit::cases::deliver;
use idem_testkit::tls_redis::TlsRedis;

/// `builder` trusting the test's CA and presenting its client certificate.
fn trusted(redis: &TlsRedis, builder: RedisStoreBuilder) -> RedisStoreBuilder {
    builder
        .tls_ca(redis.ca.clone())
        .tls_client_certificate(redis.client_cert.clone(), redis.client_key.clone())
        .timeout(Duration::from_secs(5))
}

/// A delivery, a replay, and a lock waiter woken by the holder's release
/// (not by the one-second fallback poll), all over TLS to a standalone Redis
/// or a cluster.
async fn works_over_tls(cluster: bool) {
    let Some(redis) = TlsRedis::start(cluster).await else {
        return;
    };
    let builder = if cluster {
        RedisStore::cluster_builder(&[&redis.url])
    } else {
        RedisStore::builder(&redis.url)
    };
    let store = trusted(&redis, builder).connect().await.unwrap();
    let key = Key::new("tls", format!("k-{}", std::process::id())).unwrap();
    deliver(&store, &key, "sent").await;
    match store.begin(&key, None, Lease::from_secs(30)).await.unwrap() {
        Begin::Completed { outcome, .. } => assert_eq!(outcome.as_deref(), Some(&b"sent"[..])),
        other => panic!("a repeat replays the outcome, got {other:?}"),
    }
    // Listing reaches every master (the one node of a cluster of one too).
    let listed = store
        .scan(&ScanQuery::new(key.namespace().clone()))
        .await
        .unwrap();
    assert!(listed.iter().any(|e| e.key == key), "{listed:?}");

    let lock = store.lock("tls-lock").lease(Duration::from_secs(5));
    let holder = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let guard = lock.try_lock(Duration::from_secs(10)).await.unwrap();
            (guard.expect("the waiter gets the lock"), Instant::now())
        }
    });
    // Let the waiter line up and block.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let (guard, got) = waiter.await.unwrap();
    assert!(
        got - released < Duration::from_millis(700),
        "the waiter was woken, not polled: {:?} after the release",
        got - released
    );
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_and_the_lock_work_over_tls() {
    works_over_tls(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_and_the_lock_work_over_tls_on_a_cluster() {
    works_over_tls(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_tls_setup_is_told_what_is_wrong() {
    let Some(redis) = TlsRedis::start(false).await else {
        return;
    };
    let connect = |builder: RedisStoreBuilder| async move {
        match builder.timeout(Duration::from_secs(3)).connect().await {
            Ok(_) => panic!("connected"),
            Err(e) => e.to_string(),
        }
    };
    // The system's roots do not know the test's CA.
    let err = connect(
        RedisStore::builder(&redis.url)
            .tls_client_certificate(redis.client_cert.clone(), redis.client_key.clone()),
    )
    .await;
    assert!(
        err.contains("invalid peer certificate: UnknownIssuer"),
        "{err}"
    );
    // Redis asks for a client certificate.
    let err = connect(RedisStore::builder(&redis.url).tls_ca(redis.ca.clone())).await;
    assert!(err.contains("CertificateRequired"), "{err}");
    // Certificates are for rediss:// only.
    let plain = redis.url.replace("rediss://", "redis://");
    let err = connect(trusted(&redis, RedisStore::builder(&plain))).await;
    assert!(err.contains("rediss://"), "{err}");
}
