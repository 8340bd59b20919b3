//! What the service counts, and `/metrics` to read it.

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
        "namespace" => ns.as_str().to_owned(),
        "operation" => operation,
        "result" => result
    )
    .increment(n);
}

/// `n` acquisitions that took over an expired lease.
pub(super) fn takeovers(ns: &Namespace, n: u64) {
    metrics::counter!("idem_lease_takeovers_total", "namespace" => ns.as_str().to_owned())
        .increment(n);
}

/// A stale token refused by `operation`.
pub(super) fn stale(ns: &Namespace, operation: &'static str) {
    metrics::counter!(
        "idem_stale_tokens_total",
        "namespace" => ns.as_str().to_owned(),
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
