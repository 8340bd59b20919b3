//! The token high-water mark survives a restart: tokens imported with
//! their records, and floors raised, stay below every token issued after
//! the store is opened again.

use std::time::Duration;

use bytes::Bytes;
use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{Clock, Completed, FencingToken, Key, Lease, ManualClock, Store, Timestamp};
use idem_file::FileStore;
use idem_testkit::cases::acquired;

fn open(dir: &std::path::Path, clock: &ManualClock) -> FileStore {
    FileStore::builder(dir)
        .clock(clock.clone())
        .sweep_interval(None)
        .open()
        .unwrap()
}

/// Far above any token the sequence issues by itself (a block is 2^20).
const FAR: u64 = 1 << 40;

/// A completed record of key `key` with `token`, kept for an hour.
fn completed(key: &str, token: u64, now: Timestamp) -> ImportItem {
    ImportItem {
        key: Key::new("high-water", key.to_owned()).unwrap(),
        record: Completed {
            token: FencingToken::new(token),
            fingerprint: None,
            outcome: Some(Bytes::from_static(b"kept")),
            completed_at: now,
            expires_at: now.after(Duration::from_secs(3600)),
        },
    }
}

async fn begin_token(store: &FileStore, key: &str) -> FencingToken {
    let key = Key::new("high-water", key.to_owned()).unwrap();
    acquired(store.begin(&key, None, Lease::from_secs(30)).await.unwrap()).token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_token_survives_reopening() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let item = completed("imported", FAR, clock.now());
    assert_eq!(
        store
            .import_many(std::slice::from_ref(&item))
            .await
            .unwrap(),
        [Imported::Written]
    );
    drop(store);

    let store = open(dir.path(), &clock);
    let high = store.token_high_water().await.unwrap();
    assert!(
        high.get() >= FAR,
        "high water {high:?} below the imported {FAR}"
    );
    let token = begin_token(&store, "after-import").await;
    assert!(
        token.get() > FAR,
        "token {token:?} not above the imported {FAR}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raised_floor_survives_reopening() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    let floor = FencingToken::new(FAR * 2);
    store.raise_token_floor(floor).await.unwrap();
    assert!(store.token_high_water().await.unwrap() >= floor);
    drop(store);

    let store = open(dir.path(), &clock);
    let high = store.token_high_water().await.unwrap();
    assert!(
        high >= floor,
        "high water {high:?} below the floor {floor:?}"
    );
    let token = begin_token(&store, "after-floor").await;
    assert!(
        token > floor,
        "token {token:?} not above the floor {floor:?}"
    );
    // A floor below the mark changes nothing.
    store.raise_token_floor(FencingToken::new(5)).await.unwrap();
    assert!(store.token_high_water().await.unwrap() >= token);
}

/// Importing a token below a raised floor leaves the mark at the floor,
/// also after reopening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_water_never_goes_down() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let clock = ManualClock::new();
    let store = open(dir.path(), &clock);
    store
        .raise_token_floor(FencingToken::new(FAR * 3))
        .await
        .unwrap();
    let lower = completed("lower", FAR, clock.now());
    store.import_many(&[lower]).await.unwrap();
    drop(store);
    let store = open(dir.path(), &clock);
    assert!(store.token_high_water().await.unwrap().get() >= FAR * 3);
}
