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

#[tokio::test]
async fn a_handler_past_the_upstream_timeout_is_a_504_and_frees_its_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let config = GatewayConfig {
        upstream_timeout: Some(std::time::Duration::from_millis(200)),
        ..GatewayConfig::default()
    };
    let app = Router::new()
        .route(
            "/pay",
            post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n == 1 {
                        std::future::pending::<()>().await;
                    }
                    (StatusCode::CREATED, format!("payment {n}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new(), config));
    let call = || {
        app.clone().oneshot(
            Request::post("/pay")
                .header("idempotency-key", "t-1")
                .body(Body::from("10 EUR"))
                .unwrap(),
        )
    };
    let first = call().await.unwrap();
    assert_eq!(first.status(), StatusCode::GATEWAY_TIMEOUT);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:upstream-timeout");
    assert!(problem["request_id"].is_string(), "{problem}");
    // Released: the retry runs the handler again and its answer is stored.
    let second = call().await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    let third = call().await.unwrap();
    assert_eq!(third.headers()["idempotent-replayed"], "true");
    let body = third.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "payment 2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
