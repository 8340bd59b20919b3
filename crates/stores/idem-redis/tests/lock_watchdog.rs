//! The lock's watchdog tells the holder its lock may be lost before the
//! lease can run out, when renewals stop getting through. On a Redis of its
//! own, which the test freezes (`SIGSTOP`) so renewals hang.

use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::services;
use support::{OwnRedis, free_port};
use tokio::time::Instant;

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_renewal_is_reported_before_the_lease_can_run_out() {
    if !services::program("redis-server") {
        return;
    }
    let port = free_port();
    let redis = OwnRedis::start(port).await;
    // Calls wait long for an answer: a renewal hangs rather than fails.
    let store = RedisStore::builder(&format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let lease = Duration::from_millis(900);
    let lock = store.lock("stalled").lease(lease);
    let before = Instant::now();
    let guard = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    redis.signal("STOP").await;
    assert!(
        before.elapsed() < lease / 3,
        "frozen before the first renewal was due"
    );
    // Redis set the lease after `before`, and nothing renewed it since: it
    // runs out no sooner than `before + lease`.
    let told = tokio::time::timeout_at(before + lease, guard.lost()).await;
    redis.signal("CONT").await;
    told.expect("the holder is told before its lease can run out");
    assert!(guard.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_lock_is_renewed_every_third_of_its_lease() {
    if !services::program("redis-server") {
        return;
    }
    let port = free_port();
    let _redis = OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::connect(&url).await.unwrap();
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let lease = Duration::from_millis(600);
    let guard = store
        .lock("renewed")
        .lease(lease)
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let script_calls = async |raw: &mut redis::aio::MultiplexedConnection| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(raw)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let before = script_calls(&mut raw).await;
    // Three leases: about nine renewals, one every 200 ms.
    tokio::time::sleep(3 * lease).await;
    let renewals = script_calls(&mut raw).await - before;
    assert!(!guard.is_lost(), "a healthy lock is not reported lost");
    assert!(
        (4..=12).contains(&renewals),
        "{renewals} renewals in three leases"
    );
    assert!(guard.release().await.unwrap());
}
