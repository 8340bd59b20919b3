//! The runner: fetch, claim, handle, settle.

mod process;
mod tally;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{BeginItem, Fingerprint, Guard, InvalidInput, Key, MemoryStore, Namespace, Store};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Backoff, DeadLetter, Delivery, Handler, KeyFrom, Source};

/// Takes messages from a [`Source`], runs a [`Handler`] once per key under a
/// [`Guard`], and settles each message with the broker (see the crate docs
/// for the table of outcomes and actions).
///
/// - **Batched claims**: each fetched batch is claimed with one
///   `begin_many`; completions go one by one as handlers finish (the Redis
///   and file stores group concurrent ones themselves).
/// - **Bounded concurrency**: at most [`concurrency`](Runner::concurrency)
///   messages are held at once, fetched or waiting or running.
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
    grace: Duration,
    linger: Duration,
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
            grace: Duration::from_secs(30),
            linger: Duration::from_millis(1),
        }
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

    /// Under load, how long to wait for half a batch of room before
    /// fetching (default 1 ms; zero fetches as soon as there is room for
    /// one). Larger batches mean fewer broker and store round trips.
    pub fn fetch_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
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
        let shared = Arc::new(Shared {
            guard: self.guard,
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
            groups: Mutex::new(HashMap::new()),
            shutdown: shutdown.clone(),
            hard_stop: CancellationToken::new(),
            tally,
        });
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let tracker = TaskTracker::new();
        let fetch_backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            jitter: 0.5,
        };
        let mut fetch_failures = 0;
        loop {
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
/// ordered) to finish.
struct Parked<R> {
    delivery: Delivery<R>,
    key: Key,
    permit: OwnedSemaphorePermit,
}

struct Shared<S, Src: Source, H> {
    guard: Guard<S>,
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
    /// Groups with a message being handled, and the messages waiting behind
    /// it.
    groups: Mutex<HashMap<Bytes, VecDeque<Parked<Src::Receipt>>>>,
    shutdown: CancellationToken,
    hard_stop: CancellationToken,
    tally: tally::Tally,
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
            let mut groups = self.groups.lock();
            match groups.get_mut(&group) {
                Some(waiting) => waiting.push_back(Parked {
                    delivery,
                    key,
                    permit,
                }),
                None => {
                    groups.insert(group.clone(), VecDeque::new());
                    starts.push((group, delivery, key, permit));
                }
            }
        }
        if starts.is_empty() {
            return;
        }
        if !self.claims {
            for (group, delivery, key, permit) in starts {
                let this = self.clone();
                tracker.spawn(Box::pin(async move {
                    this.settle_unclaimed(delivery, &key).await;
                    drop(permit);
                    this.drain(group).await;
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
        for (group, delivery, key, permit) in starts {
            let begun = answers.next().expect("one answer per item");
            let this = self.clone();
            // Boxed: the task then moves a pointer, not the whole state
            // of a guarded handler.
            tracker.spawn(Box::pin(async move {
                this.settle(delivery, &key, begun, sent).await;
                drop(permit);
                this.drain(group).await;
            }));
        }
    }

    /// Handles the messages parked behind `group`, one after another, then
    /// frees the group.
    async fn drain(&self, group: Bytes) {
        loop {
            let next = {
                let mut groups = self.groups.lock();
                let waiting = groups.get_mut(&group).expect("a running group is listed");
                match waiting.pop_front() {
                    Some(parked) => parked,
                    None => {
                        groups.remove(&group);
                        return;
                    }
                }
            };
            let Parked {
                delivery,
                key,
                permit,
            } = next;
            if self.shutdown.is_cancelled() {
                self.requeue(delivery).await;
            } else if !self.claims {
                self.settle_unclaimed(delivery, &key).await;
            } else {
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
            }
            drop(permit);
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
