//! What the service counts, and `/metrics` to read it.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use idem_core::Namespace;
use metrics::{Counter, Gauge, Histogram};

use super::{Problem, Shared};

// Every series is looked up by its labels once and its handle kept: a
// lookup by name and labels (what the `counter!` macros do on each call)
// allocates the labels and hashes them, which on the memory store costs
// more than the store's own work. The handles are made on first use, so the
// recorder must be installed before the first request (`idem serve` does it
// at start).

/// The handles of one route: its latency histogram, and a counter per
/// status made when the status is first answered.
struct RouteMeters {
    seconds: Histogram,
    /// Indexed by the status less 100 (statuses run from 100 to 999).
    by_status: Box<[OnceLock<Counter>]>,
    route: String,
}

impl RouteMeters {
    fn new(route: &str) -> Self {
        Self {
            seconds: metrics::histogram!("idem_http_request_duration_seconds", "route" => route.to_owned()),
            by_status: (100..1000).map(|_| OnceLock::new()).collect(),
            route: route.to_owned(),
        }
    }

    fn status(&self, status: StatusCode) -> &Counter {
        self.by_status[usize::from(status.as_u16()) - 100].get_or_init(|| {
            metrics::counter!(
                "idem_http_requests_total",
                "route" => self.route.clone(),
                "status" => status.as_u16().to_string()
            )
        })
    }
}

/// The routes' handles, by route pattern (a route is never a path, so the
/// set is bounded by the router).
fn route_meters(route: &str) -> Arc<RouteMeters> {
    static ROUTES: OnceLock<RwLock<HashMap<String, Arc<RouteMeters>>>> = OnceLock::new();
    let routes = ROUTES.get_or_init(Default::default);
    if let Some(m) = routes.read().unwrap_or_else(|e| e.into_inner()).get(route) {
        return m.clone();
    }
    routes
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(route.to_owned())
        .or_insert_with(|| Arc::new(RouteMeters::new(route)))
        .clone()
}

/// One answered request on `route` (the route's pattern, never the path).
pub(super) fn request(route: &str, status: StatusCode, took: Duration) {
    let meters = route_meters(route);
    meters.seconds.record(took.as_secs_f64());
    meters.status(status).increment(1);
}

/// A `/v1` request refused before its namespace could be trusted (a
/// malformed namespace, no token, or a token not allowed it). The namespace
/// is left out, so made-up names cannot add series.
pub(super) fn refused(reason: &'static str) {
    metrics::counter!("idem_refused_requests_total", "reason" => reason).increment(1);
}

/// Most namespaces that get series of their own. Without auth any client
/// names namespaces, and each would add series to `/metrics` for as long as
/// the process runs; past this many, operations count under
/// [`OTHER_NAMESPACES`].
const MAX_NAMESPACE_LABELS: usize = 1000;

/// The `namespace` label of operations on namespaces past
/// [`MAX_NAMESPACE_LABELS`]: not a valid namespace, so it names none.
const OTHER_NAMESPACES: &str = "(other)";

/// `begin`'s results, in the order of [`NamespaceMeters::begin`].
const BEGIN_RESULTS: [&str; 4] = ["acquired", "in_progress", "completed", "mismatch"];
/// The fenced operations, in the order of [`NamespaceMeters::fenced`].
const FENCED: [&str; 3] = ["complete", "release", "extend"];
/// A fenced operation's results.
const FENCED_RESULTS: [&str; 2] = ["ok", "stale"];

/// The handles of one namespace's series, each made when first used.
struct NamespaceMeters {
    label: String,
    begin: [OnceLock<Counter>; BEGIN_RESULTS.len()],
    fenced: [[OnceLock<Counter>; FENCED_RESULTS.len()]; FENCED.len()],
    stale: [OnceLock<Counter>; FENCED.len()],
    takeovers: OnceLock<Counter>,
}

impl NamespaceMeters {
    fn new(label: &str) -> Self {
        Self {
            label: label.to_owned(),
            begin: Default::default(),
            fenced: Default::default(),
            stale: Default::default(),
            takeovers: OnceLock::new(),
        }
    }

    fn operation(&self, operation: &'static str, result: &'static str) -> Counter {
        let made = |slot: &OnceLock<Counter>| {
            slot.get_or_init(|| self.operation_counter(operation, result))
                .clone()
        };
        if operation == "begin" {
            if let Some(i) = BEGIN_RESULTS.iter().position(|r| *r == result) {
                return made(&self.begin[i]);
            }
        } else if let (Some(o), Some(r)) = (
            FENCED.iter().position(|o| *o == operation),
            FENCED_RESULTS.iter().position(|r| *r == result),
        ) {
            return made(&self.fenced[o][r]);
        }
        self.operation_counter(operation, result)
    }

    fn operation_counter(&self, operation: &'static str, result: &'static str) -> Counter {
        metrics::counter!(
            "idem_operations_total",
            "namespace" => self.label.clone(),
            "operation" => operation,
            "result" => result
        )
    }
}

/// The handles of `ns`'s series: its own while it is one of the first
/// [`MAX_NAMESPACE_LABELS`] namespaces seen, else those of
/// [`OTHER_NAMESPACES`].
fn namespace_meters(ns: &Namespace) -> Arc<NamespaceMeters> {
    static SEEN: OnceLock<RwLock<HashMap<String, Arc<NamespaceMeters>>>> = OnceLock::new();
    static OTHER: OnceLock<Arc<NamespaceMeters>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let name = ns.as_str();
    if let Some(m) = seen.read().unwrap_or_else(|e| e.into_inner()).get(name) {
        return m.clone();
    }
    let mut seen = seen.write().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = seen.get(name) {
        return m.clone();
    }
    if seen.len() < MAX_NAMESPACE_LABELS {
        let m = Arc::new(NamespaceMeters::new(name));
        seen.insert(name.to_owned(), m.clone());
        return m;
    }
    OTHER
        .get_or_init(|| Arc::new(NamespaceMeters::new(OTHER_NAMESPACES)))
        .clone()
}

/// One store operation on `ns` and its result.
pub(super) fn operation(ns: &Namespace, operation: &'static str, result: &'static str) {
    operations(ns, operation, result, 1);
}

/// `n` store operations on `ns` with the same result. Batches count their
/// items with one update per result.
pub(super) fn operations(ns: &Namespace, operation: &'static str, result: &'static str, n: u64) {
    namespace_meters(ns)
        .operation(operation, result)
        .increment(n);
}

/// `n` acquisitions that took over an expired lease.
pub(super) fn takeovers(ns: &Namespace, n: u64) {
    let meters = namespace_meters(ns);
    meters
        .takeovers
        .get_or_init(
            || metrics::counter!("idem_lease_takeovers_total", "namespace" => meters.label.clone()),
        )
        .increment(n);
}

/// A stale token refused by `operation`.
pub(super) fn stale(ns: &Namespace, operation: &'static str) {
    let meters = namespace_meters(ns);
    let counter = || {
        metrics::counter!(
            "idem_stale_tokens_total",
            "namespace" => meters.label.clone(),
            "operation" => operation
        )
    };
    match FENCED.iter().position(|o| *o == operation) {
        Some(i) => meters.stale[i].get_or_init(counter).increment(1),
        None => counter().increment(1),
    }
}

/// Records held, by the service's count: a first acquisition adds one, a
/// complete or release takes one away.
pub(super) fn in_progress(change: f64) {
    static HELD: OnceLock<Gauge> = OnceLock::new();
    HELD.get_or_init(|| metrics::gauge!("idem_in_progress_records"))
        .increment(change);
}

/// Prometheus metrics, text format. With auth on, it takes a token that
/// may use every namespace, unless `public_metrics` is set.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, body = String, content_type = "text/plain"),
    (status = 401, body = Problem, content_type = "application/problem+json"),
    (status = 403, body = Problem, content_type = "application/problem+json"),
    (status = 404, body = Problem, content_type = "application/problem+json"),
))]
pub(super) async fn metrics_text(
    axum::extract::State(state): Shared,
    headers: http::HeaderMap,
) -> Response {
    if !state.config.public_metrics {
        match state
            .auth
            .namespaces_for(headers.get(header::AUTHORIZATION))
        {
            Ok(super::Namespaces::All) => {}
            Ok(super::Namespaces::Only(_)) => {
                return Problem::forbidden(
                    "/metrics names every tenant's namespaces: it takes a token that may use every \
                     namespace (`*`), or start idem serve with --public-metrics",
                )
                .into_response();
            }
            Err(p) => return p.into_response(),
        }
    }
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => Problem::not_found("metrics are not enabled on this server").into_response(),
    }
}
