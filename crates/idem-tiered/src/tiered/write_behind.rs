//! Write-behind: completed records move from the hot tier to the cold one
//! in batches, off the path of the `complete` that made them.
//!
//! A `complete` takes a place in a bounded queue before it completes in
//! the hot tier (so a full queue makes it wait, and changes nothing while
//! it waits), then reads the completed record back from the hot tier (its
//! token, fingerprint and times, which the cold tier keeps) and sends it.
//! One task drains the queue: it adds the keys to the filter and imports
//! each batch into the cold tier, retrying for as long as the cold tier
//! fails. A record whose read-back failed is read again by that task.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use idem_core::tier::{ImportItem, Tier};
use idem_core::{Completed, InvalidInput, Key, Record, StoreError};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::filter::KeyFilter;

pub(super) struct WriteBehindConfig {
    pub capacity: usize,
    pub batch: usize,
}

impl Default for WriteBehindConfig {
    fn default() -> Self {
        Self {
            capacity: 65_536,
            batch: 1_024,
        }
    }
}

/// A completed record on its way to the cold tier.
pub(super) struct Pending {
    key: Key,
    /// The retention asked for: the cold tier keeps the record this long
    /// from its completion.
    retention: Duration,
    /// The record as the hot tier holds it, when it could be read.
    record: Option<Completed>,
    /// Told whether the record reached the cold tier (write-through).
    reached: Option<oneshot::Sender<bool>>,
}

/// What the write-behind queue has done since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteBehindStats {
    /// Records queued and not yet in the cold tier.
    pub pending: u64,
    /// Records imported into the cold tier (kept ones included).
    pub imported: u64,
    /// Records that left the hot tier (expired) before they could be read
    /// for the cold tier, after a read-back failed: raise the hot
    /// retention if this grows.
    pub lost: u64,
    /// Records the cold tier refused (input over its limits: give both
    /// tiers the same limits).
    pub refused: u64,
    /// Failed attempts at the hot or cold tier, each retried.
    pub retries: u64,
}

#[derive(Default)]
struct State {
    pending: AtomicU64,
    imported: AtomicU64,
    lost: AtomicU64,
    refused: AtomicU64,
    retries: AtomicU64,
    /// The importing task has ended (it panicked): nothing drains the
    /// queue any more, and waiting for it would never end.
    stopped: std::sync::atomic::AtomicBool,
    drained: Notify,
}

/// Marks the queue stopped when the importing task ends, by a panic too,
/// and wakes whoever waits for it to drain.
struct StopsQueue(Arc<State>);

impl Drop for StopsQueue {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::Release);
        self.0.drained.notify_waiters();
    }
}

impl State {
    fn done(&self, n: u64) {
        let left = self.pending.fetch_sub(n, Ordering::AcqRel) - n;
        metrics::gauge!("idem_tiered_write_behind_pending").set(left as f64);
        if left == 0 {
            self.drained.notify_waiters();
        }
    }
}

pub(super) struct WriteBehind {
    tx: mpsc::Sender<Pending>,
    state: Arc<State>,
}

/// A place in the queue, taken before the completion it will carry.
pub(super) struct Place {
    permit: mpsc::OwnedPermit<Pending>,
    state: Arc<State>,
}

impl Place {
    /// Sends the record completed as `key`, read back from the hot tier
    /// (`None` when that failed: the queue's task reads it again).
    pub fn send(
        self,
        key: Key,
        retention: Duration,
        record: Option<Completed>,
        reached: Option<oneshot::Sender<bool>>,
    ) {
        let pending = self.state.pending.fetch_add(1, Ordering::AcqRel) + 1;
        metrics::gauge!("idem_tiered_write_behind_pending").set(pending as f64);
        self.permit.send(Pending {
            key,
            retention,
            record,
            reached,
        });
    }
}

impl WriteBehind {
    pub fn start<H: Tier + Clone, C: Tier + Clone>(
        hot: H,
        cold: C,
        filter: Option<Arc<KeyFilter>>,
        hot_retention: Duration,
        config: WriteBehindConfig,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.capacity);
        let state = Arc::new(State::default());
        let worker = Worker {
            hot,
            cold,
            filter,
            hot_retention,
            state: state.clone(),
        };
        tokio::spawn(worker.run(rx, config.batch));
        Self { tx, state }
    }

    /// Waits for `n` places in the queue (at most its capacity at a time).
    pub async fn reserve(&self, n: usize) -> Result<Vec<Place>, StoreError> {
        let mut places = Vec::with_capacity(n);
        for _ in 0..n {
            let permit = self.tx.clone().reserve_owned().await.map_err(|_| {
                StoreError::unavailable("the tiered store's write-behind task has stopped")
            })?;
            places.push(Place {
                permit,
                state: self.state.clone(),
            });
        }
        Ok(places)
    }

    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }

    pub async fn flush(&self) {
        loop {
            let drained = self.state.drained.notified();
            if self.state.pending.load(Ordering::Acquire) == 0
                || self.state.stopped.load(Ordering::Acquire)
            {
                return;
            }
            drained.await;
        }
    }

    pub fn stats(&self) -> WriteBehindStats {
        let s = &self.state;
        WriteBehindStats {
            pending: s.pending.load(Ordering::Acquire),
            imported: s.imported.load(Ordering::Relaxed),
            lost: s.lost.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            retries: s.retries.load(Ordering::Relaxed),
        }
    }
}

struct Worker<H, C> {
    hot: H,
    cold: C,
    filter: Option<Arc<KeyFilter>>,
    hot_retention: Duration,
    state: Arc<State>,
}

impl<H: Tier, C: Tier> Worker<H, C> {
    async fn run(self, mut rx: mpsc::Receiver<Pending>, batch: usize) {
        let _stops = StopsQueue(self.state.clone());
        let mut pending = Vec::with_capacity(batch);
        while rx.recv_many(&mut pending, batch).await > 0 {
            let n = pending.len() as u64;
            let items = self.read_back(&mut pending).await;
            self.import(items).await;
            self.state.done(n);
        }
    }

    /// Tells a write-through caller whether its record reached the cold
    /// tier (it may have left; then nobody listens).
    fn tell(reached: Option<oneshot::Sender<bool>>, yes: bool) {
        if let Some(tx) = reached {
            let _ = tx.send(yes);
        }
    }

    /// The completed records of `pending`, read again from the hot tier
    /// where they came without one.
    async fn read_back(&self, pending: &mut Vec<Pending>) -> Vec<Ready> {
        let mut items = Vec::with_capacity(pending.len());
        pending.retain_mut(|p| match p.record.take() {
            Some(record) => {
                let item = import_item(p.key.clone(), record, p.retention);
                items.push((item, p.reached.take()));
                false
            }
            None => true,
        });
        let mut backoff = Backoff::default();
        while !pending.is_empty() {
            let reads = join_all(pending.iter().map(|p| self.hot.get(&p.key))).await;
            let mut unread = Vec::new();
            for (p, read) in pending.drain(..).zip(reads) {
                match read {
                    // Kept in the hot tier for its whole retention: a retry
                    // of a completion that never needed the cold tier.
                    Ok(Some(Record::Completed(c)))
                        if c.expires_at.since(c.completed_at) < self.hot_retention =>
                    {
                        Self::tell(p.reached, true);
                    }
                    Ok(Some(Record::Completed(c))) => {
                        items.push((import_item(p.key, c, p.retention), p.reached));
                    }
                    Ok(_) => {
                        Self::tell(p.reached, false);
                        self.state.lost.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("idem_tiered_write_behind_lost_total").increment(1);
                        tracing::warn!(key = %p.key, "a completed record left the hot tier before it reached the cold tier; raise the hot retention");
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, key = %p.key, "reading a completed record from the hot tier failed; retrying");
                        unread.push(p);
                    }
                }
            }
            *pending = unread;
            if !pending.is_empty() {
                self.retried();
                backoff.wait().await;
            }
        }
        items
    }

    /// Imports `items` into the cold tier, retrying while it fails; an item
    /// it refuses is dropped with an error.
    async fn import(&self, ready: Vec<Ready>) {
        let (mut items, mut reached): (Vec<ImportItem>, Vec<_>) = ready.into_iter().unzip();
        if let Some(filter) = &self.filter {
            // Before the import: once the cold tier holds a key, the filter
            // must never call it new.
            for item in &items {
                filter.insert(&item.key);
            }
        }
        let mut backoff = Backoff::default();
        while !items.is_empty() {
            match self.cold.import_many(&items).await {
                Ok(_) => {
                    let n = items.len() as u64;
                    self.state.imported.fetch_add(n, Ordering::Relaxed);
                    metrics::counter!("idem_tiered_imported_total").increment(n);
                    for r in reached {
                        Self::tell(r, true);
                    }
                    return;
                }
                Err(StoreError::Invalid(InvalidInput::InItem { index, error }))
                    if index < items.len() =>
                {
                    let item = items.remove(index);
                    Self::tell(reached.remove(index), false);
                    self.refused(&item.key, &error.to_string());
                }
                Err(StoreError::Invalid(e)) => {
                    for (item, r) in items.drain(..).zip(reached.drain(..)) {
                        Self::tell(r, false);
                        self.refused(&item.key, &e.to_string());
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, records = items.len(), "importing into the cold tier failed; retrying");
                    self.retried();
                    backoff.wait().await;
                }
            }
        }
    }

    fn refused(&self, key: &Key, why: &str) {
        self.state.refused.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idem_tiered_write_behind_refused_total").increment(1);
        tracing::error!(%key, error = why, "the cold tier refused a completed record; it stays in the hot tier only");
    }

    fn retried(&self) {
        self.state.retries.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idem_tiered_write_behind_retries_total").increment(1);
    }
}

/// A record ready for the cold tier, and who waits to hear it got there.
type Ready = (ImportItem, Option<oneshot::Sender<bool>>);

/// The cold tier's copy of a record: kept for the whole retention from its
/// completion.
fn import_item(key: Key, record: Completed, retention: Duration) -> ImportItem {
    ImportItem {
        record: Completed {
            expires_at: record.completed_at.after(retention),
            ..record
        },
        key,
    }
}

/// 10 ms, doubling to 1 s.
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(10))
    }
}

impl Backoff {
    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }
}
