//! When the store fails, the API answers 503 with `Retry-After` and
//! `/readyz` says not ready; the gateway fails closed the same way.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::MemoryStore;
use idem_http::api::{ApiConfig, ApiState, Auth, router};
use idem_http::gateway::{GatewayConfig, IdempotencyLayer};
use idem_testkit::faults::Switchable;
use tower::ServiceExt;

async fn call(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, http::HeaderMap, serde_json::Value) {
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        serde_json::from_slice(&bytes).unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_failed_store_is_a_503_with_retry_after() {
    let store = Switchable::new(MemoryStore::new());
    let app = router(ApiState {
        store: Arc::new(store.clone()),
        config: ApiConfig::default(),
        auth: Auth::default(),
        metrics: None,
        detached: Default::default(),
    });
    let begin = || {
        Request::post("/v1/orders/begin")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"key":"k"}"#))
            .unwrap()
    };
    assert_eq!(call(&app, begin()).await.0, StatusCode::OK);
    store.set_down(true);
    let (status, headers, problem) = call(&app, begin()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(problem["type"], "urn:idem:problem:store-unavailable");
    let ready = Request::get("/readyz").body(Body::empty()).unwrap();
    assert_eq!(call(&app, ready).await.0, StatusCode::SERVICE_UNAVAILABLE);
    let live = Request::get("/healthz").body(Body::empty()).unwrap();
    assert_eq!(
        call(&app, live).await.0,
        StatusCode::OK,
        "the process itself is alive"
    );
    store.set_down(false);
    let (status, _, answer) = call(&app, begin()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer["status"], "in_progress",
        "nothing was lost while down"
    );
}

#[tokio::test]
async fn the_gateway_fails_closed_when_the_store_is_down() {
    let store = Switchable::new(MemoryStore::new());
    let app = axum::Router::new()
        .route("/pay", axum::routing::post(|| async { "paid" }))
        .layer(IdempotencyLayer::new(
            store.clone(),
            GatewayConfig::default(),
        ));
    store.set_down(true);
    let req = Request::post("/pay")
        .header("idempotency-key", "k-1")
        .body(Body::from("x"))
        .unwrap();
    let (status, headers, problem) = call(&app, req).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(problem["type"], "urn:idem:problem:store-unavailable");
}
