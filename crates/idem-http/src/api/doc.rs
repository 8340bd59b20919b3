//! The OpenAPI document, generated from the handlers so that it cannot drift
//! from them.

use utoipa::OpenApi;

use super::Problem;
use super::handlers::{
    __path_begin, __path_begin_batch, __path_complete, __path_complete_batch, __path_extend,
    __path_healthz, __path_openapi, __path_readyz, __path_record, __path_release,
};
use super::telemetry::__path_metrics_text;
use super::wire::*;

/// The `{ns}` path segment, for the API document.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // only describes the path
pub(super) struct NsParam {
    /// The namespace: `[A-Za-z0-9_.-]{1,64}`.
    #[param(pattern = r"^[A-Za-z0-9_.\-]{1,64}$")]
    ns: String,
}

// The error answers of every `/v1` operation, for the API document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum V1Problems {
    /// Malformed or refused input.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// No bearer token, or an unknown one.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// The token may not use this namespace.
    #[response(status = 403, content_type = "application/problem+json")]
    Forbidden(Problem),
    /// The store failed; retry after `Retry-After`.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

// Those of the operations that take a body.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum BodyProblems {
    /// The body did not arrive within the read timeout of its headers.
    #[response(status = 408, content_type = "application/problem+json")]
    Timeout(Problem),
    /// The body or the outcome is over its limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The body is not declared as JSON: send `Content-Type: application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    NotJson(Problem),
}

// That of the operations that need the caller to own the key.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum StaleProblem {
    /// The token does not own the key (stale).
    #[response(status = 409, content_type = "application/problem+json")]
    Stale(Problem),
}

// That of the record lookup.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum NotFoundProblem {
    /// No record for the key.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
}

/// The OpenAPI document of the service, generated from the handlers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "idem",
        description = "Idempotency records over HTTP: begin, complete, release, extend."
    ),
    paths(
        begin,
        complete,
        release,
        extend,
        begin_batch,
        complete_batch,
        record,
        healthz,
        readyz,
        metrics_text,
        openapi
    ),
    components(schemas(
        BeginRequest,
        BeginAnswer,
        CompleteRequest,
        CompleteAnswer,
        ReleaseRequest,
        ReleaseAnswer,
        ExtendRequest,
        ExtendAnswer,
        BeginBatch,
        BeginBatchAnswer,
        CompleteBatch,
        CompleteBatchAnswer,
        CompleteItemAnswer,
        RecordAnswer,
        Health,
        Problem
    ))
)]
pub struct ApiDoc;
