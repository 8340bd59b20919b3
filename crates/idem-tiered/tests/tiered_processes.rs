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
