//! `idem proxy` at the edges of its upstream: one that never answers, one
//! that cannot be connected to, headers that stop at the proxy, the
//! headers that name the client, paths that climb out of the base path, and
//! failures whose causes go to the log rather than to the client.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::{any, post};
use bytes::Bytes;
use http::Method;
use support::{Answer, Process, send};

/// The upstream: `/hang` takes the request and never answers; `/stall`
/// answers 201 with one chunk of body and never ends it; `/echo` answers
/// the request's headers, one `name: value` line each, with hop-by-hop
/// headers of its own (`Keep-Alive`, and `X-Internal` named in
/// `Connection`). Each route counts its calls.
#[derive(Default)]
struct Calls {
    hang: AtomicUsize,
    stall: AtomicUsize,
    echo: AtomicUsize,
}

async fn upstream() -> (String, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let (hang, stall, echo) = (calls.clone(), calls.clone(), calls.clone());
    let app = Router::new()
        .route(
            "/hang",
            post(move || async move {
                hang.hang.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }),
        )
        .route(
            "/stall",
            post(move || async move {
                stall.stall.fetch_add(1, Ordering::SeqCst);
                let first = futures_util::stream::iter([Ok::<_, std::io::Error>(
                    Bytes::from_static(b"partial"),
                )]);
                let body = futures_util::StreamExt::chain(first, futures_util::stream::pending());
                (http::StatusCode::CREATED, Body::from_stream(body))
            }),
        )
        .route(
            "/api/{*rest}",
            any(move |headers: HeaderMap| async move {
                echo.echo.fetch_add(1, Ordering::SeqCst);
                let mut lines: Vec<String> = headers
                    .iter()
                    .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
                    .collect();
                lines.sort();
                (
                    [
                        ("x-internal", "upstream-only"),
                        ("connection", "x-internal"),
                        ("keep-alive", "timeout=99"),
                        ("x-kept", "yes"),
                    ],
                    lines.join("\n"),
                )
                    .into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), calls)
}

/// `idem proxy` in front of `upstream` on a memory store, its log (at
/// `warn`) in a file whose path comes back with it.
async fn proxy(upstream: &str, args: &[&str]) -> (Process, tempfile::TempPath) {
    let mut all = vec!["proxy", "--upstream", upstream, "--store", "memory://"];
    all.extend_from_slice(args);
    all.extend(["--log", "warn"]);
    support::start_logged(&all, &[]).await
}

async fn post_key(url: &str, key: &str, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("idempotency-key", key), ("content-type", "text/plain")];
    all.extend_from_slice(headers);
    tokio::time::timeout(
        Duration::from_secs(20),
        send(Method::POST, url, &all, "body"),
    )
    .await
    .expect("the proxy answers within 20 s")
}

/// The problem's `request_id`, which its `detail` names too.
fn request_id(answer: &Answer) -> String {
    let p = answer.json();
    let id = p["request_id"].as_str().expect("a request_id").to_owned();
    assert!(p["detail"].as_str().unwrap().contains(&id), "{p}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_is_a_504_and_frees_the_key() {
    let (up, calls) = upstream().await;
    let metrics = format!("127.0.0.1:{}", support::consume::free_port());
    let (proxy, log) = proxy(
        &up,
        &["--upstream-timeout", "1s", "--metrics-listen", &metrics],
    )
    .await;
    for attempt in 1..=2 {
        let started = Instant::now();
        let a = post_key(&proxy.url("/hang"), "h-1", &[]).await;
        assert_eq!(a.problem(504), "urn:idem:problem:upstream-timeout");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let id = request_id(&a);
        // The key was released: the retry reached the upstream again
        // instead of being told the first is still running.
        assert_eq!(calls.hang.load(Ordering::SeqCst), attempt);
        support::log_line_naming(&log, &id);
    }
    // A body that starts and never ends holds the key no longer either.
    let a = post_key(&proxy.url("/stall"), "s-1", &[]).await;
    assert_eq!(a.problem(504), "urn:idem:problem:upstream-timeout");
    let b = post_key(&proxy.url("/stall"), "s-1", &[]).await;
    assert_eq!(b.problem(504), "urn:idem:problem:upstream-timeout");
    assert_eq!(calls.stall.load(Ordering::SeqCst), 2);
    // A request that is not guarded gets no longer.
    let unguarded = send(Method::POST, &proxy.url("/hang"), &[], "body").await;
    assert_eq!(unguarded.problem(504), "urn:idem:problem:upstream-timeout");
    assert_eq!(calls.hang.load(Ordering::SeqCst), 3);
    // Counted as timeouts, in buckets that reach past a second.
    let page = send(
        Method::GET,
        &format!("http://{metrics}/metrics"),
        &[],
        Bytes::new(),
    )
    .await;
    let page = String::from_utf8_lossy(&page.body);
    assert!(
        page.contains("idem_proxy_upstream_requests_total{status=\"timeout\"} 3"),
        "{page}"
    );
    assert!(
        page.contains("idem_proxy_upstream_seconds_bucket{le=\"60\"}"),
        "{page}"
    );
}

/// A listening socket whose accept queue is full: the kernel drops the
/// next connection's SYN, so connecting to it hangs.
async fn black_hole() -> (String, Vec<std::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(s) => held.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
            Err(e) => panic!("filling the accept queue: {e}"),
        }
        assert!(held.len() < 64, "the accept queue never filled");
    }
    // The listener lives as long as the test: leak it.
    std::mem::forget(listener);
    (format!("http://{addr}"), held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_cannot_be_connected_to_is_a_504_after_the_connect_timeout() {
    let (up, _held) = black_hole().await;
    let (proxy, _log) = proxy(&up, &["--upstream-connect-timeout", "500ms"]).await;
    for _ in 0..2 {
        let started = Instant::now();
        let a = post_key(&proxy.url("/orders"), "c-1", &[]).await;
        assert_eq!(a.problem(504), "urn:idem:problem:upstream-timeout");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeouts_are_checked_at_start() {
    for (flag, value, says) in [
        ("--upstream-timeout", "1.5s", "use ms, s, m, h or d"),
        ("--upstream-timeout", "0s", "1ms to 24h"),
        ("--upstream-connect-timeout", "soon", "e.g. 90s"),
        (
            "--forwarded-headers",
            "x-real-ip",
            "x-forwarded, forwarded or none",
        ),
    ] {
        let (code, _, err) = support::run(
            &[
                "proxy",
                "--upstream",
                "http://127.0.0.1:9",
                "--store",
                "memory://",
                flag,
                value,
            ],
            &[],
        );
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

/// Lines `name: value` of what `/api/…` saw, lower-case names.
fn seen(a: &Answer) -> Vec<String> {
    String::from_utf8_lossy(&a.body)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn has(lines: &[String], name: &str) -> bool {
    lines.iter().any(|l| l.starts_with(&format!("{name}: ")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_stop_at_the_proxy_and_the_upstream_learns_who_the_client_is() {
    let (up, _) = upstream().await;
    let (proxy, _log) = proxy(&up, &[]).await;
    let hop = [
        ("connection", "keep-alive, x-hop"),
        ("x-hop", "secret for the proxy"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("proxy-authorization", "Basic cHJveHk6c2VjcmV0"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-host", "forged.example"),
        ("forwarded", "for=6.6.6.6"),
        ("x-end-to-end", "kept"),
    ];
    for (key, path) in [(Some("e-1"), "/api/one"), (None, "/api/two")] {
        let a = match key {
            Some(key) => post_key(&proxy.url(path), key, &hop).await,
            None => send(Method::GET, &proxy.url(path), &hop, Bytes::new()).await,
        };
        assert_eq!(a.status, 200, "{path}");
        let lines = seen(&a);
        for gone in [
            "x-hop",
            "keep-alive",
            "proxy-connection",
            "proxy-authorization",
            "forwarded",
        ] {
            assert!(
                !has(&lines, gone),
                "{path}: {gone} reached the upstream: {lines:?}"
            );
        }
        assert!(
            lines.contains(&"x-end-to-end: kept".to_owned()),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"x-forwarded-for: 127.0.0.1".to_owned()),
            "{lines:?}"
        );
        assert!(
            lines.contains(&"x-forwarded-proto: http".to_owned()),
            "{lines:?}"
        );
        let host = proxy.base.trim_start_matches("http://");
        assert!(
            lines.contains(&format!("x-forwarded-host: {host}")),
            "{lines:?}"
        );
        // And on the way back: the upstream's hop-by-hop headers stop here.
        assert!(a.headers.get("x-internal").is_none(), "{:?}", a.headers);
        assert!(a.headers.get("keep-alive").is_none(), "{:?}", a.headers);
        assert_eq!(a.headers.get("x-kept").unwrap(), "yes");
    }
    // Replayed, the stored answer has none of them either.
    let replay = post_key(&proxy.url("/api/one"), "e-1", &hop).await;
    assert_eq!(replay.headers.get("idempotent-replayed").unwrap(), "true");
    assert!(replay.headers.get("x-internal").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_can_be_rfc_7239_or_left_to_the_client() {
    let (up, _) = upstream().await;
    let (forwarded, _log) = proxy(&up, &["--forwarded-headers", "forwarded"]).await;
    let a = send(
        Method::GET,
        &forwarded.url("/api/x"),
        &[("x-forwarded-for", "6.6.6.6"), ("forwarded", "for=6.6.6.6")],
        Bytes::new(),
    )
    .await;
    let lines = seen(&a);
    let host = forwarded.base.trim_start_matches("http://");
    assert!(
        lines.contains(&format!(
            "forwarded: for=127.0.0.1;host=\"{host}\";proto=http"
        )),
        "{lines:?}"
    );
    assert!(!has(&lines, "x-forwarded-for"), "{lines:?}");

    let (none, _log) = proxy(&up, &["--forwarded-headers", "none"]).await;
    let a = send(
        Method::GET,
        &none.url("/api/x"),
        &[("x-forwarded-for", "10.1.2.3")],
        Bytes::new(),
    )
    .await;
    let lines = seen(&a);
    assert!(
        lines.contains(&"x-forwarded-for: 10.1.2.3".to_owned()),
        "{lines:?}"
    );
    assert!(!has(&lines, "x-forwarded-proto"), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_climb_out_of_the_base_path_are_refused() {
    let (up, calls) = upstream().await;
    let (proxy, _log) = proxy(&format!("{up}/api"), &[]).await;
    let ok = send(Method::GET, &proxy.url("/fine"), &[], Bytes::new()).await;
    assert_eq!(ok.status, 200);
    for path in [
        "/../hang",
        "/a/../../hang",
        "/%2e%2e/hang",
        "/%2E./hang",
        "/.%2e%2fhang",
        "/..%5chang",
        "/./x",
    ] {
        for (method, key) in [(Method::GET, None), (Method::POST, Some("p-1"))] {
            let mut headers = vec![];
            if let Some(k) = key {
                headers.push(("idempotency-key", k));
            }
            let a = send(method.clone(), &proxy.url(path), &headers, "x").await;
            assert_eq!(
                a.problem(400),
                "urn:idem:problem:malformed-request",
                "{method} {path}"
            );
        }
    }
    assert_eq!(calls.echo.load(Ordering::SeqCst), 1);
    assert_eq!(calls.hang.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_s_cause_goes_to_the_log_not_to_the_client() {
    let (proxy, log) = proxy(&support::nothing_listening(), &[]).await;
    let a = post_key(&proxy.url("/orders"), "d-1", &[]).await;
    assert_eq!(a.problem(502), "urn:idem:problem:upstream-failed");
    let id = request_id(&a);
    let body = String::from_utf8_lossy(&a.body).to_lowercase();
    for cause in ["refused", "tcp connect", "os error", "127.0.0.1"] {
        assert!(!body.contains(cause), "the answer tells {cause:?}: {body}");
    }
    let line = support::log_line_naming(&log, &id);
    assert!(line.contains("refused"), "{line}");
}
