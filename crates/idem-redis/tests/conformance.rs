//! The Redis store passes the conformance kit on a real Redis
//! (`IDEM_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`).

use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::{Subject, TimeControl, services};

async fn subject() -> Option<Subject<RedisStore>> {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    match store {
        // Redis keeps time: the suite sleeps, 100 ms a step.
        Ok(store) => Some(Subject::new(
            store,
            TimeControl::Real {
                unit: Duration::from_millis(100),
            },
        )),
        Err(e) => services::absent("Redis", &url, e),
    }
}

idem_testkit::conformance_tests!(subject());
