//! When a tier fails part way, the tiered store leaves nothing half done:
//! a batch whose cold check fails holds no claims, a batch that fails
//! after completing some records still moves them, a flush with the cold
//! tier down ends within its bound, and a read the hot tier can answer
//! does not need the cold tier.

use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_core::{
    Begin, BeginItem, CompleteItem, FencingToken, Key, Lease, MemoryStore, Record, Store,
    StoreError,
};
use idem_testkit::faults::Switchable;
use idem_tiered::TieredStore;

const HOUR: Duration = Duration::from_secs(3600);

fn key(i: usize) -> Key {
    Key::new("failures", format!("order-{i:06}")).unwrap()
}

fn claimed(b: &Begin) -> FencingToken {
    match b {
        Begin::Acquired(c) => c.token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn batch(range: std::ops::Range<usize>, lease: Lease) -> Vec<BeginItem> {
    range
        .map(|i| BeginItem {
            key: key(i),
            fingerprint: None,
            lease,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_batch_whose_cold_check_fails_holds_no_claims() {
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .open()
        .await
        .unwrap();
    // Ten minutes of lease: a claim left behind would hold its key that
    // long.
    let long = Lease::from_secs(600);
    cold.set_down(true);
    let failed = store.begin_many(&batch(0..10_000, long)).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    cold.set_down(false);
    let again = store.begin_many(&batch(0..10_000, long)).await.unwrap();
    for (i, answer) in again.iter().enumerate() {
        assert!(
            matches!(answer, Begin::Acquired(_)),
            "key {i} was still held: {answer:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_batch_that_fails_part_way_still_moves_what_it_completed() {
    // A hot tier that outlives the process answers before the cold tier.
    // One item of the batch is a stale retry, and reading the cold tier for
    // it fails: the batch answers the error, yet the record it completed
    // reaches the cold tier all the same.
    let dir = tempfile::tempdir().unwrap();
    let hot = idem_file::FileStore::builder(dir.path()).open().unwrap();
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(hot, cold.clone())
        .hot_retention(Duration::from_secs(1))
        .open()
        .await
        .unwrap();
    let claims = store
        .begin_many(&batch(0..2, Lease::from_secs(60)))
        .await
        .unwrap();
    let (good, stale) = (claimed(&claims[0]), claimed(&claims[1]));
    assert!(!store.release(&key(1), stale).await.unwrap().is_stale());
    cold.set_down(true);
    let items = vec![
        CompleteItem {
            key: key(0),
            token: good,
            outcome: Some(Bytes::from_static(b"done")),
            retention: HOUR,
        },
        CompleteItem {
            key: key(1),
            token: stale,
            outcome: None,
            retention: HOUR,
        },
    ];
    let failed = store.complete_many(&items).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    cold.set_down(false);
    store.flush().await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(
        matches!(cold.inner().get(&key(0)).await.unwrap(), Some(Record::Completed(c)) if c.token == good),
        "the completed record reached the cold tier"
    );
    let replay = store.begin(&key(0), None, Lease::from_secs(60)).await;
    assert!(
        matches!(replay, Ok(Begin::Completed { .. })),
        "past the hot retention: {replay:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_with_the_cold_tier_down_ends_within_its_bound() {
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .ack_before_cold(true)
        .open()
        .await
        .unwrap();
    let claims = store
        .begin_many(&batch(0..5, Lease::from_secs(60)))
        .await
        .unwrap();
    cold.set_down(true);
    for (i, claim) in claims.iter().enumerate() {
        let done = store.complete(&key(i), claimed(claim), None, HOUR).await;
        assert!(!done.unwrap().is_stale());
    }
    let started = Instant::now();
    let left = store.flush_within(Duration::from_millis(300)).await;
    let took = started.elapsed();
    assert_eq!(left, 5);
    assert!(
        took < Duration::from_secs(2),
        "flush_within(300 ms) took {took:?}"
    );
    cold.set_down(false);
    assert_eq!(store.flush_within(Duration::from_secs(10)).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_hot_tier_can_answer_does_not_need_the_cold_tier() {
    let cold = Switchable::new(MemoryStore::new());
    let store = TieredStore::builder(MemoryStore::new(), cold.clone())
        .open()
        .await
        .unwrap();
    let claim = store
        .begin(&key(0), None, Lease::from_secs(60))
        .await
        .unwrap();
    let token = claimed(&claim);
    let done = store
        .complete(&key(0), token, Some(Bytes::from_static(b"kept")), HOUR)
        .await;
    assert!(!done.unwrap().is_stale());
    cold.set_down(true);
    match store.get(&key(0)).await {
        Ok(Some(Record::Completed(c))) => {
            assert_eq!(c.token, token);
            assert_eq!(c.outcome.as_deref(), Some(&b"kept"[..]));
        }
        other => panic!("the hot tier holds the record: {other:?}"),
    }
    // What only the cold tier could answer is still an error.
    assert!(store.get(&key(1)).await.is_err());
}
