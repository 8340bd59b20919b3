//! A retried `complete` by the token that completed the record is answered
//! 200 again and changes nothing; another token is still stale. The same for
//! `complete-batch`. A client whose first answer was lost can tell success
//! from a lost lease.

mod support;

use serde_json::json;
use support::{Process, post, start};

async fn a_retried_complete_is_ok_and_changes_nothing(idem: &Process, ns: &str) {
    let url = |op: &str| idem.url(&format!("/v1/{ns}/{op}"));
    let token = |answer: &serde_json::Value| answer["token"].as_u64().unwrap();
    let t = token(&post(&url("begin"), json!({"key": "k"})).await.json());
    // Tokens increase per key: any other is not the one that completed it.
    let other = t + 1;

    for attempt in ["first", "retry", "retry again"] {
        let done = post(
            &url("complete"),
            json!({"key": "k", "token": t, "outcome": attempt}),
        )
        .await;
        assert_eq!(done.status, 200, "{attempt}: {:?}", done.body);
        assert_eq!(done.json(), json!({"status": "completed"}), "{attempt}");
    }
    let stale = post(&url("complete"), json!({"key": "k", "token": other})).await;
    assert_eq!(stale.problem(409), "urn:idem:problem:stale-token");
    let replay = post(&url("begin"), json!({"key": "k"})).await.json();
    assert_eq!(
        replay["outcome"], "first",
        "a retried complete changed the outcome"
    );

    let begun = post(
        &url("begin-batch"),
        json!({"items": [{"key": "b1"}, {"key": "b2"}]}),
    )
    .await
    .json();
    let (t1, t2) = (token(&begun["results"][0]), token(&begun["results"][1]));
    let batch = |first: u64, second: u64| {
        json!({"items": [
            {"key": "b1", "token": first, "outcome": 1},
            {"key": "b2", "token": second, "outcome": 2}
        ]})
    };
    let completed = json!({"results": [{"status": "completed"}, {"status": "completed"}]});
    for attempt in ["first", "retry"] {
        let done = post(&url("complete-batch"), batch(t1, t2)).await.json();
        assert_eq!(done, completed, "{attempt}");
    }
    let others = post(&url("complete-batch"), batch(t1 + 1, t2 + 1))
        .await
        .json();
    assert_eq!(
        others,
        json!({"results": [{"status": "stale"}, {"status": "stale"}]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_complete_is_ok_on_the_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    a_retried_complete_is_ok_and_changes_nothing(&idem, "retry").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_complete_is_ok_on_the_memory_store() {
    let idem = start(&["serve", "--store", "memory://"], &[]).await;
    a_retried_complete_is_ok_and_changes_nothing(&idem, "retry").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_complete_is_ok_on_redis() {
    let Some((idem, ns)) = support::serve_on_redis("retry").await else {
        return;
    };
    a_retried_complete_is_ok_and_changes_nothing(&idem, &ns).await;
}
