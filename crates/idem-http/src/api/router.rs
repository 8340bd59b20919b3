//! The routes, and the layers around them.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};

use super::handlers::{
    begin, begin_batch, complete, complete_batch, extend, healthz, openapi, readyz, record, release,
};
use super::middleware::{authorize, observe};
use super::telemetry::metrics_text;
use super::{ApiState, Problem};

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
        .route_layer(from_fn_with_state(state.clone(), authorize));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi))
        .fallback(|| async { Problem::not_found("no such path; see /openapi.json") })
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .layer(from_fn(observe))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}
