//! A cold tier takes completed history in large batches: 10 000 records in
//! one `import_many`, on PostgreSQL and on MySQL/MariaDB.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use std::time::{Duration, Instant};

use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{Begin, Completed, FencingToken, Fingerprint, Key, Lease, Store, Timestamp};

const RECORDS: usize = 10_000;

fn items(now: Timestamp) -> Vec<ImportItem> {
    (0..RECORDS)
        .map(|i| ImportItem {
            key: Key::new("import-batch", format!("order-{i:06}")).unwrap(),
            record: Completed {
                token: FencingToken::new(1_000_000 + i as u64),
                fingerprint: Some(Fingerprint::sha256(format!("payload {i}").as_bytes())),
                outcome: Some(format!("{{\"receipt\":\"r-{i}\"}}").into()),
                completed_at: now,
                expires_at: now.after(Duration::from_secs(3600)),
            },
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_import_in_one_call() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("import");
        let Some(store) =
            support::open(service, &url, |b| b.table(&prefix).sweep_interval(None)).await
        else {
            continue;
        };
        let now = Timestamp::from_millis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64,
        );
        let batch = items(now);

        let start = Instant::now();
        let answers = store.import_many(&batch).await.unwrap();
        let took = start.elapsed();
        eprintln!(
            "{service}: imported {RECORDS} records in one call in {took:?} ({:.0} records/s)",
            RECORDS as f64 / took.as_secs_f64()
        );
        assert_eq!(answers, vec![Imported::Written; RECORDS], "{service}");

        for i in [0, 4_321, RECORDS - 1] {
            let item = &batch[i];
            let fp = item.record.fingerprint;
            match store
                .begin(&item.key, fp, Lease::from_secs(30))
                .await
                .unwrap()
            {
                Begin::Completed {
                    outcome,
                    completed_at,
                } => {
                    assert_eq!(outcome, item.record.outcome, "{service}");
                    assert_eq!(completed_at, item.record.completed_at, "{service}");
                }
                other => panic!("{service}: item {i}: expected the imported record, got {other:?}"),
            }
        }
        let listed = store.completed_keys(None, RECORDS + 1).await.unwrap();
        let want: Vec<Key> = batch.iter().map(|i| i.key.clone()).collect();
        assert!(listed == want, "{service}: every imported key, in order");

        let start = Instant::now();
        let again = store.import_many(&batch).await.unwrap();
        eprintln!(
            "{service}: imported the same {RECORDS} again (all kept) in {:?}",
            start.elapsed()
        );
        assert_eq!(again, vec![Imported::Kept; RECORDS], "{service}");
        support::drop_tables(&store, &url).await;
    }
}
