//! Failures are retried at the broker after a backoff, exhausted messages
//! are dead-lettered with their headers, and a key held elsewhere waits in
//! the runner, retried a handful of times rather than spun on, without
//! using up the server's delivery count.

mod support;

use std::time::Duration;

use idem_consumer::{Backoff, HandlerError, KeyFrom, Runner};
use idem_core::{Begin, Key, Lease, MemoryStore, Namespace, Store};
use support::{Effects, Fixture, done, guard, spawn, wait_settled, wait_until};
use tokio::time::Instant;

fn exact(initial_ms: u64) -> Backoff {
    Backoff {
        initial: Duration::from_millis(initial_ms),
        max: Duration::from_secs(5),
        jitter: 0.0,
    }
}

#[tokio::test]
async fn failing_twice_then_succeeding_takes_effect_once_after_backoff() {
    let Some(f) = Fixture::new("retry").await else {
        return;
    };
    let source = f.source(f.config()).await;
    f.publish("paid", "order-1", &[], "{}").await;
    let effects = Effects::default();
    let seen = effects.clone();
    let times = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let at = times.clone();
    let handler = move |m: idem_consumer::Message, _claim: support::Claim| {
        let effects = seen.clone();
        let at = at.clone();
        async move {
            let key = m.id.clone().unwrap();
            effects.called(&key, m.attempt);
            at.lock().push(Instant::now());
            if effects.calls(&key) <= 2 {
                return Err(HandlerError::transient("the payment service is down"));
            }
            effects.apply(&key);
            done()
        }
    };
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler).backoff(exact(300)),
    );
    wait_until(Duration::from_secs(10), "the third attempt", || async {
        effects.applied("order-1") == 1
    })
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    assert_eq!(effects.applied("order-1"), 1);
    assert_eq!(
        effects.attempts("order-1"),
        [1, 2, 3],
        "attempts from the delivery count"
    );
    let times = times.lock().clone();
    // The backoff doubles: 300 ms, then 600 ms, waited at the broker.
    assert!(
        times[1] - times[0] >= Duration::from_millis(280),
        "{times:?}"
    );
    assert!(
        times[2] - times[1] >= Duration::from_millis(580),
        "{times:?}"
    );
    assert_eq!(
        (report.retried_failed, report.handled),
        (2, 1),
        "{report:?}"
    );
}

#[tokio::test]
async fn always_failing_is_dead_lettered_after_max_attempts_with_its_headers() {
    let Some(f) = Fixture::new("dead").await else {
        return;
    };
    let source = f.source(f.config()).await;
    f.publish("paid", "order-9", &[("tenant", "acme")], r#"{"amount":12}"#)
        .await;
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |m: idem_consumer::Message, _claim: support::Claim| {
        let effects = seen.clone();
        async move {
            effects.called("order-9", m.attempt);
            Err::<idem_core::Bytes, _>(HandlerError::transient("card declined"))
        }
    };
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler)
            .max_attempts(3)
            .backoff(exact(100)),
    );
    wait_until(Duration::from_secs(10), "the dead letter", || async {
        f.js.get_stream(format!("{}_dead-letter", f.stream))
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages
            == 1
    })
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    assert_eq!(effects.attempts("order-9"), [1, 2, 3]);
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let dead = f.dead_letters().await;
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.subject.as_str(), format!("{}.dead-letter", f.stream));
    assert_eq!(&d.payload[..], br#"{"amount":12}"#, "the body is kept");
    let h = |name: &str| d.headers.get_last(name).map(|v| v.as_str().to_owned());
    assert_eq!(h("tenant").as_deref(), Some("acme"), "headers are kept");
    assert_eq!(h("idem-message-id").as_deref(), Some("order-9"));
    assert_eq!(
        h("Nats-Msg-Id"),
        Some(format!("{}:1", f.stream)),
        "deduplicated per stream message"
    );
    assert_eq!(h("idem-key").as_deref(), Some("order-9"));
    assert_eq!(h("idem-attempts").as_deref(), Some("3"));
    let last = h("idem-last-error").unwrap();
    assert!(last.contains("card declined"), "{last}");
}

#[tokio::test]
async fn a_key_held_elsewhere_waits_in_the_runner_without_using_up_deliveries() {
    let Some(f) = Fixture::new("busy").await else {
        return;
    };
    let source = f.source(f.config()).await;
    let store = MemoryStore::new();
    // Another consumer holds the key for 1.5 s and then vanishes.
    let key = Key::in_namespace(Namespace::new(&f.stream).unwrap(), "order-5").unwrap();
    let held = store
        .begin(&key, None, Lease::new(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert!(matches!(held, Begin::Acquired(_)));
    let started = Instant::now();
    f.publish("paid", "order-5", &[], "{}").await;
    let effects = Effects::default();
    let handler = effects.handler(Duration::ZERO);
    let guard = idem_core::Guard::new(store).lease(Lease::new(Duration::from_secs(10)));
    let running = spawn(Runner::new(guard, source.clone(), handler).key(KeyFrom::MessageId));
    wait_until(Duration::from_secs(10), "the takeover", || async {
        effects.applied("order-5") == 1
    })
    .await;
    wait_settled(&source).await;
    let report = running.stop().await;

    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "not before the lease expired"
    );
    assert_eq!(effects.calls("order-5"), 1);
    assert!(
        (1..=5).contains(&report.retried_busy),
        "retried a handful of times, not spun: {report:?}"
    );
    // A busy retry waits in the runner, kept alive, instead of a nak that
    // the server would count as a delivery.
    assert_eq!(effects.attempts("order-5"), [1], "no delivery used up");
}

#[tokio::test]
async fn dead_letters_of_two_messages_sharing_a_producer_id_are_both_kept() {
    let Some(f) = Fixture::new("deadtwice").await else {
        return;
    };
    // A short duplicate window lets the producer reuse an id, as a replay
    // of a dead letter does once the window has passed.
    f.js.create_stream(async_nats::jetstream::stream::Config {
        name: f.stream.clone(),
        subjects: vec![format!("{}.>", f.prefix)],
        duplicate_window: Duration::from_millis(200),
        ..Default::default()
    })
    .await
    .unwrap();
    let source = f.source(f.config()).await;
    f.publish("paid", "order-7", &[("order-id", "a")], "first")
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    f.publish("paid", "order-7", &[("order-id", "b")], "second")
        .await;
    let handler = |_m: idem_consumer::Message, _claim: support::Claim| async move {
        Err::<idem_core::Bytes, _>(HandlerError::permanent("malformed order"))
    };
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler)
            .key(KeyFrom::Header("order-id".into())),
    );
    wait_settled(&source).await;
    let report = running.stop().await;

    assert_eq!(report.dead_lettered, 2, "{report:?}");
    let bodies: Vec<_> = f
        .dead_letters()
        .await
        .iter()
        .map(|d| d.payload.clone())
        .collect();
    assert_eq!(
        bodies,
        ["first", "second"],
        "neither was dropped as a duplicate"
    );
}
