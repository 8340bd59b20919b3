//! Concurrent single calls travel together in batches that span cluster
//! masters; when one master refuses (here: out of memory, so it refuses
//! every script that may write), only the calls for its keys fail.
//! Callers whose keys live on a healthy master get their own answers, and
//! their claims are theirs to complete. On a cluster of two masters this
//! test starts itself, so breaking one disturbs no other test.

use std::time::Duration;

use idem_core::{Begin, BeginItem, Fenced, Key, Lease, Store, StoreError};
use idem_redis::RedisStore;
use idem_testkit::services;
use support::{OwnRedis, cli, cluster_node, free_port, until};

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_master_fails_only_the_calls_for_its_keys() {
    if !services::program("redis-server") {
        return;
    }
    // Two masters, half the slots each; the one left keeps serving its
    // slots while the other is down.
    let (a, b, a_bus) = (free_port(), free_port(), free_port());
    let node = |bus| {
        let mut args = cluster_node(bus);
        args.extend(["--cluster-require-full-coverage", "no"].map(str::to_owned));
        args
    };
    let _healthy = OwnRedis::start_with(a, &node(a_bus)).await;
    let _failing = OwnRedis::start_with(b, &node(free_port())).await;
    cli(a, &["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]).await;
    cli(b, &["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]).await;
    let (a_port, a_bus) = (a.to_string(), a_bus.to_string());
    cli(b, &["CLUSTER", "MEET", "127.0.0.1", &a_port, &a_bus]).await;
    until("both masters see a whole cluster", async || {
        for port in [a, b] {
            if !cli(port, &["CLUSTER", "INFO"])
                .await
                .contains("cluster_state:ok")
            {
                return false;
            }
        }
        true
    })
    .await;
    let nodes = [
        format!("redis://127.0.0.1:{a}"),
        format!("redis://127.0.0.1:{b}"),
    ];
    let seeds: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&seeds)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();

    // Keys on each master, found by asking Redis for their record's slot.
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    let mut n = 0;
    while on_a.len() < 28 || on_b.len() < 28 {
        n += 1;
        let k = Key::new("per-item", format!("k{n}-{}", std::process::id())).unwrap();
        let record = format!("idem:{{per-item:{}}}:r", String::from_utf8_lossy(k.bytes()));
        let slot: u16 = cli(a, &["CLUSTER", "KEYSLOT", &record])
            .await
            .parse()
            .unwrap();
        match slot {
            0..=8191 if on_a.len() < 28 => on_a.push(k),
            8192.. if on_b.len() < 28 => on_b.push(k),
            _ => {}
        }
    }
    let (many_a, many_b) = (on_a.split_off(24), on_b.split_off(24));
    // Every script that may write is refused there from now on.
    cli(b, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
    cli(b, &["CONFIG", "SET", "maxmemory", "1"]).await;

    // Interleaved, all at once: the calls that find others in flight are
    // sent together, keys of both masters in one batch.
    let calls: Vec<_> = on_a
        .iter()
        .zip(&on_b)
        .flat_map(|(x, y)| [(x.clone(), true), (y.clone(), false)])
        .map(|(k, healthy)| {
            let store = store.clone();
            tokio::spawn(async move {
                let answer = store.begin(&k, None, Lease::from_secs(60)).await;
                (k, healthy, answer)
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for call in calls {
        let (k, healthy, answer) = call.await.unwrap();
        match (healthy, answer) {
            (true, Ok(Begin::Acquired(claim))) => claimed.push((k, claim.token)),
            (true, other) => panic!("{k:?} lives on the healthy master, yet: {other:?}"),
            (false, Err(StoreError::Unavailable(_))) => {}
            (false, other) => panic!("{k:?} lives on the failing master, yet: {other:?}"),
        }
    }
    // The claims are real and their holders' own: each completes.
    let completes: Vec<_> = claimed
        .into_iter()
        .map(|(k, token)| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .complete(&k, token, Some("done".into()), Duration::from_secs(60))
                    .await
            })
        })
        .collect();
    for c in completes {
        assert_eq!(c.await.unwrap().unwrap(), Fenced::Ok(()));
    }

    // A `begin_many` that fails in part answers with the error and keeps
    // none of its claims: the keys on the healthy master are free again.
    let items: Vec<BeginItem> = many_a
        .iter()
        .chain(&many_b)
        .map(|k| BeginItem {
            key: k.clone(),
            fingerprint: None,
            lease: Lease::from_secs(60),
        })
        .collect();
    assert!(matches!(
        store.begin_many(&items).await,
        Err(StoreError::Unavailable(_))
    ));
    for k in &many_a {
        match store.begin(k, None, Lease::from_secs(60)).await.unwrap() {
            Begin::Acquired(_) => {}
            other => panic!("{k:?} was left claimed by a failed begin_many: {other:?}"),
        }
    }
}
