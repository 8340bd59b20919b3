//! The token floor and high-water mark a tiered store relies on
//! (docs/contract.md §2, "Tiers"): the mark is kept in Redis, so a new
//! connection reads it; a floor within a second of Redis's clock is waited
//! for; one further ahead is refused at once and stores nothing.
//!
//! A mark far ahead of the clock would make every later floor on that
//! Redis wait or fail, so the test that sets one runs on a Redis of its
//! own; on the shared cluster only floors that are passed or refused.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{Begin, Completed, FencingToken, Key, Lease, Store, StoreError, Timestamp};
use idem_redis::RedisStore;
use idem_testkit::services;
use support::{OwnRedis, free_port};

mod support;

/// Tokens per millisecond of Redis's clock.
const PER_MS: u64 = 1024;

/// A store on a Redis of its own, and that Redis (stopped when dropped).
async fn own_redis() -> Option<(RedisStore, OwnRedis, String)> {
    if !services::program("redis-server") {
        return None;
    }
    let redis = OwnRedis::start(free_port()).await;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let store = RedisStore::connect(&url).await.unwrap();
    Some((store, redis, url))
}

fn unique(case: &str) -> Key {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Key::new(
        "token-floor",
        format!("{case}-{}-{nanos}", std::process::id()),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_water_mark_survives_a_new_connection() {
    let Some((store, _redis, url)) = own_redis().await else {
        return;
    };
    // An hour of tokens ahead of Redis's clock: only the stored mark can
    // answer it.
    let ahead = store.token_high_water().await.unwrap().get() + 3_600_000 * PER_MS;
    let now = Timestamp::from_millis(
        u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap(),
    );
    let item = ImportItem {
        key: unique("survives"),
        record: Completed {
            token: FencingToken::new(ahead),
            fingerprint: None,
            outcome: None,
            completed_at: now,
            expires_at: now.after(Duration::from_secs(60)),
        },
    };
    assert_eq!(
        store.import_many(&[item]).await.unwrap(),
        [Imported::Written]
    );
    drop(store);

    let again = RedisStore::connect(&url).await.unwrap();
    let mark = again.token_high_water().await.unwrap();
    assert!(
        mark.get() >= ahead,
        "a new connection reads high water {mark:?}, below the imported token {ahead}"
    );
    // A tier whose tokens are that far ahead cannot sit in front of this
    // Redis: its floor is refused.
    assert!(again.raise_token_floor(mark).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_just_ahead_of_redis_is_waited_for() {
    let Some((store, _redis, _)) = own_redis().await else {
        return;
    };
    floor_just_ahead_is_waited_for(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_far_ahead_of_redis_is_refused_and_not_stored() {
    let Some((store, _redis, _)) = own_redis().await else {
        return;
    };
    floor_far_ahead_is_refused_and_not_stored(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_just_ahead_of_every_cluster_master_is_waited_for() {
    let Some(store) = support::test_cluster().await else {
        return;
    };
    floor_just_ahead_is_waited_for(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_far_ahead_of_the_cluster_is_refused_and_not_stored() {
    let Some(store) = support::test_cluster().await else {
        return;
    };
    floor_far_ahead_is_refused_and_not_stored(&store).await;
}

/// A floor 300 ms of tokens ahead: the call returns once Redis's clock has
/// passed it, and every token after it is above it.
async fn floor_just_ahead_is_waited_for(store: &RedisStore) {
    let floor = FencingToken::new(store.token_high_water().await.unwrap().get() + 300 * PER_MS);
    let started = Instant::now();
    store.raise_token_floor(floor).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200),
        "returned after {waited:?}, before Redis's clock could pass a floor 300 ms ahead"
    );
    assert!(store.token_high_water().await.unwrap() >= floor);
    for i in 0..3 {
        let key = unique(&format!("waited-{i}"));
        match store.begin(&key, None, Lease::from_secs(5)).await.unwrap() {
            Begin::Acquired(claim) => assert!(
                claim.token > floor,
                "token {:?} issued after the floor {floor:?} is not above it",
                claim.token
            ),
            other => panic!("a fresh key is acquired, got {other:?}"),
        }
    }
}

/// A floor a minute ahead: refused without waiting, saying the clock is
/// behind and what to do, and the mark stays below it.
async fn floor_far_ahead_is_refused_and_not_stored(store: &RedisStore) {
    let floor = FencingToken::new(store.token_high_water().await.unwrap().get() + 60_000 * PER_MS);
    let started = Instant::now();
    let refused = store.raise_token_floor(floor).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "refused after {:?}: a floor past the longest wait is refused at once",
        started.elapsed()
    );
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");
    let said = refused.to_string();
    assert!(
        said.contains("ms behind token floor") && said.contains("NTP"),
        "the error says the clock is behind and what to do: {said}"
    );
    let mark = store.token_high_water().await.unwrap();
    assert!(
        mark < floor,
        "a refused floor is stored: high water {mark:?}"
    );
}
