//! The state machine's decisions, for stores that hold records in the
//! process. Stores that decide inside a server (a Lua script, an SQL
//! statement) implement the same table; the conformance kit holds them all
//! to it.

use std::time::Duration;

use crate::{Fingerprint, Timestamp};

/// What a store currently holds for a key, as `begin` sees it.
#[derive(Clone, Copy, Debug)]
pub enum Current {
    /// Nothing, or a completed record past its retention.
    Absent,
    /// An `in_progress` record, live or with an expired lease.
    InProgress {
        /// Its fingerprint.
        fingerprint: Option<Fingerprint>,
        /// When its lease runs out.
        lease_expires_at: Timestamp,
        /// Acquisitions so far.
        attempts: u32,
    },
    /// A `completed` record within its retention.
    Completed {
        /// Its fingerprint.
        fingerprint: Option<Fingerprint>,
    },
}

/// What `begin` must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Write a new `in_progress` record with a new token.
    Acquire {
        /// The new record's attempt count.
        attempt: u32,
    },
    /// Answer `InProgress`.
    Wait {
        /// Time left on the live lease.
        retry_after: Duration,
    },
    /// Answer `Completed` with the stored outcome.
    Replay,
    /// Answer `Mismatch`.
    Mismatch,
}

/// Decides `begin` (docs/contract.md §2).
///
/// A fingerprint mismatch is reported for live records only: an expired lease
/// means its holder gave up, and the key is taken over with the new content.
pub fn decide_begin(
    current: Current,
    fingerprint: Option<Fingerprint>,
    now: Timestamp,
) -> Decision {
    let differs =
        |stored: Option<Fingerprint>| matches!((stored, fingerprint), (Some(a), Some(b)) if a != b);
    match current {
        Current::Absent => Decision::Acquire { attempt: 1 },
        Current::InProgress {
            lease_expires_at,
            attempts,
            ..
        } if lease_expires_at <= now => Decision::Acquire {
            attempt: attempts.saturating_add(1),
        },
        Current::InProgress {
            fingerprint: stored,
            ..
        }
        | Current::Completed {
            fingerprint: stored,
        } if differs(stored) => Decision::Mismatch,
        Current::InProgress {
            lease_expires_at, ..
        } => Decision::Wait {
            retry_after: retry_after(lease_expires_at, now),
        },
        Current::Completed { .. } => Decision::Replay,
    }
}

/// Whether a holder of `held` owns a record whose token is `stored` and whose
/// lease runs out at `lease_expires_at`: same token, lease still live.
pub fn owns(stored: u64, held: u64, lease_expires_at: Timestamp, now: Timestamp) -> bool {
    stored == held && now < lease_expires_at
}

/// Whether a `complete` by `held` is the retry of the call that completed a
/// record whose token is `stored` and which is kept until `expires_at`: then
/// it is answered `Ok` again and changes nothing.
pub fn completed_by(stored: u64, held: u64, expires_at: Timestamp, now: Timestamp) -> bool {
    stored == held && now < expires_at
}

/// Time until `lease_expires_at`, at least 1 ms.
pub fn retry_after(lease_expires_at: Timestamp, now: Timestamp) -> Duration {
    lease_expires_at.since(now).max(Duration::from_millis(1))
}
