//! Rebalances lose nothing: a member joining takes partitions over from
//! their committed offsets, a member leaving commits what it finished
//! first, and the guard absorbs what is handed over twice.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use parking_lot::Mutex;
use support::{Effects, Fixture, Running, wait_until};

/// A handler that takes a few ms, so work is in flight when partitions
/// move; records one effect per call and who made it.
fn slow(
    effects: Effects,
    by: Arc<Mutex<Vec<&'static str>>>,
    me: &'static str,
) -> impl Fn(
    Message,
    ClaimHandle,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Bytes, HandlerError>> + Send>>
+ Send
+ Sync
+ Clone {
    move |m: Message, _c: ClaimHandle| {
        let (effects, by) = (effects.clone(), by.clone());
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            *effects.0.lock().entry(m.id.clone().unwrap()).or_default() += 1;
            by.lock().push(me);
            Ok(Bytes::new())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joining_and_one_leaving_lose_nothing() {
    let Some(f) = Fixture::new("rebalance", 4).await else {
        return;
    };
    let total = 600;
    for i in 0..total {
        f.publish(&format!("m-{i}"), Some(i % 4), "{}").await;
    }
    let store = MemoryStore::new();
    let effects = Effects::default();
    let by = Arc::new(Mutex::new(Vec::new()));

    // A short session, in case the broker moves partitions only when a
    // member's session ends rather than when it leaves.
    let url = "&session.timeout.ms=6000&heartbeat.interval.ms=500";
    let a = f.source(url).await;
    let run_a = Running::start(
        Runner::new(
            Guard::new(store.clone()),
            a.clone(),
            slow(effects.clone(), by.clone(), "a"),
        )
        .concurrency(4),
    );
    wait_until("a's first effects", Duration::from_secs(30), || {
        effects.count() >= 100
    })
    .await;

    let b = f.source(url).await;
    let run_b = Running::start(
        Runner::new(
            Guard::new(store.clone()),
            b.clone(),
            slow(effects.clone(), by.clone(), "b"),
        )
        .concurrency(4),
    );
    let mut b_held = Vec::new();
    wait_until("b to get partitions", Duration::from_secs(30), || {
        b_held = b.assignment();
        !b_held.is_empty()
    })
    .await;
    let a_held = a.assignment();
    assert!(
        a_held.iter().all(|tp| !b_held.contains(tp)),
        "no partition is held twice: a {a_held:?}, b {b_held:?}"
    );
    wait_until("half the effects", Duration::from_secs(60), || {
        effects.count() >= total as usize / 2
    })
    .await;

    // a leaves: its partitions go to b, from what a committed on revoke.
    run_a.stop().await;
    a.close().await;
    let more = 40;
    for i in total..total + more {
        f.publish(&format!("m-{i}"), Some(i % 4), "{}").await;
    }
    let main_of_b = || -> Vec<(String, i32)> {
        b.assignment()
            .into_iter()
            .filter(|(t, _)| *t == f.topic)
            .collect()
    };
    wait_until("b to hold every partition", Duration::from_secs(60), || {
        main_of_b().len() == 4
    })
    .await;
    let all = (total + more) as usize;
    wait_until("every effect", Duration::from_secs(60), || {
        effects.count() == all
    })
    .await;
    f.wait_committed_to_end().await;
    let report_b = run_b.stop().await;
    b.close().await;

    assert!(
        effects.doubled().is_empty(),
        "doubled: {:?}",
        effects.doubled()
    );
    let by = by.lock();
    let (from_a, from_b) = (
        by.iter().filter(|w| **w == "a").count(),
        by.iter().filter(|w| **w == "b").count(),
    );
    assert!(
        from_a > 0 && from_b > 0,
        "both members worked: a {from_a}, b {from_b}"
    );
    eprintln!("rebalance: a {from_a}, b {from_b}, b's report {report_b:?}");
}

/// Without a guard (the handler's own table would be the dedup), a
/// message handed to a new member after a revoke would run twice: the
/// revoke waits for the work in flight and commits it first, so nothing
/// runs twice even here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_waits_for_work_in_flight_and_commits_it_first() {
    let Some(f) = Fixture::new("revoke", 2).await else {
        return;
    };
    for p in 0..2 {
        f.publish(&format!("slow-{p}"), Some(p), "{}").await;
    }
    for i in 0..20 {
        f.publish(&format!("m-{i}"), Some(i % 2), "{}").await;
    }
    let effects = Effects::default();
    let started = Arc::new(Mutex::new(0));
    let handler = {
        let (effects, started) = (effects.clone(), started.clone());
        move |m: Message, _c: ClaimHandle| {
            let (effects, started) = (effects.clone(), started.clone());
            async move {
                let id = m.id.clone().unwrap();
                if id.starts_with("slow") {
                    *started.lock() += 1;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                *effects.0.lock().entry(id).or_default() += 1;
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let url = "&session.timeout.ms=6000&heartbeat.interval.ms=500";
    let a = f.source(url).await;
    let run_a = Running::start(Runner::unguarded(a.clone(), handler.clone()).ordered(true));
    wait_until(
        "both slow messages to start",
        Duration::from_secs(30),
        || *started.lock() == 2,
    )
    .await;
    let b = f.source(url).await;
    let run_b = Running::start(Runner::unguarded(b.clone(), handler).ordered(true));
    wait_until("every effect", Duration::from_secs(60), || {
        effects.count() == 22
    })
    .await;
    f.wait_committed_to_end().await;
    run_a.stop().await;
    run_b.stop().await;
    a.close().await;
    b.close().await;
    assert!(
        effects.doubled().is_empty(),
        "ran twice: {:?}",
        effects.doubled()
    );
    assert_eq!(*started.lock(), 2, "each slow message started once");
}
