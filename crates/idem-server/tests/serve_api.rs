//! `idem serve` over HTTP: the operations, their races, and a restart.

mod support;

use std::sync::Arc;

use serde_json::json;
use support::{get, post, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_complete_replay_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    let begin = post(
        &idem.url("/v1/orders/begin"),
        json!({"key": "o-1", "fingerprint": "sum=10"}),
    )
    .await;
    assert_eq!(begin.status, 200);
    let b = begin.json();
    assert_eq!(b["status"], "acquired");
    assert_eq!(b["attempt"], 1);
    let token = b["token"].as_u64().unwrap();

    let busy = post(&idem.url("/v1/orders/begin"), json!({"key": "o-1"}))
        .await
        .json();
    assert_eq!(busy["status"], "in_progress");
    assert!(busy["retry_after_ms"].as_u64().unwrap() > 0);

    let extended = post(
        &idem.url("/v1/orders/extend"),
        json!({"key": "o-1", "token": token, "lease_ms": 60000}),
    )
    .await;
    assert_eq!(extended.json()["status"], "extended");

    let done = post(
        &idem.url("/v1/orders/complete"),
        json!({"key": "o-1", "token": token, "outcome": {"receipt": "r-1", "cents": 1000}}),
    )
    .await;
    assert_eq!(done.status, 200);
    assert_eq!(done.json(), json!({"status": "completed"}));

    let replay = post(
        &idem.url("/v1/orders/begin"),
        json!({"key": "o-1", "fingerprint": "sum=10"}),
    )
    .await
    .json();
    assert_eq!(replay["status"], "completed");
    assert_eq!(replay["outcome"], json!({"receipt": "r-1", "cents": 1000}));
    let other = post(
        &idem.url("/v1/orders/begin"),
        json!({"key": "o-1", "fingerprint": "sum=99"}),
    )
    .await
    .json();
    assert_eq!(other, json!({"status": "mismatch"}));

    let record = get(&idem.url("/v1/orders/record?key=o-1")).await.json();
    assert_eq!(record["state"], "completed");
    assert_eq!(record["token"], token);
    assert_eq!(
        get(&idem.url("/v1/orders/record?key=nope"))
            .await
            .problem(404),
        "urn:idem:problem:not-found"
    );

    // Release: the key can be begun again.
    let b2 = post(&idem.url("/v1/orders/begin"), json!({"key": "o-2"}))
        .await
        .json();
    let t2 = b2["token"].as_u64().unwrap();
    let released = post(
        &idem.url("/v1/orders/release"),
        json!({"key": "o-2", "token": t2}),
    )
    .await;
    assert_eq!(released.json(), json!({"status": "released"}));
    let again = post(&idem.url("/v1/orders/begin"), json!({"key": "o-2"}))
        .await
        .json();
    assert_eq!(again["status"], "acquired");
    assert!(again["token"].as_u64().unwrap() > t2);
    // The old token is stale now.
    let stale = post(
        &idem.url("/v1/orders/complete"),
        json!({"key": "o-2", "token": t2}),
    )
    .await;
    assert_eq!(stale.problem(409), "urn:idem:problem:stale-token");

    let metrics = String::from_utf8(get(&idem.url("/metrics")).await.body.to_vec()).unwrap();
    for name in [
        "idem_operations_total",
        "idem_stale_tokens_total",
        "idem_in_progress_records",
        "idem_http_request_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    assert_eq!(
        get(&idem.url("/healthz")).await.json(),
        json!({"status": "ok"})
    );
    assert_eq!(
        get(&idem.url("/readyz")).await.json(),
        json!({"status": "ok"})
    );
    let doc = get(&idem.url("/openapi.json")).await.json();
    assert!(doc["paths"]["/v1/{ns}/begin"]["post"].is_object());
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_begins_acquire_once() {
    let idem = Arc::new(start(&["serve", "--store", "memory://"], &[]).await);
    for round in 0..3 {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let url = idem.url("/v1/race/begin");
                tokio::spawn(async move {
                    post(&url, json!({"key": format!("k-{round}")}))
                        .await
                        .json()
                })
            })
            .collect();
        let mut acquired = 0;
        for t in tasks {
            let answer = t.await.unwrap();
            match answer["status"].as_str().unwrap() {
                "acquired" => acquired += 1,
                "in_progress" => {}
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(acquired, 1, "exactly one of 64 begins may acquire");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_answer_in_order() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    let begun = post(
        &idem.url("/v1/b/begin-batch"),
        json!({"items": [{"key": "a"}, {"key": "b"}, {"key": "a"}]}),
    )
    .await
    .json();
    let results = begun["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], "acquired");
    assert_eq!(results[1]["status"], "acquired");
    assert_eq!(results[2]["status"], "in_progress");
    let (ta, tb) = (
        results[0]["token"].as_u64().unwrap(),
        results[1]["token"].as_u64().unwrap(),
    );
    let completed = post(
        &idem.url("/v1/b/complete-batch"),
        json!({"items": [
            {"key": "a", "token": ta, "outcome": 1},
            {"key": "b", "token": ta},
            {"key": "b", "token": tb, "outcome": "two"}
        ]}),
    )
    .await
    .json();
    assert_eq!(
        completed,
        json!({"results": [{"status": "completed"}, {"status": "stale"}, {"status": "completed"}]})
    );
    let replay = post(&idem.url("/v1/b/begin"), json!({"key": "b"}))
        .await
        .json();
    assert_eq!(replay["outcome"], "two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_finds_every_completed_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    let mut tokens = Vec::new();
    for i in 0..50 {
        let b = post(&idem.url("/v1/keep/begin"), json!({"key": format!("k{i}")}))
            .await
            .json();
        let token = b["token"].as_u64().unwrap();
        tokens.push(token);
        let done = post(
            &idem.url("/v1/keep/complete"),
            json!({"key": format!("k{i}"), "token": token, "outcome": {"n": i}}),
        )
        .await;
        assert_eq!(done.status, 200);
    }
    assert_eq!(idem.terminate().await, 0, "SIGTERM is a clean exit");

    let idem = start(&["serve", "--store", &store], &[]).await;
    for i in 0..50 {
        let replay = post(&idem.url("/v1/keep/begin"), json!({"key": format!("k{i}")}))
            .await
            .json();
        assert_eq!(
            replay["status"], "completed",
            "k{i} was lost in the restart"
        );
        assert_eq!(replay["outcome"], json!({"n": i}));
    }
    let fresh = post(&idem.url("/v1/keep/begin"), json!({"key": "new"}))
        .await
        .json();
    assert!(fresh["token"].as_u64().unwrap() > *tokens.iter().max().unwrap());
    assert_eq!(idem.terminate().await, 0);
}
