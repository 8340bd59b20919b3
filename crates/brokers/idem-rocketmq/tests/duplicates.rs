//! Copies of a message that reach the consumer (the same `KEYS`, published
//! more than once) take effect once, and every copy is acked.

mod support;

use std::time::Duration;

use idem_consumer::Runner;
use support::{Effects, Fixture, guard, spawn, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_reaching_the_consumer_take_effect_once_and_are_all_acked() {
    let Some(f) = Fixture::new("dups").await else {
        return;
    };
    const N: usize = 200;
    // Every tenth order is published twice.
    let mut copies = 0;
    for i in 0..N {
        let key = format!("order-{i}");
        f.publish(&key, &[("order-id", &key)], "{}").await;
        if i % 10 == 0 {
            f.publish(&key, &[("order-id", &key)], "{}").await;
            copies += 1;
        }
    }
    let source = f.source(f.config().concurrency(16)).await;
    let effects = Effects::default();
    let running = spawn(
        Runner::new(
            guard(Duration::from_secs(10)),
            source.clone(),
            effects.handler(Duration::from_millis(5)),
        )
        .concurrency(16),
    );
    wait_until(Duration::from_secs(60), "every order applied", || async {
        effects.applied_total() as usize >= N
    })
    .await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;

    for i in 0..N {
        let key = format!("order-{i}");
        assert_eq!(effects.applied(&key), 1, "{key} took effect once");
        assert_eq!(effects.calls(&key), 1, "{key} was handled once");
        assert_eq!(effects.attempts(&key), [1], "{key}: a first delivery");
    }
    assert_eq!(report.handled as usize, N, "{report:?}");
    assert_eq!(report.duplicates as usize, copies, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
}
