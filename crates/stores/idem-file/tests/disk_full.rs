//! A full disk: the store runs on a small tmpfs (`idem_testkit::small_disk`)
//! that a ballast file fills until writes fail with `ENOSPC`.
//!
//! The first write the disk refuses (a completion, the durable token
//! ceiling a claim raises, or a table the engine writes in the background,
//! whose error only the engine's log shows: the store then tells a full
//! disk by the room left on it) stops the store: that operation and every
//! later one answer `Unavailable`, saying the disk is full, where, and what
//! to do, and no `complete` answers `Ok` unless its record was written. A new
//! store cannot be made on the full disk, and says why. Every completion
//! acknowledged before is kept: it reads back when the store is opened
//! again on the still full disk, and again once room is freed, when the
//! store takes new claims, with tokens above every token issued before.
//! The stopped store itself does not recover: it must be opened again.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_core::{
    Begin, Fenced, FencingToken, Key, Lease, Namespace, Record, ScanQuery, Store, StoreError,
};
use idem_file::{FileStore, OpenError};
use idem_testkit::cases::acquired;
use idem_testkit::small_disk::SmallDisk;

/// Room for the engine's files with records of a few kilobytes in all,
/// and little enough that filling it is quick.
const DISK_BYTES: u64 = 16 << 20;

/// The completions acknowledged: key to token.
type Acked = BTreeMap<String, u64>;

fn key(name: &str) -> Key {
    Key::new("orders", name.to_owned()).unwrap()
}

fn outcome(name: &str) -> Bytes {
    Bytes::from(format!("receipt for {name}"))
}

fn claim(name: &str) -> (Key, Lease) {
    (key(name), Lease::from_secs(60))
}

/// A completion the disk refused: its key, its holder's token, the error.
struct Refused {
    name: String,
    token: FencingToken,
    error: StoreError,
}

/// Claims and completes keys `{prefix}-0`, `{prefix}-1`, … until the store
/// refuses a completion (or, with `until_refused` false, `n` of them);
/// records the acknowledged ones and the highest token issued.
async fn deliver(
    store: &FileStore,
    prefix: &str,
    n: usize,
    acked: &mut Acked,
    issued: &mut u64,
) -> Option<Refused> {
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let (k, lease) = claim(&name);
        let c = acquired(store.begin(&k, None, lease).await.unwrap());
        *issued = (*issued).max(c.token.get());
        match store
            .complete(&k, c.token, Some(outcome(&name)), Duration::from_secs(600))
            .await
        {
            Ok(Fenced::Ok(())) => {
                acked.insert(name, c.token.get());
            }
            Ok(Fenced::Stale) => panic!("{name}: its own holder's complete is stale"),
            Err(error) => {
                return Some(Refused {
                    name,
                    token: c.token,
                    error,
                });
            }
        }
    }
    None
}

/// `e` is `Unavailable` and names the full disk, the store's directory
/// and what to do.
fn assert_says_disk_full(e: &StoreError, dir: &Path, what: &str) {
    println!("{what}: {e}");
    assert!(
        matches!(e, StoreError::Unavailable(_)) && e.is_transient(),
        "{what}: {e:?}"
    );
    let message = e.to_string().to_lowercase();
    for part in [
        "is full",
        &dir.display().to_string()[..],
        "free space",
        "reopen",
    ] {
        assert!(
            message.contains(part),
            "{what}: {part:?} missing from: {message}"
        );
    }
}

/// Every acknowledged completion reads back with its token and outcome,
/// and every stored record decodes.
async fn assert_kept(store: &FileStore, acked: &Acked) {
    for (name, token) in acked {
        match store.get(&key(name)).await.unwrap() {
            Some(Record::Completed(r))
                if r.token.get() == *token && r.outcome == Some(outcome(name)) => {}
            other => panic!("{name} (token {token}) was acknowledged, and reads back {other:?}"),
        }
    }
    let listed = store
        .scan(&ScanQuery::new(Namespace::new("orders").unwrap()).limit(100_000))
        .await
        .expect("every stored record decodes");
    assert!(listed.len() >= acked.len(), "{} listed", listed.len());
}

/// A new claim on `store` gets a token above `issued`.
async fn assert_new_claims_above(store: &FileStore, issued: u64) {
    let (k, lease) = claim(&format!("fresh-{issued}"));
    let c = acquired(store.begin(&k, None, lease).await.unwrap());
    assert!(
        c.token.get() > issued,
        "token {} after reopening is not above {issued}, issued before",
        c.token
    );
}

/// A new store on the full disk is refused, saying why.
fn assert_no_new_store(disk: &SmallDisk) {
    let elsewhere = disk.path().join("another");
    match FileStore::open(&elsewhere) {
        Err(e @ OpenError::DiskFull { .. }) => {
            println!("a new store on the full disk: {e}");
            let message = e.to_string();
            for part in [
                "disk is full",
                &elsewhere.display().to_string()[..],
                "free space",
            ] {
                assert!(message.contains(part), "{part:?} missing from: {message}");
            }
        }
        Err(e) => panic!("a new store on the full disk: {e:?}"),
        Ok(_) => panic!("a new store opened on the full disk"),
    }
}

/// Opened again on the still full disk: what was acknowledged reads back,
/// and the store stops again at the first write the disk refuses.
async fn reopen_while_full(dir: &Path, acked: &mut Acked, issued: &mut u64) {
    let store = FileStore::open(dir).expect("the store opens on the full disk");
    assert_kept(&store, acked).await;
    let refused = deliver(&store, "full-again", 100_000, acked, issued)
        .await
        .expect("the full disk refuses a completion again");
    assert_says_disk_full(&refused.error, dir, "reopened on the full disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_the_full_disk_refuses_is_not_acknowledged_and_nothing_acknowledged_is_lost() {
    let Some(disk) = SmallDisk::mount_for_test(DISK_BYTES) else {
        return;
    };
    let started = Instant::now();
    let dir = disk.path().join("store");
    let store = FileStore::open(&dir).unwrap();
    let (mut acked, mut issued) = (Acked::new(), 0);
    deliver(&store, "before", 50, &mut acked, &mut issued).await;
    let ballast = disk.fill().unwrap();

    // Claims cost no write; completions write until the disk refuses one.
    let refused = deliver(&store, "filling", 100_000, &mut acked, &mut issued)
        .await
        .expect("the full disk refuses a completion");
    println!(
        "the ballast took {ballast} bytes; {} completions were acknowledged on the full disk first",
        acked.len() - 50
    );
    let Refused { name, token, error } = refused;
    assert_says_disk_full(&error, &dir, "the refused complete");

    // The store has stopped: the holder's retry, a new claim and a read.
    let k = key(&name);
    let again = store.complete(&k, token, None, Duration::from_secs(600));
    assert_says_disk_full(&again.await.unwrap_err(), &dir, "the retried complete");
    let (new, lease) = claim("new");
    let begin = store.begin(&new, None, lease).await;
    assert_says_disk_full(&begin.unwrap_err(), &dir, "a new claim");
    assert_says_disk_full(&store.get(&new).await.unwrap_err(), &dir, "a read");
    assert_no_new_store(&disk);
    drop(store);

    reopen_while_full(&dir, &mut acked, &mut issued).await;
    disk.free().unwrap();
    let store = FileStore::open(&dir).expect("the store opens once there is room");
    assert_kept(&store, &acked).await;
    assert_new_claims_above(&store, issued).await;
    // The refused completion was never acknowledged, so either may follow:
    // the engine wrote the rest of it as it closed, and the holder's retry
    // answers `Ok`; or it is gone with the claim, and the next delivery
    // runs again. Never another record.
    let retried = store
        .complete(&k, token, None, Duration::from_secs(600))
        .await
        .unwrap();
    match store.get(&k).await.unwrap() {
        None => assert_eq!(retried, Fenced::Stale),
        Some(Record::Completed(r)) if r.token == token && r.outcome == Some(outcome(&name)) => {
            assert_eq!(retried, Fenced::Ok(()))
        }
        other => panic!("{name}'s completion was refused, and reads back {other:?}"),
    }
    println!("the refused completion's retry after reopening: {retried:?}");
    assert!(
        deliver(&store, "after", 10, &mut acked, &mut issued)
            .await
            .is_none()
    );
    drop(store);
    let store = FileStore::open(&dir).unwrap();
    assert_kept(&store, &acked).await;
    println!(
        "{} acknowledged in all, every one kept; {:?}",
        acked.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_full_disk_refuses_stops_the_store_and_nothing_acknowledged_is_lost() {
    let Some(disk) = SmallDisk::mount_for_test(DISK_BYTES) else {
        return;
    };
    let started = Instant::now();
    let dir = disk.path().join("store");
    // A durable token ceiling raised every 2 tokens: claims write too.
    let store = FileStore::builder(&dir).token_block(2).open().unwrap();
    let (mut acked, mut issued) = (Acked::new(), 0);
    deliver(&store, "before", 50, &mut acked, &mut issued).await;
    let (held, lease) = claim("held");
    let c = acquired(store.begin(&held, None, lease).await.unwrap());
    disk.fill().unwrap();

    let mut refused = None;
    for i in 0..100_000 {
        let (k, lease) = claim(&format!("filling-{i}"));
        match store.begin(&k, None, lease).await {
            Ok(Begin::Acquired(c)) => issued = c.token.get(),
            Ok(other) => panic!("a new key answered {other:?}"),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("the full disk refuses a claim");
    assert_says_disk_full(&e, &dir, "the refused claim");

    // A claim made before cannot be completed on the stopped store.
    let late = Some(Bytes::from_static(b"late"));
    let done = store
        .complete(&held, c.token, late, Duration::from_secs(600))
        .await;
    assert_says_disk_full(&done.unwrap_err(), &dir, "the held claim's complete");
    drop(store);

    reopen_while_full(&dir, &mut acked, &mut issued).await;
    disk.free().unwrap();
    let store = FileStore::open(&dir).expect("the store opens once there is room");
    assert_kept(&store, &acked).await;
    assert_new_claims_above(&store, issued).await;
    assert_eq!(
        store.get(&held).await.unwrap(),
        None,
        "the held claim ended with the store"
    );
    assert!(
        deliver(&store, "after", 10, &mut acked, &mut issued)
            .await
            .is_none()
    );
    println!(
        "every acknowledged completion kept; {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_the_full_disk_refuses_stops_the_store_and_nothing_acknowledged_is_lost() {
    let Some(disk) = SmallDisk::mount_for_test(32 << 20) else {
        return;
    };
    let started = Instant::now();
    let dir = disk.path().join("store");
    let store = FileStore::open(&dir).unwrap();
    let (mut acked, mut issued) = (Acked::new(), 0);
    // Outcomes that do not compress fill most of a memtable (8 MiB)...
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let large: Bytes = (0..256 << 10)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into();
    for i in 0..31 {
        let name = format!("large-{i}");
        let (k, lease) = claim(&name);
        let c = acquired(store.begin(&k, None, lease).await.unwrap());
        let retention = Duration::from_secs(600);
        let done = store.complete(&k, c.token, Some(large.clone()), retention);
        assert_eq!(done.await.unwrap(), Fenced::Ok(()));
        issued = c.token.get();
    }
    // ... then small ones, on a disk with room for their journal but not
    // for the table the engine writes once the memtable is full. That
    // write, in the background, takes the last room and fails: the store
    // sees the engine stop (the error itself only in the engine's log), or
    // its own next journal write refused, whichever comes first.
    disk.fill_leaving(1 << 20).unwrap();
    let refused = deliver(&store, "small", 100_000, &mut acked, &mut issued)
        .await
        .expect("the full disk refuses a table, and the store stops");
    println!("{} small completions acknowledged first", acked.len());
    assert_says_disk_full(&refused.error, &dir, "after a table was refused");
    let (new, lease) = claim("new");
    let begin = store.begin(&new, None, lease).await;
    assert_says_disk_full(&begin.unwrap_err(), &dir, "a new claim");
    drop(store);

    disk.free().unwrap();
    let store = FileStore::open(&dir).expect("the store opens once there is room");
    for i in 0..31 {
        let r = store.get(&key(&format!("large-{i}"))).await.unwrap();
        assert!(
            matches!(&r, Some(Record::Completed(c)) if c.outcome.as_ref() == Some(&large)),
            "large-{i}: {r:?}"
        );
    }
    assert_kept(&store, &acked).await;
    assert_new_claims_above(&store, issued).await;
    println!(
        "every acknowledged completion kept; {:?}",
        started.elapsed()
    );
}
