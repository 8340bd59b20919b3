//! The tiered store: a hot tier in front holds every record in progress and
//! every recent one; a cold tier behind holds completed history; a key
//! filter in front of the cold tier answers "certainly new" for most new
//! keys without touching it (docs/high-volume.md).

mod key_check;
mod tokens;
mod write_behind;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use idem_core::tier::{Handover, ImportItem, Imported, SharedFilter, SoleFront, Tier};
use idem_core::{
    Begin, BeginItem, Clock, CompleteItem, Completed, Entry, Fenced, FencingToken, Fingerprint,
    Key, Lease, Limits, Record, ScanQuery, SharedClock, Store, StoreError, SystemClock, Timestamp,
};

use self::key_check::{ColdCheckCounts, KeyCheck};
use self::tokens::TokenBlocks;
use self::write_behind::{READS_AT_ONCE, Tiers, WriteBehind, WriteBehindConfig};
use crate::filter::{FilterConfig, KeyFilter};

pub use self::key_check::ColdChecks;
pub use self::write_behind::WriteBehindStats;

/// How long the hot tier keeps a completed record by default.
pub const DEFAULT_HOT_RETENTION: Duration = Duration::from_secs(3 * 3600);

/// The shortest hot retention.
pub const MIN_HOT_RETENTION: Duration = Duration::from_secs(1);

/// Cold-tier lookups in flight at once for one `begin_many`.
const COLD_CHECKS_AT_ONCE: usize = 64;

/// How long a `reopen` waits for the completions queued for the cold tier
/// to reach it.
const REOPEN_FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// How long the hot tier keeps a completed record once the cold tier has
/// it: which records the hot tier alone keeps, and which the cold tier
/// must keep too.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HotRetention(Duration);

impl HotRetention {
    pub(crate) fn get(self) -> Duration {
        self.0
    }

    /// Whether the hot tier keeps a record completed with `retention` for
    /// all of it, so the cold tier need not hold it.
    pub(crate) fn covers(self, retention: Duration) -> bool {
        retention < self.0
    }

    /// [`covers`](Self::covers) for a record as a tier holds it.
    pub(crate) fn covers_record(self, c: &Completed) -> bool {
        self.covers(c.expires_at.since(c.completed_at))
    }
}

/// When a [`TieredStore`] answers a `complete` whose record goes to the
/// cold tier, and so what a crash of the process can lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acknowledgement {
    /// Once the cold tier holds the record: a crash loses no acknowledged
    /// completion. The default with a memory hot tier, and what
    /// [`write_through`](TieredStoreBuilder::write_through) asks for.
    AfterCold,
    /// Once a hot tier that outlives the process (Redis) holds the record
    /// for its whole retention and has it on its list of handovers: a
    /// crash of the process loses nothing (the next process to open the
    /// store moves what is listed); the hot tier's own durability bounds
    /// it. The default with such a hot tier.
    AfterHot,
    /// Once a memory hot tier holds it: a crash of the process loses
    /// every completion still on its way to the cold tier
    /// ([`WriteBehindStats::unprotected`], the gauge
    /// `idem_tiered_unprotected_completions`). Only when asked for with
    /// [`ack_before_cold`](TieredStoreBuilder::ack_before_cold).
    BeforeColdUnprotected,
}

/// A hot tier in front of a cold one, with an optional key filter in front
/// of the cold tier; itself a [`Store`] that passes the conformance kit.
///
/// - `begin` claims in the hot tier. A key the hot tier has not seen is
///   checked against the cold tier, unless the filter says it is
///   certainly new; a completed record found there is brought back into
///   the hot tier and replayed.
/// - `complete` completes in the hot tier with the whole retention. A
///   record the hot tier does not keep for all of it (or every record, with
///   a memory hot tier) is queued for the cold tier (write-behind: batched
///   imports, a bounded queue that makes `complete` wait when full); once
///   the cold tier holds it, the hot copy is shortened to the hot
///   retention. A record is never in neither tier.
/// - `release` and `extend` concern claims, which live in the hot tier
///   only; `get` and `scan` read both tiers.
///
/// # What a crash can lose
///
/// See [`Acknowledgement`]: by default nothing acknowledged. With a memory
/// hot tier `complete` answers once the cold tier holds the record (group
/// commit keeps that cheap: the queue imports in batches). With a hot tier
/// that outlives the process (Redis) it answers once the hot tier holds
/// the record for its whole retention and has it on its list of handovers;
/// a process that opens the store later moves to the cold tier what a
/// crashed one left there. Claims in progress in a memory hot tier are
/// lost with the process (their redeliveries run again, as after a lease
/// expiry). Tokens never go back: the hot tier's floor is raised to the
/// cold tier's high-water mark when the store opens, and a memory hot
/// tier's tokens are reserved in the cold tier in blocks before they are
/// handed out.
///
/// # Cancel safety
///
/// - `begin`: a claim made in the hot tier whose caller left before the
///   cold check ends with its lease, as for any store; a record brought
///   back from the cold tier is imported in full or not at all.
/// - `complete`: runs to the end in a task of its own once started (the
///   hot tier's completion, its listing and its place in the write-behind
///   queue), so a caller that leaves cannot leave a completion the cold
///   tier never gets. A caller waiting for room in a full queue has
///   changed nothing.
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
    check: KeyCheck,
    cold_checks: ColdCheckCounts,
    clock: SharedClock,
    hot_retention: HotRetention,
    acknowledgement: Acknowledgement,
    /// Every completion goes to the cold tier, not only those the hot tier
    /// does not keep for their whole retention.
    all_to_cold: bool,
    /// The hot tier's list of handovers, when it keeps one.
    list: Option<String>,
    limits: Limits,
    behind: WriteBehind,
    tokens: TokenBlocks,
    /// The cold tier, held as this process's alone while a volatile hot
    /// tier is in front of it.
    _sole: Option<SoleFront>,
    /// Held while the store is open: the shared filter's upkeep ends with
    /// it.
    _open: Arc<()>,
}

/// Configures a [`TieredStore`].
pub struct TieredStoreBuilder<H, C> {
    hot: H,
    cold: C,
    filter: Option<Arc<KeyFilter>>,
    shared_filter: Option<FilterConfig>,
    clock: SharedClock,
    hot_retention: Duration,
    write_through: bool,
    ack_before_cold: bool,
    handover_list: String,
    write_behind: WriteBehindConfig,
}

impl<H: Tier + Clone, C: Tier + Clone> TieredStore<H, C> {
    /// Configures a store of `hot` in front of `cold`.
    pub fn builder(hot: H, cold: C) -> TieredStoreBuilder<H, C> {
        TieredStoreBuilder {
            hot,
            cold,
            filter: None,
            shared_filter: None,
            clock: Arc::new(SystemClock),
            hot_retention: DEFAULT_HOT_RETENTION,
            write_through: false,
            ack_before_cold: false,
            handover_list: "default".to_owned(),
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

    /// The key filter in this process's memory, if there is one.
    pub fn filter(&self) -> Option<&Arc<KeyFilter>> {
        match &self.shared.check {
            KeyCheck::Local(f) => Some(f),
            _ => None,
        }
    }

    /// The key filter the hot tier keeps for every process, if there is
    /// one, with the settings every process agreed on.
    pub fn shared_filter(&self) -> Option<&SharedFilter> {
        match &self.shared.check {
            KeyCheck::Shared(s) => Some(&s.filter),
            _ => None,
        }
    }

    /// How the keys the hot tier did not know were settled: looked up in
    /// the cold tier, or spared it by the filter.
    pub fn cold_checks(&self) -> ColdChecks {
        self.shared.cold_checks.get()
    }

    /// When `complete` answers, and so what a crash can lose.
    pub fn acknowledgement(&self) -> Acknowledgement {
        self.shared.acknowledgement
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

    /// [`flush`](Self::flush) for at most `limit`: a cold tier that is
    /// down would make it wait for ever. Returns the records still queued
    /// then (0: all in the cold tier); what becomes of them is
    /// [`acknowledgement`](Self::acknowledgement)'s to say.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn flush_within(&self, limit: Duration) -> u64 {
        let _ = tokio::time::timeout(limit, self.flush()).await;
        self.shared.behind.stats().pending
    }

    /// What the write-behind queue has done so far.
    pub fn write_behind(&self) -> WriteBehindStats {
        self.shared.behind.stats()
    }

    /// Whether the record of `item` goes to the cold tier.
    fn to_cold(&self, item: &CompleteItem) -> bool {
        self.shared.all_to_cold || !self.shared.hot_retention.covers(item.retention)
    }

    /// Completes `items`, queueing those the cold tier must hold.
    async fn complete_items(&self, items: Vec<CompleteItem>) -> Result<Vec<Fenced>, StoreError> {
        let moving = items.iter().filter(|i| self.to_cold(i)).count();
        if moving == 0 {
            let mut answers = self.complete_in_hot(&items).await?;
            self.retried_in_cold(&items, &mut answers).await?;
            return Ok(answers);
        }
        self.complete_behind(items, moving).await
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
    /// those `Stale` answers into `Ok`.
    async fn retried_in_cold(
        &self,
        items: &[CompleteItem],
        answers: &mut [Fenced],
    ) -> Result<(), StoreError> {
        for (n, item) in items.iter().enumerate() {
            if answers[n].is_stale()
                && let Some(Record::Completed(c)) = self.shared.cold.get(&item.key).await?
                && c.token == item.token
            {
                answers[n] = Fenced::Ok(());
            }
        }
        Ok(())
    }

    /// Completes `items` in the hot tier with their whole retention and
    /// queues the `moving` ones the cold tier must hold, in a task of its
    /// own so that a caller who leaves cannot cut it in half; answers as
    /// [`acknowledgement`](Self::acknowledgement) says.
    async fn complete_behind(
        &self,
        items: Vec<CompleteItem>,
        moving: usize,
    ) -> Result<Vec<Fenced>, StoreError> {
        if moving > self.shared.behind.capacity() {
            return Err(StoreError::unavailable(format!(
                "a batch of {moving} completions for the cold tier is larger than the write-behind queue ({}); raise its capacity or send smaller batches",
                self.shared.behind.capacity()
            )));
        }
        let mut places = self.shared.behind.reserve(moving).await?;
        let this = self.clone();
        let task = tokio::spawn(async move {
            let shared = &this.shared;
            let mut answers = this.complete_in_hot(&items).await?;
            let done: Vec<Handover> = items
                .iter()
                .zip(&answers)
                .filter(|(i, answer)| !answer.is_stale() && this.to_cold(i))
                .map(|(i, _)| Handover {
                    key: i.key.clone(),
                    token: i.token,
                })
                .collect();
            if let KeyCheck::Local(filter) = &shared.check {
                // Known before anyone hears of it, not only once moved: a
                // snapshot of the filter taken while the record waits in
                // the queue then holds its key, and a filter loaded from
                // it catches up from its time alone.
                for handover in &done {
                    filter.insert(&handover.key);
                }
            }
            let hot = &shared.hot;
            let mut records = Vec::with_capacity(done.len());
            for chunk in done.chunks(READS_AT_ONCE) {
                records.extend(join_all(chunk.iter().map(|h| hot.get(&h.key))).await);
            }
            if let Some(list) = &shared.list {
                // Listed before anyone hears of it: a crash from here on
                // leaves it for the next process to move.
                hot.list_handovers(list, &done).await?;
            }
            let waits = shared.acknowledgement == Acknowledgement::AfterCold;
            let mut reached = Vec::new();
            for (handover, record) in done.into_iter().zip(records) {
                let record = match record {
                    Ok(Some(Record::Completed(c))) if c.token == handover.token => Some(c),
                    _ => None,
                };
                let told = waits.then(|| {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    reached.push((handover.key.clone(), rx));
                    tx
                });
                let place = places.pop().expect("a place for each record moving");
                place.send(handover, record, told);
            }
            // Queued first: an error reading the cold tier leaves nothing
            // completed in the hot tier behind.
            this.retried_in_cold(&items, &mut answers).await?;
            Ok::<_, StoreError>((answers, reached))
        });
        let (answers, reached) = task
            .await
            .map_err(|e| StoreError::unavailable(format!("a completion task failed: {e}")))??;
        for (key, reached) in reached {
            if reached.await != Ok(true) {
                return Err(StoreError::unavailable(format!(
                    "the completion of {key} is in the hot tier but did not reach the cold tier (see the write-behind counters); a retry by its holder waits for it again"
                )));
            }
        }
        Ok(answers)
    }

    /// The answers to callers whose `items` the hot tier answered with
    /// `claims`: a claim stands unless the cold tier holds the key's
    /// completed record (asked unless the filter says the key is new), which
    /// is then brought back and answered. A claim whose caller will not
    /// hear of it (an error on the way) is given back, so a retry starts
    /// clean.
    async fn settle(
        &self,
        items: &[(&Key, Option<Fingerprint>)],
        claims: Vec<Begin>,
    ) -> Vec<Result<Begin, StoreError>> {
        let shared = &self.shared;
        let tokens: Vec<Option<FencingToken>> = claims
            .iter()
            .map(|c| match c {
                Begin::Acquired(c) => Some(c.token),
                _ => None,
            })
            .collect();
        let token = |i: usize| tokens[i].expect("only acquired claims are settled");
        let acquired: Vec<usize> = (0..claims.len()).filter(|&i| tokens[i].is_some()).collect();
        let mut answers: Vec<Result<Begin, StoreError>> = claims.into_iter().map(Ok).collect();
        let Some(highest) = tokens.iter().flatten().max().copied() else {
            return answers;
        };
        // Reserving past the highest reserves the others too.
        if let Err(e) = shared.tokens.issued(highest, &shared.cold).await {
            let why = e.to_string();
            for &i in &acquired {
                let _ = shared.hot.release(items[i].0, token(i)).await;
                answers[i] = Err(StoreError::unavailable(format!(
                    "reserving tokens in the cold tier failed: {why}"
                )));
            }
            return answers;
        }
        let keys: Vec<&Key> = acquired.iter().map(|&i| items[i].0).collect();
        let maybe = shared
            .check
            .may_be_cold(&shared.hot, &keys, &shared.cold_checks)
            .await;
        let asked: Vec<usize> = acquired
            .iter()
            .zip(maybe)
            .filter(|(_, maybe)| *maybe)
            .map(|(&i, _)| i)
            .collect();
        for chunk in asked.chunks(COLD_CHECKS_AT_ONCE) {
            let found = join_all(chunk.iter().map(|&i| {
                let (key, fingerprint) = items[i];
                self.cold_answer(key, fingerprint)
            }))
            .await;
            for (&i, found) in chunk.iter().zip(found) {
                match found {
                    Ok(Some(answer)) => answers[i] = Ok(answer),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = shared.hot.release(items[i].0, token(i)).await;
                        answers[i] = Err(e);
                    }
                }
            }
        }
        answers
    }

    /// The answer the cold tier's completed record of `key` gives, once
    /// brought back into the hot tier; `None` when it has none.
    async fn cold_answer(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Option<Begin>, StoreError> {
        match self.shared.cold.get(key).await? {
            Some(Record::Completed(old)) => self.bring_back(key, fingerprint, old).await.map(Some),
            _ => Ok(None),
        }
    }

    /// Imports a record found only in the cold tier into the hot tier (over
    /// the claim just made) and answers as the hot tier now would.
    async fn bring_back(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        old: Completed,
    ) -> Result<Begin, StoreError> {
        let until = self
            .shared
            .clock
            .now()
            .after(self.shared.hot_retention.get());
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
    /// A key filter in front of the cold tier, in this process's memory:
    /// for a hot tier only this process uses (memory). Its window must
    /// cover the longest retention the store accepts: the store's
    /// `max_retention` is cut to it.
    pub fn filter(mut self, filter: Arc<KeyFilter>) -> Self {
        self.filter = Some(filter);
        self
    }

    /// A key filter in front of the cold tier kept in the hot tier, shared
    /// by every process that uses it ([`Tier::SHARES_FILTER`]: Redis), so
    /// that none calls new a key another moved to the cold tier. Sized and
    /// seeded from `config` by the first process to open it; later ones use
    /// those settings (named by [`handover_list`](Self::handover_list)).
    /// While it is not ready (new, or lost with the hot tier's data), every
    /// new key is looked up in the cold tier, and one process rebuilds it.
    /// The store's `max_retention` is cut to its window, as for
    /// [`filter`](Self::filter). Costs one hot-tier round trip per batch of
    /// new keys.
    pub fn shared_filter(mut self, config: FilterConfig) -> Self {
        self.shared_filter = Some(config);
        self
    }

    /// The clock for the hot retention of records brought back from the
    /// cold tier (the tiers keep their own clocks for everything else).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How long the hot tier keeps a completed record once the cold tier
    /// has it (default 3 h, at least [`MIN_HOT_RETENTION`]). With a hot
    /// tier that outlives the process, a completion with a longer retention
    /// also goes to the cold tier; with a memory hot tier, every completion
    /// does.
    pub fn hot_retention(mut self, d: Duration) -> Self {
        self.hot_retention = d.max(MIN_HOT_RETENTION);
        self
    }

    /// Whether `complete` answers only once its record is in the cold tier
    /// (default `false`), whatever the hot tier: every completion then goes
    /// to the cold tier. A memory hot tier does this unless
    /// [`ack_before_cold`](Self::ack_before_cold) is set.
    pub fn write_through(mut self, on: bool) -> Self {
        self.write_through = on;
        self
    }

    /// With a memory hot tier, answers `complete` once the hot tier holds
    /// the record, before the cold tier does (default `false`). Faster for
    /// a lone caller, but a crash of the process loses every completion
    /// then on its way to the cold tier ([`WriteBehindStats::unprotected`]):
    /// a redelivery of such a key runs again. No effect with a hot tier
    /// that outlives the process, nor with
    /// [`write_through`](Self::write_through).
    pub fn ack_before_cold(mut self, on: bool) -> Self {
        self.ack_before_cold = on;
        self
    }

    /// The name of the hot tier's list of handovers (default `default`),
    /// for a hot tier that keeps one: one name per cold tier, so that
    /// stores sharing a Redis in front of different cold tiers never move
    /// each other's records.
    pub fn handover_list(mut self, name: impl Into<String>) -> Self {
        self.handover_list = name.into();
        self
    }

    /// How long a completion stays on the hot tier's list of handovers
    /// before any process that has the store open moves it (default 30 s):
    /// longer than a move takes, so a process that is alive is seldom
    /// helped, and short enough that what a crashed one left moves soon.
    pub fn handover_grace(mut self, d: Duration) -> Self {
        self.write_behind.grace = d;
        self
    }

    /// Whether this store moves what has been on the hot tier's list of
    /// handovers for longer than the grace (default `true`). An operator's
    /// short look at the store turns it off.
    pub fn sweep_handovers(mut self, on: bool) -> Self {
        self.write_behind.sweep = on;
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

    /// Opens the store: with a memory hot tier, holds the cold tier as this
    /// process's alone ([`Tier::hold_sole_front`]: a second process fails
    /// here, saying to use a hot tier the processes share); raises the hot
    /// tier's token floor to the cold
    /// tier's high-water mark and starts the write-behind queue (and, with
    /// a hot tier that keeps a list of handovers, the sweep that moves what
    /// earlier processes left on it). Needs a Tokio runtime.
    pub async fn open(self) -> Result<TieredStore<H, C>, StoreError> {
        // First: a second process must not so much as raise a floor.
        let sole = match H::VOLATILE {
            true => Some(self.cold.hold_sole_front().await?),
            false => None,
        };
        let tokens = TokenBlocks::open(&self.hot, &self.cold).await?;
        let mut limits = self.hot.limits().clone();
        let check = match (self.filter.clone(), &self.shared_filter) {
            (Some(_), Some(_)) => {
                return Err(StoreError::unavailable(
                    "a tiered store takes a filter in memory or a shared one, not both",
                ));
            }
            (Some(_), None) if H::SHARES_FILTER => {
                return Err(StoreError::unavailable(
                    "a filter in this process's memory cannot stand in front of a hot tier other processes share: a key another process moved to the cold tier would be called new here; give the store a shared filter (TieredStoreBuilder::shared_filter)",
                ));
            }
            (Some(f), None) => {
                let sizing = f.sizing();
                let kept = sizing.window * sizing.generations.saturating_sub(1);
                limits.max_retention = limits.max_retention.min(kept);
                KeyCheck::Local(f)
            }
            (None, Some(config)) => {
                let filter = self.agree_filter(config).await?;
                let kept = filter.window * filter.generations.saturating_sub(1);
                limits.max_retention = limits.max_retention.min(kept);
                KeyCheck::Shared(Arc::new(key_check::Shared::new(filter)))
            }
            (None, None) => KeyCheck::Off,
        };
        if !matches!(check, KeyCheck::Off) {
            self.check_cold_fits(limits.max_retention).await?;
        }
        let open = Arc::new(());
        if let KeyCheck::Shared(shared) = &check {
            let alive = Arc::downgrade(&open);
            tokio::spawn(key_check::keep_ready(
                shared.clone(),
                self.hot.clone(),
                self.cold.clone(),
                move || alive.strong_count() > 0,
            ));
        }
        let acknowledgement = if self.write_through || (H::VOLATILE && !self.ack_before_cold) {
            Acknowledgement::AfterCold
        } else if H::VOLATILE {
            Acknowledgement::BeforeColdUnprotected
        } else {
            Acknowledgement::AfterHot
        };
        let list = H::KEEPS_HANDOVERS.then_some(self.handover_list);
        let hot_retention = HotRetention(self.hot_retention);
        let behind = WriteBehind::start(
            Tiers {
                hot: self.hot.clone(),
                cold: self.cold.clone(),
                check: check.clone(),
                hot_retention,
                list: list.clone(),
            },
            self.write_behind,
            acknowledgement == Acknowledgement::BeforeColdUnprotected,
        );
        Ok(TieredStore {
            shared: Arc::new(Shared {
                hot: self.hot,
                cold: self.cold,
                check,
                cold_checks: ColdCheckCounts::default(),
                clock: self.clock,
                hot_retention,
                acknowledgement,
                all_to_cold: H::VOLATILE || self.write_through,
                list,
                limits,
                behind,
                tokens,
                _sole: sole,
                _open: open,
            }),
        })
    }
}

impl<H: Tier + Clone, C: Tier + Clone> TieredStoreBuilder<H, C> {
    /// Refuses a key filter that keeps keys for `kept` when the cold tier
    /// holds records longer from now (written while the filter was off or
    /// kept keys longer, or a store adopted as the cold tier): once the
    /// filter forgot such a key, it would be called new while the cold tier
    /// still holds it.
    async fn check_cold_fits(&self, kept: Duration) -> Result<(), StoreError> {
        let Some(latest) = self.cold.latest_expiry().await? else {
            return Ok(());
        };
        let now = self.clock.now();
        let needed = latest.since(now);
        if needed <= kept {
            return Ok(());
        }
        Err(StoreError::unavailable(format!(
            "the cold tier holds completed records until {} ms since the epoch, {} ms from now, \
             longer than the key filter keeps keys ({} ms): a key the filter forgot would be \
             called new while the cold tier still holds it. Make the filter keep keys at least \
             {} ms (--filter-retention-ms), or turn it off (--filter-items 0)",
            latest.as_millis(),
            needed.as_millis(),
            kept.as_millis(),
            needed.as_millis()
        )))
    }

    /// The shared filter `config` asks for, as the hot tier keeps it.
    async fn agree_filter(&self, config: &FilterConfig) -> Result<SharedFilter, StoreError> {
        if !H::SHARES_FILTER {
            return Err(StoreError::unavailable(
                "this hot tier keeps no shared key filter: give a memory hot tier a filter in memory (TieredStoreBuilder::filter), or use a Redis hot tier",
            ));
        }
        let sizing = config
            .sizing()
            .map_err(|e| StoreError::unavailable(format!("the shared key filter: {e}")))?;
        let proposed = SharedFilter {
            name: self.handover_list.clone(),
            seed: config.seed.secret(),
            bits: sizing.generation.bits,
            hashes: sizing.generation.hashes,
            window: sizing.window,
            generations: sizing.generations,
            epoch: key_check::random(),
        };
        let agreed = self.hot.agree_filter(&proposed).await?;
        let same_settings = SharedFilter {
            epoch: proposed.epoch,
            ..agreed.clone()
        } == proposed;
        if !same_settings {
            tracing::warn!(
                kept_bits = agreed.bits,
                kept_window_ms = agreed.window.as_millis() as u64,
                kept_generations = agreed.generations,
                "the shared key filter was first opened with other settings (or another seed); using those, as every process must"
            );
        }
        Ok(agreed)
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
        if !matches!(claim, Begin::Acquired(_)) {
            return Ok(claim);
        }
        let mut answers = self.settle(&[(key, fingerprint)], vec![claim]).await;
        answers.pop().expect("one answer per item")
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

    /// Reopens the completion in the tier that decides it: the cold tier
    /// for a record that goes there (its copy in the hot tier is reopened
    /// after it, so a `begin` in between still finds the hot copy and never
    /// brings the record back), the hot tier for one only the hot tier
    /// keeps. The completions queued for the cold tier are flushed first
    /// (for at most 10 s), so an import still on its way
    /// cannot bring the record back into the cold tier afterwards; a queue
    /// that does not drain in time is an error, and nothing is reopened.
    async fn reopen(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
        self.shared.limits.check_key(key)?;
        if tokio::time::timeout(REOPEN_FLUSH_LIMIT, self.flush())
            .await
            .is_err()
        {
            return Err(StoreError::unavailable(format!(
                "completions queued for the cold tier did not reach it within {}s, so key {key} \
                 cannot be reopened yet: check the cold tier, then try again",
                REOPEN_FLUSH_LIMIT.as_secs()
            )));
        }
        let completed = |r: Option<Record>| match r {
            Some(Record::Completed(c)) if c.token == token => Some(c),
            _ => None,
        };
        let record = match completed(self.shared.hot.get(key).await?) {
            Some(c) => c,
            None => match completed(self.shared.cold.get(key).await?) {
                Some(c) => c,
                None => return Ok(Fenced::Stale),
            },
        };
        if self.shared.all_to_cold || !self.shared.hot_retention.covers_record(&record) {
            let answer = self.shared.cold.reopen(key, token).await?;
            // The cold tier decided; the hot copy, if any, goes with it.
            let _ = self.shared.hot.reopen(key, token).await?;
            Ok(answer)
        } else {
            self.shared.hot.reopen(key, token).await
        }
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
    /// the cold tier also holds shows the cold tier's copy, with the whole
    /// retention; with the cold tier down, the hot tier's copy is answered
    /// (its retention may then show the hot tier's).
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        match self.shared.hot.get(key).await? {
            Some(Record::Completed(c)) if !self.shared.hot_retention.covers_record(&c) => {
                match self.shared.cold.get(key).await {
                    Ok(Some(Record::Completed(cold))) if cold.token == c.token => {
                        Ok(Some(Record::Completed(cold)))
                    }
                    Ok(_) => Ok(Some(Record::Completed(c))),
                    Err(e) => {
                        tracing::debug!(error = %e, %key, "the cold tier cannot answer; answering the hot tier's copy");
                        Ok(Some(Record::Completed(c)))
                    }
                }
            }
            Some(r) => Ok(Some(r)),
            None => match self.shared.cold.get(key).await? {
                Some(r @ Record::Completed(_)) => Ok(Some(r)),
                _ => Ok(None),
            },
        }
    }

    /// Claims in the hot tier, then asks the cold tier about the keys it
    /// acquired, a bounded number at a time. When one of those fails, every
    /// claim of the batch is given back (its caller gets no tokens) and
    /// the error answered.
    async fn begin_many(&self, items: &[BeginItem]) -> Result<Vec<Begin>, StoreError> {
        // The hot tier checks the batch against the same limits.
        let claims = self.shared.hot.begin_many(items).await?;
        let asked: Vec<(&Key, Option<Fingerprint>)> =
            items.iter().map(|i| (&i.key, i.fingerprint)).collect();
        let settled = self.settle(&asked, claims).await;
        if let Some(failed) = settled.iter().position(Result::is_err) {
            for (item, answer) in items.iter().zip(&settled) {
                if let Ok(Begin::Acquired(c)) = answer {
                    let _ = self.shared.hot.release(&item.key, c.token).await;
                }
            }
            return Err(settled
                .into_iter()
                .nth(failed)
                .and_then(Result::err)
                .expect("the failure found above"));
        }
        settled.into_iter().collect()
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
