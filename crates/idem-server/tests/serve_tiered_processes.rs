//! Several `idem serve --store tiered` processes on one cold tier: memory
//! hot tiers share no claims, so a second one in front of the same
//! PostgreSQL table refuses to start, saying to share a Redis hot tier.

mod support;

use support::{run, start, unique};

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
