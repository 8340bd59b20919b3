//! Outcomes up to the limit (1 MiB by default) are stored and replayed
//! byte for byte, also many of them in one batch: a batch is cut into
//! statements the server accepts.

mod support;

use std::time::Duration;

use idem_core::{Begin, BeginItem, CompleteItem, Key, Lease, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_outcomes_at_the_limit_is_stored_whole() {
    for (service, url) in support::databases() {
        let Some(store) = support::open(service, &url, |b| b.table("idem_large_outcomes")).await
        else {
            continue;
        };
        let limit = store.limits().max_outcome_bytes;
        let run = format!("{}-{}", std::process::id(), support::fresh_prefix("x"));
        let items: Vec<BeginItem> = (0..12)
            .map(|i| BeginItem {
                key: Key::new("large", format!("{run}-{i}")).unwrap(),
                fingerprint: None,
                lease: Lease::from_secs(60),
            })
            .collect();
        let claims = store.begin_many(&items).await.unwrap();
        let outcome = |i: usize| -> Vec<u8> { (0..limit).map(|b| (b * 7 + i) as u8).collect() };
        let done: Vec<CompleteItem> = items
            .iter()
            .zip(&claims)
            .enumerate()
            .map(|(i, (item, claim))| {
                let Begin::Acquired(c) = claim else {
                    panic!("{service}: fresh keys are acquired")
                };
                CompleteItem {
                    key: item.key.clone(),
                    token: c.token,
                    outcome: Some(outcome(i).into()),
                    retention: Duration::from_secs(60),
                }
            })
            .collect();
        let answers = store.complete_many(&done).await.unwrap();
        assert!(
            answers.iter().all(|a| !a.is_stale()),
            "{service}: {answers:?}"
        );
        for (i, item) in items.iter().enumerate() {
            match store
                .begin(&item.key, None, Lease::from_secs(60))
                .await
                .unwrap()
            {
                Begin::Completed {
                    outcome: Some(o), ..
                } => {
                    assert!(
                        o[..] == outcome(i)[..],
                        "{service}: outcome {i} replayed as stored"
                    )
                }
                other => panic!("{service}: expected the outcome, got {other:?}"),
            }
        }
        support::drop_tables(&store, &url).await;
    }
}
