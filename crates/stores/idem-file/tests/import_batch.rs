//! A cold tier takes completed history in large batches: 10 000 records
//! in one `import_many`, written with one durable commit.

use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_core::Clock;
use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{Begin, Completed, FencingToken, Fingerprint, Key, Lease, Store, SystemClock};
use idem_file::FileStore;

const RECORDS: usize = 10_000;

fn items(now: idem_core::Timestamp) -> Vec<ImportItem> {
    (0..RECORDS)
        .map(|i| ImportItem {
            key: Key::new("import-batch", format!("order-{i:06}")).unwrap(),
            record: Completed {
                token: FencingToken::new(1_000_000 + i as u64),
                fingerprint: Some(Fingerprint::sha256(format!("payload {i}").as_bytes())),
                outcome: Some(Bytes::from(format!("{{\"receipt\":\"r-{i}\"}}"))),
                completed_at: now,
                expires_at: now.after(Duration::from_secs(3600)),
            },
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_import_in_one_call() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = FileStore::builder(dir.path())
        .sweep_interval(None)
        .open()
        .unwrap();
    let batch = items(SystemClock.now());

    let start = Instant::now();
    let answers = store.import_many(&batch).await.unwrap();
    let took = start.elapsed();
    eprintln!(
        "file store: imported {RECORDS} records in one call in {took:?} ({:.0} records/s)",
        RECORDS as f64 / took.as_secs_f64()
    );
    assert_eq!(answers, vec![Imported::Written; RECORDS]);

    // Each record is the key's, as given.
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
                assert_eq!(outcome, item.record.outcome);
                assert_eq!(completed_at, item.record.completed_at);
            }
            other => panic!("item {i}: expected the imported record, got {other:?}"),
        }
    }
    let mut listed = 0;
    let mut after = None;
    loop {
        let page = store.completed_keys(after.as_ref(), 1_000).await.unwrap();
        let Some(last) = page.last().cloned() else {
            break;
        };
        listed += page.len();
        after = Some(last);
    }
    assert_eq!(listed, RECORDS, "every imported key is listed once");

    // The same batch again keeps every record.
    let again = store.import_many(&batch).await.unwrap();
    assert_eq!(again, vec![Imported::Kept; RECORDS]);
    assert!(store.token_high_water().await.unwrap().get() >= 1_000_000 + RECORDS as u64 - 1);
}
