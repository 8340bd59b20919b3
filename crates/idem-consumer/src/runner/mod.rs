//! The runner: fetch, claim, handle, settle.

mod gather;
mod process;
mod tally;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use idem_core::{BeginItem, Fingerprint, Guard, InvalidInput, Key, MemoryStore, Namespace, Store};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::copy::header_text;
use crate::{Backoff, Capabilities, DeadLetter, Delivery, Handler, KeyFrom, Source};

/// Takes messages from a [`Source`], runs a [`Handler`] once per key under a
/// [`Guard`], and settles each message with the broker (see the crate docs
/// for the table of outcomes and actions).
///
/// - **Batched claims and completions**: each fetched batch is claimed with
///   one `begin_many`, and its messages' completions are stored with one
///   `complete_many` once every message of the batch has finished (or the
///   first finished one has waited
///   [`completion_linger`](Runner::completion_linger)); each message is
///   acked after its completion is stored.
/// - **Bounded concurrency**: at most [`concurrency`](Runner::concurrency)
///   messages are fetched or running at once (a key or lane whose messages
///   run one after another holds one place while it runs). Messages
///   waiting behind another of their group take no part of that room: they
///   have a budget of their own (four times the concurrency).
/// - **Duplicates in flight**: a message whose key is already being handled
///   by this runner waits for that one instead of being retried, then is
///   acked as a duplicate (or handled, if the first one failed).
/// - **Order**: with [`ordered`](Runner::ordered), messages of one lane
///   (partition, ordering key; the key where the broker gives none) are
///   handled one after another, in the order fetched. A retried message
///   comes back later, after the ones behind it, unless retries wait in
///   place ([`retry_in_place`](Runner::retry_in_place)).
/// - **Graceful shutdown**: when the token passed to [`run`](Runner::run) is
///   cancelled, fetching stops; handlers in flight get
///   [`shutdown_grace`](Runner::shutdown_grace) to finish and are settled;
///   the claims of those that did not finish are released and their
///   messages handed back, so a redelivery runs at once. Messages still
///   waiting behind another are handed back too.
///
/// - **Kept alive**: every delivery the runner holds (running, waiting to
///   retry in place, waiting behind its group) is kept alive at a broker
///   that redelivers after a timer ([`Source::keep_alive`]); a retry in
///   place that would outlast what the broker allows
///   ([`Capabilities::max_hold`]) goes to the broker instead. While a
///   message of an [`ordered`](Runner::ordered) lane waits in place, its
///   lane is paused at the source ([`Source::pause_lane`]), so other lanes
///   keep the runner's whole room.
/// - **Busy keys and store outages**: where a broker counts every retry
///   against a delivery limit of its own
///   ([`Capabilities::busy_retry_uses_attempt`]), a message whose key
///   another consumer holds, or whose store cannot be reached, waits in
///   place, kept alive, rather than using up that limit.
/// - **Misconfigured handler** ([`HandlerError::pause`](crate::HandlerError::pause)):
///   consumption pauses with backoff, the message waits without counting an
///   attempt, and [`Readiness`] reports not ready until a call succeeds.
/// - **Panics**: a handler that panics counts as a transient failure (its
///   claim released, the message retried, dead-lettered after the last
///   attempt); a panic anywhere in a message's task is logged and never
///   keeps its room, its key or its group from the messages behind it.
///
/// [`Runner::unguarded`] claims nothing: for handlers whose own database
/// transaction records the key (an inbox table beside the business data).
pub struct Runner<S, Src, H> {
    guard: Guard<S>,
    claims: bool,
    source: Src,
    handler: H,
    namespace: Option<Namespace>,
    key: KeyFrom,
    concurrency: usize,
    batch: Option<usize>,
    max_attempts: u32,
    backoff: Backoff,
    ordered: bool,
    retry_in_place: bool,
    fingerprint: bool,
    remember_dead_letters: bool,
    grace: Duration,
    linger: Duration,
    completion_linger: Duration,
    readiness: Readiness,
}

impl<S, Src, H> Runner<S, Src, H>
where
    S: Store + Clone,
    Src: Source,
    H: Handler,
{
    /// A runner with the defaults: keys from the message id, the source's
    /// name as namespace, 16 at a time, 16 attempts, unordered, 30 s grace.
    pub fn new(guard: Guard<S>, source: Src, handler: H) -> Self {
        Self {
            guard,
            claims: true,
            source,
            handler,
            namespace: None,
            key: KeyFrom::MessageId,
            concurrency: 16,
            batch: None,
            max_attempts: 16,
            backoff: Backoff::default(),
            ordered: false,
            retry_in_place: false,
            fingerprint: false,
            remember_dead_letters: true,
            grace: Duration::from_secs(30),
            linger: Duration::from_millis(1),
            completion_linger: DEFAULT_COMPLETION_LINGER,
            readiness: Readiness::default(),
        }
    }

    /// Whether the runner is taking messages: not ready while consumption
    /// is paused because the handler said it cannot take any
    /// ([`HandlerError::pause`](crate::HandlerError::pause)), until a call
    /// succeeds. For a readiness probe.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// The namespace keys live in (default: the source's name).
    ///
    /// Without claims ([`Runner::unguarded`]) the handler builds its keys
    /// itself; the runner uses this one to find copies in flight.
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Where each message's key comes from (default: its message id).
    pub fn key(mut self, key: KeyFrom) -> Self {
        self.key = key;
        self
    }

    /// Most messages held at once (default 16, at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Most messages fetched and claimed in one go (default: the
    /// concurrency).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = Some(n.max(1));
        self
    }

    /// Handler attempts before a message is dead-lettered (default 16),
    /// counted by the source across redeliveries and restarts.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The delays between attempts of a failing message.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Handle each lane's messages one after another (default: no).
    pub fn ordered(mut self, yes: bool) -> Self {
        self.ordered = yes;
        self
    }

    /// Wait out each retry here and run the message again, instead of
    /// handing it back to the broker (default: no). The message keeps its
    /// place: with [`ordered`](Runner::ordered), the messages of its lane
    /// wait behind it, so a failing message holds its lane (a Kafka
    /// partition) until it succeeds or is dead-lettered. Attempts are then
    /// counted by the runner: a restart starts again from the broker's
    /// count. At shutdown a waiting message is handed back.
    pub fn retry_in_place(mut self, yes: bool) -> Self {
        self.retry_in_place = yes;
        self
    }

    /// Fingerprint each body, so a key reused for different content is
    /// dead-lettered as a mismatch (default: no).
    pub fn fingerprint(mut self, yes: bool) -> Self {
        self.fingerprint = yes;
        self
    }

    /// Record the key of each message dead-lettered because its handler
    /// failed (for good, or on its last attempt) as dead-lettered (default:
    /// yes), with the outcome [`DEAD_LETTERED`](crate::dlq::DEAD_LETTERED)
    /// and the guard's retention: a later copy of the message is acked as a
    /// duplicate instead of running and being parked again, and its dead
    /// letter, replayed with `idem dlq replay`, reopens the key and runs.
    /// With `false`, the key is left free: every copy runs the handler
    /// again.
    pub fn remember_dead_letters(mut self, yes: bool) -> Self {
        self.remember_dead_letters = yes;
        self
    }

    /// Under load, how long to wait for half a batch of room before
    /// fetching (default 1 ms; zero fetches as soon as there is room for
    /// one). Larger batches mean fewer broker and store round trips.
    pub fn fetch_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// How long a finished message waits for the rest of its fetched batch
    /// before its completion is stored without them (default 1 ms; zero
    /// stores each completion on its own, as soon as its handler returns).
    ///
    /// The completions of a batch are stored with one `complete_many` when
    /// the batch's last message finishes, so a store across the network
    /// (Redis, SQL) takes one call a batch instead of one a message. A
    /// message is acked only once its completion is stored; a handler
    /// slower than the others delays their acks by at most this long.
    pub fn completion_linger(mut self, linger: Duration) -> Self {
        self.completion_linger = linger;
        self
    }

    /// How long handlers in flight may take to finish at shutdown (default
    /// 30 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Runs until `shutdown` is cancelled, then shuts down gracefully (see
    /// [`Runner`]) and reports what it did.
    ///
    /// Fetch failures are logged and retried with backoff: a broker that is
    /// away for a while only pauses the runner.
    ///
    /// # Cancel safety
    ///
    /// Cancel `shutdown` rather than dropping this future: dropping it stops
    /// fetching and leaves the spawned message tasks running to their end,
    /// but nobody waits for them.
    pub async fn run(self, shutdown: CancellationToken) -> Result<Report, RunError> {
        let namespace = match self.namespace {
            Some(ns) => ns,
            None => Namespace::new(self.source.name()).map_err(RunError::Namespace)?,
        };
        let batch = self
            .batch
            .unwrap_or(self.concurrency)
            .min(self.concurrency)
            .min(self.guard.store().limits().max_batch.max(1));
        let tally = tally::Tally::new(namespace.as_str());
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let capabilities = self.source.capabilities();
        let gather = (self.claims && !self.completion_linger.is_zero())
            .then(|| gather::flush_into(self.guard.store().clone()));
        let shared = Arc::new(Shared {
            guard: self
                .guard
                .with_store(gather::Gathered::new(self.guard.store().clone())),
            gather,
            completion_linger: self.completion_linger,
            claims: self.claims,
            source: self.source,
            handler: self.handler,
            namespace,
            key: self.key,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            ordered: self.ordered,
            retry_in_place: self.retry_in_place,
            fingerprint: self.fingerprint,
            remembers_dead_letters: self.claims && self.remember_dead_letters,
            groups: Mutex::new(HashMap::new()),
            shutdown: shutdown.clone(),
            hard_stop: CancellationToken::new(),
            tally,
            parked_room: Arc::new(Semaphore::new(self.concurrency.saturating_mul(4))),
            capabilities,
            pause: Mutex::new(Pause::default()),
            readiness: self.readiness,
        });
        let tracker = TaskTracker::new();
        let lag = tokio::spawn(watch_lag(shared.clone()));
        let fetch_backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            jitter: 0.5,
        };
        let mut fetch_failures = 0;
        loop {
            // The handler said it cannot take messages: fetch none until
            // the pause ends.
            let paused_until = shared.pause.lock().until;
            if let Some(until) = paused_until.filter(|u| *u > Instant::now()) {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep_until(until) => {}
                }
            }
            let first = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            let mut held = vec![first];
            take_free(&permits, &mut held, batch);
            // Under load permits come back one at a time; fetching each
            // alone would cost a broker round trip and a claim round trip
            // per message. Wait a moment for half a batch.
            if held.len() < batch / 2 && !self.linger.is_zero() {
                let until = Instant::now() + self.linger;
                while held.len() < batch / 2 {
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => break,
                        p = permits.clone().acquire_owned() => {
                            held.push(p.expect("the semaphore is never closed"));
                        }
                        () = tokio::time::sleep_until(until) => break,
                    }
                }
                take_free(&permits, &mut held, batch);
            }
            let fetched = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                r = shared.source.fetch(held.len()) => r,
            };
            match fetched {
                Ok(deliveries) => {
                    fetch_failures = 0;
                    let mut permits_for = Vec::with_capacity(deliveries.len());
                    for _ in 0..deliveries.len() {
                        match held.pop() {
                            Some(p) => permits_for.push(p),
                            // A source that gave more than asked: wait for room.
                            None => permits_for.push(
                                permits
                                    .clone()
                                    .acquire_owned()
                                    .await
                                    .expect("the semaphore is never closed"),
                            ),
                        }
                    }
                    shared.dispatch(deliveries, permits_for, &tracker).await;
                }
                Err(e) => {
                    fetch_failures += 1;
                    shared.tally.fetch_failed();
                    let pause = fetch_backoff.delay(fetch_failures);
                    tracing::warn!(error = %e, ?pause, "fetching messages failed; trying again");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        lag.abort();
        tracker.close();
        if tokio::time::timeout(self.grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace = ?self.grace,
                "handlers still running after the shutdown grace; releasing their claims"
            );
            shared.hard_stop.cancel();
            tracker.wait().await;
        }
        Ok(shared.tally.report())
    }
}

impl<Src, H> Runner<MemoryStore, Src, H>
where
    Src: Source,
    H: Handler,
{
    /// A runner that claims nothing: the handler's own transaction is the
    /// dedup. For handlers that record each message's key in the database
    /// of their effect, in the transaction that makes it (an inbox table),
    /// so that the effect and the record commit together or not at all;
    /// the key is in [`Message::key`](crate::Message::key).
    ///
    /// Each message goes straight to the handler, and is acked once the
    /// handler returns `Ok`. The rest is as with a guard: transient failures
    /// retried with backoff, dead letters after
    /// [`max_attempts`](Runner::max_attempts) and for permanent failures,
    /// copies of a key in flight in this runner waiting for each other,
    /// [`ordered`](Runner::ordered) lanes, the broker's keep-alive, and the
    /// graceful shutdown (a handler still running after the grace is
    /// dropped, which rolls its transaction back, and its message is handed
    /// back).
    ///
    /// What differs: nothing is stored, so a duplicate runs the handler,
    /// which finds its key recorded and returns `Ok` (the [`Report`] counts
    /// it as handled; only the handler knows it was a duplicate); the
    /// handler's claim handle has no fencing token and is never lost;
    /// [`fingerprint`](Runner::fingerprint) has nothing to compare with.
    /// The type's store parameter is a placeholder that is never used.
    pub fn unguarded(source: Src, handler: H) -> Self {
        let placeholder = MemoryStore::builder().sweep_interval(None).build();
        Self {
            claims: false,
            ..Self::new(Guard::new(placeholder), source, handler)
        }
    }
}

/// Deliveries taken out of a group's queue for a keep-alive round; put back
/// in front when the round ends or is dropped.
struct PutBack<'a, R> {
    groups: &'a Mutex<HashMap<Bytes, VecDeque<Parked<R>>>>,
    group: &'a Bytes,
    parked: VecDeque<Parked<R>>,
}

impl<R> Drop for PutBack<'_, R> {
    fn drop(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let mut groups = self.groups.lock();
        let waiting = groups
            .get_mut(self.group)
            .expect("a group with parked messages stays listed while its task runs");
        let newer = std::mem::replace(waiting, std::mem::take(&mut self.parked));
        waiting.extend(newer);
    }
}

/// The text of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// How long a finished message waits for the rest of its fetched batch
/// before its completion is stored without them.
const DEFAULT_COMPLETION_LINGER: Duration = Duration::from_millis(1);

/// How often the runner asks the broker for its lag.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Keeps `idem_consumer_lag{namespace}` at the source's lag, asked every
/// [`LAG_EVERY`], until the source says it cannot tell.
async fn watch_lag<S, Src, H>(shared: Arc<Shared<S, Src, H>>)
where
    S: Store + Clone,
    Src: Source,
    H: Handler,
{
    let gauge = metrics::gauge!("idem_consumer_lag", "namespace" => shared.namespace.to_string());
    tracing::debug!("watching the consumer's lag");
    loop {
        match shared.source.lag().await {
            Ok(Some(n)) => gauge.set(n as f64),
            Ok(None) => return,
            Err(e) => tracing::debug!(error = %e, "reading the consumer's lag failed"),
        }
        tokio::time::sleep(LAG_EVERY).await;
    }
}

/// Adds free permits to `held`, up to `batch`.
fn take_free(permits: &Arc<Semaphore>, held: &mut Vec<OwnedSemaphorePermit>, batch: usize) {
    while held.len() < batch {
        match permits.clone().try_acquire_owned() {
            Ok(p) => held.push(p),
            Err(_) => break,
        }
    }
}

/// What a run did, message by message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Handled and acked.
    pub handled: u64,
    /// Acked without running the handler: the key was completed before.
    pub duplicates: u64,
    /// Retried because another consumer held the key.
    pub retried_busy: u64,
    /// Retried after the handler failed.
    pub retried_failed: u64,
    /// Retried because the store could not be reached.
    pub retried_unavailable: u64,
    /// Dead-lettered.
    pub dead_lettered: u64,
    /// Handed back at shutdown.
    pub requeued: u64,
    /// Broker operations that failed (each message then comes back by
    /// redelivery).
    pub source_errors: u64,
    /// Fetches that failed.
    pub fetch_errors: u64,
    /// Panics caught in message tasks (a handler's count as a failed
    /// attempt too).
    pub panics: u64,
}

/// Why the runner could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The source's name is not a valid namespace: set one with
    /// [`Runner::namespace`].
    #[error("the source's name is not a valid namespace ({0}); set one explicitly")]
    Namespace(InvalidInput),
}

/// A message waiting for another of its group (same key, or same lane when
/// ordered) to finish. It holds a place in the parked budget, not in the
/// runner's concurrency.
struct Parked<R> {
    delivery: Delivery<R>,
    key: Key,
    room: OwnedSemaphorePermit,
}

/// Whether the runner is taking messages (see [`Runner::readiness`]).
#[derive(Clone, Debug)]
pub struct Readiness(Arc<AtomicBool>);

impl Default for Readiness {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl Readiness {
    /// False while consumption is paused for a handler that cannot take
    /// messages; true again once a call succeeds.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
}

/// Consumption paused because the handler cannot take messages.
#[derive(Default)]
struct Pause {
    /// Pauses in a row without a successful call since.
    times: u32,
    /// When fetching may start again.
    until: Option<Instant>,
}

struct Shared<S, Src: Source, H> {
    /// The runner's guard, its completions gathered per fetched batch.
    guard: Guard<gather::Gathered<S>>,
    /// Stores a fetched batch's completions (`None`: each on its own).
    gather: Option<gather::Flush>,
    completion_linger: Duration,
    /// Whether keys are claimed in the store (false: [`Runner::unguarded`]).
    claims: bool,
    source: Src,
    handler: H,
    namespace: Namespace,
    key: KeyFrom,
    max_attempts: u32,
    backoff: Backoff,
    ordered: bool,
    /// Retries wait in the runner ([`Runner::retry_in_place`]).
    retry_in_place: bool,
    fingerprint: bool,
    /// Whether a dead-lettered key is recorded as such
    /// ([`Runner::remember_dead_letters`]; never without claims).
    remembers_dead_letters: bool,
    /// Groups with a message being handled, and the messages waiting behind
    /// it.
    groups: Mutex<HashMap<Bytes, VecDeque<Parked<Src::Receipt>>>>,
    shutdown: CancellationToken,
    hard_stop: CancellationToken,
    tally: tally::Tally,
    /// Places for messages waiting behind their group.
    parked_room: Arc<Semaphore>,
    capabilities: Capabilities,
    pause: Mutex<Pause>,
    readiness: Readiness,
}

impl<S, Src, H> Shared<S, Src, H>
where
    S: Store + Clone,
    Src: Source,
    H: Handler,
{
    /// Claims the batch's messages that can start now in one `begin_many`
    /// and spawns a task for each; parks the others behind their group.
    async fn dispatch(
        self: &Arc<Self>,
        deliveries: Vec<Delivery<Src::Receipt>>,
        permits: Vec<OwnedSemaphorePermit>,
        tracker: &TaskTracker,
    ) {
        let mut starts = Vec::with_capacity(deliveries.len());
        for (delivery, permit) in deliveries.into_iter().zip(permits) {
            let key = match self.key_of(&delivery) {
                Ok(key) => key,
                Err(why) => {
                    let this = self.clone();
                    tracker.spawn(async move {
                        let attempts = delivery.message.attempt;
                        let why = DeadLetter {
                            key: None,
                            attempts,
                            last_error: why,
                        };
                        this.dead_letter(delivery, why).await;
                        drop(permit);
                    });
                    continue;
                }
            };
            let group = match (&delivery.message.lane, self.ordered) {
                (Some(lane), true) => lane.clone(),
                _ => key.bytes().clone(),
            };
            let mut item = Some((delivery, key));
            let mut room = None;
            loop {
                {
                    let mut groups = self.groups.lock();
                    match groups.get_mut(&group) {
                        None => {
                            groups.insert(group.clone(), VecDeque::new());
                            let (delivery, key) = item.take().expect("placed once");
                            starts.push((group, delivery, key, permit));
                            break;
                        }
                        // Behind a running message of its group: it waits
                        // in the parked budget and gives its place in the
                        // concurrency back.
                        Some(waiting) => {
                            if room.is_none() {
                                room = self.parked_room.clone().try_acquire_owned().ok();
                            }
                            if let Some(room) = room.take() {
                                let (delivery, key) = item.take().expect("placed once");
                                waiting.push_back(Parked {
                                    delivery,
                                    key,
                                    room,
                                });
                                drop(permit);
                                break;
                            }
                        }
                    }
                }
                // The parked budget is full: wait for a place, then look
                // again (the group may have finished meanwhile).
                room = Some(
                    self.parked_room
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed"),
                );
            }
        }
        if starts.is_empty() {
            return;
        }
        if !self.claims {
            for (group, delivery, key, permit) in starts {
                let this = self.clone();
                tracker.spawn(Box::pin(async move {
                    this.step(&group, this.settle_unclaimed(delivery, &key))
                        .await;
                    this.drain(group, permit).await;
                }));
            }
            return;
        }
        let items: Vec<BeginItem> = starts
            .iter()
            .map(|(_, delivery, key, _)| BeginItem {
                key: key.clone(),
                fingerprint: self.fingerprint_of(delivery),
                lease: self.guard.lease_length(),
            })
            .collect();
        let sent = Instant::now();
        let mut answers = match self.guard.store().begin_many(&items).await {
            Ok(answers) => answers.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) if e.is_transient() => {
                let e = Arc::new(e);
                items.iter().map(|_| Err(e.clone())).collect()
            }
            // Refused whole (a limit): claim one by one, so that only the
            // offending messages are refused.
            Err(_) => {
                let mut answers = Vec::with_capacity(items.len());
                for item in &items {
                    answers.push(
                        self.guard
                            .store()
                            .begin(&item.key, item.fingerprint, item.lease)
                            .await
                            .map_err(Arc::new),
                    );
                }
                answers
            }
        }
        .into_iter();
        let batch = self
            .gather
            .as_ref()
            .map(|flush| gather::Batch::new(flush.clone(), self.completion_linger, starts.len()));
        for (group, delivery, key, permit) in starts {
            let begun = answers.next().expect("one answer per item");
            let member = batch.as_ref().map(gather::Member::of);
            let this = self.clone();
            // Boxed: the task then moves a pointer, not the whole state
            // of a guarded handler.
            tracker.spawn(Box::pin(async move {
                let settle = this.settle(delivery, &key, begun, sent);
                this.step(&group, gather::within(member, settle)).await;
                this.drain(group, permit).await;
            }));
        }
    }

    /// Handles the messages parked behind `group`, one after another, then
    /// frees the group and its place in the concurrency (`permit`: a group
    /// holds one place while it runs, so its parked messages never wait
    /// for another).
    async fn drain(&self, group: Bytes, permit: OwnedSemaphorePermit) {
        loop {
            let next = {
                let mut groups = self.groups.lock();
                let waiting = groups.get_mut(&group).expect("a running group is listed");
                match waiting.pop_front() {
                    Some(parked) => parked,
                    None => {
                        groups.remove(&group);
                        drop(permit);
                        return;
                    }
                }
            };
            let Parked {
                delivery,
                key,
                room,
            } = next;
            drop(room);
            if self.shutdown.is_cancelled() {
                self.step(&group, self.requeue(delivery)).await;
            } else if !self.claims {
                self.step(&group, self.settle_unclaimed(delivery, &key))
                    .await;
            } else {
                let step = async {
                    let sent = Instant::now();
                    let begun = self
                        .guard
                        .store()
                        .begin(
                            &key,
                            self.fingerprint_of(&delivery),
                            self.guard.lease_length(),
                        )
                        .await
                        .map_err(Arc::new);
                    self.settle(delivery, &key, begun, sent).await;
                };
                self.step(&group, step).await;
            }
        }
    }

    /// Runs one message's step while the messages parked behind `group`
    /// are kept alive at the broker. A panic in the step is caught and
    /// logged: the message is left to the broker's redelivery, and the
    /// group goes on.
    async fn step(&self, group: &Bytes, step: impl Future<Output = ()>) {
        let step = AssertUnwindSafe(step).catch_unwind();
        let done = tokio::select! {
            r = step => r,
            () = self.keep_parked_alive(group) => unreachable!("keep-alive never ends"),
        };
        if let Err(panic) = done {
            self.tally.panicked();
            tracing::error!(
                panic = %header_text(&panic_text(panic.as_ref())),
                "a message's task panicked; the broker will redeliver the message"
            );
        }
    }

    /// Keeps the deliveries parked behind `group` alive at the broker,
    /// every [`Source::keep_alive_every`]; never ends. Dropping it between
    /// rounds or in one loses nothing: the deliveries taken out for a
    /// round go back in front of the queue.
    async fn keep_parked_alive(&self, group: &Bytes) {
        let Some(every) = self.source.keep_alive_every() else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(every).await;
            let taken = self
                .groups
                .lock()
                .get_mut(group)
                .map(std::mem::take)
                .unwrap_or_default();
            let taken = PutBack {
                groups: &self.groups,
                group,
                parked: taken,
            };
            for parked in &taken.parked {
                if let Err(e) = self.source.keep_alive(&parked.delivery.receipt).await {
                    tracing::warn!(error = %e, "telling the broker a waiting message is still held failed");
                }
            }
        }
    }

    fn key_of(&self, delivery: &Delivery<Src::Receipt>) -> Result<Key, String> {
        let bytes = self
            .key
            .extract(&delivery.message)
            .map_err(|e| e.to_string())?;
        let key = Key::in_namespace(self.namespace.clone(), bytes).map_err(|e| e.to_string())?;
        if !self.claims {
            // No store, no store limit: the handler's table has its own.
            return Ok(key);
        }
        self.guard
            .store()
            .limits()
            .check_key(&key)
            .map_err(|e| e.to_string())?;
        Ok(key)
    }

    fn fingerprint_of(&self, delivery: &Delivery<Src::Receipt>) -> Option<Fingerprint> {
        self.fingerprint
            .then(|| Fingerprint::xxh3(&delivery.message.body))
    }
}
