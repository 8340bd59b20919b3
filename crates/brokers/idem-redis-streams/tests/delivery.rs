//! Entries reach the handler once per message id, however often they are
//! published, and however many consumers share the group.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner, Source};
use idem_core::{Bytes, ClaimHandle};
use support::{Effects, Fixture, Running, eventually, guard, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_fields_become_the_message_and_an_ack_settles_it() {
    let Some(fx) = Fixture::new("layout") else {
        return;
    };
    let source = fx.source().await;
    let mut sent = message("m-1");
    sent.content_type = Some("application/json".into());
    sent.headers = vec![
        ("tenant".into(), Bytes::from("t9")),
        ("trace".into(), Bytes::from("abc")),
    ];
    sent.body = Bytes::from_static(b"{\"amount\":5}");
    let entry_id = fx.publisher().await.publish(&sent).await.unwrap();

    let got = source.fetch(10).await.unwrap();
    assert_eq!(got.len(), 1);
    let d = got.into_iter().next().unwrap();
    assert_eq!(d.receipt.entry_id(), entry_id);
    assert_eq!(d.message.id.as_deref(), Some("m-1"));
    assert_eq!(d.message.body, sent.body);
    assert_eq!(d.message.content_type.as_deref(), Some("application/json"));
    assert_eq!(d.message.headers, sent.headers);
    assert_eq!(d.message.attempt, 1);
    assert_eq!(
        fx.backlog().await.pending,
        1,
        "a fetched entry is pending until acked"
    );
    source.ack(d).await.unwrap();
    assert_eq!(fx.backlog().await.pending, 0);
    assert!(
        source.fetch(10).await.unwrap().is_empty(),
        "an acked entry is not read again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_take_effect_once_and_the_stream_drains() {
    let Some(fx) = Fixture::new("duplicates") else {
        return;
    };
    const N: usize = 200;
    let publisher = fx.publisher().await;
    // Every tenth id is published twice: half of those both up front, half
    // again by the handler while the first copy is being handled.
    let again_while_handled: HashSet<String> = (0..N)
        .filter(|i| i % 20 == 5)
        .map(|i| format!("o-{i}"))
        .collect();
    for i in 0..N {
        let id = format!("o-{i}");
        publisher.publish(&message(&id)).await.unwrap();
        if i % 20 == 0 {
            publisher.publish(&message(&id)).await.unwrap();
        }
    }
    let effects = Effects::default();
    let handler = {
        let (effects, publisher, again) = (
            effects.clone(),
            publisher.clone(),
            Arc::new(again_while_handled),
        );
        move |m: Message, _: ClaimHandle| {
            let (effects, publisher, again) = (effects.clone(), publisher.clone(), again.clone());
            async move {
                if again.contains(m.id.as_deref().unwrap_or_default()) {
                    publisher
                        .publish(&m)
                        .await
                        .map_err(HandlerError::transient)?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                effects.record(&m);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let source = fx.source().await;
    let running = Running::start(Runner::new(guard(10_000), source, handler).concurrency(16));
    eventually(
        Duration::from_secs(30),
        "all handled and the stream drained",
        || async { effects.total() >= N && fx.backlog().await.is_drained() },
    )
    .await;
    let report = running.stop().await;

    let all = effects.all();
    assert_eq!(all.len(), N);
    for (id, attempts) in &all {
        assert_eq!(attempts, &[1], "{id} took effect {} times", attempts.len());
    }
    assert_eq!(report.handled, N as u64);
    assert_eq!(report.duplicates, (N / 10) as u64, "{report:?}");
    assert!(
        fx.backlog().await.is_drained(),
        "entries left pending or parked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runners_on_one_group_share_the_work() {
    let Some(fx) = Fixture::new("share") else {
        return;
    };
    const N: usize = 200;
    let publisher = fx.publisher().await;
    for i in 0..N {
        publisher
            .publish(&message(&format!("s-{i}")))
            .await
            .unwrap();
    }
    let effects = Effects::default();
    let handler = |count: Arc<AtomicUsize>| {
        let effects = effects.clone();
        move |m: Message, _: ClaimHandle| {
            let (effects, count) = (effects.clone(), count.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                effects.record(&m);
                count.fetch_add(1, Ordering::Relaxed);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let (a_count, b_count) = (Arc::default(), Arc::default());
    let guard = guard(10_000);
    let a = fx.source_with(fx.config().consumer("a")).await;
    let b = fx.source_with(fx.config().consumer("b")).await;
    assert_eq!(a.consumer(), "a");
    let a =
        Running::start(Runner::new(guard.clone(), a, handler(Arc::clone(&a_count))).concurrency(8));
    let b = Running::start(Runner::new(guard, b, handler(Arc::clone(&b_count))).concurrency(8));
    eventually(Duration::from_secs(30), "all handled", || async {
        effects.total() >= N && fx.backlog().await.is_drained()
    })
    .await;
    let (ra, rb) = (a.stop().await, b.stop().await);

    let (a_count, b_count) = (
        a_count.load(Ordering::Relaxed),
        b_count.load(Ordering::Relaxed),
    );
    assert!(
        a_count > 0 && b_count > 0,
        "one runner did all the work: a {a_count}, b {b_count}"
    );
    assert_eq!(a_count + b_count, N);
    assert_eq!(effects.all().len(), N);
    assert!(effects.all().values().all(|v| v == &[1]));
    assert_eq!(ra.handled + rb.handled, N as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_under_a_consumer_is_consumed_again_once_recreated() {
    let Some(fx) = Fixture::new("recreated") else {
        return;
    };
    let source = fx.source().await;
    let client = redis::Client::open(fx.server.as_str()).unwrap();
    let _: () = redis::Commands::del(&mut client.get_connection().unwrap(), &fx.stream).unwrap();
    let publisher = fx.publisher().await;
    publisher.publish(&message("n-1")).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let got = loop {
        match source.fetch(10).await {
            Ok(got) if !got.is_empty() => break got,
            _ if tokio::time::Instant::now() > deadline => panic!("the new stream is never read"),
            _ => {}
        }
    };
    assert_eq!(got[0].message.id.as_deref(), Some("n-1"));
}
