//! `/metrics` labels never come from input no token vouched for: refused
//! requests to made-up namespaces add no series.

mod support;

use serde_json::json;
use support::{Process, post_auth, start};

const ORDERS: &str = "orders-token-0123456789";

/// A token for every namespace: what `/metrics` takes with auth on.
const OPERATOR: &str = "operator-token-0123456789";

/// The series `/metrics` shows: every sample line.
async fn series(idem: &Process) -> Vec<String> {
    let bearer = format!("Bearer {OPERATOR}");
    let text = support::send(
        http::Method::GET,
        &idem.url("/metrics"),
        &[("authorization", &bearer)],
        bytes::Bytes::new(),
    )
    .await
    .body;
    String::from_utf8(text.to_vec())
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l, |(name, _value)| name)
                .to_owned()
        })
        .collect()
}

/// Refused with a wrong token (401), with a token for another namespace
/// (403), and with a namespace that is not one (400).
async fn refused(idem: &Process, i: usize) {
    let made_up = format!("made-up-{i}");
    let begin = idem.url(&format!("/v1/{made_up}/begin"));
    let wrong = post_auth(&begin, "not-a-token-0123456789", json!({"key": "k"})).await;
    assert_eq!(wrong.status, 401);
    let forbidden = post_auth(&begin, ORDERS, json!({"key": "k"})).await;
    assert_eq!(forbidden.status, 403);
    let malformed = idem.url(&format!("/v1/{}{i}/begin", "n".repeat(64)));
    let invalid = post_auth(&malformed, ORDERS, json!({"key": "k"})).await;
    assert_eq!(invalid.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_to_made_up_namespaces_add_no_series() {
    let (orders, all) = (format!("orders={ORDERS}"), format!("*={OPERATOR}"));
    let idem = start(
        &[
            "serve",
            "--store",
            "memory://",
            "--auth-token",
            &orders,
            "--auth-token",
            &all,
        ],
        &[],
    )
    .await;
    // Once, so that every series a refusal or a scrape brings exists.
    refused(&idem, 0).await;
    series(&idem).await;
    let before = series(&idem).await;
    for i in 1..=500 {
        refused(&idem, i).await;
    }
    let after = series(&idem).await;
    let added: Vec<_> = after.iter().filter(|s| !before.contains(s)).collect();
    assert!(
        added.is_empty(),
        "1 500 refused requests to 500 made-up namespaces added {} series, e.g. {:?}",
        added.len(),
        added.iter().take(3).collect::<Vec<_>>()
    );
    assert!(
        !after.iter().any(|s| s.contains("made-up")),
        "a made-up namespace is a label"
    );
    let refusals = after
        .iter()
        .filter(|s| s.starts_with("idem_refused_requests_total"))
        .count();
    assert_eq!(refusals, 3, "refusals are counted, by reason: {after:?}");

    // An allowed namespace is still a label.
    let ok = post_auth(&idem.url("/v1/orders/begin"), ORDERS, json!({"key": "k"})).await;
    assert_eq!(ok.status, 200);
    assert!(
        series(&idem)
            .await
            .iter()
            .any(|s| s.contains(r#"namespace="orders""#))
    );
}
