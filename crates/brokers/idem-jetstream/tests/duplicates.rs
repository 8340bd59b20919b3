//! Duplicates that reach the consumer (same key, distinct `Nats-Msg-Id`)
//! take effect once, and every message is acked.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use idem_consumer::{KeyFrom, Runner};
use support::{Effects, Fixture, done, guard, header, spawn, wait_settled, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_reaching_the_consumer_take_effect_once_and_are_all_acked() {
    let Some(f) = Fixture::new("dups").await else {
        return;
    };
    const N: usize = 200;
    let source = f.source(f.config().concurrency(16)).await;
    // Every tenth order is published twice: half of the copies before the
    // runner starts, half while the first copy is being handled.
    let early: Vec<usize> = (0..N).step_by(20).collect();
    let late: HashSet<usize> = (10..N).step_by(20).collect();
    for i in 0..N {
        let key = format!("order-{i}");
        f.publish("paid", &format!("{key}-a"), &[("order-id", &key)], "{}")
            .await;
        if early.contains(&i) {
            f.publish("paid", &format!("{key}-b"), &[("order-id", &key)], "{}")
                .await;
        }
    }
    let effects = Effects::default();
    let seen = effects.clone();
    let slow: HashSet<String> = late.iter().map(|i| format!("order-{i}")).collect();
    let handler = move |m: idem_consumer::Message, _claim: support::Claim| {
        let effects = seen.clone();
        let slow = slow.contains(&header(&m, "order-id"));
        async move {
            let key = header(&m, "order-id");
            effects.called(&key, m.attempt);
            let pause = if slow { 400 } else { 2 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            effects.apply(&key);
            done()
        }
    };
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler)
            .key(KeyFrom::Header("order-id".into()))
            .concurrency(16),
    );
    for i in &late {
        let key = format!("order-{i}");
        wait_until(
            Duration::from_secs(20),
            "the first copy to start",
            || async { effects.started(&key) },
        )
        .await;
        f.publish("paid", &format!("{key}-b"), &[("order-id", &key)], "{}")
            .await;
    }
    wait_until(Duration::from_secs(30), "every order applied", || async {
        effects.applied_total() as usize >= N
    })
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    for i in 0..N {
        let key = format!("order-{i}");
        assert_eq!(effects.applied(&key), 1, "{key} took effect once");
        assert_eq!(effects.calls(&key), 1, "{key} was handled once");
    }
    let copies = early.len() + late.len();
    assert_eq!(report.handled as usize, N, "{report:?}");
    assert_eq!(report.duplicates as usize, copies, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(f.stored().await as usize, N + copies);
}
