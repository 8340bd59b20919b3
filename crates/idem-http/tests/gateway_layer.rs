//! The gateway is a plain tower layer: here inside an axum app, in process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::MemoryStore;
use idem_http::gateway::{GatewayConfig, IdempotencyLayer};
use tower::ServiceExt;

#[tokio::test]
async fn an_axum_handler_behind_the_layer_runs_once_per_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/pay",
            post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (StatusCode::CREATED, format!("payment {n}")) }
            }),
        )
        .layer(IdempotencyLayer::new(
            MemoryStore::new(),
            GatewayConfig::default(),
        ));
    let call = |key: &'static str, body: &'static str| {
        app.clone().oneshot(
            Request::post("/pay")
                .header("idempotency-key", key)
                .body(Body::from(body))
                .unwrap(),
        )
    };
    let first = call("p-1", "10 EUR").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let second = call("p-1", "10 EUR").await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    let body = second.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "payment 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let reused = call("p-1", "99 EUR").await.unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
