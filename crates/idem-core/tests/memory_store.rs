//! What the memory store does beyond the shared contract: its capacity
//! limit, its sweeper, and its index under heavy churn.

use std::time::Duration;

use idem_core::{
    Begin, BeginItem, Fenced, Key, Lease, ManualClock, MemoryStore, Record, Store, StoreError,
};

fn key(i: usize) -> Key {
    Key::new("mem", format!("k{i}")).unwrap()
}

async fn acquire(store: &MemoryStore, k: &Key) -> Result<idem_core::Claim, StoreError> {
    match store.begin(k, None, Lease::from_secs(10)).await? {
        Begin::Acquired(c) => Ok(c),
        other => panic!("expected Acquired for {k}, got {other:?}"),
    }
}

#[tokio::test]
async fn capacity_limit_refuses_new_keys_and_never_drops_live_ones() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .capacity(3)
        .sweep_interval(None)
        .build();
    let claims: Vec<_> = futures_util::future::try_join_all((0..3).map(|i| {
        let store = store.clone();
        async move { acquire(&store, &key(i)).await }
    }))
    .await
    .unwrap();
    let err = store
        .begin(&key(3), None, Lease::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::CapacityExceeded { limit: 3 }));
    assert!(err.to_string().contains("raise the capacity"), "{err}");
    for i in 0..3 {
        assert!(
            store.get(&key(i)).await.unwrap().is_some(),
            "a live record was dropped"
        );
    }
    // Existing keys still answer.
    assert!(matches!(
        store
            .begin(&key(0), None, Lease::from_secs(10))
            .await
            .unwrap(),
        Begin::InProgress { .. }
    ));
    // Releasing makes room.
    assert_eq!(
        store.release(&key(0), claims[0].token).await.unwrap(),
        Fenced::Ok(())
    );
    acquire(&store, &key(3)).await.unwrap();
    // So does a record past its retention, even before the sweeper runs.
    let done = store
        .complete(&key(1), claims[1].token, None, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    assert!(
        store
            .begin(&key(4), None, Lease::from_secs(10))
            .await
            .is_err()
    );
    clock.advance(Duration::from_secs(6));
    acquire(&store, &key(4)).await.unwrap();
}

/// A batch that does not fit a full store is refused whole: no item is
/// acquired, and a batch that fits (existing keys need no room) still runs.
#[tokio::test]
async fn batch_that_does_not_fit_acquires_nothing() {
    let store = MemoryStore::builder()
        .capacity(4)
        .sweep_interval(None)
        .build();
    acquire(&store, &key(0)).await.unwrap();
    acquire(&store, &key(1)).await.unwrap();
    let items = |keys: &[usize]| -> Vec<BeginItem> {
        keys.iter()
            .map(|&i| BeginItem {
                key: key(i),
                fingerprint: None,
                lease: Lease::from_secs(10),
            })
            .collect()
    };
    // Two held keys and three new ones: one more record than there is room.
    let err = store
        .begin_many(&items(&[0, 2, 1, 3, 4]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::CapacityExceeded { limit: 4 }),
        "{err}"
    );
    for i in 2..5 {
        assert_eq!(store.get(&key(i)).await.unwrap(), None, "k{i} was acquired");
    }
    assert_eq!(store.len(), 2);
    // Held keys and two new ones fit exactly.
    let begun = store.begin_many(&items(&[0, 2, 1, 3])).await.unwrap();
    assert!(matches!(begun[0], Begin::InProgress { .. }), "{begun:?}");
    assert!(matches!(begun[1], Begin::Acquired(_)), "{begun:?}");
    assert!(matches!(begun[3], Begin::Acquired(_)), "{begun:?}");
    assert_eq!(store.len(), 4);
    assert!(
        store
            .begin(&key(5), None, Lease::from_secs(10))
            .await
            .is_err()
    );
}

/// Room is counted exactly: a batch naming one new key twice takes one
/// record's room, and a stale release frees none.
#[tokio::test]
async fn capacity_counts_exactly_what_is_held() {
    let store = MemoryStore::builder()
        .capacity(2)
        .sweep_interval(None)
        .build();
    assert!(store.is_empty());
    let twice = BeginItem {
        key: key(0),
        fingerprint: None,
        lease: Lease::from_secs(10),
    };
    let begun = store.begin_many(&[twice.clone(), twice]).await.unwrap();
    assert!(matches!(begun[1], Begin::InProgress { .. }), "{begun:?}");
    assert!(!store.is_empty());
    let held = acquire(&store, &key(1)).await.unwrap();
    let stale = idem_core::FencingToken::new(held.token.get() + 1000);
    assert_eq!(store.release(&key(1), stale).await.unwrap(), Fenced::Stale);
    assert!(
        matches!(
            store.begin(&key(2), None, Lease::from_secs(10)).await,
            Err(StoreError::CapacityExceeded { limit: 2 })
        ),
        "the store is full: a stale release freed nothing"
    );
}

/// A full store whose records have expired makes room for a batch by
/// sweeping at once, before the sweeper's next round.
#[tokio::test]
async fn full_store_sweeps_expired_records_for_a_batch() {
    let clock = ManualClock::new();
    let limits = idem_core::Limits {
        max_outcome_bytes: 64,
        ..Default::default()
    };
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .limits(limits.clone())
        .capacity(2)
        .sweep_interval(None)
        .build();
    assert_eq!(store.limits(), &limits);
    for i in 0..2 {
        let c = acquire(&store, &key(i)).await.unwrap();
        let done = store
            .complete(&key(i), c.token, None, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(done, Fenced::Ok(()));
    }
    clock.advance(Duration::from_secs(2));
    let items: Vec<BeginItem> = (2..4)
        .map(|i| BeginItem {
            key: key(i),
            fingerprint: None,
            lease: Lease::from_secs(10),
        })
        .collect();
    let begun = store.begin_many(&items).await.unwrap();
    assert!(
        begun.iter().all(|b| matches!(b, Begin::Acquired(_))),
        "{begun:?}"
    );
}

#[tokio::test]
async fn sweeper_removes_expired_records_only() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .abandoned_retention(Duration::from_secs(60))
        .build();
    let done = acquire(&store, &key(0)).await.unwrap();
    let _ = store
        .complete(&key(0), done.token, None, Duration::from_secs(5))
        .await
        .unwrap();
    acquire(&store, &key(1)).await.unwrap(); // lease 10 s, then abandoned
    let long = acquire(&store, &key(2)).await.unwrap();
    let _ = store
        .complete(&key(2), long.token, None, Duration::from_secs(3600))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(30));
    assert_eq!(store.sweep(), 1, "only the completed record past retention");
    assert!(matches!(
        store.get(&key(1)).await.unwrap(),
        Some(Record::InProgress(_))
    ));
    clock.advance(Duration::from_secs(60));
    assert_eq!(store.sweep(), 1, "the abandoned claim after its grace");
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn index_stays_right_under_churn() {
    let store = MemoryStore::builder()
        .shards(2)
        .sweep_interval(None)
        .build();
    let mut tokens = Vec::new();
    for i in 0..5_000 {
        tokens.push(acquire(&store, &key(i)).await.unwrap().token);
    }
    // Release every third key, in an order that moves slots around.
    for i in (0..5_000).rev().filter(|i| i % 3 == 0) {
        assert_eq!(
            store.release(&key(i), tokens[i]).await.unwrap(),
            Fenced::Ok(())
        );
    }
    for (i, token) in tokens.iter().enumerate() {
        let record = store.get(&key(i)).await.unwrap();
        if i % 3 == 0 {
            assert_eq!(record, None, "k{i} was released");
        } else {
            assert_eq!(
                record.map(|r| r.token()),
                Some(*token),
                "k{i} lost or mixed up"
            );
        }
    }
    assert_eq!(store.len(), 5_000 - 5_000usize.div_ceil(3));
}
