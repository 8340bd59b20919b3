//! The guard: runs a handler at most once per key (docs/contract.md §3).

mod error;

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::error::{Disposition, GuardError};
use crate::{
    Begin, BoxError, Claim, Fenced, FencingToken, Fingerprint, Key, Lease, Record, Store,
    StoreError,
};

/// Runs handlers under a claim, so that however often a key is delivered its
/// handler's effect happens once and every duplicate gets the first outcome.
///
/// ```
/// use idem_core::{Guard, Key, Lease, MemoryStore};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let guard = Guard::new(MemoryStore::new()).lease(Lease::from_secs(30));
/// let key = Key::new("payments", "charge-42")?;
/// for _delivery in 0..3 {
///     let receipt: String = guard
///         .run(&key, None, |_claim| async { Ok::<_, std::io::Error>("charged 10 EUR".to_string()) })
///         .await?;
///     assert_eq!(receipt, "charged 10 EUR"); // the charge ran once
/// }
/// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
///
/// Steps:
/// 1. `begin`. `Completed` returns the stored outcome without running
///    anything; `InProgress` and `Mismatch` return errors.
/// 2. `Acquired` runs the handler. A watchdog extends the lease every third
///    of its length; if the lease is lost the handler's [`ClaimHandle`] says
///    so.
/// 3. `Ok(v)` stores `v` (as JSON) and returns it. A store that fails
///    meanwhile is retried, with growing pauses, while the watchdog keeps
///    the lease, up to the last known lease end: a blip of the store does
///    not run the handler again. `Err`, a panic, or the future being
///    dropped releases the claim so that a redelivery runs again (after the
///    compensation step, if one is given).
/// 4. A store that cannot be reached fails the call (fail closed), unless
///    [`fail_open`](Guard::fail_open) is set: then the handler runs unguarded
///    and `idem_guard_fail_open_total` counts it.
///
/// What no guard can fix: a handler with several external steps that crashes
/// between them runs the early steps again on redelivery. Use the fencing
/// token at the sink, idempotent downstream calls, or keep the claim and the
/// business write in one transaction.
#[derive(Clone, Debug)]
pub struct Guard<S> {
    store: S,
    lease: Lease,
    retention: Duration,
    fail_open: bool,
}

/// The handler's view of its claim.
#[derive(Clone, Debug)]
pub struct ClaimHandle {
    token: Option<FencingToken>,
    attempt: u32,
    lost: CancellationToken,
}

impl ClaimHandle {
    /// The handle of a handler that runs without a claim: no token,
    /// attempt 1, never lost. What the guard gives when it fails open, and
    /// what a runner that claims nothing gives (the handler's own
    /// transaction is then the dedup).
    pub fn unclaimed() -> Self {
        Self {
            token: None,
            attempt: 1,
            lost: CancellationToken::new(),
        }
    }

    /// The fencing token, to hand to a sink that checks it. `None` only when
    /// the handler runs without a claim ([`unclaimed`](Self::unclaimed)).
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// 1 on a first acquisition, more after takeovers of expired leases.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the lease is lost or about to be: a renewal was refused, or
    /// none succeeded while less than a third of the lease was left.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes when the lease is lost or about to be (see
    /// [`is_lost`](Self::is_lost)): `select!` on it to stop early, before
    /// anyone else can take the key over.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }
}

/// Why the compensation step runs.
#[derive(Debug)]
pub enum Failure<'a, E> {
    /// The handler returned this error.
    Error(&'a E),
    /// The handler panicked.
    Panicked,
}

impl<S: Store + Clone> Guard<S> {
    /// A guard with a 30 s lease, 24 h retention, failing closed.
    pub fn new(store: S) -> Self {
        Self {
            store,
            lease: Lease::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            fail_open: false,
        }
    }

    /// The lease each claim takes (renewed while the handler runs).
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// How long completed outcomes are kept.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Whether to run handlers unguarded when the store cannot be reached.
    pub fn fail_open(mut self, yes: bool) -> Self {
        self.fail_open = yes;
        self
    }

    /// The lease each claim takes.
    pub fn lease_length(&self) -> Lease {
        self.lease
    }

    /// How long completed outcomes are kept.
    pub fn retention_length(&self) -> Duration {
        self.retention
    }

    /// Whether handlers run unguarded when the store cannot be reached.
    pub fn fails_open(&self) -> bool {
        self.fail_open
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// A guard with the same lease, retention and failure mode around
    /// another store: this one wrapped in a layer, say.
    pub fn with_store<T: Store + Clone>(&self, store: T) -> Guard<T> {
        Guard {
            store,
            lease: self.lease,
            retention: self.retention,
            fail_open: self.fail_open,
        }
    }

    /// Runs `handler` once for `key`; see [`Guard`].
    pub async fn run<T, E, F, Fut>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
    {
        self.run_compensated(key, fingerprint, handler, |_| async {})
            .await
    }

    /// Like [`run`](Guard::run), and when the handler fails or panics, runs
    /// `compensate` (to undo partial work) before the claim is released.
    pub async fn run_compensated<T, E, F, Fut, C, CFut>(
        &self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
        compensate: C,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        C: FnOnce(Failure<'_, E>) -> CFut,
        CFut: Future<Output = ()>,
    {
        self.run_with(&Json, key, fingerprint, handler, compensate)
            .await
    }

    /// The general form: outcomes are stored with `codec` instead of JSON.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the claim is acquired leaves what a
    /// dropped [`Store::begin`] leaves (a claim nobody heard of ends with its
    /// lease). Dropping it later releases the claim (on a spawned task), so
    /// a redelivery runs at once; the compensation step does not run. That
    /// holds while the outcome is being stored, too: the retries stop, and
    /// a `complete` already sent either lands first (the release then
    /// answers `Stale` and the outcome stands) or after the release (it is
    /// then `Stale` and changes nothing). The same goes for
    /// [`run`](Guard::run) and [`run_compensated`](Guard::run_compensated).
    pub async fn run_with<T, E, F, Fut, C, CFut, K>(
        &self,
        codec: &K,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        handler: F,
        compensate: C,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        K: Codec<T>,
        C: FnOnce(Failure<'_, E>) -> CFut,
        CFut: Future<Output = ()>,
    {
        let sent = Instant::now();
        let begun = match self.store.begin(key, fingerprint, self.lease).await {
            Ok(b) => b,
            Err(e) if self.fail_open && e.is_transient() => {
                metrics::counter!("idem_guard_fail_open_total").increment(1);
                tracing::warn!(%key, error = %e, "store unreachable; running unguarded (fail open)");
                return handler(ClaimHandle::unclaimed())
                    .await
                    .map_err(GuardError::Handler);
            }
            Err(e) => return Err(GuardError::from_store(e)),
        };
        match begun {
            Begin::Completed { outcome, .. } => codec
                .decode(outcome.as_deref())
                .map_err(|e| GuardError::Outcome(e.into())),
            Begin::InProgress { retry_after } => Err(GuardError::InProgress { retry_after }),
            Begin::Mismatch => Err(GuardError::Mismatch),
            Begin::Acquired(claim) => {
                let lease_end = sent + self.lease.duration();
                self.hold(
                    codec,
                    key,
                    fingerprint,
                    claim,
                    lease_end,
                    handler,
                    compensate,
                )
                .await
            }
        }
    }

    /// Runs `handler` under a claim the caller has already acquired (for
    /// example one answer of a [`begin_many`](Store::begin_many)), as
    /// [`run_with`](Guard::run_with) runs it after its own `begin`: the
    /// watchdog renews the lease, `Ok` stores the outcome, `Err` or a panic
    /// releases the claim. `begun` is when the `begin` that acquired the
    /// claim was sent: the lease is reckoned from then. `fingerprint` is
    /// the one that `begin` was given (the guard needs it if the lease
    /// runs out before the outcome lands: see [`GuardError::LeaseLost`]).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases the claim (on a spawned task), so a
    /// redelivery runs at once, also while the outcome is being stored (the
    /// retries stop); an outcome already on its way to the store may still
    /// land first, as with [`Store::complete`], and then stands.
    pub async fn run_acquired<T, E, F, Fut, K>(
        &self,
        codec: &K,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        claim: Claim,
        begun: Instant,
        handler: F,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        K: Codec<T>,
    {
        let lease_end = begun + self.lease.duration();
        self.hold(
            codec,
            key,
            fingerprint,
            claim,
            lease_end,
            handler,
            |_| async {},
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn hold<T, E, F, Fut, C, CFut, K>(
        &self,
        codec: &K,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        claim: Claim,
        lease_end: Instant,
        handler: F,
        compensate: C,
    ) -> Result<T, GuardError<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        K: Codec<T>,
        C: FnOnce(Failure<'_, E>) -> CFut,
        CFut: Future<Output = ()>,
    {
        let mut held = ReleaseOnDrop {
            store: self.store.clone(),
            key: key.clone(),
            token: Some(claim.token),
        };
        let lost = CancellationToken::new();
        let handle = ClaimHandle {
            token: Some(claim.token),
            attempt: claim.attempt,
            lost: lost.clone(),
        };
        let lease_end = Mutex::new(lease_end);
        let work = AssertUnwindSafe(handler(handle)).catch_unwind();
        // Renews until the lease is lost or about to be: while the handler
        // runs, and on while its outcome is being stored.
        let renewals = self.renew(key, claim.token, &lease_end);
        tokio::pin!(work, renewals);
        let mut renewing = true;
        let result = tokio::select! {
            biased;
            r = &mut work => r,
            () = &mut renewals => {
                renewing = false;
                metrics::counter!("idem_guard_lease_lost_total").increment(1);
                tracing::warn!(%key, token = %claim.token, "lease lost (or about to be) while the handler runs");
                lost.cancel();
                work.await
            }
        };
        match result {
            Ok(Ok(value)) => {
                let outcome = match codec.encode(&value) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        held.release().await;
                        return Err(GuardError::Outcome(e.into()));
                    }
                };
                let storing = self.store_outcome(key, claim.token, outcome.clone(), &lease_end);
                tokio::pin!(storing);
                let stored = tokio::select! {
                    biased;
                    r = &mut storing => r,
                    // Renewals stopped: the retries end at the last known
                    // lease end, and a retry's answer settles the rest.
                    () = &mut renewals, if renewing => storing.await,
                };
                match stored {
                    Ok(Fenced::Ok(())) => {
                        held.disarm();
                        Ok(value)
                    }
                    Ok(Fenced::Stale) => {
                        held.disarm();
                        self.store_late(key, claim.token, fingerprint, outcome)
                            .await
                            .map(|()| value)
                    }
                    // Refused outcome: release so the key is not stuck.
                    Err(e @ (GuardError::Invalid(_) | GuardError::Outcome(_))) => {
                        held.release().await;
                        Err(e)
                    }
                    // The store failed for leases past the lease's end: the claim
                    // expires by itself.
                    Err(e) => {
                        held.disarm();
                        Err(e)
                    }
                }
            }
            Ok(Err(e)) => {
                compensate(Failure::Error(&e)).await;
                held.release().await;
                Err(GuardError::Handler(e))
            }
            Err(panic) => {
                compensate(Failure::Panicked).await;
                held.release().await;
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Stores `outcome` after the `complete` of `token` was refused as
    /// stale: the lease ran out before the outcome landed (renewals could
    /// not reach the store in time). If no one has taken the key over
    /// since, the guard takes it over itself with a `begin` (atomic: it
    /// never holds the key beside another holder) and stores the outcome
    /// under the new claim, so work that was done once is recorded as done
    /// and a redelivery does not run it again. A key another holder has
    /// taken over, or completed, is [`GuardError::LeaseLost`]: that holder
    /// finishes it. A store that cannot answer is a transient error: the
    /// message is delivered again later.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the new claim is taken releases it (on a
    /// spawned task), as dropping [`run_with`](Guard::run_with) does.
    async fn store_late<E>(
        &self,
        key: &Key,
        token: FencingToken,
        fingerprint: Option<Fingerprint>,
        outcome: Bytes,
    ) -> Result<(), GuardError<E>> {
        let unavailable = |e: StoreError| match e {
            e if e.is_transient() => GuardError::Store(e),
            e => GuardError::Store(StoreError::unavailable(e)),
        };
        match self.store.get(key).await.map_err(unavailable)? {
            // Expired under this token (or gone with its lease): no one
            // has it.
            None => {}
            Some(Record::InProgress(r)) if r.token == token => {}
            Some(_) => return Err(GuardError::LeaseLost { outcome }),
        }
        let claim = match self
            .store
            .begin(key, fingerprint, self.lease)
            .await
            .map_err(unavailable)?
        {
            Begin::Acquired(claim) => claim,
            _ => return Err(GuardError::LeaseLost { outcome }),
        };
        let mut held = ReleaseOnDrop {
            store: self.store.clone(),
            key: key.clone(),
            token: Some(claim.token),
        };
        match self
            .store
            .complete(key, claim.token, Some(outcome.clone()), self.retention)
            .await
        {
            Ok(Fenced::Ok(())) => {
                held.disarm();
                metrics::counter!("idem_guard_stored_late_total").increment(1);
                tracing::warn!(%key, stale = %token, token = %claim.token, "the lease ran out before the outcome was stored; no one had taken the key over, so it was claimed again and the outcome stored");
                Ok(())
            }
            Ok(Fenced::Stale) => {
                held.disarm();
                Err(GuardError::LeaseLost { outcome })
            }
            Err(e) => {
                held.release().await;
                Err(unavailable(e))
            }
        }
    }

    /// Stores the outcome. A transient failure is retried after a pause
    /// that doubles from 10 ms up to 1 s (each cut by up to half at random,
    /// so that holders failing together do not retry in step, and cut to
    /// end just before the deadline, so the last retry is not skipped), as
    /// long as the retry comes within [`LATE_STORE_LEASES`] leases of the
    /// earlier of the last known lease end (renewals push it out) and one
    /// lease after the first try (a store that renews but never stores does
    /// not hold the message forever). Retrying is safe: a `complete` by the
    /// same token answers `Ok` again once one has landed, and one that
    /// comes after the lease's end is refused as stale, which
    /// [`store_late`](Self::store_late) settles by what the store holds.
    async fn store_outcome<E>(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Bytes,
        lease_end: &Mutex<Instant>,
    ) -> Result<Fenced, GuardError<E>> {
        self.store
            .limits()
            .check_outcome(Some(&outcome))
            .map_err(GuardError::Invalid)?;
        let lease = self.lease.duration();
        let give_up_by = Instant::now() + lease;
        let mut pause = FIRST_COMPLETE_PAUSE;
        loop {
            match self
                .store
                .complete(key, token, Some(outcome.clone()), self.retention)
                .await
            {
                Err(e) if e.is_transient() => {
                    let deadline = (*lease_end.lock()).min(give_up_by) + lease * LATE_STORE_LEASES;
                    // The last retry comes just before the deadline rather
                    // than not at all; the timer may fire up to its
                    // resolution late.
                    let left =
                        deadline.saturating_duration_since(Instant::now() + TIMER_RESOLUTION);
                    let wait = jittered(pause).min(left);
                    if wait.is_zero() {
                        tracing::warn!(%key, error = %e, "storing the outcome failed for longer than the lease allows; giving up");
                        return Err(GuardError::from_store(e));
                    }
                    tracing::warn!(%key, error = %e, ?wait, "storing the outcome failed; retrying");
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(MAX_COMPLETE_PAUSE);
                }
                r => return r.map_err(GuardError::from_store),
            }
        }
    }

    /// Extends the lease every third of its length, keeping `lease_end`
    /// up to date, and returns when a renewal is refused, or when less than
    /// a third of the lease is left and no renewal has succeeded: the
    /// handler hears of it before anyone can take the key over.
    ///
    /// The lease is reckoned from when each renewal was *sent*: the store
    /// cannot have started it earlier, so the local reckoning ends no later
    /// than the store's, whatever the round trip took. (The expiry `extend`
    /// returns is on the store's clock, which the guard does not read.)
    async fn renew(&self, key: &Key, token: FencingToken, lease_end: &Mutex<Instant>) {
        let lease = self.lease.duration();
        let period = (lease / 3).max(Duration::from_millis(1));
        let mut next = Instant::now() + period;
        loop {
            let end = *lease_end.lock();
            let warn_at = end.checked_sub(lease / 3).unwrap_or(end);
            tokio::time::sleep_until(next.min(warn_at)).await;
            if Instant::now() >= warn_at {
                return;
            }
            let sent = Instant::now();
            let renewal = self.store.extend(key, token, self.lease);
            match tokio::time::timeout_at(warn_at, renewal).await {
                Ok(Ok(Fenced::Ok(_))) => {
                    *lease_end.lock() = sent + lease;
                    next = sent + period;
                }
                Ok(Ok(Fenced::Stale)) => return,
                Ok(Err(e)) => {
                    tracing::warn!(%key, error = %e, "lease renewal failed; retrying");
                    next = Instant::now() + period / 4;
                }
                // No answer before the warning point.
                Err(_) => return,
            }
        }
    }
}

/// How many leases past the lease's end a failed `complete` is still
/// retried. Work that was done is worth more than a prompt redelivery: a
/// store down for a little longer than the lease (a database restarting)
/// gets the outcome when it is back, under a new claim if no one took the
/// key over meanwhile, rather than the message being handed back to run
/// the effect again. Past this the message is handed back (retry later).
const LATE_STORE_LEASES: u32 = 2;

/// How late tokio's timer may wake a sleep (it counts whole milliseconds).
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// The first pause before a failed `complete` is retried; each next one
/// doubles, up to [`MAX_COMPLETE_PAUSE`].
const FIRST_COMPLETE_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause between retries of a failed `complete`: a store back
/// from an outage gets the outcome within a second.
const MAX_COMPLETE_PAUSE: Duration = Duration::from_secs(1);

/// `pause` cut by up to half, at random.
fn jittered(pause: Duration) -> Duration {
    let half = pause / 2;
    let random = RandomState::new().hash_one(Instant::now());
    half + Duration::from_nanos(random % half.as_nanos().max(1) as u64)
}

/// How the guard turns a handler's value into stored bytes and back.
pub trait Codec<T> {
    /// Why a value could not be encoded or decoded.
    type Error: Into<BoxError>;
    /// The bytes to store for `value`.
    fn encode(&self, value: &T) -> Result<Bytes, Self::Error>;
    /// The value a duplicate gets back; `None` when no outcome was stored.
    fn decode(&self, stored: Option<&[u8]>) -> Result<T, Self::Error>;
}

/// Outcomes as JSON (serde): what [`Guard::run`] uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    type Error = serde_json::Error;
    fn encode(&self, value: &T) -> Result<Bytes, serde_json::Error> {
        serde_json::to_vec(value).map(Bytes::from)
    }
    fn decode(&self, stored: Option<&[u8]>) -> Result<T, serde_json::Error> {
        serde_json::from_slice(stored.unwrap_or(b"null"))
    }
}

/// Outcomes stored as the handler's bytes, unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl Codec<Bytes> for Raw {
    type Error = std::convert::Infallible;
    fn encode(&self, value: &Bytes) -> Result<Bytes, Self::Error> {
        Ok(value.clone())
    }
    fn decode(&self, stored: Option<&[u8]>) -> Result<Bytes, Self::Error> {
        Ok(stored.map(Bytes::copy_from_slice).unwrap_or_default())
    }
}

/// Releases the claim unless disarmed: when the handler fails, and when the
/// guard's future is dropped mid-run (the release is then spawned).
struct ReleaseOnDrop<S: Store + Clone> {
    store: S,
    key: Key,
    token: Option<FencingToken>,
}

impl<S: Store + Clone> ReleaseOnDrop<S> {
    fn disarm(&mut self) {
        self.token = None;
    }

    async fn release(&mut self) {
        if let Some(token) = self.token.take()
            && let Err(e) = self.store.release(&self.key, token).await
        {
            tracing::warn!(key = %self.key, error = %e, "release failed; the claim will expire");
        }
    }
}

impl<S: Store + Clone> Drop for ReleaseOnDrop<S> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let store = self.store.clone();
                let key = self.key.clone();
                runtime.spawn(async move {
                    if let Err(e) = store.release(&key, token).await {
                        tracing::warn!(%key, error = %e, "release failed; the claim will expire");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(key = %self.key, "dropped outside a runtime; the claim will expire")
            }
        }
    }
}
