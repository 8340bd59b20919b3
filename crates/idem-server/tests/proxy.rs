//! `idem proxy` in front of a small upstream that counts what reaches it.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use support::{Answer, Process, client, run, send, start};

#[derive(Default)]
struct Counts {
    orders: AtomicUsize,
    flaky: AtomicUsize,
    big: AtomicUsize,
    slow: AtomicUsize,
    limited: AtomicUsize,
    grpc: AtomicUsize,
    /// Lets `/big` send its last chunk.
    big_gate: tokio::sync::Notify,
}

/// Size of `/big`'s answer: four chunks of 512 KiB, over the 1 MiB replay
/// limit.
const BIG: usize = 4 * CHUNK;
const CHUNK: usize = 512 * 1024;

/// The upstream: `/orders` takes a second and answers 201; `/flaky` answers
/// 503 the first time; `/big` streams 2 MiB, its last chunk only once
/// `big_gate` opens; `/slow/{n}` takes 400 ms; `/limited` answers 429 the
/// first time; `/grpc` answers with `grpc-status` in its trailers.
async fn upstream() -> (String, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    let app = Router::new()
        .route(
            "/slow/{n}",
            post({
                let c = c.clone();
                move |Path(n): Path<String>| async move {
                    let call = c.slow.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    (StatusCode::CREATED, format!("order {n}, call {call}"))
                }
            }),
        )
        .route(
            "/limited",
            fails_once(&c, |c| &c.limited, StatusCode::TOO_MANY_REQUESTS),
        )
        .route(
            "/grpc",
            post({
                let c = c.clone();
                move || async move {
                    let n = c.grpc.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    trailers.insert("grpc-message", format!("call-{n}").parse().unwrap());
                    let frames = [
                        Frame::data(Bytes::from_static(b"reply")),
                        Frame::trailers(trailers),
                    ];
                    let body = StreamBody::new(futures_util::stream::iter(
                        frames.map(Ok::<_, Infallible>),
                    ));
                    (
                        [
                            ("content-type", "application/grpc"),
                            ("trailer", "grpc-status, grpc-message"),
                        ],
                        Body::new(body),
                    )
                        .into_response()
                }
            }),
        )
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
            fails_once(&c, |c| &c.flaky, StatusCode::SERVICE_UNAVAILABLE),
        )
        .route(
            "/big",
            post(move || async move {
                c.big.fetch_add(1, Ordering::SeqCst);
                let chunks = futures_util::stream::unfold(0, move |i| {
                    let c = c.clone();
                    async move {
                        if i * CHUNK == BIG {
                            return None;
                        }
                        if (i + 1) * CHUNK == BIG {
                            c.big_gate.notified().await;
                        }
                        let chunk = Frame::data(Bytes::from(vec![b'z'; CHUNK]));
                        Some((Ok::<_, Infallible>(chunk), i + 1))
                    }
                });
                Body::new(StreamBody::new(chunks))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), counts)
}

/// Starts `idem proxy` in front of `upstream` on a memory store, with `args`.
async fn start_proxy(upstream: &str, args: &[&str]) -> Process {
    let mut all = vec!["proxy", "--upstream", upstream, "--store", "memory://"];
    all.extend(args);
    start(&all, &[]).await
}

/// Runs `idem proxy` with `args`, which it must refuse (exit 2): its
/// error message.
fn refused(upstream: &str, args: &[&str]) -> String {
    let mut all = vec!["proxy", "--upstream", upstream, "--store", "memory://"];
    all.extend(args);
    let (code, _, err) = run(&all, &[]);
    assert_eq!(code, 2, "{err}");
    err
}

/// A route that answers `first` on its first call, 201 after; counted in
/// `count`.
fn fails_once(
    c: &Arc<Counts>,
    count: fn(&Counts) -> &AtomicUsize,
    first: StatusCode,
) -> MethodRouter {
    let c = c.clone();
    post(move || async move {
        match count(&c).fetch_add(1, Ordering::SeqCst) {
            0 => (first, "not now"),
            _ => (StatusCode::CREATED, "made it"),
        }
    })
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
    let proxy = Arc::new(start_proxy(&up, &[]).await);
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
    let proxy = start_proxy(&up, &[]).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_to_store_streams_through_and_is_not_replayed() {
    let (up, counts) = upstream().await;
    let proxy = start_proxy(&up, &[]).await;
    let request = Request::post(proxy.url("/big"))
        .header("idempotency-key", "b-1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client().request(request))
        .await
        .expect("the head arrives before the body is complete")
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut received = 0;
    // The upstream holds back its last chunk: what arrived before it was
    // streamed through, not held by the gateway.
    while received < BIG - CHUNK {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the first 1.5 MiB stream through while the upstream is still sending")
            .unwrap()
            .unwrap();
        received += frame.into_data().map_or(0, |d| d.len());
    }
    counts.big_gate.notify_one();
    received += body.collect().await.unwrap().to_bytes().len();
    assert_eq!(received, BIG, "the first caller gets all of it");

    let repeat = post_with(&proxy.url("/big"), Some("b-1"), None, "{}").await;
    assert_eq!(
        repeat.problem(409),
        "urn:idem:problem:response-not-replayable"
    );
    assert!(
        repeat.headers.get("retry-after").is_none(),
        "retrying cannot help"
    );
    assert_eq!(
        counts.big.load(Ordering::SeqCst),
        1,
        "the upstream ran once"
    );

    let err = refused(
        &up,
        &[
            "--max-outcome-bytes",
            "1000",
            "--max-response-bytes",
            "2000",
        ],
    );
    assert!(
        err.contains("max_response_bytes") && err.contains("--max-outcome-bytes"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_keys_and_the_keyless_window() {
    let (up, counts) = upstream().await;
    let strict = start_proxy(&up, &["--require-key"]).await;
    let missing = post_with(&strict.url("/orders"), None, None, "{}").await;
    assert_eq!(
        missing.problem(400),
        "urn:idem:problem:missing-idempotency-key"
    );
    assert_eq!(counts.orders.load(Ordering::SeqCst), 0);

    // The window merges requests of one client, so it must know who that is.
    let err = refused(&up, &["--keyless-window-ms", "5000"]);
    assert!(err.contains("--scope-header"), "{err}");

    let window = start_proxy(
        &up,
        &[
            "--keyless-window-ms",
            "5000",
            "--scope-header",
            "Authorization",
        ],
    )
    .await;
    let a = post_with(&window.url("/orders"), None, Some("alice"), "{\"same\":1}").await;
    assert_eq!(a.status, 201);
    let b = post_with(&window.url("/orders"), None, Some("alice"), "{\"same\":1}").await;
    assert_eq!(b.status, 201);
    assert_eq!(b.headers["idempotent-replayed"], "true");
    assert_eq!(
        counts.orders.load(Ordering::SeqCst),
        1,
        "a double click runs once"
    );
    let c = post_with(&window.url("/orders"), None, Some("alice"), "{\"same\":2}").await;
    assert!(c.headers.get("idempotent-replayed").is_none());
    assert_eq!(counts.orders.load(Ordering::SeqCst), 2);
    // Another client's identical request is its own.
    let d = post_with(&window.url("/orders"), None, Some("bob"), "{\"same\":1}").await;
    assert!(d.headers.get("idempotent-replayed").is_none());
    assert_eq!(counts.orders.load(Ordering::SeqCst), 3);
    // Clients without an identity are never merged.
    for _ in 0..2 {
        let anonymous = post_with(&window.url("/orders"), None, None, "{\"same\":1}").await;
        assert!(anonymous.headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(counts.orders.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502_and_releases_the_key() {
    let proxy = start_proxy(&support::nothing_listening(), &[]).await;
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
    let proxy = start_proxy(&up, &[]).await;
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

/// Posts to `/slow/{n}` with key `slow-{n}`, giving up after `timeout`.
async fn post_slow(proxy: &str, n: usize, timeout: Duration) -> Option<Answer> {
    let url = format!("{proxy}/slow/{n}");
    let key = format!("slow-{n}");
    tokio::time::timeout(timeout, post_with(&url, Some(&key), None, "{}"))
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_and_retries_gets_the_first_answer_replayed() {
    let (up, counts) = upstream().await;
    let proxy = start_proxy(&up, &[]).await;
    let base = proxy.base.clone();
    // Five clients give up after 50 ms on an upstream that takes 400 ms.
    let clients: Vec<_> = (0..5)
        .map(|n| {
            let base = base.clone();
            tokio::spawn(async move {
                let first = post_slow(&base, n, Duration::from_millis(50)).await;
                assert!(first.is_none(), "the client gave up");
                tokio::time::sleep(Duration::from_millis(100)).await;
                let busy = post_slow(&base, n, Duration::from_secs(10)).await.unwrap();
                assert_eq!(busy.problem(409), "urn:idem:problem:request-in-progress");
                assert!(busy.headers.contains_key("retry-after"));
                tokio::time::sleep(Duration::from_millis(450)).await;
                post_slow(&base, n, Duration::from_secs(10)).await.unwrap()
            })
        })
        .collect();
    for (n, client) in clients.into_iter().enumerate() {
        let retry = client.await.unwrap();
        assert_eq!(retry.status, 201, "{:?}", retry.body);
        assert_eq!(retry.headers["idempotent-replayed"], "true");
        assert!(
            String::from_utf8_lossy(&retry.body).starts_with(&format!("order {n}, call ")),
            "{:?}",
            retry.body
        );
    }
    assert_eq!(
        counts.slow.load(Ordering::SeqCst),
        5,
        "the upstream ran exactly once per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_scoped_by_the_configured_client_header() {
    let (up, counts) = upstream().await;
    let proxy = start_proxy(&up, &["--scope-header", "X-API-Key"]).await;
    let as_client = |api_key: &'static str| {
        let url = proxy.url("/slow/1");
        async move {
            let headers = [("idempotency-key", "k-1"), ("x-api-key", api_key)];
            send(Method::POST, &url, &headers, "{}").await
        }
    };
    let alice = as_client("alice-key").await;
    assert_eq!(alice.status, 201);
    let bob = as_client("bob-key").await;
    assert_eq!(bob.status, 201);
    assert!(
        bob.headers.get("idempotent-replayed").is_none(),
        "bob does not get alice's response"
    );
    assert_ne!(bob.body, alice.body);
    let alice_again = as_client("alice-key").await;
    assert_eq!(alice_again.headers["idempotent-replayed"], "true");
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(counts.slow.load(Ordering::SeqCst), 2);

    let err = refused(&up, &["--scope-header", "X API Key"]);
    assert!(err.contains("not a header name"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn which_statuses_release_the_key_is_a_policy() {
    let (up, counts) = upstream().await;
    // By default a 429 releases the key: the retry reaches the upstream.
    let proxy = start_proxy(&up, &[]).await;
    let limited = post_with(&proxy.url("/limited"), Some("l-1"), None, "{}").await;
    assert_eq!(limited.status, 429);
    let retried = post_with(&proxy.url("/limited"), Some("l-1"), None, "{}").await;
    assert_eq!(retried.status, 201);
    assert!(retried.headers.get("idempotent-replayed").is_none());
    assert_eq!(counts.limited.load(Ordering::SeqCst), 2);

    // Released only on 5xx: the 429 is stored and replayed.
    counts.limited.store(0, Ordering::SeqCst);
    let strict = start_proxy(&up, &["--release-status", "500-599"]).await;
    let limited = post_with(&strict.url("/limited"), Some("l-2"), None, "{}").await;
    assert_eq!(limited.status, 429);
    let replayed = post_with(&strict.url("/limited"), Some("l-2"), None, "{}").await;
    assert_eq!(replayed.status, 429);
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    assert_eq!(counts.limited.load(Ordering::SeqCst), 1);

    let err = refused(&up, &["--release-status", "5xx"]);
    assert!(
        err.contains("release_status") && err.contains("500-599"),
        "{err}"
    );
}

/// Posts to `/grpc` asking for trailers: status, body and trailers.
async fn post_grpc(proxy: &str) -> (StatusCode, HeaderMap, Bytes, Option<HeaderMap>) {
    let request = Request::post(format!("{proxy}/grpc"))
        .header("idempotency-key", "g-1")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"call")))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (parts.status, parts.headers, collected.to_bytes(), trailers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_are_passed_on_stored_and_replayed() {
    let (up, counts) = upstream().await;
    let proxy = start_proxy(&up, &[]).await;
    let (status, _, body, trailers) = post_grpc(&proxy.base).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"reply"[..]));
    let trailers = trailers.expect("the first answer has its trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "call-1");
    let (status, headers, body, replayed) = post_grpc(&proxy.base).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"reply"[..]));
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed.expect("the replay has the trailers"), trailers);
    assert_eq!(counts.grpc.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_and_release_settings_come_from_the_file_and_the_environment() {
    let (up, counts) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.toml");
    std::fs::write(
        &file,
        "scope_headers = [\"X-API-Key\"]\nrelease_status = \"500-599\"\nkeyless_window_ms = 5000\n",
    )
    .unwrap();
    let proxy = start_proxy(&up, &["--config", file.to_str().unwrap()]).await;
    let as_client = |api_key: &'static str| {
        let url = proxy.url("/limited");
        async move {
            let headers = [("idempotency-key", "k-1"), ("x-api-key", api_key)];
            send(Method::POST, &url, &headers, "{}").await
        }
    };
    let alice = as_client("alice-key").await;
    assert_eq!(alice.status, 429, "stored, not released, under 500-599");
    assert_eq!(
        as_client("alice-key").await.headers["idempotent-replayed"],
        "true"
    );
    let bob = as_client("bob-key").await;
    assert_eq!(bob.status, 201);
    assert!(bob.headers.get("idempotent-replayed").is_none());
    assert_eq!(counts.limited.load(Ordering::SeqCst), 2);

    let env = [
        ("IDEM_SCOPE_HEADERS", "X-API-Key,Authorization"),
        ("IDEM_KEYLESS_WINDOW_MS", "5000"),
    ];
    let mut args = vec!["proxy", "--upstream", &up, "--store", "memory://"];
    args.push("--listen");
    args.push("127.0.0.1:0");
    drop(start(&args, &env).await);
    let (code, _, err) = run(&args, &[("IDEM_RELEASE_STATUS", "5xx")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("release_status"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_calls_whose_clients_left_store_their_answers() {
    let (up, counts) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let start_on_file = || {
        let args = ["proxy", "--upstream", &up, "--store", &store];
        async move { start(&args, &[]).await }
    };
    let proxy = start_on_file().await;
    assert!(
        post_slow(&proxy.base, 7, Duration::from_millis(50))
            .await
            .is_none(),
        "the client gave up"
    );
    // Stopped while the upstream still works on the request, for a client
    // that is gone: the proxy waits for the answer and stores it.
    assert_eq!(proxy.terminate().await, 0);
    let restarted = start_on_file().await;
    let retry = post_slow(&restarted.base, 7, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(counts.slow.load(Ordering::SeqCst), 1);
}
