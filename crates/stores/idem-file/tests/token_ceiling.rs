//! A damaged token ceiling stops the store from opening: resuming tokens at 1
//! could hand a stale holder's token to a new claim.

use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use idem_file::{FileStore, OpenError};

#[test]
fn corrupt_token_ceiling_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(FileStore::open(dir.path()).unwrap());
    {
        let db = Database::builder(dir.path()).open().unwrap();
        let meta = db.keyspace("meta", KeyspaceCreateOptions::default).unwrap();
        meta.insert("token_ceiling", [7u8, 0, 0]).unwrap();
        db.persist(PersistMode::SyncAll).unwrap();
    }
    let err = match FileStore::open(dir.path()) {
        Ok(_) => panic!("a store with a 3-byte token ceiling opened"),
        Err(e) => e,
    };
    assert!(
        matches!(err, OpenError::CorruptTokenCeiling { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    for part in [
        "token ceiling",
        "holds 3 bytes",
        "instead of an 8-byte number",
        "refuses to open",
        "restore the directory from a backup",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}
