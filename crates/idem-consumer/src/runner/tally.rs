//! What the runner counts: the run's report and the Prometheus metrics,
//! with metric handles made once per run (a message costs no label
//! allocation).

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Histogram};

use super::Report;
use crate::RetryReason;

/// What happened to a message at the broker.
#[derive(Clone, Copy, Debug)]
pub(super) enum Settled {
    Handled,
    Duplicate,
    RetriedBusy,
    RetriedFailed,
    RetriedUnavailable,
    DeadLettered,
    Requeued,
}

const ALL: [Settled; 7] = [
    Settled::Handled,
    Settled::Duplicate,
    Settled::RetriedBusy,
    Settled::RetriedFailed,
    Settled::RetriedUnavailable,
    Settled::DeadLettered,
    Settled::Requeued,
];

impl Settled {
    /// The tally for a retry for `reason`.
    pub(super) fn retried(reason: RetryReason) -> Self {
        match reason {
            RetryReason::Busy => Settled::RetriedBusy,
            RetryReason::Failed => Settled::RetriedFailed,
            RetryReason::Unavailable => Settled::RetriedUnavailable,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Settled::Handled => "handled",
            Settled::Duplicate => "duplicate",
            Settled::RetriedBusy => "retried_busy",
            Settled::RetriedFailed => "retried_failed",
            Settled::RetriedUnavailable => "retried_unavailable",
            Settled::DeadLettered => "dead_lettered",
            Settled::Requeued => "requeued",
        }
    }
}

pub(super) struct Tally {
    settled: [AtomicU64; 7],
    settled_metric: [Counter; 7],
    source_errors: AtomicU64,
    source_errors_metric: [Counter; 7],
    fetch_errors: AtomicU64,
    fetch_errors_metric: Counter,
    panics: AtomicU64,
    panics_metric: Counter,
    pub(super) fail_open: Counter,
    pub(super) handler_seconds: Histogram,
}

impl Tally {
    /// Handles for `namespace`, from the metrics recorder installed now.
    pub(super) fn new(namespace: &str) -> Self {
        let ns = namespace.to_owned();
        Self {
            settled: Default::default(),
            settled_metric: ALL.map(|s| {
                metrics::counter!(
                    "idem_consumer_messages_total",
                    "namespace" => ns.clone(),
                    "outcome" => s.as_str()
                )
            }),
            source_errors: AtomicU64::new(0),
            source_errors_metric: ALL.map(|s| {
                metrics::counter!(
                    "idem_consumer_source_errors_total",
                    "namespace" => ns.clone(),
                    "op" => s.as_str()
                )
            }),
            fetch_errors: AtomicU64::new(0),
            fetch_errors_metric: metrics::counter!(
                "idem_consumer_source_errors_total",
                "namespace" => ns.clone(),
                "op" => "fetch"
            ),
            panics: AtomicU64::new(0),
            panics_metric: metrics::counter!("idem_consumer_panics_total", "namespace" => ns.clone()),
            fail_open: metrics::counter!("idem_consumer_fail_open_total", "namespace" => ns.clone()),
            handler_seconds: metrics::histogram!("idem_consumer_handler_seconds", "namespace" => ns),
        }
    }

    /// Counts a settled message; a failed broker call also as a source
    /// error (the broker then redelivers the message).
    pub(super) fn settled(&self, what: Settled, broker_failed: bool) {
        let i = what as usize;
        self.settled[i].fetch_add(1, Ordering::Relaxed);
        self.settled_metric[i].increment(1);
        if broker_failed {
            self.source_errors.fetch_add(1, Ordering::Relaxed);
            self.source_errors_metric[i].increment(1);
        }
    }

    pub(super) fn fetch_failed(&self) {
        self.fetch_errors.fetch_add(1, Ordering::Relaxed);
        self.fetch_errors_metric.increment(1);
    }

    /// Counts a panic in a message's task (the handler's, or a broker
    /// call's).
    pub(super) fn panicked(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
        self.panics_metric.increment(1);
    }

    pub(super) fn report(&self) -> Report {
        let get = |s: Settled| self.settled[s as usize].load(Ordering::Relaxed);
        Report {
            handled: get(Settled::Handled),
            duplicates: get(Settled::Duplicate),
            retried_busy: get(Settled::RetriedBusy),
            retried_failed: get(Settled::RetriedFailed),
            retried_unavailable: get(Settled::RetriedUnavailable),
            dead_lettered: get(Settled::DeadLettered),
            requeued: get(Settled::Requeued),
            source_errors: self.source_errors.load(Ordering::Relaxed),
            fetch_errors: self.fetch_errors.load(Ordering::Relaxed),
            panics: self.panics.load(Ordering::Relaxed),
        }
    }
}
