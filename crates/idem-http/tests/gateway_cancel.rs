//! A caller that goes away never cancels the upstream call: the gateway
//! finishes it, stores the answer, and the retry gets it replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use idem_core::MemoryStore;
use idem_http::gateway::{GatewayConfig, IdempotencyLayer};
use tower::{Layer, ServiceExt};

/// A handler that takes 300 ms, behind the layer; counts its runs.
fn app(layer: &IdempotencyLayer<MemoryStore>) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = Router::new().route(
        "/pay",
        post(move || {
            let counter = counter.clone();
            async move {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                (StatusCode::CREATED, format!("payment {n}"))
            }
        }),
    );
    (Router::new().fallback_service(layer.layer(handler)), runs)
}

async fn pay(app: &Router) -> Response<Body> {
    app.clone()
        .oneshot(
            Request::post("/pay")
                .header("idempotency-key", "p-1")
                .body(Body::from("10 EUR"))
                .unwrap(),
        )
        .await
        .unwrap()
}

async fn text(response: Response<Body>) -> String {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_response_future_mid_call_still_completes_the_record() {
    let layer = IdempotencyLayer::new(MemoryStore::new(), GatewayConfig::default());
    let (app, runs) = app(&layer);
    // The caller gives up while the handler runs.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), pay(&app))
            .await
            .is_err()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler started");
    let busy = pay(&app).await;
    assert_eq!(busy.status(), StatusCode::CONFLICT, "still running");
    assert!(busy.headers().contains_key("retry-after"));
    // The detached call finishes and stores its answer without the caller.
    tokio::time::timeout(Duration::from_secs(5), layer.wait_detached())
        .await
        .expect("the detached call finishes");
    let retry = pay(&app).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(text(retry).await, "payment 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_future_at_any_point_leaves_the_key_usable_and_run_once() {
    // Drop the caller's future at many points of its life: before the
    // claim, during the call, around the store's completion.
    for after_ms in [0, 1, 2, 5, 10, 50, 150, 290, 299, 300, 301, 305, 320] {
        let layer = IdempotencyLayer::new(MemoryStore::new(), GatewayConfig::default());
        let (app, runs) = app(&layer);
        let _ = tokio::time::timeout(Duration::from_millis(after_ms), pay(&app)).await;
        layer.wait_detached().await;
        let answer = pay(&app).await;
        assert_eq!(
            answer.status(),
            StatusCode::CREATED,
            "dropped after {after_ms} ms"
        );
        let ran = runs.load(Ordering::SeqCst);
        assert_eq!(
            ran, 1,
            "dropped after {after_ms} ms: the handler ran {ran} times"
        );
        assert_eq!(text(answer).await, "payment 1");
    }
}
