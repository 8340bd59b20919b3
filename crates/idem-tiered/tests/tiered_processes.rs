//! Several processes on one tiered store: memory hot tiers share no
//! claims, so a second one in front of the same SQL cold tier is refused
//! (saying to share a Redis hot tier), and let in once the first is gone.

use idem_core::{MemoryStore, StoreError};
use idem_sql::SqlStore;
use idem_testkit::services;
use idem_tiered::TieredStore;

async fn cold(var: &str, default: &str, service: &str, table: &str) -> Option<SqlStore> {
    let url = services::url(var, default);
    match SqlStore::builder(&url).table(table).connect().await {
        Ok(store) => Some(store),
        Err(e) => services::absent(service, &url, e),
    }
}

async fn a_second_memory_front_is_refused(cold: SqlStore, other: SqlStore) {
    let first = TieredStore::builder(MemoryStore::new(), cold.clone())
        .open()
        .await
        .unwrap();
    // Another process: its own connections to the same tables.
    let second = TieredStore::builder(MemoryStore::new(), other.clone())
        .open()
        .await;
    match second {
        Err(StoreError::Unavailable(why)) => {
            let why = why.to_string();
            assert!(why.contains("--hot-store redis://"), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("two memory hot tiers in front of one cold tier"),
    }
    drop(first);
    // The hold goes with the store (its connection closes at once).
    let started = std::time::Instant::now();
    loop {
        match TieredStore::builder(MemoryStore::new(), other.clone())
            .open()
            .await
        {
            Ok(_) => break,
            Err(e) if started.elapsed() < std::time::Duration::from_secs(10) => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the first store is gone, yet: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_memory_hot_tier_in_front_of_postgres_is_refused() {
    let (var, default) = (
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let Some(a) = cold(var, default, "PostgreSQL", "idem_sole_front").await else {
        return;
    };
    let b = cold(var, default, "PostgreSQL", "idem_sole_front")
        .await
        .unwrap();
    a_second_memory_front_is_refused(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_memory_hot_tier_in_front_of_mysql_is_refused() {
    let (var, default) = ("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let Some(a) = cold(var, default, "MySQL", "idem_sole_front").await else {
        return;
    };
    let b = cold(var, default, "MySQL", "idem_sole_front")
        .await
        .unwrap();
    a_second_memory_front_is_refused(a, b).await;
}

/// A name no earlier run used: records outlive a test in the shared Redis.
fn unique(prefix: &str) -> String {
    let nanos = std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{prefix}{}x{nanos}", std::process::id())
}

/// A Redis store: standalone for one URL, a cluster for several
/// (comma-separated).
async fn connect(urls: &str) -> Result<idem_redis::RedisStore, idem_redis::ConnectError> {
    let nodes: Vec<&str> = urls.split(',').collect();
    match nodes[..] {
        [one] => idem_redis::RedisStore::builder(one).connect().await,
        _ => {
            idem_redis::RedisStore::cluster_builder(&nodes)
                .connect()
                .await
        }
    }
}

/// Waits until the shared filter of `store` says it is ready.
async fn ready<C: idem_core::tier::Tier + Clone>(store: &TieredStore<idem_redis::RedisStore, C>) {
    use idem_core::tier::Tier;
    let filter = store.shared_filter().expect("a shared filter").clone();
    let started = std::time::Instant::now();
    while !store.hot().filter_ready(&filter).await.unwrap() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the shared filter never became ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Two processes (two stores, each with its own Redis connection and its
/// own view of the filter) in front of one Redis and one cold tier: a key
/// one completed, moved and forgot in Redis is never new to the other.
async fn two_processes_share_one_filter(hot: &str, cold: SqlStore, other_cold: SqlStore) {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use idem_core::{Begin, Key, Lease, Store};
    use idem_testkit::faults::Switchable;
    use idem_tiered::filter::{FilterConfig, FilterSeed};

    let name = unique("shared");
    let config = FilterConfig::new(FilterSeed::new(0x51ab), 100_000, Duration::from_secs(3600));
    let open = |cold| {
        let (name, config) = (name.clone(), config.clone());
        async move {
            let hot = connect(hot).await.unwrap();
            TieredStore::builder(hot, cold)
                .hot_retention(Duration::from_secs(1))
                .handover_list(name)
                .shared_filter(config)
                .open()
                .await
                .unwrap()
        }
    };
    let a = open(Switchable::new(cold)).await;
    let b_cold = Switchable::new(other_cold);
    let b = open(b_cold.clone()).await;
    ready(&a).await;
    let ns = unique("ns");
    let key = |i: usize| Key::new(ns.as_str(), format!("k-{i}")).unwrap();
    for i in 0..50 {
        let token = match a.begin(&key(i), None, Lease::from_secs(60)).await.unwrap() {
            Begin::Acquired(c) => c.token,
            other => panic!("{other:?}"),
        };
        let k = key(i);
        let done = a.complete(&k, token, None, Duration::from_secs(3600));
        assert!(!done.await.unwrap().is_stale());
    }
    a.flush().await;
    // Past the hot retention, the hot copies are gone: only the cold tier
    // knows the keys, and only the shared filter tells B to ask it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for i in 0..50 {
        let again = b.begin(&key(i), None, Lease::from_secs(60)).await;
        assert!(
            matches!(again, Ok(Begin::Completed { .. })),
            "key {i}, completed through A, was new to B: {again:?}"
        );
    }
    // New keys B has never seen skip the cold tier.
    let asked = b_cold.calls().get.load(Ordering::SeqCst);
    for i in 1_000..1_200 {
        let fresh = b.begin(&key(i), None, Lease::from_secs(60)).await.unwrap();
        assert!(matches!(fresh, Begin::Acquired(_)), "{fresh:?}");
    }
    let more = b_cold.calls().get.load(Ordering::SeqCst) - asked;
    assert!(
        more <= 5,
        "{more} of 200 new keys were looked up in the cold tier"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_redis_and_postgres_share_one_filter() {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    two_processes_on(&url, "Redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_a_redis_cluster_and_postgres_share_one_filter() {
    let urls = services::url(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002",
    );
    two_processes_on(&urls, "Redis Cluster").await;
}

async fn two_processes_on(url: &str, service: &str) {
    if let Err(e) = connect(url).await {
        return services::absent(service, url, e).unwrap_or(());
    }
    let (var, default) = (
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let Some(a) = cold(var, default, "PostgreSQL", "idem_shared_filter").await else {
        return;
    };
    let b = cold(var, default, "PostgreSQL", "idem_shared_filter")
        .await
        .unwrap();
    two_processes_share_one_filter(url, a, b).await;
}
