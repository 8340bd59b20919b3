//! A store that fails while the guard stores a handler's outcome does not
//! make the handler run again: `complete` by the same token is idempotent
//! (docs/contract.md §2), so the guard retries it while the watchdog keeps
//! the lease, and on for two leases past the lease's end (a `complete`
//! refused as stale then stores the outcome under a new claim), and only
//! then gives up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{Disposition, Guard, GuardError, Key, Lease, MemoryStore, Record, Store};
use idem_testkit::faults::Switchable;
use tokio::time::Instant;

fn key(k: &str) -> Key {
    Key::new("storing-the-outcome", k.to_owned()).unwrap()
}

fn count(n: &AtomicU32) -> u32 {
    n.load(Ordering::SeqCst)
}

/// Takes the store down now and brings it back after `outage`.
fn blip(store: &Switchable<MemoryStore>, outage: Duration) {
    store.set_down(true);
    let store = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(outage).await;
        store.set_down(false);
    });
}

/// A 500 ms outage as the handler returns (ten times what three quick
/// tries would cover) still stores the outcome, and a redelivery gets it
/// without running the handler again.
#[tokio::test(start_paused = true)]
async fn a_half_second_store_blip_at_completion_stores_the_outcome_once() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone());
    let runs = AtomicU32::new(0);
    let k = key("blip");
    let start = Instant::now();
    for _delivery in 0..2 {
        let r = guard
            .run(&k, None, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                blip(&store, Duration::from_millis(500));
                Ok::<_, String>(7)
            })
            .await;
        assert_eq!(r.unwrap(), 7);
    }
    assert_eq!(count(&runs), 1, "the handler ran once");
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(1500),
        "stored once the store was back, within a retry pause: {elapsed:?}"
    );
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::Completed(_))
    ));
}

/// The watchdog keeps renewing while the outcome is retried: an outage of
/// `complete` that outlasts the lease the handler finished with still ends
/// in a stored outcome, because the renewals moved the lease's end out.
#[tokio::test(start_paused = true)]
async fn renewals_keep_the_lease_while_the_outcome_is_retried() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(9));
    let k = key("renewed");
    let start = Instant::now();
    let failing = store.clone();
    let r = guard
        .run(&k, None, |_| async move {
            // Just before the first renewal (at 3 s): the lease then ends
            // at 9 s unless renewed, and `complete` fails until 9.5 s.
            tokio::time::sleep(Duration::from_millis(2900)).await;
            failing.fail_next_completes(u32::MAX);
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(9500)).await;
                failing.fail_next_completes(0);
            });
            Ok::<_, String>(7)
        })
        .await;
    assert_eq!(
        r.unwrap(),
        7,
        "stored after the first lease would have ended"
    );
    assert!(start.elapsed() >= Duration::from_millis(9500));
    assert!(
        count(&store.calls().extend) >= 3,
        "renewed at 3, 6 and 9 s while retrying"
    );
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::Completed(_))
    ));
}

/// A store that stays down: the guard gives up with the store's error just
/// before two leases past the last known lease end (its last retry cut to
/// land within the timer's millisecond before it), not earlier, and leaves
/// the claim to expire (the message is retried later). Tokio's timer wakes
/// a sleep at the next whole millisecond, so the guard leaves that much
/// room: the last retry must never land on the deadline itself.
#[tokio::test(start_paused = true)]
async fn storing_the_outcome_gives_up_two_leases_past_the_lease_end_when_the_store_stays_down() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    let k = key("down");
    let start = Instant::now();
    let runs = AtomicU32::new(0);
    let r = guard
        .run(&k, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            store.set_down(true);
            Ok::<_, String>(7)
        })
        .await;
    let gave_up_after = start.elapsed();
    let e = r.unwrap_err();
    assert!(matches!(e, GuardError::Store(_)), "{e:?}");
    assert_eq!(e.disposition(), Disposition::RetryLater { after: None });
    assert!(
        gave_up_after >= Duration::from_millis(89_990) && gave_up_after < Duration::from_secs(90),
        "gave up just before two leases past the lease's end: {gave_up_after:?}"
    );
    assert_eq!(count(&runs), 1);
    store.set_down(false);
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress(_))),
        "the claim is left to expire"
    );
}

/// A store that renews the lease but never stores the outcome does not
/// hold the message forever: the retries end three leases after they
/// began.
#[tokio::test(start_paused = true)]
async fn a_store_that_renews_but_never_stores_gives_up_after_three_leases() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(6));
    let start = Instant::now();
    let r = guard
        .run(&key("never"), None, |_| async {
            store.fail_next_completes(u32::MAX);
            Ok::<_, String>(7)
        })
        .await;
    let gave_up_after = start.elapsed();
    assert!(matches!(r, Err(GuardError::Store(_))), "{r:?}");
    assert!(
        gave_up_after >= Duration::from_millis(17_990) && gave_up_after < Duration::from_secs(18),
        "{gave_up_after:?}"
    );
    assert!(count(&store.calls().extend) >= 1, "renewed meanwhile");
}

/// The pause between tries grows to a second and no further: a 20 s outage
/// takes between 20 and 60 tries, and the outcome lands within a second of
/// the store's return.
#[tokio::test(start_paused = true)]
async fn retries_back_off_to_a_pause_of_at_most_a_second() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(120));
    let start = Instant::now();
    let r = guard
        .run(&key("backoff"), None, |_| async {
            blip(&store, Duration::from_secs(20));
            Ok::<_, String>(7)
        })
        .await;
    assert_eq!(r.unwrap(), 7);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(20) && elapsed <= Duration::from_secs(21),
        "{elapsed:?}"
    );
    let tries = count(&store.calls().complete);
    assert!((20..=60).contains(&tries), "{tries} tries");
}

/// Dropping the guard's future while the outcome is being retried stops
/// the retries and releases the claim: a redelivery runs at once.
#[tokio::test(start_paused = true)]
async fn dropping_the_run_while_the_outcome_is_retried_releases_the_claim() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone());
    let k = key("dropped");
    let failing = store.clone();
    let run = tokio::spawn({
        let (guard, k) = (guard.clone(), k.clone());
        async move {
            guard
                .run(&k, None, |_| async move {
                    failing.fail_next_completes(u32::MAX);
                    Ok::<_, String>(7)
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tries = count(&store.calls().complete);
    assert!(tries > 1, "retrying");
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    store.fail_next_completes(0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(store.get(&k).await.unwrap(), None, "released");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        count(&store.calls().complete),
        tries,
        "no retry after the drop"
    );
    let again = Arc::new(AtomicU32::new(0));
    let ran = again.clone();
    guard
        .run(&k, None, |_| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(8)
        })
        .await
        .unwrap();
    assert_eq!(count(&again), 1, "the redelivery ran");
}

/// Holders that failed together do not retry in step: each pause is cut
/// by a random part, so runs whose outcomes failed at the same moment store
/// them at different moments once the store is back.
#[tokio::test(start_paused = true)]
async fn holders_failing_together_retry_at_different_moments() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone());
    store.fail_next_completes(u32::MAX);
    let back = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        back.fail_next_completes(0);
    });
    let start = Instant::now();
    let runs = (0..8).map(|n| {
        let guard = guard.clone();
        async move {
            guard
                .run(&key(&format!("together-{n}")), None, |_| async {
                    Ok::<_, String>(n)
                })
                .await
                .unwrap();
            start.elapsed()
        }
    });
    let mut stored_at = futures_util::future::join_all(runs).await;
    stored_at.sort();
    stored_at.dedup();
    assert!(stored_at.len() > 1, "all retried in step: {stored_at:?}");
}

/// A failure that retrying cannot mend (the store refuses the retention)
/// is not retried: one try, then the error, and the key is released.
#[tokio::test(start_paused = true)]
async fn a_refused_complete_is_not_retried() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).retention(Duration::from_secs(400 * 24 * 3600));
    let k = key("refused");
    let r = guard.run(&k, None, |_| async { Ok::<_, String>(7) }).await;
    assert!(matches!(r, Err(GuardError::Invalid(_))), "{r:?}");
    assert_eq!(count(&store.calls().complete), 1, "tried once");
    assert_eq!(store.get(&k).await.unwrap(), None, "released");
}

/// A store down a little longer than the lease (a database restarting)
/// when the handler succeeds, in real time (the store's lease runs out): the guard keeps trying to store the outcome
/// past the lease's end and, the store back, claims the key again and
/// stores it, rather than hand the message back to run the effect again.
/// A store down for longer than the retries' bound hands it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_outlives_a_store_outage_a_little_longer_than_the_lease() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_millis(300));
    let runs = AtomicU32::new(0);
    let k = key("outage");
    let r = guard
        .run(&k, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            blip(&store, Duration::from_millis(450));
            Ok::<_, String>(7)
        })
        .await;
    assert_eq!(r.expect("the outcome is stored once the store is back"), 7);
    let Some(Record::Completed(done)) = store.get(&k).await.unwrap() else {
        panic!("the key is completed");
    };
    assert_eq!(done.outcome.as_deref(), Some(&b"7"[..]));
    let again = guard
        .run(&k, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(0)
        })
        .await;
    assert_eq!((again.unwrap(), count(&runs)), (7, 1));

    // Down for much longer: the message is handed back (retry later)
    // within three leases of the handler's end, not held forever.
    let k = key("long-outage");
    let started = std::time::Instant::now();
    let r = guard
        .run(&k, None, |_| async {
            blip(&store, Duration::from_secs(3));
            Ok::<_, String>(8)
        })
        .await;
    assert!(matches!(r, Err(GuardError::Store(_))), "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(1_500));
    assert_eq!(
        r.unwrap_err().disposition(),
        Disposition::RetryLater { after: None }
    );
}

/// Dropping the run while it retries storing past the lease's end stops
/// the retries: nothing is stored later on the dropped run's behalf, and
/// the key is free for the next delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_while_storing_late_stores_nothing_and_frees_the_key() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_millis(200));
    let k = key("dropped-late");
    let running = tokio::spawn({
        let (guard, k, store) = (guard.clone(), k.clone(), store.clone());
        async move {
            guard
                .run(&k, None, |_| async move {
                    store.set_down(true);
                    Ok::<_, String>(1)
                })
                .await
        }
    });
    // Past the lease's end, inside the retries' bound.
    tokio::time::sleep(Duration::from_millis(320)).await;
    assert!(!running.is_finished(), "the guard still retries");
    running.abort();
    let _ = running.await;
    store.set_down(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !matches!(store.get(&k).await.unwrap(), Some(Record::Completed(_))),
        "the dropped run stored its outcome"
    );
    let runs = AtomicU32::new(0);
    let r = guard
        .run(&k, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(2)
        })
        .await;
    assert_eq!((r.unwrap(), count(&runs)), (2, 1));
}
