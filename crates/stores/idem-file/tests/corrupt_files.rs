//! A damaged store directory is refused at `open` with an error that names
//! the directory and says what to do, or it opens and every record reads
//! back as written or as a reported corruption: never a panic, never a
//! wrong outcome, never a record silently gone.
//!
//! The damage: a record value with bytes flipped (through the engine, so
//! that only idem's decoding can notice, and in the files themselves, in
//! the journal and in a table), the journal cut short, and a file replaced
//! by garbage.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use idem_core::{Fenced, Key, Lease, Record, Store, StoreError};
use idem_file::{Durability, FileStore, OpenError};
use idem_testkit::cases::acquired;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A store in `dir` holding `count` completed records with outcomes of
/// `size` bytes, each spelling its key; closed before this returns.
async fn filled(dir: &Path, count: usize, size: usize) -> Vec<(Key, Bytes)> {
    let store = FileStore::builder(dir)
        .durability(Durability::Immediate)
        .open()
        .unwrap();
    let mut written = Vec::new();
    for i in 0..count {
        let key = Key::new("orders", format!("order-{i:04}")).unwrap();
        let text = format!("{{\"receipt\":\"r-{i:04}\"}}");
        let outcome = Bytes::from(text.repeat(size.div_ceil(text.len()).max(1)));
        let claim = acquired(store.begin(&key, None, Lease::from_secs(60)).await.unwrap());
        let done = store
            .complete(
                &key,
                claim.token,
                Some(outcome.clone()),
                Duration::from_secs(3600),
            )
            .await
            .unwrap();
        assert_eq!(done, Fenced::Ok(()));
        written.push((key, outcome));
    }
    store.flush().unwrap();
    drop(store);
    written
}

/// Every file under `dir`, largest first.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).unwrap().len()));
    out
}

/// The journal files (`N.jnl`).
fn journals(dir: &Path) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jnl"))
        .collect()
}

/// The first file holding `needle`, and where.
fn find(dir: &Path, needle: &[u8]) -> Option<(PathBuf, usize)> {
    files(dir).into_iter().find_map(|p| {
        let bytes = std::fs::read(&p).ok()?;
        let at = bytes.windows(needle.len()).position(|w| w == needle)?;
        Some((p, at))
    })
}

fn flip(path: &Path, at: usize, count: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    for b in &mut bytes[at..at + count] {
        *b ^= 0x5a;
    }
    std::fs::write(path, bytes).unwrap();
}

/// What opening the damaged directory came to.
enum Opened {
    Refused(OpenError),
    /// It opened; how many records read back as written, how many were
    /// reported corrupt, and how many are gone.
    Read {
        intact: usize,
        reported: usize,
        gone: usize,
    },
}

/// Opens `dir` (a panic fails the test) and reads every record of
/// `written` back: each must be intact, reported or gone, never different.
async fn reopen(dir: &Path, written: &[(Key, Bytes)]) -> Opened {
    let opened = catch_unwind(AssertUnwindSafe(|| FileStore::open(dir)))
        .unwrap_or_else(|_| panic!("opening the damaged store at {} panicked", dir.display()));
    let store = match opened {
        Ok(store) => store,
        Err(e) => return Opened::Refused(e),
    };
    let (mut intact, mut reported, mut gone) = (0, 0, 0);
    for (key, outcome) in written {
        match store.get(key).await {
            Ok(Some(Record::Completed(c))) => {
                assert_eq!(
                    c.outcome.as_ref(),
                    Some(outcome),
                    "{key} reads back a different outcome"
                );
                intact += 1;
            }
            Ok(None) => gone += 1,
            Ok(Some(other)) => panic!("{key} changed: {other:?}"),
            Err(e) => {
                // Damage is no outage: a retry would fail the same way.
                assert!(matches!(e, StoreError::Corrupt(_)), "{key}: {e}");
                reported += 1;
            }
        }
    }
    Opened::Read {
        intact,
        reported,
        gone,
    }
}

/// A refusal names the directory, says the store is damaged, and what to
/// do about it.
fn assert_clear(err: &OpenError, dir: &Path) {
    let message = err.to_string();
    for part in [
        &dir.display().to_string()[..],
        "damaged",
        "restore the directory from a backup",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

/// The journal is read back write batch by write batch, and the engine
/// cannot tell a batch that damage cut short from the last one a crash cut
/// short: it cuts the journal there. Records past the cut may be gone, but
/// not silently: the store warns, naming the journal and how much it cut
/// (which the journal's shrinking shows here; `idem serve` prints it), or
/// refuses to open.
fn check_journal_loss(opened: Opened, dir: &Path, journal: &Path, left: u64) {
    match opened {
        Opened::Refused(e) => assert_clear(&e, dir),
        Opened::Read { gone: 0, .. } => {}
        Opened::Read { gone, .. } => {
            let now = std::fs::metadata(journal).map_or(0, |m| m.len());
            assert!(
                now < left,
                "{gone} records are gone and the journal was not cut ({now} bytes): nothing said so"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_value_with_flipped_bytes_is_reported_not_returned() {
    let dir = dir();
    let written = filled(dir.path(), 20, 40).await;
    // Damage three records' stored values the way a bad sector would,
    // through the engine, so that only idem's decoding can tell.
    {
        let db = Database::builder(dir.path()).open().unwrap();
        let records = db
            .keyspace("records", KeyspaceCreateOptions::default)
            .unwrap();
        for (i, (key, _)) in written.iter().take(3).enumerate() {
            let mut value = records.get(key.encode()).unwrap().unwrap().to_vec();
            match i {
                0 => value[0] ^= 0xff,   // the format version
                1 => value[25] ^= 0x80,  // the flags
                _ => value.truncate(10), // cut inside the header
            }
            records.insert(key.encode(), value).unwrap();
        }
        db.persist(PersistMode::SyncAll).unwrap();
    }
    match reopen(dir.path(), &written).await {
        Opened::Read {
            intact,
            reported,
            gone,
        } => {
            assert_eq!((reported, gone), (3, 0), "each damaged record is reported");
            assert_eq!(intact, written.len() - 3);
        }
        Opened::Refused(e) => panic!("a damaged record value stopped the whole store: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_the_journal_are_refused_with_what_to_do() {
    let dir = dir();
    let written = filled(dir.path(), 20, 40).await;
    let (path, at) = find(dir.path(), b"r-0007").expect("the journal holds the outcome");
    flip(&path, at, 4);
    match reopen(dir.path(), &written).await {
        Opened::Refused(e) => assert_clear(&e, dir.path()),
        Opened::Read { intact, .. } => assert_eq!(intact, written.len(), "nothing lost"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_a_table_are_refused_or_reported() {
    let dir = dir();
    // Over the 8 MiB memtable: the engine writes tables.
    let written = filled(dir.path(), 100, 128 * 1024).await;
    let table = files(dir.path())
        .into_iter()
        .find(|p| p.components().any(|c| c.as_os_str() == "tables"))
        .expect("a table was written");
    let len = std::fs::metadata(&table).unwrap().len() as usize;
    flip(&table, len / 3, 16);
    match reopen(dir.path(), &written).await {
        Opened::Refused(e) => assert_clear(&e, dir.path()),
        Opened::Read { gone, .. } => assert_eq!(gone, 0, "no record is gone"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_journal_is_refused_or_its_loss_is_reported() {
    let dir = dir();
    let written = filled(dir.path(), 20, 40).await;
    let journal = journals(dir.path()).into_iter().next().expect("a journal");
    let half = std::fs::metadata(&journal).unwrap().len() / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(half)
        .unwrap();
    let opened = reopen(dir.path(), &written).await;
    check_journal_loss(opened, dir.path(), &journal, half);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_garbage_is_refused_or_its_loss_is_reported() {
    // Each of the store's files in turn replaced by garbage of its size.
    let template = dir();
    let written = filled(template.path(), 20, 40).await;
    for victim in files(template.path()) {
        let relative = victim.strip_prefix(template.path()).unwrap().to_path_buf();
        if relative.as_os_str() == "lock" {
            continue;
        }
        let dir = dir();
        copy_tree(template.path(), dir.path());
        let path = dir.path().join(&relative);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        let garbage: Vec<u8> = (0..len.max(64))
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        std::fs::write(&path, &garbage).unwrap();
        let opened = reopen(dir.path(), &written).await;
        let outcome = match &opened {
            Opened::Refused(_) => "refused".to_owned(),
            Opened::Read {
                intact,
                reported,
                gone,
            } => format!("opened: {intact} intact, {reported} reported, {gone} gone"),
        };
        println!("garbage in {}: {outcome}", relative.display());
        if path.extension().is_some_and(|e| e == "jnl") {
            check_journal_loss(opened, dir.path(), &path, garbage.len() as u64);
            continue;
        }
        match opened {
            Opened::Refused(e) => assert_clear(&e, dir.path()),
            Opened::Read { gone, .. } => {
                assert_eq!(gone, 0, "garbage in {}: records gone", relative.display())
            }
        }
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
