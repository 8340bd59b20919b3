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

/// Keys whose records expired are done again while sweeps run: no new
/// record may be deleted by a sweep that read the old index entry before
/// the new record was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_while_a_sweep_runs_survive_it() {
    let dir = dir();
    let clock = ManualClock::new();
    let store = FileStore::builder(dir.path())
        .clock(clock.clone())
        .sweep_interval(None)
        .durability(idem_file::Durability::Buffered)
        .open()
        .unwrap();
    let keys: Vec<Key> = (0..4096)
        .map(|i| Key::new("sweep-race", format!("k{i:05}")).unwrap())
        .collect();
    for chunk in keys.chunks(10_000) {
        let items: Vec<idem_core::BeginItem> = chunk
            .iter()
            .map(|k| idem_core::BeginItem {
                key: k.clone(),
                fingerprint: None,
                lease: Lease::from_secs(10),
            })
            .collect();
        let claims = store.begin_many(&items).await.unwrap();
        let completes: Vec<idem_core::CompleteItem> = chunk
            .iter()
            .zip(claims)
            .map(|(k, c)| idem_core::CompleteItem {
                key: k.clone(),
                token: acquired(c).token,
                outcome: Some("old".into()),
                retention: Duration::from_secs(1),
            })
            .collect();
        store.complete_many(&completes).await.unwrap();
    }
    clock.advance(Duration::from_secs(2));

    let sweeper = {
        let store = store.clone();
        std::thread::spawn(move || store.sweep().unwrap())
    };
    let redo = keys.iter().map(|k| {
        let store = store.clone();
        async move { finish(&store, k, "new", Duration::from_secs(100)).await }
    });
    futures_util::future::join_all(redo).await;
    sweeper.join().unwrap();
    store.sweep().unwrap();
    for k in &keys {
        match store.get(k).await.unwrap() {
            Some(Record::Completed(r)) => assert_eq!(r.outcome.as_deref(), Some(&b"new"[..])),
            other => panic!("{k}: the new record was swept: {other:?}"),
        }
    }
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
