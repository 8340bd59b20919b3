//! One shard of the in-memory store: an index of `u32` positions into a dense
//! vector of slots.
//!
//! Keeping slots out of the hash table means the table's load-factor slack
//! costs 5 bytes a bucket instead of a whole slot, and the vector grows by a
//! quarter at a time instead of doubling: together they keep a record near 100
//! bytes plus its key.

use std::hash::{BuildHasher, Hasher};

use bytes::Bytes;
use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::key::hash_encoded;
use crate::{Completed, FencingToken, Fingerprint, InProgress, Key, Record, Timestamp};

/// A record as the memory store keeps it.
pub(super) struct Slot {
    /// [`Key::encode`]d.
    pub key: Box<[u8]>,
    pub outcome: Option<Box<[u8]>>,
    pub token: u64,
    /// Lease expiry while in progress, retention expiry once completed.
    pub deadline: Timestamp,
    /// `started_at` while in progress, `completed_at` once completed.
    pub since: Timestamp,
    pub attempts: u32,
    pub fingerprint: Option<Fingerprint>,
    pub completed: bool,
}

impl Slot {
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
                attempts: self.attempts,
                started_at: self.since,
            })
        }
    }
}

#[derive(Default)]
pub(super) struct Shard {
    index: HashTable<u32>,
    slots: Vec<Slot>,
}

impl Shard {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn find(&self, hash: u64, key: &Key) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| key.matches_encoded(&slots[i as usize].key))
            .map(|&i| i as usize)
    }

    pub fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    pub fn slot_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.slots[i]
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    pub fn insert(&mut self, hash: u64, slot: Slot, hasher: &RandomState) {
        if self.slots.len() == self.slots.capacity() {
            // Grow by a quarter, not double: bounded slack matters more here
            // than the rare extra copy.
            let extra = (self.slots.len() / 4).max(16);
            self.slots.reserve_exact(extra);
        }
        let i = u32::try_from(self.slots.len()).expect("a shard holds at most 2^32 records");
        self.slots.push(slot);
        let slots = &self.slots;
        self.index
            .insert_unique(hash, i, |&j| hash_slot(hasher, &slots[j as usize]));
    }

    /// Removes slot `i`, moving the last slot into its place.
    pub fn remove(&mut self, i: usize, hasher: &RandomState) -> Slot {
        let hash = hash_slot(hasher, &self.slots[i]);
        let Ok(entry) = self.index.find_entry(hash, |&j| j as usize == i) else {
            unreachable!("every slot is indexed");
        };
        entry.remove();
        let last = self.slots.len() - 1;
        if i != last {
            let moved = hash_slot(hasher, &self.slots[last]);
            let Some(pos) = self.index.find_mut(moved, |&j| j as usize == last) else {
                unreachable!("every slot is indexed");
            };
            *pos = i as u32;
        }
        self.slots.swap_remove(i)
    }

    /// Removes every slot `dead` says is dead; returns how many.
    pub fn remove_where(&mut self, hasher: &RandomState, dead: impl Fn(&Slot) -> bool) -> usize {
        let mut removed = 0;
        let mut i = 0;
        while i < self.slots.len() {
            if dead(&self.slots[i]) {
                self.remove(i, hasher);
                removed += 1;
            } else {
                i += 1;
            }
        }
        removed
    }
}

pub(super) fn hash_key(hasher: &RandomState, key: &Key) -> u64 {
    let mut h = hasher.build_hasher();
    key.hash_into(&mut h);
    h.finish()
}

fn hash_slot(hasher: &RandomState, slot: &Slot) -> u64 {
    let mut h = hasher.build_hasher();
    hash_encoded(&slot.key, &mut h);
    h.finish()
}
