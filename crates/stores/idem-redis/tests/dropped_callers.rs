//! Callers that stop waiting (their futures dropped) at each stage of a
//! call leave every key usable: a `begin` or `complete` still queued for
//! the next batch is not sent; a `begin` whose batch was sent lets its
//! claim go once the answer comes; a dropped `LockGuard::release` still
//! releases. (A dropped `try_lock` is in `lock.rs`; every store operation
//! dropped after one poll, and at random points, is in the conformance
//! kit.) On a Redis of its own, whose writes the test pauses
//! (`CLIENT PAUSE … WRITE`) so calls stay in flight.

use std::time::Duration;

use idem_core::{Begin, Fenced, Key, Lease, Record, Store};
use idem_redis::RedisStore;
use idem_testkit::cases::acquired;
use idem_testkit::services;
use support::{OwnRedis, free_port};

mod support;

/// A store on a Redis of its own, and a plain connection to pause it.
async fn own() -> Option<(OwnRedis, RedisStore, redis::aio::MultiplexedConnection)> {
    if !services::program("redis-server") {
        return None;
    }
    let port = free_port();
    let redis = OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((redis, store, raw))
}

/// Writes wait for `ms` while Redis is paused; the store's calls stay in
/// flight.
async fn pause_writes(raw: &mut redis::aio::MultiplexedConnection, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query_async(raw)
        .await
        .unwrap();
}

fn key(n: &str) -> Key {
    Key::new("dropped-callers", n.to_owned()).unwrap()
}

fn lease() -> Lease {
    Lease::from_secs(30)
}

/// Fills every call slot with calls that wait out the pause, `call(i)`
/// for i in 0..12: one direct call, then one batch after another.
async fn fill_call_slots<T: Send + 'static>(
    call: impl Fn(usize) -> futures_util::future::BoxFuture<'static, T>,
) -> Vec<tokio::task::JoinHandle<T>> {
    let mut held = Vec::new();
    for i in 0..12 {
        held.push(tokio::spawn(call(i)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held
}

/// `begin` of key `held-{i}`, to fill the call slots with.
fn held_begin(
    store: &RedisStore,
) -> impl Fn(usize) -> futures_util::future::BoxFuture<'static, Begin> {
    let store = store.clone();
    move |i| {
        let store = store.clone();
        Box::pin(async move {
            store
                .begin(&key(&format!("held-{i}")), None, lease())
                .await
                .unwrap()
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_queued_begin_is_not_sent() {
    let Some((_redis, store, mut raw)) = own().await else {
        return;
    };
    pause_writes(&mut raw, 1000).await;
    let held = fill_call_slots(held_begin(&store)).await;
    // These queue behind the full slots; their callers give up.
    for i in 0..4 {
        let k = key(&format!("dropped-{i}"));
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), store.begin(&k, None, lease())).await;
        assert!(gave_up.is_err(), "still queued while Redis is paused");
    }
    for h in held {
        // The held calls went through once Redis woke.
        acquired(h.await.unwrap());
    }
    for i in 0..4 {
        let k = key(&format!("dropped-{i}"));
        assert_eq!(
            store.get(&k).await.unwrap(),
            None,
            "a begin whose caller left was not sent"
        );
        // The key is free for the next delivery.
        let claim = acquired(store.begin(&k, None, lease()).await.unwrap());
        assert_eq!(claim.attempt, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sent_begin_lets_its_claim_go() {
    let Some((_redis, store, mut raw)) = own().await else {
        return;
    };
    pause_writes(&mut raw, 600).await;
    // One call in flight, so the next goes out in a batch of its own at
    // once, and waits out the pause on Redis.
    let held = {
        let store = store.clone();
        tokio::spawn(async move { store.begin(&key("in-flight"), None, lease()).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let k = key("sent-then-dropped");
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), store.begin(&k, None, lease())).await;
    assert!(gave_up.is_err(), "still in flight while Redis is paused");
    acquired(held.await.unwrap().unwrap());
    // The dropped begin runs on Redis just after the held one: a read
    // before it lands would see no record yet. Wait until it has made its
    // claim (or until it is plainly let go already).
    let mut record = store.get(&k).await.unwrap();
    for _ in 0..25 {
        if record.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        record = store.get(&k).await.unwrap();
    }
    // Its answer came back to nobody: the claim it made is let go.
    for _ in 0..50 {
        if record.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        record = store.get(&k).await.unwrap();
    }
    assert_eq!(record, None, "the claim nobody heard of was released");
    let claim = acquired(store.begin(&k, None, lease()).await.unwrap());
    assert_eq!(claim.attempt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_queued_complete_is_not_sent_and_a_retry_completes() {
    let Some((_redis, store, mut raw)) = own().await else {
        return;
    };
    let k = key("complete-dropped");
    let claim = acquired(store.begin(&k, None, lease()).await.unwrap());
    let mut claims = Vec::new();
    for i in 0..12 {
        let k = key(&format!("held-complete-{i}"));
        claims.push((
            k.clone(),
            acquired(store.begin(&k, None, lease()).await.unwrap()).token,
        ));
    }
    pause_writes(&mut raw, 1000).await;
    let held = fill_call_slots(|i| {
        let (store, (k, token)) = (store.clone(), claims[i].clone());
        Box::pin(async move {
            store
                .complete(&k, token, None, Duration::from_secs(60))
                .await
                .unwrap()
        })
    })
    .await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        store.complete(&k, claim.token, Some("x".into()), Duration::from_secs(60)),
    )
    .await;
    assert!(gave_up.is_err(), "still queued while Redis is paused");
    for h in held {
        assert_eq!(h.await.unwrap(), Fenced::Ok(()));
    }
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress(_))),
        "a complete whose caller left was not sent"
    );
    // The holder retries, and the key replays its outcome.
    let done = store
        .complete(&k, claim.token, Some("x".into()), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    match store.begin(&k, None, lease()).await.unwrap() {
        Begin::Completed { outcome, .. } => assert_eq!(outcome.as_deref(), Some(&b"x"[..])),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_release_still_releases() {
    let Some((_redis, store, mut raw)) = own().await else {
        return;
    };
    let lock = store.lock("release-dropped").lease(Duration::from_secs(30));
    let guard = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    pause_writes(&mut raw, 300).await;
    let gave_up = tokio::time::timeout(Duration::from_millis(50), guard.release()).await;
    assert!(gave_up.is_err(), "still in flight while Redis is paused");
    // Well within the 30 s lease, the lock is free again.
    let next = lock
        .try_lock(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("the dropped release went through");
    assert!(next.release().await.unwrap());
}
