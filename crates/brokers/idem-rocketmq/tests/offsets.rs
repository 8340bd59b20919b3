//! Offsets: a consumer restarted in the same group resumes after what was
//! acked; what was handed back at shutdown goes to the next consumer
//! without an attempt counted.

mod support;

use std::time::Duration;

use idem_consumer::{Message, Runner};
use support::{Claim, Effects, Fixture, done, guard, spawn, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_are_resumed_after_a_restart() {
    let Some(f) = Fixture::new("resume").await else {
        return;
    };
    for i in 0..20 {
        f.publish(&format!("old-{i}"), &[], "{}").await;
    }
    let source = f.source(f.config()).await;
    let before = Effects::default();
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        before.handler(Duration::ZERO),
    ));
    wait_until(Duration::from_secs(60), "the first 20", || async {
        before.applied_total() == 20
    })
    .await;
    running.stop().await;
    source.shutdown().await;
    f.wait_drained().await;

    for i in 0..10 {
        f.publish(&format!("new-{i}"), &[], "{}").await;
    }
    // A fresh store: a message delivered again would be handled again.
    let source = f.source(f.config()).await;
    let after = Effects::default();
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        after.handler(Duration::ZERO),
    ));
    wait_until(Duration::from_secs(60), "the next 10", || async {
        after.applied_total() == 10
    })
    .await;
    f.wait_drained().await;
    running.stop().await;
    source.shutdown().await;

    for i in 0..10 {
        assert_eq!(after.calls(&format!("new-{i}")), 1);
    }
    assert_eq!(after.calls_total(), 10, "nothing acked before came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_handed_back_at_shutdown_goes_to_the_next_consumer_without_an_attempt() {
    let Some(f) = Fixture::new("handback").await else {
        return;
    };
    f.publish("slow-1", &[], "{}").await;
    let source = f.source(f.config()).await;
    let first = Effects::default();
    let seen = first.clone();
    let handler = move |m: Message, _claim: Claim| {
        let effects = seen.clone();
        async move {
            effects.called(m.id.as_deref().unwrap_or_default(), m.attempt);
            std::future::pending::<()>().await;
            done()
        }
    };
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler)
            .shutdown_grace(Duration::from_millis(200)),
    );
    wait_until(Duration::from_secs(60), "the handler to start", || async {
        first.calls("slow-1") == 1
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.requeued, 1, "{report:?}");
    source.shutdown().await;

    let source = f.source(f.config()).await;
    let second = Effects::default();
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        second.handler(Duration::ZERO),
    ));
    wait_until(
        Duration::from_secs(60),
        "the hand-back to be handled",
        || async { second.applied("slow-1") == 1 },
    )
    .await;
    f.wait_drained().await;
    running.stop().await;
    source.shutdown().await;
    assert_eq!(
        second.attempts("slow-1"),
        [1],
        "the hand-back counted no attempt"
    );
}
