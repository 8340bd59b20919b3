//! Hash sharding: each key lives in the table its stable hash names, keys
//! spread over every table, and operations find them there.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_core::{Begin, Key, Lease, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_in_the_table_their_hash_names() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("shards");
        let Some(store) = support::open(service, &url, |b| b.table(&prefix).shards(8)).await else {
            continue;
        };
        let tables = store.tables().clone();
        let keys: Vec<Key> = (0..200)
            .map(|i| Key::new("orders", format!("order-{i}")).unwrap())
            .collect();
        for key in &keys {
            let Begin::Acquired(c) = store.begin(key, None, Lease::from_secs(60)).await.unwrap()
            else {
                panic!("{service}: a fresh key is acquired");
            };
            let done = store
                .complete(key, c.token, Some("x".into()), Duration::from_secs(60))
                .await
                .unwrap();
            assert!(!done.is_stale());
        }
        for shard in 0..8 {
            let name = tables.name(shard).to_string();
            let expected = keys.iter().filter(|k| tables.shard_of(k) == shard).count();
            assert!(expected > 0, "200 keys reach every one of 8 tables");
            let quoted = if url.starts_with("postgres") {
                format!("\"{name}\"")
            } else {
                format!("`{name}`")
            };
            let rows = support::count(&url, &format!("SELECT COUNT(*) FROM {quoted}")).await;
            assert_eq!(rows as usize, expected, "{service}: rows of {name}");
        }
        // A batch that spans every table answers each item in order.
        let answers = store
            .begin_many(
                &keys
                    .iter()
                    .map(|k| idem_core::BeginItem {
                        key: k.clone(),
                        fingerprint: None,
                        lease: Lease::from_secs(60),
                    })
                    .collect::<Vec<_>>(),
            )
            .await
            .unwrap();
        assert!(answers.iter().all(|a| matches!(a, Begin::Completed { .. })));
        support::drop_tables(&store, &url).await;
    }
}
