//! One shard of the in-memory store: an index of positions into dense pages
//! of slots, and the namespaces its keys are in.
//!
//! Keeping slots out of the hash table means the table's load-factor slack
//! costs 9 bytes a bucket instead of a whole slot, and slots live in fixed
//! pages, so growing never copies them and wastes at most one page. A slot
//! names its namespace by a small id instead of repeating it, and keeps its
//! key, fingerprint and outcome in one allocation: together they keep a
//! record near 75 bytes plus its key.

use std::hash::{BuildHasher, Hasher};

use bytes::Bytes;
use foldhash::fast::RandomState;
use hashbrown::{HashMap, HashTable};

use crate::{Completed, FencingToken, Fingerprint, InProgress, Key, Namespace, Record, Timestamp};

/// A record as the memory store keeps it.
///
/// 56 bytes. The key's hash is kept (32 bits of it) so that growing the index
/// never hashes a key again.
pub(super) struct Slot {
    /// The key's bytes (without the namespace), then the fingerprint if there
    /// is one, then the outcome if there is one: one allocation instead of
    /// three, and no room for what the record lacks.
    data: Box<[u8]>,
    pub token: u64,
    /// Lease expiry while in progress, retention expiry once completed.
    pub deadline: Timestamp,
    /// `started_at` while in progress, `completed_at` once completed.
    pub since: Timestamp,
    pub hash: KeyHash,
    key_len: u32,
    /// The namespace's id in its shard's [`Namespaces`]; set by the shard.
    ns: u32,
    /// Saturates at `u16::MAX`: a key taken over that often is a poison
    /// message whichever way it is counted.
    attempts: u16,
    /// [`HAS_FINGERPRINT`] and [`HAS_OUTCOME`]: what follows the key in
    /// `data`.
    has: u8,
    pub completed: bool,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Slot>() == 56);

const HAS_FINGERPRINT: u8 = 1;
const HAS_OUTCOME: u8 = 2;
const FINGERPRINT_BYTES: usize = 16;

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
    fn new(
        key: &Key,
        hash: KeyHash,
        fingerprint: Option<Fingerprint>,
        outcome: Option<&[u8]>,
    ) -> Self {
        let key = key.bytes();
        let mut slot = Self {
            data: Box::default(),
            token: 0,
            deadline: Timestamp::default(),
            since: Timestamp::default(),
            hash,
            key_len: u32::try_from(key.len()).expect("a key is shorter than 4 GiB"),
            ns: 0,
            attempts: 1,
            has: 0,
            completed: false,
        };
        let mut data = Vec::with_capacity(tail_len(key.len(), fingerprint, outcome));
        data.extend_from_slice(key);
        slot.data = slot.with_tail(data, fingerprint, outcome);
        slot
    }

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
            token,
            deadline: lease_expires_at,
            since: now,
            attempts: saturate(attempts),
            ..Self::new(key, hash, fingerprint, None)
        }
    }

    /// A completed record as another store held it (an import).
    pub fn completed(key: &Key, hash: KeyHash, record: &Completed) -> Self {
        Self {
            token: record.token.get(),
            deadline: record.expires_at,
            since: record.completed_at,
            completed: true,
            ..Self::new(key, hash, record.fingerprint, record.outcome.as_deref())
        }
    }

    /// Its namespace's id in its shard (see [`Shard::namespace_id`]).
    pub fn namespace_id(&self) -> u32 {
        self.ns
    }

    /// The key's bytes, without the namespace.
    pub fn key(&self) -> &[u8] {
        &self.data[..self.key_len as usize]
    }

    pub fn fingerprint(&self) -> Option<Fingerprint> {
        (self.has & HAS_FINGERPRINT != 0).then(|| {
            let at = self.key_len as usize;
            let bytes = self.data[at..at + FINGERPRINT_BYTES].try_into();
            Fingerprint::from_bytes(bytes.expect("16 bytes"))
        })
    }

    pub fn outcome(&self) -> Option<&[u8]> {
        (self.has & HAS_OUTCOME != 0).then(|| &self.data[self.outcome_at()..])
    }

    fn outcome_at(&self) -> usize {
        let fingerprint = if self.has & HAS_FINGERPRINT != 0 {
            FINGERPRINT_BYTES
        } else {
            0
        };
        self.key_len as usize + fingerprint
    }

    /// Sets the fingerprint and drops the outcome, as a new attempt does.
    pub fn restart(&mut self, fingerprint: Option<Fingerprint>) {
        if self.has & HAS_OUTCOME == 0 && self.fingerprint() == fingerprint {
            return;
        }
        let mut data = std::mem::take(&mut self.data).into_vec();
        data.truncate(self.key_len as usize);
        data.reserve_exact(tail_len(0, fingerprint, None));
        self.data = self.with_tail(data, fingerprint, None);
    }

    /// Sets the outcome, keeping the key and the fingerprint.
    pub fn set_outcome(&mut self, outcome: Option<&[u8]>) {
        let fingerprint = self.fingerprint();
        let mut data = std::mem::take(&mut self.data).into_vec();
        data.truncate(self.outcome_at());
        // Exact, so that boxing it again does not reallocate.
        data.reserve_exact(outcome.map_or(0, <[u8]>::len));
        if let Some(outcome) = outcome {
            data.extend_from_slice(outcome);
        }
        self.has = (self.has & HAS_FINGERPRINT) | if outcome.is_some() { HAS_OUTCOME } else { 0 };
        self.data = data.into_boxed_slice();
        debug_assert_eq!(self.fingerprint(), fingerprint);
    }

    /// `data`, holding the key, with the fingerprint and the outcome appended
    /// (room for them reserved); notes which are there.
    fn with_tail(
        &mut self,
        mut data: Vec<u8>,
        fingerprint: Option<Fingerprint>,
        outcome: Option<&[u8]>,
    ) -> Box<[u8]> {
        self.has = 0;
        if let Some(fingerprint) = fingerprint {
            data.extend_from_slice(&fingerprint.to_bytes());
            self.has |= HAS_FINGERPRINT;
        }
        if let Some(outcome) = outcome {
            data.extend_from_slice(outcome);
            self.has |= HAS_OUTCOME;
        }
        data.into_boxed_slice()
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
                fingerprint: self.fingerprint(),
                outcome: self.outcome().map(Bytes::copy_from_slice),
                completed_at: self.since,
                expires_at: self.deadline,
            })
        } else {
            Record::InProgress(InProgress {
                token,
                fingerprint: self.fingerprint(),
                lease_expires_at: self.deadline,
                attempts: self.attempts(),
                started_at: self.since,
            })
        }
    }
}

/// How long `data` is with `key_len` bytes of key and this tail.
fn tail_len(key_len: usize, fingerprint: Option<Fingerprint>, outcome: Option<&[u8]>) -> usize {
    key_len + fingerprint.map_or(0, |_| FINGERPRINT_BYTES) + outcome.map_or(0, <[u8]>::len)
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
    namespaces: Namespaces,
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
            namespaces: Namespaces::default(),
            earliest_death: Timestamp::from_millis(u64::MAX),
        }
    }
}

impl Shard {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn find(&self, hash: KeyHash, key: &Key) -> Option<usize> {
        // No record of the shard is in a namespace it does not know.
        let ns = self.namespaces.id(key.namespace())?;
        let slots = &self.slots;
        self.index
            .find(hash.spread(), |at| {
                at.hash == hash.0 && {
                    let slot = &slots[at.slot as usize];
                    slot.ns == ns && slot.key() == &key.bytes()[..]
                }
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

    /// The id `slot.ns` holds for `namespace`, if any slot is in it.
    pub fn namespace_id(&self, namespace: &Namespace) -> Option<u32> {
        self.namespaces.id(namespace)
    }

    /// `slot`'s key as [`Key::encode`] writes it.
    pub fn encoded_key(&self, slot: &Slot) -> Vec<u8> {
        let prefix = self.namespaces.prefix(slot.ns);
        let mut out = Vec::with_capacity(prefix.len() + slot.key().len());
        out.extend_from_slice(prefix);
        out.extend_from_slice(slot.key());
        out
    }

    /// Whether `slot`'s encoded key sorts after `encoded`, without building
    /// it.
    pub fn encoded_key_after(&self, slot: &Slot, encoded: &[u8]) -> bool {
        let prefix = self.namespaces.prefix(slot.ns);
        prefix.iter().chain(slot.key()).gt(encoded)
    }

    /// Adds `slot`, keyed in `namespace`.
    pub fn insert(&mut self, namespace: &Namespace, mut slot: Slot) {
        slot.ns = self.namespaces.take(namespace);
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

    /// Puts `slot`, for the same key, in place of slot `i`.
    pub fn replace(&mut self, i: usize, mut slot: Slot) {
        let old = &mut self.slots[i];
        slot.ns = old.ns;
        *old = slot;
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
        let slot = self.slots.swap_remove(i);
        self.namespaces.give_back(slot.ns);
        slot
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

/// The namespaces a shard's slots are in, each under a small id that slots
/// hold instead of the name. An id is freed with its last slot, so a stream
/// of short-lived namespaces does not grow the table.
#[derive(Default)]
struct Namespaces {
    /// By id; `None` for a free id.
    by_id: Vec<Option<Interned>>,
    free: Vec<u32>,
    /// Looked in once there are more than [`SCANNED`] ids.
    by_name: HashMap<Namespace, u32, RandomState>,
}

struct Interned {
    name: Namespace,
    /// [`Key::encode_namespace`]d.
    prefix: Box<[u8]>,
    slots: usize,
}

/// Up to this many ids, a scan (which compares pointers first: keys usually
/// share their namespace's allocation) beats hashing the name.
const SCANNED: usize = 8;

impl Namespaces {
    fn id(&self, namespace: &Namespace) -> Option<u32> {
        if self.by_id.len() <= SCANNED {
            let found = self
                .by_id
                .iter()
                .position(|n| n.as_ref().is_some_and(|n| n.name == *namespace));
            found.map(|i| i as u32)
        } else {
            self.by_name.get(namespace).copied()
        }
    }

    fn prefix(&self, id: u32) -> &[u8] {
        &self.by_id[id as usize].as_ref().expect("a live id").prefix
    }

    /// The id for one more slot in `namespace`.
    fn take(&mut self, namespace: &Namespace) -> u32 {
        if let Some(id) = self.id(namespace) {
            self.by_id[id as usize].as_mut().expect("a live id").slots += 1;
            return id;
        }
        let interned = Interned {
            name: namespace.clone(),
            prefix: Key::encode_namespace(namespace).into_boxed_slice(),
            slots: 1,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.by_id[id as usize] = Some(interned);
                id
            }
            None => {
                self.by_id.push(Some(interned));
                u32::try_from(self.by_id.len() - 1).expect("fewer than 2^32 namespaces")
            }
        };
        self.by_name.insert(namespace.clone(), id);
        id
    }

    /// One slot fewer in namespace `id`.
    fn give_back(&mut self, id: u32) {
        let entry = &mut self.by_id[id as usize];
        let interned = entry.as_mut().expect("a live id");
        interned.slots -= 1;
        if interned.slots == 0 {
            let gone = entry.take().expect("a live id");
            self.by_name.remove(&gone.name);
            self.free.push(id);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: &Key, hasher: &RandomState, fingerprint: Option<Fingerprint>) -> Slot {
        let hash = KeyHash::of(hasher, key);
        let t = Timestamp::from_millis(1);
        Slot::in_progress(key, hash, 1, t, t, 1, fingerprint)
    }

    #[test]
    fn the_tail_keeps_fingerprint_and_outcome_apart() {
        let hasher = RandomState::default();
        let key = Key::new("orders", "o-1").unwrap();
        let fp = Fingerprint::xxh3(b"body");
        let mut s = slot(&key, &hasher, Some(fp));
        assert_eq!(
            (s.key(), s.fingerprint(), s.outcome()),
            (&b"o-1"[..], Some(fp), None)
        );
        s.set_outcome(Some(b""));
        assert_eq!((s.fingerprint(), s.outcome()), (Some(fp), Some(&b""[..])));
        s.set_outcome(Some(b"done"));
        assert_eq!((s.key(), s.fingerprint()), (&b"o-1"[..], Some(fp)));
        assert_eq!(s.outcome(), Some(&b"done"[..]));
        s.restart(None);
        assert_eq!(
            (s.key(), s.fingerprint(), s.outcome()),
            (&b"o-1"[..], None, None)
        );
        s.set_outcome(None);
        assert_eq!((s.fingerprint(), s.outcome()), (None, None));
        s.restart(Some(fp));
        assert_eq!(
            (s.key(), s.fingerprint(), s.outcome()),
            (&b"o-1"[..], Some(fp), None)
        );
    }

    #[test]
    fn namespace_ids_are_found_by_name_and_freed_with_their_last_slot() {
        let hasher = RandomState::default();
        let mut shard = Shard::default();
        // More namespaces than are scanned, so the map answers too.
        let keys: Vec<Key> = (0..3 * SCANNED)
            .flat_map(|n| (0..2).map(move |k| Key::new(&format!("ns-{n}"), format!("k{k}"))))
            .map(Result::unwrap)
            .collect();
        for key in &keys {
            shard.insert(key.namespace(), slot(key, &hasher, None));
        }
        for key in &keys {
            // A namespace equal by name but not by allocation is the same.
            let copy = Key::new(key.namespace().as_str(), key.bytes().clone()).unwrap();
            let i = shard
                .find(KeyHash::of(&hasher, &copy), &copy)
                .expect("found");
            assert_eq!(shard.encoded_key(shard.slot(i)), key.encode());
        }
        let other = Key::new("ns-0", "k9").unwrap();
        assert!(shard.find(KeyHash::of(&hasher, &other), &other).is_none());
        for key in &keys {
            let i = shard.find(KeyHash::of(&hasher, key), key).unwrap();
            shard.remove(i);
        }
        assert!(shard.namespace_id(keys[0].namespace()).is_none());
        assert_eq!(shard.namespaces.free.len(), 3 * SCANNED);
        let again = Key::new("fresh", "k").unwrap();
        shard.insert(again.namespace(), slot(&again, &hasher, None));
        assert!(shard.find(KeyHash::of(&hasher, &again), &again).is_some());
        assert_eq!(shard.namespaces.by_id.len(), 3 * SCANNED);
    }
}
