//! The ring of bit arrays, one per window, and its rotation.

use std::sync::atomic::{AtomicU64, Ordering};

use fastbloom::AtomicBloomFilter;
use idem_core::Timestamp;
use parking_lot::Mutex;

use super::config::{FilterSeed, FilterSizing};

/// One window's keys.
struct Generation {
    bits: AtomicBloomFilter,
    started_at: AtomicU64,
}

/// `slots.len()` generations in a ring. Generation number `n` lives in slot
/// `n % len`; `newest` is the number of the one receiving inserts. Lookups
/// and inserts take no lock; rotation and snapshots take `rotation`.
pub(super) struct Generations {
    slots: Box<[Generation]>,
    newest: AtomicU64,
    window_ms: u64,
    rotation: Mutex<()>,
}

/// One generation as a snapshot reads it.
pub(super) struct GenerationView<'a> {
    pub(super) started_at: Timestamp,
    bits: &'a AtomicBloomFilter,
}

impl GenerationView<'_> {
    /// The bit array, 64 bits at a time.
    pub(super) fn words(&self) -> impl Iterator<Item = u64> + '_ {
        self.bits.iter()
    }
}

/// One generation as a snapshot stores it.
pub(super) struct StoredGeneration {
    pub(super) started_at: Timestamp,
    pub(super) words: Vec<u64>,
}

impl Generations {
    /// Empty generations, the newest starting at `now`.
    pub(super) fn new(sizing: &FilterSizing, seed: &FilterSeed, now: Timestamp) -> Self {
        let count = u64::from(sizing.generations);
        let window_ms = sizing.window_ms();
        let words = (sizing.generation.bits / 64) as usize;
        let stored = (0..count).map(|n| StoredGeneration {
            // Nominal starts for the empty older ones, a window apart.
            started_at: Timestamp::from_millis(
                now.as_millis().saturating_sub((count - 1 - n) * window_ms),
            ),
            words: vec![0; words],
        });
        Self::from_stored(sizing, seed, stored)
    }

    /// Generations read back, oldest first.
    pub(super) fn from_stored(
        sizing: &FilterSizing,
        seed: &FilterSeed,
        stored: impl IntoIterator<Item = StoredGeneration>,
    ) -> Self {
        let slots: Box<[Generation]> = stored
            .into_iter()
            .map(|generation| Generation {
                bits: AtomicBloomFilter::from_vec(generation.words)
                    .seed(&seed.secret())
                    .hashes(sizing.generation.hashes),
                started_at: AtomicU64::new(generation.started_at.as_millis()),
            })
            .collect();
        debug_assert_eq!(slots.len(), sizing.generations as usize);
        Self {
            newest: AtomicU64::new(slots.len() as u64 - 1),
            slots,
            window_ms: sizing.window_ms(),
            rotation: Mutex::new(()),
        }
    }

    fn slot(&self, number: u64) -> &Generation {
        &self.slots[(number % self.slots.len() as u64) as usize]
    }

    /// Whether any generation may hold `hash`.
    pub(super) fn contains(&self, hash: u64) -> bool {
        self.slots.iter().any(|g| g.bits.contains_hash(hash))
    }

    /// Adds `hash` to the newest generation.
    pub(super) fn insert(&self, hash: u64) {
        let mut number = self.newest.load(Ordering::Acquire);
        loop {
            self.slot(number).bits.insert_hash(hash);
            // A rotation in between stopped the generation just written
            // from receiving keys before this insert returned: write the
            // newest as well, so the key is kept a retention from now.
            let newest = self.newest.load(Ordering::Acquire);
            if newest == number {
                return;
            }
            number = newest;
        }
    }

    /// Once the newest generation's window has passed by `now`, clears the
    /// oldest and makes it the newest, starting at `now`; returns whether it
    /// did.
    ///
    /// One generation a call, starting when the call is made: so every
    /// generation is the newest for at least a window and then outlives
    /// `len - 1` more windows of at least a window each. A key inserted any
    /// time before its generation stopped receiving — however late the
    /// rotation — is kept at least the retention.
    pub(super) fn rotate(&self, now: Timestamp) -> bool {
        let _rotation = self.rotation.lock();
        let newest = self.newest.load(Ordering::Relaxed);
        let started = self.slot(newest).started_at.load(Ordering::Relaxed);
        if now.as_millis() < started.saturating_add(self.window_ms) {
            return false;
        }
        let next = self.slot(newest + 1);
        next.bits.clear();
        next.started_at.store(now.as_millis(), Ordering::Relaxed);
        self.newest.store(newest + 1, Ordering::Release);
        true
    }

    /// Generation start times, oldest first.
    pub(super) fn starts(&self) -> Vec<Timestamp> {
        let _rotation = self.rotation.lock();
        self.oldest_first()
            .map(|g| Timestamp::from_millis(g.started_at.load(Ordering::Relaxed)))
            .collect()
    }

    /// Holds rotation off and shows the generations oldest first: what a
    /// snapshot writes. Inserts go on meanwhile.
    pub(super) fn with_rotation_held<T>(
        &self,
        visit: impl FnOnce(&[GenerationView<'_>]) -> T,
    ) -> T {
        let _rotation = self.rotation.lock();
        let views: Vec<GenerationView<'_>> = self
            .oldest_first()
            .map(|generation| GenerationView {
                started_at: Timestamp::from_millis(generation.started_at.load(Ordering::Relaxed)),
                bits: &generation.bits,
            })
            .collect();
        visit(&views)
    }

    fn oldest_first(&self) -> impl Iterator<Item = &Generation> {
        let newest = self.newest.load(Ordering::Acquire);
        let len = self.slots.len() as u64;
        (newest + 1..=newest + len).map(move |number| self.slot(number))
    }

    /// Each generation's share of bits set, oldest first.
    pub(super) fn fill(&self) -> Vec<f64> {
        self.slots
            .iter()
            .map(|g| {
                let set: u64 = g.bits.iter().map(|w| u64::from(w.count_ones())).sum();
                set as f64 / g.bits.num_bits().max(1) as f64
            })
            .collect()
    }

    /// Bytes of all bit arrays.
    pub(super) fn bytes(&self) -> u64 {
        self.slots
            .iter()
            .map(|g| g.bits.num_bits() as u64 / 8)
            .sum()
    }
}
