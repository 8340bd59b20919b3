//! The Redis store passes the conformance kit on a real 3-master Redis
//! Cluster (`IDEM_TEST_REDIS_CLUSTER_URLS`, default
//! `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002`;
//! `scripts/redis-cluster` starts one), as a store and as a tier.

use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::{Subject, TimeControl};

mod support;

async fn subject() -> Option<Subject<RedisStore>> {
    let store = support::test_cluster().await?;
    Some(Subject::new(
        store,
        TimeControl::Real {
            unit: Duration::from_millis(100),
        },
    ))
}

idem_testkit::conformance_tests!(subject());

mod tier {
    use super::*;

    idem_testkit::tier_conformance_tests!(subject());
}

/// The operator's cases: counting, listing and purging namespaces.
mod admin {
    use super::*;

    idem_testkit::admin_conformance_tests!(subject());
}
