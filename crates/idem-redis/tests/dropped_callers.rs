//! A caller that stops waiting while its `begin` is still queued for the
//! next batch leaves the key alone: no claim that nobody holds. In a file
//! of its own because it pauses the Redis's writes for a moment
//! (`CLIENT PAUSE … WRITE`), which would disturb other tests.

use std::time::Duration;

use idem_core::{Key, Lease, Store};
use idem_redis::RedisStore;
use idem_testkit::cases::acquired;
use idem_testkit::services;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_queued_begin_is_not_sent() {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let store = match RedisStore::connect(&url).await {
        Ok(s) => s,
        Err(e) => return services::absent("Redis", &url, e).unwrap_or(()),
    };
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = |n: &str| Key::new("dropped-callers", format!("{n}-{}", std::process::id())).unwrap();
    // Writes wait while Redis is paused; the store's calls stay in flight.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("WRITE")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Fill every call slot: one direct call, then one batch after another.
    let mut held = Vec::new();
    for i in 0..12 {
        let (store, k) = (store.clone(), key(&format!("held-{i}")));
        held.push(tokio::spawn(async move {
            store.begin(&k, None, Lease::from_secs(30)).await
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // These queue behind the full slots; their callers give up.
    for i in 0..4 {
        let k = key(&format!("dropped-{i}"));
        let gave_up = tokio::time::timeout(
            Duration::from_millis(50),
            store.begin(&k, None, Lease::from_secs(30)),
        )
        .await;
        assert!(gave_up.is_err(), "still queued while Redis is paused");
    }
    for h in held {
        // The held calls went through once Redis woke.
        acquired(h.await.unwrap().unwrap());
    }
    for i in 0..4 {
        let k = key(&format!("dropped-{i}"));
        assert_eq!(
            store.get(&k).await.unwrap(),
            None,
            "a begin whose caller left was not sent"
        );
        // The key is free for the next delivery.
        let claim = acquired(store.begin(&k, None, Lease::from_secs(30)).await.unwrap());
        assert_eq!(claim.attempt, 1);
    }
}
