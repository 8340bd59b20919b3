//! A damaged token ceiling or high-water mark stops the store from opening:
//! resuming tokens at 1 could hand a stale holder's token to a new claim.

use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use idem_file::{FileStore, OpenError};

/// Opens a store whose `meta` key `key` holds `value`; returns the error.
fn open_with_meta(key: &str, value: &[u8]) -> OpenError {
    let dir = tempfile::tempdir().unwrap();
    drop(FileStore::open(dir.path()).unwrap());
    {
        let db = Database::builder(dir.path()).open().unwrap();
        let meta = db.keyspace("meta", KeyspaceCreateOptions::default).unwrap();
        meta.insert(key, value).unwrap();
        db.persist(PersistMode::SyncAll).unwrap();
    }
    match FileStore::open(dir.path()) {
        Ok(_) => panic!("a store whose {key} holds {} bytes opened", value.len()),
        Err(e) => e,
    }
}

fn assert_says(err: &OpenError, parts: &[&str]) {
    let message = err.to_string();
    for part in parts {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn corrupt_token_ceiling_refuses_to_open() {
    let err = open_with_meta("token_ceiling", &[7, 0, 0]);
    assert!(
        matches!(err, OpenError::CorruptTokenCeiling { .. }),
        "{err:?}"
    );
    assert_says(
        &err,
        &[
            "token ceiling",
            "holds 3 bytes",
            "instead of an 8-byte number",
            "refuses to open",
            "restore the directory from a backup",
        ],
    );
}

#[test]
fn corrupt_token_high_water_refuses_to_open() {
    let err = open_with_meta("token_high_water", &[1; 9]);
    assert!(
        matches!(err, OpenError::CorruptTokenHighWater { .. }),
        "{err:?}"
    );
    assert_says(
        &err,
        &[
            "token high-water mark",
            "holds 9 bytes",
            "instead of an 8-byte number",
            "refuses to open",
            "restore the directory from a backup",
        ],
    );
}
