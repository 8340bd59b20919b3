//! Dead letters: the runner's (at its last attempt, or at once for a
//! permanent failure) carry idem's headers to `%DLQ%GROUP`; and the broker
//! parks a message there itself after `max_reconsume_times`; idem's
//! properties are one line each and replace the message's of the same name.

mod support;

use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner};
use support::{Claim, Effects, Fixture, guard, header, spawn};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_failing_every_attempt_are_dead_lettered_with_idem_headers() {
    let Some(f) = Fixture::new("dead").await else {
        return;
    };
    let dead = f.dead_letter_reader().await;
    f.publish("always-1", &[("tenant", "eu")], "{\"n\":1}")
        .await;
    f.publish("refused-2", &[], "{\"n\":2}").await;
    let source = f.source(f.config()).await;
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |m: Message, _claim: Claim| {
        let effects = seen.clone();
        async move {
            let key = m.id.clone().unwrap_or_default();
            effects.called(&key, m.attempt);
            if key.starts_with("refused") {
                Err::<idem_core::Bytes, _>(HandlerError::permanent("no such account"))
            } else {
                Err(HandlerError::transient("the ledger is down"))
            }
        }
    };
    let running =
        spawn(Runner::new(guard(Duration::from_secs(10)), source.clone(), handler).max_attempts(3));
    let letters = dead.wait_for(2).await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;
    dead.stop().await;

    assert_eq!(letters.len(), 2, "{letters:?}");
    let find = |key: &str| {
        letters
            .iter()
            .find(|m| m.id.as_deref() == Some(key))
            .unwrap_or_else(|| panic!("{key} is not among {letters:?}"))
    };
    let always = find("always-1");
    assert_eq!(header(always, "idem-key"), "always-1");
    assert_eq!(header(always, "idem-attempts"), "3");
    assert!(header(always, "idem-last-error").contains("the ledger is down"));
    assert_eq!(
        header(always, "tenant"),
        "eu",
        "its own properties are kept"
    );
    assert_eq!(always.body.as_ref(), b"{\"n\":1}");
    let refused = find("refused-2");
    assert_eq!(header(refused, "idem-attempts"), "1");
    assert!(header(refused, "idem-last-error").contains("no such account"));
    assert_eq!(effects.attempts("always-1"), [1, 2, 3]);
    assert_eq!(effects.attempts("refused-2"), [1]);
    assert_eq!(report.dead_lettered, 2, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_parks_a_message_after_max_reconsume_times() {
    let Some(f) = Fixture::new("parked").await else {
        return;
    };
    let dead = f.dead_letter_reader().await;
    f.publish("always-1", &[], "{}").await;
    // The runner would try 100 times; the broker stops after 2 redeliveries.
    let source = f.source(f.config().max_reconsume_times(2)).await;
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |m: Message, _claim: Claim| {
        let effects = seen.clone();
        async move {
            effects.called(m.id.as_deref().unwrap_or_default(), m.attempt);
            Err::<idem_core::Bytes, _>(HandlerError::transient("down"))
        }
    };
    let running = spawn(
        Runner::new(guard(Duration::from_secs(10)), source.clone(), handler).max_attempts(100),
    );
    let letters = dead.wait_for(1).await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;
    dead.stop().await;

    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].id.as_deref(), Some("always-1"));
    assert_eq!(
        header(&letters[0], "idem-attempts"),
        "",
        "the broker adds no idem headers"
    );
    assert_eq!(effects.attempts("always-1"), [1, 2, 3]);
    assert_eq!(report.dead_lettered, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_with_property_separators_cannot_inject_properties_into_a_dead_letter() {
    let Some(f) = Fixture::new("deadsep").await else {
        return;
    };
    let dead = f.dead_letter_reader().await;
    f.publish("order-1", &[], "{}").await;
    let source = f.source(f.config()).await;
    // The property encoding is `name\u{1}value\u{2}`: unescaped, this text
    // would end idem-last-error and add a `KEYS` property of `x`.
    let handler = |_m: Message, _claim: Claim| async move {
        Err::<idem_core::Bytes, _>(HandlerError::permanent(
            "refused\u{1}KEYS\u{2}x\u{2}\nsecond line",
        ))
    };
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        handler,
    ));
    let letters = dead.wait_for(1).await;
    f.wait_drained().await;
    let report = running.stop().await;
    source.shutdown().await;
    dead.stop().await;

    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let letter = &letters[0];
    assert_eq!(
        letter.id.as_deref(),
        Some("order-1"),
        "KEYS is the original's"
    );
    let mut names: Vec<_> = letter.headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "idem-attempts",
            "idem-dead-lettered-at",
            "idem-key",
            "idem-last-error"
        ],
        "exactly idem's properties"
    );
    let last = header(letter, "idem-last-error");
    assert!(!last.chars().any(char::is_control), "one line: {last:?}");
    assert!(
        last.contains(r"refused\u{1}KEYS\u{2}x\u{2}\nsecond line"),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_letter_dead_lettered_again_carries_only_the_new_idem_properties() {
    let Some(f) = Fixture::new("deadreplay").await else {
        return;
    };
    let dead = f.dead_letter_reader().await;
    // A dead letter published back, its idem properties spelled as another
    // tool wrote them.
    f.publish(
        "order-1",
        &[("tenant", "eu"), ("IDEM-LAST-ERROR", "the old error")],
        "{}",
    )
    .await;
    let source = f.source(f.config()).await;
    let handler = |_m: Message, _claim: Claim| async move {
        Err::<idem_core::Bytes, _>(HandlerError::permanent("the new error"))
    };
    let running = spawn(Runner::new(
        guard(Duration::from_secs(10)),
        source.clone(),
        handler,
    ));
    let letters = dead.wait_for(1).await;
    f.wait_drained().await;
    running.stop().await;
    source.shutdown().await;
    dead.stop().await;

    let letter = &letters[0];
    let mut names: Vec<_> = letter.headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "idem-attempts",
            "idem-dead-lettered-at",
            "idem-key",
            "idem-last-error",
            "tenant"
        ],
        "idem's replace the old ones"
    );
    assert_eq!(header(letter, "idem-last-error"), "the new error");
}
