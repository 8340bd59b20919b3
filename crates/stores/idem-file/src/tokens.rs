//! Fencing tokens that stay monotonic across restarts and crashes.
//!
//! One store-wide sequence. Before any token at or above the durable ceiling
//! is handed out, a new ceiling a block higher is written and fsynced; after
//! a restart the sequence resumes at the stored ceiling, above every token the
//! previous run can have issued. A crash costs at most one unused block.
//!
//! Tokens that come from elsewhere (imported records, raised floors) lift
//! the sequence above them, and a second key, the high-water mark, keeps
//! the largest of them. Only the committer writes it, in the batch that
//! carries the imported records, so two writers never race to lower it;
//! after a restart the sequence resumes above it too.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, PersistMode};
use parking_lot::Mutex;

use crate::OpenError;

const CEILING: &[u8] = b"token_ceiling";

/// The largest token imported or raised as a floor, written by the
/// committer.
pub const HIGH_WATER: &[u8] = b"token_high_water";

/// How far ahead of the tokens issued the durable ceiling is set: one sync
/// per block of tokens.
pub const BLOCK: u64 = 1 << 20;

pub struct TokenSequence {
    next: AtomicU64,
    ceiling: AtomicU64,
    block: u64,
    raise: Mutex<()>,
    db: Database,
    meta: Keyspace,
    /// The high-water mark stored when the store opened.
    stored_high_water: u64,
}

/// Why the sequence could not be resumed.
pub enum ResumeError {
    Engine(fjall::Error),
    /// The stored ceiling is not a u64: where the previous run stopped is
    /// unknown, so no token is known to be safe.
    CorruptCeiling(Vec<u8>),
    /// The stored high-water mark is not a u64: which tokens were imported
    /// is unknown.
    CorruptHighWater(Vec<u8>),
}

impl ResumeError {
    pub fn into_open_error(self, path: &Path) -> OpenError {
        match self {
            Self::Engine(source) => OpenError::from_engine(path, source),
            Self::CorruptCeiling(value) => OpenError::CorruptTokenCeiling {
                path: path.to_path_buf(),
                value,
            },
            Self::CorruptHighWater(value) => OpenError::CorruptTokenHighWater {
                path: path.to_path_buf(),
                value,
            },
        }
    }
}

impl From<fjall::Error> for ResumeError {
    fn from(e: fjall::Error) -> Self {
        Self::Engine(e)
    }
}

impl TokenSequence {
    /// Resumes the sequence above every token a previous run can have issued,
    /// raising the ceiling `block` tokens at a time.
    pub fn open(db: &Database, meta: &Keyspace, block: u64) -> Result<Self, ResumeError> {
        let stored = read_u64(meta, CEILING, ResumeError::CorruptCeiling)?;
        let high_water = read_u64(meta, HIGH_WATER, ResumeError::CorruptHighWater)?;
        let start = stored.max(high_water.saturating_add(1)).max(1);
        let seq = Self {
            next: AtomicU64::new(start),
            ceiling: AtomicU64::new(start),
            block: block.max(1),
            raise: Mutex::new(()),
            db: db.clone(),
            meta: meta.clone(),
            stored_high_water: high_water,
        };
        seq.raise_above(start)?;
        Ok(seq)
    }

    /// The high-water mark stored when the store opened: where the
    /// committer's copy starts.
    pub fn stored_high_water(&self) -> u64 {
        self.stored_high_water
    }

    /// Makes every token issued from now on exceed `token`. In memory only:
    /// the caller makes `token` durable as the high-water mark.
    pub fn lift_above(&self, token: u64) {
        self.next
            .fetch_max(token.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether a restart resumes above `token` already: it is below the
    /// durable ceiling.
    pub fn durably_above(&self, token: u64) -> bool {
        token < self.ceiling.load(Ordering::Acquire)
    }

    /// A token at least as large as every token issued, imported or
    /// raised as a floor, in this run or before.
    pub fn high_water(&self) -> u64 {
        self.next.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// The next token.
    pub fn next(&self) -> fjall::Result<u64> {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        if token >= self.ceiling.load(Ordering::Acquire) {
            self.raise_above(token)?;
        }
        Ok(token)
    }

    fn raise_above(&self, token: u64) -> fjall::Result<()> {
        let _one_at_a_time = self.raise.lock();
        if token < self.ceiling.load(Ordering::Acquire) {
            return Ok(());
        }
        let ceiling = token.saturating_add(self.block);
        self.meta.insert(CEILING, ceiling.to_le_bytes())?;
        self.db.persist(PersistMode::SyncAll)?;
        self.ceiling.store(ceiling, Ordering::Release);
        Ok(())
    }
}

/// The number stored under `key` in `meta`, 0 when there is none.
fn read_u64(
    meta: &Keyspace,
    key: &[u8],
    corrupt: fn(Vec<u8>) -> ResumeError,
) -> Result<u64, ResumeError> {
    match meta.get(key)? {
        Some(v) => Ok(u64::from_le_bytes(
            v.as_ref().try_into().map_err(|_| corrupt(v.to_vec()))?,
        )),
        None => Ok(0),
    }
}
