//! The conformance kit: one suite every idem store runs unchanged.
//!
//! A store crate states how to make a fresh store and how time moves for it,
//! and [`conformance_tests!`] writes one test per guarantee:
//!
//! ```ignore
//! idem_testkit::conformance_tests!(async {
//!     let clock = idem_core::ManualClock::new();
//!     let store = idem_core::MemoryStore::builder().clock(clock.clone()).build();
//!     idem_testkit::Subject::new(store, idem_testkit::TimeControl::Manual(clock))
//! });
//! ```
//!
//! Stores that keep time in a server (Redis `TIME`, SQL `now()`) pass
//! [`TimeControl::Real`]: the suite then sleeps where it would advance a
//! manual clock, with every duration scaled to a short unit.
#![deny(missing_docs)]

pub mod admin;
pub mod cancel;
pub mod cases;
pub mod faults;
pub mod model;
#[cfg(feature = "fuse")]
pub mod power_loss;
pub mod services;
pub mod small_disk;
pub mod tiers;
pub mod tls_redis;

use std::time::Duration;

use idem_core::{Clock, Key, ManualClock, Store};

/// How the suite makes time pass for the store under test.
#[derive(Clone, Debug)]
pub enum TimeControl {
    /// The store reads this clock: time moves only when the suite says so.
    Manual(ManualClock),
    /// The store keeps real time: the suite sleeps, `unit` per step.
    Real {
        /// The length of one step of time in the suite.
        unit: Duration,
    },
}

/// A store under test and the control of its time.
#[derive(Clone, Debug)]
pub struct Subject<S> {
    /// The store.
    pub store: S,
    /// How its time moves.
    pub time: TimeControl,
    run: u64,
}

impl<S: Store + Clone> Subject<S> {
    /// A subject. Each case uses keys of its own, so one store may serve many.
    pub fn new(store: S, time: TimeControl) -> Self {
        Self {
            store,
            time,
            run: std::process::id() as u64 * 1_000_000_000
                + std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as u64,
        }
    }

    /// `n` steps of time: 1 s each on a manual clock, `unit` each in real time.
    pub fn steps(&self, n: u32) -> Duration {
        match &self.time {
            TimeControl::Manual(_) => Duration::from_secs(1) * n,
            TimeControl::Real { unit } => *unit * n,
        }
    }

    /// Lets `n` steps of time pass.
    pub async fn pass(&self, n: u32) {
        let d = self.steps(n);
        match &self.time {
            TimeControl::Manual(clock) => clock.advance(d),
            TimeControl::Real { .. } => tokio::time::sleep(d).await,
        }
    }

    /// Whether times the store reports can be predicted exactly.
    pub fn exact_time(&self) -> bool {
        matches!(self.time, TimeControl::Manual(_))
    }

    /// The manual clock's time, if there is one.
    pub fn now(&self) -> Option<idem_core::Timestamp> {
        match &self.time {
            TimeControl::Manual(clock) => Some(clock.now()),
            TimeControl::Real { .. } => None,
        }
    }

    /// A key no other case or run uses, in namespace `conformance`.
    pub fn key(&self, case: &str) -> Key {
        Key::new("conformance", format!("{case}-{}", self.run)).expect("a valid key")
    }
}

/// What a conformance test's setup gives: a subject, or `None` when the
/// store's service is absent and the test is skipped (see [`services`]).
pub trait IntoSubject<S> {
    /// The subject, if there is one.
    fn into_subject(self) -> Option<Subject<S>>;
}

impl<S> IntoSubject<S> for Subject<S> {
    fn into_subject(self) -> Option<Subject<S>> {
        Some(self)
    }
}

impl<S> IntoSubject<S> for Option<Subject<S>> {
    fn into_subject(self) -> Option<Subject<S>> {
        self
    }
}

/// Writes one `#[tokio::test]` per case of a store that can be a tier
/// ([`idem_core::tier::Tier`]), with the same argument as
/// [`conformance_tests!`].
#[macro_export]
macro_rules! tier_conformance_tests {
    ($subject:expr) => {
        $crate::tier_conformance_tests!(@cases $subject;
            import_writes_the_record_as_given,
            import_keeps_a_live_completed_record,
            import_replaces_a_record_in_progress,
            import_of_an_expired_record_writes_nothing,
            token_high_water_covers_imported_and_issued_tokens,
            raised_floor_lifts_every_later_token,
            recorded_high_water_counts_at_once,
            completed_keys_page_in_key_order,
            completed_since_pages_the_records_completed_since,
        );
    };
    (@cases $subject:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(subject) = $crate::IntoSubject::into_subject($subject.await) else {
                    return;
                };
                $crate::tiers::$case(&subject).await;
            }
        )*
    };
}

/// Writes one `#[tokio::test]` per conformance case. The argument is an
/// expression giving a future of a [`Subject`] (or of an `Option` of one,
/// `None` to skip); it is evaluated afresh in each test. The calling crate
/// needs `tokio` with the `macros` and `rt-multi-thread` features as a
/// dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($subject:expr) => {
        $crate::conformance_tests!(@cases $subject;
            begin_on_absent_key_acquires,
            begin_while_lease_is_live_reports_in_progress,
            begin_after_complete_replays_the_outcome,
            begin_after_lease_expiry_takes_over,
            other_fingerprint_is_a_mismatch,
            missing_fingerprint_never_mismatches,
            stale_token_cannot_complete,
            stale_token_cannot_release,
            stale_token_cannot_extend,
            never_issued_token_is_stale,
            holder_whose_lease_ran_out_is_stale,
            completed_record_refuses_other_tokens,
            complete_retried_by_its_token_is_ok,
            release_lets_a_redelivery_run_again,
            reopen_lets_a_completed_key_run_again,
            tokens_increase_across_release_takeover_and_expiry,
            extend_pushes_the_lease_out,
            completed_record_expires_after_retention,
            get_shows_each_state,
            namespaces_are_isolated,
            batch_forms_agree_with_single_forms,
            batch_begin_of_one_key_twice_acquires_once,
            begin_race_has_exactly_one_winner,
            complete_race_stores_exactly_one_outcome,
            bad_input_is_refused_and_changes_nothing,
            scan_lists_stuck_work,
            random_operations_match_the_model,
            operations_dropped_after_one_poll_leave_keys_usable,
            operations_dropped_at_random_points_leave_keys_usable,
        );
    };
    (@cases $subject:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(subject) = $crate::IntoSubject::into_subject($subject.await) else {
                    return;
                };
                $crate::cases::$case(&subject).await;
            }
        )*
    };
}
