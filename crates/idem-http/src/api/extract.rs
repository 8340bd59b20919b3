//! What the handlers take from a request: the checked namespace and the JSON
//! body, with refusals as problems.

use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, StatusCode, header};
use idem_core::Namespace;
use serde::de::DeserializeOwned;

use super::Problem;

/// The `{ns}` path segment, checked.
pub(super) struct Ns(pub Namespace);

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

/// A request body declared as JSON (`application/json` or any `+json`
/// type), read into `T`.
pub(super) struct Payload<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Payload<T> {
    type Rejection = Problem;
    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let JsonBody(bytes) = JsonBody::from_request(req, state).await?;
        decode(&bytes).map(Payload)
    }
}

/// A request body declared as JSON, not yet read into anything: for a
/// handler that reads it itself, then with [`decode`] if that fails.
pub(super) struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = Problem;
    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        // Refused before the body is read: a web page may post `text/plain`
        // to a local server without asking, but not `application/json`.
        let declared = req.headers().get(header::CONTENT_TYPE);
        if !declared.is_some_and(is_json) {
            return Err(Problem::not_json(
                declared.map(|t| t.to_str().unwrap_or("(not text)")),
            ));
        }
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .copied()
            .unwrap_or(BodyLimit {
                bytes: usize::MAX,
                timeout: Duration::MAX,
            });
        // A body trickled in a byte at a time would hold the connection and
        // its buffer for as long as the client likes.
        let read = tokio::time::timeout(limit.timeout, Bytes::from_request(req, state));
        match read.await {
            Ok(Ok(bytes)) => Ok(JsonBody(bytes)),
            Ok(Err(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(Problem::body_too_large(limit.bytes))
            }
            Ok(Err(e)) => Err(Problem::malformed(e.body_text())),
            Err(_) => Err(Problem::body_timeout(limit.timeout)),
        }
    }
}

/// A JSON body read into `T`, or the problem that says why not.
pub(super) fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(body)
        .map_err(|e| Problem::malformed(format!("the body is not the JSON expected: {e}")))
}

/// `application/json` or `type/subtype+json`, any case, with or without
/// parameters such as `charset`.
fn is_json(content_type: &HeaderValue) -> bool {
    let Ok(t) = content_type.to_str() else {
        return false;
    };
    let essence = t.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let json = |s: &str| s.eq_ignore_ascii_case("json");
    let suffix = subtype
        .rsplit_once('+')
        .is_some_and(|(name, suffix)| !name.is_empty() && json(suffix));
    !kind.is_empty() && (kind.eq_ignore_ascii_case("application") && json(subtype) || suffix)
}

/// The body's limits: its size, and the time it may take to arrive.
#[derive(Clone, Copy)]
pub(super) struct BodyLimit {
    pub bytes: usize,
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_application_json_or_a_json_suffix_with_any_parameters() {
        for declared in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            "application/merge-patch+json",
            "application/vnd.api+json; ext=x",
        ] {
            assert!(is_json(&HeaderValue::from_static(declared)), "{declared}");
        }
        for declared in [
            "text/plain",
            "text/plain; charset=json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "application/json-seq",
            "json",
            "/json",
            "application/+json",
            "",
        ] {
            assert!(!is_json(&HeaderValue::from_static(declared)), "{declared}");
        }
    }
}
