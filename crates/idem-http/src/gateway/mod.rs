//! The `Idempotency-Key` gateway (DESIGN.md §6), after the IETF
//! Idempotency-Key draft and Stripe's documented behaviour.
//!
//! For covered methods (POST and PATCH by default):
//! - The key comes from the `Idempotency-Key` header (a plain token or a
//!   quoted string; 1 to [`GatewayConfig::max_key_bytes`] visible ASCII
//!   bytes), scoped by the client: a hash of its `Authorization` header, so
//!   two clients never see each other's responses.
//! - The fingerprint is SHA-256 of method, path, query and body.
//! - First request: claim, forward, store status, headers and body. An
//!   upstream 5xx or failure releases the key, so the client may retry.
//! - Repeat after completion: the stored response, with
//!   `Idempotent-Replayed: true`.
//! - Repeat while the first is running: 409 with `Retry-After`.
//! - Same key, other content: 422. Malformed key: 400. Missing key: passed
//!   through, or 400 when [`GatewayConfig::require_key`] is set, or — with
//!   [`GatewayConfig::keyless_window`] — identical requests from one client
//!   within the window count as one.
//!
//! Responses whose body would take the stored record over the store's
//! `max_outcome_bytes` are still returned in full to the first caller, and
//! the request still counts as done (it is never run twice); replays of it
//! carry the status and headers, an empty body, and
//! `Idempotent-Body-Omitted: true`. Headers never stored: hop-by-hop ones,
//! `Content-Length`, `Date` and `Set-Cookie`.
//!
//! Error answers are `application/problem+json`.

mod future;
mod layer;
mod stored;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::IntoResponse;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use idem_core::{BoxError, Codec, Fingerprint, Guard, GuardError, Key, Lease, Namespace, Store};
use sha2::{Digest, Sha256};
use tower::{Service, ServiceExt};

pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
use self::stored::{ResponseCodec, StoredResponse};
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

impl std::fmt::Debug for GatewayBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayBody")
    }
}

/// The header clients send their key in.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on replayed responses.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Set on replays whose body was too large to store.
pub const IDEMPOTENT_BODY_OMITTED: HeaderName = HeaderName::from_static("idempotent-body-omitted");

/// How the gateway behaves.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The store namespace for its records (default `http`).
    pub namespace: Namespace,
    /// Methods it covers (default POST and PATCH); others pass through.
    pub methods: Vec<Method>,
    /// Refuse covered requests without a key (400) instead of passing them.
    pub require_key: bool,
    /// Treat identical keyless requests from one client within this window
    /// as one (a double click). `None` (default) turns it off; 5 s is the
    /// usual choice.
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
    /// Run requests unguarded when the store is down (default: answer 503).
    pub fail_open: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            namespace: Namespace::new("http").expect("a valid namespace"),
            methods: vec![Method::POST, Method::PATCH],
            require_key: false,
            keyless_window: None,
            lease: Lease::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            max_key_bytes: 200,
            max_request_bytes: 16 * 1024 * 1024,
            fail_open: false,
        }
    }
}

/// The gateway service; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Idempotency<S, I> {
    guard: Guard<S>,
    keyless: Guard<S>,
    config: Arc<GatewayConfig>,
    inner: I,
}

impl<S: Store + Clone, I> Idempotency<S, I> {
    /// Wraps `inner`.
    pub fn new(store: S, config: Arc<GatewayConfig>, inner: I) -> Self {
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
            inner,
        }
    }
}

fn boxed<B>(body: B) -> GatewayBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    GatewayBody::new(body)
}

fn problem(p: Problem) -> Response<GatewayBody> {
    p.into_response().map(boxed)
}

fn full(bytes: Bytes) -> GatewayBody {
    boxed(Full::new(bytes))
}

/// Why a guarded request did not produce a response to store.
enum Forward<E> {
    /// The upstream answered 5xx: released, passed on.
    Upstream(Response<GatewayBody>),
    /// The inner service failed: released, error passed on.
    Inner(E),
    /// The upstream's body failed mid-way: released, 502.
    Body(BoxError),
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

/// Who is asking: a hash of the `Authorization` header, so keys of two
/// clients never meet.
fn client_scope(headers: &http::HeaderMap) -> String {
    match headers.get(header::AUTHORIZATION) {
        Some(v) => hex::encode(&Sha256::digest(v.as_bytes())[..8]),
        None => "anonymous".to_owned(),
    }
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

fn reply(stored: StoredResponse, replayed: bool) -> Response<GatewayBody> {
    let mut response = Response::new(full(stored.body));
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        headers.append(name, value);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        if stored.body_omitted {
            headers.insert(IDEMPOTENT_BODY_OMITTED, HeaderValue::from_static("true"));
        }
    }
    response
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
    async fn forward(
        inner: I,
        req: Request<GatewayBody>,
    ) -> Result<Response<GatewayBody>, I::Error> {
        inner.oneshot(req).await.map(|r| r.map(boxed))
    }

    async fn handle<ReqB>(self, req: Request<ReqB>) -> Result<Response<GatewayBody>, I::Error>
    where
        ReqB: Body<Data = Bytes> + Send + 'static,
        ReqB::Error: Into<BoxError>,
    {
        let config = &self.config;
        if !config.methods.contains(req.method()) {
            return Self::forward(self.inner, req.map(boxed)).await;
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
                return Self::forward(self.inner, req.map(boxed)).await;
            }
            None => None,
        };
        let (parts, body) = req.into_parts();
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
        let scope = client_scope(&parts.headers);
        let (store_key, guard) = match &raw_key {
            Some(k) => (format!("{scope}:{k}"), &self.guard),
            None => (format!("{scope}:~{}", fp.to_hex()), &self.keyless),
        };
        let key = match Key::in_namespace(config.namespace.clone(), store_key) {
            Ok(k) => k,
            Err(e) => return Ok(problem(Problem::invalid(&e))),
        };
        let codec = ResponseCodec {
            max_bytes: guard.store().limits().max_outcome_bytes,
        };
        let ran = AtomicBool::new(false);
        let inner = self.inner.clone();
        let request = Request::from_parts(parts, full(body));
        let outcome = guard
            .run_with(
                &codec,
                &key,
                Some(fp),
                |_claim| async {
                    ran.store(true, Ordering::Relaxed);
                    let response = Self::forward(inner, request)
                        .await
                        .map_err(Forward::Inner)?;
                    if response.status().is_server_error() {
                        return Err(Forward::Upstream(response));
                    }
                    let (parts, body) = response.into_parts();
                    let body = body.collect().await.map_err(Forward::Body)?.to_bytes();
                    Ok(StoredResponse::from_parts(
                        parts.status,
                        &parts.headers,
                        body,
                    ))
                },
                |_| async {},
            )
            .await;
        let replayed = !ran.load(Ordering::Relaxed);
        Ok(match outcome {
            Ok(stored) => reply(stored, replayed),
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
            Err(GuardError::Handler(Forward::Upstream(response))) => response,
            Err(GuardError::Handler(Forward::Inner(e))) => return Err(e),
            Err(GuardError::Handler(Forward::Body(e))) => problem(Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream failed",
                format!("reading the upstream response failed: {e}"),
            )),
            Err(GuardError::LeaseLost { outcome }) => match codec.decode(Some(&outcome)) {
                Ok(stored) => reply(stored, false),
                Err(e) => problem(Problem::store(idem_core::StoreError::Corrupt(
                    e.to_string(),
                ))),
            },
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
