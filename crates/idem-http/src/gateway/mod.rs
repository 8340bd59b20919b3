//! The `Idempotency-Key` gateway (`docs/contract.md` §6), after the IETF
//! Idempotency-Key draft and Stripe's documented behaviour.
//!
//! For covered methods (POST and PATCH by default):
//! - The key comes from the `Idempotency-Key` header (a plain token or a
//!   quoted string; 1 to [`GatewayConfig::max_key_bytes`] visible ASCII
//!   bytes), scoped by the client ([`GatewayConfig::client_scope`]: the
//!   `Authorization` header by default, or an API-key header, a cookie, any
//!   [`ClientScope`]), so two clients never see each other's responses.
//! - The fingerprint is SHA-256 of method, path, query and body.
//! - First request: claim, forward, store status, headers, body and
//!   trailers. The upstream call runs detached from the caller (spawned): a
//!   client that times out or disconnects never cancels it, its answer is
//!   stored, and the retry gets it replayed.
//! - Statuses in [`GatewayConfig::release`] (408, 425, 429 and 5xx by
//!   default), an unreachable upstream, a body that fails mid-way, or a
//!   call longer than [`GatewayConfig::upstream_timeout`] (504) release the
//!   key, so the client may retry; every other status is stored. The cause
//!   of a 502 or 504 goes to the log under the `request_id` its answer
//!   carries, never into the answer.
//! - Repeat after completion: the stored response, with
//!   `Idempotent-Replayed: true`.
//! - Repeat while the first is running: 409 with `Retry-After`.
//! - Same key, other content: 422. Malformed key: 400. Missing key: passed
//!   through, or 400 when [`GatewayConfig::require_key`] is set, or — with
//!   [`GatewayConfig::keyless_window`] — identical requests from one client
//!   within the window count as one. Keyless requests that carry no client
//!   identity are never merged: they pass through.
//!
//! A response whose body is over [`GatewayConfig::max_response_bytes`] (or
//! would take the record over the store's `max_outcome_bytes`) is not held
//! in memory: it streams through to the first caller, and the key is marked
//! done but not replayable. A repeat gets 409 `response-not-replayable`
//! without `Retry-After`: the request is never run twice, and the client
//! needs a new key to run it again. Headers never stored: hop-by-hop ones,
//! `Content-Length`, `Date` and `Set-Cookie`.
//!
//! Error answers are `application/problem+json`.

mod forward;
mod future;
mod layer;
mod policy;
mod scope;
mod stored;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::IntoResponse;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use idem_core::{BoxError, Codec, Fingerprint, Guard, GuardError, Key, Lease, Namespace, Store};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceExt};

use self::forward::{Forward, Forwarded, reply};
pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
pub use self::policy::{ReleasePolicy, ReleasePolicyError};
pub use self::scope::{ClientScope, HeaderScope};
use self::stored::ResponseCodec;
use crate::api::Problem;

/// The body of every response the gateway gives, and of every request it
/// passes on: any body, boxed.
pub struct GatewayBody(UnsyncBoxBody<Bytes, BoxError>);

impl GatewayBody {
    /// Boxes `body`.
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self(body.map_err(Into::into).boxed_unsync())
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

impl fmt::Debug for GatewayBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GatewayBody")
    }
}

/// When the gateway stops waiting for the call it forwards: put in the
/// request's extensions when [`GatewayConfig::upstream_timeout`] is set, so
/// the inner service can give up at the same moment and say why in its own
/// terms (`idem proxy` answers 504 and counts the timeout). Past it the
/// gateway drops the call and answers 504 `upstream-timeout` itself.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamDeadline {
    /// The moment.
    pub at: tokio::time::Instant,
    /// The timeout it was set from.
    pub limit: Duration,
}

impl UpstreamDeadline {
    /// `limit` from now, if there is a limit.
    fn from_now(limit: Option<Duration>) -> Option<Self> {
        limit.map(|limit| Self {
            at: tokio::time::Instant::now() + limit,
            limit,
        })
    }
}

/// The header clients send their key in.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on replayed responses.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How the gateway behaves.
#[derive(Clone)]
pub struct GatewayConfig {
    /// The store namespace for its records (default `http`).
    pub namespace: Namespace,
    /// Methods it covers (default POST and PATCH); others pass through.
    pub methods: Vec<Method>,
    /// Who the client is (default: the `Authorization` header). Keys are
    /// scoped by it, so set it to what authenticates your clients.
    pub client_scope: Arc<dyn ClientScope>,
    /// Refuse covered requests without a key (400) instead of passing them.
    pub require_key: bool,
    /// Treat identical keyless requests from one client within this window
    /// as one (a double click). `None` (default) turns it off; 5 s is the
    /// usual choice. Only requests with a client identity are merged.
    pub keyless_window: Option<Duration>,
    /// The claim's lease, renewed while the request runs (default 60 s).
    pub lease: Lease,
    /// How long a response is replayed (default 24 h).
    pub retention: Duration,
    /// Longest key header, in bytes (default 200; with the client scope the
    /// stored key stays within the store's 255).
    pub max_key_bytes: usize,
    /// Largest request body buffered for fingerprinting (default 16 MiB);
    /// larger requests get 413.
    pub max_request_bytes: usize,
    /// Largest response body stored for replay (default 1 MiB, the store's
    /// default outcome limit); larger ones stream through and are not
    /// replayable.
    pub max_response_bytes: usize,
    /// Upstream statuses that release the key instead of being stored
    /// (default 408, 425, 429 and 5xx).
    pub release: ReleasePolicy,
    /// Run requests unguarded when the store is down (default: answer 503).
    pub fail_open: bool,
    /// The longest a forwarded call may take: to the end of the response
    /// body a guarded call stores, to the response's head for one that is
    /// not guarded (default `None`: no limit). Past it the call is dropped
    /// and the client gets 504 `upstream-timeout`; a guarded call's key is
    /// released: the upstream may have acted, and a retry with the same key
    /// runs the request again, as after a 5xx. Without a limit, a call that
    /// never ends holds its key (its lease is renewed) and every retry gets
    /// 409 until the process stops. The inner service finds the deadline in
    /// the request's extensions ([`UpstreamDeadline`]).
    pub upstream_timeout: Option<Duration>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            namespace: Namespace::new("http").expect("a valid namespace"),
            methods: vec![Method::POST, Method::PATCH],
            client_scope: Arc::new(HeaderScope::default()),
            require_key: false,
            keyless_window: None,
            lease: Lease::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            max_key_bytes: 200,
            max_request_bytes: 16 * 1024 * 1024,
            max_response_bytes: 1024 * 1024,
            release: ReleasePolicy::default(),
            fail_open: false,
            upstream_timeout: None,
        }
    }
}

impl fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("namespace", &self.namespace)
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("keyless_window", &self.keyless_window)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("max_key_bytes", &self.max_key_bytes)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("release", &self.release)
            .field("fail_open", &self.fail_open)
            .field("upstream_timeout", &self.upstream_timeout)
            .finish_non_exhaustive()
    }
}

/// The gateway service; see the [module docs](self).
///
/// A covered request with a key is claimed in the store and then forwarded
/// by a task spawned on the current Tokio runtime, which stores the upstream's answer whatever happens
/// to the caller; [`IdempotencyLayer::wait_detached`] waits for those tasks
/// (at shutdown).
///
/// # Cancel safety
///
/// Dropping the [`ResponseFuture`] (the client timed out or disconnected):
/// - while the request body is being read, nothing has happened: the key
///   was not claimed;
/// - once the key is claimed, the upstream call, storing its answer (or
///   releasing the key under the [`ReleasePolicy`]) and the lease renewals
///   carry on in the spawned task, so a retry gets 409 with `Retry-After`
///   while it runs and the stored answer, replayed, after;
/// - requests that are not guarded (methods not covered, no key) are
///   forwarded in the caller's future and cancelled with it.
#[derive(Clone, Debug)]
pub struct Idempotency<S, I> {
    guard: Guard<S>,
    keyless: Guard<S>,
    config: Arc<GatewayConfig>,
    tasks: TaskTracker,
    inner: I,
}

impl<S: Store + Clone, I> Idempotency<S, I> {
    /// Wraps `inner`.
    pub fn new(store: S, config: Arc<GatewayConfig>, inner: I) -> Self {
        Self::with_tasks(store, config, TaskTracker::new(), inner)
    }

    fn with_tasks(store: S, config: Arc<GatewayConfig>, tasks: TaskTracker, inner: I) -> Self {
        let guard = Guard::new(store)
            .lease(config.lease)
            .retention(config.retention)
            .fail_open(config.fail_open);
        let keyless = guard
            .clone()
            .retention(config.keyless_window.unwrap_or(config.retention));
        Self {
            guard,
            keyless,
            config,
            tasks,
            inner,
        }
    }
}

fn problem(p: Problem) -> Response<GatewayBody> {
    p.into_response().map(GatewayBody::new)
}

fn full(bytes: Bytes) -> GatewayBody {
    GatewayBody::new(Full::new(bytes))
}

/// The key from the header: a token, or a quoted string as the draft has it.
fn parse_key(raw: &HeaderValue, max: usize) -> Result<String, Problem> {
    let bad = |why: &str| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed-idempotency-key",
            "Malformed Idempotency-Key",
            format!("Idempotency-Key {why}; send 1 to {max} visible ASCII characters, e.g. a UUID"),
        )
    };
    let text = raw.to_str().map_err(|_| bad("is not ASCII"))?.trim();
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    if text.is_empty() {
        return Err(bad("is empty"));
    }
    if text.len() > max {
        return Err(bad(&format!("is {} bytes long", text.len())));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("has spaces or control characters"));
    }
    Ok(text.to_owned())
}

/// The scope part of a stored key: a short hash of the client's identity.
fn scope_hash(identity: &[u8]) -> String {
    hex::encode(&Sha256::digest(identity)[..8])
}

fn fingerprint(parts: &http::request::Parts, body: &[u8]) -> Fingerprint {
    let mut h = Sha256::new();
    h.update(parts.method.as_str());
    h.update(b"\n");
    h.update(parts.uri.path());
    h.update(b"\n");
    h.update(parts.uri.query().unwrap_or(""));
    h.update(b"\n");
    h.update(body);
    let digest = h.finalize();
    Fingerprint::from_bytes(digest[..16].try_into().expect("16 bytes"))
}

/// 504: the upstream did not answer within `limit`; logged with `key`, if
/// the call was guarded.
fn timed_out(limit: Duration, key: Option<&Key>) -> Response<GatewayBody> {
    let id = crate::api::new_request_id();
    let limit_ms = limit.as_millis() as u64;
    tracing::warn!(request_id = %id, key = key.map(tracing::field::display), limit_ms, "the upstream did not answer in time");
    let released = match key {
        Some(_) => {
            "the key was released, so a retry with the same Idempotency-Key runs the request \
             again (the upstream may have acted on this one)"
        }
        None => "the request was not guarded",
    };
    problem(
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream-timeout",
            "Upstream timeout",
            format!(
                "the upstream did not answer within {limit_ms} ms; {released} (request id {id})"
            ),
        )
        .request_id(id),
    )
}

fn not_replayable(status: StatusCode, limit: usize) -> Response<GatewayBody> {
    problem(Problem::new(
        StatusCode::CONFLICT,
        "response-not-replayable",
        "Response not replayable",
        format!(
            "the request with this Idempotency-Key was already processed (the upstream answered {status}), \
             but its response body was over the gateway's {limit}-byte replay limit and was not stored; \
             it will not run again: send a new Idempotency-Key to run it again"
        ),
    ))
}

impl<S, I, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S, I>
where
    S: Store + Clone,
    I: Service<Request<GatewayBody>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<GatewayBody>;
    type Error = I::Error;
    type Future = ResponseFuture<I::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness of the inner service is awaited per request (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let this = self.clone();
        ResponseFuture {
            inner: Box::pin(async move { this.handle(req).await }),
        }
    }
}

impl<S, I, ResB> Idempotency<S, I>
where
    S: Store + Clone,
    I: Service<Request<GatewayBody>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    /// Forwards a request that is not guarded, within the upstream timeout.
    async fn pass<ReqB>(
        inner: I,
        config: &GatewayConfig,
        req: Request<ReqB>,
    ) -> Result<Response<GatewayBody>, I::Error>
    where
        ReqB: Body<Data = Bytes> + Send + 'static,
        ReqB::Error: Into<BoxError>,
    {
        let mut req = req.map(GatewayBody::new);
        let Some(deadline) = UpstreamDeadline::from_now(config.upstream_timeout) else {
            return inner.oneshot(req).await.map(|r| r.map(GatewayBody::new));
        };
        req.extensions_mut().insert(deadline);
        match tokio::time::timeout_at(deadline.at, inner.oneshot(req)).await {
            Ok(answer) => answer.map(|r| r.map(GatewayBody::new)),
            Err(_) => Ok(timed_out(deadline.limit, None)),
        }
    }

    async fn handle<ReqB>(self, req: Request<ReqB>) -> Result<Response<GatewayBody>, I::Error>
    where
        ReqB: Body<Data = Bytes> + Send + 'static,
        ReqB::Error: Into<BoxError>,
    {
        let config = self.config.clone();
        if !config.methods.contains(req.method()) {
            return Self::pass(self.inner, &config, req).await;
        }
        let raw_key = match req.headers().get(IDEMPOTENCY_KEY) {
            Some(raw) => match parse_key(raw, config.max_key_bytes) {
                Ok(k) => Some(k),
                Err(p) => return Ok(problem(p)),
            },
            None if config.require_key => {
                return Ok(problem(Problem::new(
                    StatusCode::BAD_REQUEST,
                    "missing-idempotency-key",
                    "Missing Idempotency-Key",
                    format!(
                        "{} requests here need an Idempotency-Key header",
                        req.method()
                    ),
                )));
            }
            None if config.keyless_window.is_none() => {
                return Self::pass(self.inner, &config, req).await;
            }
            None => None,
        };
        let (parts, body) = req.into_parts();
        let identity = config.client_scope.identify(&parts);
        if raw_key.is_none() && identity.is_none() {
            // Without an identity, identical requests of two clients would
            // be merged: keyless requests of unknown clients are not guarded.
            return Self::pass(self.inner, &config, Request::from_parts(parts, body)).await;
        }
        let body = match Limited::new(body, config.max_request_bytes).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Ok(problem(Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too-large",
                    "Too large",
                    format!(
                        "the request body is over the gateway's limit of {} bytes (set `max_request_bytes`)",
                        config.max_request_bytes
                    ),
                )));
            }
            Err(e) => {
                return Ok(problem(Problem::malformed(format!(
                    "reading the request body failed: {e}"
                ))));
            }
        };
        let fp = fingerprint(&parts, &body);
        let scope = identity.map_or_else(|| "anonymous".to_owned(), |id| scope_hash(&id));
        let (store_key, guard) = match &raw_key {
            Some(k) => (format!("{scope}:{k}"), self.guard),
            None => (format!("{scope}:~{}", fp.to_hex()), self.keyless),
        };
        let key = match Key::in_namespace(config.namespace.clone(), store_key) {
            Ok(k) => k,
            Err(e) => return Ok(problem(Problem::invalid(&e))),
        };
        let request = Request::from_parts(parts, full(body));
        let (answer, answered) = oneshot::channel();
        let inner = self.inner;
        self.tasks.spawn(async move {
            let response = Self::guarded(guard, &config, key, fp, inner, request).await;
            // The caller may be gone: the answer is stored all the same.
            let _ = answer.send(response);
        });
        answered.await.unwrap_or_else(|_| {
            Ok(problem(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "the gateway's upstream call ended without an answer (it panicked)",
            )))
        })
    }

    /// Claims `key`, forwards, stores or releases: the detached part.
    async fn guarded(
        guard: Guard<S>,
        config: &GatewayConfig,
        key: Key,
        fp: Fingerprint,
        inner: I,
        request: Request<GatewayBody>,
    ) -> Result<Response<GatewayBody>, I::Error> {
        let store_limit = guard.store().limits().max_outcome_bytes;
        let codec = ResponseCodec {
            max_bytes: store_limit,
        };
        let limit = config.max_response_bytes.min(store_limit);
        let mut ran = false;
        let outcome = guard
            .run_with(
                &codec,
                &key,
                Some(fp),
                |_claim| {
                    ran = true;
                    let mut request = request;
                    let deadline = UpstreamDeadline::from_now(config.upstream_timeout);
                    if let Some(d) = deadline {
                        request.extensions_mut().insert(d);
                    }
                    forward::call_within(
                        deadline,
                        forward::call(inner, request, &config.release, limit),
                    )
                },
                |_| async {},
            )
            .await;
        Ok(match outcome {
            Ok(f) if !ran && f.stored.body_omitted => not_replayable(f.stored.status, limit),
            Ok(f) => reply(f, !ran),
            Err(GuardError::InProgress { retry_after }) => problem(
                Problem::new(
                    StatusCode::CONFLICT,
                    "request-in-progress",
                    "Request in progress",
                    "a request with this Idempotency-Key is still being processed; retry later",
                )
                .retry_after(retry_after),
            ),
            Err(GuardError::Mismatch) => problem(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key reused",
                "this Idempotency-Key was used for a different request (method, path, query or body differ)",
            )),
            Err(GuardError::Handler(Forward::Released(response))) => response,
            Err(GuardError::Handler(Forward::Inner(e))) => return Err(e),
            Err(GuardError::Handler(Forward::Body(e))) => {
                let id = crate::api::new_request_id();
                tracing::warn!(request_id = %id, key = %key, error = %e, "the upstream's response broke off");
                problem(
                    Problem::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream-failed",
                        "Upstream failed",
                        format!(
                            "the upstream's response broke off mid-way; the key was released, so a retry with the same \
                             Idempotency-Key runs the request again (request id {id}: the gateway's log has the cause)"
                        ),
                    )
                    .request_id(id),
                )
            }
            Err(GuardError::Handler(Forward::TimedOut(limit))) => timed_out(limit, Some(&key)),
            Err(GuardError::LeaseLost { outcome }) => {
                match Codec::<Forwarded>::decode(&codec, Some(&outcome)) {
                    Ok(f) if f.stored.body_omitted => not_replayable(f.stored.status, limit),
                    Ok(f) => reply(f, false),
                    Err(e) => problem(Problem::store(idem_core::StoreError::Corrupt(
                        e.to_string(),
                    ))),
                }
            }
            Err(GuardError::Invalid(e)) => problem(Problem::invalid(&e)),
            Err(GuardError::Store(e)) => problem(Problem::store(e)),
            Err(GuardError::Outcome(e)) => problem(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                format!("the stored response could not be read: {e}"),
            )),
            Err(_) => problem(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "the gateway could not handle this request",
            )),
        })
    }
}
