//! The operations of `/v1/{ns}/*`, health and the API document.

use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header;
use idem_core::{
    Begin, BeginItem, CompleteItem, Fenced, FencingToken, Fingerprint, Key, Lease, Namespace,
    Record, Store,
};
use serde_json::value::RawValue;
use utoipa::OpenApi;

use super::doc::{BodyProblems, NotFoundProblem, NsParam, StaleProblem, V1Problems};
use super::extract::{Ns, Payload};
use super::wire::*;
use super::{ApiConfig, ApiDoc, Problem, Shared, telemetry};

fn key(ns: &Namespace, key: String) -> Result<Key, Problem> {
    Key::in_namespace(ns.clone(), key).map_err(|e| Problem::invalid(&e))
}

fn lease(ms: Option<u64>, config: &ApiConfig) -> Lease {
    ms.map_or(Lease::new(config.default_lease), Lease::from_millis)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A stored outcome as the JSON to answer with: the text stored, as it is.
fn outcome_json(bytes: Option<&[u8]>) -> Box<RawValue> {
    let Some(b) = bytes else {
        return RawValue::NULL.to_owned();
    };
    std::str::from_utf8(b)
        .ok()
        .and_then(|text| RawValue::from_string(text.to_owned()).ok())
        // Outcomes stored through the service are JSON; anything else
        // (stored by a library user) comes back as a string.
        .unwrap_or_else(|| {
            serde_json::value::to_raw_value(&String::from_utf8_lossy(b))
                .expect("a string serializes")
        })
}

fn begin_answer(ns: &Namespace, b: Begin) -> BeginAnswer {
    match b {
        Begin::Acquired(c) => {
            if c.attempt > 1 {
                telemetry::takeover(ns);
            } else {
                telemetry::in_progress(1.0);
            }
            telemetry::operation(ns, "begin", "acquired");
            BeginAnswer::Acquired {
                token: c.token.get(),
                lease_expires_at_ms: c.lease_expires_at.as_millis(),
                attempt: c.attempt,
            }
        }
        Begin::InProgress { retry_after } => {
            telemetry::operation(ns, "begin", "in_progress");
            BeginAnswer::InProgress {
                retry_after_ms: millis(retry_after),
            }
        }
        Begin::Completed {
            outcome,
            completed_at,
        } => {
            telemetry::operation(ns, "begin", "completed");
            BeginAnswer::Completed {
                outcome: outcome_json(outcome.as_deref()),
                completed_at_ms: completed_at.as_millis(),
            }
        }
        Begin::Mismatch => {
            telemetry::operation(ns, "begin", "mismatch");
            BeginAnswer::Mismatch
        }
    }
}

fn fenced<T>(ns: &Namespace, operation: &'static str, f: Fenced<T>) -> Result<T, Problem> {
    match f {
        Fenced::Ok(t) => {
            telemetry::operation(ns, operation, "ok");
            if operation != "extend" {
                telemetry::in_progress(-1.0);
            }
            Ok(t)
        }
        Fenced::Stale => {
            telemetry::operation(ns, operation, "stale");
            telemetry::stale(ns, operation);
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
        .map(|raw| Bytes::from(String::from(Box::<str>::from(raw))));
    Ok(CompleteItem {
        key: key(ns, r.key)?,
        token: FencingToken::new(r.token),
        outcome,
        retention: r
            .retention_ms
            .map_or(config.default_retention, Duration::from_millis),
    })
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

/// Claims a key.
#[utoipa::path(post, path = "/v1/{ns}/begin", tag = "records",
    params(NsParam),
    request_body = BeginRequest,
    responses(
        (status = 200, body = BeginAnswer, description = "acquired, in_progress, completed or mismatch"),
        V1Problems,
        BodyProblems,
    ))]
pub(super) async fn begin(
    State(state): Shared,
    Ns(ns): Ns,
    Payload(r): Payload<BeginRequest>,
) -> Result<Json<BeginAnswer>, Problem> {
    let item = begin_item(&ns, r, &state.config)?;
    let b = state
        .on_store(
            move |store| async move { store.begin(&item.key, item.fingerprint, item.lease).await },
        )
        .await?;
    Ok(Json(begin_answer(&ns, b)))
}

/// Stores the outcome of the work a token holds.
#[utoipa::path(post, path = "/v1/{ns}/complete", tag = "records",
    params(NsParam),
    request_body = CompleteRequest,
    responses(
        (status = 200, body = CompleteAnswer),
        V1Problems,
        BodyProblems,
        StaleProblem,
    ))]
pub(super) async fn complete(
    State(state): Shared,
    Ns(ns): Ns,
    Payload(r): Payload<CompleteRequest>,
) -> Result<Json<CompleteAnswer>, Problem> {
    let item = complete_item(&ns, r, &state.config)?;
    let f = state
        .on_store(move |store| async move {
            store
                .complete(&item.key, item.token, item.outcome, item.retention)
                .await
        })
        .await?;
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
        V1Problems,
        BodyProblems,
        StaleProblem,
    ))]
pub(super) async fn release(
    State(state): Shared,
    Ns(ns): Ns,
    Payload(r): Payload<ReleaseRequest>,
) -> Result<Json<ReleaseAnswer>, Problem> {
    let k = key(&ns, r.key)?;
    let f = state
        .on_store(move |store| async move { store.release(&k, FencingToken::new(r.token)).await })
        .await?;
    fenced(&ns, "release", f)?;
    Ok(Json(ReleaseAnswer { status: "released" }))
}

/// Pushes a held lease out (a heartbeat).
#[utoipa::path(post, path = "/v1/{ns}/extend", tag = "records",
    params(NsParam),
    request_body = ExtendRequest,
    responses(
        (status = 200, body = ExtendAnswer),
        V1Problems,
        BodyProblems,
        StaleProblem,
    ))]
pub(super) async fn extend(
    State(state): Shared,
    Ns(ns): Ns,
    Payload(r): Payload<ExtendRequest>,
) -> Result<Json<ExtendAnswer>, Problem> {
    let k = key(&ns, r.key)?;
    let lease = lease(r.lease_ms, &state.config);
    let f = state
        .on_store(
            move |store| async move { store.extend(&k, FencingToken::new(r.token), lease).await },
        )
        .await?;
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
        BodyProblems,
    ))]
pub(super) async fn begin_batch(
    State(state): Shared,
    Ns(ns): Ns,
    Payload(r): Payload<BeginBatch>,
) -> Result<Json<BeginBatchAnswer>, Problem> {
    let items = batch_items(&ns, r.items, &state.config, begin_item)?;
    let answers = state
        .on_store(move |store| async move { store.begin_many(&items).await })
        .await?;
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
        BodyProblems,
    ))]
pub(super) async fn complete_batch(
    State(state): Shared,
    Ns(ns): Ns,
    Payload(r): Payload<CompleteBatch>,
) -> Result<Json<CompleteBatchAnswer>, Problem> {
    let items = batch_items(&ns, r.items, &state.config, complete_item)?;
    let answers = state
        .on_store(move |store| async move { store.complete_many(&items).await })
        .await?;
    let results = answers
        .into_iter()
        .map(|f| match f {
            Fenced::Ok(()) => {
                telemetry::operation(&ns, "complete", "ok");
                telemetry::in_progress(-1.0);
                CompleteItemAnswer::Completed
            }
            Fenced::Stale => {
                telemetry::operation(&ns, "complete", "stale");
                CompleteItemAnswer::Stale
            }
        })
        .collect();
    Ok(Json(CompleteBatchAnswer { results }))
}

/// A record as stored, for inspection.
#[utoipa::path(get, path = "/v1/{ns}/record", tag = "records",
    params(NsParam, RecordQuery),
    responses(
        (status = 200, body = RecordAnswer),
        V1Problems,
        NotFoundProblem,
    ))]
pub(super) async fn record(
    State(state): Shared,
    Ns(ns): Ns,
    query: Result<Query<RecordQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RecordAnswer>, Problem> {
    let Query(q) =
        query.map_err(|e| Problem::malformed(format!("{}; pass ?key=K", e.body_text())))?;
    let k = key(&ns, q.key)?;
    let shown = k.to_string();
    let found = state
        .on_store(move |store| async move { store.get(&k).await })
        .await?;
    let hex = |f: Option<Fingerprint>| f.map(Fingerprint::to_hex);
    match found {
        None => Err(Problem::not_found(format!("no record for key {shown}"))),
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

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: the store answers.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, body = Health),
    (status = 503, body = Problem, content_type = "application/problem+json"),
))]
pub(super) async fn readyz(State(state): Shared) -> Result<Json<Health>, Problem> {
    let probe = Key::new("idem.readyz", "probe").expect("a valid key");
    state
        .on_store(move |store| async move { store.get(&probe).await })
        .await?;
    Ok(Json(Health { status: "ok" }))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub(super) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        ApiDoc::openapi()
            .to_json()
            .expect("the API document serializes"),
    )
        .into_response()
}
