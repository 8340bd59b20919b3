//! The tiered store passes the conformance kit: with every completion also
//! in the cold tier and the hot tier keeping it the shortest time it may
//! (so most replays after time passes come back from the cold tier), with a
//! key filter in front of the cold tier, with the default hot retention,
//! and on a memory hot tier over the file store and Redis over PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, ManualClock, MemoryStore, Timestamp};
use idem_testkit::{Subject, TimeControl};
use idem_tiered::TieredStore;
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};

fn memory(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder().clock(clock.clone()).build()
}

/// An empty filter, ready (rebuilt from an empty cold tier).
fn filter(now: Timestamp) -> Arc<KeyFilter> {
    let config = FilterConfig::new(
        FilterSeed::new(7),
        100_000,
        Duration::from_secs(30 * 24 * 3600),
    );
    let filter = KeyFilter::new(&config, now).unwrap();
    filter
        .rebuild(
            std::iter::empty::<Result<idem_core::Key, std::io::Error>>(),
            Some(0),
            |_, _| {},
        )
        .unwrap();
    Arc::new(filter)
}

/// A memory hot tier over a memory cold tier on one manual clock: the hot
/// tier keeps records the shortest time it may (one step), every
/// completion waits for the cold tier, and the filter is there or not.
async fn memory_over_memory(filtered: bool) -> Subject<TieredStore<MemoryStore, MemoryStore>> {
    let clock = ManualClock::new();
    let mut builder = TieredStore::builder(memory(&clock), memory(&clock))
        .clock(clock.clone())
        .hot_retention(idem_tiered::MIN_HOT_RETENTION)
        .write_through(true);
    if filtered {
        builder = builder.filter(filter(clock.now()));
    }
    Subject::new(builder.open().await.unwrap(), TimeControl::Manual(clock))
}

mod from_the_cold_tier {
    idem_testkit::conformance_tests!(super::memory_over_memory(false));
}

mod behind_a_filter {
    idem_testkit::conformance_tests!(super::memory_over_memory(true));
}

mod hot_by_default {
    use super::*;

    idem_testkit::conformance_tests!(async {
        let clock = ManualClock::new();
        let store = TieredStore::builder(memory(&clock), memory(&clock))
            .clock(clock.clone())
            .open()
            .await
            .unwrap();
        Subject::new(store, TimeControl::Manual(clock))
    });
}

/// A memory hot tier over the embedded file store, on one manual clock.
mod memory_over_file {
    use super::*;

    idem_testkit::conformance_tests!(async {
        let clock = ManualClock::new();
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap()
            .keep();
        let cold = idem_file::FileStore::builder(&dir)
            .clock(clock.clone())
            .open()
            .unwrap();
        let store = TieredStore::builder(memory(&clock), cold)
            .clock(clock.clone())
            .hot_retention(Duration::from_secs(1))
            .write_through(true)
            .filter(filter(clock.now()))
            .open()
            .await
            .unwrap();
        Subject::new(store, TimeControl::Manual(clock))
    });
}

/// A Redis hot tier over PostgreSQL: both keep time in their servers, so
/// the suite sleeps, 100 ms a step; the hot tier keeps records 10 steps.
mod redis_over_postgres {
    use super::*;
    use idem_testkit::services;

    async fn subject() -> Option<Subject<TieredStore<idem_redis::RedisStore, idem_sql::SqlStore>>> {
        let redis_url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let hot = match idem_redis::RedisStore::builder(&redis_url).connect().await {
            Ok(s) => s,
            Err(e) => return services::absent("Redis", &redis_url, e),
        };
        let pg = services::url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let cold = match idem_sql::SqlStore::builder(&pg)
            .table("idem_tiered_conformance")
            .connect()
            .await
        {
            Ok(s) => s,
            Err(e) => return services::absent("PostgreSQL", &pg, e),
        };
        let store = TieredStore::builder(hot, cold)
            .hot_retention(Duration::from_secs(1))
            .handover_list("idem_tiered_conformance")
            .write_through(true)
            .open()
            .await
            .unwrap();
        Some(Subject::new(
            store,
            TimeControl::Real {
                unit: Duration::from_millis(100),
            },
        ))
    }

    idem_testkit::conformance_tests!(subject());
}
