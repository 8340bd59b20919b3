//! What the service counts, and `/metrics` to read it.

use std::collections::HashSet;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use idem_core::Namespace;

use super::{Problem, Shared};

/// One answered request on `route` (the route's pattern, never the path).
pub(super) fn request(route: String, status: StatusCode, took: Duration) {
    metrics::histogram!("idem_http_request_duration_seconds", "route" => route.clone())
        .record(took.as_secs_f64());
    metrics::counter!(
        "idem_http_requests_total",
        "route" => route,
        "status" => status.as_u16().to_string()
    )
    .increment(1);
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

/// The `namespace` label for `ns`: its name, while it is one of the first
/// [`MAX_NAMESPACE_LABELS`] namespaces seen.
fn namespace_label(ns: &Namespace) -> String {
    static SEEN: OnceLock<RwLock<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    let name = ns.as_str();
    if seen
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(name)
    {
        return name.to_owned();
    }
    let mut seen = seen.write().unwrap_or_else(|e| e.into_inner());
    if seen.len() < MAX_NAMESPACE_LABELS {
        seen.insert(name.to_owned());
    }
    if seen.contains(name) {
        name.to_owned()
    } else {
        OTHER_NAMESPACES.to_owned()
    }
}

/// One store operation on `ns` and its result.
pub(super) fn operation(ns: &Namespace, operation: &'static str, result: &'static str) {
    operations(ns, operation, result, 1);
}

/// `n` store operations on `ns` with the same result. Batches count their
/// items with one update per result: each update looks its series up by its
/// labels, which costs more than the store's own work on a key.
pub(super) fn operations(ns: &Namespace, operation: &'static str, result: &'static str, n: u64) {
    metrics::counter!(
        "idem_operations_total",
        "namespace" => namespace_label(ns),
        "operation" => operation,
        "result" => result
    )
    .increment(n);
}

/// `n` acquisitions that took over an expired lease.
pub(super) fn takeovers(ns: &Namespace, n: u64) {
    metrics::counter!("idem_lease_takeovers_total", "namespace" => namespace_label(ns))
        .increment(n);
}

/// A stale token refused by `operation`.
pub(super) fn stale(ns: &Namespace, operation: &'static str) {
    metrics::counter!(
        "idem_stale_tokens_total",
        "namespace" => namespace_label(ns),
        "operation" => operation
    )
    .increment(1);
}

/// Records held, by the service's count: a first acquisition adds one, a
/// complete or release takes one away.
pub(super) fn in_progress(change: f64) {
    metrics::gauge!("idem_in_progress_records").increment(change);
}

/// Prometheus metrics, text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, body = String, content_type = "text/plain"),
    (status = 404, body = Problem, content_type = "application/problem+json"),
))]
pub(super) async fn metrics_text(axum::extract::State(state): Shared) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => Problem::not_found("metrics are not enabled on this server").into_response(),
    }
}
