//! A filter loaded from its snapshot is made ready from the cold tier with
//! the keys completed since the snapshot alone, on 100 000 records; a tier
//! that cannot list by completion time is read whole instead. On
//! PostgreSQL the listing walks the completion index (checked with
//! `EXPLAIN`).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use idem_core::tier::{CompletedKey, ImportItem, Tier};
use idem_core::{Clock, Completed, FencingToken, Key, SystemClock, Timestamp};
use idem_sql::SqlStore;
use idem_testkit::services;
use idem_tiered::filter::{Fed, FilterConfig, FilterSeed, KeyFilter, Membership, Readiness};
use sqlx::AssertSqlSafe;

const RECORDS: usize = 100_000;

fn config() -> FilterConfig {
    FilterConfig::new(
        FilterSeed::new(0x5eed),
        200_000,
        Duration::from_secs(2 * 3600),
    )
}

fn key(ns: &str, i: usize) -> Key {
    Key::new(ns, format!("k-{i:06}")).unwrap()
}

async fn import<T: Tier>(tier: &T, keys: impl Iterator<Item = Key>, completed_at: Timestamp) {
    let expires_at = completed_at.after(Duration::from_secs(3600));
    let items: Vec<ImportItem> = keys
        .enumerate()
        .map(|(n, key)| ImportItem {
            key,
            record: Completed {
                token: FencingToken::new(1_000 + n as u64),
                fingerprint: None,
                outcome: Some(Bytes::from_static(b"done")),
                completed_at,
                expires_at,
            },
        })
        .collect();
    for chunk in items.chunks(5_000) {
        tier.import_many(chunk).await.unwrap();
    }
}

/// 100 000 records completed ten minutes ago, a snapshot now, 50 records
/// completed after it: the loaded filter is fed those 50 and knows all.
async fn caught_up_with_what_came_after<T: Tier>(tier: &T, ns: &str) {
    let now = SystemClock.now();
    let old = Timestamp::from_millis(now.as_millis() - 600_000);
    import(tier, (0..RECORDS).map(|i| key(ns, i)), old).await;

    let filter = KeyFilter::new(&config(), now).unwrap();
    let fed = filter.rebuild_from_tier(tier, |_, _| {}).await.unwrap();
    assert!(
        matches!(fed, Fed::Rebuilt { .. }),
        "a new filter reads every key: {fed:?}"
    );
    assert!(fed.keys() >= RECORDS as u64, "{fed:?}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, now).unwrap();

    let later = now.after(Duration::from_millis(10));
    import(tier, (RECORDS..RECORDS + 50).map(|i| key(ns, i)), later).await;
    let loaded = KeyFilter::load_snapshot(&path, &config(), later).unwrap();
    let fed = loaded.rebuild_from_tier(tier, |_, _| {}).await.unwrap();
    assert_eq!(
        fed,
        Fed::CaughtUp { keys: 50 },
        "only what came after the snapshot"
    );
    for i in 0..RECORDS + 50 {
        assert_eq!(loaded.check(&key(ns, i)), Membership::Maybe, "key {i}");
    }
    let new = (0..1_000)
        .filter(|i| loaded.check(&key("never", *i)).is_absent())
        .count();
    assert!(
        new > 950,
        "a ready filter calls new keys new: {new} of 1000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_cold_tier_catches_a_loaded_filter_up_with_the_keys_since() {
    let dir = tempfile::tempdir().unwrap();
    let cold = idem_file::FileStore::open(dir.path()).unwrap();
    caught_up_with_what_came_after(&cold, "orders").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_cold_tier_catches_a_loaded_filter_up_through_its_index() {
    let url = services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let table = "idem_catch_up";
    let cold = match SqlStore::builder(&url).table(table).connect().await {
        Ok(store) => store,
        Err(e) => return services::absent("PostgreSQL", &url, e).unwrap_or(()),
    };
    // Only this run's records: the filter is sized for them.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!("TRUNCATE \"{table}\"")))
        .execute(&pool)
        .await
        .unwrap();
    let ns = format!("c{}", std::process::id());
    caught_up_with_what_came_after(&cold, &ns).await;

    // The plan: the partial completion index, not the whole table.
    sqlx::query(AssertSqlSafe(format!("ANALYZE \"{table}\"")))
        .execute(&pool)
        .await
        .unwrap();
    let plan: Vec<(String,)> = sqlx::query_as(AssertSqlSafe(format!(
        "EXPLAIN SELECT ns, k, completed_at FROM \"{table}\"
         WHERE state = 2 AND completed_at >= 1 AND (completed_at, ns, k) > (1, ''::bytea, ''::bytea)
           AND expires_at > 0
         ORDER BY completed_at, ns, k LIMIT 10000"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan: String = plan.into_iter().map(|(l,)| l + "\n").collect();
    assert!(plan.contains(&format!("{table}_completed")), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_cold_tier_catches_a_loaded_filter_up() {
    let url = services::url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let cold = match SqlStore::builder(&url)
        .table("idem_catch_up")
        .connect()
        .await
    {
        Ok(store) => store,
        Err(e) => return services::absent("MariaDB", &url, e).unwrap_or(()),
    };
    // Only this run's records: the filter is sized for them.
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    sqlx::query("TRUNCATE idem_catch_up")
        .execute(&pool)
        .await
        .unwrap();
    caught_up_with_what_came_after(&cold, &format!("c{}", std::process::id())).await;
}

/// Redis cannot list its records by completion time: a loaded filter is
/// fed every key, never trusted on a partial feed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_that_cannot_list_by_time_feeds_every_key() {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let tier = match idem_redis::RedisStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => return services::absent("Redis", &url, e).unwrap_or(()),
    };
    let now = SystemClock.now();
    let after: Option<&CompletedKey> = None;
    assert_eq!(tier.completed_since(now, after, 10).await.unwrap(), None);
    let ns = format!("r{}", std::process::id());
    import(&tier, (0..20).map(|i| key(&ns, i)), now).await;
    let filter = KeyFilter::new(&config(), now).unwrap();
    filter
        .rebuild(
            std::iter::empty::<Result<Key, std::convert::Infallible>>(),
            None,
            |_, _| {},
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, now).unwrap();
    let loaded = KeyFilter::load_snapshot(&path, &config(), now).unwrap();
    let fed = loaded.rebuild_from_tier(&tier, |_, _| {}).await.unwrap();
    assert!(
        matches!(fed, Fed::Rebuilt { keys } if keys >= 20),
        "{fed:?}"
    );
    for i in 0..20 {
        assert_eq!(loaded.check(&key(&ns, i)), Membership::Maybe);
    }
}

/// A catch-up dropped mid-way leaves the filter answering "maybe", never
/// trusted on a partial feed, and a later one makes it ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_dropped_mid_way_leaves_the_filter_not_ready_and_a_retry_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let cold = idem_file::FileStore::open(dir.path().join("cold")).unwrap();
    let now = SystemClock.now();
    let filter = KeyFilter::new(&config(), now).unwrap();
    filter
        .rebuild(
            std::iter::empty::<Result<Key, std::convert::Infallible>>(),
            None,
            |_, _| {},
        )
        .unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, now).unwrap();
    let later = now.after(Duration::from_millis(10));
    import(&cold, (0..20_000).map(|i| key("late", i)), later).await;

    let loaded = KeyFilter::load_snapshot(&path, &config(), later).unwrap();
    for polls in [1, 3, 10] {
        let mut feed = std::pin::pin!(loaded.rebuild_from_tier(&cold, |_, _| {}));
        for _ in 0..polls {
            tokio::task::yield_now().await;
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if feed.as_mut().poll(&mut cx).is_ready() {
                panic!("20 000 keys off the worker threads are not fed in {polls} polls");
            }
        }
        // Dropped here, mid-way.
    }
    assert!(
        matches!(loaded.readiness(), Readiness::NeedsRebuild { .. }),
        "{:?}",
        loaded.readiness()
    );
    assert_eq!(loaded.check(&key("never", 1)), Membership::Maybe);
    let fed = loaded.rebuild_from_tier(&cold, |_, _| {}).await.unwrap();
    assert_eq!(fed, Fed::CaughtUp { keys: 20_000 });
    assert_eq!(loaded.readiness(), Readiness::Ready);
    assert_eq!(loaded.check(&key("late", 19_999)), Membership::Maybe);
}
