//! Outcomes up to the limit (1 MiB by default) are stored and replayed
//! byte for byte, also many of them in one batch: a batch is cut into
//! statements the server accepts. On MySQL an outcome travels as its
//! bytes, so one over half the server's packet limit is stored too, and a
//! limit the packet cannot carry is refused when the store opens.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::Duration;

use idem_core::{Begin, BeginItem, CompleteItem, Key, Lease, Limits, Record, Store};

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

/// The MySQL server's `max_allowed_packet`, in bytes.
async fn max_allowed_packet(url: &str) -> usize {
    let n = support::count(url, "SELECT CAST(@@max_allowed_packet AS SIGNED)").await;
    usize::try_from(n).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_over_half_the_packet_limit_is_stored_as_its_bytes() {
    let url = support::mysql_url();
    let prefix = support::fresh_prefix("packet");
    // Probe first: the limit below needs the server's packet size.
    let Some(probe) = support::open("MySQL", &url, |b| b.table(&prefix)).await else {
        return;
    };
    drop(probe);
    // More than half the packet: as hexadecimal text it would not fit.
    let size = max_allowed_packet(&url).await * 3 / 5;
    let limits = Limits {
        max_outcome_bytes: size,
        ..Limits::default()
    };
    let store = support::open("MySQL", &url, |b| b.table(&prefix).limits(limits))
        .await
        .expect("the limit fits the packet");
    let key = Key::new("large", format!("packet-{prefix}")).unwrap();
    let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(60)).await.unwrap()
    else {
        panic!("a fresh key is acquired")
    };
    let outcome: Vec<u8> = (0..size).map(|b| (b * 31) as u8).collect();
    let done = store
        .complete(
            &key,
            claim.token,
            Some(outcome.clone().into()),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(!done.is_stale());
    match store.get(&key).await.unwrap() {
        Some(Record::Completed(done)) => assert!(
            done.outcome.as_deref() == Some(&outcome[..]),
            "the outcome is stored byte for byte"
        ),
        other => panic!("the completed record is kept, got {:?}", other.is_some()),
    }
    support::drop_tables(&store, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_limit_the_packet_cannot_carry_is_refused_at_open() {
    let url = support::mysql_url();
    let prefix = support::fresh_prefix("packet");
    let Some(probe) = support::open("MySQL", &url, |b| b.table(&prefix)).await else {
        return;
    };
    support::drop_tables(&probe, &url).await;
    drop(probe);
    let packet = max_allowed_packet(&url).await;
    let limits = Limits {
        max_outcome_bytes: packet,
        ..Limits::default()
    };
    let err = match idem_sql::SqlStore::builder(&url)
        .table(&prefix)
        .limits(limits)
        .connect()
        .await
    {
        Ok(_) => panic!("a limit of the whole packet leaves no room for the statement"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!("max_outcome_bytes is {packet}"))
            && err.contains(&format!("max_allowed_packet is {packet}"))
            && err.contains("raise max_allowed_packet")
            && err.contains("lower max_outcome_bytes"),
        "{err}"
    );
    support::exec(&url, &format!("DROP TABLE IF EXISTS `{prefix}`")).await;
    support::exec(&url, &format!("DROP TABLE IF EXISTS `{prefix}_tokens`")).await;
    support::exec(&url, &format!("DROP TABLE IF EXISTS `{prefix}_schema`")).await;
}
