//! A key filter never forgets a key the cold tier still holds: a cold tier
//! whose records outlive what the filter keeps (written while it was off,
//! under a longer filter retention, or a plain store adopted as the cold
//! tier) is refused with both numbers, and one that fits is taken.

use std::sync::Arc;
use std::time::Duration;

use idem_core::tier::{ImportItem, Tier};
use idem_core::{Clock, Completed, FencingToken, Key, MemoryStore, StoreError, SystemClock};
use idem_tiered::TieredStore;
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter};

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn cold_holding_until(days: u32) -> MemoryStore {
    let cold = MemoryStore::new();
    let now = SystemClock.now();
    let record = Completed {
        token: FencingToken::new(7),
        fingerprint: None,
        outcome: None,
        completed_at: now,
        expires_at: now.after(DAY * days),
    };
    let key = Key::new("kept", "long").unwrap();
    cold.import_many(&[ImportItem { key, record }])
        .await
        .unwrap();
    cold
}

fn filter(retention: Duration) -> Arc<KeyFilter> {
    let config = FilterConfig::new(FilterSeed::new(3), 10_000, retention);
    Arc::new(KeyFilter::new(&config, SystemClock.now()).unwrap())
}

#[tokio::test]
async fn a_cold_tier_that_outlives_the_filter_is_refused_with_both_numbers() {
    let cold = cold_holding_until(365).await;
    let refused = TieredStore::builder(MemoryStore::new(), cold)
        .filter(filter(30 * DAY))
        .open()
        .await;
    match refused {
        Err(StoreError::Unavailable(why)) => {
            let why = why.to_string();
            assert!(why.contains("--filter-retention-ms"), "{why}");
            assert!(why.contains(&(30 * DAY).as_millis().to_string()), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a filter of 30 days in front of records kept a year"),
    }
}

#[tokio::test]
async fn a_cold_tier_the_filter_covers_is_taken() {
    let cold = cold_holding_until(20).await;
    TieredStore::builder(MemoryStore::new(), cold.clone())
        .filter(filter(30 * DAY))
        .open()
        .await
        .expect("records of 20 days behind a filter of 30");
    // Without a filter nothing is forgotten, whatever the records.
    let long = cold_holding_until(365).await;
    TieredStore::builder(MemoryStore::new(), long)
        .open()
        .await
        .expect("no filter, nothing to outlive");
}
