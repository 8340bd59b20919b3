//! Fencing tokens that stay monotonic across restarts and crashes.
//!
//! One store-wide sequence. Before any token at or above the durable ceiling
//! is handed out, a new ceiling a block higher is written and fsynced; after
//! a restart the sequence resumes at the stored ceiling, above every token the
//! previous run can have issued. A crash costs at most one unused block.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, PersistMode};
use parking_lot::Mutex;

use crate::OpenError;

const CEILING: &[u8] = b"token_ceiling";

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
}

/// Why the sequence could not be resumed.
pub enum ResumeError {
    Engine(fjall::Error),
    /// The stored ceiling is not a u64: where the previous run stopped is
    /// unknown, so no token is known to be safe.
    CorruptCeiling(Vec<u8>),
}

impl ResumeError {
    pub fn into_open_error(self, path: &Path) -> OpenError {
        match self {
            Self::Engine(source) => OpenError::Engine {
                path: path.to_path_buf(),
                source,
            },
            Self::CorruptCeiling(value) => OpenError::CorruptTokenCeiling {
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
        let stored = match meta.get(CEILING)? {
            Some(v) => u64::from_le_bytes(
                v.as_ref()
                    .try_into()
                    .map_err(|_| ResumeError::CorruptCeiling(v.to_vec()))?,
            ),
            None => 0,
        };
        let start = stored.max(1);
        let seq = Self {
            next: AtomicU64::new(start),
            ceiling: AtomicU64::new(start),
            block: block.max(1),
            raise: Mutex::new(()),
            db: db.clone(),
            meta: meta.clone(),
        };
        seq.raise_above(start)?;
        Ok(seq)
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
        let ceiling = token + self.block;
        self.meta.insert(CEILING, ceiling.to_le_bytes())?;
        self.db.persist(PersistMode::SyncAll)?;
        self.ceiling.store(ceiling, Ordering::Release);
        Ok(())
    }
}
