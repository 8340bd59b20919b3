//! The Redis store passes the conformance kit on a real Redis
//! (`IDEM_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`), as a store
//! and as a tier.

use std::time::Duration;

use idem_redis::{RedisStore, RedisStoreBuilder};
use idem_testkit::{Subject, TimeControl, services};

async fn subject() -> Option<Subject<RedisStore>> {
    connect(|b| b).await
}

async fn connect(
    configure: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
) -> Option<Subject<RedisStore>> {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let store = configure(RedisStore::builder(&url).timeout(Duration::from_secs(5)))
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

/// The same without batching single calls together, and with the commands
/// of a Redis before 7.0.
mod one_call_each_plain_commands {
    use super::*;

    async fn subject() -> Option<Subject<RedisStore>> {
        connect(|b| b.coalesce(false).plain_commands()).await
    }

    idem_testkit::conformance_tests!(subject());
}

mod tier {
    use super::*;

    idem_testkit::tier_conformance_tests!(subject());
}

/// The operator's cases: counting, listing and purging namespaces.
mod admin {
    use super::*;

    idem_testkit::admin_conformance_tests!(subject());
}
