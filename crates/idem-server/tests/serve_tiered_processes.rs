//! Several `idem serve --store tiered` processes on one cold tier: memory
//! hot tiers share no claims, so a second one in front of the same
//! PostgreSQL table refuses to start, saying to share a Redis hot tier.

mod support;

use serde_json::json;
use support::{post, run, start, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_memory_hot_tier_on_one_cold_table_refuses_to_start() {
    let Some(cold) = support::postgres_table(&unique("sole").replace('-', "_")) else {
        return;
    };
    let args = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &cold,
        "--listen",
        "127.0.0.1:0",
    ];
    let first = start(&args, &[]).await;
    let (code, _, err) = run(&args, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--hot-store redis://"), "{err}");
    // Once the first has stopped, its place is free.
    assert_eq!(first.terminate().await, 0);
    let second = start(&args, &[]).await;
    assert_eq!(second.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_and_one_table_answer_as_one() {
    let Some((redis, cold)) = support::redis_over_postgres(&unique("two").replace('-', "_")).await
    else {
        return;
    };
    // The defaults but a short hot retention: the key filter is on.
    let args = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        &redis,
        "--cold-store",
        &cold,
        "--hot-retention-ms",
        "1000",
    ];
    let a = start(&args, &[]).await;
    let b = start(&args, &[]).await;
    let ns = unique("two");
    for i in 0..50 {
        let key = format!("k-{i}");
        let begun = post(&a.url(&format!("/v1/{ns}/begin")), json!({"key": key}))
            .await
            .json();
        assert_eq!(begun["status"], "acquired", "{begun}");
        let done = post(
            &a.url(&format!("/v1/{ns}/complete")),
            json!({"key": key, "token": begun["token"], "outcome": i, "retention_ms": 3_600_000}),
        )
        .await;
        assert_eq!(done.status, 200, "{}", done.problem(200));
    }
    // Past the hot retention, the write-behind long done: only the cold
    // tier holds the keys, and B must not call them new.
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    for i in 0..50 {
        let again = post(
            &b.url(&format!("/v1/{ns}/begin")),
            json!({"key": format!("k-{i}")}),
        )
        .await
        .json();
        assert_eq!(again["status"], "completed", "k-{i} through B: {again}");
        assert_eq!(again["outcome"], i);
    }
    assert_eq!(a.terminate().await, 0);
    assert_eq!(b.terminate().await, 0);
}
