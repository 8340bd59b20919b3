//! Redis whose append-only file is on a full disk: a Redis of the test's own
//! keeps its data directory on a small tmpfs (`idem_testkit::small_disk`)
//! that a ballast file fills until Redis's writes fail with `ENOSPC`.
//!
//! - `appendfsync always`: Redis cannot answer a write it could not log,
//!   so at the first AOF write the disk refuses it exits before answering.
//!   That call, whether a `begin` or a `complete`, and every later one are
//!   answered `Unavailable` (transient), never `Ok`. Restarted with room
//!   (or even on the full disk: it cuts the refused write off its file),
//!   Redis holds every acknowledged completion, and the store, reconnecting
//!   by itself, completes the claims held across the outage.
//! - `appendfsync everysec`: Redis refuses writes with `MISCONF`, which the
//!   store answers `Unavailable`, saying what to do, while reads go on; once
//!   room is freed Redis takes writes again by itself, and so does the
//!   store. But Redis answered the writes whose AOF write failed: they live
//!   in its memory only until room is freed, and a crash before that loses
//!   an acknowledged completion.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_core::{Fenced, FencingToken, Key, Lease, Record, Store, StoreError};
use idem_redis::RedisStore;
use idem_testkit::cases::acquired;
use idem_testkit::services;
use idem_testkit::small_disk::SmallDisk;
use support::{OwnRedis, cli, free_port, until};

mod support;

/// Room for Redis's append-only file with a few kilobytes of records.
const DISK_BYTES: u64 = 8 << 20;

/// The completions acknowledged: key to token.
type Acked = BTreeMap<String, FencingToken>;

fn key(name: &str) -> Key {
    Key::new("disk-full", name.to_owned()).unwrap()
}

fn outcome(name: &str) -> Bytes {
    Bytes::from(format!("receipt for {name}"))
}

/// A Redis of its own on `disk`, with `appendfsync` set to `fsync`.
async fn redis_on(disk: &SmallDisk, port: u16, fsync: &str) -> OwnRedis {
    let dir = disk.path().display().to_string();
    let args = ["--dir", &dir, "--appendonly", "yes", "--appendfsync", fsync];
    OwnRedis::start_with(port, &args).await
}

async fn connect(port: u16) -> RedisStore {
    RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap()
}

/// `n` keys `{prefix}-{i}` claimed and held.
async fn hold(store: &RedisStore, prefix: &str, n: usize) -> Vec<(String, FencingToken)> {
    let mut held = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let lease = Lease::from_secs(600);
        let c = acquired(store.begin(&key(&name), None, lease).await.unwrap());
        held.push((name, c.token));
    }
    held
}

async fn complete(
    store: &RedisStore,
    name: &str,
    token: FencingToken,
) -> Result<Fenced, StoreError> {
    let retention = Duration::from_secs(600);
    store
        .complete(&key(name), token, Some(outcome(name)), retention)
        .await
}

/// Completes the held claims in order until the store refuses one;
/// records the acknowledged ones. The refused one's index and error.
async fn complete_until_refused(
    store: &RedisStore,
    held: &[(String, FencingToken)],
    acked: &mut Acked,
) -> (usize, StoreError) {
    for (i, (name, token)) in held.iter().enumerate() {
        match complete(store, name, *token).await {
            Ok(Fenced::Ok(())) => {
                acked.insert(name.clone(), *token);
            }
            Ok(Fenced::Stale) => panic!("{name}: its own holder's complete is stale"),
            Err(e) => return (i, e),
        }
    }
    panic!("the full disk refused none of {} completions", held.len());
}

/// A transient `Unavailable`, not a corrupt record.
fn assert_transient(e: &StoreError, what: &str) {
    println!("{what}: {e}");
    assert!(
        matches!(e, StoreError::Unavailable(_)) && e.is_transient(),
        "{what}: {e:?}"
    );
}

/// The acknowledged completions that do not read back as written.
async fn missing(store: &RedisStore, acked: &Acked) -> Vec<String> {
    let mut missing = Vec::new();
    for (name, token) in acked {
        match store.get(&key(name)).await.unwrap() {
            Some(Record::Completed(r)) if r.token == *token && r.outcome == Some(outcome(name)) => {
            }
            other => missing.push(format!("{name} (token {token}): {other:?}")),
        }
    }
    missing
}

/// Waits until the store, reconnecting by itself, answers a read.
async fn until_answering(store: &RedisStore) {
    until("the store answers again", async || {
        store.get(&key("probe")).await.is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_appendfsync_always_redis_stops_before_answering_and_nothing_acknowledged_is_lost() {
    if !services::program("redis-server") {
        return;
    }
    let Some(disk) = SmallDisk::mount_for_test(DISK_BYTES) else {
        return;
    };
    let started = Instant::now();
    let port = free_port();
    let mut redis = redis_on(&disk, port, "always").await;
    let store = connect(port).await;
    let mut acked = Acked::new();
    let before = hold(&store, "before", 50).await;
    complete_all(&store, &before, &mut acked).await;
    // Claims made before the disk fills, completed after.
    let held = hold(&store, "held", 2_000).await;
    disk.fill().unwrap();

    let (refused, e) = complete_until_refused(&store, &held, &mut acked).await;
    assert_transient(&e, "the refused complete");
    println!(
        "{refused} completions acknowledged on the full disk first; Redis answers ping with {:?}",
        cli(port, &["ping"]).await
    );
    let (name, token) = &held[refused];
    let again = complete(&store, name, *token).await;
    assert_transient(&again.unwrap_err(), "the retried complete");
    let begin = store.begin(&key("new"), None, Lease::from_secs(60)).await;
    assert_transient(&begin.unwrap_err(), "a new claim");
    redis.stop().await;

    // Restarted on the still full disk, Redis loads its file (the refused
    // write cut off it) and takes writes until the disk refuses one again:
    // a claim, this time.
    let mut redis = redis_on(&disk, port, "always").await;
    until_answering(&store).await;
    assert_eq!(missing(&store, &acked).await, Vec::<String>::new());
    let mut refused_claim = None;
    for i in 0..100_000 {
        let lease = Lease::from_secs(60);
        if let Err(e) = store
            .begin(&key(&format!("filling-{i}")), None, lease)
            .await
        {
            refused_claim = Some(e);
            break;
        }
    }
    let e = refused_claim.expect("the full disk refuses a claim");
    assert_transient(&e, "the refused claim");
    let later = complete(&store, name, *token).await;
    assert_transient(&later.unwrap_err(), "a held claim's complete");
    redis.stop().await;

    disk.free().unwrap();
    let mut redis = redis_on(&disk, port, "always").await;
    until_answering(&store).await;
    assert_eq!(missing(&store, &acked).await, Vec::<String>::new());
    // The claims held across the outage complete now.
    let rest = &held[refused..refused + 10];
    complete_all(&store, rest, &mut acked).await;
    redis.stop().await;
    let mut redis = redis_on(&disk, port, "always").await;
    until_answering(&store).await;
    assert_eq!(missing(&store, &acked).await, Vec::<String>::new());
    redis.stop().await;
    println!(
        "{} acknowledged in all, every one kept; {:?}",
        acked.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_appendfsync_everysec_redis_refuses_writes_and_holds_answered_ones_in_memory() {
    if !services::program("redis-server") {
        return;
    }
    let Some(disk) = SmallDisk::mount_for_test(DISK_BYTES) else {
        return;
    };
    let started = Instant::now();
    let port = free_port();
    let mut redis = redis_on(&disk, port, "everysec").await;
    let store = connect(port).await;
    let mut acked = Acked::new();
    let before = hold(&store, "before", 50).await;
    complete_all(&store, &before, &mut acked).await;
    let held = hold(&store, "held", 2_000).await;
    disk.fill().unwrap();

    let (refused, e) = complete_until_refused(&store, &held, &mut acked).await;
    assert_transient(&e, "the refused complete");
    let message = e.to_string();
    for part in ["MISCONF", "No space left on device", "free space"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    let begin = store.begin(&key("new"), None, Lease::from_secs(60)).await;
    assert_transient(&begin.unwrap_err(), "a new claim");
    // Reads go on, from memory.
    assert_eq!(missing(&store, &acked).await, Vec::<String>::new());

    // Room again: Redis writes what it held and takes writes by itself.
    disk.free().unwrap();
    let (name, token) = &held[refused];
    until("Redis takes writes again", async || {
        complete(&store, name, *token).await.is_ok()
    })
    .await;
    acked.insert(name.clone(), *token);
    complete_all(&store, &held[refused + 1..refused + 10], &mut acked).await;
    let new = acquired(
        store
            .begin(&key("new"), None, Lease::from_secs(60))
            .await
            .unwrap(),
    );
    println!("a new claim after room was freed: token {}", new.token);

    // Full again, then Redis killed before room is freed: the completions
    // it answered though it could not write them are gone.
    disk.fill().unwrap();
    let rest = &held[refused + 10..];
    let (more, e) = complete_until_refused(&store, rest, &mut acked).await;
    assert_transient(&e, "refused again");
    redis.signal("KILL").await;
    redis.stop().await;
    disk.free().unwrap();
    let mut redis = redis_on(&disk, port, "everysec").await;
    until_answering(&store).await;
    let lost = missing(&store, &acked).await;
    redis.stop().await;
    println!(
        "{more} completions answered on the full disk the second time; lost to kill -9: {lost:?}; {:?}",
        started.elapsed()
    );
    assert!(
        !lost.is_empty(),
        "every completion answered on the full disk survived kill -9: Redis wrote them"
    );
}

/// Completes every claim in `held`, each acknowledged.
async fn complete_all(store: &RedisStore, held: &[(String, FencingToken)], acked: &mut Acked) {
    for (name, token) in held {
        let done = complete(store, name, *token).await;
        assert_eq!(done.unwrap(), Fenced::Ok(()), "{name}");
        acked.insert(name.clone(), *token);
    }
}
