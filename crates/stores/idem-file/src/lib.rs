//! idem's embedded durable store: one directory on local disk, nothing else
//! to run. The default store of `idem serve`.
//!
//! Completed records live in [fjall](https://docs.rs/fjall), an LSM-tree
//! engine (a dedup store is write-heavy: every message writes, few read
//! back), with an expiry index that a background sweeper follows. In-progress
//! claims live in memory (see below). An acknowledged `complete` survives
//! `kill -9` and, with [`Durability::GroupCommit`] or
//! [`Durability::Immediate`], power loss.
//!
//! ```no_run
//! use idem_file::FileStore;
//! use idem_core::{Guard, Key};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = FileStore::open("./idem-data")?;
//! let guard = Guard::new(store);
//! let key = Key::new("orders", "o-1")?;
//! let n: u32 = guard.run(&key, None, |_| async { Ok::<_, std::io::Error>(1) }).await?;
//! # Ok(()) }
//! ```
//!
//! # What a crash keeps
//!
//! - Every acknowledged `complete`, with its outcome.
//! - Fencing tokens stay monotonic: a restarted store issues only tokens
//!   above any issued before, imported with a record or raised as a floor
//!   (see [`Tier`](idem_core::tier::Tier)).
//! - In-progress claims are lost. That acts like the expiry of their leases:
//!   their holders' tokens are stale, and the next delivery acquires again.
//!   Only what must survive a crash waits for the disk, which is why a
//!   `begin` costs no fsync.
//!
//! # A full disk
//!
//! The first write the disk refuses (a completion, the token ceiling a
//! claim raises once per 2^20 tokens, or a table the engine writes in the
//! background) stops the store: that operation and every later one, reads
//! too, answer [`StoreError::Unavailable`] saying the disk is full, and no
//! `complete` answers `Ok` unless its record was written. Every completion
//! acknowledged before is kept. The store does not resume by itself: free
//! space, then open it again (it also opens on a disk still full, and stops
//! again at the next write the disk refuses). A completion refused this way
//! may turn out written after all (the engine writes what it held as it
//! closes): its holder's retry then answers `Ok`. `tests/disk_full.rs`
//! shows each case.
#![deny(missing_docs)]

mod admin;
mod claims;
mod codec;
mod commit;
mod dir;
mod failure;
mod records;
mod tier;
mod tokens;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use idem_core::layer::{Checked, StoreWrapper};
use idem_core::machine::{self, Current, Decision};
use idem_core::periodic::spawn_periodic;
use idem_core::{
    Begin, Claim as Acquired, Clock, CompleteItem, Completed, DEFAULT_ABANDONED_RETENTION, Entry,
    Fenced, FencingToken, Fingerprint, InProgress, Key, Lease, Limits, Record, ScanQuery,
    StoreError, SystemClock, Timestamp,
};
use tokio::sync::oneshot;

use self::claims::{Claim, Claims, encoded};
use self::codec::{completed_key, decode_completed, expiry_key};
pub use self::commit::Durability;

/// The on-disk record format, for the fuzz targets in `fuzz/`; not part of
/// the API.
#[doc(hidden)]
pub mod on_disk {
    pub use crate::codec::{decode_completed, encode_completed, expires_at_of, split_expiry_key};
}
use self::commit::{Job, Put};
use self::failure::{WriteFailed, is_disk_full};
use self::records::Records;
use parking_lot::MutexGuard;

/// Why a file store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The directory could not be created or used.
    #[error("cannot use {path}: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The storage engine refused to open or recover the directory.
    #[error(
        "cannot open the store at {path}: {source} (is another idem process using it? each directory takes one process)"
    )]
    Engine {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: fjall::Error,
    },
    /// The disk holding the directory has no room left (or the quota on it
    /// is used up): the store cannot make the writes opening takes.
    #[error(
        "cannot open the store at {path}: its disk is full ({source}); free space on that disk, then open the store again"
    )]
    DiskFull {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The engine found the store's files damaged: a checksum that does not
    /// match, a file cut short, bytes that are not what the engine wrote.
    #[error(
        "the store at {path} is damaged: {source}; its files no longer read back as they were written, so the store refuses to open rather than lose or change records; restore the directory from a backup, or move it aside and start over in an empty directory once every client that may still hold a token has stopped"
    )]
    Damaged {
        /// The directory.
        path: PathBuf,
        /// What the engine found.
        source: fjall::Error,
    },
    /// The stored token ceiling is damaged: the store cannot know which
    /// fencing tokens it already issued, and reusing one would let a stale
    /// holder pass as the current one.
    #[error(
        "the store at {path} is damaged: its token ceiling (key `token_ceiling` in keyspace `meta`) holds {} bytes ({value:02x?}) instead of an 8-byte number, so the fencing tokens already issued are unknown and the store refuses to open rather than reuse one; restore the directory from a backup, or stop every client that may still hold a token before starting over in an empty directory",
        value.len()
    )]
    CorruptTokenCeiling {
        /// The directory.
        path: PathBuf,
        /// The stored value.
        value: Vec<u8>,
    },
    /// The stored token high-water mark is damaged: the store cannot know
    /// which fencing tokens it imported or was told to stay above.
    #[error(
        "the store at {path} is damaged: its token high-water mark (key `token_high_water` in keyspace `meta`) holds {} bytes ({value:02x?}) instead of an 8-byte number, so the fencing tokens imported or raised as a floor are unknown and the store refuses to open rather than issue one of them again; restore the directory from a backup, or stop every client that may still hold a token before starting over in an empty directory",
        value.len()
    )]
    CorruptTokenHighWater {
        /// The directory.
        path: PathBuf,
        /// The stored value.
        value: Vec<u8>,
    },
    /// A background thread could not be started.
    #[error("cannot start the store's {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// What failed.
        source: std::io::Error,
    },
}

/// Says what the engine's recovery cut off the end of a journal: bytes
/// that did not read back as a whole write batch. After a crash that is the
/// batch being written, which was never acknowledged; after a clean
/// shutdown, or more than one batch, it is damage, and the records it held
/// are gone. The engine cannot tell the two apart, so this is said loudly
/// rather than refused: refusing would stop every restart after a crash.
fn report_cut_journals(path: &Path, before: &[(PathBuf, u64)]) {
    for (file, was) in before {
        let now = std::fs::metadata(file).map_or(0, |m| m.len());
        if now < *was {
            tracing::warn!(
                "the store at {} cut {} bytes off the end of its journal {} ({was} bytes before, {now} after): they did not read back as a whole write. After a crash that is the write under way, which no client was told had landed; if the store was shut down cleanly, or more was cut than one write, the journal was damaged and the records it held are gone: restore the directory from a backup",
                path.display(),
                was - now,
                file.display(),
            );
        }
    }
}

impl OpenError {
    /// A directory `path` that could not be created or synced: full, or
    /// unusable.
    fn from_directory(path: &Path, source: std::io::Error) -> Self {
        let path = path.to_path_buf();
        if is_disk_full(&source) {
            OpenError::DiskFull { path, source }
        } else {
            OpenError::Directory { path, source }
        }
    }

    /// What the engine's `source` means for the store at `path`: damaged
    /// files, or a directory it cannot use (in use, not permitted).
    fn from_engine(path: &Path, source: fjall::Error) -> Self {
        let path = path.to_path_buf();
        match source {
            fjall::Error::Io(source) | fjall::Error::Storage(fjall::LsmError::Io(source))
                if is_disk_full(&source) =>
            {
                return OpenError::DiskFull { path, source };
            }
            _ => {}
        }
        if is_damage(&source) {
            OpenError::Damaged { path, source }
        } else {
            OpenError::Engine { path, source }
        }
    }
}

/// The embedded durable store; see the [crate docs](crate).
///
/// Clones share one store. It closes when the last clone is dropped, after
/// the committer has answered everything handed to it. It is also a
/// [`Tier`](idem_core::tier::Tier), usually the cold one: `import_many`
/// writes a whole batch with one durable commit.
///
/// # Cancel safety
///
/// - `begin` takes effect in its first poll: it has acquired the key or
///   not. A claim nobody heard of is taken over once its lease runs out.
/// - `complete`: the record is handed to the committer in the first poll.
///   Dropped after that, the completion still happens (the committer,
///   finding nobody to answer, finishes the claim itself), and a retry by
///   the same token is answered `Ok` once it is durable.
/// - `release` takes effect in its first poll (memory only).
/// - `extend` takes effect in its first poll (memory only).
/// - `get` reads only.
/// - `begin_many`: as `begin`, item by item: dropped mid-way, a prefix of
///   the items may have been begun.
/// - `complete_many`: as `complete`: every item's effect is decided in the
///   first poll.
/// - `scan` reads only.
/// - `import_many` first reads the stored records, which changes nothing;
///   then, in one poll, it decides every item and hands the records to the
///   committer. Dropped after that, the import still happens, as a
///   `complete` does, and its keys answer `InProgress` until it is durable.
/// - `raise_token_floor` lifts the sequence in its first poll and hands the
///   durable mark to the committer in the same poll; the committer writes
///   it whether or not the caller still waits.
/// - `token_high_water` and `completed_keys` read only.
#[derive(Clone)]
pub struct FileStore {
    store: Checked<Records>,
}

struct Inner {
    db: Database,
    records: Keyspace,
    expiry: Keyspace,
    /// `(completed_at, key)` of each record: what was completed since a
    /// time (`Tier::completed_since`).
    completed: Keyspace,
    /// The completion index holds every record completed from this time
    /// on: records written before the index existed (a directory from an
    /// older build) are missing from it.
    completed_from: Timestamp,
    claims: Arc<Claims>,
    tokens: tokens::TokenSequence,
    /// `None` only while dropping.
    committer: Option<mpsc::Sender<Job>>,
    committer_thread: Option<JoinHandle<()>>,
    clock: Arc<dyn Clock>,
    limits: Limits,
    abandoned_retention: Duration,
    /// Where the store is, for messages.
    path: PathBuf,
    /// Set when a write or fsync failed: the engine can no longer promise
    /// durability, so every later operation fails until a restart.
    failed: OnceLock<WriteFailed>,
    sweeper: OnceLock<Thread>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.sweeper.get() {
            t.unpark();
        }
        // Closing the channel lets the committer answer what it holds and
        // stop; waiting for it releases the directory for the next opener.
        self.committer.take();
        if let Some(t) = self.committer_thread.take() {
            let _ = t.join();
        }
    }
}

/// Configures and opens a [`FileStore`].
#[derive(Debug)]
pub struct FileStoreBuilder {
    path: PathBuf,
    durability: Durability,
    clock: Arc<dyn Clock>,
    limits: Limits,
    sweep_interval: Option<Duration>,
    abandoned_retention: Duration,
    cache_bytes: u64,
    token_block: u64,
}

impl FileStoreBuilder {
    /// How acknowledged completions are made durable (default group commit).
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// The clock leases and retention are measured on (default: system).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The limits to enforce.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How often expired records are removed (default 1 s); `None` for never
    /// (call [`FileStore::sweep`] yourself).
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// How long an in-progress claim whose lease ran out is kept so that a
    /// takeover counts its attempts.
    pub fn abandoned_retention(mut self, d: Duration) -> Self {
        self.abandoned_retention = d;
        self
    }

    /// The engine's block cache, in bytes (default 64 MiB).
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// How many tokens each durable raise of the token ceiling covers
    /// (default 2^20). Small values exercise the raise in tests.
    #[doc(hidden)]
    pub fn token_block(mut self, tokens: u64) -> Self {
        self.token_block = tokens;
        self
    }

    /// Opens (or creates) the store, recovering it after a crash.
    pub fn open(self) -> Result<FileStore, OpenError> {
        let path = self.path;
        dir::create_durably(&path).map_err(|source| OpenError::from_directory(&path, source))?;
        let engine = |source| OpenError::from_engine(&path, source);
        let journals = dir::journal_sizes(&path);
        let db = Database::builder(&path)
            .cache_size(self.cache_bytes)
            .manual_journal_persist(true)
            .open()
            .map_err(engine)?;
        report_cut_journals(&path, &journals);
        let records = db.keyspace("records", keyspace_options).map_err(engine)?;
        let expiry = db.keyspace("expiry", keyspace_options).map_err(engine)?;
        let meta = db
            .keyspace("meta", KeyspaceCreateOptions::default)
            .map_err(engine)?;
        let completed_from =
            completion_index_start(&db, &records, &meta, self.clock.now()).map_err(engine)?;
        let completed = db.keyspace("completed", keyspace_options).map_err(engine)?;
        dir::sync_tree(&path).map_err(|source| OpenError::from_directory(&path, source))?;
        let tokens = tokens::TokenSequence::open(&db, &meta, self.token_block)
            .map_err(|e| e.into_open_error(&path))?;
        let claims = Arc::new(Claims::new(64));
        let (committer, committer_thread) = commit::spawn(commit::Engine {
            db: db.clone(),
            records: records.clone(),
            expiry: expiry.clone(),
            completed: completed.clone(),
            meta: meta.clone(),
            claims: claims.clone(),
            durability: self.durability,
            high_water: tokens.stored_high_water(),
        })
        .map_err(|source| OpenError::Thread {
            what: "committer",
            source,
        })?;
        let inner = Arc::new(Inner {
            db,
            records,
            expiry,
            completed,
            completed_from,
            claims,
            tokens,
            committer: Some(committer),
            committer_thread: Some(committer_thread),
            clock: self.clock,
            limits: self.limits,
            abandoned_retention: self.abandoned_retention,
            path: path.clone(),
            failed: OnceLock::new(),
            sweeper: OnceLock::new(),
        });
        if let Some(every) = self.sweep_interval {
            let sweeper = spawn_periodic("idem-file-sweeper", &inner, every, |inner| {
                // A stopped store said why when it stopped: nothing to
                // sweep, and nothing new to say, until it is reopened.
                if inner.failed.get().is_none()
                    && let Err(e) = inner.sweep()
                {
                    tracing::warn!(error = %e, "sweeping expired records failed");
                }
            })
            .map_err(|source| OpenError::Thread {
                what: "sweeper",
                source,
            })?;
            let _ = inner.sweeper.set(sweeper);
        }
        Ok(FileStore {
            store: Checked::new(Records { inner }),
        })
    }
}

impl FileStore {
    /// Opens the store in `path` with group commit and default limits.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::builder(path).open()
    }

    /// Configures a store in `path`.
    pub fn builder(path: impl AsRef<Path>) -> FileStoreBuilder {
        FileStoreBuilder {
            path: path.as_ref().to_path_buf(),
            durability: Durability::default(),
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            sweep_interval: Some(Duration::from_secs(1)),
            abandoned_retention: DEFAULT_ABANDONED_RETENTION,
            cache_bytes: 64 * 1024 * 1024,
            token_block: tokens::BLOCK,
        }
    }

    /// Removes expired records now; returns how many completed records went.
    pub fn sweep(&self) -> Result<usize, StoreError> {
        self.records().sweep()
    }

    /// Makes everything written so far durable (also what `Buffered` mode
    /// has not synced). For a clean shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        let inner = self.records();
        inner
            .db
            .persist(PersistMode::SyncAll)
            .map_err(|e| inner.engine_failed(e.into()))
    }
}

impl FileStore {
    fn records(&self) -> &Arc<Inner> {
        &self.store.inner().inner
    }
}

impl StoreWrapper for FileStore {
    type Inner = Checked<Records>;

    fn inner(&self) -> &Checked<Records> {
        &self.store
    }
}

/// Memtables of 8 MiB instead of fjall's 64: every write searches the
/// memtable's skip list, and measured here a smaller one takes inserts about
/// 40 % faster, at the price of more frequent (background) flushes.
pub const MEMTABLE_BYTES: u64 = 8 << 20;

/// Where the completion index begins: kept in `meta` from the start that
/// created the index, which covers every record when the store was empty
/// then, and those completed from then on otherwise.
fn completion_index_start(
    db: &Database,
    records: &Keyspace,
    meta: &Keyspace,
    now: Timestamp,
) -> fjall::Result<Timestamp> {
    if let Some(v) = meta.get(COMPLETED_FROM)?
        && let Ok(bytes) = <[u8; 8]>::try_from(&*v)
    {
        return Ok(Timestamp::from_millis(u64::from_le_bytes(bytes)));
    }
    let from = if records.first_key_value().is_none() {
        Timestamp::from_millis(0)
    } else {
        now
    };
    meta.insert(COMPLETED_FROM, from.as_millis().to_le_bytes())?;
    db.persist(PersistMode::SyncAll)?;
    Ok(from)
}

/// The `meta` key of [`completion_index_start`].
const COMPLETED_FROM: &[u8] = b"completed_index_from";

fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES)
}

/// Whether the engine's error says its files are damaged (a checksum that
/// does not match, a file cut short, one its own records name but that is
/// missing, bytes it did not write), rather than that it cannot use them now
/// (locked, not permitted, a failed write).
fn is_damage(e: &fjall::Error) -> bool {
    let damaged_io = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::InvalidData
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::NotFound
        )
    };
    match e {
        fjall::Error::Locked | fjall::Error::Poisoned | fjall::Error::KeyspaceDeleted => false,
        fjall::Error::Io(e) | fjall::Error::Storage(fjall::LsmError::Io(e)) => damaged_io(e),
        _ => true,
    }
}

/// A failed read: corruption when the files are damaged (no retry will
/// help), the store unavailable otherwise.
fn read_failed(e: fjall::Error) -> StoreError {
    if is_damage(&e) {
        StoreError::Corrupt(format!(
            "the store's files are damaged ({e}); restore the directory from a backup"
        ))
    } else {
        StoreError::unavailable(e)
    }
}

fn corrupt(key: &[u8], detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!(
        "record {:?}: {detail}",
        key.escape_ascii().to_string()
    ))
}

impl Inner {
    fn check_healthy(&self) -> Result<(), StoreError> {
        match self.failed.get() {
            Some(why) => Err(why.stopped(&self.path)),
            None => Ok(()),
        }
    }

    /// Stops the store after a write the engine could not make, and
    /// answers why it stopped: the first failure, which later ones (the
    /// engine refusing every write after one failed) only repeat.
    fn engine_failed(&self, e: WriteFailed) -> StoreError {
        self.failed
            .get_or_init(|| e.at(&self.path))
            .stopped(&self.path)
    }

    /// The completed record stored for `encoded`, live or not.
    fn read_completed(&self, encoded: &[u8]) -> Result<Option<Completed>, StoreError> {
        let value = self.records.get(encoded).map_err(read_failed)?;
        value
            .map(|v| decode_completed(&v).map_err(|e| corrupt(encoded, e)))
            .transpose()
    }

    /// Reads the record of `enc` without holding its shard's lock (a read
    /// may wait for the disk), then locks the shard. `finished` is the
    /// shard's count of finished completions before the read: if one
    /// finished meanwhile (rare), reads once more under the lock, so what it
    /// returns is current while the lock is held.
    fn read_then_lock(
        &self,
        enc: &[u8],
        finished: u64,
    ) -> Result<(MutexGuard<'_, claims::Shard>, Option<Completed>), StoreError> {
        let stored = self.read_completed(enc)?;
        let shard = self.claims.lock(enc);
        if shard.finished == finished {
            return Ok((shard, stored));
        }
        let stored = self.read_completed(enc)?;
        Ok((shard, stored))
    }

    /// `begin`, decided in memory when the key has a claim, else after one
    /// point read of the stored record, outside the shard's lock.
    fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        self.check_healthy()?;
        let enc = encoded(key);
        let finished = {
            let mut shard = self.claims.lock(&enc);
            if shard.claims.contains_key(&enc) {
                return self.begin_held(&mut shard, enc, fingerprint, lease);
            }
            shard.finished
        };
        let (mut shard, stored) = self.read_then_lock(&enc, finished)?;
        if shard.claims.contains_key(&enc) {
            // Claimed while the record was read.
            return self.begin_held(&mut shard, enc, fingerprint, lease);
        }
        let now = self.clock.now();
        let live = stored.filter(|r| r.expires_at > now);
        let current = live
            .as_ref()
            .map_or(Current::Absent, |r| Current::Completed {
                fingerprint: r.fingerprint,
            });
        match machine::decide_begin(current, fingerprint, now) {
            Decision::Acquire { attempt } => {
                self.acquire(&mut shard, enc, fingerprint, lease, attempt, now)
            }
            Decision::Wait { retry_after } => Ok(Begin::InProgress { retry_after }),
            Decision::Mismatch => Ok(Begin::Mismatch),
            Decision::Replay => {
                let r = live.expect("a completed record was read");
                Ok(Begin::Completed {
                    outcome: r.outcome,
                    completed_at: r.completed_at,
                })
            }
        }
    }

    /// `begin` on a key that has a claim: decided in memory.
    fn begin_held(
        &self,
        shard: &mut claims::Shard,
        enc: Box<[u8]>,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        let now = self.clock.now();
        let c = shard.claims.get(&enc).expect("the key has a claim");
        if c.completing {
            return Ok(Begin::InProgress {
                retry_after: machine::retry_after(c.lease_expires_at, now),
            });
        }
        let current = Current::InProgress {
            fingerprint: c.fingerprint,
            lease_expires_at: c.lease_expires_at,
            attempts: c.attempts,
        };
        match machine::decide_begin(current, fingerprint, now) {
            Decision::Acquire { attempt } => {
                self.acquire(shard, enc, fingerprint, lease, attempt, now)
            }
            Decision::Wait { retry_after } => Ok(Begin::InProgress { retry_after }),
            Decision::Mismatch => Ok(Begin::Mismatch),
            Decision::Replay => unreachable!("a claim is never a completed record"),
        }
    }

    fn acquire(
        &self,
        shard: &mut claims::Shard,
        enc: Box<[u8]>,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
        attempt: u32,
        now: Timestamp,
    ) -> Result<Begin, StoreError> {
        let token = self
            .tokens
            .next()
            .map_err(|e| self.engine_failed(e.into()))?;
        let lease_expires_at = now.after(lease.duration());
        shard.claims.insert(
            enc,
            Claim {
                token,
                fingerprint,
                lease_expires_at,
                attempts: attempt,
                started_at: now,
                completing: false,
                waiters: Vec::new(),
            },
        );
        Ok(Begin::Acquired(Acquired {
            token: FencingToken::new(token),
            lease_expires_at,
            attempt,
        }))
    }

    /// What `complete` of one item does first, under its shard's lock.
    fn start_completing(&self, item: &CompleteItem) -> Completing {
        let enc = encoded(&item.key);
        let mut shard = self.claims.lock(&enc);
        let now = self.clock.now();
        let token = item.token;
        let Some(claim) = shard.claims.get_mut(&enc) else {
            // No claim: completed already (a retry), or stale. A record for
            // this token can no longer appear: its claim would still be here.
            return Completing::Check(enc);
        };
        if claim.token != token.get() {
            return Completing::Done(Fenced::Stale);
        }
        if claim.completing {
            let (tx, rx) = oneshot::channel();
            claim.waiters.push(tx);
            return Completing::Wait(rx);
        }
        if !machine::owns(claim.token, token.get(), claim.lease_expires_at, now) {
            return Completing::Done(Fenced::Stale);
        }
        claim.completing = true;
        let record = Completed {
            token,
            fingerprint: claim.fingerprint,
            outcome: item.outcome.clone(),
            completed_at: now,
            expires_at: now.after(item.retention),
        };
        Completing::Write(Put::new(enc, &record, token.get()))
    }

    fn send(&self, job: Job) -> Result<(), StoreError> {
        self.committer
            .as_ref()
            .expect("the store is open")
            .send(job)
            .map_err(|_| self.engine_failed(WriteFailed::committer_stopped()))
    }

    /// Completes every item. Each item's effect is decided, and the writes
    /// are handed to the committer, before the first await: a caller that
    /// stops waiting leaves full effect (the committer writes and finishes
    /// the claims) or, dropped before its first poll, none.
    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.check_healthy()?;
        let steps: Vec<Completing> = items.iter().map(|i| self.start_completing(i)).collect();
        let puts: Vec<Put> = Vec::new();
        let (mut puts, mut answers) = (puts, Vec::with_capacity(items.len()));
        let mut pending = Vec::new();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Completing::Write(put) => {
                    puts.push(put);
                    answers.push(Fenced::Ok(()));
                }
                Completing::Done(answer) => answers.push(answer),
                other => {
                    pending.push((i, other));
                    answers.push(Fenced::Stale);
                }
            }
        }
        let written = if puts.is_empty() {
            None
        } else {
            let owned = puts.iter().map(|p| (p.key.clone(), p.token)).collect();
            let (done, answer) = oneshot::channel();
            self.send(Job::Put {
                puts,
                high_water: None,
                done,
            })?;
            Some(claims::Finishing::new(&self.claims, owned, answer))
        };
        // This call's own writes first: a retry of one of them in the same
        // batch waits for it below.
        if let Some(written) = written {
            match written.wait().await {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(self.engine_failed(e)),
                None => return Err(self.engine_failed(WriteFailed::committer_stopped())),
            }
        }
        for (i, step) in pending {
            answers[i] = match step {
                Completing::Wait(rx) => match rx.await {
                    Ok(Ok(())) => Fenced::Ok(()),
                    Ok(Err(e)) => return Err(self.engine_failed(e)),
                    Err(_) => return Err(self.engine_failed(WriteFailed::committer_stopped())),
                },
                Completing::Check(enc) => {
                    let stored = self.read_completed(&enc)?;
                    let now = self.clock.now();
                    match stored {
                        Some(r)
                            if machine::completed_by(
                                r.token.get(),
                                items[i].token.get(),
                                r.expires_at,
                                now,
                            ) =>
                        {
                            Fenced::Ok(())
                        }
                        _ => Fenced::Stale,
                    }
                }
                Completing::Write(_) | Completing::Done(_) => unreachable!("answered above"),
            };
        }
        Ok(answers)
    }

    /// Deletes the record of `key` if `token` completed it and it is live,
    /// durably, on the committer (the only writer of records): handed over
    /// before the first await, so a caller that stops waiting leaves the
    /// full effect or, dropped before its first poll, none.
    async fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.check_healthy()?;
        let (done, answer) = oneshot::channel();
        self.send(Job::Reopen {
            key: encoded(key).into_vec().into(),
            token: token.get(),
            now: self.clock.now(),
            done,
        })?;
        match answer.await {
            Ok(Ok(true)) => Ok(Fenced::Ok(())),
            Ok(Ok(false)) => Ok(Fenced::Stale),
            Ok(Err(e)) => Err(self.engine_failed(e)),
            Err(_) => Err(self.engine_failed(WriteFailed::committer_stopped())),
        }
    }

    fn with_owned<T>(
        &self,
        key: &Key,
        token: FencingToken,
        op: impl FnOnce(&mut claims::Shard, Box<[u8]>, Timestamp) -> T,
    ) -> Result<Fenced<T>, StoreError> {
        self.check_healthy()?;
        let enc = encoded(key);
        let mut shard = self.claims.lock(&enc);
        let now = self.clock.now();
        let owned = shard.claims.get(&enc).is_some_and(|c| {
            !c.completing && machine::owns(c.token, token.get(), c.lease_expires_at, now)
        });
        Ok(if owned {
            Fenced::Ok(op(&mut shard, enc, now))
        } else {
            Fenced::Stale
        })
    }

    fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.check_healthy()?;
        let enc = encoded(key);
        let finished = self.claims.lock(&enc).finished;
        let (shard, stored) = self.read_then_lock(&enc, finished)?;
        if let Some(c) = shard.claims.get(&enc) {
            return Ok(Some(in_progress(c)));
        }
        let now = self.clock.now();
        Ok(stored.filter(|r| r.expires_at > now).map(Record::Completed))
    }

    fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        self.check_healthy()?;
        let prefix = Key::encode_namespace(&query.namespace);
        let after = query.after.as_ref().map(|a| [&prefix[..], a].concat());
        let past_cursor = |k: &[u8]| after.as_deref().is_none_or(|a| k > a);
        let now = self.clock.now();
        let mut found = std::collections::BTreeMap::<Vec<u8>, Record>::new();
        for shard in self.claims.shards() {
            for (k, c) in shard.lock().claims.iter() {
                if k.starts_with(&prefix) && past_cursor(k) {
                    let record = in_progress(c);
                    if query.admits(&record) {
                        found.insert(k.to_vec(), record);
                    }
                }
            }
        }
        let mut from_disk = 0;
        for item in self.records.prefix(&prefix) {
            if from_disk >= query.limit {
                break;
            }
            let (k, v) = item.into_inner().map_err(read_failed)?;
            if !past_cursor(&k) || found.contains_key(&k[..]) {
                continue;
            }
            let r = decode_completed(&v).map_err(|e| corrupt(&k, e))?;
            let record = Record::Completed(r);
            if let Record::Completed(r) = &record
                && r.expires_at > now
                && query.admits(&record)
            {
                found.insert(k.to_vec(), record);
                from_disk += 1;
            }
        }
        found
            .into_iter()
            .take(query.limit)
            .map(|(k, record)| {
                let key = Key::decode(&k).map_err(|e| corrupt(&k, e))?;
                Ok(Entry { key, record })
            })
            .collect()
    }

    /// Removes completed records past retention (following the expiry index;
    /// the committer deletes them) and claims abandoned longer than
    /// `abandoned_retention`.
    fn sweep(&self) -> Result<usize, StoreError> {
        self.check_healthy()?;
        let now = self.clock.now();
        for shard in self.claims.shards() {
            shard.lock().claims.retain(|_, c| {
                c.completing || c.lease_expires_at.after(self.abandoned_retention) > now
            });
        }
        self.trim_completion_index(now)?;
        let due_end = expiry_key(now.after(Duration::from_millis(1)), &[]);
        let mut removed = 0;
        loop {
            let due: Vec<_> = self
                .expiry
                .range(..due_end.clone())
                .take(4096)
                .map(|item| item.key())
                .collect::<Result<_, _>>()
                .map_err(StoreError::unavailable)?;
            if due.is_empty() {
                return Ok(removed);
            }
            let (done, answer) = std::sync::mpsc::sync_channel(1);
            self.send(Job::Sweep { due, done })?;
            removed += answer
                .recv()
                .map_err(|_| self.engine_failed(WriteFailed::committer_stopped()))?
                .map_err(|e| self.engine_failed(e))?;
        }
    }
}

impl Inner {
    /// Removes completion index entries older than the longest retention:
    /// their records have expired (the sweep removed them with their
    /// entry), and what is left there names a record written over since.
    /// No record written later can carry such a completion time, so this
    /// needs not go through the committer.
    fn trim_completion_index(&self, now: Timestamp) -> Result<(), StoreError> {
        let Some(before) = now
            .as_millis()
            .checked_sub(self.limits.max_retention.as_millis() as u64)
        else {
            return Ok(());
        };
        let end = completed_key(Timestamp::from_millis(before), &[]);
        loop {
            let old: Vec<_> = self
                .completed
                .range(..end.clone())
                .take(4096)
                .map(|item| item.key())
                .collect::<Result<_, _>>()
                .map_err(StoreError::unavailable)?;
            if old.is_empty() {
                return Ok(());
            }
            let mut batch = self.db.batch();
            for k in old {
                batch.remove(&self.completed, k);
            }
            batch.commit().map_err(|e| self.engine_failed(e.into()))?;
        }
    }
}

/// Runs `work` on Tokio's blocking pool when there is a runtime, else here.
/// For reads of many records (`begin_many`, `scan`), which must not hold an
/// async worker for long. A single point read stays on the worker: it is
/// bounded (a few blocks at most, usually none past the filters and the
/// block cache), and a hop to the pool cost more than it saves (see
/// BENCHMARKS.md).
async fn off_workers<T: Send + 'static>(
    inner: &Arc<Inner>,
    work: impl FnOnce(&Inner) -> T + Send + 'static,
) -> Result<T, StoreError> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Ok(work(inner));
    };
    let inner = inner.clone();
    match runtime.spawn_blocking(move || work(&inner)).await {
        Ok(v) => Ok(v),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(StoreError::unavailable(e)),
    }
}

/// The first step of completing one item.
enum Completing {
    /// Write this record; the answer is `Ok` once it is durable.
    Write(Put),
    /// Answered already.
    Done(Fenced),
    /// The same token's completion is in flight: its result is the answer.
    Wait(oneshot::Receiver<Result<(), WriteFailed>>),
    /// No claim: `Ok` if the stored record was completed by this token.
    Check(Box<[u8]>),
}

fn in_progress(c: &Claim) -> Record {
    Record::InProgress(InProgress {
        token: FencingToken::new(c.token),
        fingerprint: c.fingerprint,
        lease_expires_at: c.lease_expires_at,
        attempts: c.attempts,
        started_at: c.started_at,
    })
}

#[cfg(test)]
mod tests {
    use idem_core::tier::Tier;
    use idem_core::{Begin, Bytes, Lease, ManualClock};

    use super::*;

    fn index_len(store: &FileStore) -> usize {
        store.records().completed.iter().count()
    }

    /// The completion index entry goes with its record when the sweep
    /// removes it, and one left by a record written over goes once older
    /// than the longest retention.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_completion_index_is_emptied_with_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let store = FileStore::builder(dir.path())
            .clock(clock.clone())
            .sweep_interval(None)
            .limits(Limits {
                max_retention: Duration::from_secs(600),
                ..Limits::default()
            })
            .open()
            .unwrap();
        let complete = |key: &'static str, retention: u64| {
            let store = store.clone();
            async move {
                let key = Key::new("orders", key).unwrap();
                let Begin::Acquired(claim) = store
                    .begin(&key, None, Lease::new(Duration::from_secs(60)))
                    .await
                    .unwrap()
                else {
                    panic!("a new key is acquired");
                };
                let done = store
                    .complete(
                        &key,
                        claim.token,
                        Some(Bytes::from_static(b"ok")),
                        Duration::from_secs(retention),
                    )
                    .await
                    .unwrap();
                assert!(!done.is_stale(), "{done:?}");
            }
        };
        complete("a", 10).await;
        complete("b", 600).await;
        assert_eq!(index_len(&store), 2);
        clock.advance(Duration::from_secs(11));
        assert_eq!(store.sweep().unwrap(), 1);
        assert_eq!(index_len(&store), 1, "a's entry went with a");
        // `b` written over once expired: its first entry is left behind.
        clock.advance(Duration::from_secs(600));
        complete("b", 600).await;
        assert_eq!(index_len(&store), 2);
        let since = Timestamp::from_millis(0);
        let listed = store
            .completed_since(since, None, 10)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(listed.len(), 1, "the stale entry is not listed: {listed:?}");
        clock.advance(Duration::from_secs(300));
        store.sweep().unwrap();
        assert_eq!(
            index_len(&store),
            1,
            "older than the longest retention: gone"
        );
    }
}
