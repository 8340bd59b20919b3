//! Bearer tokens per namespace: a token for `orders` cannot touch `payments`.

mod support;

use serde_json::json;
use support::{post, post_auth, start};

const ORDERS: &str = "orders-token-0123456789";
const PAYMENTS: &str = "payments-token-0123456789";
const ADMIN: &str = "admin-token-0123456789abc";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_confined_to_their_namespaces() {
    let orders = format!("orders={ORDERS}");
    let idem = start(
        &["serve", "--store", "memory://", "--auth-token", &orders],
        &[(
            "IDEM_AUTH_TOKENS",
            "ignored-because-the-flag-wins=xxxxxxxxxxxxxxxxxx",
        )],
    )
    .await;
    let url = |ns: &str| idem.url(&format!("/v1/{ns}/begin"));
    let ok = post_auth(&url("orders"), ORDERS, json!({"key": "a"})).await;
    assert_eq!(ok.json()["status"], "acquired");
    let other_ns = post_auth(&url("payments"), ORDERS, json!({"key": "a"})).await;
    assert_eq!(other_ns.problem(403), "urn:idem:problem:forbidden");
    let none = post(&url("orders"), json!({"key": "b"})).await;
    assert_eq!(none.problem(401), "urn:idem:problem:unauthorized");
    assert_eq!(none.headers.get("www-authenticate").unwrap(), "Bearer");
    let wrong = post_auth(
        &url("orders"),
        "orders-token-0123456780",
        json!({"key": "b"}),
    )
    .await;
    assert_eq!(wrong.problem(401), "urn:idem:problem:unauthorized");
    // Health stays open.
    assert_eq!(support::get(&idem.url("/healthz")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_from_the_environment_and_a_wildcard() {
    let env = format!("payments={PAYMENTS};*={ADMIN}");
    let idem = start(
        &["serve", "--store", "memory://"],
        &[("IDEM_AUTH_TOKENS", &env)],
    )
    .await;
    let url = |ns: &str| idem.url(&format!("/v1/{ns}/begin"));
    assert_eq!(
        post_auth(&url("payments"), PAYMENTS, json!({"key": "p"}))
            .await
            .status,
        200
    );
    assert_eq!(
        post_auth(&url("orders"), PAYMENTS, json!({"key": "p"}))
            .await
            .status,
        403
    );
    assert_eq!(
        post_auth(&url("orders"), ADMIN, json!({"key": "p"}))
            .await
            .status,
        200
    );
    assert_eq!(
        post_auth(&url("anything.else"), ADMIN, json!({"key": "p"}))
            .await
            .status,
        200
    );
}
