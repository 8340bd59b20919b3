//! Outcomes are opaque: what `begin`, `begin-batch` and `GET …/record` answer
//! is the JSON text `complete` was sent, byte for byte, on every store.

mod support;

use http::Method;
use serde_json::json;
use support::{Process, post, send, start};

/// Keys out of order, spacing inside, and a number no `f64` holds.
const OUTCOME: &str = r#"{"zeta": 1,  "alpha" :[ 3, 2,1 ],"big":123456789012345678901234567890,"nested":{"y":true , "b":null},"s":"caf\u00e9 \"q\""}"#;

/// Completes two keys with [`OUTCOME`], one with `complete` and one with
/// `complete-batch`, and checks every answer that carries it.
async fn outcomes_come_back_as_sent(idem: &Process, ns: &str, prefix: &str) {
    let (single, batched) = (format!("{prefix}-single"), format!("{prefix}-batched"));
    let url = |op: &str| idem.url(&format!("/v1/{ns}/{op}"));
    let begun = post(
        &url("begin-batch"),
        json!({"items": [{"key": single}, {"key": batched}]}),
    )
    .await
    .json();
    let token = |i: usize| begun["results"][i]["token"].as_u64().unwrap();
    let json = [("content-type", "application/json")];
    let done = send(
        Method::POST,
        &url("complete"),
        &json,
        format!(
            r#"{{"key":"{single}","token":{},"outcome":{OUTCOME},"retention_ms":60000}}"#,
            token(0)
        ),
    )
    .await;
    assert_eq!(done.json(), json!({"status": "completed"}));
    let done = send(
        Method::POST,
        &url("complete-batch"),
        &json,
        format!(
            r#"{{"items":[{{"key":"{batched}","token":{},"outcome":{OUTCOME},"retention_ms":60000}}]}}"#,
            token(1)
        ),
    )
    .await;
    assert_eq!(done.json(), json!({"results": [{"status": "completed"}]}));

    let exact = format!(r#""outcome":{OUTCOME}"#);
    for key in [&single, &batched] {
        let replay = post(&url("begin"), json!({"key": key})).await;
        let text = String::from_utf8(replay.body.to_vec()).unwrap();
        assert_eq!(replay.json()["status"], "completed", "{text}");
        assert!(text.contains(&exact), "begin changed the outcome: {text}");
        let record = support::get(&idem.url(&format!("/v1/{ns}/record?key={key}"))).await;
        let text = String::from_utf8(record.body.to_vec()).unwrap();
        assert_eq!(record.json()["state"], "completed", "{text}");
        assert!(text.contains(&exact), "record changed the outcome: {text}");
    }
    let replays = post(
        &url("begin-batch"),
        json!({"items": [{"key": single}, {"key": batched}]}),
    )
    .await;
    let text = String::from_utf8(replays.body.to_vec()).unwrap();
    assert_eq!(
        text.matches(&exact).count(),
        2,
        "begin-batch changed the outcome: {text}"
    );
    assert_eq!(replays.json()["results"][1]["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_come_back_byte_identical_from_the_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    outcomes_come_back_as_sent(&idem, "exact", "file").await;
    // Also once read back from disk.
    assert_eq!(idem.terminate().await, 0);
    let idem = start(&["serve", "--store", &store], &[]).await;
    let record = support::get(&idem.url("/v1/exact/record?key=file-single")).await;
    let text = String::from_utf8(record.body.to_vec()).unwrap();
    assert!(text.contains(&format!(r#""outcome":{OUTCOME}"#)), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_come_back_byte_identical_from_the_memory_store() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    outcomes_come_back_as_sent(&idem, "exact", "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_come_back_byte_identical_from_redis() {
    let Some((idem, prefix)) = support::serve_on_redis("redis").await else {
        return;
    };
    outcomes_come_back_as_sent(&idem, "exact", &prefix).await;
}
