//! What the filter answered: counters read by `stats()`, and the same as
//! `metrics` counters and gauges.

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::Counter;

/// Counts since the filter was built (or loaded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Lookups answered: `absent + maybe`.
    pub lookups: u64,
    /// Lookups answered `Absent`: the exact check was skipped.
    pub absent: u64,
    /// Lookups answered `Maybe`: `hits` plus those made before the filter
    /// was ready.
    pub maybe: u64,
    /// `Maybe` answers from the bits: a key inserted before, or a false
    /// positive.
    pub hits: u64,
    /// Keys inserted, live or by a rebuild.
    pub inserts: u64,
    /// Rotations: generations dropped and started anew.
    pub rotations: u64,
    /// Generations the filter has.
    pub generations: u32,
    /// Bytes of all bit arrays.
    pub bytes: u64,
}

/// A counter on a cache line of its own: lookups on many cores would
/// otherwise fight over one line.
#[derive(Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU64);

impl PaddedCounter {
    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The filter's counters and its `metrics` handles, registered once so
/// that a lookup does no registry work.
pub(super) struct Counters {
    absent: PaddedCounter,
    hits: PaddedCounter,
    unready: PaddedCounter,
    inserts: PaddedCounter,
    rotations: AtomicU64,
    absent_metric: Counter,
    maybe_metric: Counter,
}

/// One lookup's answer, for counting.
pub(super) enum Answer {
    Absent,
    Hit,
    NotReady,
}

impl Counters {
    /// Registers the metrics and sets the gauges for a filter of
    /// `generations` generations and `bytes` bytes.
    pub(super) fn new(generations: u32, bytes: u64) -> Self {
        let lookups = "idem_filter_lookups_total";
        metrics::describe_counter!(
            lookups,
            "Key filter lookups, by answer: absent skipped the exact check, maybe went to it"
        );
        metrics::describe_gauge!(
            "idem_filter_bytes",
            metrics::Unit::Bytes,
            "Bytes of the key filter's bit arrays"
        );
        metrics::describe_gauge!(
            "idem_filter_generations",
            "Generations the key filter keeps"
        );
        metrics::gauge!("idem_filter_bytes").set(bytes as f64);
        metrics::gauge!("idem_filter_generations").set(f64::from(generations));
        Self {
            absent: PaddedCounter::default(),
            hits: PaddedCounter::default(),
            unready: PaddedCounter::default(),
            inserts: PaddedCounter::default(),
            rotations: AtomicU64::new(0),
            absent_metric: metrics::counter!(lookups, "answer" => "absent"),
            maybe_metric: metrics::counter!(lookups, "answer" => "maybe"),
        }
    }

    pub(super) fn lookup(&self, answer: Answer) {
        match answer {
            Answer::Absent => {
                self.absent.add();
                self.absent_metric.increment(1);
            }
            Answer::Hit => {
                self.hits.add();
                self.maybe_metric.increment(1);
            }
            Answer::NotReady => {
                self.unready.add();
                self.maybe_metric.increment(1);
            }
        }
    }

    pub(super) fn insert(&self) {
        self.inserts.add();
    }

    pub(super) fn rotated(&self) {
        self.rotations.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn stats(&self, generations: u32, bytes: u64) -> FilterStats {
        let absent = self.absent.get();
        let hits = self.hits.get();
        let maybe = hits + self.unready.get();
        FilterStats {
            lookups: absent + maybe,
            absent,
            maybe,
            hits,
            inserts: self.inserts.get(),
            rotations: self.rotations.load(Ordering::Relaxed),
            generations,
            bytes,
        }
    }
}
