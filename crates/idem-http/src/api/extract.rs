//! What the handlers take from a request: the checked namespace and the JSON
//! body, with refusals as problems.

use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use bytes::Bytes;
use http::StatusCode;
use http::request::Parts;
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

/// A request body read as JSON into `T`, whatever its `Content-Type`.
pub(super) struct Payload<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Payload<T> {
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
            .map(Payload)
            .map_err(|e| Problem::malformed(format!("the body is not the JSON expected: {e}")))
    }
}

/// The body limit, for the problem that names it.
#[derive(Clone, Copy)]
pub(super) struct BodyLimit(pub usize);
