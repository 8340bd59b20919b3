//! The distributed lock on a real Redis and on a real Redis Cluster:
//! mutual exclusion under contention, the watchdog, a dead holder's expiry
//! with a larger token, owner-only release, first-come-first-served
//! waiting, woken rather than polled, and names and leases past the limits
//! refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{InvalidInput, StoreError};
use idem_redis::RedisStore;
use idem_testkit::services;
use tokio::sync::Mutex;

/// A raw connection beside the store, to act as another process would.
enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    /// Sets lock `name`'s value, as another owner would, for `ms`.
    async fn hold(&mut self, name: &str, owner: &str, ms: u64) {
        let _: () = self
            .run(
                redis::cmd("SET")
                    .arg(format!("idem:{{lock:{name}}}"))
                    .arg(owner)
                    .arg("PX")
                    .arg(ms),
            )
            .await;
    }

    async fn run<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Raw::Single(c) => cmd.query_async(c).await.unwrap(),
            Raw::Cluster(c) => cmd.query_async(c).await.unwrap(),
        }
    }
}

async fn standalone() -> Option<(RedisStore, Raw)> {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    match RedisStore::connect(&url).await {
        Ok(s) => {
            let raw = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            Some((s, Raw::Single(raw)))
        }
        Err(e) => services::absent("Redis", &url, e),
    }
}

async fn cluster() -> Option<(RedisStore, Raw)> {
    let urls = services::url(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002",
    );
    let nodes: Vec<&str> = urls.split(',').collect();
    match RedisStore::cluster_builder(&nodes).connect().await {
        Ok(s) => {
            let raw = redis::cluster::ClusterClient::new(nodes)
                .unwrap()
                .get_async_connection()
                .await
                .unwrap();
            Some((s, Raw::Cluster(raw)))
        }
        Err(e) => services::absent("Redis Cluster", &urls, e),
    }
}

/// Each case, on a standalone Redis and on the cluster.
macro_rules! on_both {
    ($($case:ident),+ $(,)?) => {
        mod standalone {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some((store, raw)) = super::standalone().await {
                        super::$case(store, raw).await;
                    }
                }
            )+
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Some((store, raw)) = super::cluster().await {
                        super::$case(store, raw).await;
                    }
                }
            )+
        }
    };
}

on_both!(
    thirty_two_contending_tasks_never_overlap,
    the_watchdog_keeps_a_long_holder_alive,
    a_dead_holders_lock_expires_and_the_next_gets_a_larger_token,
    only_the_owner_can_release_and_a_lost_lock_is_reported,
    waiters_are_served_first_come_first_served,
    names_and_leases_past_the_limits_are_refused_touching_nothing,
    a_dropped_waiter_leaves_the_line,
    a_wait_of_duration_max_waits_for_the_lock,
    a_wait_longer_than_redis_counts_leaves_no_waiter_behind,
    a_later_waiter_never_shortens_the_lines_life,
);

fn name(n: &str) -> String {
    format!(
        "{n}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

async fn thirty_two_contending_tasks_never_overlap(store: RedisStore, _raw: Raw) {
    let lock = store.lock(&name("mutex")).lease(Duration::from_secs(5));
    let counter = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (lock, counter, inside, tokens) = (
                lock.clone(),
                counter.clone(),
                inside.clone(),
                tokens.clone(),
            );
            tokio::spawn(async move {
                for _ in 0..3 {
                    let guard = lock
                        .try_lock(Duration::from_secs(60))
                        .await
                        .unwrap()
                        .expect("acquired in time");
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    // A read-modify-write that a second holder would break.
                    let v = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    tokens.lock().await.push(guard.token());
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 96);
    let tokens = tokens.lock().await;
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens increase with each acquisition"
    );
}

async fn the_watchdog_keeps_a_long_holder_alive(store: RedisStore, _raw: Raw) {
    let lease = Duration::from_millis(600);
    let lock = store.lock(&name("watchdog")).lease(lease);
    let guard = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    for _ in 0..4 {
        // Three leases and more.
        tokio::time::sleep(lease / 2).await;
        assert!(
            lock.try_lock(Duration::ZERO).await.unwrap().is_none(),
            "taken from a live holder"
        );
    }
    assert!(!guard.is_lost(), "a healthy lock is not reported lost");
    assert!(
        tokio::time::timeout(lease, guard.lost()).await.is_err(),
        "a healthy lock is not reported lost"
    );
    assert!(guard.release().await.unwrap());
    assert!(lock.try_lock(Duration::ZERO).await.unwrap().is_some());
}

async fn a_dead_holders_lock_expires_and_the_next_gets_a_larger_token(
    store: RedisStore,
    mut raw: Raw,
) {
    let n = name("dead");
    let lock = store.lock(&n).lease(Duration::from_secs(5));
    let first = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    let t1 = first.token();
    assert!(first.release().await.unwrap());
    // Another process took the lock and died: its value stays until its
    // lease runs out, and nobody renews it.
    raw.hold(&n, "a-process-that-died", 400).await;
    assert!(lock.try_lock(Duration::ZERO).await.unwrap().is_none());
    let next = lock
        .try_lock(Duration::from_secs(3))
        .await
        .unwrap()
        .expect("the dead lease ran out");
    assert!(next.token() > t1);
}

async fn only_the_owner_can_release_and_a_lost_lock_is_reported(store: RedisStore, mut raw: Raw) {
    let n = name("owner");
    let lock = store.lock(&n).lease(Duration::from_millis(300));
    let guard = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    // Someone else now owns it (as after an expiry and a takeover).
    raw.hold(&n, "someone-else", 10_000).await;
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the watchdog reports the lost lock");
    assert!(
        !guard.release().await.unwrap(),
        "a non-owner's release is refused"
    );
    let value: String = raw
        .run(redis::cmd("GET").arg(format!("idem:{{lock:{n}}}")))
        .await;
    assert_eq!(value, "someone-else", "the other owner's lock is untouched");
}

async fn waiters_are_served_first_come_first_served(store: RedisStore, _raw: Raw) {
    let lock = store.lock(&name("fair")).lease(Duration::from_secs(5));
    let holder = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (lock, order) = (lock.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let g = lock
                .try_lock(Duration::from_secs(10))
                .await
                .unwrap()
                .unwrap();
            order.lock().await.push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
        }));
        // Each waiter is in line before the next arrives.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = tokio::time::Instant::now();
    assert!(holder.release().await.unwrap());
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().await, [0, 1, 2, 3]);
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "waiters were woken, not left to the once-a-second poll: {:?}",
        started.elapsed()
    );
}

async fn names_and_leases_past_the_limits_are_refused_touching_nothing(
    store: RedisStore,
    mut raw: Raw,
) {
    let refused = |r: Result<Option<idem_redis::LockGuard>, StoreError>| match r {
        Err(StoreError::Invalid(e)) => e,
        Err(e) => panic!("refused as the wrong error: {e}"),
        Ok(_) => panic!("not refused"),
    };
    let wait = Duration::from_secs(1);
    assert!(matches!(
        refused(store.lock("").try_lock(wait).await),
        InvalidInput::EmptyKey
    ));
    // 255 bytes is the default limit.
    let long = format!("{}-{}", name("long"), "x".repeat(255));
    assert!(matches!(
        refused(store.lock(&long).try_lock(wait).await),
        InvalidInput::KeyTooLong { limit: 255, .. }
    ));
    let n = name("lease");
    for too_long in [Duration::from_secs(8 * 24 * 3600), Duration::MAX] {
        assert!(matches!(
            refused(store.lock(&n).lease(too_long).try_lock(wait).await),
            InvalidInput::LeaseTooLong { .. }
        ));
    }
    for name in [&long, &n] {
        let keys = [":t", ":q", ":qd"].map(|s| format!("idem:{{lock:{name}}}{s}"));
        let found: usize = raw
            .run(
                redis::cmd("EXISTS")
                    .arg(format!("idem:{{lock:{name}}}"))
                    .arg(&keys[..]),
            )
            .await;
        assert_eq!(found, 0, "a refused lock wrote to Redis");
    }
    // Within the limits, the same store takes it.
    let guard = store.lock(&n).try_lock(wait).await.unwrap().unwrap();
    assert!(guard.release().await.unwrap());
}

/// Holds `lock` until the returned guard is released, and checks that a
/// newcomer gets it within a second of the release: nobody who left the
/// line is in its way.
async fn newcomer_gets_it_after(lock: &idem_redis::Lock, holder: idem_redis::LockGuard) {
    assert!(holder.release().await.unwrap());
    let newcomer = lock
        .try_lock(Duration::from_secs(1))
        .await
        .unwrap()
        .expect("a newcomer gets the free lock: nobody gone is ahead of it");
    assert!(newcomer.release().await.unwrap());
}

async fn a_dropped_waiter_leaves_the_line(store: RedisStore, _raw: Raw) {
    let lock = store.lock(&name("dropped")).lease(Duration::from_secs(5));
    let holder = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    // A waiter that meant to wait a minute is dropped (its caller timed
    // out) while in line.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        lock.try_lock(Duration::from_secs(60)),
    )
    .await;
    assert!(gave_up.is_err(), "still waiting when dropped");
    newcomer_gets_it_after(&lock, holder).await;
}

async fn a_wait_of_duration_max_waits_for_the_lock(store: RedisStore, _raw: Raw) {
    let lock = store.lock(&name("max")).lease(Duration::from_secs(5));
    let holder = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock(Duration::MAX).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(holder.release().await.unwrap());
    let got = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter gets the released lock")
        .unwrap()
        .unwrap()
        .expect("acquired");
    assert!(got.release().await.unwrap());
}

async fn a_wait_longer_than_redis_counts_leaves_no_waiter_behind(store: RedisStore, _raw: Raw) {
    let lock = store.lock(&name("huge")).lease(Duration::from_secs(5));
    let holder = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    // 10^18 ms: more than Redis takes as an expiry. Whether the call
    // fails or waits, once it is over it holds no place in line.
    let _ = tokio::time::timeout(
        Duration::from_millis(300),
        lock.try_lock(Duration::from_secs(1_000_000_000_000_000)),
    )
    .await;
    newcomer_gets_it_after(&lock, holder).await;
}

async fn a_later_waiter_never_shortens_the_lines_life(store: RedisStore, mut raw: Raw) {
    let n = name("line-life");
    let holder = store
        .lock(&n)
        .lease(Duration::from_secs(5))
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let queue = format!("idem:{{lock:{n}}}:q");
    let pttl = async |raw: &mut Raw| -> i64 { raw.run(redis::cmd("PTTL").arg(&queue)).await };
    let wait_in_line = |lease: Duration, wait: Duration| {
        let lock = store.lock(&n).lease(lease);
        tokio::spawn(async move { lock.try_lock(wait).await })
    };
    // A waiter with a long lease and a long wait; then one with short ones.
    let first = wait_in_line(Duration::from_secs(60), Duration::from_secs(600));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let set_by_first = pttl(&mut raw).await;
    let second = wait_in_line(Duration::from_millis(3), Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after_second = pttl(&mut raw).await;
    assert!(
        after_second > set_by_first - 1000,
        "the line's life went from {set_by_first} ms to {after_second} ms"
    );
    first.abort();
    second.abort();
    assert!(holder.release().await.unwrap());
}
