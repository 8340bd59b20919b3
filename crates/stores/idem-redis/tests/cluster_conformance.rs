//! The Redis store passes the conformance kit on a real 3-master Redis
//! Cluster (`IDEM_TEST_REDIS_CLUSTER_URLS`, default
//! `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002`;
//! `scripts/redis-cluster` starts one).

use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::{Subject, TimeControl, services};

async fn subject() -> Option<Subject<RedisStore>> {
    let urls = services::url(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002",
    );
    let nodes: Vec<&str> = urls.split(',').collect();
    let store = RedisStore::cluster_builder(&nodes)
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    match store {
        Ok(store) => Some(Subject::new(
            store,
            TimeControl::Real {
                unit: Duration::from_millis(100),
            },
        )),
        Err(e) => services::absent("Redis Cluster", &urls, e),
    }
}

idem_testkit::conformance_tests!(subject());
