//! `idem serve --store redis://…`: the API on the Redis store, and records
//! that outlive the server process.

mod support;

use idem_testkit::services;
use serde_json::json;
use support::{post, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_redis_keeps_records_across_server_restarts() {
    let url = services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let addr = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    if let Err(e) = tokio::net::TcpStream::connect(&addr).await {
        return services::absent("Redis", &url, e).unwrap_or(());
    }
    let key = format!("r-{}", std::process::id());
    let idem = start(&["serve", "--store", &url], &[]).await;
    let b = post(&idem.url("/v1/redis-test/begin"), json!({"key": key}))
        .await
        .json();
    assert_eq!(b["status"], "acquired");
    let done = post(
        &idem.url("/v1/redis-test/complete"),
        json!({"key": key, "token": b["token"], "outcome": "kept", "retention_ms": 60000}),
    )
    .await;
    assert_eq!(done.status, 200);
    assert_eq!(idem.terminate().await, 0);

    let idem = start(&["serve", "--store", &url], &[]).await;
    let replay = post(&idem.url("/v1/redis-test/begin"), json!({"key": key}))
        .await
        .json();
    assert_eq!(replay["status"], "completed");
    assert_eq!(replay["outcome"], "kept");
}
