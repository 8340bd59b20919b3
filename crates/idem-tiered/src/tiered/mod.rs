//! The tiered store: a hot tier in front holds every record in progress and
//! every recent one; a cold tier behind holds completed history; a key
//! filter in front of the cold tier answers "certainly new" for most new
//! keys without touching it (docs/high-volume.md).

mod tokens;
mod write_behind;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use idem_core::tier::{ImportItem, Imported, Tier};
use idem_core::{
    Begin, BeginItem, Clock, CompleteItem, Completed, Entry, Fenced, FencingToken, Fingerprint,
    Key, Lease, Limits, Record, ScanQuery, SharedClock, Store, StoreError, SystemClock, Timestamp,
};

use self::tokens::TokenBlocks;
use self::write_behind::{WriteBehind, WriteBehindConfig};
use crate::filter::KeyFilter;

pub use self::write_behind::WriteBehindStats;

/// How long the hot tier keeps a completed record by default.
pub const DEFAULT_HOT_RETENTION: Duration = Duration::from_secs(3 * 3600);

/// The shortest hot retention: a record on its way to the cold tier is read
/// back from the hot tier, so it must stay there a little while.
pub const MIN_HOT_RETENTION: Duration = Duration::from_secs(1);

/// A hot tier in front of a cold one, with an optional key filter in front
/// of the cold tier; itself a [`Store`] that passes the conformance kit.
///
/// - `begin` claims in the hot tier. A key the hot tier has not seen is
///   checked against the cold tier, unless the filter says it is
///   certainly new; a completed record found there is brought back into
///   the hot tier and replayed.
/// - `complete` completes in the hot tier, keeping the record there for
///   at most the hot retention; a record kept longer is queued for the
///   cold tier (write-behind: batched imports, a bounded queue that makes
///   `complete` wait when full, flushed by [`flush`](Self::flush)).
/// - `release` and `extend` concern claims, which live in the hot tier
///   only; `get` and `scan` read both tiers.
///
/// # What a crash can lose
///
/// A completion is acknowledged once the hot tier has it. Until the
/// write-behind queue has imported it into the cold tier (milliseconds
/// under normal load; [`flush`](Self::flush) and a graceful shutdown wait
/// for it), it exists only in the hot tier: a Redis hot tier keeps it
/// protected through a crash of this process; a memory hot tier loses it
/// with the process, and a redelivery of that key would run again. Claims
/// in progress in a memory hot tier are lost likewise (their redeliveries
/// run again, as after a lease expiry). Tokens never go back: the hot
/// tier's floor is raised to the cold tier's high-water mark when the
/// store opens, and a memory hot tier's tokens are reserved in the cold
/// tier in blocks before they are handed out.
///
/// # Cancel safety
///
/// - `begin`: a claim made in the hot tier whose caller left before the
///   cold check ends with its lease, as for any store; a record brought
///   back from the cold tier is imported in full or not at all.
/// - `complete`: runs to the end in a task of its own once started (the
///   hot tier's completion and its place in the write-behind queue), so a
///   caller that leaves cannot leave a completion the cold tier never
///   gets. A caller waiting for room in a full queue has changed nothing.
/// - the rest: as the hot tier's, or read-only.
pub struct TieredStore<H, C> {
    shared: Arc<Shared<H, C>>,
}

impl<H, C> Clone for TieredStore<H, C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<H, C> {
    hot: H,
    cold: C,
    filter: Option<Arc<KeyFilter>>,
    clock: SharedClock,
    hot_retention: Duration,
    write_through: bool,
    limits: Limits,
    behind: WriteBehind,
    tokens: TokenBlocks,
}

/// Configures a [`TieredStore`].
pub struct TieredStoreBuilder<H, C> {
    hot: H,
    cold: C,
    filter: Option<Arc<KeyFilter>>,
    clock: SharedClock,
    hot_retention: Duration,
    write_through: bool,
    write_behind: WriteBehindConfig,
}

impl<H: Tier + Clone, C: Tier + Clone> TieredStore<H, C> {
    /// Configures a store of `hot` in front of `cold`.
    pub fn builder(hot: H, cold: C) -> TieredStoreBuilder<H, C> {
        TieredStoreBuilder {
            hot,
            cold,
            filter: None,
            clock: Arc::new(SystemClock),
            hot_retention: DEFAULT_HOT_RETENTION,
            write_through: false,
            write_behind: WriteBehindConfig::default(),
        }
    }

    /// The hot tier.
    pub fn hot(&self) -> &H {
        &self.shared.hot
    }

    /// The cold tier.
    pub fn cold(&self) -> &C {
        &self.shared.cold
    }

    /// The key filter, if there is one.
    pub fn filter(&self) -> Option<&Arc<KeyFilter>> {
        self.shared.filter.as_ref()
    }

    /// Waits until every completion queued so far is in the cold tier (or
    /// was given up: see [`WriteBehindStats`]). Returns at once if the task
    /// that imports them has stopped (a panic in the cold tier's code):
    /// then completions that need the cold tier fail instead of waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn flush(&self) {
        self.shared.behind.flush().await;
    }

    /// What the write-behind queue has done so far.
    pub fn write_behind(&self) -> WriteBehindStats {
        self.shared.behind.stats()
    }

    /// Completes `items`: in the hot tier only when it keeps them for their
    /// whole retention, else also towards the cold tier.
    async fn complete_items(&self, items: Vec<CompleteItem>) -> Result<Vec<Fenced>, StoreError> {
        if items
            .iter()
            .all(|i| i.retention < self.shared.hot_retention)
        {
            let mut answers = self.complete_in_hot(&items).await?;
            self.retried_in_cold(&items, &mut answers).await?;
            return Ok(answers);
        }
        self.complete_behind(items).await
    }

    /// One `complete`, or one `complete_many` for several.
    async fn complete_in_hot(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        let hot = &self.shared.hot;
        match items {
            [one] => Ok(vec![
                hot.complete(&one.key, one.token, one.outcome.clone(), one.retention)
                    .await?,
            ]),
            many => hot.complete_many(many).await,
        }
    }

    /// A retried `complete` whose record has left the hot tier meets it in
    /// the cold tier: still `Ok` for the token that completed it. Turns
    /// those `Stale` answers into `Ok`, and says which they were.
    async fn retried_in_cold(
        &self,
        items: &[CompleteItem],
        answers: &mut [Fenced],
    ) -> Result<Vec<bool>, StoreError> {
        let mut in_cold = vec![false; items.len()];
        for (n, item) in items.iter().enumerate() {
            if answers[n].is_stale()
                && let Some(Record::Completed(c)) = self.shared.cold.get(&item.key).await?
                && c.token == item.token
            {
                answers[n] = Fenced::Ok(());
                in_cold[n] = true;
            }
        }
        Ok(in_cold)
    }

    /// Completes `items` in the hot tier and queues those kept longer than
    /// the hot retention for the cold tier, in a task of its own so that a
    /// caller who leaves cannot cut it in half.
    async fn complete_behind(&self, items: Vec<CompleteItem>) -> Result<Vec<Fenced>, StoreError> {
        let hot_retention = self.shared.hot_retention;
        let behind = items
            .iter()
            .filter(|i| i.retention >= hot_retention)
            .count();
        if behind > self.shared.behind.capacity() {
            return Err(StoreError::unavailable(format!(
                "a batch of {behind} completions for the cold tier is larger than the write-behind queue ({}); raise its capacity or send smaller batches",
                self.shared.behind.capacity()
            )));
        }
        let mut places = self.shared.behind.reserve(behind).await?;
        let this = self.clone();
        let task = tokio::spawn(async move {
            let hot = &this.shared.hot;
            let in_hot: Vec<CompleteItem> = items
                .iter()
                .map(|i| CompleteItem {
                    retention: i.retention.min(hot_retention),
                    ..i.clone()
                })
                .collect();
            let mut answers = this.complete_in_hot(&in_hot).await?;
            let in_cold = this.retried_in_cold(&items, &mut answers).await?;
            let done: Vec<CompleteItem> = items
                .into_iter()
                .zip(answers.iter().zip(in_cold))
                .filter(|(i, (answer, in_cold))| {
                    i.retention >= hot_retention && !answer.is_stale() && !in_cold
                })
                .map(|(i, _)| i)
                .collect();
            let records = join_all(done.iter().map(|i| hot.get(&i.key))).await;
            let mut waits = Vec::new();
            for (item, record) in done.into_iter().zip(records) {
                let record = match record {
                    // Completed earlier with a retention the hot tier
                    // covers (this call was a retry): nothing to move.
                    Ok(Some(Record::Completed(c)))
                        if c.token == item.token
                            && c.expires_at.since(c.completed_at) < hot_retention =>
                    {
                        continue;
                    }
                    Ok(Some(Record::Completed(c))) if c.token == item.token => Some(c),
                    _ => None,
                };
                let reached = this.shared.write_through.then(|| {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    waits.push((item.key.clone(), rx));
                    tx
                });
                let place = places.pop().expect("a place for each record kept longer");
                place.send(item.key, item.retention, record, reached);
            }
            Ok::<_, StoreError>((answers, waits))
        });
        let (answers, waits) = task
            .await
            .map_err(|e| StoreError::unavailable(format!("a completion task failed: {e}")))??;
        for (key, reached) in waits {
            if reached.await != Ok(true) {
                return Err(StoreError::unavailable(format!(
                    "the completion of {key} is in the hot tier but did not reach the cold tier (see the write-behind counters); a retry by its holder is answered from the hot tier"
                )));
            }
        }
        Ok(answers)
    }

    /// After the hot tier acquired `key` for a caller: the answer, once the
    /// cold tier has been asked (unless the filter says the key is new).
    async fn settle_acquired(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        claim: Begin,
    ) -> Result<Begin, StoreError> {
        let Begin::Acquired(c) = &claim else {
            return Ok(claim);
        };
        self.shared
            .tokens
            .issued(c.token, &self.shared.cold)
            .await?;
        if self.certainly_new(key) {
            return Ok(claim);
        }
        let token = c.token;
        match self.shared.cold.get(key).await {
            Ok(Some(Record::Completed(old))) => self.bring_back(key, fingerprint, old).await,
            Ok(_) => Ok(claim),
            Err(e) => {
                // Without the cold tier's answer the key cannot be called
                // new: give the claim back so a retry starts clean.
                let _ = self.shared.hot.release(key, token).await;
                Err(e)
            }
        }
    }

    fn certainly_new(&self, key: &Key) -> bool {
        let absent = self
            .shared
            .filter
            .as_ref()
            .is_some_and(|f| f.check(key).is_absent());
        metrics::counter!("idem_tiered_cold_checks_total", "answer" => if absent { "skipped" } else { "asked" })
            .increment(1);
        absent
    }

    /// Imports a record found only in the cold tier into the hot tier (over
    /// the claim just made) and answers as the hot tier now would.
    async fn bring_back(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        old: Completed,
    ) -> Result<Begin, StoreError> {
        let until = self.shared.clock.now().after(self.shared.hot_retention);
        let item = ImportItem {
            key: key.clone(),
            record: Completed {
                expires_at: old.expires_at.min(until),
                ..old.clone()
            },
        };
        if let Imported::Kept = self.shared.hot.import_many(&[item]).await?[0] {
            tracing::debug!(%key, "the hot tier kept its own record over the cold tier's");
        }
        let differs = matches!((fingerprint, old.fingerprint), (Some(a), Some(b)) if a != b);
        Ok(if differs {
            Begin::Mismatch
        } else {
            Begin::Completed {
                outcome: old.outcome,
                completed_at: old.completed_at,
            }
        })
    }
}

impl<H: Tier + Clone, C: Tier + Clone> TieredStoreBuilder<H, C> {
    /// A key filter in front of the cold tier. Its window must cover the
    /// longest retention the store accepts: the store's `max_retention` is
    /// cut to it.
    pub fn filter(mut self, filter: Arc<KeyFilter>) -> Self {
        self.filter = Some(filter);
        self
    }

    /// The clock for the hot retention of records brought back from the
    /// cold tier (the tiers keep their own clocks for everything else).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How long the hot tier keeps a completed record (default 3 h, at
    /// least [`MIN_HOT_RETENTION`]). A completion with a longer retention
    /// also goes to the cold tier.
    pub fn hot_retention(mut self, d: Duration) -> Self {
        self.hot_retention = d.max(MIN_HOT_RETENTION);
        self
    }

    /// Whether `complete` answers only once its record is in the cold tier
    /// (default `false`: once the hot tier has it). Slower, but a crash
    /// then loses nothing a memory hot tier held.
    pub fn write_through(mut self, on: bool) -> Self {
        self.write_through = on;
        self
    }

    /// The write-behind queue's room in records (default 65 536); a
    /// `complete` waits for room when it is full.
    pub fn queue_capacity(mut self, records: usize) -> Self {
        self.write_behind.capacity = records.max(1);
        self
    }

    /// Most records in one import into the cold tier (default 1 024).
    pub fn batch(mut self, records: usize) -> Self {
        self.write_behind.batch = records.max(1);
        self
    }

    /// Opens the store: raises the hot tier's token floor to the cold
    /// tier's high-water mark and starts the write-behind queue. Needs a
    /// Tokio runtime.
    pub async fn open(self) -> Result<TieredStore<H, C>, StoreError> {
        let tokens = TokenBlocks::open(&self.hot, &self.cold).await?;
        let mut limits = self.hot.limits().clone();
        if let Some(f) = &self.filter {
            let sizing = f.sizing();
            let kept = sizing.window * sizing.generations.saturating_sub(1);
            limits.max_retention = limits.max_retention.min(kept);
        }
        let behind = WriteBehind::start(
            self.hot.clone(),
            self.cold.clone(),
            self.filter.clone(),
            self.hot_retention,
            self.write_behind,
        );
        Ok(TieredStore {
            shared: Arc::new(Shared {
                hot: self.hot,
                cold: self.cold,
                filter: self.filter,
                clock: self.clock,
                hot_retention: self.hot_retention,
                write_through: self.write_through,
                limits,
                behind,
                tokens,
            }),
        })
    }
}

impl<H: Tier + Clone, C: Tier + Clone> Store for TieredStore<H, C> {
    async fn begin(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        lease: Lease,
    ) -> Result<Begin, StoreError> {
        // The hot tier checks key and lease against the same limits.
        let claim = self.shared.hot.begin(key, fingerprint, lease).await?;
        self.settle_acquired(key, fingerprint, claim).await
    }

    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        self.shared
            .limits
            .check_complete(key, outcome.as_ref(), retention)?;
        let item = CompleteItem {
            key: key.clone(),
            token,
            outcome,
            retention,
        };
        let mut answers = self.complete_items(vec![item]).await?;
        Ok(answers.pop().expect("one answer per item"))
    }

    async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.shared.hot.release(key, token).await
    }

    async fn extend(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Lease,
    ) -> Result<Fenced<Timestamp>, StoreError> {
        self.shared.hot.extend(key, token, lease).await
    }

    /// The hot tier's record, or the cold tier's completed one. A record
    /// the hot tier keeps for less than its retention shows the cold
    /// tier's copy, with the whole retention, once the write-behind queue
    /// has brought it there.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        match self.shared.hot.get(key).await? {
            Some(Record::Completed(c))
                if c.expires_at.since(c.completed_at) >= self.shared.hot_retention =>
            {
                match self.shared.cold.get(key).await? {
                    Some(Record::Completed(cold)) if cold.token == c.token => {
                        Ok(Some(Record::Completed(cold)))
                    }
                    _ => Ok(Some(Record::Completed(c))),
                }
            }
            Some(r) => Ok(Some(r)),
            None => match self.shared.cold.get(key).await? {
                Some(r @ Record::Completed(_)) => Ok(Some(r)),
                _ => Ok(None),
            },
        }
    }

    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        // The hot tier checks the batch against the same limits.
        let claims = self.shared.hot.begin_many(items).await?;
        let settled = items
            .iter()
            .zip(claims)
            .map(|(item, claim)| self.settle_acquired(&item.key, item.fingerprint, claim));
        join_all(settled).await.into_iter().collect()
    }

    async fn complete_many(&self, items: &[CompleteItem]) -> Result<Vec<Fenced>, StoreError> {
        self.shared.limits.check_complete_items(items)?;
        self.complete_items(items.to_vec()).await
    }

    async fn scan(&self, query: &ScanQuery) -> Result<Vec<Entry>, StoreError> {
        let (hot, cold) = tokio::join!(self.shared.hot.scan(query), self.shared.cold.scan(query));
        let mut merged = hot?;
        let known: std::collections::HashSet<Key> = merged.iter().map(|e| e.key.clone()).collect();
        merged.extend(cold?.into_iter().filter(|e| !known.contains(&e.key)));
        merged.sort_by_cached_key(|e| e.key.encode());
        merged.truncate(query.limit);
        Ok(merged)
    }

    fn limits(&self) -> &Limits {
        &self.shared.limits
    }
}
