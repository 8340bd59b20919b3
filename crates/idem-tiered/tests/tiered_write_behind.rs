//! What the tiered store promises beyond the conformance kit: completions
//! reach the cold tier and are replayed from it, a full queue holds
//! `complete` back and loses nothing, a caller who leaves cannot cut a
//! completion in half, tokens never go back, and the filter spares the cold
//! tier.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use idem_core::tier::{ImportItem, Tier};
use idem_core::{
    Begin, Clock, Completed, FencingToken, Key, Lease, MemoryStore, Record, Store, StoreError,
    SystemClock,
};
use idem_testkit::faults::Switchable;
use idem_tiered::TieredStore;
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};

const HOUR: Duration = Duration::from_secs(3600);

fn key(i: usize) -> Key {
    Key::new("tiered", format!("order-{i:06}")).unwrap()
}

fn claimed(b: Begin) -> FencingToken {
    match b {
        Begin::Acquired(c) => c.token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn deliver<S: Store>(store: &S, k: &Key, outcome: &'static str) -> FencingToken {
    let token = claimed(store.begin(k, None, Lease::from_secs(30)).await.unwrap());
    let done = store
        .complete(k, token, Some(Bytes::from_static(outcome.as_bytes())), HOUR)
        .await
        .unwrap();
    assert!(!done.is_stale());
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_reach_the_cold_tier_and_are_replayed_from_it() {
    let cold = MemoryStore::new();
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .hot_retention(Duration::from_secs(1))
        .batch(64)
        .open()
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for i in 0..1_000 {
        tokens.push(deliver(&store, &key(i), "shipped").await);
    }
    store.flush().await;
    let stats = store.write_behind();
    assert_eq!(
        (stats.pending, stats.imported, stats.lost),
        (0, 1_000, 0),
        "{stats:?}"
    );
    for (i, token) in tokens.iter().enumerate() {
        match cold.get(&key(i)).await.unwrap() {
            Some(Record::Completed(c)) => {
                assert_eq!(c.token, *token);
                assert_eq!(
                    c.expires_at.since(c.completed_at),
                    HOUR,
                    "the cold copy keeps the whole retention"
                );
            }
            other => panic!("key {i} is not in the cold tier: {other:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for i in 0..1_000 {
        match store
            .begin(&key(i), None, Lease::from_secs(30))
            .await
            .unwrap()
        {
            Begin::Completed { outcome, .. } => {
                assert_eq!(outcome.as_deref(), Some(&b"shipped"[..]))
            }
            other => panic!("key {i} after the hot tier forgot it: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_complete_back_and_loses_nothing() {
    let cold = Switchable::new(MemoryStore::new());
    // Answering before the cold tier has a record is what lets completions
    // run ahead of it into the queue.
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .hot_retention(Duration::from_secs(60))
        .ack_before_cold(true)
        .queue_capacity(4)
        .batch(2)
        .open()
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for i in 0..10 {
        let claim = store.begin(&key(i), None, Lease::from_secs(30)).await;
        tokens.push(claimed(claim.unwrap()));
    }
    cold.set_down(true);
    // The queue holds 4 and the importing task at most a batch of 2: a
    // few completions go through, then one waits for room.
    let mut held = None;
    for (i, token) in tokens.iter().enumerate() {
        let k = key(i);
        let call = store.complete(&k, *token, None, HOUR);
        match tokio::time::timeout(Duration::from_millis(300), call).await {
            Ok(done) => assert!(!done.unwrap().is_stale()),
            Err(_) => {
                held = Some(i);
                break;
            }
        }
    }
    let held = held.expect("a full queue makes complete wait");
    assert!(
        (4..=6).contains(&held),
        "complete waited at the {held}th record"
    );
    assert!(
        store
            .get(&key(held))
            .await
            .unwrap()
            .is_some_and(|r| !matches!(r, Record::Completed(_))),
        "a complete that waited for room changed nothing"
    );
    cold.set_down(false);
    for (i, token) in tokens.iter().enumerate().skip(held) {
        let done = store.complete(&key(i), *token, None, HOUR).await.unwrap();
        assert!(!done.is_stale());
    }
    store.flush().await;
    let stats = store.write_behind();
    assert_eq!(
        (stats.imported, stats.lost, stats.refused),
        (10, 0, 0),
        "{stats:?}"
    );
    assert!(
        stats.retries > 0,
        "the cold tier's failures were retried: {stats:?}"
    );
    for i in 0..10 {
        assert!(
            cold.inner().get(&key(i)).await.unwrap().is_some(),
            "key {i} reached the cold tier"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_whose_caller_left_still_reaches_the_cold_tier() {
    let cold = MemoryStore::new();
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .hot_retention(Duration::from_secs(60))
        .open()
        .await
        .unwrap();
    for i in 0..50 {
        let k = key(i);
        let token = claimed(store.begin(&k, None, Lease::from_secs(30)).await.unwrap());
        let mut call = Box::pin(store.complete(&k, token, Some(Bytes::from_static(b"ok")), HOUR));
        // One poll starts it; then the caller leaves.
        let _ = call.as_mut().now_or_never();
        drop(call);
        // The holder's retry settles it either way.
        let again = store
            .complete(&k, token, Some(Bytes::from_static(b"ok")), HOUR)
            .await;
        assert!(!again.unwrap().is_stale(), "key {i}");
    }
    store.flush().await;
    for i in 0..50 {
        assert!(
            matches!(cold.get(&key(i)).await.unwrap(), Some(Record::Completed(_))),
            "key {i} reached the cold tier"
        );
    }
}

#[tokio::test]
async fn tokens_never_go_back_below_what_the_cold_tier_holds() {
    let cold = MemoryStore::new();
    let now = SystemClock.now();
    let old = Completed {
        token: FencingToken::new(1_000_000_000),
        fingerprint: None,
        outcome: None,
        completed_at: now,
        expires_at: now.after(HOUR),
    };
    cold.import_many(&[ImportItem {
        key: key(0),
        record: old,
    }])
    .await
    .unwrap();
    // A fresh memory hot tier starts at token 1 on its own.
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .open()
        .await
        .unwrap();
    let token = claimed(
        store
            .begin(&key(1), None, Lease::from_secs(30))
            .await
            .unwrap(),
    );
    assert!(token.get() > 1_000_000_000, "token {token:?} went back");
    // And what it hands out is reserved in the cold tier before anyone
    // hears of it, so a restart after a crash starts above it too.
    let reserved = cold.token_high_water().await.unwrap();
    assert!(
        reserved >= token,
        "reserved {reserved:?} below issued {token:?}"
    );
    let mut last = token;
    for i in 2..70_000 {
        last = claimed(
            store
                .begin(&key(i), None, Lease::from_secs(30))
                .await
                .unwrap(),
        );
    }
    assert!(cold.token_high_water().await.unwrap() >= last);
}

#[tokio::test]
async fn the_filter_spares_the_cold_tier_for_new_keys() {
    let cold = Switchable::new(MemoryStore::new());
    let config = FilterConfig::new(FilterSeed::new(42), 100_000, Duration::from_secs(24 * 3600));
    let filter = Arc::new(KeyFilter::new(&config, SystemClock.now()).unwrap());
    filter
        .rebuild(
            std::iter::empty::<Result<Key, std::io::Error>>(),
            Some(0),
            |_, _| {},
        )
        .unwrap();
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .hot_retention(Duration::from_secs(1))
        .filter(filter.clone())
        .open()
        .await
        .unwrap();
    for i in 0..2_000 {
        deliver(&store, &key(i), "ok").await;
    }
    let asked = cold.calls().get.load(Ordering::SeqCst);
    assert!(
        asked <= 10,
        "new keys went to the cold tier {asked} times in 2 000"
    );
    store.flush().await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // Once the hot tier has forgotten them, duplicates are found in the
    // cold tier: the filter never calls a seen key new.
    for i in 0..2_000 {
        let again = store
            .begin(&key(i), None, Lease::from_secs(30))
            .await
            .unwrap();
        assert!(
            matches!(again, Begin::Completed { .. }),
            "key {i}: {again:?}"
        );
    }
    assert!(cold.calls().get.load(Ordering::SeqCst) >= asked + 2_000);
}

#[tokio::test]
async fn a_cold_tier_that_cannot_answer_leaves_the_key_free() {
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .open()
        .await
        .unwrap();
    cold.set_down(true);
    let failed = store.begin(&key(0), None, Lease::from_secs(30)).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    cold.set_down(false);
    claimed(
        store
            .begin(&key(0), None, Lease::from_secs(30))
            .await
            .unwrap(),
    );
}

/// A cold tier whose imports panic.
#[derive(Clone)]
struct Panicking(MemoryStore);

impl idem_core::layer::StoreWrapper for Panicking {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
}

impl Tier for Panicking {
    async fn import_many(
        &self,
        _: &[ImportItem],
    ) -> Result<Vec<idem_core::tier::Imported>, StoreError> {
        panic!("a bug in the cold tier")
    }
    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        self.0.raise_token_floor(floor).await
    }
    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        self.0.token_high_water().await
    }
    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.0.completed_keys(after, limit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_cold_tier_wedges_no_one() {
    let store = TieredStore::builder(MemoryStore::new(), Panicking(MemoryStore::new()))
        .hot_retention(Duration::from_secs(60))
        .open()
        .await
        .unwrap();
    // The completion waits for the cold tier, whose import panics: it
    // fails instead of waiting for ever.
    let token = claimed(
        store
            .begin(&key(0), None, Lease::from_secs(30))
            .await
            .unwrap(),
    );
    let done = tokio::time::timeout(
        Duration::from_secs(5),
        store.complete(&key(0), token, None, HOUR),
    )
    .await
    .expect("complete answers");
    assert!(matches!(done, Err(StoreError::Unavailable(_))), "{done:?}");
    // The importing task is gone: flush returns, and a completion fails at
    // once instead of waiting for room.
    tokio::time::timeout(Duration::from_secs(5), store.flush())
        .await
        .expect("flush returns once the importing task has stopped");
    let token = claimed(
        store
            .begin(&key(1), None, Lease::from_secs(30))
            .await
            .unwrap(),
    );
    let done = tokio::time::timeout(
        Duration::from_secs(5),
        store.complete(&key(1), token, None, Duration::from_secs(10)),
    )
    .await
    .expect("complete answers");
    assert!(matches!(done, Err(StoreError::Unavailable(_))), "{done:?}");
    // Claims still work: taken, released, taken again.
    let held = claimed(
        store
            .begin(&key(3), None, Lease::from_secs(30))
            .await
            .unwrap(),
    );
    assert!(!store.release(&key(3), held).await.unwrap().is_stale());
    claimed(
        store
            .begin(&key(3), None, Lease::from_secs(30))
            .await
            .unwrap(),
    );
}
