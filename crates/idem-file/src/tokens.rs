//! Fencing tokens that stay monotonic across restarts and crashes.
//!
//! One store-wide sequence. Before any token at or above the durable ceiling
//! is handed out, a new ceiling a block higher is written and fsynced; after
//! a restart the sequence resumes at the stored ceiling, above every token the
//! previous run can have issued. A crash costs at most one unused block.

use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, PersistMode};
use parking_lot::Mutex;

const CEILING: &[u8] = b"token_ceiling";
const BLOCK: u64 = 1 << 20;

pub struct TokenSequence {
    next: AtomicU64,
    ceiling: AtomicU64,
    raise: Mutex<()>,
    db: Database,
    meta: Keyspace,
}

impl TokenSequence {
    pub fn open(db: &Database, meta: &Keyspace) -> fjall::Result<Self> {
        let stored = match meta.get(CEILING)? {
            Some(v) => u64::from_le_bytes(v.as_ref().try_into().unwrap_or([0; 8])),
            None => 0,
        };
        let start = stored.max(1);
        let seq = Self {
            next: AtomicU64::new(start),
            ceiling: AtomicU64::new(start),
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
        let ceiling = token + BLOCK;
        self.meta.insert(CEILING, ceiling.to_le_bytes())?;
        self.db.persist(PersistMode::SyncAll)?;
        self.ceiling.store(ceiling, Ordering::Release);
        Ok(())
    }
}
