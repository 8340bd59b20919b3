//! Clients that attack `idem serve` over the network get a clear answer, or
//! their connection closed by a documented limit, and the server's memory
//! stays bounded: huge headers, many namespaces, bodies and headers sent a
//! byte at a time, deeply nested JSON. Each test reads the server's peak
//! resident memory (`VmHWM`) before and after, prints both, and holds the
//! growth to a generous bound.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::json;
use support::{Process, post, start};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The server's peak resident memory so far, in KiB.
fn peak_kib(idem: &Process) -> u64 {
    let pid = idem.child.id().expect("idem is running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Prints the peak before and after, and holds the growth to `bound_mib`.
fn assert_bounded(what: &str, before: u64, idem: &Process, bound_mib: u64) {
    let after = peak_kib(idem);
    println!(
        "{what}: peak RSS {:.1} MiB before, {:.1} MiB after",
        before as f64 / 1024.0,
        after as f64 / 1024.0
    );
    assert!(
        after.saturating_sub(before) < bound_mib * 1024,
        "{what}: peak RSS grew from {before} KiB to {after} KiB (bound {bound_mib} MiB)"
    );
}

fn addr(idem: &Process) -> String {
    idem.base.trim_start_matches("http://").to_owned()
}

/// Writes `request` (ignoring a server that hangs up mid-way) and reads
/// until the server closes the connection or `within` passes; returns what
/// came back and whether the connection was closed.
async fn exchange(addr: &str, request: &[u8], within: Duration) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(request).await;
    read_until_closed(&mut stream, within).await
}

async fn read_until_closed(
    stream: &mut (impl AsyncRead + Unpin),
    within: Duration,
) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

async fn still_serves(idem: &Process) {
    let ok = post(&idem.url("/v1/after/begin"), json!({"key": "k"})).await;
    assert_eq!(ok.json()["status"], "acquired", "the server still answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_headers_are_refused_with_431_and_memory_stays_bounded() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    let addr = addr(&idem);
    let before = peak_kib(&idem);
    let head = format!("POST /v1/orders/begin HTTP/1.1\r\nhost: {addr}\r\n");
    let one_huge = format!("{head}x-huge: {}\r\n\r\n", "a".repeat(1 << 20));
    let many: String = (0..10_000).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many = format!("{head}{many}\r\n");
    let long_target = format!(
        "GET /v1/orders/record?key={} HTTP/1.1\r\nhost: {addr}\r\n\r\n",
        "k".repeat(1 << 20)
    );
    for (what, request) in [
        ("a 1 MiB header", &one_huge),
        ("10 000 headers", &many),
        ("a 1 MiB request target", &long_target),
    ] {
        // Sixteen at once, so that buffers would add up.
        let answers =
            join_all((0..16).map(|_| exchange(&addr, request.as_bytes(), Duration::from_secs(10))))
                .await;
        for (answer, closed) in answers {
            assert!(closed, "{what}: the connection stays open");
            assert!(
                answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
                "{what}: answered {:?}",
                answer.lines().next()
            );
        }
    }
    still_serves(&idem).await;
    assert_bounded("huge headers", before, &idem, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_namespaces_add_a_bounded_number_of_metric_series() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    let before = peak_kib(&idem);
    const NAMESPACES: usize = 3000;
    for chunk in (0..NAMESPACES).collect::<Vec<_>>().chunks(50) {
        join_all(chunk.iter().map(|i| {
            let url = idem.url(&format!("/v1/made-up-{i}/begin"));
            async move {
                let answer = post(&url, json!({"key": "k"})).await;
                assert_eq!(answer.status, 200);
            }
        }))
        .await;
    }
    let metrics = support::get(&idem.url("/metrics")).await;
    let text = String::from_utf8_lossy(&metrics.body);
    let mut labelled: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("idem_operations_total"))
        .filter_map(|l| l.split("namespace=\"").nth(1)?.split('"').next())
        .collect();
    labelled.sort_unstable();
    labelled.dedup();
    println!(
        "{NAMESPACES} namespaces: {} namespace labels, /metrics is {} bytes",
        labelled.len(),
        text.len()
    );
    assert!(
        labelled.len() <= 1001,
        "{} namespaces have series of their own",
        labelled.len()
    );
    assert!(labelled.contains(&"(other)"), "the rest count together");
    still_serves(&idem).await;
    assert_bounded("many namespaces", before, &idem, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_bodies_are_cut_off_by_the_read_timeout() {
    let idem = start(
        &["serve", "--store", "memory://", "--read-timeout-ms", "1000"],
        &[],
    )
    .await;
    let addr = addr(&idem);
    let before = peak_kib(&idem);
    let trickle = |request: String, start_at: usize| {
        let addr = addr.clone();
        async move {
            let started = Instant::now();
            let stream = TcpStream::connect(&addr).await.unwrap();
            let (mut from, mut to) = stream.into_split();
            let answered =
                tokio::spawn(
                    async move { read_until_closed(&mut from, Duration::from_secs(8)).await },
                );
            let bytes = request.into_bytes();
            to.write_all(&bytes[..start_at]).await.unwrap();
            // One byte every 100 ms, until the server answers or hangs up.
            for b in &bytes[start_at..] {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if answered.is_finished() || to.write_all(&[*b]).await.is_err() {
                    break;
                }
            }
            let (answer, closed) = answered.await.unwrap();
            (answer, closed, started.elapsed())
        }
    };
    let body = json!({"key": "slow", "fingerprint": "x".repeat(200)}).to_string();
    let slow_body = format!(
        "POST /v1/orders/begin HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let body_starts = slow_body.len() - body.len();
    let slow_head = format!(
        "POST /v1/orders/begin HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nx-padding: {}\r\n\r\n",
        "p".repeat(200)
    );
    let bodies = join_all((0..50).map(|_| trickle(slow_body.clone(), body_starts)));
    let heads = join_all((0..50).map(|_| trickle(slow_head.clone(), 10)));
    let (bodies, heads) = tokio::join!(bodies, heads);
    for (answer, closed, took) in bodies {
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "a slow body got {:?}",
            answer.lines().next()
        );
        assert!(
            answer.contains("urn:idem:problem:request-timeout"),
            "{answer}"
        );
        assert!(closed, "the connection of a slow body is closed");
        assert!(took < Duration::from_secs(8), "cut off after {took:?}");
    }
    for (answer, closed, took) in heads {
        assert!(closed, "the connection of slow headers is closed");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "slow headers got {:?}",
            answer.lines().next()
        );
        assert!(took < Duration::from_secs(8), "cut off after {took:?}");
    }
    let record = support::get(&idem.url("/v1/orders/record?key=slow")).await;
    assert_eq!(record.status, 404, "no slow request changed anything");
    still_serves(&idem).await;
    assert_bounded("slow headers and bodies", before, &idem, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_json_is_refused_or_stored_verbatim_without_blowing_the_stack() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    let before = peak_kib(&idem);
    let held = post(&idem.url("/v1/deep/begin"), json!({"key": "deep"}))
        .await
        .json();
    let token = held["token"].as_u64().unwrap();
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // 400 000 levels (800 KB, under the 1 MiB outcome limit): an outcome
    // is refused for its nesting, other fields for their type.
    let outcome = format!(
        r#"{{"key":"deep","token":{token},"outcome":{}}}"#,
        nested(400_000)
    );
    let items = format!(r#"{{"items":[{outcome}]}}"#);
    for (route, body, kind) in [
        ("complete", &outcome, "invalid-input"),
        ("complete-batch", &items, "invalid-input"),
        ("begin-batch", &items, "malformed-request"),
        (
            "begin",
            &format!(r#"{{"key":{}}}"#, "{\"a\":".repeat(200_000)),
            "malformed-request",
        ),
        (
            "begin-batch",
            &format!(r#"{{"items":{}}}"#, nested(400_000)),
            "malformed-request",
        ),
    ] {
        let answer = support::send(
            http::Method::POST,
            &idem.url(&format!("/v1/deep/{route}")),
            &[("content-type", "application/json")],
            body.clone(),
        )
        .await;
        assert_eq!(
            answer.problem(400),
            format!("urn:idem:problem:{kind}"),
            "{route}"
        );
        if kind == "invalid-input" {
            let detail = answer.json()["detail"].as_str().unwrap().to_owned();
            assert!(detail.contains("more than 127 levels"), "{detail}");
        }
    }
    // Nesting as deep as serde_json reads (127 levels) is stored verbatim.
    let fine = nested(127);
    let body = format!(r#"{{"key":"deep","token":{token},"outcome":{fine}}}"#);
    let stored = support::send(
        http::Method::POST,
        &idem.url("/v1/deep/complete"),
        &[("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(stored.json(), json!({"status": "completed"}));
    let again = post(&idem.url("/v1/deep/begin"), json!({"key": "deep"})).await;
    let text = String::from_utf8_lossy(&again.body);
    assert!(text.contains(&fine), "the outcome comes back as sent");
    still_serves(&idem).await;
    assert_bounded("deeply nested JSON", before, &idem, 64);
}
