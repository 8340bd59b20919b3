//! The token high-water mark survives reopening the store, and a floor
//! the database's clock does not pass within a second is refused, saying
//! why.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{Begin, Completed, FencingToken, Key, Lease, Store, Timestamp};
use idem_sql::SqlStore;

/// The database's clock as tokens: its time in ms × 1024.
fn clock_tokens() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    ms * 1024
}

async fn open(service: &str, url: &str, prefix: &str) -> Option<SqlStore> {
    support::open(service, url, |b| b.table(prefix).sweep_interval(None)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_water_survives_reopening() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("highwater");
        let Some(store) = open(service, &url, &prefix).await else {
            continue;
        };
        // An hour of the clock ahead: only the stored mark can cover it.
        let ahead = clock_tokens() + 3_600_000 * 1024;
        let now = Timestamp::from_millis(clock_tokens() / 1024);
        let key = Key::new("high-water", "imported").unwrap();
        let item = ImportItem {
            key: key.clone(),
            record: Completed {
                token: FencingToken::new(ahead),
                fingerprint: None,
                outcome: Some("kept".into()),
                completed_at: now,
                expires_at: now.after(Duration::from_secs(3600)),
            },
        };
        assert_eq!(
            store.import_many(&[item]).await.unwrap(),
            [Imported::Written],
            "{service}"
        );
        let recorded = ahead + 5_000;
        store
            .record_high_water(FencingToken::new(recorded))
            .await
            .unwrap();
        drop(store);

        let store = open(service, &url, &prefix).await.unwrap();
        let high = store.token_high_water().await.unwrap();
        assert!(
            high.get() >= recorded,
            "{service}: high water {high:?} below the recorded {recorded} after reopening"
        );
        match store.begin(&key, None, Lease::from_secs(30)).await.unwrap() {
            Begin::Completed { outcome, .. } => {
                assert_eq!(outcome.as_deref(), Some(&b"kept"[..]), "{service}")
            }
            other => panic!("{service}: expected the imported record, got {other:?}"),
        }
        support::drop_tables(&store, &url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_within_a_second_is_waited_for_and_beyond_is_refused() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("floor");
        let Some(store) = open(service, &url, &prefix).await else {
            continue;
        };
        let floor = FencingToken::new(clock_tokens() + 300 * 1024);
        let started = std::time::Instant::now();
        store.raise_token_floor(floor).await.unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_millis(1500),
            "{service}: a floor 300 ms ahead took {waited:?}"
        );
        let key = Key::new("floor", "after").unwrap();
        let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(30)).await.unwrap()
        else {
            panic!("{service}: a fresh key is acquired")
        };
        assert!(
            claim.token > floor,
            "{service}: {:?} not above {floor:?}",
            claim.token
        );
        assert!(store.token_high_water().await.unwrap() >= floor);

        let far = FencingToken::new(clock_tokens() + 60_000 * 1024);
        let started = std::time::Instant::now();
        let err = store.raise_token_floor(far).await.unwrap_err().to_string();
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{service}: a floor a minute ahead is refused at once"
        );
        for part in [
            "cannot raise the token floor",
            "ms × 1024",
            "raise the floor by less",
        ] {
            assert!(
                err.contains(part),
                "{service}: {part:?} missing from: {err}"
            );
        }
        assert!(
            store.token_high_water().await.unwrap() < far,
            "{service}: a refused floor is not recorded"
        );
        support::drop_tables(&store, &url).await;
    }
}
