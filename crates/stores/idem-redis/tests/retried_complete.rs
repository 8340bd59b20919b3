//! A `complete` retried by the token that completed the record is answered
//! `Ok` again and changes nothing (its first answer may have been lost);
//! any other token is still stale. Alone, in `complete_many`, and when
//! concurrent single calls travel together in one batch; on a standalone
//! Redis, on its plain-command path, and on the cluster.

use std::time::Duration;

use bytes::Bytes;
use idem_core::{CompleteItem, Fenced, FencingToken, Key, Lease, Record, Store};
use idem_redis::{RedisStore, RedisStoreBuilder};
use idem_testkit::cases::{acquired, deliver};
use idem_testkit::services;

async fn standalone(configure: fn(RedisStoreBuilder) -> RedisStoreBuilder) -> Option<RedisStore> {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    match configure(RedisStore::builder(&url)).connect().await {
        Ok(s) => Some(s),
        Err(e) => services::absent("Redis", &url, e),
    }
}

async fn cluster() -> Option<RedisStore> {
    let urls = services::url(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002",
    );
    let nodes: Vec<&str> = urls.split(',').collect();
    match RedisStore::cluster_builder(&nodes).connect().await {
        Ok(s) => Some(s),
        Err(e) => services::absent("Redis Cluster", &urls, e),
    }
}

fn key(k: &str) -> Key {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Key::new(
        "retried-complete",
        format!("{k}-{}-{nanos}", std::process::id()),
    )
    .unwrap()
}

fn item(key: &Key, token: FencingToken, outcome: &'static str) -> CompleteItem {
    CompleteItem {
        key: key.clone(),
        token,
        outcome: Some(Bytes::from_static(outcome.as_bytes())),
        retention: Duration::from_secs(600),
    }
}

async fn outcome_of(store: &RedisStore, k: &Key) -> Record {
    store.get(k).await.unwrap().expect("a record")
}

async fn retried_by_its_token_is_ok_and_changes_nothing(store: RedisStore) {
    // Alone.
    let k = key("alone");
    let token = deliver(&store, &k, "first").await;
    let before = outcome_of(&store, &k).await;
    let again = store
        .complete(&k, token, Some("second".into()), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(again, Fenced::Ok(()), "the completing token's retry");
    assert_eq!(outcome_of(&store, &k).await, before, "nothing changed");
    let other = FencingToken::new(token.get() + 1);
    assert_eq!(
        store
            .complete(&k, other, Some("third".into()), Duration::from_secs(1))
            .await
            .unwrap(),
        Fenced::Stale,
        "any other token"
    );
    assert_eq!(outcome_of(&store, &k).await, before);

    // In one many-item call, beside a stale item and a fresh claim.
    let (done, fresh) = (key("many-done"), key("many-fresh"));
    let done_token = deliver(&store, &done, "kept").await;
    let done_before = outcome_of(&store, &done).await;
    let claim = acquired(
        store
            .begin(&fresh, None, Lease::from_secs(60))
            .await
            .unwrap(),
    );
    let answers = store
        .complete_many(&[
            item(&done, done_token, "changed"),
            item(&done, FencingToken::new(done_token.get() - 1), "stale"),
            item(&fresh, claim.token, "now"),
            item(&fresh, claim.token, "retried in the same call"),
        ])
        .await
        .unwrap();
    assert_eq!(
        answers,
        [
            Fenced::Ok(()),
            Fenced::Stale,
            Fenced::Ok(()),
            Fenced::Ok(())
        ]
    );
    assert_eq!(outcome_of(&store, &done).await, done_before);
    match outcome_of(&store, &fresh).await {
        Record::Completed(r) => assert_eq!(r.outcome.as_deref(), Some(&b"now"[..])),
        other => panic!("{other:?}"),
    }

    // Concurrent single calls, gathered into batches: every retry of the
    // completing token is answered Ok, one outcome stands.
    let k = key("coalesced");
    let claim = acquired(store.begin(&k, None, Lease::from_secs(60)).await.unwrap());
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move {
                let outcome = Bytes::from(format!("try {i}"));
                let r = store
                    .complete(&k, claim.token, Some(outcome), Duration::from_secs(600))
                    .await
                    .unwrap();
                let stale = store
                    .complete(&k, FencingToken::new(1), None, Duration::from_secs(600))
                    .await
                    .unwrap();
                (r, stale)
            })
        })
        .collect();
    for t in tasks {
        let (r, stale) = t.await.unwrap();
        assert_eq!(r, Fenced::Ok(()));
        assert_eq!(stale, Fenced::Stale);
    }
    assert!(matches!(outcome_of(&store, &k).await, Record::Completed(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_retried_complete_is_ok() {
    if let Some(store) = standalone(|b| b).await {
        retried_by_its_token_is_ok_and_changes_nothing(store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_commands_retried_complete_is_ok() {
    if let Some(store) = standalone(|b| b.coalesce(false).plain_commands()).await {
        retried_by_its_token_is_ok_and_changes_nothing(store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_retried_complete_is_ok() {
    if let Some(store) = cluster().await {
        retried_by_its_token_is_ok_and_changes_nothing(store).await;
    }
}
