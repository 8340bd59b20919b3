//! Errors as `application/problem+json` (RFC 9457), each with a stable
//! `type`.

use std::time::Duration;

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use idem_core::{InvalidInput, StoreError};
use serde::Serialize;
use utoipa::ToSchema;

/// An error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// A stable identifier of the kind of problem, e.g.
    /// `urn:idem:problem:stale-token`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong this time, and what to change.
    pub detail: String,
    /// Names this failure in the server's log, which has its cause (the
    /// cause itself stays out of the answer). Only on failures whose cause
    /// is logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(skip)]
    #[schema(ignore)]
    retry_after: Option<Duration>,
    #[serde(skip)]
    #[schema(ignore)]
    www_authenticate: bool,
}

impl Problem {
    /// A problem of kind `urn:idem:problem:{slug}`.
    pub fn new(
        status: StatusCode,
        slug: &str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind: format!("urn:idem:problem:{slug}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            request_id: None,
            retry_after: None,
            www_authenticate: false,
        }
    }

    /// 400: the request could not be read (not JSON, wrong fields).
    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed-request",
            "Malformed request",
            detail,
        )
    }

    /// 400, or 413 for an outcome over its limit: the store refused the
    /// input.
    pub fn invalid(e: &InvalidInput) -> Self {
        let too_large = |e: &InvalidInput| matches!(e, InvalidInput::OutcomeTooLarge { .. });
        let large = match e {
            InvalidInput::InItem { error, .. } => too_large(error),
            e => too_large(e),
        };
        if large {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "Too large",
                e.to_string(),
            )
        } else {
            Self::new(
                StatusCode::BAD_REQUEST,
                "invalid-input",
                "Invalid input",
                e.to_string(),
            )
        }
    }

    /// 413: the body is over the server's limit.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Too large",
            format!("the request body is over the limit of {limit} bytes (set `max_body_bytes`)"),
        )
    }

    /// 408: the body did not arrive within `limit` of the headers.
    pub fn body_timeout(limit: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request-timeout",
            "Request timeout",
            format!(
                "the request body did not arrive within {} ms of its headers (set `read_timeout_ms`); send the whole body at once",
                limit.as_millis()
            ),
        )
    }

    /// 415: the body is not declared as JSON; `declared` is its
    /// `Content-Type`, if any.
    pub fn not_json(declared: Option<&str>) -> Self {
        let found = match declared {
            Some(t) => format!("the body is declared as {t:?}"),
            None => "the body has no Content-Type".to_owned(),
        };
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            format!(
                "{found}; send it as JSON with `Content-Type: application/json` (curl: --json)"
            ),
        )
    }

    /// 409: the token does not own the key.
    pub fn stale(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "stale-token", "Stale token", detail)
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 405.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "this path does not take that method; see /openapi.json",
        )
    }

    /// 401: no bearer token, or an unknown one.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            detail,
        );
        p.www_authenticate = true;
        p
    }

    /// 403: the token may not use this namespace.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    /// 503 with `Retry-After`, or 400/413 for refused input.
    pub fn store(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(e) => Self::invalid(&e),
            StoreError::CapacityExceeded { .. } => {
                let mut p = Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "capacity-exceeded",
                    "Store full",
                    e.to_string(),
                );
                p.retry_after = Some(Duration::from_secs(1));
                p
            }
            e => {
                let mut p = Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store-unavailable",
                    "Store unavailable",
                    e.to_string(),
                );
                p.retry_after = Some(Duration::from_secs(1));
                p
            }
        }
    }
}

impl Problem {
    /// Carries `id` (from [`new_request_id`]) as `request_id`, the name
    /// under which the cause was logged.
    pub fn request_id(mut self, id: String) -> Self {
        self.request_id = Some(id);
        self
    }

    /// Adds a `Retry-After` header (whole seconds, at least 1).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

/// A new id for a failure whose cause goes to the log and not to the
/// client: the process's start (seconds since the epoch, hex) and a count,
/// e.g. `6757a1c2-17`. Unique within a process, and across restarts a
/// second apart.
pub fn new_request_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    static STARTED: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let started = *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let n = COUNT.fetch_add(1, Ordering::Relaxed) + 1;
    format!("{started:x}-{n}")
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (retry_after, www_authenticate) = (self.retry_after, self.www_authenticate);
        let mut response = (status, Json(self)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, secs.max(1).into());
        }
        if www_authenticate {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
