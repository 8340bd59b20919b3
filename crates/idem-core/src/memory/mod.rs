//! The in-memory store: sharded, concurrent, for tests, single-process
//! services and as the hot tier in front of a durable store.

mod shard;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use bytes::Bytes;
use foldhash::fast::RandomState;
use parking_lot::Mutex;

use self::shard::{KeyHash, Shard, Slot};
use crate::layer::{Checked, StoreWrapper};
use crate::machine::{self, Current, Decision};
use crate::periodic::spawn_periodic;
use crate::tier::{CompletedKey, Handover, ImportItem, Imported, Tier};
use crate::{
    Begin, BeginItem, Claim, Clock, CompleteItem, Entry, Fenced, FencingToken, Fingerprint, Key,
    Lease, Limits, Record, ScanQuery, Store, StoreError, SystemClock, Timestamp,
};

/// How long an `in_progress` record whose lease ran out is kept, so that a
/// takeover still counts its attempts. After that the key is forgotten.
pub const DEFAULT_ABANDONED_RETENTION: Duration = Duration::from_secs(3600);

/// Records kept in memory, lost when the process ends.
///
/// # Cancel safety
///
/// Every operation takes effect in its first poll, under the key's shard
/// lock, and never waits: a dropped future has taken full effect or none.
///
/// Sharded by key hash, each shard under its own lock; a background thread
/// removes expired records. It never drops a live record to save memory: with
/// a [capacity](MemoryStoreBuilder::capacity), a `begin` that would need a new
/// record beyond it fails with [`StoreError::CapacityExceeded`].
///
/// ```
/// use idem_core::{Begin, Key, Lease, MemoryStore, Store};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let key = Key::new("orders", "o-1")?;
/// let Begin::Acquired(claim) = store.begin(&key, None, Lease::from_secs(30)).await? else {
///     unreachable!()
/// };
/// // ... do the work ...
/// let done = store.complete(&key, claim.token, Some("ok".into()), Duration::from_secs(3600)).await?;
/// assert!(!done.is_stale());
/// assert!(matches!(store.begin(&key, None, Lease::from_secs(30)).await?, Begin::Completed { .. }));
/// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    store: Checked<Records>,
}

/// A memory store's operations, behind the limit checks [`Checked`] makes.
#[derive(Clone)]
pub struct Records {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    limits: Limits,
    next_token: AtomicU64,
    capacity: Option<usize>,
    /// Counted only when a capacity is set.
    len: AtomicUsize,
    /// When a full store last swept on demand (ms on its clock).
    last_full_sweep: AtomicU64,
    abandoned_retention: Duration,
    sweeper: OnceLock<Thread>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.sweeper.get() {
            t.unpark();
        }
    }
}

/// Builds a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    limits: Limits,
    capacity: Option<usize>,
    shards: usize,
    sweep_interval: Option<Duration>,
    abandoned_retention: Duration,
}

impl MemoryStoreBuilder {
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

    /// The most records to hold (default: unbounded). A `begin` that would
    /// need a new record beyond it, and a `begin_many` whose new records do
    /// not all fit, are refused with [`StoreError::CapacityExceeded`] and
    /// change nothing.
    pub fn capacity(mut self, records: usize) -> Self {
        self.capacity = Some(records);
        self
    }

    /// How many shards (rounded up to a power of two; default 64).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n.max(1).next_power_of_two();
        self
    }

    /// How often the background sweeper removes expired records (default
    /// 1 s); `None` runs none: call [`MemoryStore::sweep`] yourself.
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// How long an `in_progress` record whose lease ran out is kept (default
    /// [`DEFAULT_ABANDONED_RETENTION`]).
    pub fn abandoned_retention(mut self, d: Duration) -> Self {
        self.abandoned_retention = d;
        self
    }

    /// The store.
    pub fn build(self) -> MemoryStore {
        let inner = Arc::new(Inner {
            shards: (0..self.shards).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            clock: self.clock,
            limits: self.limits,
            next_token: AtomicU64::new(1),
            capacity: self.capacity,
            len: AtomicUsize::new(0),
            last_full_sweep: AtomicU64::new(0),
            abandoned_retention: self.abandoned_retention,
            sweeper: OnceLock::new(),
        });
        if let Some(every) = self.sweep_interval {
            let sweeper = spawn_periodic("idem-memory-sweeper", &inner, every, |inner| {
                inner.sweep();
            })
            .expect("spawning the sweeper thread");
            let _ = inner.sweeper.set(sweeper);
        }
        MemoryStore {
            store: Checked::new(Records { inner }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock with default limits, no capacity limit and
    /// a sweeper every second.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            capacity: None,
            shards: 64,
            sweep_interval: Some(Duration::from_secs(1)),
            abandoned_retention: DEFAULT_ABANDONED_RETENTION,
        }
    }

    /// Removes expired records now; returns how many.
    pub fn sweep(&self) -> usize {
        self.records().sweep()
    }

    /// How many records are held, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.records().shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn records(&self) -> &Inner {
        &self.store.inner().inner
    }
}

impl StoreWrapper for MemoryStore {
    type Inner = Checked<Records>;

    fn inner(&self) -> &Checked<Records> {
        &self.store
    }
}

impl Inner {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn shard(&self, hash: KeyHash) -> &Mutex<Shard> {
        &self.shards[hash.shard(self.shards.len())]
    }

    /// When the sweeper may remove `slot`.
    fn dies_at(&self, slot: &Slot) -> Timestamp {
        if slot.completed {
            slot.deadline
        } else {
            slot.deadline.after(self.abandoned_retention)
        }
    }

    /// Tells slot `i`'s shard when the slot may die.
    fn note_death(&self, shard: &mut Shard, i: usize) {
        let t = self.dies_at(shard.slot(i));
        shard.may_die_at(t);
    }

    fn sweep(&self) -> usize {
        let now = self.now();
        let removed: usize = self
            .shards
            .iter()
            .map(|s| {
                let mut shard = s.lock();
                if shard.may_have_dead(now) {
                    shard.sweep(now, |slot| self.dies_at(slot))
                } else {
                    0
                }
            })
            .sum();
        if self.capacity.is_some() {
            self.len.fetch_sub(removed, Ordering::Relaxed);
        }
        removed
    }

    /// Counts `n` more records, or refuses (counting none) when they do not
    /// all fit.
    fn reserve(&self, n: usize) -> Result<Room<'_>, StoreError> {
        if let Some(limit) = self.capacity {
            let before = self.len.fetch_add(n, Ordering::Relaxed);
            if before.saturating_add(n) > limit {
                self.len.fetch_sub(n, Ordering::Relaxed);
                return Err(StoreError::CapacityExceeded { limit });
            }
        }
        Ok(Room {
            inner: self,
            left: n,
        })
    }

    /// When full, sweeps at once instead of waiting for the sweeper, at most
    /// every 100 ms (a full store of live records would otherwise pay a
    /// whole sweep per `begin`). Returns whether it swept.
    fn sweep_when_full(&self) -> bool {
        let now = self.now().as_millis();
        let last = self.last_full_sweep.load(Ordering::Relaxed);
        let due = now.saturating_sub(last) >= 100
            && self
                .last_full_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        due && self.sweep() > 0
    }

    fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        let hash = KeyHash::of(&self.hasher, key);
        let attempt = || {
            let mut shard = self.shard(hash).lock();
            self.begin_in(
                &mut shard,
                hash,
                key,
                fingerprint,
                lease,
                &mut self.no_room(),
            )
        };
        match attempt() {
            // The shard's lock is released before sweeping, which locks all.
            Err(StoreError::CapacityExceeded { .. }) if self.sweep_when_full() => attempt(),
            r => r,
        }
    }

    /// `begin_many`, all or nothing: with a capacity set, the shards of every
    /// item are locked together and room for each new record is reserved
    /// before any item is acquired, so a full store refuses the whole batch
    /// and changes nothing.
    fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        if self.capacity.is_none() {
            // Each shard is locked once for its items (in their order, so
            // copies of one key are decided first come, first served),
            // not once an item: with two workers, a lock taken for every
            // key moves its cache line between the cores all the time.
            let n = self.shards.len();
            let hashes: Vec<KeyHash> = items
                .iter()
                .map(|i| KeyHash::of(&self.hasher, &i.key))
                .collect();
            let mut order: Vec<usize> = (0..items.len()).collect();
            order.sort_by_key(|&i| hashes[i].shard(n));
            let mut answers: Vec<Option<Result<Begin, StoreError>>> =
                items.iter().map(|_| None).collect();
            let mut room = self.no_room();
            for run in order.chunk_by(|&a, &b| hashes[a].shard(n) == hashes[b].shard(n)) {
                let mut shard = self.shards[hashes[run[0]].shard(n)].lock();
                for &i in run {
                    let item = &items[i];
                    answers[i] = Some(self.begin_in(
                        &mut shard,
                        hashes[i],
                        &item.key,
                        item.fingerprint,
                        item.lease,
                        &mut room,
                    ));
                }
            }
            return answers
                .into_iter()
                .map(|a| a.expect("every item answered"))
                .collect();
        }
        let hashes: Vec<KeyHash> = items
            .iter()
            .map(|i| KeyHash::of(&self.hasher, &i.key))
            .collect();
        let mut swept = false;
        loop {
            let n = self.shards.len();
            let mut wanted: Vec<usize> = hashes.iter().map(|h| h.shard(n)).collect();
            wanted.sort_unstable();
            wanted.dedup();
            // Locked in shard order, so two batches cannot deadlock.
            let mut locked: Vec<Option<parking_lot::MutexGuard<'_, Shard>>> =
                (0..n).map(|_| None).collect();
            for i in wanted {
                locked[i] = Some(self.shards[i].lock());
            }
            let shard_of = |h: KeyHash| h.shard(n);
            let new_records = items
                .iter()
                .zip(&hashes)
                .filter(|(i, h)| {
                    let shard = locked[shard_of(**h)].as_ref().expect("locked");
                    shard.find(**h, &i.key).is_none()
                })
                .count();
            let mut room = match self.reserve(new_records) {
                Ok(room) => room,
                Err(e) if swept => return Err(e),
                Err(e) => {
                    drop(locked);
                    swept = true;
                    if self.sweep_when_full() {
                        continue;
                    }
                    return Err(e);
                }
            };
            return items
                .iter()
                .zip(&hashes)
                .map(|(i, h)| {
                    let shard = locked[shard_of(*h)].as_mut().expect("locked");
                    self.begin_in(shard, *h, &i.key, i.fingerprint, i.lease, &mut room)
                })
                .collect();
        }
    }

    /// No reserved room: a new record takes room as it is made.
    fn no_room(&self) -> Room<'_> {
        Room {
            inner: self,
            left: 0,
        }
    }

    /// `begin` on `key`'s locked shard; a new record takes its room from
    /// `room`.
    fn begin_in(
        &self,
        shard: &mut Shard,
        hash: KeyHash,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
        room: &mut Room<'_>,
    ) -> Result<Begin, StoreError> {
        let now = self.now();
        let found = shard.find(hash, key);
        let current = match found.map(|i| shard.slot(i)) {
            None => Current::Absent,
            Some(s) if s.completed && s.deadline <= now => Current::Absent,
            Some(s) if s.completed => Current::Completed {
                fingerprint: s.fingerprint(),
            },
            Some(s) => Current::InProgress {
                fingerprint: s.fingerprint(),
                lease_expires_at: s.deadline,
                attempts: s.attempts(),
            },
        };
        match machine::decide_begin(current, fingerprint, now) {
            Decision::Acquire { attempt } => {
                if found.is_none() {
                    room.take()?;
                }
                let token = self.next_token.fetch_add(1, Ordering::Relaxed);
                let lease_expires_at = now.after(lease.duration());
                match found {
                    Some(i) => {
                        let slot = shard.slot_mut(i);
                        slot.restart(fingerprint);
                        slot.token = token;
                        slot.deadline = lease_expires_at;
                        slot.since = now;
                        slot.set_attempts(attempt);
                        slot.completed = false;
                        self.note_death(shard, i);
                    }
                    None => {
                        shard.insert(
                            key.namespace(),
                            Slot::in_progress(
                                key,
                                hash,
                                token,
                                lease_expires_at,
                                now,
                                attempt,
                                fingerprint,
                            ),
                        );
                        let last = shard.len() - 1;
                        self.note_death(shard, last);
                    }
                }
                Ok(Begin::Acquired(Claim {
                    token: FencingToken::new(token),
                    lease_expires_at,
                    attempt,
                }))
            }
            Decision::Wait { retry_after } => Ok(Begin::InProgress { retry_after }),
            Decision::Mismatch => Ok(Begin::Mismatch),
            Decision::Replay => {
                let slot = shard.slot(found.expect("a completed record was found"));
                Ok(Begin::Completed {
                    outcome: slot.outcome().map(Bytes::copy_from_slice),
                    completed_at: slot.since,
                })
            }
        }
    }

    /// Runs `op` on the slot `token` owns, or answers `Stale`.
    fn with_owned<T>(
        &self,
        key: &Key,
        token: FencingToken,
        op: impl FnOnce(&mut Shard, usize, Timestamp) -> T,
    ) -> Fenced<T> {
        let hash = KeyHash::of(&self.hasher, key);
        let mut shard = self.shard(hash).lock();
        let now = self.now();
        match shard.find(hash, key) {
            Some(i)
                if !shard.slot(i).completed && {
                    let s = shard.slot(i);
                    machine::owns(s.token, token.get(), s.deadline, now)
                } =>
            {
                Fenced::Ok(op(&mut shard, i, now))
            }
            _ => Fenced::Stale,
        }
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        let hash = KeyHash::of(&self.hasher, key);
        let mut shard = self.shard(hash).lock();
        let now = self.now();
        let Some(i) = shard.find(hash, key) else {
            return Ok(Fenced::Stale);
        };
        let s = shard.slot(i);
        if s.completed {
            let retried = machine::completed_by(s.token, token.get(), s.deadline, now);
            return Ok(if retried {
                Fenced::Ok(())
            } else {
                Fenced::Stale
            });
        }
        if !machine::owns(s.token, token.get(), s.deadline, now) {
            return Ok(Fenced::Stale);
        }
        let slot = shard.slot_mut(i);
        slot.completed = true;
        slot.set_outcome(outcome.as_deref());
        slot.since = now;
        slot.deadline = now.after(retention);
        self.note_death(&mut shard, i);
        Ok(Fenced::Ok(()))
    }

    fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        let released = self.with_owned(key, token, |shard, i, _| {
            shard.remove(i);
        });
        if !released.is_stale() && self.capacity.is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(released)
    }

    fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        let hash = KeyHash::of(&self.hasher, key);
        let mut shard = self.shard(hash).lock();
        let now = self.now();
        let reopened = match shard.find(hash, key) {
            Some(i)
                if {
                    let s = shard.slot(i);
                    s.completed && machine::completed_by(s.token, token.get(), s.deadline, now)
                } =>
            {
                shard.remove(i);
                Fenced::Ok(())
            }
            _ => Fenced::Stale,
        };
        if !reopened.is_stale() && self.capacity.is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(reopened)
    }

    fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        Ok(self.with_owned(key, token, |shard, i, now| {
            let slot = shard.slot_mut(i);
            slot.deadline = now.after(lease.duration());
            let until = slot.deadline;
            self.note_death(shard, i);
            until
        }))
    }

    fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let hash = KeyHash::of(&self.hasher, key);
        let shard = self.shard(hash).lock();
        let now = self.now();
        Ok(shard
            .find(hash, key)
            .map(|i| shard.slot(i))
            .filter(|s| !(s.completed && s.deadline <= now))
            .map(Slot::record))
    }

    fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let after = query.after.as_deref();
        let now = self.now();
        // One namespace: keys sort as their encoded forms do.
        let mut found: Vec<(Bytes, Record)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            let Some(ns) = shard.namespace_id(&query.namespace) else {
                continue;
            };
            for slot in shard.slots() {
                let live = !(slot.completed && slot.deadline <= now);
                let in_range = slot.namespace_id() == ns && after.is_none_or(|a| slot.key() > a);
                if live && in_range {
                    let record = slot.record();
                    if query.admits(&record) {
                        found.push((Bytes::copy_from_slice(slot.key()), record));
                    }
                }
            }
        }
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        found.truncate(query.limit);
        found
            .into_iter()
            .map(|(k, record)| {
                let key = Key::in_namespace(query.namespace.clone(), k)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(Entry { key, record })
            })
            .collect()
    }
}

impl Inner {
    /// One record of an `import_many`.
    fn import(&self, item: &ImportItem) -> Result<Imported, StoreError> {
        let hash = KeyHash::of(&self.hasher, &item.key);
        let mut shard = self.shard(hash).lock();
        let now = self.now();
        let found = shard.find(hash, &item.key);
        let live_completed = found
            .map(|i| shard.slot(i))
            .is_some_and(|s| s.completed && s.deadline > now);
        if live_completed || item.record.expires_at <= now {
            return Ok(Imported::Kept);
        }
        self.next_token
            .fetch_max(item.record.token.get().saturating_add(1), Ordering::Relaxed);
        let slot = Slot::completed(&item.key, hash, &item.record);
        let i = match found {
            Some(i) => {
                shard.replace(i, slot);
                i
            }
            None => {
                self.no_room().take()?;
                shard.insert(item.key.namespace(), slot);
                shard.len() - 1
            }
        };
        self.note_death(&mut shard, i);
        Ok(Imported::Written)
    }

    /// The latest retention end of a completed record.
    fn latest_expiry(&self) -> Option<Timestamp> {
        self.shards
            .iter()
            .filter_map(|shard| {
                let shard = shard.lock();
                shard
                    .slots()
                    .filter(|s| s.completed)
                    .map(|s| s.deadline)
                    .max()
            })
            .max()
    }

    /// Keeps the record `item` names at most `keep` past its completion.
    fn shorten(&self, item: &Handover, keep: Duration) {
        let hash = KeyHash::of(&self.hasher, &item.key);
        let mut shard = self.shard(hash).lock();
        let Some(i) = shard.find(hash, &item.key) else {
            return;
        };
        let slot = shard.slot_mut(i);
        if !slot.completed || slot.token != item.token.get() {
            return;
        }
        let until = slot.since.after(keep);
        if until < slot.deadline {
            slot.deadline = until;
            self.note_death(&mut shard, i);
        }
    }

    /// Live completed keys completed at or after `since`, after `after`,
    /// in (completion time, encoded key) order.
    fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Vec<CompletedKey>, StoreError> {
        let after = after.map(|a| (a.at, a.key.encode()));
        let now = self.now();
        let mut found: Vec<(Timestamp, Vec<u8>)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            found.extend(
                shard
                    .slots()
                    .filter(|s| s.completed && s.deadline > now && s.since >= since)
                    .map(|s| (s.since, shard.encoded_key(s)))
                    .filter(|entry| after.as_ref().is_none_or(|a| entry > a)),
            );
        }
        found.sort_unstable();
        found.truncate(limit);
        found
            .into_iter()
            .map(|(at, k)| {
                let key = Key::decode(&k).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(CompletedKey { at, key })
            })
            .collect()
    }

    /// Live completed keys after `after`, in encoded order.
    fn completed_keys(&self, after: Option<&Key>, limit: usize) -> Result<Vec<Key>, StoreError> {
        let after = after.map(Key::encode);
        let now = self.now();
        let mut found: Vec<Vec<u8>> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            found.extend(
                shard
                    .slots()
                    .filter(|s| s.completed && s.deadline > now)
                    .filter(|s| {
                        after
                            .as_deref()
                            .is_none_or(|a| shard.encoded_key_after(s, a))
                    })
                    .map(|s| shard.encoded_key(s)),
            );
        }
        found.sort_unstable();
        found.truncate(limit);
        found
            .iter()
            .map(|k| Key::decode(k).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }
}

/// A memory store can be either tier: in front of a durable store it holds
/// the work in progress and recent records; its tokens come from one
/// sequence, which imports and [`raise_token_floor`](Tier::raise_token_floor)
/// only ever move up. `completed_keys` reads every record under each
/// shard's lock and sorts: fine for rebuilding a filter at start, not for
/// paging through millions of records often.
impl Tier for MemoryStore {
    const VOLATILE: bool = true;

    async fn import_many(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        self.records().limits.check_import_items(items)?;
        items
            .iter()
            .map(|item| self.records().import(item))
            .collect()
    }

    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        self.records()
            .next_token
            .fetch_max(floor.get().saturating_add(1), Ordering::Relaxed);
        Ok(())
    }

    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        let next = self.records().next_token.load(Ordering::Relaxed);
        Ok(FencingToken::new(next.saturating_sub(1)))
    }

    async fn latest_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        Ok(self.records().latest_expiry())
    }

    async fn shorten(&self, items: &[Handover], keep: Duration) -> Result<(), StoreError> {
        for item in items {
            self.records().shorten(item, keep);
        }
        Ok(())
    }

    async fn completed_since(
        &self,
        since: Timestamp,
        after: Option<&CompletedKey>,
        limit: usize,
    ) -> Result<Option<Vec<CompletedKey>>, StoreError> {
        self.records()
            .completed_since(since, after, limit)
            .map(Some)
    }

    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.records().completed_keys(after, limit)
    }
}

/// Records counted against the capacity ahead of a `begin`; what is not
/// taken is given back when dropped.
struct Room<'a> {
    inner: &'a Inner,
    left: usize,
}

impl Room<'_> {
    /// Room for one new record: reserved, or counted now.
    fn take(&mut self) -> Result<(), StoreError> {
        if self.left > 0 {
            self.left -= 1;
            return Ok(());
        }
        self.inner.reserve(1)?.left = 0;
        Ok(())
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        if self.inner.capacity.is_some() && self.left > 0 {
            self.inner.len.fetch_sub(self.left, Ordering::Relaxed);
        }
    }
}

impl Store for Records {
    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        self.inner.begin(key, fingerprint, lease)
    }

    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        self.inner.complete(key, token, outcome, retention)
    }

    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner.release(key, token)
    }

    async fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.inner.reopen(key, token)
    }

    async fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        self.inner.extend(key, token, lease)
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key)
    }

    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        self.inner.begin_many(items)
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        items
            .iter()
            .map(|i| {
                self.inner
                    .complete(&i.key, i.token, i.outcome.clone(), i.retention)
            })
            .collect()
    }

    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        self.inner.scan(query)
    }

    fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}
