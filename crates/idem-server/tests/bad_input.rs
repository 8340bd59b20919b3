//! Every kind of bad input gets its status and a problem+json body, and
//! changes nothing.

mod support;

use http::Method;
use serde_json::json;
use support::{post, send, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_with_the_right_status_and_a_problem() {
    let idem = start(
        &[
            "serve",
            "--store",
            "memory://",
            "--max-body-bytes",
            "4096",
            "--max-outcome-bytes",
            "64",
            "--max-batch",
            "3",
            "--max-key-bytes",
            "32",
        ],
        &[],
    )
    .await;
    let begin = idem.url("/v1/orders/begin");
    let held = post(&begin, json!({"key": "held"})).await.json();
    let token = held["token"].as_u64().unwrap();

    let malformed = send(
        Method::POST,
        &begin,
        &[("content-type", "application/json")],
        "{\"key\":",
    )
    .await;
    assert_eq!(malformed.problem(400), "urn:idem:problem:malformed-request");
    let missing_key = post(&begin, json!({"lease_ms": 10})).await;
    assert!(
        missing_key.json()["detail"]
            .as_str()
            .unwrap()
            .contains("key")
    );
    assert_eq!(
        missing_key.problem(400),
        "urn:idem:problem:malformed-request"
    );
    let unknown_field = post(&begin, json!({"key": "k", "lease": 10})).await;
    assert_eq!(
        unknown_field.problem(400),
        "urn:idem:problem:malformed-request"
    );
    let empty_key = post(&begin, json!({"key": ""})).await;
    assert_eq!(empty_key.problem(400), "urn:idem:problem:invalid-input");
    let long_key = post(&begin, json!({"key": "k".repeat(33)})).await;
    assert_eq!(long_key.problem(400), "urn:idem:problem:invalid-input");
    assert!(
        long_key.json()["detail"]
            .as_str()
            .unwrap()
            .contains("limit is 32")
    );
    let zero_lease = post(&begin, json!({"key": "k", "lease_ms": 0})).await;
    assert_eq!(zero_lease.problem(400), "urn:idem:problem:invalid-input");
    let huge_lease = post(
        &begin,
        json!({"key": "k", "lease_ms": 8u64 * 24 * 3600 * 1000}),
    )
    .await;
    assert_eq!(huge_lease.problem(400), "urn:idem:problem:invalid-input");
    let negative_token = post(
        &idem.url("/v1/orders/complete"),
        json!({"key": "held", "token": -1}),
    )
    .await;
    assert_eq!(
        negative_token.problem(400),
        "urn:idem:problem:malformed-request"
    );
    let bad_ns = post(&idem.url("/v1/no%20spaces/begin"), json!({"key": "k"})).await;
    assert_eq!(bad_ns.problem(400), "urn:idem:problem:invalid-input");

    let big_body = post(&begin, json!({"key": "k", "fingerprint": "x".repeat(5000)})).await;
    assert_eq!(big_body.problem(413), "urn:idem:problem:too-large");
    let big_outcome = post(
        &idem.url("/v1/orders/complete"),
        json!({"key": "held", "token": token, "outcome": "y".repeat(100)}),
    )
    .await;
    assert_eq!(big_outcome.problem(413), "urn:idem:problem:too-large");
    let big_batch = post(
        &idem.url("/v1/orders/begin-batch"),
        json!({"items": [{"key": "a"}, {"key": "b"}, {"key": "c"}, {"key": "d"}]}),
    )
    .await;
    assert_eq!(big_batch.problem(400), "urn:idem:problem:invalid-input");
    assert!(
        big_batch.json()["detail"]
            .as_str()
            .unwrap()
            .contains("batch has 4 items")
    );
    let bad_item = post(
        &idem.url("/v1/orders/begin-batch"),
        json!({"items": [{"key": "fine"}, {"key": ""}]}),
    )
    .await;
    assert_eq!(bad_item.problem(400), "urn:idem:problem:invalid-input");
    assert!(
        bad_item.json()["detail"]
            .as_str()
            .unwrap()
            .starts_with("batch item 1")
    );
    let no_query = support::get(&idem.url("/v1/orders/record")).await;
    assert_eq!(no_query.problem(400), "urn:idem:problem:malformed-request");
    let stale = post(
        &idem.url("/v1/orders/release"),
        json!({"key": "held", "token": token + 99}),
    )
    .await;
    assert_eq!(stale.problem(409), "urn:idem:problem:stale-token");
    let nowhere = support::get(&idem.url("/v2/nothing")).await;
    assert_eq!(nowhere.problem(404), "urn:idem:problem:not-found");
    let wrong_method = support::get(&idem.url("/v1/orders/begin")).await;
    assert_eq!(
        wrong_method.problem(405),
        "urn:idem:problem:method-not-allowed"
    );

    // Nothing above changed the held record, or wrote the refused ones.
    let record = support::get(&idem.url("/v1/orders/record?key=held"))
        .await
        .json();
    assert_eq!(record["state"], "in_progress");
    assert_eq!(record["token"], token);
    for never in ["fine", "k", "a"] {
        // ("float" was accepted on purpose above.)
        let r = support::get(&idem.url(&format!("/v1/orders/record?key={never}"))).await;
        assert_eq!(r.status, 404, "{never} was written by a refused request");
    }
    let ok = post(
        &idem.url("/v1/orders/complete"),
        json!({"key": "held", "token": token, "outcome": "ok"}),
    )
    .await;
    assert_eq!(ok.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_not_declared_as_json_is_refused_with_415_and_changes_nothing() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    let held = post(&idem.url("/v1/ns/begin"), json!({"key": "held"}))
        .await
        .json();
    let token = held["token"].as_u64().unwrap();
    let complete = json!({"key": "held", "token": token, "outcome": "done"}).to_string();
    // What a web page can send to a local server without a CORS preflight.
    for declared in [
        Some("text/plain"),
        Some("text/plain; charset=utf-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let headers: Vec<_> = declared.iter().map(|t| ("content-type", *t)).collect();
        let refused = send(
            Method::POST,
            &idem.url("/v1/ns/complete"),
            &headers,
            complete.clone(),
        )
        .await;
        assert_eq!(
            refused.problem(415),
            "urn:idem:problem:unsupported-media-type",
            "{declared:?}"
        );
        let detail = refused.json()["detail"].as_str().unwrap().to_owned();
        assert!(
            detail.contains("Content-Type: application/json"),
            "the answer says which header to send: {detail}"
        );
        let begin = send(
            Method::POST,
            &idem.url("/v1/ns/begin"),
            &headers,
            r#"{"key":"new"}"#,
        )
        .await;
        assert_eq!(begin.status, 415, "{declared:?}");
    }
    let record = support::get(&idem.url("/v1/ns/record?key=held"))
        .await
        .json();
    assert_eq!(
        record["state"], "in_progress",
        "a refused complete changed the record"
    );
    assert_eq!(record["token"], token);
    let never = support::get(&idem.url("/v1/ns/record?key=new")).await;
    assert_eq!(never.status, 404, "a refused begin wrote a record");

    // JSON declared with parameters, or as a `+json` type, is JSON.
    let charset = send(
        Method::POST,
        &idem.url("/v1/ns/begin"),
        &[("content-type", "application/json; charset=utf-8")],
        r#"{"key":"new"}"#,
    )
    .await;
    assert_eq!(charset.json()["status"], "acquired");
    let suffix = send(
        Method::POST,
        &idem.url("/v1/ns/complete"),
        &[("content-type", "application/vnd.idem+json")],
        complete,
    )
    .await;
    assert_eq!(suffix.json(), json!({"status": "completed"}));
}
