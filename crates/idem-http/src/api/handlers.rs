//! The operations of `/v1/{ns}/*`, health and the API document.

use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{StatusCode, header};
use idem_core::{
    Begin, BeginItem, CompleteItem, Fenced, FencingToken, Fingerprint, Key, Lease, Namespace,
    Record, Store,
};
use serde_json::value::RawValue;
use utoipa::OpenApi;

use super::batch_json;
use super::doc::{BodyProblems, NotFoundProblem, NsParam, StaleProblem, V1Problems};
use super::extract::{JsonBody, Ns, Payload, decode};
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

/// What some `begin`s answered, counted for the metrics. A batch updates each
/// series once with its count rather than once per key: an update builds its
/// labels and looks its series up by them, which took 40 % of a batch's
/// server time when done for every key.
#[derive(Default)]
struct BeginCounts {
    acquired: u64,
    takeovers: u64,
    in_progress: u64,
    completed: u64,
    mismatch: u64,
}

impl BeginCounts {
    fn add(&mut self, b: &Begin) {
        match b {
            Begin::Acquired(c) => {
                self.acquired += 1;
                if c.attempt > 1 {
                    self.takeovers += 1;
                }
            }
            Begin::InProgress { .. } => self.in_progress += 1,
            Begin::Completed { .. } => self.completed += 1,
            Begin::Mismatch => self.mismatch += 1,
        }
    }

    fn record(&self, ns: &Namespace) {
        if self.takeovers > 0 {
            telemetry::takeovers(ns, self.takeovers);
        }
        // A takeover's record was already counted as held.
        let held = self.acquired - self.takeovers;
        if held > 0 {
            telemetry::in_progress(held as f64);
        }
        for (result, n) in [
            ("acquired", self.acquired),
            ("in_progress", self.in_progress),
            ("completed", self.completed),
            ("mismatch", self.mismatch),
        ] {
            if n > 0 {
                telemetry::operations(ns, "begin", result, n);
            }
        }
    }
}

fn begin_answer(b: Begin) -> BeginAnswer {
    match b {
        Begin::Acquired(c) => BeginAnswer::Acquired {
            token: c.token.get(),
            lease_expires_at_ms: c.lease_expires_at.as_millis(),
            attempt: c.attempt,
        },
        Begin::InProgress { retry_after } => BeginAnswer::InProgress {
            retry_after_ms: millis(retry_after),
        },
        Begin::Completed {
            outcome,
            completed_at,
        } => BeginAnswer::Completed {
            outcome: outcome_json(outcome.as_deref()),
            completed_at_ms: completed_at.as_millis(),
        },
        Begin::Mismatch => BeginAnswer::Mismatch,
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
    if let Some(raw) = &r.outcome
        && nests_deeper_than(raw.get().as_bytes(), MAX_OUTCOME_NESTING)
    {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-input",
            "Invalid input",
            format!(
                "the outcome nests arrays and objects more than {MAX_OUTCOME_NESTING} levels deep; \
                 JSON readers (idem's own among them) refuse deeper nesting or overflow their stack on it"
            ),
        ));
    }
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

/// Deepest nesting of arrays and objects an outcome may have: the most
/// serde_json reads, so that every outcome stored can be read back by a
/// guard.
/// An outcome is kept as the text sent and never parsed into values, so
/// without this check the service would store what its clients cannot read.
const MAX_OUTCOME_NESTING: usize = 127;

/// Whether the JSON text `json` (already checked to be JSON) nests arrays
/// and objects more than `max` levels deep.
fn nests_deeper_than(json: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Converts each request of a batch, naming the first bad one.
fn batch_items<R, T>(
    ns: &Namespace,
    requests: Vec<R>,
    config: &ApiConfig,
    convert: fn(&Namespace, R, &ApiConfig) -> Result<T, Problem>,
) -> Result<Vec<T>, Problem> {
    // Sized up front: collecting into `Result<Vec<_>, _>` would not know the
    // length and grow the vector by copying.
    let mut items = Vec::with_capacity(requests.len());
    for (index, r) in requests.into_iter().enumerate() {
        items.push(convert(ns, r, config).map_err(|mut p| {
            p.detail = format!("batch item {index}: {}", p.detail);
            p
        })?);
    }
    Ok(items)
}

/// The items of a plain `begin-batch` body, or `None` if one is refused (the
/// serde_json path then names it).
fn plain_begin_items(
    ns: &Namespace,
    plain: Vec<batch_json::PlainBeginItem<'_>>,
    config: &ApiConfig,
) -> Option<Vec<BeginItem>> {
    // Every key of the batch in one buffer, each key a slice of it: one
    // allocation (and one free) for the batch rather than one per key. A key
    // that a store keeps past the call (in a write-behind queue) keeps the
    // buffer, which holds no more than the keys of its batch.
    let mut keys = Vec::with_capacity(plain.iter().map(|i| i.key.len()).sum());
    for i in &plain {
        keys.extend_from_slice(i.key);
    }
    let keys = Bytes::from(keys);
    let mut at = 0;
    // Sized up front: collecting into `Option<Vec<_>>` would not know the
    // length and grow the vector by copying.
    let mut items = Vec::with_capacity(plain.len());
    for i in plain {
        let key = keys.slice(at..at + i.key.len());
        at += i.key.len();
        items.push(BeginItem {
            // An empty key is refused, by the serde_json path.
            key: Key::in_namespace(ns.clone(), key).ok()?,
            fingerprint: i.fingerprint.map(Fingerprint::sha256),
            lease: lease(i.lease_ms, config),
        });
    }
    Some(items)
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
    let mut counts = BeginCounts::default();
    counts.add(&b);
    counts.record(&ns);
    Ok(Json(begin_answer(b)))
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
    JsonBody(body): JsonBody,
) -> Result<Response, Problem> {
    // The usual body is read by hand; anything else, and every refusal, by
    // serde_json as the other operations are.
    let plain = batch_json::begin_items(&body)
        .and_then(|items| plain_begin_items(&ns, items, &state.config));
    let items = match plain {
        Some(items) => items,
        None => {
            let r: BeginBatch = decode(&body)?;
            batch_items(&ns, r.items, &state.config, begin_item)?
        }
    };
    let answers = state
        .on_store(move |store| async move { store.begin_many(&items).await })
        .await?;
    let mut counts = BeginCounts::default();
    for b in &answers {
        counts.add(b);
    }
    counts.record(&ns);
    // The same body and header as `Json(BeginBatchAnswer { .. })`, written
    // faster.
    let json = BeginBatchAnswer::json_of(answers.into_iter().map(begin_answer));
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
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
    let results: Vec<_> = answers
        .into_iter()
        .map(|f| match f {
            Fenced::Ok(()) => CompleteItemAnswer::Completed,
            Fenced::Stale => CompleteItemAnswer::Stale,
        })
        .collect();
    // Counted once per result, as `begin-batch` does (see `BeginCounts`).
    let ok = results
        .iter()
        .filter(|a| matches!(a, CompleteItemAnswer::Completed))
        .count() as u64;
    let stale = results.len() as u64 - ok;
    if ok > 0 {
        telemetry::operations(&ns, "complete", "ok", ok);
        telemetry::in_progress(-(ok as f64));
    }
    if stale > 0 {
        telemetry::operations(&ns, "complete", "stale", stale);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_nesting_counts_arrays_and_objects_but_not_brackets_in_strings() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!nests_deeper_than(nested(127).as_bytes(), 127));
        assert!(nests_deeper_than(nested(128).as_bytes(), 127));
        // The most serde_json reads, and one more.
        let read = |n: usize| serde_json::from_str::<serde_json::Value>(&nested(n)).is_ok();
        assert!(read(MAX_OUTCOME_NESTING) && !read(MAX_OUTCOME_NESTING + 1));
        assert!(nests_deeper_than(br#"{"a":[{"b":[1]}]}"#, 3));
        assert!(!nests_deeper_than(br#"{"a":[{"b":1}]}"#, 3));
        // Brackets and escaped quotes inside strings are text.
        assert!(!nests_deeper_than(
            br#"["[[[[", "\"[[[", {"k\\": "{{"}]"#,
            2
        ));
        assert!(!nests_deeper_than(b"\"[[[\"", 0));
    }
}
