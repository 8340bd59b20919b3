//! After a consumer dies holding claims, the next consumer finds those keys
//! busy until their lease ends. Every retry at the broker raises the
//! reconsume count, so busy retries wait in the runner instead: they use
//! up none of the message's attempts, and nothing reaches `%DLQ%`.

mod support;

use std::time::Duration;

use idem_consumer::testing::die_mid_handler;
use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Guard, Lease, MemoryStore};
use idem_rocketmq::RocketMqSource;
use support::{Claim, Effects, Fixture, done, spawn, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_retries_after_a_crash_use_up_no_attempts() {
    let Some(f) = Fixture::new("busycrash").await else {
        return;
    };
    let dead = f.dead_letter_reader().await;
    // One store for both consumers, as a shared Redis would be. The lease
    // outlasts the rebalance that gives the dead consumer's queue to the
    // next one, so the next one finds the key still held.
    let store = MemoryStore::new();
    let lease = Duration::from_secs(15);
    let config = f.config().lease(lease).max_reconsume_times(4);
    f.publish("flaky-1", &[], "{}").await;

    let first_config = config.clone();
    die_mid_handler(
        Guard::new(store.clone()).lease(Lease::new(lease)),
        move || async move { RocketMqSource::connect(first_config).await.unwrap() },
        Duration::from_secs(30),
    )
    .await;
    f.publish("order-2", &[], "{}").await;
    f.publish("order-3", &[], "{}").await;

    let source = f.source(config).await;
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |m: Message, _claim: Claim| {
        let effects = seen.clone();
        async move {
            let key = m.id.clone().unwrap_or_default();
            effects.called(&key, m.attempt);
            if key == "flaky-1" && effects.calls(&key) <= 2 {
                return Err(HandlerError::transient("the ledger is down"));
            }
            effects.apply(&key);
            done()
        }
    };
    let guard = Guard::new(store).lease(Lease::new(lease));
    let running = spawn(Runner::new(guard, source.clone(), handler).max_attempts(4));
    wait_until(Duration::from_secs(90), "every message handled", || async {
        ["flaky-1", "order-2", "order-3"]
            .iter()
            .all(|k| effects.applied(k) == 1)
    })
    .await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;
    let letters = dead.read();
    dead.stop().await;

    assert!(
        report.retried_busy >= 1,
        "the dead consumer's key was found busy: {report:?}"
    );
    // The dead consumer's listener, its source dropped, may have answered
    // `ReconsumeLater` on its way out: a second copy (attempt 2) beside the
    // original read again from the committed offset. Either way no attempt
    // goes past the handler's failures plus one.
    let attempts = effects.attempts("flaky-1");
    assert_eq!(effects.calls("flaky-1"), 3, "{attempts:?}");
    assert!(
        attempts.iter().all(|&a| a <= 3),
        "only the handler's failures count: {attempts:?}"
    );
    assert!(letters.is_empty(), "nothing dead-lettered: {letters:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(report.handled, 3, "{report:?}");
}
