//! In-progress claims, held in memory.
//!
//! Only completed records must survive a crash, so claims never touch the
//! disk: a restart loses them, which acts as the expiry of their leases (the
//! holders' tokens are stale afterwards, since tokens stay monotonic). Each
//! shard's lock also serializes everything the store does for the shard's
//! keys, disk reads and the hand-off to the committer included.

use std::hash::{BuildHasher, Hasher};

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use idem_core::{Fingerprint, Key, Timestamp};
use parking_lot::{Mutex, MutexGuard};

pub struct Claim {
    pub token: u64,
    pub fingerprint: Option<Fingerprint>,
    pub lease_expires_at: Timestamp,
    pub attempts: u32,
    pub started_at: Timestamp,
    /// `complete` has handed the record to the committer and waits for its
    /// fsync: the key answers `InProgress` and cannot be taken over.
    pub completing: bool,
}

pub type Shard = HashMap<Box<[u8]>, Claim, RandomState>;

pub struct Claims {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
}

impl Claims {
    pub fn new(shards: usize) -> Self {
        let hasher = RandomState::default();
        Self {
            shards: (0..shards.next_power_of_two())
                .map(|_| Mutex::new(HashMap::with_hasher(hasher.clone())))
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
}

/// The encoded form of `key`, the claims' and the disk's key.
pub fn encoded(key: &Key) -> Box<[u8]> {
    key.encode().into_boxed_slice()
}
