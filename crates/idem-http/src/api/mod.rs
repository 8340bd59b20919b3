//! The service API of DESIGN.md §5, as an axum [`Router`] over any store.

mod auth;
mod problem;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::request::Parts;
use http::{StatusCode, header};
use idem_core::{
    Begin, BeginItem, CompleteItem, Fenced, FencingToken, Fingerprint, Key, Lease, Namespace,
    Record, SharedStore, Store,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;
use utoipa::OpenApi;

pub use self::auth::{Auth, Grant, Namespaces};
pub use self::problem::Problem;
use self::wire::*;

/// How the service behaves, beside the store's own limits.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// The lease when a request names none.
    pub default_lease: Duration,
    /// The retention when a request names none.
    pub default_retention: Duration,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            default_lease: Duration::from_secs(30),
            default_retention: Duration::from_secs(24 * 3600),
            max_body_bytes: 16 * 1024 * 1024,
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The store.
    pub store: SharedStore,
    /// Behaviour.
    pub config: ApiConfig,
    /// Who may call.
    pub auth: Auth,
    /// Renders `/metrics`; `None` answers 404 there.
    pub metrics: Option<PrometheusHandle>,
}

/// The whole service: `/v1/*`, health, metrics and the API document.
pub fn router(state: ApiState) -> Router {
    let state = Arc::new(state);
    let v1 = Router::new()
        .route("/v1/{ns}/begin", post(begin))
        .route("/v1/{ns}/complete", post(complete))
        .route("/v1/{ns}/release", post(release))
        .route("/v1/{ns}/extend", post(extend))
        .route("/v1/{ns}/begin-batch", post(begin_batch))
        .route("/v1/{ns}/complete-batch", post(complete_batch))
        .route("/v1/{ns}/record", get(record))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi))
        .fallback(|| async { Problem::not_found("no such path; see /openapi.json") })
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .layer(middleware::from_fn(observe))
        .layer(axum::extract::DefaultBodyLimit::max(
            state.config.max_body_bytes,
        ))
        .with_state(state)
}

type Shared = State<Arc<ApiState>>;

/// The `{ns}` path segment, checked.
struct Ns(Namespace);

impl<S: Send + Sync> FromRequestParts<S> for Ns {
    type Rejection = Problem;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let Path(ns) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| Problem::malformed(e.body_text()))?;
        Namespace::new(&ns)
            .map(Ns)
            .map_err(|e| Problem::invalid(&e))
    }
}

/// A JSON body, whatever its `Content-Type`, with errors as problems.
struct Body<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;
    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let limit = match req.extensions().get::<BodyLimit>() {
            Some(BodyLimit(l)) => *l,
            None => usize::MAX,
        };
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Problem::body_too_large(limit)
            } else {
                Problem::malformed(e.body_text())
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(Body)
            .map_err(|e| Problem::malformed(format!("the body is not the JSON expected: {e}")))
    }
}

#[derive(Clone, Copy)]
struct BodyLimit(usize);

async fn authorize(State(state): Shared, Ns(ns): Ns, mut req: Request, next: Next) -> Response {
    if let Err(p) = state
        .auth
        .check(req.headers().get(header::AUTHORIZATION), &ns)
    {
        count(
            &ns,
            "auth",
            if p.status == 401 {
                "unauthorized"
            } else {
                "forbidden"
            },
        );
        return p.into_response();
    }
    req.extensions_mut()
        .insert(BodyLimit(state.config.max_body_bytes));
    next.run(req).await
}

/// Counts requests and times them by route.
async fn observe(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let start = Instant::now();
    let response = next.run(req).await;
    metrics::histogram!("idem_http_request_duration_seconds", "route" => route.clone())
        .record(start.elapsed().as_secs_f64());
    metrics::counter!(
        "idem_http_requests_total",
        "route" => route,
        "status" => response.status().as_u16().to_string()
    )
    .increment(1);
    response
}

fn count(ns: &Namespace, operation: &'static str, result: &'static str) {
    metrics::counter!(
        "idem_operations_total",
        "namespace" => ns.as_str().to_owned(),
        "operation" => operation,
        "result" => result
    )
    .increment(1);
}

fn key(ns: &Namespace, key: String) -> Result<Key, Problem> {
    Key::in_namespace(ns.clone(), key).map_err(|e| Problem::invalid(&e))
}

fn lease(ms: Option<u64>, config: &ApiConfig) -> Lease {
    ms.map_or(Lease::new(config.default_lease), Lease::from_millis)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn outcome_json(bytes: Option<&[u8]>) -> serde_json::Value {
    match bytes {
        None => serde_json::Value::Null,
        // Outcomes stored through the service are JSON; anything else
        // (stored by a library user) comes back as a string.
        Some(b) => serde_json::from_slice(b)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(b).into_owned())),
    }
}

fn begin_answer(ns: &Namespace, b: Begin) -> BeginAnswer {
    match b {
        Begin::Acquired(c) => {
            if c.attempt > 1 {
                metrics::counter!("idem_lease_takeovers_total", "namespace" => ns.as_str().to_owned())
                    .increment(1);
            } else {
                metrics::gauge!("idem_in_progress_records").increment(1.0);
            }
            count(ns, "begin", "acquired");
            BeginAnswer::Acquired {
                token: c.token.get(),
                lease_expires_at_ms: c.lease_expires_at.as_millis(),
                attempt: c.attempt,
            }
        }
        Begin::InProgress { retry_after } => {
            count(ns, "begin", "in_progress");
            BeginAnswer::InProgress {
                retry_after_ms: millis(retry_after),
            }
        }
        Begin::Completed {
            outcome,
            completed_at,
        } => {
            count(ns, "begin", "completed");
            BeginAnswer::Completed {
                outcome: outcome_json(outcome.as_deref()),
                completed_at_ms: completed_at.as_millis(),
            }
        }
        Begin::Mismatch => {
            count(ns, "begin", "mismatch");
            BeginAnswer::Mismatch
        }
    }
}

fn fenced<T>(ns: &Namespace, operation: &'static str, f: Fenced<T>) -> Result<T, Problem> {
    match f {
        Fenced::Ok(t) => {
            count(ns, operation, "ok");
            if operation != "extend" {
                metrics::gauge!("idem_in_progress_records").decrement(1.0);
            }
            Ok(t)
        }
        Fenced::Stale => {
            count(ns, operation, "stale");
            metrics::counter!(
                "idem_stale_tokens_total",
                "namespace" => ns.as_str().to_owned(),
                "operation" => operation
            )
            .increment(1);
            Err(Problem::stale(
                "this token does not own the key: its lease ran out, someone took over, or it was completed or released",
            ))
        }
    }
}

fn begin_item(ns: &Namespace, r: BeginRequest, config: &ApiConfig) -> Result<BeginItem, Problem> {
    Ok(BeginItem {
        key: key(ns, r.key)?,
        fingerprint: r.fingerprint.map(|f| Fingerprint::sha256(f.as_bytes())),
        lease: lease(r.lease_ms, config),
    })
}

fn complete_item(
    ns: &Namespace,
    r: CompleteRequest,
    config: &ApiConfig,
) -> Result<CompleteItem, Problem> {
    let outcome = r
        .outcome
        .map(|v| Bytes::from(serde_json::to_vec(&v).expect("a JSON value serializes")));
    Ok(CompleteItem {
        key: key(ns, r.key)?,
        token: FencingToken::new(r.token),
        outcome,
        retention: r
            .retention_ms
            .map_or(config.default_retention, Duration::from_millis),
    })
}

/// Claims a key.
#[utoipa::path(post, path = "/v1/{ns}/begin", tag = "records",
    params(NsParam),
    request_body = BeginRequest,
    responses(
        (status = 200, body = BeginAnswer, description = "acquired, in_progress, completed or mismatch"),
        V1Problems,
    ))]
async fn begin(
    State(state): Shared,
    Ns(ns): Ns,
    Body(r): Body<BeginRequest>,
) -> Result<Json<BeginAnswer>, Problem> {
    let item = begin_item(&ns, r, &state.config)?;
    let b = state
        .store
        .begin(&item.key, item.fingerprint, item.lease)
        .await
        .map_err(Problem::store)?;
    Ok(Json(begin_answer(&ns, b)))
}

/// Stores the outcome of the work a token holds.
#[utoipa::path(post, path = "/v1/{ns}/complete", tag = "records",
    params(NsParam),
    request_body = CompleteRequest,
    responses(
        (status = 200, body = CompleteAnswer),
        FencedProblems,
    ))]
async fn complete(
    State(state): Shared,
    Ns(ns): Ns,
    Body(r): Body<CompleteRequest>,
) -> Result<Json<CompleteAnswer>, Problem> {
    let item = complete_item(&ns, r, &state.config)?;
    let f = state
        .store
        .complete(&item.key, item.token, item.outcome, item.retention)
        .await
        .map_err(Problem::store)?;
    fenced(&ns, "complete", f)?;
    Ok(Json(CompleteAnswer {
        status: "completed",
    }))
}

/// Gives a key up so that a redelivery runs again.
#[utoipa::path(post, path = "/v1/{ns}/release", tag = "records",
    params(NsParam),
    request_body = ReleaseRequest,
    responses(
        (status = 200, body = ReleaseAnswer),
        FencedProblems,
    ))]
async fn release(
    State(state): Shared,
    Ns(ns): Ns,
    Body(r): Body<ReleaseRequest>,
) -> Result<Json<ReleaseAnswer>, Problem> {
    let k = key(&ns, r.key)?;
    let f = state
        .store
        .release(&k, FencingToken::new(r.token))
        .await
        .map_err(Problem::store)?;
    fenced(&ns, "release", f)?;
    Ok(Json(ReleaseAnswer { status: "released" }))
}

/// Pushes a held lease out (a heartbeat).
#[utoipa::path(post, path = "/v1/{ns}/extend", tag = "records",
    params(NsParam),
    request_body = ExtendRequest,
    responses(
        (status = 200, body = ExtendAnswer),
        FencedProblems,
    ))]
async fn extend(
    State(state): Shared,
    Ns(ns): Ns,
    Body(r): Body<ExtendRequest>,
) -> Result<Json<ExtendAnswer>, Problem> {
    let k = key(&ns, r.key)?;
    let f = state
        .store
        .extend(
            &k,
            FencingToken::new(r.token),
            lease(r.lease_ms, &state.config),
        )
        .await
        .map_err(Problem::store)?;
    let until = fenced(&ns, "extend", f)?;
    Ok(Json(ExtendAnswer {
        status: "extended",
        lease_expires_at_ms: until.as_millis(),
    }))
}

/// `begin` for many keys in one request; answers in order.
#[utoipa::path(post, path = "/v1/{ns}/begin-batch", tag = "records",
    params(NsParam),
    request_body = BeginBatch,
    responses(
        (status = 200, body = BeginBatchAnswer),
        V1Problems,
    ))]
async fn begin_batch(
    State(state): Shared,
    Ns(ns): Ns,
    Body(r): Body<BeginBatch>,
) -> Result<Json<BeginBatchAnswer>, Problem> {
    let items = batch_items(&ns, r.items, &state.config, begin_item)?;
    let answers = state
        .store
        .begin_many(&items)
        .await
        .map_err(Problem::store)?;
    Ok(Json(BeginBatchAnswer {
        results: answers.into_iter().map(|b| begin_answer(&ns, b)).collect(),
    }))
}

/// `complete` for many keys in one request; answers in order.
#[utoipa::path(post, path = "/v1/{ns}/complete-batch", tag = "records",
    params(NsParam),
    request_body = CompleteBatch,
    responses(
        (status = 200, body = CompleteBatchAnswer),
        V1Problems,
    ))]
async fn complete_batch(
    State(state): Shared,
    Ns(ns): Ns,
    Body(r): Body<CompleteBatch>,
) -> Result<Json<CompleteBatchAnswer>, Problem> {
    let items = batch_items(&ns, r.items, &state.config, complete_item)?;
    let answers = state
        .store
        .complete_many(&items)
        .await
        .map_err(Problem::store)?;
    let results = answers
        .into_iter()
        .map(|f| match f {
            Fenced::Ok(()) => {
                count(&ns, "complete", "ok");
                metrics::gauge!("idem_in_progress_records").decrement(1.0);
                CompleteItemAnswer::Completed
            }
            Fenced::Stale => {
                count(&ns, "complete", "stale");
                CompleteItemAnswer::Stale
            }
        })
        .collect();
    Ok(Json(CompleteBatchAnswer { results }))
}

/// Converts each request of a batch, naming the first bad one.
fn batch_items<R, T>(
    ns: &Namespace,
    requests: Vec<R>,
    config: &ApiConfig,
    convert: fn(&Namespace, R, &ApiConfig) -> Result<T, Problem>,
) -> Result<Vec<T>, Problem> {
    requests
        .into_iter()
        .enumerate()
        .map(|(index, r)| {
            convert(ns, r, config).map_err(|mut p| {
                p.detail = format!("batch item {index}: {}", p.detail);
                p
            })
        })
        .collect()
}

/// A record as stored, for inspection.
#[utoipa::path(get, path = "/v1/{ns}/record", tag = "records",
    params(NsParam, RecordQuery),
    responses(
        (status = 200, body = RecordAnswer),
        LookupProblems,
    ))]
async fn record(
    State(state): Shared,
    Ns(ns): Ns,
    query: Result<Query<RecordQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RecordAnswer>, Problem> {
    let Query(q) =
        query.map_err(|e| Problem::malformed(format!("{}; pass ?key=K", e.body_text())))?;
    let k = key(&ns, q.key)?;
    let found = state.store.get(&k).await.map_err(Problem::store)?;
    let hex = |f: Option<Fingerprint>| f.map(Fingerprint::to_hex);
    match found {
        None => Err(Problem::not_found(format!("no record for key {k}"))),
        Some(Record::InProgress(r)) => Ok(Json(RecordAnswer::InProgress {
            token: r.token.get(),
            fingerprint: hex(r.fingerprint),
            lease_expires_at_ms: r.lease_expires_at.as_millis(),
            attempts: r.attempts,
            started_at_ms: r.started_at.as_millis(),
        })),
        Some(Record::Completed(r)) => Ok(Json(RecordAnswer::Completed {
            token: r.token.get(),
            fingerprint: hex(r.fingerprint),
            outcome: outcome_json(r.outcome.as_deref()),
            completed_at_ms: r.completed_at.as_millis(),
            expires_at_ms: r.expires_at.as_millis(),
        })),
    }
}

/// The `{ns}` path segment, for the API document.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // only describes the path
struct NsParam {
    /// The namespace: `[A-Za-z0-9_.-]{1,64}`.
    #[param(pattern = r"^[A-Za-z0-9_.\-]{1,64}$")]
    ns: String,
}

// The error answers of the `/v1` operations, for the API document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
enum V1Problems {
    /// Malformed or refused input.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// No bearer token, or an unknown one.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// The token may not use this namespace.
    #[response(status = 403, content_type = "application/problem+json")]
    Forbidden(Problem),
    /// The body or the outcome is over its limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The store failed; retry after `Retry-After`.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

// Those of the operations that need the caller to own the key.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
enum FencedProblems {
    /// Malformed or refused input.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// No bearer token, or an unknown one.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// The token may not use this namespace.
    #[response(status = 403, content_type = "application/problem+json")]
    Forbidden(Problem),
    /// The token does not own the key (stale).
    #[response(status = 409, content_type = "application/problem+json")]
    Stale(Problem),
    /// The body or the outcome is over its limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The store failed; retry after `Retry-After`.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

// Those of the record lookup.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
enum LookupProblems {
    /// Malformed or refused input.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// No bearer token, or an unknown one.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// The token may not use this namespace.
    #[response(status = 403, content_type = "application/problem+json")]
    Forbidden(Problem),
    /// No record for the key.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// The store failed; retry after `Retry-After`.
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: the store answers.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, body = Health),
    (status = 503, body = Problem, content_type = "application/problem+json"),
))]
async fn readyz(State(state): Shared) -> Result<Json<Health>, Problem> {
    let probe = Key::new("idem.readyz", "probe").expect("a valid key");
    state.store.get(&probe).await.map_err(Problem::store)?;
    Ok(Json(Health { status: "ok" }))
}

/// Prometheus metrics, text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, body = String, content_type = "text/plain"),
    (status = 404, body = Problem, content_type = "application/problem+json"),
))]
async fn metrics_text(State(state): Shared) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => Problem::not_found("metrics are not enabled on this server").into_response(),
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        ApiDoc::openapi()
            .to_json()
            .expect("the API document serializes"),
    )
        .into_response()
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
