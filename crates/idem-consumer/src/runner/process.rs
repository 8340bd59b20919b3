//! One message: from its `begin` answer to its broker action.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument as _;

use idem_core::{
    Begin, Claim, ClaimHandle, Fenced, Fingerprint, GuardError, Key, Raw, Record, Store, StoreError,
};
use tokio::time::Instant;

use super::Shared;
use super::tally::Settled;
use crate::copy::header_text;
use crate::dlq::{DEAD_LETTERED, REPLAYED_FROM_HEADER, is_dead_lettered};
use crate::{DeadLetter, Delivery, Handler, HandlerError, RetryReason, Source};

/// Busy retries wait at least this long, so an almost expired lease does not
/// make a hot loop.
const MIN_BUSY_DELAY: Duration = Duration::from_millis(100);

/// What to do with a message at the broker.
enum Action {
    Ack {
        duplicate: bool,
    },
    Retry {
        reason: RetryReason,
        delay: Duration,
    },
    /// Park the message; `remember`: the handler failed for good, so the
    /// key is recorded as dead-lettered once the dead letter is parked.
    DeadLetter {
        error: String,
        remember: bool,
    },
    Requeue,
    /// The handler cannot take messages now: pause, hold the message and
    /// run it again, no attempt counted.
    Pause(String),
}

impl Action {
    /// The action's name in a `settle` span.
    fn name(&self) -> &'static str {
        match self {
            Action::Ack { duplicate: false } => "ack",
            Action::Ack { duplicate: true } => "ack_duplicate",
            Action::Retry { .. } => "retry",
            Action::DeadLetter { .. } => "dead_letter",
            Action::Requeue => "requeue",
            Action::Pause(_) => "pause",
        }
    }
}

impl<S, Src, H> Shared<S, Src, H>
where
    S: Store + Clone,
    Src: Source,
    H: Handler,
{
    /// Decides and performs the broker action for a message whose key was
    /// begun with answer `begun` (the `begin` sent at `sent`).
    pub(super) async fn settle(
        &self,
        mut delivery: Delivery<Src::Receipt>,
        key: &Key,
        mut begun: Result<Begin, Arc<StoreError>>,
        mut sent: Instant,
    ) {
        let mut held = Held {
            since: sent,
            paused_lane: None,
        };
        loop {
            let action = self.decide(&delivery, key, begun, sent).await;
            // Its completion, if any, is queued or stored: the rest of its
            // fetched batch need not wait for this message any longer.
            super::gather::leave();
            let Some(delivery_again) = self.wait_in_place(delivery, key, action, &mut held).await
            else {
                break;
            };
            delivery = delivery_again;
            sent = Instant::now();
            begun = self
                .guard
                .store()
                .begin(
                    key,
                    self.fingerprint_of(&delivery),
                    self.guard.lease_length(),
                )
                .await
                .map_err(Arc::new);
        }
        held.resume(&self.source);
    }

    /// Whether `action` waits here (a retry in place, a busy key on a
    /// broker that counts retries, a paused handler) and gives the
    /// delivery back to run again (its attempt counted for a failure); every
    /// other action, a wait that would outlast what the broker allows, and a
    /// wait cut short by shutdown, is performed at the broker.
    async fn wait_in_place(
        &self,
        mut delivery: Delivery<Src::Receipt>,
        key: &Key,
        action: Action,
        held: &mut Held,
    ) -> Option<Delivery<Src::Receipt>> {
        let (reason, delay) = match action {
            Action::Retry { reason, delay }
                if self.retry_in_place
                    || (matches!(reason, RetryReason::Busy | RetryReason::Unavailable)
                        && self.capabilities.busy_retry_uses_attempt) =>
            {
                (reason, delay)
            }
            Action::Pause(why) => (RetryReason::Unavailable, self.pause(key, &why)),
            action => {
                self.perform(delivery, key, action).await;
                return None;
            }
        };
        if let Some(max) = self.capabilities.max_hold
            && held.since.elapsed() + delay > max
        {
            self.perform(delivery, key, Action::Retry { reason, delay })
                .await;
            return None;
        }
        tracing::debug!(%key, reason = reason.as_str(), ?delay, "retrying in place");
        self.count(Settled::retried(reason), Ok(()));
        if self.ordered
            && held.paused_lane.is_none()
            && let Some(lane) = &delivery.message.lane
        {
            self.source.pause_lane(lane);
            held.paused_lane = Some(lane.clone());
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = self.keep_alive(&delivery) => unreachable!("keep-alive never ends"),
            () = self.shutdown.cancelled() => {
                self.requeue(delivery).await;
                return None;
            }
        }
        if reason.counts_as_attempt() {
            delivery.message.attempt = delivery.message.attempt.max(1).saturating_add(1);
        }
        Some(delivery)
    }

    /// Pauses consumption after the handler said it cannot take messages;
    /// answers how long this message waits.
    fn pause(&self, key: &Key, why: &str) -> Duration {
        let now = Instant::now();
        let mut pause = self.pause.lock();
        let until = match pause.until {
            // Already paused: wait with the others.
            Some(until) if until > now => until,
            _ => {
                pause.times = pause.times.saturating_add(1);
                let until = now + self.backoff.delay(pause.times);
                pause.until = Some(until);
                tracing::error!(
                    %key,
                    error = %header_text(why),
                    pause = ?until - now,
                    "the handler cannot take messages; consumption paused"
                );
                until
            }
        };
        self.readiness.set(false);
        until - now
    }

    /// The handler's future, a panic turned into a transient failure (so
    /// the guard releases the claim and the message is retried, then
    /// dead-lettered after its last attempt).
    async fn caught(
        &self,
        work: impl Future<Output = Result<bytes::Bytes, HandlerError>>,
    ) -> Result<bytes::Bytes, HandlerError> {
        match AssertUnwindSafe(work).catch_unwind().await {
            Ok(r) => r,
            Err(panic) => {
                self.tally.panicked();
                let text = super::panic_text(panic.as_ref());
                Err(HandlerError::transient(format!(
                    "the handler panicked: {text}"
                )))
            }
        }
    }

    /// A call succeeded: consumption is no longer paused.
    fn unpause(&self) {
        if !self.readiness.is_ready() {
            *self.pause.lock() = super::Pause::default();
            self.readiness.set(true);
            tracing::info!("the handler takes messages again; consumption resumed");
        }
    }

    /// The broker action for a message whose key was begun with answer
    /// `begun`, running the handler when the claim was acquired.
    async fn decide(
        &self,
        delivery: &Delivery<Src::Receipt>,
        key: &Key,
        begun: Result<Begin, Arc<StoreError>>,
        sent: Instant,
    ) -> Action {
        let attempt = delivery.message.attempt.max(1);
        let replayed = delivery.message.header(REPLAYED_FROM_HEADER).is_some();
        let begun = match begun {
            Ok(Begin::Completed { outcome, .. })
                if replayed && is_dead_lettered(outcome.as_deref()) =>
            {
                self.reopen_dead_lettered(delivery, key).await
            }
            other => other,
        };
        match begun {
            // Reopened by another copy and parked again at once, or brought
            // back by a late import: the next delivery tries again.
            Ok(Begin::Completed { outcome, .. })
                if replayed && is_dead_lettered(outcome.as_deref()) =>
            {
                Action::Retry {
                    reason: RetryReason::Busy,
                    delay: self.backoff.delay(attempt),
                }
            }
            Ok(Begin::Completed { outcome, .. }) => {
                if is_dead_lettered(outcome.as_deref()) {
                    tracing::debug!(%key, "a copy of a dead-lettered message: acked, its dead letter stays parked");
                }
                Action::Ack { duplicate: true }
            }
            Ok(Begin::InProgress { retry_after }) => Action::Retry {
                reason: RetryReason::Busy,
                delay: retry_after.max(MIN_BUSY_DELAY) + retry_after.mul_f64(0.1 * fastrand::f64()),
            },
            Ok(Begin::Mismatch) => Action::DeadLetter {
                error: "fingerprint mismatch: this key was used before for a different body".into(),
                remember: false,
            },
            Ok(Begin::Acquired(claim)) if attempt > self.max_attempts => {
                self.release(key, &claim).await;
                self.exhausted(attempt)
            }
            Ok(Begin::Acquired(claim)) => self.handle(delivery, key, claim, sent).await,
            Err(e) if e.is_transient() && self.guard.fails_open() => {
                self.tally.fail_open.increment(1);
                self.handle_unguarded(delivery, key).await
            }
            Err(e) if e.is_transient() => Action::Retry {
                reason: RetryReason::Unavailable,
                delay: self.backoff.delay(attempt),
            },
            Err(e) => Action::DeadLetter {
                error: e.to_string(),
                remember: false,
            },
        }
    }

    /// A replayed dead letter whose key the runner recorded as
    /// dead-lettered: reopens that record (by its token, so never a later
    /// completion) and claims the key again; answers the new `begin`.
    async fn reopen_dead_lettered(
        &self,
        delivery: &Delivery<Src::Receipt>,
        key: &Key,
    ) -> Result<Begin, Arc<StoreError>> {
        let store = self.guard.store();
        if let Some(Record::Completed(c)) = store.get(key).await.map_err(Arc::new)?
            && is_dead_lettered(c.outcome.as_deref())
            && !store
                .reopen(key, c.token)
                .await
                .map_err(Arc::new)?
                .is_stale()
        {
            tracing::info!(%key, "a replayed dead letter reopened its key");
        }
        store
            .begin(
                key,
                self.fingerprint_of(delivery),
                self.guard.lease_length(),
            )
            .await
            .map_err(Arc::new)
    }

    /// Records `key` as dead-lettered (see [`DEAD_LETTERED`]) after its
    /// dead letter was parked: claims it and completes it with that
    /// outcome. A key held or settled meanwhile by another delivery is left
    /// to it; a failure is logged, and a later copy then runs again.
    async fn remember_dead_letter(&self, key: &Key, fingerprint: Option<Fingerprint>) {
        let store = self.guard.store();
        let claim = match store
            .begin(key, fingerprint, self.guard.lease_length())
            .await
        {
            Ok(Begin::Acquired(claim)) => claim,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(%key, error = %e, "recording the key as dead-lettered failed; a later copy of the message runs again");
                return;
            }
        };
        let outcome = Some(bytes::Bytes::from_static(DEAD_LETTERED));
        let stored = store
            .complete(key, claim.token, outcome, self.guard.retention_length())
            .await;
        if !matches!(stored, Ok(Fenced::Ok(()))) {
            tracing::warn!(%key, answer = ?stored, "recording the key as dead-lettered failed; a later copy of the message runs again");
            let _ = store.release(key, claim.token).await;
        }
    }

    /// Without claims ([`Runner::unguarded`](crate::Runner::unguarded)):
    /// runs the handler with no claim, and performs the broker action its
    /// result calls for.
    pub(super) async fn settle_unclaimed(&self, mut delivery: Delivery<Src::Receipt>, key: &Key) {
        let mut held = Held {
            since: Instant::now(),
            paused_lane: None,
        };
        loop {
            let action = self.decide_unclaimed(&delivery, key).await;
            match self.wait_in_place(delivery, key, action, &mut held).await {
                Some(again) => delivery = again,
                None => break,
            }
        }
        held.resume(&self.source);
    }

    /// The broker action for a message without claims, after running its
    /// handler.
    async fn decide_unclaimed(&self, delivery: &Delivery<Src::Receipt>, key: &Key) -> Action {
        let attempt = delivery.message.attempt.max(1);
        if attempt > self.max_attempts {
            self.exhausted(attempt)
        } else {
            let started = Instant::now();
            let work = self.caught(
                self.handler
                    .handle(with_key(&delivery.message, key), ClaimHandle::unclaimed()),
            );
            let outcome = tokio::select! {
                r = work => Some(r),
                () = self.keep_alive(delivery) => unreachable!("keep-alive never ends"),
                () = self.hard_stop.cancelled() => None,
            };
            self.tally
                .handler_seconds
                .record(started.elapsed().as_secs_f64());
            match outcome {
                // Dropped: the handler's transaction rolled back.
                None => Action::Requeue,
                Some(r) => self.action_after(r.map_err(GuardError::Handler), attempt),
            }
        }
    }

    /// A message delivered past the attempt limit: dead-lettered without
    /// running.
    fn exhausted(&self, attempt: u32) -> Action {
        Action::DeadLetter {
            error: format!(
                "delivered for attempt {attempt} without finishing; the limit is {} attempts",
                self.max_attempts
            ),
            remember: true,
        }
    }

    /// Runs the handler under the claim; renews the broker's redelivery
    /// timer while it works; at a hard stop, releases the claim and hands
    /// the message back.
    async fn handle(
        &self,
        delivery: &Delivery<Src::Receipt>,
        key: &Key,
        claim: Claim,
        sent: Instant,
    ) -> Action {
        let token = claim.token;
        let fingerprint = self.fingerprint_of(delivery);
        let started = Instant::now();
        // The handler's span: its namespace and attempt, and how it ended
        // (`ok`, `error` or `stopped`); never the key's or outcome's bytes.
        let span = tracing::debug_span!(
            "handler",
            namespace = %key.namespace(),
            attempt = delivery.message.attempt.max(1),
            outcome = tracing::field::Empty,
        );
        let work = self
            .guard
            .run_acquired(&Raw, key, fingerprint, claim, sent, |handle| {
                self.caught(
                    self.handler
                        .handle(with_key(&delivery.message, key), handle),
                )
            })
            .instrument(span.clone());
        let outcome = tokio::select! {
            r = work => Some(r),
            () = self.keep_alive(delivery) => unreachable!("keep-alive never ends"),
            () = self.hard_stop.cancelled() => None,
        };
        span.record(
            "outcome",
            match &outcome {
                Some(Ok(_)) => "ok",
                Some(Err(_)) => "error",
                None => "stopped",
            },
        );
        self.tally
            .handler_seconds
            .record(started.elapsed().as_secs_f64());
        match outcome {
            // The guard's own release was spawned when its future was
            // dropped; this one is awaited so the redelivery finds the key
            // free (whichever lands second answers `Stale`).
            None => {
                let _ = self.guard.store().release(key, token).await;
                Action::Requeue
            }
            Some(r) => self.action_after(r, delivery.message.attempt.max(1)),
        }
    }

    /// Fail open: the store is unreachable and the guard allows running
    /// unguarded (the guard counts it).
    async fn handle_unguarded(&self, delivery: &Delivery<Src::Receipt>, key: &Key) -> Action {
        let r = self
            .guard
            .run_with(
                &Raw,
                key,
                None,
                |handle| {
                    self.caught(
                        self.handler
                            .handle(with_key(&delivery.message, key), handle),
                    )
                },
                |_| async {},
            )
            .await;
        self.action_after(r, delivery.message.attempt.max(1))
    }

    fn action_after(
        &self,
        r: Result<bytes::Bytes, GuardError<HandlerError>>,
        attempt: u32,
    ) -> Action {
        match r {
            Ok(_) => {
                self.unpause();
                Action::Ack { duplicate: false }
            }
            Err(GuardError::Handler(e)) if e.is_pause() => Action::Pause(e.to_string()),
            Err(GuardError::Handler(e)) if e.is_permanent() => Action::DeadLetter {
                error: e.to_string(),
                remember: true,
            },
            Err(GuardError::Handler(e)) if attempt >= self.max_attempts => Action::DeadLetter {
                error: format!("{e} (attempt {attempt} of {})", self.max_attempts),
                remember: true,
            },
            Err(GuardError::Handler(e)) => Action::Retry {
                reason: RetryReason::Failed,
                delay: e
                    .requested_delay()
                    .unwrap_or_default()
                    .max(self.backoff.delay(attempt)),
            },
            // Another holder took the key over and will finish it.
            Err(GuardError::LeaseLost { .. }) => Action::Ack { duplicate: false },
            Err(GuardError::InProgress { retry_after }) => Action::Retry {
                reason: RetryReason::Busy,
                delay: retry_after.max(MIN_BUSY_DELAY),
            },
            // The outcome could not be stored: the claim expires and a
            // redelivery takes it over.
            Err(GuardError::Store(e)) if e.is_transient() => Action::Retry {
                reason: RetryReason::Unavailable,
                delay: self
                    .backoff
                    .delay(attempt)
                    .max(self.guard.lease_length().duration()),
            },
            Err(e) => Action::DeadLetter {
                error: e.to_string(),
                remember: false,
            },
        }
    }

    pub(super) async fn keep_alive(&self, delivery: &Delivery<Src::Receipt>) {
        let Some(every) = self.source.keep_alive_every() else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = self.source.keep_alive(&delivery.receipt).await {
                tracing::warn!(error = %e, "telling the broker the message is in progress failed");
            }
        }
    }

    async fn release(&self, key: &Key, claim: &Claim) {
        if let Err(e) = self.guard.store().release(key, claim.token).await {
            tracing::warn!(%key, error = %e, "release failed; the claim will expire");
        }
    }

    async fn perform(&self, delivery: Delivery<Src::Receipt>, key: &Key, action: Action) {
        // The broker settle's span: the namespace, what was done, and
        // whether the broker took it.
        let span = tracing::debug_span!(
            "settle",
            namespace = %key.namespace(),
            action = action.name(),
            result = tracing::field::Empty,
        );
        self.perform_in(delivery, key, action)
            .instrument(span)
            .await;
    }

    async fn perform_in(&self, delivery: Delivery<Src::Receipt>, key: &Key, action: Action) {
        let (settled, result) = match action {
            Action::Ack { duplicate } => {
                let settled = if duplicate {
                    Settled::Duplicate
                } else {
                    Settled::Handled
                };
                (settled, self.source.ack(delivery).await)
            }
            Action::Retry { reason, delay } => {
                tracing::debug!(%key, reason = reason.as_str(), ?delay, "retrying later");
                (
                    Settled::retried(reason),
                    self.source.retry(delivery, delay, reason).await,
                )
            }
            Action::DeadLetter {
                error: last_error,
                remember,
            } => {
                let why = DeadLetter {
                    key: Some(String::from_utf8_lossy(key.bytes()).into_owned()),
                    attempts: delivery.message.attempt.max(1),
                    last_error,
                };
                let fingerprint = self.fingerprint_of(&delivery);
                if self.dead_letter(delivery, why).await && remember && self.remembers_dead_letters
                {
                    self.remember_dead_letter(key, fingerprint).await;
                }
                return;
            }
            Action::Requeue => return self.requeue(delivery).await,
            // `wait_in_place` turns every pause into a wait or a retry.
            Action::Pause(_) => unreachable!("a pause never reaches the broker as such"),
        };
        self.count(settled, result);
    }

    /// Parks the message; answers whether the broker took the dead letter.
    pub(super) async fn dead_letter(
        &self,
        delivery: Delivery<Src::Receipt>,
        why: DeadLetter,
    ) -> bool {
        tracing::warn!(
            key = %header_text(why.key.as_deref().unwrap_or_default()),
            attempts = why.attempts,
            error = %header_text(&why.last_error),
            "dead-lettering a message"
        );
        let r = self.source.dead_letter(delivery, why).await;
        let parked = r.is_ok();
        self.count(Settled::DeadLettered, r);
        parked
    }

    pub(super) async fn requeue(&self, delivery: Delivery<Src::Receipt>) {
        let r = self.source.requeue(delivery).await;
        self.count(Settled::Requeued, r);
    }

    fn count(&self, settled: Settled, result: Result<(), crate::SourceError>) {
        tracing::Span::current().record("result", if result.is_ok() { "ok" } else { "failed" });
        self.tally.settled(settled, result.is_err());
        if let Err(e) = result {
            tracing::warn!(error = %e, ?settled, "settling a message failed; the broker will redeliver it");
        }
    }
}

/// How long a message has been held, and the lane it paused.
struct Held {
    since: Instant,
    paused_lane: Option<bytes::Bytes>,
}

impl Held {
    /// Lets the source hand out the paused lane's messages again.
    fn resume<Src: Source>(self, source: &Src) {
        if let Some(lane) = self.paused_lane {
            source.resume_lane(&lane);
        }
    }
}

/// The message as the handler gets it: with its key.
fn with_key(message: &crate::Message, key: &Key) -> crate::Message {
    let mut message = message.clone();
    message.key = Some(key.bytes().clone());
    message
}
