//! What runs around the handlers: authorization of `/v1/*`, and request
//! metrics for every route.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header;

use super::extract::{BodyLimit, Ns};
use super::telemetry;
use super::{Problem, Shared};

/// Refuses a `/v1/{ns}/*` request whose namespace is malformed or whose
/// bearer token may not use it. Refusals are counted without the namespace:
/// labels never come from input no token vouched for.
pub(super) async fn authorize(
    State(state): Shared,
    ns: Result<Ns, Problem>,
    mut req: Request,
    next: Next,
) -> Response {
    let ns = match ns {
        Ok(Ns(ns)) => ns,
        Err(p) => {
            telemetry::refused("invalid_namespace");
            return p.into_response();
        }
    };
    if let Err(p) = state
        .auth
        .check(req.headers().get(header::AUTHORIZATION), &ns)
    {
        telemetry::refused(if p.status == 401 {
            "unauthorized"
        } else {
            "forbidden"
        });
        return p.into_response();
    }
    req.extensions_mut().insert(BodyLimit {
        bytes: state.config.max_body_bytes,
        timeout: state.config.body_timeout,
    });
    next.run(req).await
}

/// Counts requests and times them by route.
pub(super) async fn observe(req: Request, next: Next) -> Response {
    // `MatchedPath` holds an `Arc<str>`: a clone is a count, not a copy.
    let route = req.extensions().get::<MatchedPath>().cloned();
    let start = Instant::now();
    let response = next.run(req).await;
    let route = route.as_ref().map_or("unmatched", |p| p.as_str());
    telemetry::request(route, response.status(), start.elapsed());
    response
}
