//! The guard's guarantees (docs/contract.md §3), against the memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{
    Disposition, Failure, Fingerprint, Guard, GuardError, Key, Lease, ManualClock, MemoryStore,
    Record, Store, StoreError,
};
use idem_testkit::faults::Switchable;
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    amount: u32,
    id: String,
}

fn key(k: &str) -> Key {
    Key::new("guard", k.to_owned()).unwrap()
}

#[tokio::test]
async fn duplicate_deliveries_run_the_handler_once() {
    let guard = Guard::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    for _ in 0..5 {
        let receipt = guard
            .run(&key("once"), None, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Receipt {
                    amount: 10,
                    id: "r-1".into(),
                })
            })
            .await
            .unwrap();
        assert_eq!(
            receipt,
            Receipt {
                amount: 10,
                id: "r-1".into()
            }
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_run_once_and_the_rest_retry_later() {
    let guard = Arc::new(Guard::new(MemoryStore::new()));
    let runs = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (guard, runs) = (guard.clone(), runs.clone());
            tokio::spawn(async move {
                guard
                    .run(&key("concurrent"), None, |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::io::Error>(1)
                    })
                    .await
            })
        })
        .collect();
    let mut busy = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(1) => {}
            Err(e @ GuardError::InProgress { .. }) => {
                assert!(matches!(
                    e.disposition(),
                    Disposition::RetryLater { after: Some(_) }
                ));
                busy += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(busy >= 1);
}

#[tokio::test]
async fn handler_error_releases_so_a_redelivery_runs_again() {
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone());
    let failed = guard
        .run(&key("retry"), None, |_| async { Err::<u32, _>("boom") })
        .await;
    assert!(matches!(failed, Err(GuardError::Handler("boom"))));
    assert_eq!(store.get(&key("retry")).await.unwrap(), None);
    let ok = guard
        .run(&key("retry"), None, |_| async { Ok::<_, &str>(7) })
        .await;
    assert_eq!(ok.unwrap(), 7);
}

#[tokio::test]
async fn compensation_runs_before_the_claim_is_released() {
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone());
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let store2 = store.clone();
    let r = guard
        .run_compensated(
            &key("compensate"),
            None,
            |_| async { Err::<u32, _>("half done") },
            move |failure| {
                let what = match failure {
                    Failure::Error(e) => e.to_string(),
                    Failure::Panicked => "panic".into(),
                };
                async move {
                    let record = store2.get(&key("compensate")).await.unwrap();
                    *seen2.lock().unwrap() = Some((what, record));
                }
            },
        )
        .await;
    assert!(matches!(r, Err(GuardError::Handler("half done"))));
    let (what, record) = seen.lock().unwrap().take().expect("compensation ran");
    assert_eq!(what, "half done");
    assert!(
        matches!(record, Some(Record::InProgress(_))),
        "still held while compensating"
    );
    assert_eq!(
        store.get(&key("compensate")).await.unwrap(),
        None,
        "released after"
    );
}

#[tokio::test]
async fn panic_releases_and_propagates() {
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone());
    let k = key("panic");
    let run = tokio::spawn({
        let guard = guard.clone();
        let k = k.clone();
        async move {
            guard
                .run(&k, None, |_| async {
                    if true {
                        panic!("handler exploded");
                    }
                    Ok::<u32, String>(1)
                })
                .await
        }
    });
    assert!(run.await.unwrap_err().is_panic());
    assert_eq!(store.get(&k).await.unwrap(), None);
}

#[tokio::test]
async fn dropped_future_releases_the_claim() {
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone());
    let k = key("dropped");
    let running = tokio::spawn({
        let (guard, k) = (guard.clone(), k.clone());
        async move {
            guard
                .run(&k, None, |_| async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok::<u32, String>(1)
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::InProgress(_))
    ));
    running.abort();
    let _ = running.await;
    for _ in 0..100 {
        if store.get(&k).await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the dropped run's claim was not released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_long_handler_holding_its_key() {
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone()).lease(Lease::from_millis(150));
    let k = key("watchdog");
    let run = tokio::spawn({
        let (guard, k) = (guard.clone(), k.clone());
        async move {
            guard
                .run(&k, None, |claim| async move {
                    // Four leases long; a live lease is never reported lost.
                    let lost = tokio::select! {
                        () = claim.lost() => true,
                        () = tokio::time::sleep(Duration::from_millis(600)) => false,
                    };
                    Ok::<_, String>(lost || claim.is_lost())
                })
                .await
        }
    });
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = store.begin(&k, None, Lease::from_secs(1)).await.unwrap();
        assert!(
            matches!(again, idem_core::Begin::InProgress { .. }),
            "the key was taken over from a live handler: {again:?}"
        );
    }
    assert!(
        !run.await.unwrap().unwrap(),
        "the handler was told its lease was lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_is_told_when_its_lease_is_lost() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let guard = Guard::new(store.clone()).lease(Lease::from_millis(90));
    let k = key("lost");
    let run = tokio::spawn({
        let (guard, k) = (guard.clone(), k.clone());
        async move {
            guard
                .run(&k, None, |claim| async move {
                    tokio::select! {
                        () = claim.lost() => {
                            assert!(claim.is_lost(), "is_lost agrees with lost()");
                            Err("lease lost")
                        }
                        () = tokio::time::sleep(Duration::from_secs(10)) => Ok(()),
                    }
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The store's time jumps past the lease: the next renewal is refused.
    clock.advance(Duration::from_secs(1));
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the handler should stop soon after the lease is lost")
        .unwrap();
    assert!(matches!(result, Err(GuardError::Handler("lease lost"))));
}

#[tokio::test]
async fn success_after_a_takeover_reports_the_lost_lease() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    let k = key("late");
    let r = guard
        .run(&k, None, |_| async {
            clock.advance(Duration::from_secs(31));
            // Another holder takes the expired claim over.
            let taken = store.begin(&k, None, Lease::from_secs(30)).await.unwrap();
            assert!(matches!(taken, idem_core::Begin::Acquired(_)));
            Ok::<_, String>(1)
        })
        .await;
    assert!(matches!(&r, Err(GuardError::LeaseLost { outcome }) if &outcome[..] == b"1"));
    assert_eq!(r.unwrap_err().disposition(), Disposition::Ack);
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::InProgress(_))
    ));
}

/// A lease that ran out while the handler worked, with no one taking the
/// key over: the work was done, so the guard claims the key again and
/// stores the outcome, rather than leave a record a later copy would run
/// again (and tell the caller to ack a message whose outcome was never
/// stored).
#[tokio::test]
async fn success_after_the_lease_ran_out_unclaimed_is_stored_under_a_new_claim() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    let k = key("late-alone");
    let runs = AtomicU32::new(0);
    let r = guard
        .run(&k, None, |claim| {
            let token = claim.token().map_or(0, |t| t.get());
            let (runs, clock) = (&runs, &clock);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                clock.advance(Duration::from_secs(31));
                Ok::<_, String>(token)
            }
        })
        .await;
    let first = r.expect("the outcome is stored under a new claim");
    let Some(Record::Completed(done)) = store.get(&k).await.unwrap() else {
        panic!("the key is completed");
    };
    assert!(done.token.get() > first, "a new claim's token completed it");
    assert_eq!(done.outcome.as_deref(), Some(first.to_string().as_bytes()));
    // A copy delivered now is a duplicate: the handler does not run again.
    let again = guard
        .run(&k, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(0)
        })
        .await
        .unwrap();
    assert_eq!((again, runs.load(Ordering::SeqCst)), (first, 1));
}

#[tokio::test]
async fn reused_key_with_other_content_is_a_mismatch() {
    let guard = Guard::new(MemoryStore::new());
    let k = key("mismatch");
    let a = Some(Fingerprint::sha256(b"amount=10"));
    let b = Some(Fingerprint::sha256(b"amount=99"));
    guard
        .run(&k, a, |_| async { Ok::<_, String>(1) })
        .await
        .unwrap();
    let r = guard.run(&k, b, |_| async { Ok::<_, String>(2) }).await;
    assert!(matches!(r, Err(GuardError::Mismatch)));
    assert_eq!(r.unwrap_err().disposition(), Disposition::DeadLetter);
}

#[tokio::test]
async fn unreachable_store_fails_closed_by_default() {
    let store = Switchable::new(MemoryStore::new());
    store.set_down(true);
    let ran = AtomicU32::new(0);
    let r = Guard::new(store.clone())
        .run(&key("closed"), None, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(1)
        })
        .await;
    assert!(matches!(r, Err(GuardError::Store(_))));
    assert_eq!(
        r.unwrap_err().disposition(),
        Disposition::RetryLater { after: None }
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn fail_open_runs_unguarded_when_configured() {
    let store = Switchable::new(MemoryStore::new());
    store.set_down(true);
    let r = Guard::new(store.clone())
        .fail_open(true)
        .run(&key("open"), None, |claim| async move {
            assert_eq!(claim.token(), None);
            Ok::<_, String>(5)
        })
        .await;
    assert_eq!(r.unwrap(), 5);
}

#[tokio::test]
async fn oversized_outcome_is_refused_and_the_key_released() {
    let store = MemoryStore::builder()
        .limits(idem_core::Limits {
            max_outcome_bytes: 8,
            ..Default::default()
        })
        .build();
    let guard = Guard::new(store.clone());
    let r = guard
        .run(&key("big"), None, |_| async {
            Ok::<_, String>("far more than eight bytes".to_string())
        })
        .await;
    assert!(matches!(
        r,
        Err(GuardError::Invalid(
            idem_core::InvalidInput::OutcomeTooLarge { .. }
        ))
    ));
    assert_eq!(store.get(&key("big")).await.unwrap(), None);
}

/// Renewals that fail warn the handler while its lease is still live, so it
/// can stop before anyone else may take the key over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewals_warn_the_handler_before_the_lease_runs_out() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_millis(600));
    let k = key("renewals-fail");
    let watched = store.clone();
    let r = guard
        .run(&k, None, |claim| async move {
            watched.set_down(true);
            tokio::select! {
                () = claim.lost() => {}
                () = tokio::time::sleep(Duration::from_secs(10)) => panic!("never warned"),
            }
            assert!(claim.is_lost());
            watched.set_down(false);
            // Warned in time: the store still holds the lease for this token.
            match watched.get(&key("renewals-fail")).await.unwrap() {
                Some(Record::InProgress(r)) => {
                    assert_eq!(Some(r.token), claim.token());
                    assert!(
                        r.lease_expires_at > idem_core::Clock::now(&idem_core::SystemClock),
                        "warned only after the lease ran out"
                    );
                }
                other => panic!("expected the claim, got {other:?}"),
            }
            Err::<u32, _>("stopped")
        })
        .await;
    assert!(matches!(r, Err(GuardError::Handler("stopped"))));
}

/// The handler sees its claim's token and attempt: 1 on a first
/// acquisition, 2 after taking over an abandoned claim, with a larger token.
#[tokio::test]
async fn handler_sees_its_token_and_attempt() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    let seen = |k: Key| {
        let (guard, store) = (guard.clone(), store.clone());
        async move {
            guard
                .run(&k.clone(), None, |claim| async move {
                    let Some(Record::InProgress(r)) = store.get(&k).await.unwrap() else {
                        panic!("the handler runs under a claim");
                    };
                    assert_eq!(claim.token(), Some(r.token), "the claim's own token");
                    Ok::<_, String>((r.token.get(), claim.attempt()))
                })
                .await
                .unwrap()
        }
    };
    let (first, attempt) = seen(key("attempt-fresh")).await;
    assert_eq!(attempt, 1);
    let abandoned = idem_testkit::cases::acquired(
        store
            .begin(&key("attempt-taken"), None, Lease::from_secs(1))
            .await
            .unwrap(),
    );
    clock.advance(Duration::from_secs(2));
    let (token, attempt) = seen(key("attempt-taken")).await;
    assert_eq!(attempt, 2, "a takeover is the second attempt");
    assert!(token > abandoned.token.get() && token > first);
}

fn count(n: &AtomicU32) -> u32 {
    n.load(Ordering::SeqCst)
}

/// The watchdog renews every third of the lease, not more often: a handler
/// shorter than a third of a lease is never renewed, and one of a lease and
/// a sixth is renewed three times.
#[tokio::test(start_paused = true)]
async fn watchdog_renews_every_third_of_the_lease() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    for (k, runs_for, renewals) in [("short", 9, 0), ("long", 35, 3)] {
        let before = count(&store.calls().extend);
        guard
            .run(&key(k), None, |claim| async move {
                tokio::time::sleep(Duration::from_secs(runs_for)).await;
                assert!(!claim.is_lost());
                Ok::<_, String>(())
            })
            .await
            .unwrap();
        assert_eq!(count(&store.calls().extend) - before, renewals, "{k}");
    }
}

/// A failed renewal is retried every twelfth of the lease until a third of
/// the lease is left; then the handler is told, 20 s into a 30 s lease.
#[tokio::test(start_paused = true)]
async fn failed_renewals_are_retried_until_a_third_of_the_lease_is_left() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    let down = store.clone();
    let start = tokio::time::Instant::now();
    let told_after = guard
        .run(&key("renewals-retried"), None, |claim| async move {
            down.set_down(true);
            claim.lost().await;
            down.set_down(false);
            Err::<(), _>(start.elapsed())
        })
        .await
        .unwrap_err();
    assert!(matches!(told_after, GuardError::Handler(d) if d == Duration::from_secs(20)));
    // At 10 s, then every 2.5 s: 12.5, 15 and 17.5 s.
    assert_eq!(count(&store.calls().extend), 4);
}

/// A run that completes leaves nothing to release; one that fails releases
/// once.
#[tokio::test]
async fn completed_runs_release_nothing() {
    let store = Switchable::new(MemoryStore::new());
    let guard = Guard::new(store.clone());
    guard
        .run(&key("no-release"), None, |_| async { Ok::<_, String>(1) })
        .await
        .unwrap();
    tokio::task::yield_now().await;
    assert_eq!(count(&store.calls().release), 0);
    let _ = guard
        .run(&key("one-release"), None, |_| async { Err::<u32, _>("no") })
        .await;
    assert_eq!(count(&store.calls().release), 1);
}

/// `run_acquired` reckons the lease from when the claim's `begin` was sent:
/// a claim begun just now is not lost while the handler runs; one begun
/// most of a lease ago is reported lost at once, before the store's lease
/// ends.
#[tokio::test(start_paused = true)]
async fn run_acquired_reckons_the_lease_from_its_begin() {
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone()).lease(Lease::from_secs(30));
    for (k, begun_ago, lost) in [("fresh", 0, false), ("old", 25, true)] {
        let k = key(k);
        let claim = idem_testkit::cases::acquired(
            store.begin(&k, None, Lease::from_secs(30)).await.unwrap(),
        );
        let begun = tokio::time::Instant::now() - Duration::from_secs(begun_ago);
        let seen = guard
            .run_acquired(
                &idem_core::Json,
                &k,
                None,
                claim,
                begun,
                |claim| async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, String>(claim.is_lost())
                },
            )
            .await
            .unwrap();
        assert_eq!(seen, lost, "{k}");
    }
}

/// The settings read back as set; the guard fails closed unless told.
#[test]
fn settings_read_back() {
    let guard = Guard::new(MemoryStore::new());
    assert!(!guard.fails_open());
    assert_eq!(guard.lease_length(), Lease::from_secs(30));
    let guard = guard.fail_open(true).lease(Lease::from_secs(5));
    assert!(guard.fails_open());
    assert_eq!(guard.lease_length(), Lease::from_secs(5));
}

/// What a consumer does with each error: a store that will not recover by
/// itself (a corrupt record) dead-letters, an unreachable one retries.
#[test]
fn each_error_says_what_to_do_with_the_message() {
    let cases: [(GuardError<String>, Disposition); 7] = [
        (
            GuardError::InProgress {
                retry_after: Duration::from_secs(3),
            },
            Disposition::RetryLater {
                after: Some(Duration::from_secs(3)),
            },
        ),
        (GuardError::Mismatch, Disposition::DeadLetter),
        (
            GuardError::Handler("no".into()),
            Disposition::RetryLater { after: None },
        ),
        (
            GuardError::LeaseLost {
                outcome: "1".into(),
            },
            Disposition::Ack,
        ),
        (
            GuardError::Store(StoreError::unavailable("down")),
            Disposition::RetryLater { after: None },
        ),
        (
            GuardError::Store(StoreError::Corrupt("bad record".into())),
            Disposition::DeadLetter,
        ),
        (
            GuardError::Outcome("undecodable".into()),
            Disposition::DeadLetter,
        ),
    ];
    for (error, disposition) in cases {
        assert_eq!(error.disposition(), disposition, "{error:?}");
    }
}

/// Errors keep their cause: a reporter walking `source()` finds the
/// handler's, the store's, the refused input's or the codec's error.
#[test]
fn errors_keep_their_cause() {
    use std::error::Error;
    let io = || std::io::Error::other("disk full");
    let cause = |e: &GuardError<std::io::Error>| e.source().map(|s| s.to_string());
    assert_eq!(
        cause(&GuardError::Handler(io())),
        Some("disk full".to_owned())
    );
    assert_eq!(
        cause(&GuardError::Store(StoreError::unavailable(io()))),
        Some(StoreError::unavailable(io()).to_string())
    );
    let refused = idem_core::InvalidInput::OutcomeTooLarge { len: 9, limit: 8 };
    assert_eq!(
        cause(&GuardError::Invalid(refused.clone())),
        Some(refused.to_string())
    );
    assert_eq!(
        cause(&GuardError::Outcome(io().into())),
        Some("disk full".to_owned())
    );
    assert_eq!(cause(&GuardError::Mismatch), None);
}

/// The `Raw` codec stores the handler's bytes unchanged and gives them
/// back to a duplicate; an outcome never stored reads as no bytes.
#[tokio::test]
async fn raw_outcomes_are_stored_and_returned_unchanged() {
    use idem_core::{Bytes, Codec, Raw};
    let store = MemoryStore::new();
    let guard = Guard::new(store.clone());
    let k = key("raw");
    let payload = Bytes::from_static(b"\x00binary\xff");
    for _delivery in 0..2 {
        let got = guard
            .run_with(
                &Raw,
                &k,
                None,
                |_| async { Ok::<_, String>(payload.clone()) },
                |_| async {},
            )
            .await
            .unwrap();
        assert_eq!(got, payload);
    }
    let Some(Record::Completed(done)) = store.get(&k).await.unwrap() else {
        panic!("completed");
    };
    assert_eq!(done.outcome, Some(payload));
    assert_eq!(Codec::<Bytes>::decode(&Raw, None).unwrap(), Bytes::new());
}

/// Each error's text says what happened, and where it wraps a cause, the
/// cause's own words.
#[test]
fn each_error_says_what_happened() {
    let texts = [
        (
            GuardError::<String>::InProgress {
                retry_after: Duration::from_secs(3),
            },
            "another holder is working on this key; retry in 3s",
        ),
        (GuardError::Mismatch, "fingerprint mismatch"),
        (
            GuardError::Handler("card declined".into()),
            "handler failed: card declined",
        ),
        (
            GuardError::LeaseLost {
                outcome: "1".into(),
            },
            "the lease was lost before the outcome was stored",
        ),
        (
            GuardError::Invalid(idem_core::InvalidInput::RetentionTooShort),
            &idem_core::InvalidInput::RetentionTooShort.to_string(),
        ),
        (
            GuardError::Outcome("trailing comma".into()),
            "outcome encoding or decoding failed: trailing comma",
        ),
        (
            GuardError::Store(StoreError::unavailable("connection refused")),
            "the store is unavailable: connection refused",
        ),
    ];
    for (error, text) in texts {
        assert!(error.to_string().contains(text), "{error:?}: {error}");
    }
}
