//! Keys are scoped by the client, as the `ClientScope` says; the keyless
//! window never merges requests of clients it cannot tell apart.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use idem_core::MemoryStore;
use idem_http::gateway::{GatewayConfig, HeaderScope, IdempotencyLayer, ReleasePolicy};
use tower::ServiceExt;

fn app(config: GatewayConfig) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    match n {
                        1 => (StatusCode::SERVICE_UNAVAILABLE, format!("order {n}")),
                        _ => (StatusCode::CREATED, format!("order {n}")),
                    }
                }
            }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new(), config));
    (app, runs)
}

async fn send(app: &Router, headers: &[(&str, &str)]) -> http::Response<Body> {
    let mut req = Request::post("/orders");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.clone()
        .oneshot(req.body(Body::from("{}")).unwrap())
        .await
        .unwrap()
}

fn replayed(r: &http::Response<Body>) -> bool {
    r.headers().contains_key("idempotent-replayed")
}

#[tokio::test]
async fn a_session_cookie_scopes_keys_and_the_keyless_window() {
    let (app, runs) = app(GatewayConfig {
        client_scope: Arc::new(HeaderScope::from_cookie("session")),
        keyless_window: Some(Duration::from_secs(5)),
        release: ReleasePolicy::none(),
        ..GatewayConfig::default()
    });
    let alice = [("cookie", "session=alice"), ("idempotency-key", "k")];
    let bob = [("cookie", "session=bob"), ("idempotency-key", "k")];
    // A 503 is stored under this policy.
    let first = send(&app, &alice).await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(replayed(&send(&app, &alice).await));
    assert!(
        !replayed(&send(&app, &bob).await),
        "bob has his own key space"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Keyless: one client's double click is one request ...
    let click = [("cookie", "session=alice")];
    assert!(!replayed(&send(&app, &click).await));
    assert!(replayed(&send(&app, &click).await));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // ... and requests without an identity are never merged.
    assert!(!replayed(&send(&app, &[]).await));
    assert!(!replayed(&send(&app, &[]).await));
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}
