//! The distributed lock; see [`Lock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{FencingToken, Fingerprint, InvalidInput, Lease, StoreError};
use redis::{Script, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::layout::{lock_key, millis};
use crate::reply::{corrupt, number, unavailable};
use crate::store::Inner;

mod waiter;

/// The lock's scripts (in `scripts/`).
pub(crate) struct Scripts {
    acquire: Script,
    release: Script,
    renew: Script,
    leave: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: Script::new(concat!(
                include_str!("../scripts/time.lua"),
                include_str!("scripts/acquire.lua")
            )),
            release: Script::new(include_str!("scripts/release.lua")),
            renew: Script::new(include_str!("scripts/renew.lua")),
            leave: Script::new(include_str!("scripts/leave.lua")),
        }
    }
}

/// The longest a waiter's place in line holds without a look.
const MAX_HOLD: Duration = Duration::from_secs(3600);

/// How often a waiter looks again when no wake-up came.
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// A named distributed lock on Redis, usable without the rest of idem: what
/// teams expect from a Redisson-style lock.
///
/// - `SET NX PX` with a random owner value; release and renewal by
///   compare-and-act scripts only, so no one deletes another owner's lock.
/// - A **watchdog** renews the lease every third of its length while the
///   guard lives and tells the holder ([`LockGuard::lost`]) when a renewal
///   is refused, or when less than a third of the lease is left without a
///   renewal getting through: before the lease can run out, not after.
/// - A **fencing token** per acquisition, increasing per lock name (same
///   rule as the store's tokens: last plus one, at least `TIME × 1024`).
/// - **Fair waiting without busy polling**: waiters line up in a Redis list;
///   a release wakes the first in line (its own wake list, `BLPOP`), and
///   newcomers cannot jump the queue. A waiter that gives up, or whose
///   call is dropped, leaves the line at once (and wakes the next when the
///   lock is free); one that dies leaves it within a few seconds, as its
///   place holds only until its next look. A bounded fallback poll (every
///   second) covers lost wake-ups, and waiting when the node cannot be
///   reached. On Redis
///   Cluster a waiter blocks on the master that serves the lock's slot.
///
/// ```no_run
/// # async fn run(store: idem_redis::RedisStore) -> Result<(), idem_core::StoreError> {
/// use std::time::Duration;
/// let lock = store.lock("nightly-report").lease(Duration::from_secs(10));
/// if let Some(guard) = lock.try_lock(Duration::from_secs(5)).await? {
///     // ... work, passing guard.token() to a sink that checks it ...
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: Arc<Inner>,
    name: String,
    lease: Duration,
}

impl Lock {
    pub(crate) fn new(inner: Arc<Inner>, name: &str) -> Self {
        Self {
            inner,
            name: name.to_owned(),
            lease: Duration::from_secs(30),
        }
    }

    /// The lease each acquisition takes, renewed by the watchdog (default
    /// 30 s). A holder that dies loses the lock within one lease. Leases
    /// under 3 ms are raised to 3 ms; one over the store's `max_lease` makes
    /// [`try_lock`](Self::try_lock) refuse.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(3));
        self
    }

    /// The name and the lease within the store's limits.
    fn check(&self) -> Result<(), InvalidInput> {
        let limits = &self.inner.limits;
        let len = self.name.len();
        if len == 0 {
            return Err(InvalidInput::EmptyKey);
        }
        if len > limits.max_key_bytes {
            return Err(InvalidInput::KeyTooLong {
                len,
                limit: limits.max_key_bytes,
            });
        }
        limits.check_lease(Lease::new(self.lease))
    }

    fn key(&self, suffix: &str) -> String {
        lock_key(&self.name, suffix)
    }

    /// Takes the lock, waiting up to `wait` in line; `None` if it stayed
    /// taken. `Duration::MAX` (or any wait past what the clock can count)
    /// waits for as long as it takes. Refuses, touching nothing, a name that
    /// is empty or longer than the store's `max_key_bytes`, and a lease over
    /// its `max_lease`.
    ///
    /// A waiter's place in line holds for the next fallback poll plus two
    /// call timeouts and a second; each look at the lock renews it. So a
    /// waiter that died holds up the line for a few seconds at most, however
    /// long it meant to wait.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a call dropped while waiting (or failing) leaves the
    /// line at once, in the background, and wakes the next in line if the
    /// lock is free; if its last look had taken the lock unheard, it lets
    /// the lock go. Nobody is held up by a waiter that is gone.
    pub async fn try_lock(&self, wait: Duration) -> Result<Option<LockGuard>, StoreError> {
        self.check()?;
        let deadline = Instant::now().checked_add(wait);
        let mut place = Place {
            lock: self,
            me: owner_id(),
        };
        let wake_key = format!("{}{}", self.key(":w:"), place.me);
        let mut waiting = None;
        loop {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            let nap = left.min(FALLBACK_POLL);
            // Capped, as a call timeout of years would make it.
            let hold = nap
                .saturating_add(self.inner.timeout.saturating_mul(2))
                .saturating_add(Duration::from_secs(1))
                .min(MAX_HOLD);
            let sent = Instant::now();
            let reply: Value = self
                .inner
                .lock_scripts
                .acquire
                .key(self.key(""))
                .key(self.key(":t"))
                .key(self.key(":q"))
                .key(self.key(":qd"))
                .arg(&place.me)
                .arg(millis(self.lease))
                .arg(millis(hold))
                .invoke_async(&mut self.inner.conn())
                .await
                .map_err(unavailable)?;
            let Value::Array(parts) = &reply else {
                return Err(corrupt("lock acquire", &reply));
            };
            if parts.first().and_then(number) == Some(1) {
                let token = parts
                    .get(1)
                    .and_then(number)
                    .ok_or_else(|| corrupt("lock token", &reply))?;
                let me = place.taken();
                return Ok(Some(LockGuard::start(
                    self.clone(),
                    me,
                    FencingToken::new(token),
                    sent,
                )));
            }
            if left.is_zero() {
                self.leave(&place.me).await?;
                place.taken();
                return Ok(None);
            }
            if waiting.is_none() {
                waiting = self
                    .inner
                    .blocking_connection(self.key("").as_bytes())
                    .await;
            }
            let woken = match waiting.as_mut() {
                // Blocks only this waiter's own connection.
                Some(conn) => redis::cmd("BLPOP")
                    .arg(&wake_key)
                    .arg(nap.as_secs_f64().max(0.01))
                    .query_async::<Option<(String, String)>>(conn)
                    .await
                    .is_ok(),
                None => false,
            };
            if !woken {
                // No node to block on, or it failed (down, or the slot
                // moved): look again after the fallback pause, and connect
                // anew next time.
                waiting = None;
                tokio::time::sleep(nap).await;
            }
        }
    }

    /// Leaves the line as waiter `me`, and lets go of the lock if a call of
    /// `me`'s whose answer nobody heard took it; wakes the next in line when
    /// the lock is free.
    async fn leave(&self, me: &str) -> Result<(), StoreError> {
        let _: Value = self
            .inner
            .lock_scripts
            .leave
            .key(self.key(""))
            .key(self.key(":q"))
            .key(self.key(":qd"))
            .key(self.key(":w:"))
            .arg(me)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn release_as(&self, me: &str) -> Result<bool, StoreError> {
        let v: Value = self
            .inner
            .lock_scripts
            .release
            .key(self.key(""))
            .key(self.key(":q"))
            .key(self.key(":w:"))
            .arg(me)
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        Ok(number(&v) == Some(1))
    }

    /// Renews the lease as `me`: how long it now runs, as Redis counts it;
    /// `None` when `me` no longer owns the lock.
    async fn renew_as(&self, me: &str) -> Result<Option<Duration>, StoreError> {
        let v: Value = self
            .inner
            .lock_scripts
            .renew
            .key(self.key(""))
            .arg(me)
            .arg(millis(self.lease))
            .invoke_async(&mut self.inner.conn())
            .await
            .map_err(unavailable)?;
        match number(&v) {
            Some(0) => Ok(None),
            Some(ms) => Ok(Some(Duration::from_millis(ms))),
            None => Err(corrupt("lock renewal", &v)),
        }
    }
}

/// A waiter's place in line while [`Lock::try_lock`] runs. Dropped before
/// the call settled (its future dropped, or an error), it leaves the line
/// in the background, so a waiter that is gone never holds up the ones
/// behind it.
struct Place<'a> {
    lock: &'a Lock,
    /// The waiter's id; empty once the call settled.
    me: String,
}

impl Place<'_> {
    /// The call settled: nothing to undo. Returns the waiter's id.
    fn taken(&mut self) -> String {
        std::mem::take(&mut self.me)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.me.is_empty() {
            return;
        }
        let (lock, me) = (self.lock.clone(), self.taken());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = lock.leave(&me).await {
                    tracing::warn!(lock = %lock.name, error = %e, "a waiter that left stays in line until its place runs out");
                }
            });
        }
    }
}

/// A held lock. Dropping it stops the watchdog and releases the lock in the
/// background; [`release`](LockGuard::release) does so and says whether this
/// holder still owned it.
pub struct LockGuard {
    lock: Lock,
    owner: String,
    token: FencingToken,
    lost: CancellationToken,
    watchdog: Option<tokio::task::JoinHandle<()>>,
}

impl LockGuard {
    /// Starts the watchdog of a lock taken by a call sent at `sent`.
    fn start(lock: Lock, owner: String, token: FencingToken, sent: Instant) -> Self {
        let lost = CancellationToken::new();
        let watchdog = tokio::spawn(watch(
            lock.clone(),
            owner.clone(),
            lost.clone(),
            sent + lock.lease,
        ));
        Self {
            lock,
            owner,
            token,
            lost,
            watchdog: Some(watchdog),
        }
    }

    /// The fencing token of this acquisition.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Whether the lock is lost, or may be soon: a renewal was refused
    /// (someone else owns it now), or less than a third of the lease is
    /// left and no renewal got through. Told before the lease can run out,
    /// so the holder can stop before anyone else may take over; from then
    /// on the watchdog renews no more.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes when the lock is lost, as [`is_lost`](Self::is_lost)
    /// tells.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits; call it again to wait again.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Releases the lock; `false` if this holder no longer owned it (then
    /// nothing was deleted).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the watchdog stops at once, and a call dropped before
    /// its answer came releases the lock in the background, as dropping
    /// the guard does (the release is by owner only, so sending it twice
    /// does no harm).
    pub async fn release(mut self) -> Result<bool, StoreError> {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        let released = self.lock.release_as(&self.owner).await;
        // Settled: nothing left for `drop` to do.
        self.owner.clear();
        released
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
        if self.owner.is_empty() {
            return;
        }
        let (lock, owner) = (self.lock.clone(), std::mem::take(&mut self.owner));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = lock.release_as(&owner).await;
            });
        }
    }
}

/// Renews the lease every third of it while the guard lives. `expires`
/// is when the lease may run out, as the holder must assume: counted from
/// when the call that set it was sent, since Redis may have set it at any
/// moment after. Cancels `lost` when a renewal is refused, or when less
/// than a third of the lease is left and no renewal got through (one that
/// hangs is not waited for past that point).
async fn watch(lock: Lock, owner: String, lost: CancellationToken, mut expires: Instant) {
    let lease = lock.lease;
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut next = Instant::now() + period;
    loop {
        let warn_at = expires.checked_sub(lease / 3).unwrap_or(expires);
        if next >= warn_at {
            tokio::time::sleep_until(warn_at).await;
            break;
        }
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let renewed = tokio::select! {
            r = lock.renew_as(&owner) => r,
            () = tokio::time::sleep_until(warn_at) => break,
        };
        match renewed {
            Ok(Some(left)) => {
                expires = sent + left;
                next = sent + period;
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(lock = %lock.name, error = %e, "lock renewal failed");
                // Try again soon: the lease is running down.
                next = Instant::now() + (period / 4).max(Duration::from_millis(1));
            }
        }
    }
    tracing::warn!(lock = %lock.name, "lock lost, or may run out before a renewal gets through");
    lost.cancel();
}

/// A value no other holder uses: a digest of the process, the time and a
/// counter.
fn owner_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let seed = format!(
        "{}:{nanos}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    Fingerprint::xxh3(seed.as_bytes()).to_hex()
}
