//! One shard of the in-memory store: an index of positions into dense pages
//! of slots.
//!
//! Keeping slots out of the hash table means the table's load-factor slack
//! costs 9 bytes a bucket instead of a whole slot, and slots live in fixed
//! pages, so growing never copies them and wastes at most one page: together
//! they keep a record near 100 bytes plus its key.

use std::hash::{BuildHasher, Hasher};

use bytes::Bytes;
use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::{Completed, FencingToken, Fingerprint, InProgress, Key, Record, Timestamp};

/// A record as the memory store keeps it.
///
/// 80 bytes. The key's hash is kept (32 bits of it) so that growing the index
/// never hashes a key again.
pub(super) struct Slot {
    /// [`Key::encode`]d.
    pub key: Box<[u8]>,
    pub outcome: Option<Box<[u8]>>,
    pub token: u64,
    /// Lease expiry while in progress, retention expiry once completed.
    pub deadline: Timestamp,
    /// `started_at` while in progress, `completed_at` once completed.
    pub since: Timestamp,
    pub hash: KeyHash,
    /// Saturates at `u16::MAX`: a key taken over that often is a poison
    /// message whichever way it is counted.
    attempts: u16,
    pub fingerprint: Option<Fingerprint>,
    pub completed: bool,
}

/// 32 bits of a key's hash, spread back over 64 for the index: the index
/// sees the same hash for a key whether it comes from the key or the slot.
#[derive(Clone, Copy)]
pub(super) struct KeyHash(u32);

impl KeyHash {
    pub fn of(hasher: &RandomState, key: &Key) -> Self {
        let mut h = hasher.build_hasher();
        key.hash_into(&mut h);
        Self((h.finish() >> 32) as u32)
    }

    /// The index's hash: multiplying by an odd constant fills the top bits
    /// the table's control bytes use.
    pub fn spread(self) -> u64 {
        (self.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// Which of `n` (a power of two) shards holds the key.
    pub fn shard(self, n: usize) -> usize {
        self.0 as usize & (n - 1)
    }
}

impl Slot {
    #[allow(clippy::too_many_arguments)]
    pub fn in_progress(
        key: &Key,
        hash: KeyHash,
        token: u64,
        lease_expires_at: Timestamp,
        now: Timestamp,
        attempts: u32,
        fingerprint: Option<Fingerprint>,
    ) -> Self {
        Self {
            key: key.encode().into_boxed_slice(),
            outcome: None,
            token,
            deadline: lease_expires_at,
            since: now,
            hash,
            attempts: saturate(attempts),
            fingerprint,
            completed: false,
        }
    }

    /// A completed record as another store held it (an import).
    pub fn completed(key: &Key, hash: KeyHash, record: &Completed) -> Self {
        Self {
            key: key.encode().into_boxed_slice(),
            outcome: record.outcome.as_deref().map(Box::from),
            token: record.token.get(),
            deadline: record.expires_at,
            since: record.completed_at,
            hash,
            attempts: 1,
            fingerprint: record.fingerprint,
            completed: true,
        }
    }

    pub fn attempts(&self) -> u32 {
        self.attempts.into()
    }

    pub fn set_attempts(&mut self, attempts: u32) {
        self.attempts = saturate(attempts);
    }

    pub fn record(&self) -> Record {
        let token = FencingToken::new(self.token);
        if self.completed {
            Record::Completed(Completed {
                token,
                fingerprint: self.fingerprint,
                outcome: self.outcome.as_deref().map(Bytes::copy_from_slice),
                completed_at: self.since,
                expires_at: self.deadline,
            })
        } else {
            Record::InProgress(InProgress {
                token,
                fingerprint: self.fingerprint,
                lease_expires_at: self.deadline,
                attempts: self.attempts(),
                started_at: self.since,
            })
        }
    }
}

/// An index entry: where the slot is, and its hash, so that growing the index
/// and most failed probes never touch the slot.
#[derive(Clone, Copy)]
struct At {
    slot: u32,
    hash: u32,
}

pub(super) struct Shard {
    index: HashTable<At>,
    slots: Pages,
    /// No slot can be swept before this: the sweeper skips the shard until
    /// then instead of reading every slot. Kept low (never later than the
    /// truth) by [`Shard::may_die_at`].
    earliest_death: Timestamp,
}

impl Default for Shard {
    fn default() -> Self {
        Self {
            index: HashTable::default(),
            slots: Pages::default(),
            earliest_death: Timestamp::from_millis(u64::MAX),
        }
    }
}

impl Shard {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn find(&self, hash: KeyHash, key: &Key) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash.spread(), |at| {
                at.hash == hash.0 && key.matches_encoded(&slots[at.slot as usize].key)
            })
            .map(|at| at.slot as usize)
    }

    pub fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    pub fn slot_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.slots[i]
    }

    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.pages.iter().flatten()
    }

    pub fn insert(&mut self, slot: Slot) {
        let at = At {
            slot: u32::try_from(self.slots.len()).expect("a shard holds at most 2^32 records"),
            hash: slot.hash.0,
        };
        self.slots.push(slot);
        self.index
            .insert_unique(KeyHash(at.hash).spread(), at, |at| {
                KeyHash(at.hash).spread()
            });
    }

    /// Removes slot `i`, moving the last slot into its place.
    pub fn remove(&mut self, i: usize) -> Slot {
        let hash = self.slots[i].hash.spread();
        let Ok(entry) = self.index.find_entry(hash, |at| at.slot as usize == i) else {
            unreachable!("every slot is indexed");
        };
        entry.remove();
        let last = self.slots.len() - 1;
        if i != last {
            let moved = self.slots[last].hash.spread();
            let Some(at) = self.index.find_mut(moved, |at| at.slot as usize == last) else {
                unreachable!("every slot is indexed");
            };
            at.slot = i as u32;
        }
        self.slots.swap_remove(i)
    }

    /// Notes that some slot may be swept from `t` on.
    pub fn may_die_at(&mut self, t: Timestamp) {
        self.earliest_death = self.earliest_death.min(t);
    }

    /// Whether any slot may be due for sweeping at `now`.
    pub fn may_have_dead(&self, now: Timestamp) -> bool {
        self.earliest_death <= now
    }

    /// Removes every slot that is dead at `now`, where `dies_at` tells when a
    /// slot dies; returns how many went.
    pub fn sweep(&mut self, now: Timestamp, dies_at: impl Fn(&Slot) -> Timestamp) -> usize {
        let mut removed = 0;
        let mut earliest = Timestamp::from_millis(u64::MAX);
        let mut i = 0;
        while i < self.slots.len() {
            let death = dies_at(&self.slots[i]);
            if death <= now {
                self.remove(i);
                removed += 1;
            } else {
                earliest = earliest.min(death);
                i += 1;
            }
        }
        self.earliest_death = earliest;
        removed
    }
}

/// A vector in fixed pages: growing allocates a page and copies nothing.
#[derive(Default)]
struct Pages {
    pages: Vec<Vec<Slot>>,
    len: usize,
}

const PAGE: usize = 256;

impl Pages {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, slot: Slot) {
        if self.len.is_multiple_of(PAGE) {
            self.pages.push(Vec::with_capacity(PAGE));
        }
        self.pages.last_mut().expect("a page").push(slot);
        self.len += 1;
    }

    fn swap_remove(&mut self, i: usize) -> Slot {
        let last_page = self.pages.last_mut().expect("not empty");
        let last = last_page.pop().expect("pages are never empty");
        if last_page.is_empty() {
            self.pages.pop();
        }
        self.len -= 1;
        if i == self.len {
            last
        } else {
            std::mem::replace(&mut self[i], last)
        }
    }
}

impl std::ops::Index<usize> for Pages {
    type Output = Slot;
    fn index(&self, i: usize) -> &Slot {
        &self.pages[i / PAGE][i % PAGE]
    }
}

impl std::ops::IndexMut<usize> for Pages {
    fn index_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.pages[i / PAGE][i % PAGE]
    }
}

fn saturate(attempts: u32) -> u16 {
    u16::try_from(attempts).unwrap_or(u16::MAX)
}
