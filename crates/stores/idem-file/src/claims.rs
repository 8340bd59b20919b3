//! In-progress claims, held in memory.
//!
//! Only completed records must survive a crash, so claims never touch the
//! disk: a restart loses them, which acts as the expiry of their leases (the
//! holders' tokens are stale afterwards, since tokens stay monotonic). Disk
//! reads happen outside the shard locks; a shard counts the completions it
//! has finished, so a reader can tell whether one landed while it read.

use std::hash::{BuildHasher, Hasher};

use fjall::Slice;
use foldhash::fast::RandomState;
use hashbrown::HashMap;
use idem_core::{Fingerprint, Key, Timestamp};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::oneshot;

use crate::failure::WriteFailed;

/// What waits for a completion in flight: a retried `complete` by the same
/// token, answered when the committer has written (or failed to write) it.
pub type Waiter = oneshot::Sender<Result<(), WriteFailed>>;

pub struct Claim {
    pub token: u64,
    pub fingerprint: Option<Fingerprint>,
    pub lease_expires_at: Timestamp,
    pub attempts: u32,
    pub started_at: Timestamp,
    /// `complete` has handed the record to the committer, which drops the
    /// claim once the record is durable: until then the key answers
    /// `InProgress` and cannot be taken over.
    pub completing: bool,
    pub waiters: Vec<Waiter>,
}

#[derive(Default)]
pub struct Shard {
    pub claims: HashMap<Box<[u8]>, Claim, RandomState>,
    /// Completions written and finished in this shard so far.
    pub finished: u64,
}

pub struct Claims {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

impl Claims {
    pub fn new(shards: usize) -> Self {
        let hasher = RandomState::default();
        Self {
            shards: (0..shards.next_power_of_two())
                .map(|_| {
                    Mutex::new(Shard {
                        claims: HashMap::with_hasher(hasher.clone()),
                        finished: 0,
                    })
                })
                .collect(),
            hasher,
        }
    }

    /// The shard that holds `encoded`, locked.
    pub fn lock(&self, encoded: &[u8]) -> MutexGuard<'_, Shard> {
        let mut h = self.hasher.build_hasher();
        h.write(encoded);
        let i = h.finish() as usize & (self.shards.len() - 1);
        self.shards[i].lock()
    }

    pub fn shards(&self) -> impl Iterator<Item = &Mutex<Shard>> {
        self.shards.iter()
    }

    /// After the committer wrote (or failed to write) the record `token`
    /// completes: drops the claim, or makes it ownable again (the store has
    /// failed by then anyway), and answers whoever waits for it.
    pub fn finish_completing(&self, key: &[u8], token: u64, written: &Result<(), WriteFailed>) {
        let mut shard = self.lock(key);
        let Some(c) = shard.claims.get_mut(key) else {
            return;
        };
        if c.token != token {
            return;
        }
        let waiters = std::mem::take(&mut c.waiters);
        if written.is_ok() {
            shard.claims.remove(key);
            shard.finished += 1;
        } else {
            c.completing = false;
        }
        drop(shard);
        for w in waiters {
            let _ = w.send(written.clone());
        }
    }
}

/// A completion handed to the committer, whose claims the caller finishes
/// when the answer comes. Dropped before that (the caller stopped waiting),
/// it stops the answer from being delivered, so the committer, unable to
/// deliver it, finishes the claims itself; or, if the answer had already
/// arrived, finishes them here. Either way exactly one side does.
pub struct Finishing<'a> {
    claims: &'a Claims,
    owned: Vec<(Slice, u64)>,
    answer: Option<oneshot::Receiver<Result<(), WriteFailed>>>,
}

impl<'a> Finishing<'a> {
    pub fn new(
        claims: &'a Claims,
        owned: Vec<(Slice, u64)>,
        answer: oneshot::Receiver<Result<(), WriteFailed>>,
    ) -> Self {
        Self {
            claims,
            owned,
            answer: Some(answer),
        }
    }

    /// The committer's answer, once the claims are finished; `None` if the
    /// committer stopped without answering.
    pub async fn wait(mut self) -> Option<Result<(), WriteFailed>> {
        let answer = self.answer.as_mut().expect("waited once").await;
        self.answer = None;
        let result = answer.ok()?;
        self.finish(&result);
        Some(result)
    }

    fn finish(&self, result: &Result<(), WriteFailed>) {
        for (key, token) in &self.owned {
            self.claims.finish_completing(key, *token, result);
        }
    }
}

impl Drop for Finishing<'_> {
    fn drop(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            // After `close`, a send either happened (and is received here)
            // or fails (and the committer finishes the claims).
            answer.close();
            if let Ok(result) = answer.try_recv() {
                self.finish(&result);
            }
        }
    }
}

/// The encoded form of `key`, the claims' and the disk's key.
pub fn encoded(key: &Key) -> Box<[u8]> {
    key.encode().into_boxed_slice()
}
