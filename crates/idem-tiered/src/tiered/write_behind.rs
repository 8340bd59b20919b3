//! Write-behind: completed records move from the hot tier to the cold one
//! in batches, off the path of the `complete` that made them.
//!
//! A `complete` takes a place in a bounded queue before it completes in
//! the hot tier (so a full queue makes it wait, and changes nothing while
//! it waits), completes there with the whole retention, reads the record
//! back (its token, fingerprint and times, which the cold tier keeps) and
//! sends it. One task drains the queue: it adds the keys to the filter,
//! imports each batch into the cold tier, retrying for as long as the cold
//! tier fails, and only then shortens the hot copies to the hot retention
//! (so a record is never in neither tier) and takes them off the hot
//! tier's list of handovers. A record whose read-back failed is read again
//! by that task.
//!
//! A hot tier that keeps a list of handovers (Redis) has each completion
//! listed before it is acknowledged. A sweep takes from that list what has
//! been listed for longer than the grace — what a crashed process left, or
//! what another process is slow to move — and moves it the same way.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use idem_core::tier::{Handover, ImportItem, Tier};
use idem_core::{Completed, InvalidInput, Record, StoreError};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot};

use super::HotRetention;
use super::key_check::KeyCheck;

/// Hot-tier reads in flight at once while records are read back.
pub(super) const READS_AT_ONCE: usize = 256;

/// Handovers taken from the list per look.
const SWEEP_PAGE: usize = 1_024;

pub(super) struct WriteBehindConfig {
    pub capacity: usize,
    pub batch: usize,
    /// How long a handover stays listed before a sweep moves it.
    pub grace: Duration,
    /// Whether to sweep the list at all.
    pub sweep: bool,
}

impl Default for WriteBehindConfig {
    fn default() -> Self {
        Self {
            capacity: 65_536,
            batch: 1_024,
            grace: Duration::from_secs(30),
            sweep: true,
        }
    }
}

/// A completed record on its way to the cold tier.
pub(super) struct Pending {
    handover: Handover,
    /// The record as the hot tier holds it, when it could be read.
    record: Option<Completed>,
    /// Told whether the record reached the cold tier (a `complete` that
    /// answers only then).
    reached: Option<oneshot::Sender<bool>>,
    /// Taken from the list of handovers, not from a completion of this
    /// process: a record that is no longer in the hot tier was moved
    /// already.
    swept: bool,
}

/// What the write-behind queue has done since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteBehindStats {
    /// Records queued and not yet in the cold tier.
    pub pending: u64,
    /// Of those, the acknowledged ones that exist only in a hot tier the
    /// process's end loses: what a crash would lose now. Zero unless the
    /// store acknowledges before the cold tier with a memory hot tier
    /// ([`TieredStoreBuilder::ack_before_cold`](super::TieredStoreBuilder::ack_before_cold)).
    pub unprotected: u64,
    /// Records imported into the cold tier (kept ones included).
    pub imported: u64,
    /// Records that left the hot tier before they could be read for the
    /// cold tier (the hot tier lost them: Redis evicted or restarted).
    pub lost: u64,
    /// Records the cold tier refused (input over its limits: give both
    /// tiers the same limits); they stay in the hot tier only.
    pub refused: u64,
    /// Failed attempts at the hot or cold tier, each retried.
    pub retries: u64,
    /// Handovers a sweep took from the hot tier's list: left by a process
    /// that ended, or slow to move.
    pub swept: u64,
}

#[derive(Default)]
struct State {
    pending: AtomicU64,
    imported: AtomicU64,
    lost: AtomicU64,
    refused: AtomicU64,
    retries: AtomicU64,
    swept: AtomicU64,
    /// Whether what is pending was acknowledged while only a volatile hot
    /// tier held it.
    unprotected: bool,
    /// The handovers queued by this process and not yet done, so a sweep
    /// does not queue them twice; kept only where there is a list to sweep.
    in_flight: Option<Mutex<HashSet<Handover>>>,
    /// The importing task has ended (it panicked): nothing drains the
    /// queue any more, and waiting for it would never end.
    stopped: AtomicBool,
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
    fn queued(&self, handover: &Handover) {
        let pending = self.pending.fetch_add(1, Ordering::AcqRel) + 1;
        self.gauges(pending);
        if let Some(in_flight) = &self.in_flight {
            in_flight.lock().insert(handover.clone());
        }
    }

    fn done(&self, handovers: &[Handover]) {
        if let Some(in_flight) = &self.in_flight {
            let mut in_flight = in_flight.lock();
            for h in handovers {
                in_flight.remove(h);
            }
        }
        let n = handovers.len() as u64;
        let left = self.pending.fetch_sub(n, Ordering::AcqRel) - n;
        self.gauges(left);
        if left == 0 {
            self.drained.notify_waiters();
        }
    }

    fn gauges(&self, pending: u64) {
        metrics::gauge!("idem_tiered_write_behind_pending").set(pending as f64);
        let unprotected = if self.unprotected { pending } else { 0 };
        metrics::gauge!("idem_tiered_unprotected_completions").set(unprotected as f64);
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
    /// Sends the record completed as `handover`, read back from the hot
    /// tier (`None` when that failed: the queue's task reads it again).
    pub fn send(
        self,
        handover: Handover,
        record: Option<Completed>,
        reached: Option<oneshot::Sender<bool>>,
    ) {
        self.state.queued(&handover);
        self.permit.send(Pending {
            handover,
            record,
            reached,
            swept: false,
        });
    }
}

/// Where the queue's task takes records from and to.
pub(super) struct Tiers<H, C> {
    pub hot: H,
    pub cold: C,
    pub check: KeyCheck,
    pub hot_retention: HotRetention,
    /// The hot tier's list of handovers for this cold tier, when it keeps
    /// one.
    pub list: Option<String>,
}

impl WriteBehind {
    /// Starts the importing task, and the sweep of the list of handovers
    /// when there is one. `unprotected`: completions are acknowledged while
    /// only a volatile hot tier holds them.
    pub fn start<H: Tier + Clone, C: Tier + Clone>(
        tiers: Tiers<H, C>,
        config: WriteBehindConfig,
        unprotected: bool,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.capacity);
        let state = Arc::new(State {
            unprotected,
            in_flight: (tiers.list.is_some() && config.sweep).then(Mutex::default),
            ..State::default()
        });
        state.gauges(0);
        let worker = Arc::new(Worker {
            tiers,
            state: state.clone(),
        });
        if worker.tiers.list.is_some() && config.sweep {
            tokio::spawn(worker.clone().sweep(tx.downgrade(), config.grace));
        }
        tokio::spawn(worker.run(rx, config.batch));
        Self { tx, state }
    }

    /// Waits for `n` places in the queue (at most its capacity at a time).
    pub async fn reserve(&self, n: usize) -> Result<Vec<Place>, StoreError> {
        let mut places = Vec::with_capacity(n);
        for _ in 0..n {
            places.push(reserve(&self.tx, &self.state).await?);
        }
        Ok(places)
    }

    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }

    /// Waits until the queue is empty, or its task has stopped.
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
        let pending = s.pending.load(Ordering::Acquire);
        WriteBehindStats {
            pending,
            unprotected: if s.unprotected { pending } else { 0 },
            imported: s.imported.load(Ordering::Relaxed),
            lost: s.lost.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            retries: s.retries.load(Ordering::Relaxed),
            swept: s.swept.load(Ordering::Relaxed),
        }
    }
}

async fn reserve(tx: &mpsc::Sender<Pending>, state: &Arc<State>) -> Result<Place, StoreError> {
    let permit =
        tx.clone().reserve_owned().await.map_err(|_| {
            StoreError::unavailable("the tiered store's write-behind task has stopped")
        })?;
    Ok(Place {
        permit,
        state: state.clone(),
    })
}

struct Worker<H, C> {
    tiers: Tiers<H, C>,
    state: Arc<State>,
}

impl<H: Tier, C: Tier> Worker<H, C> {
    async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<Pending>, batch: usize) {
        let _stops = StopsQueue(self.state.clone());
        let mut pending = Vec::with_capacity(batch);
        while rx.recv_many(&mut pending, batch).await > 0 {
            let handovers: Vec<Handover> = pending.iter().map(|p| p.handover.clone()).collect();
            let items = self.read_back(&mut pending).await;
            self.import(items).await;
            self.state.done(&handovers);
        }
    }

    /// Every so often, queues what has been on the hot tier's list of
    /// handovers for longer than `grace` and is not queued here already.
    /// Ends once the store is gone.
    async fn sweep(self: Arc<Self>, tx: mpsc::WeakSender<Pending>, grace: Duration) {
        let Some(list) = self.tiers.list.clone() else {
            return;
        };
        let every = (grace / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(tx) = tx.upgrade() else {
                return;
            };
            loop {
                let due = match self.tiers.hot.due_handovers(&list, grace, SWEEP_PAGE).await {
                    Ok(due) => due,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the hot tier's list of handovers failed; retrying at the next sweep");
                        break;
                    }
                };
                let whole_page = due.len() == SWEEP_PAGE;
                for handover in due {
                    let queued = self.state.in_flight.as_ref();
                    if queued.is_some_and(|q| q.lock().contains(&handover)) {
                        continue;
                    }
                    let Ok(place) = reserve(&tx, &self.state).await else {
                        return;
                    };
                    self.state.swept.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("idem_tiered_handovers_swept_total").increment(1);
                    self.state.queued(&handover);
                    place.permit.send(Pending {
                        handover,
                        record: None,
                        reached: None,
                        swept: true,
                    });
                }
                if !whole_page {
                    break;
                }
            }
        }
    }

    /// Tells a caller waiting for the cold tier whether its record reached
    /// it (it may have left; then nobody listens).
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
                items.push(Ready::new(&p.handover, record, p.reached.take()));
                false
            }
            None => true,
        });
        let mut backoff = Backoff::default();
        while !pending.is_empty() {
            let hot = &self.tiers.hot;
            let mut reads = Vec::with_capacity(pending.len());
            for chunk in pending.chunks(READS_AT_ONCE) {
                reads.extend(join_all(chunk.iter().map(|p| hot.get(&p.handover.key))).await);
            }
            let mut unread = Vec::new();
            for (p, read) in pending.drain(..).zip(reads) {
                match read {
                    Ok(Some(Record::Completed(c))) if c.token == p.handover.token => {
                        items.push(Ready::new(&p.handover, c, p.reached));
                    }
                    // A listed record no longer there (or completed anew):
                    // moved and shortened already, its listing outlived.
                    Ok(_) if p.swept => self.unlist(std::slice::from_ref(&p.handover)).await,
                    Ok(_) => {
                        Self::tell(p.reached, false);
                        self.state.lost.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("idem_tiered_write_behind_lost_total").increment(1);
                        tracing::error!(key = %p.handover.key, "a completed record left the hot tier before it reached the cold tier (the hot tier lost it: eviction or a restart without persistence)");
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, key = %p.handover.key, "reading a completed record from the hot tier failed; retrying");
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

    /// Imports `ready` into the cold tier, retrying while it fails (an item
    /// it refuses is dropped with an error), then shortens the hot copies
    /// and takes them off the list of handovers.
    async fn import(&self, ready: Vec<Ready>) {
        if ready.is_empty() {
            return;
        }
        let mut items = Vec::with_capacity(ready.len());
        let mut reached = Vec::with_capacity(ready.len());
        let mut handovers = Vec::with_capacity(ready.len());
        for r in ready {
            items.push(r.item);
            reached.push(r.reached);
            handovers.push(r.handover);
        }
        // Before the import: once the cold tier holds a key, the filter
        // must never call it new.
        let mut backoff = Backoff::default();
        loop {
            let keys: Vec<&idem_core::Key> = items.iter().map(|i| &i.key).collect();
            match self.tiers.check.insert(&self.tiers.hot, &keys).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, records = items.len(), "adding keys to the shared key filter failed; retrying before they move");
                    self.retried();
                    backoff.wait().await;
                }
            }
        }
        let mut backoff = Backoff::default();
        let mut moved = Vec::with_capacity(items.len());
        while !items.is_empty() {
            match self.tiers.cold.import_many(&items).await {
                Ok(_) => {
                    let n = items.len() as u64;
                    self.state.imported.fetch_add(n, Ordering::Relaxed);
                    metrics::counter!("idem_tiered_imported_total").increment(n);
                    for r in reached.drain(..) {
                        Self::tell(r, true);
                    }
                    moved.append(&mut handovers);
                    break;
                }
                Err(StoreError::Invalid(InvalidInput::InItem { index, error }))
                    if index < items.len() =>
                {
                    let item = items.remove(index);
                    Self::tell(reached.remove(index), false);
                    self.refused(&item.key, &error.to_string());
                    // Kept in the hot tier for its whole retention.
                    self.unlist(&[handovers.remove(index)]).await;
                }
                Err(StoreError::Invalid(e)) => {
                    for (item, r) in items.drain(..).zip(reached.drain(..)) {
                        Self::tell(r, false);
                        self.refused(&item.key, &e.to_string());
                    }
                    self.unlist(&std::mem::take(&mut handovers)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, records = items.len(), "importing into the cold tier failed; retrying");
                    self.retried();
                    backoff.wait().await;
                }
            }
        }
        if moved.is_empty() {
            return;
        }
        // The cold tier holds them now: the hot copies need only last the
        // hot retention. Failing that, they last their whole retention and
        // stay listed, and a later sweep tries again.
        match self
            .tiers
            .hot
            .shorten(&moved, self.tiers.hot_retention.get())
            .await
        {
            Ok(()) => self.unlist(&moved).await,
            Err(e) => {
                self.retried();
                tracing::warn!(error = %e, records = moved.len(), "shortening hot copies already in the cold tier failed; they stay until their own retention ends, and a later sweep tries again");
            }
        }
    }

    async fn unlist(&self, handovers: &[Handover]) {
        let Some(list) = &self.tiers.list else {
            return;
        };
        if let Err(e) = self.tiers.hot.unlist_handovers(list, handovers).await {
            self.retried();
            tracing::warn!(error = %e, records = handovers.len(), "taking moved records off the hot tier's list of handovers failed; a later sweep finds them moved");
        }
    }

    fn refused(&self, key: &idem_core::Key, why: &str) {
        self.state.refused.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idem_tiered_write_behind_refused_total").increment(1);
        tracing::error!(%key, error = why, "the cold tier refused a completed record; it stays in the hot tier only, for its whole retention");
    }

    fn retried(&self) {
        self.state.retries.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idem_tiered_write_behind_retries_total").increment(1);
    }
}

/// A record ready for the cold tier, and who waits to hear it got there.
struct Ready {
    item: ImportItem,
    handover: Handover,
    reached: Option<oneshot::Sender<bool>>,
}

impl Ready {
    /// The cold tier's copy is the hot tier's, which keeps the whole
    /// retention until it is moved.
    fn new(handover: &Handover, record: Completed, reached: Option<oneshot::Sender<bool>>) -> Self {
        Self {
            item: ImportItem {
                key: handover.key.clone(),
                record,
            },
            handover: handover.clone(),
            reached,
        }
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
