//! `idem proxy` in front of an HTTPS upstream (a private CA given with
//! `--upstream-ca-cert`, HTTP/2 by ALPN), an h2c upstream
//! (`--upstream-http2`), clients speaking HTTP/2 to the proxy, and the
//! proxy's own metrics.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::extract::State;
use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// An upstream that counts its calls and answers the HTTP version it was
/// spoken to in.
async fn version(State(calls): State<Arc<AtomicU32>>, req: Request<axum::body::Body>) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    format!("{:?}", req.version())
}

fn app(calls: Arc<AtomicU32>) -> axum::Router {
    axum::Router::new().fallback(version).with_state(calls)
}

/// POSTs `key` twice through the proxy at `base`; answers both bodies.
async fn twice(base: &str, key: &str) -> (String, String) {
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let answer = support::send(
            http::Method::POST,
            &format!("{base}/orders"),
            &[
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            Bytes::from_static(b"{}"),
        )
        .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        bodies.push(String::from_utf8_lossy(&answer.body).into_owned());
    }
    (bodies.remove(0), bodies.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_with_a_private_ca_speaks_http2() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &cert_pem).unwrap();
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(
        cert_pem.into_bytes(),
        key_pem.into_bytes(),
    )
    .await
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = axum_server::from_tcp_rustls(listener, tls).unwrap();
    let upstream_app = app(calls.clone());
    tokio::spawn(async move { server.serve(upstream_app.into_make_service()).await });
    let upstream = format!("https://localhost:{port}");

    let metrics = format!("127.0.0.1:{}", support::consume::free_port());
    let proxy = support::start(
        &[
            "proxy",
            "--upstream",
            &upstream,
            "--upstream-ca-cert",
            ca.to_str().unwrap(),
            "--store",
            "memory://",
            "--metrics-listen",
            &metrics,
        ],
        &[],
    )
    .await;
    let (first, replay) = twice(&proxy.base, "k-1").await;
    assert_eq!(first, "HTTP/2.0", "ALPN chose HTTP/2");
    assert_eq!(replay, first, "the replay is the stored answer");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one upstream call");
    let text = support::get(&format!("http://{metrics}/metrics")).await;
    let text = String::from_utf8_lossy(&text.body).into_owned();
    assert!(
        text.contains("idem_proxy_upstream_requests_total{status=\"200\"} 1"),
        "{text}"
    );
    assert!(text.contains("idem_proxy_upstream_seconds"), "{text}");
    proxy.terminate().await;

    // Without the CA, the system's roots do not know the certificate: the
    // key is released, and the proxy's log says why under the request id
    // the client is given.
    let (proxy, log) = support::start_logged(
        &[
            "proxy",
            "--upstream",
            &upstream,
            "--store",
            "memory://",
            "--log",
            "warn",
        ],
        &[],
    )
    .await;
    let answer = support::send(
        http::Method::POST,
        &format!("{}/orders", proxy.base),
        &[
            ("idempotency-key", "k-2"),
            ("content-type", "application/json"),
        ],
        Bytes::from_static(b"{}"),
    )
    .await;
    assert_eq!(answer.status, 502);
    let id = answer.json()["request_id"].as_str().unwrap().to_owned();
    let line = support::log_line_naming(&log, &id);
    assert!(line.contains("certificate"), "{line}");
    proxy.terminate().await;

    // Bad settings are refused at once.
    let (code, _, err) = support::run(
        &["proxy", "--upstream", "ftp://x", "--store", "memory://"],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("http:// or https://"), "{err}");
    let (code, _, err) = support::run(
        &[
            "proxy",
            "--upstream",
            "http://127.0.0.1:1",
            "--upstream-ca-cert",
            ca.to_str().unwrap(),
            "--store",
            "memory://",
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("https://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upstream_and_http2_clients() {
    let calls = Arc::new(AtomicU32::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let upstream_app = app(calls.clone());
    tokio::spawn(async move { axum::serve(listener, upstream_app).await });
    let proxy = support::start(
        &[
            "proxy",
            "--upstream",
            &format!("http://{addr}"),
            "--upstream-http2",
            "--store",
            "memory://",
        ],
        &[],
    )
    .await;
    let (first, _) = twice(&proxy.base, "h2c-1").await;
    assert_eq!(first, "HTTP/2.0", "prior knowledge to the upstream");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A client speaking HTTP/2 (prior knowledge) to the proxy.
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::post(format!("{}/orders", proxy.base))
        .header("idempotency-key", "h2c-1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let answer = client.request(req).await.expect("the proxy speaks HTTP/2");
    assert_eq!(answer.version(), Version::HTTP_2);
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"HTTP/2.0", "the stored answer, replayed");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a replay, no second call");
    proxy.terminate().await;
}
