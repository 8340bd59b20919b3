//! Whether the filter may answer `Absent` yet, and rebuilding it until it may.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use futures_util::{Stream, StreamExt};
use idem_core::{Key, Timestamp};

use super::KeyFilter;

/// How often, in keys, a rebuild reports progress (and, fed by a stream,
/// lets other tasks run).
pub const REBUILD_PROGRESS_EVERY: u64 = 4096;

/// Whether the filter knows every key it should, and so may answer
/// [`Absent`](super::Membership::Absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The filter lacks keys: every lookup answers `Maybe` until
    /// [`KeyFilter::rebuild`] has fed it the keys of the records created
    /// since `since` (all of them when `None`: a new filter).
    NeedsRebuild {
        /// The earliest record creation time whose key the filter may lack:
        /// the time of the snapshot it was loaded from, or `None` when it
        /// may lack any key. Start the feed earlier by the most the store's
        /// clock may run behind the one the snapshot was taken by.
        since: Option<Timestamp>,
    },
    /// A rebuild is running; every lookup answers `Maybe` until it ends.
    Rebuilding {
        /// Keys fed so far (updated every [`REBUILD_PROGRESS_EVERY`]).
        done: u64,
        /// Keys to feed, when the source said.
        total: Option<u64>,
    },
    /// The filter holds every key inserted into it or fed to it: a lookup
    /// may answer `Absent`.
    Ready,
}

/// Why a rebuild did not make the filter ready.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError<E: std::error::Error + 'static> {
    /// Another rebuild of this filter is running.
    #[error("a rebuild of this filter is already running; wait for it to end")]
    AlreadyRunning,
    /// The filter is ready already.
    #[error(
        "the filter is ready already (rebuilt, or caught up after loading a snapshot); build a new filter to rebuild from scratch"
    )]
    AlreadyReady,
    /// The key source failed; the filter still answers `Maybe`.
    #[error(
        "reading the keys to rebuild from failed after {done} keys; the filter keeps answering Maybe until a rebuild completes: retry it"
    )]
    Source {
        /// Keys fed before the failure.
        done: u64,
        /// What the source reported.
        #[source]
        source: E,
    },
}

const NEEDS_REBUILD: u8 = 0;
const REBUILDING: u8 = 1;
const READY: u8 = 2;

/// The readiness as the filter keeps it: read on every lookup.
pub(super) struct ReadinessState {
    state: AtomicU8,
    since: Option<Timestamp>,
    done: AtomicU64,
    total: AtomicU64,
}

impl ReadinessState {
    pub(super) fn needs_rebuild(since: Option<Timestamp>) -> Self {
        ready_gauge(false);
        Self {
            state: AtomicU8::new(NEEDS_REBUILD),
            since,
            done: AtomicU64::new(0),
            total: AtomicU64::new(u64::MAX),
        }
    }

    /// Acquire pairs with the release that marks a rebuild done: a lookup
    /// that sees "ready" sees every key the rebuild fed.
    pub(super) fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    pub(super) fn get(&self) -> Readiness {
        match self.state.load(Ordering::Acquire) {
            READY => Readiness::Ready,
            REBUILDING => Readiness::Rebuilding {
                done: self.done.load(Ordering::Relaxed),
                total: Some(self.total.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX),
            },
            _ => Readiness::NeedsRebuild { since: self.since },
        }
    }

    /// The earliest record creation time whose key the filter may lack, if
    /// a snapshot taken now were loaded: `now` once ready, otherwise what
    /// the filter lacks already (`None`: any key).
    pub(super) fn complete_before(&self, now: Timestamp) -> Option<Timestamp> {
        if self.is_ready() {
            Some(now)
        } else {
            self.since
        }
    }
}

/// `idem_filter_ready`: 1 once the filter may answer `Absent`.
fn ready_gauge(ready: bool) {
    metrics::gauge!("idem_filter_ready").set(if ready { 1.0 } else { 0.0 });
}

/// A running rebuild; dropped before [`finish`](Rebuild::finish) (an error,
/// a dropped future), it leaves the filter needing a rebuild.
struct Rebuild<'a, P: FnMut(u64, Option<u64>)> {
    filter: &'a KeyFilter,
    total: Option<u64>,
    done: u64,
    progress: P,
    finished: bool,
}

impl<'a, P: FnMut(u64, Option<u64>)> Rebuild<'a, P> {
    fn start<E: std::error::Error>(
        filter: &'a KeyFilter,
        total: Option<u64>,
        mut progress: P,
    ) -> Result<Self, RebuildError<E>> {
        let readiness = &filter.readiness;
        if let Err(state) = readiness.state.compare_exchange(
            NEEDS_REBUILD,
            REBUILDING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            return Err(if state == READY {
                RebuildError::AlreadyReady
            } else {
                RebuildError::AlreadyRunning
            });
        }
        readiness.done.store(0, Ordering::Relaxed);
        readiness
            .total
            .store(total.unwrap_or(u64::MAX), Ordering::Relaxed);
        tracing::info!(?total, "rebuilding the key filter");
        progress(0, total);
        Ok(Self {
            filter,
            total,
            done: 0,
            progress,
            finished: false,
        })
    }

    /// Feeds one key from the source; true when progress was just
    /// reported.
    fn feed<E: std::error::Error>(&mut self, key: Result<Key, E>) -> Result<bool, RebuildError<E>> {
        let key = key.map_err(|source| RebuildError::Source {
            done: self.done,
            source,
        })?;
        self.filter.insert(&key);
        self.done += 1;
        if self.done.is_multiple_of(REBUILD_PROGRESS_EVERY) {
            self.report();
            return Ok(true);
        }
        Ok(false)
    }

    fn report(&mut self) {
        self.filter
            .readiness
            .done
            .store(self.done, Ordering::Relaxed);
        (self.progress)(self.done, self.total);
    }

    fn finish(mut self) -> u64 {
        self.report();
        self.finished = true;
        self.filter.readiness.state.store(READY, Ordering::Release);
        ready_gauge(true);
        tracing::info!(
            keys = self.done,
            "key filter rebuilt: it may answer Absent now"
        );
        self.done
    }
}

impl<P: FnMut(u64, Option<u64>)> Drop for Rebuild<'_, P> {
    fn drop(&mut self) {
        if !self.finished {
            tracing::warn!(
                keys = self.done,
                "key filter rebuild stopped before the end; it answers Maybe until a rebuild completes"
            );
            self.filter
                .readiness
                .state
                .store(NEEDS_REBUILD, Ordering::Release);
        }
    }
}

impl KeyFilter {
    /// Whether the filter may answer `Absent` yet.
    pub fn readiness(&self) -> Readiness {
        self.readiness.get()
    }

    /// Feeds the filter the keys of the records that exist (or, after
    /// loading a snapshot, of those created since
    /// [`Readiness::NeedsRebuild::since`]), then marks it ready.
    ///
    /// Lookups answer `Maybe` until it returns `Ok`; inserts from live
    /// traffic go on meanwhile and are kept. Fed keys all go to the newest
    /// generation, so each is kept at least a retention from now.
    /// `progress(done, total)` is called at the start, every
    /// [`REBUILD_PROGRESS_EVERY`] keys and at the end; `total` is passed
    /// through for a progress bar. Returns the number of keys fed.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use idem_core::{Key, Timestamp};
    /// use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter, Membership};
    ///
    /// let config = FilterConfig::new(FilterSeed::new(7), 1_000, Duration::from_secs(3600));
    /// let filter = KeyFilter::new(&config, Timestamp::from_millis(0))?;
    /// let stored = [Key::new("orders", "o-1")?];
    /// filter.rebuild(stored.iter().cloned().map(Ok::<_, Infallible>), Some(1), |_, _| {})?;
    /// assert_eq!(filter.check(&stored[0]), Membership::Maybe);
    /// assert_eq!(filter.check(&Key::new("orders", "o-2")?), Membership::Absent);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn rebuild<E: std::error::Error + 'static>(
        &self,
        keys: impl IntoIterator<Item = Result<Key, E>>,
        total: Option<u64>,
        progress: impl FnMut(u64, Option<u64>),
    ) -> Result<u64, RebuildError<E>> {
        let mut rebuild = Rebuild::start(self, total, progress)?;
        for key in keys {
            rebuild.feed(key)?;
        }
        Ok(rebuild.finish())
    }

    /// [`rebuild`](KeyFilter::rebuild), fed by a stream (the cold tier's
    /// scan). Dropping the future stops the rebuild and leaves the filter
    /// needing one.
    pub async fn rebuild_from_stream<E: std::error::Error + 'static>(
        &self,
        keys: impl Stream<Item = Result<Key, E>>,
        total: Option<u64>,
        progress: impl FnMut(u64, Option<u64>),
    ) -> Result<u64, RebuildError<E>> {
        let mut rebuild = Rebuild::start(self, total, progress)?;
        let mut keys = std::pin::pin!(keys);
        while let Some(key) = keys.next().await {
            if rebuild.feed(key)? {
                // A stream that is always ready would hold the worker
                // thread for the whole rebuild.
                tokio::task::yield_now().await;
            }
        }
        Ok(rebuild.finish())
    }
}
