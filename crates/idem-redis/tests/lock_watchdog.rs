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
