//! A `begin_many` whose statement for one shard fails answers the error
//! and releases the claims its other statements made: the caller has no
//! tokens to complete them, so they must not block their keys for a lease.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use idem_core::{Begin, BeginItem, Key, Lease, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_begin_many_releases_the_claims_it_made() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("partial");
        let Some(store) = support::open(service, &url, |b| b.table(&prefix).shards(2)).await else {
            continue;
        };
        let items: Vec<BeginItem> = (0..40)
            .map(|i| BeginItem {
                key: Key::new("partial", format!("key-{i}")).unwrap(),
                fingerprint: None,
                lease: Lease::from_secs(600),
            })
            .collect();
        let on_shard = |shard| {
            items
                .iter()
                .filter(|i| store.tables().shard_of(&i.key) == shard)
                .count()
        };
        assert!(
            on_shard(0) > 0 && on_shard(1) > 0,
            "{service}: keys on both shards"
        );
        // The second shard's statement fails: its table is gone.
        let gone = store.tables().name(1).to_string();
        let drop = if url.starts_with("postgres") {
            format!("DROP TABLE \"{gone}\"")
        } else {
            format!("DROP TABLE `{gone}`")
        };
        support::exec(&url, &drop).await;

        let err = store
            .begin_many(&items)
            .await
            .expect_err("one shard's statement fails");
        assert!(err.is_transient(), "{service}: {err}");
        for item in items
            .iter()
            .filter(|i| store.tables().shard_of(&i.key) == 0)
        {
            let again = store
                .begin(&item.key, None, Lease::from_secs(600))
                .await
                .unwrap();
            assert!(
                matches!(again, Begin::Acquired(_)),
                "{service}: {:?} was claimed by the failed call and not released: {again:?}",
                item.key
            );
        }
        support::drop_tables(&store, &url).await;
    }
}
