//! A failed message comes back through the group's `%RETRY%` topic with
//! the broker's reconsume count as its attempt, its properties intact.

mod support;

use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner};
use support::{Claim, Effects, Fixture, done, guard, header, spawn, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_messages_come_back_through_the_retry_topic_with_attempt_counts() {
    let Some(f) = Fixture::new("retry").await else {
        return;
    };
    f.publish("order-1", &[("tenant", "eu")], "{\"n\":1}").await;
    f.publish("order-2", &[], "{\"n\":2}").await;
    let source = f.source(f.config()).await;
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |m: Message, _claim: Claim| {
        let effects = seen.clone();
        async move {
            let key = m.id.clone().unwrap_or_default();
            effects.called(&key, m.attempt);
            assert_eq!(
                m.body.as_ref(),
                if key == "order-1" {
                    b"{\"n\":1}"
                } else {
                    b"{\"n\":2}"
                }
            );
            if key == "order-1" {
                assert_eq!(header(&m, "tenant"), "eu", "properties survive the retry");
                if m.attempt < 3 {
                    return Err(HandlerError::transient("the ledger is down"));
                }
            }
            effects.apply(&key);
            done()
        }
    };
    let running =
        spawn(Runner::new(guard(Duration::from_secs(10)), source.clone(), handler).max_attempts(5));
    wait_until(Duration::from_secs(90), "order-1 applied", || async {
        effects.applied("order-1") == 1 && effects.applied("order-2") == 1
    })
    .await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;

    assert_eq!(
        effects.attempts("order-1"),
        [1, 2, 3],
        "each redelivery counts one more"
    );
    assert_eq!(effects.attempts("order-2"), [1]);
    assert_eq!(report.retried_failed, 2, "{report:?}");
    assert_eq!(report.handled, 2, "{report:?}");
}
