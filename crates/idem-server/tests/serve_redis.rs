//! `idem serve --store redis://…`: the API on the Redis store, records
//! that outlive the server process, and `rediss://` with the certificates
//! a managed Redis asks for.

mod support;

use idem_testkit::tls_redis::TlsRedis;
use serde_json::json;
use support::{post, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_redis_keeps_records_across_server_restarts() {
    let Some(url) = support::redis().await else {
        return;
    };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_speaks_tls_to_redis_and_to_a_redis_cluster() {
    for cluster in [false, true] {
        let Some(redis) = TlsRedis::start(cluster).await else {
            return;
        };
        let store = if cluster {
            redis.url.replace("rediss://", "rediss+cluster://")
        } else {
            redis.url.clone()
        };
        let file = |name: &str| redis.file(name).to_str().unwrap().to_owned();
        let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
        let idem = start(
            &[
                "serve",
                "--store",
                &store,
                "--redis-ca-cert",
                &ca,
                "--redis-client-cert",
                &cert,
            ],
            &[("IDEM_REDIS_CLIENT_KEY", &key)],
        )
        .await;
        let begin = idem.url("/v1/tls/begin");
        let b = post(&begin, json!({"key": "k"})).await.json();
        assert_eq!(b["status"], "acquired", "{store}");
        let again = post(&begin, json!({"key": "k"})).await.json();
        assert_eq!(again["status"], "in_progress", "{store}");
    }
}
