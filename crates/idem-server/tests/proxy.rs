//! `idem proxy` in front of a small upstream that counts what reaches it.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use http::Method;
use support::{Answer, send, start};

#[derive(Default)]
struct Counts {
    orders: AtomicUsize,
    flaky: AtomicUsize,
    big: AtomicUsize,
}

/// The upstream: `/orders` takes a second and answers 201; `/flaky` answers
/// 503 the first time; `/big` answers 2 MiB.
async fn upstream() -> (String, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    let app = Router::new()
        .route(
            "/orders",
            post({
                let c = c.clone();
                move |body: String| async move {
                    let n = c.orders.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(1000)).await;
                    let mut h = HeaderMap::new();
                    h.insert("x-order-id", n.to_string().parse().unwrap());
                    h.insert("set-cookie", "session=secret".parse().unwrap());
                    (
                        StatusCode::CREATED,
                        h,
                        format!("{{\"order\":{n},\"echo\":{body:?}}}"),
                    )
                }
            })
            .get({
                let c = c.clone();
                move || async move { c.orders.load(Ordering::SeqCst).to_string() }
            }),
        )
        .route(
            "/flaky",
            post({
                let c = c.clone();
                move || async move {
                    match c.flaky.fetch_add(1, Ordering::SeqCst) {
                        0 => (StatusCode::SERVICE_UNAVAILABLE, "try again"),
                        _ => (StatusCode::CREATED, "made it"),
                    }
                }
            }),
        )
        .route(
            "/big",
            post(move || async move {
                c.big.fetch_add(1, Ordering::SeqCst);
                vec![b'z'; 2 * 1024 * 1024]
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), counts)
}

async fn post_with(url: &str, key: Option<&str>, auth: Option<&str>, body: &str) -> Answer {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(k) = key {
        headers.push(("idempotency-key", k));
    }
    let bearer;
    if let Some(a) = auth {
        bearer = format!("Bearer {a}");
        headers.push(("authorization", &bearer));
    }
    send(Method::POST, url, &headers, body.to_owned()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_posts_with_one_key_reach_the_upstream_once() {
    let (up, counts) = upstream().await;
    let proxy = Arc::new(start(&["proxy", "--upstream", &up, "--store", "memory://"], &[]).await);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let url = proxy.url("/orders");
            tokio::spawn(
                async move { post_with(&url, Some("order-1"), None, "{\"sku\":\"a\"}").await },
            )
        })
        .collect();
    let mut first = None;
    let mut busy = 0;
    for t in tasks {
        let a = t.await.unwrap();
        match a.status.as_u16() {
            201 => {
                assert!(a.headers.get("idempotent-replayed").is_none());
                assert!(
                    first.replace(a).is_none(),
                    "two callers got a fresh response"
                );
            }
            409 => {
                assert_eq!(a.problem(409), "urn:idem:problem:request-in-progress");
                let retry: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!(retry >= 1);
                busy += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    let first = first.expect("one caller gets the upstream's response");
    assert_eq!(busy, 19);
    assert_eq!(
        counts.orders.load(Ordering::SeqCst),
        1,
        "the upstream ran once"
    );

    let again = post_with(
        &proxy.url("/orders"),
        Some("order-1"),
        None,
        "{\"sku\":\"a\"}",
    )
    .await;
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.headers["x-order-id"], "1");
    assert!(
        again.headers.get("set-cookie").is_none(),
        "cookies are not replayed"
    );
    assert_eq!(counts.orders.load(Ordering::SeqCst), 1);

    // Same key, other body: 422, and the upstream is not called.
    let reused = post_with(
        &proxy.url("/orders"),
        Some("order-1"),
        None,
        "{\"sku\":\"b\"}",
    )
    .await;
    assert_eq!(
        reused.problem(422),
        "urn:idem:problem:idempotency-key-reused"
    );
    // Another client with the same key is another request.
    let other_client = post_with(
        &proxy.url("/orders"),
        Some("order-1"),
        Some("client-b"),
        "{\"sku\":\"a\"}",
    )
    .await;
    assert_eq!(other_client.status, 201);
    assert!(other_client.headers.get("idempotent-replayed").is_none());
    assert_eq!(counts.orders.load(Ordering::SeqCst), 2);
    // GET is not covered: it passes through.
    let count = send(
        Method::GET,
        &proxy.url("/orders"),
        &[("idempotency-key", "order-1")],
        "",
    )
    .await;
    assert_eq!(count.body, "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_and_failures_release_them() {
    let (up, counts) = upstream().await;
    let proxy = start(&["proxy", "--upstream", &up, "--store", "memory://"], &[]).await;
    let spaced = post_with(&proxy.url("/orders"), Some("has space"), None, "{}").await;
    assert_eq!(
        spaced.problem(400),
        "urn:idem:problem:malformed-idempotency-key"
    );
    let long = "k".repeat(201);
    let too_long = post_with(&proxy.url("/orders"), Some(&long), None, "{}").await;
    assert_eq!(
        too_long.problem(400),
        "urn:idem:problem:malformed-idempotency-key"
    );
    assert_eq!(counts.orders.load(Ordering::SeqCst), 0);
    // No key, no window: passed through unguarded.
    let keyless = post_with(&proxy.url("/orders"), None, None, "{}").await;
    assert_eq!(keyless.status, 201);
    assert_eq!(counts.orders.load(Ordering::SeqCst), 1);

    // An upstream 5xx releases the key, so the retry runs.
    let failed = post_with(&proxy.url("/flaky"), Some("f-1"), None, "{}").await;
    assert_eq!(failed.status, 503);
    let retried = post_with(&proxy.url("/flaky"), Some("f-1"), None, "{}").await;
    assert_eq!(retried.status, 201);
    assert_eq!(counts.flaky.load(Ordering::SeqCst), 2);

    // A response too large to store: the first caller gets all of it, a
    // replay gets status and headers, and the upstream runs once.
    let big = post_with(&proxy.url("/big"), Some("b-1"), None, "{}").await;
    assert_eq!(big.status, 200);
    assert_eq!(big.body.len(), 2 * 1024 * 1024);
    let replay = post_with(&proxy.url("/big"), Some("b-1"), None, "{}").await;
    assert_eq!(replay.status, 200);
    assert!(replay.body.is_empty());
    assert_eq!(replay.headers["idempotent-body-omitted"], "true");
    assert_eq!(counts.big.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_keys_and_the_keyless_window() {
    let (up, counts) = upstream().await;
    let strict = start(
        &[
            "proxy",
            "--upstream",
            &up,
            "--store",
            "memory://",
            "--require-key",
        ],
        &[],
    )
    .await;
    let missing = post_with(&strict.url("/orders"), None, None, "{}").await;
    assert_eq!(
        missing.problem(400),
        "urn:idem:problem:missing-idempotency-key"
    );
    assert_eq!(counts.orders.load(Ordering::SeqCst), 0);

    let window = start(
        &[
            "proxy",
            "--upstream",
            &up,
            "--store",
            "memory://",
            "--keyless-window-ms",
            "5000",
        ],
        &[],
    )
    .await;
    let a = post_with(&window.url("/orders"), None, None, "{\"same\":1}").await;
    assert_eq!(a.status, 201);
    let b = post_with(&window.url("/orders"), None, None, "{\"same\":1}").await;
    assert_eq!(b.status, 201);
    assert_eq!(b.headers["idempotent-replayed"], "true");
    assert_eq!(
        counts.orders.load(Ordering::SeqCst),
        1,
        "a double click runs once"
    );
    let c = post_with(&window.url("/orders"), None, None, "{\"same\":2}").await;
    assert!(c.headers.get("idempotent-replayed").is_none());
    assert_eq!(counts.orders.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502_and_releases_the_key() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let proxy = start(&["proxy", "--upstream", &dead, "--store", "memory://"], &[]).await;
    let a = post_with(&proxy.url("/orders"), Some("d-1"), None, "{}").await;
    assert_eq!(a.problem(502), "urn:idem:problem:upstream-failed");
    // Released: the retry tries the upstream again (and fails again), it is
    // not told the request is in progress or done.
    let b = post_with(&proxy.url("/orders"), Some("d-1"), None, "{}").await;
    assert_eq!(b.problem(502), "urn:idem:problem:upstream-failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish() {
    let (up, counts) = upstream().await;
    let proxy = start(&["proxy", "--upstream", &up, "--store", "memory://"], &[]).await;
    let url = proxy.url("/orders");
    // The upstream takes a second; stop the proxy half way through.
    let in_flight = tokio::spawn(async move { post_with(&url, Some("late-1"), None, "{}").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        counts.orders.load(Ordering::SeqCst),
        1,
        "the request reached the upstream"
    );
    let code = proxy.terminate().await;
    let answer = in_flight.await.unwrap();
    assert_eq!(
        answer.status, 201,
        "the in-flight request was finished, not cut"
    );
    assert_eq!(code, 0);
}
