//! Nothing acknowledged is lost to a crash of the process: with a memory
//! hot tier a completion is answered once the cold tier holds it (unless
//! the caller opts into the window, which is then counted); with a hot
//! tier that outlives the process, the hot copy keeps its whole retention
//! until the cold tier has it, and what a crashed process left on the hot
//! tier's list of handovers is moved by the next one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_core::tier::Tier;
use idem_core::{Begin, FencingToken, Key, Lease, MemoryStore, Record, Store, SystemClock};
use idem_core::{Clock, StoreError};
use idem_testkit::faults::Switchable;
use idem_testkit::services;
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};
use idem_tiered::{Acknowledgement, TieredStore};

const HOUR: Duration = Duration::from_secs(3600);

fn key(ns: &str, i: usize) -> Key {
    Key::new(ns, format!("order-{i:06}")).unwrap()
}

fn claimed(b: Begin) -> FencingToken {
    match b {
        Begin::Acquired(c) => c.token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn claim<S: Store>(store: &S, k: &Key) -> FencingToken {
    claimed(store.begin(k, None, Lease::from_secs(60)).await.unwrap())
}

/// Claims `n` keys of `ns`, switches `cold` off, then completes them (with
/// an hour of retention): each answered done.
async fn complete_with_cold_down<S: Store, C: Store>(
    store: &S,
    cold: &Switchable<C>,
    ns: &str,
    n: usize,
) -> Vec<FencingToken> {
    let mut tokens = Vec::new();
    for i in 0..n {
        tokens.push(claim(store, &key(ns, i)).await);
    }
    cold.set_down(true);
    for (i, token) in tokens.iter().enumerate() {
        let k = key(ns, i);
        let done = store.complete(&k, *token, Some(Bytes::from_static(b"ok")), HOUR);
        assert!(
            !done.await.unwrap().is_stale(),
            "acknowledged with the cold tier down"
        );
    }
    tokens
}

async fn in_cold<C: Store>(cold: &C, k: &Key, token: FencingToken) -> bool {
    matches!(cold.get(k).await.unwrap(), Some(Record::Completed(c)) if c.token == token)
}

/// A ready filter, as after a rebuild from an empty cold tier.
fn ready_filter() -> Arc<KeyFilter> {
    let config = FilterConfig::new(FilterSeed::new(9), 100_000, Duration::from_secs(24 * 3600));
    let filter = KeyFilter::new(&config, SystemClock.now()).unwrap();
    filter
        .rebuild(
            std::iter::empty::<Result<Key, StoreError>>(),
            Some(0),
            |_, _| {},
        )
        .unwrap();
    Arc::new(filter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_memory_hot_tier_every_acknowledged_completion_is_in_the_cold_tier() {
    let cold = MemoryStore::new();
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .open()
        .await
        .unwrap();
    assert_eq!(store.acknowledgement(), Acknowledgement::AfterCold);
    // Sixteen callers at once, long and short retentions alike: a crash of
    // the process right after any answer would lose only the memory tier.
    let callers: Vec<_> = (0..16)
        .map(|c| {
            let (store, cold) = (store.clone(), cold.clone());
            tokio::spawn(async move {
                for i in 0..40 {
                    let k = key("acked", c * 1_000 + i);
                    let token = claim(&store, &k).await;
                    let retention = if i % 2 == 0 {
                        HOUR
                    } else {
                        Duration::from_secs(60)
                    };
                    let done = store
                        .complete(&k, token, Some(Bytes::from_static(b"ok")), retention)
                        .await
                        .unwrap();
                    assert!(!done.is_stale());
                    assert!(
                        in_cold(&cold, &k, token).await,
                        "{k} was acknowledged before the cold tier held it"
                    );
                }
            })
        })
        .collect();
    for c in callers {
        c.await.unwrap();
    }
    assert_eq!(store.write_behind().unprotected, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_sends_retentions_the_hot_tier_covers_to_the_cold_tier_too() {
    // A hot tier that outlives the process (the file store here) keeps a
    // short retention on its own, unless write-through asks for the cold
    // tier; a memory one always needs the cold tier.
    let dir = tempfile::tempdir().unwrap();
    let hot = idem_file::FileStore::builder(dir.path()).open().unwrap();
    let cold = MemoryStore::new();
    let store = TieredStore::builder(hot, cold.clone())
        .write_through(true)
        .open()
        .await
        .unwrap();
    assert_eq!(store.acknowledgement(), Acknowledgement::AfterCold);
    let memory_cold = MemoryStore::new();
    let memory = TieredStore::builder(MemoryStore::new(), memory_cold.clone())
        .write_through(true)
        .ack_before_cold(true)
        .open()
        .await
        .unwrap();
    assert_eq!(memory.acknowledgement(), Acknowledgement::AfterCold);
    let ten_minutes = Duration::from_secs(600);
    for i in 0..50 {
        let k = key("through", i);
        let token = claim(&store, &k).await;
        assert!(
            !store
                .complete(&k, token, None, ten_minutes)
                .await
                .unwrap()
                .is_stale()
        );
        assert!(in_cold(&cold, &k, token).await, "{k} not in the cold tier");
        let token = claim(&memory, &k).await;
        assert!(
            !memory
                .complete(&k, token, None, ten_minutes)
                .await
                .unwrap()
                .is_stale()
        );
        assert!(
            in_cold(&memory_cold, &k, token).await,
            "{k} not in the cold tier"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledging_before_the_cold_tier_counts_what_a_crash_would_lose() {
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .ack_before_cold(true)
        .open()
        .await
        .unwrap();
    assert_eq!(
        store.acknowledgement(),
        Acknowledgement::BeforeColdUnprotected
    );
    complete_with_cold_down(&store, &cold, "window", 5).await;
    let stats = store.write_behind();
    assert_eq!((stats.pending, stats.unprotected), (5, 5), "{stats:?}");
    cold.set_down(false);
    store.flush().await;
    let stats = store.write_behind();
    assert_eq!((stats.pending, stats.unprotected), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_copy_outlives_its_hot_retention_until_the_cold_tier_has_it() {
    // Queued behind an import that keeps failing, longer than the hot
    // retention: neither in the filter nor in the cold tier yet, so only
    // the hot copy can answer for them.
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .hot_retention(Duration::from_secs(1))
        .ack_before_cold(true)
        .batch(2)
        .filter(ready_filter())
        .open()
        .await
        .unwrap();
    complete_with_cold_down(&store, &cold, "outlives", 10).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    for i in 0..10 {
        let again = store
            .begin(&key("outlives", i), None, Lease::from_secs(60))
            .await;
        assert!(
            matches!(again, Ok(Begin::Completed { .. })),
            "key {i} past the hot retention, not yet in the cold tier: {again:?}"
        );
    }
    cold.set_down(false);
    store.flush().await;
    // Moved: the hot copies last the hot retention from their completion,
    // long past, and the cold tier answers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = cold.calls().get.load(std::sync::atomic::Ordering::SeqCst);
    for i in 0..10 {
        let again = store
            .begin(&key("outlives", i), None, Lease::from_secs(60))
            .await;
        assert!(matches!(again, Ok(Begin::Completed { .. })), "{again:?}");
    }
    assert!(
        cold.calls().get.load(std::sync::atomic::Ordering::SeqCst) >= asked + 10,
        "answered from the cold tier once moved"
    );
}

/// A name no earlier run used: records outlive a test in the shared Redis.
fn unique(prefix: &str) -> String {
    let nanos = std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{prefix}{}x{nanos}", std::process::id())
}

#[test]
fn a_redis_hot_tier_keeps_what_a_crashed_process_acknowledged_and_the_next_moves_it() {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Err(e) = main.block_on(idem_redis::RedisStore::connect(&url)) {
        return services::absent("Redis", &url, e).unwrap_or(());
    }
    let ns = unique("crash");
    let list = unique("list");
    let cold = Switchable::new(MemoryStore::new());

    // The process that crashes: its own runtime, dropped with every task
    // of the store (the write-behind queue, the Redis connection) in it.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tokens: Vec<FencingToken> = doomed.block_on(async {
        let hot = idem_redis::RedisStore::connect(&url).await.unwrap();
        let store = TieredStore::builder(hot, cold.clone())
            .hot_retention(Duration::from_secs(1))
            .handover_list(list.clone())
            .open()
            .await
            .unwrap();
        assert_eq!(store.acknowledgement(), Acknowledgement::AfterHot);
        complete_with_cold_down(&store, &cold, &ns, 20).await
    });
    drop(doomed);

    main.block_on(async {
        // Past the hot retention: the hot copies keep the whole retention
        // while the cold tier does not have them.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let hot = idem_redis::RedisStore::connect(&url).await.unwrap();
        for (i, token) in tokens.iter().enumerate() {
            assert!(
                in_cold(&hot, &key(&ns, i), *token).await,
                "key {i} left Redis"
            );
        }
        // The next process moves them, once listed for the grace.
        cold.set_down(false);
        let store = TieredStore::builder(hot.clone(), cold.clone())
            .hot_retention(Duration::from_secs(1))
            .handover_list(list.clone())
            .handover_grace(Duration::from_millis(200))
            .open()
            .await
            .unwrap();
        let started = Instant::now();
        loop {
            let mut moved = 0;
            for (i, token) in tokens.iter().enumerate() {
                moved += usize::from(in_cold(cold.inner(), &key(&ns, i), *token).await);
            }
            if moved == tokens.len() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{moved} of {} moved to the cold tier",
                tokens.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        store.flush().await;
        assert!(
            store.write_behind().swept >= 20,
            "{:?}",
            store.write_behind()
        );
        // Moved, the hot copies last the hot retention from completion
        // (long past): gone from Redis, answered from the cold tier, and
        // off the list.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for i in 0..tokens.len() {
            assert_eq!(hot.get(&key(&ns, i)).await.unwrap(), None, "key {i}");
            let again = store.begin(&key(&ns, i), None, Lease::from_secs(60)).await;
            assert!(matches!(again, Ok(Begin::Completed { .. })), "{again:?}");
        }
        let left = hot.due_handovers(&list, Duration::ZERO, 100).await.unwrap();
        assert!(left.is_empty(), "still listed: {left:?}");
    });
}
