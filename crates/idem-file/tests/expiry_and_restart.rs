//! What the file store keeps on disk: expired records are swept away,
//! live ones survive a clean restart, and a directory takes one store at a
//! time.

use idem_testkit::cases::acquired;
use std::time::Duration;

use idem_core::{Fenced, Key, Lease, ManualClock, Record, Store};
use idem_file::FileStore;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

async fn finish(store: &FileStore, key: &Key, outcome: &'static str, retention: Duration) {
    let c = acquired(store.begin(key, None, Lease::from_secs(10)).await.unwrap());
    let done = store
        .complete(key, c.token, Some(outcome.into()), retention)
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
}

#[tokio::test]
async fn sweeper_removes_expired_records_and_spares_their_successors() {
    let dir = dir();
    let clock = ManualClock::new();
    let store = FileStore::builder(dir.path())
        .clock(clock.clone())
        .sweep_interval(None)
        .open()
        .unwrap();
    let (gone, reused, kept) = (
        Key::new("sweep", "gone").unwrap(),
        Key::new("sweep", "reused").unwrap(),
        Key::new("sweep", "kept").unwrap(),
    );
    finish(&store, &gone, "1", Duration::from_secs(2)).await;
    finish(&store, &reused, "old", Duration::from_secs(2)).await;
    finish(&store, &kept, "3", Duration::from_secs(100)).await;
    clock.advance(Duration::from_secs(3));
    // `reused` expired and was done again: its old index entry must not
    // delete the new record.
    finish(&store, &reused, "new", Duration::from_secs(100)).await;
    assert_eq!(store.sweep().unwrap(), 1, "only `gone` is due");
    assert_eq!(store.sweep().unwrap(), 0, "the index entries are gone too");
    match store.get(&reused).await.unwrap() {
        Some(Record::Completed(r)) => assert_eq!(r.outcome.as_deref(), Some(&b"new"[..])),
        other => panic!("the successor was swept: {other:?}"),
    }
    assert!(store.get(&kept).await.unwrap().is_some());
    clock.advance(Duration::from_secs(200));
    assert_eq!(store.sweep().unwrap(), 2);
}

#[tokio::test]
async fn abandoned_claims_are_forgotten_after_their_grace() {
    let dir = dir();
    let clock = ManualClock::new();
    let store = FileStore::builder(dir.path())
        .clock(clock.clone())
        .sweep_interval(None)
        .abandoned_retention(Duration::from_secs(60))
        .open()
        .unwrap();
    let key = Key::new("sweep", "abandoned").unwrap();
    let _ = store.begin(&key, None, Lease::from_secs(1)).await.unwrap();
    clock.advance(Duration::from_secs(30));
    store.sweep().unwrap();
    assert!(
        store.get(&key).await.unwrap().is_some(),
        "kept to count attempts"
    );
    clock.advance(Duration::from_secs(60));
    store.sweep().unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None);
}

#[tokio::test]
async fn completed_records_survive_a_restart_and_claims_do_not() {
    let dir = dir();
    let done = Key::new("restart", "done").unwrap();
    let held = Key::new("restart", "held").unwrap();
    let old_token = {
        let store = FileStore::open(dir.path()).unwrap();
        finish(&store, &done, "kept", Duration::from_secs(3600)).await;
        let c = acquired(
            store
                .begin(&held, None, Lease::from_secs(600))
                .await
                .unwrap(),
        );
        c.token
    };
    let store = FileStore::open(dir.path()).expect("reopens once the first store is dropped");
    match store.get(&done).await.unwrap() {
        Some(Record::Completed(r)) => assert_eq!(r.outcome.as_deref(), Some(&b"kept"[..])),
        other => panic!("lost a completed record: {other:?}"),
    }
    // The claim is gone with the process: its holder is stale, and the next
    // delivery acquires with a larger token.
    assert_eq!(
        store
            .complete(&held, old_token, None, Duration::from_secs(1))
            .await
            .unwrap(),
        Fenced::Stale
    );
    let c = acquired(store.begin(&held, None, Lease::from_secs(1)).await.unwrap());
    assert!(c.token > old_token);
}

#[tokio::test]
async fn a_directory_in_use_is_refused_with_a_clear_error() {
    let dir = dir();
    let _first = FileStore::open(dir.path()).unwrap();
    let err = FileStore::open(dir.path())
        .err()
        .expect("a second opener is refused");
    let msg = err.to_string();
    assert!(msg.contains("another idem process"), "{msg}");
}
