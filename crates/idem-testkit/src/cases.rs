//! The conformance cases, one per guarantee of docs/contract.md §1–§2. Each asserts
//! what would break if its guarantee did.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{
    Begin, BeginItem, Claim, CompleteItem, Fenced, FencingToken, Fingerprint, InvalidInput, Key,
    Lease, Namespace, Record, RecordState, ScanQuery, Store, StoreError,
};

use crate::Subject;
pub use crate::cancel::{
    operations_dropped_after_one_poll_leave_keys_usable,
    operations_dropped_at_random_points_leave_keys_usable,
};

/// Unwraps `Acquired`, failing the test with what came instead.
pub fn acquired(begin: Begin) -> Claim {
    match begin {
        Begin::Acquired(claim) => claim,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// One whole delivery of a key not seen before: claims it (60 s lease),
/// completes it with `outcome` (kept 10 minutes) and returns the token,
/// failing the test if either step does not succeed.
pub async fn deliver<S: Store>(store: &S, key: &Key, outcome: &'static str) -> FencingToken {
    let claim = acquired(store.begin(key, None, Lease::from_secs(60)).await.unwrap());
    let done = store
        .complete(
            key,
            claim.token,
            Some(Bytes::from_static(outcome.as_bytes())),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()), "a fresh claim's holder completes it");
    claim.token
}

fn lease<S: Store + Clone>(s: &Subject<S>, steps: u32) -> Lease {
    Lease::new(s.steps(steps))
}

fn fp(tag: &str) -> Option<Fingerprint> {
    Some(Fingerprint::sha256(tag.as_bytes()))
}

async fn begin<S: Store + Clone>(
    s: &Subject<S>,
    key: &Key,
    f: Option<Fingerprint>,
    steps: u32,
) -> Begin {
    s.store
        .begin(key, f, lease(s, steps))
        .await
        .expect("begin should succeed")
}

async fn complete<S: Store + Clone>(
    s: &Subject<S>,
    key: &Key,
    token: FencingToken,
    outcome: Option<&'static str>,
) -> Fenced {
    s.store
        .complete(
            key,
            token,
            outcome.map(|o| Bytes::from_static(o.as_bytes())),
            s.steps(600),
        )
        .await
        .expect("complete should succeed")
}

async fn get<S: Store + Clone>(s: &Subject<S>, key: &Key) -> Option<Record> {
    s.store.get(key).await.expect("get should succeed")
}

/// `begin` on a key never seen acquires it with attempt 1 and writes an
/// `in_progress` record.
pub async fn begin_on_absent_key_acquires<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("absent");
    let claim = acquired(begin(s, &key, fp("a"), 10).await);
    assert_eq!(claim.attempt, 1);
    if let Some(now) = s.now() {
        assert_eq!(claim.lease_expires_at, now.after(s.steps(10)));
    }
    match get(s, &key).await {
        Some(Record::InProgress(r)) => {
            assert_eq!(r.token, claim.token);
            assert_eq!(r.attempts, 1);
            assert_eq!(r.fingerprint, fp("a"));
            assert_eq!(r.lease_expires_at, claim.lease_expires_at);
        }
        other => panic!("expected an in_progress record, got {other:?}"),
    }
}

/// While the holder's lease is live, `begin` answers `InProgress` with the
/// time left on the lease.
pub async fn begin_while_lease_is_live_reports_in_progress<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("busy");
    acquired(begin(s, &key, None, 10).await);
    s.pass(2).await;
    match begin(s, &key, None, 10).await {
        Begin::InProgress { retry_after } => {
            assert!(retry_after > Duration::ZERO);
            assert!(retry_after <= s.steps(8), "{retry_after:?}");
            if s.exact_time() {
                assert_eq!(retry_after, s.steps(8));
            }
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
}

/// After `complete`, every `begin` returns the stored outcome (or none).
pub async fn begin_after_complete_replays_the_outcome<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("replay");
    let claim = acquired(begin(s, &key, None, 10).await);
    assert_eq!(
        complete(s, &key, claim.token, Some("receipt-1")).await,
        Fenced::Ok(())
    );
    for _ in 0..2 {
        match begin(s, &key, None, 10).await {
            Begin::Completed { outcome, .. } => {
                assert_eq!(outcome.as_deref(), Some(&b"receipt-1"[..]));
            }
            other => panic!("expected Completed, got {other:?}"),
        }
    }
    let empty = s.key("replay-empty");
    let claim = acquired(begin(s, &empty, None, 10).await);
    assert_eq!(complete(s, &empty, claim.token, None).await, Fenced::Ok(()));
    assert!(matches!(
        begin(s, &empty, None, 10).await,
        Begin::Completed { outcome: None, .. }
    ));
}

/// Once a lease has run out, `begin` takes over with a larger token and the
/// next attempt number.
pub async fn begin_after_lease_expiry_takes_over<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("takeover");
    let first = acquired(begin(s, &key, None, 2).await);
    s.pass(3).await;
    let second = acquired(begin(s, &key, None, 10).await);
    assert!(second.token > first.token);
    assert_eq!(second.attempt, 2);
    s.pass(11).await;
    let third = acquired(begin(s, &key, None, 10).await);
    assert!(third.token > second.token);
    assert_eq!(third.attempt, 3);
    match get(s, &key).await {
        Some(Record::InProgress(r)) => assert_eq!((r.token, r.attempts), (third.token, 3)),
        other => panic!("expected in_progress, got {other:?}"),
    }
}

/// A live record with another fingerprint answers `Mismatch`, in progress and
/// completed; an expired lease is taken over with the new content.
pub async fn other_fingerprint_is_a_mismatch<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("mismatch");
    let claim = acquired(begin(s, &key, fp("A"), 3).await);
    assert_eq!(begin(s, &key, fp("B"), 3).await, Begin::Mismatch);
    assert!(matches!(
        begin(s, &key, fp("A"), 3).await,
        Begin::InProgress { .. }
    ));
    assert_eq!(
        complete(s, &key, claim.token, Some("done")).await,
        Fenced::Ok(())
    );
    assert_eq!(begin(s, &key, fp("B"), 3).await, Begin::Mismatch);
    assert!(matches!(
        begin(s, &key, fp("A"), 3).await,
        Begin::Completed { .. }
    ));

    let expired = s.key("mismatch-expired");
    acquired(begin(s, &expired, fp("A"), 2).await);
    s.pass(3).await;
    let taken = acquired(begin(s, &expired, fp("B"), 10).await);
    assert_eq!(taken.attempt, 2);
    assert_eq!(begin(s, &expired, fp("A"), 3).await, Begin::Mismatch);
}

/// A fingerprint missing on either side never counts as a mismatch.
pub async fn missing_fingerprint_never_mismatches<S: Store + Clone>(s: &Subject<S>) {
    let a = s.key("nofp-stored");
    acquired(begin(s, &a, None, 10).await);
    assert!(matches!(
        begin(s, &a, fp("A"), 10).await,
        Begin::InProgress { .. }
    ));
    let b = s.key("nofp-asked");
    acquired(begin(s, &b, fp("A"), 10).await);
    assert!(matches!(
        begin(s, &b, None, 10).await,
        Begin::InProgress { .. }
    ));
}

async fn taken_over<S: Store + Clone>(s: &Subject<S>, key: &Key) -> (Claim, Claim) {
    let old = acquired(begin(s, key, None, 2).await);
    s.pass(3).await;
    let new = acquired(begin(s, key, None, 30).await);
    (old, new)
}

async fn assert_held_by<S: Store + Clone>(s: &Subject<S>, key: &Key, token: FencingToken) {
    match get(s, key).await {
        Some(Record::InProgress(r)) => assert_eq!(r.token, token, "the record changed hands"),
        other => panic!("expected in_progress held by {token:?}, got {other:?}"),
    }
}

/// A holder whose lease was taken over cannot complete, and the new holder's
/// record is untouched.
pub async fn stale_token_cannot_complete<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("stale-complete");
    let (old, new) = taken_over(s, &key).await;
    assert_eq!(
        complete(s, &key, old.token, Some("late")).await,
        Fenced::Stale
    );
    assert_held_by(s, &key, new.token).await;
    assert_eq!(
        complete(s, &key, new.token, Some("ok")).await,
        Fenced::Ok(())
    );
}

/// A holder whose lease was taken over cannot release.
pub async fn stale_token_cannot_release<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("stale-release");
    let (old, new) = taken_over(s, &key).await;
    assert_eq!(
        s.store.release(&key, old.token).await.unwrap(),
        Fenced::Stale
    );
    assert_held_by(s, &key, new.token).await;
}

/// A holder whose lease was taken over cannot extend.
pub async fn stale_token_cannot_extend<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("stale-extend");
    let (old, new) = taken_over(s, &key).await;
    let before = get(s, &key).await;
    assert_eq!(
        s.store
            .extend(&key, old.token, lease(s, 100))
            .await
            .unwrap(),
        Fenced::Stale
    );
    assert_eq!(get(s, &key).await, before);
    assert_held_by(s, &key, new.token).await;
}

/// Tokens that were never issued own nothing, on a held key or an absent one.
pub async fn never_issued_token_is_stale<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("forged");
    let claim = acquired(begin(s, &key, None, 10).await);
    let absent = s.key("forged-absent");
    for forged in [
        FencingToken::new(claim.token.get() + 1_000_000),
        FencingToken::new(0),
    ] {
        for k in [&key, &absent] {
            assert_eq!(complete(s, k, forged, Some("x")).await, Fenced::Stale);
            assert_eq!(s.store.release(k, forged).await.unwrap(), Fenced::Stale);
            assert!(
                s.store
                    .extend(k, forged, lease(s, 10))
                    .await
                    .unwrap()
                    .is_stale()
            );
        }
    }
    assert_held_by(s, &key, claim.token).await;
    assert_eq!(get(s, &absent).await, None);
}

/// Once its lease has run out a holder owns nothing, even before anyone takes
/// over.
pub async fn holder_whose_lease_ran_out_is_stale<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("ran-out");
    let claim = acquired(begin(s, &key, None, 2).await);
    s.pass(3).await;
    assert!(
        s.store
            .extend(&key, claim.token, lease(s, 10))
            .await
            .unwrap()
            .is_stale()
    );
    assert_eq!(
        complete(s, &key, claim.token, Some("late")).await,
        Fenced::Stale
    );
    assert_eq!(
        s.store.release(&key, claim.token).await.unwrap(),
        Fenced::Stale
    );
    // Nothing was completed: the next delivery may run.
    assert_eq!(acquired(begin(s, &key, None, 10).await).attempt, 2);
}

/// A completed record refuses every other token, and cannot be released or
/// extended, not even by the token that completed it.
pub async fn completed_record_refuses_other_tokens<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("done");
    let (old, claim) = taken_over(s, &key).await;
    assert_eq!(
        complete(s, &key, claim.token, Some("first")).await,
        Fenced::Ok(())
    );
    let before = get(s, &key).await;
    let never_issued = FencingToken::new(claim.token.get() + 1_000_000);
    for other in [old.token, never_issued] {
        assert_eq!(
            complete(s, &key, other, Some("second")).await,
            Fenced::Stale
        );
    }
    assert_eq!(
        s.store.release(&key, claim.token).await.unwrap(),
        Fenced::Stale
    );
    assert!(
        s.store
            .extend(&key, claim.token, lease(s, 10))
            .await
            .unwrap()
            .is_stale()
    );
    assert_eq!(get(s, &key).await, before);
}

/// A `complete` retried by the token that completed the record (its first
/// answer was lost) is answered `Ok` again and changes nothing, singly and in
/// a batch; once the record has expired the token is stale.
pub async fn complete_retried_by_its_token_is_ok<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("retried-complete");
    let claim = acquired(begin(s, &key, None, 10).await);
    assert_eq!(
        complete(s, &key, claim.token, Some("first")).await,
        Fenced::Ok(())
    );
    let before = get(s, &key).await;
    assert_eq!(
        complete(s, &key, claim.token, Some("second")).await,
        Fenced::Ok(()),
        "a retry by the completing token is answered Ok"
    );
    let retry = |token, outcome: &'static str| CompleteItem {
        key: key.clone(),
        token,
        outcome: Some(outcome.into()),
        retention: s.steps(600),
    };
    let forged = FencingToken::new(claim.token.get() + 1_000_000);
    assert_eq!(
        s.store
            .complete_many(&[retry(claim.token, "third"), retry(forged, "forged")])
            .await
            .unwrap(),
        [Fenced::Ok(()), Fenced::Stale]
    );
    assert_eq!(get(s, &key).await, before, "a retry changes nothing");
    match begin(s, &key, None, 10).await {
        Begin::Completed { outcome, .. } => assert_eq!(outcome.as_deref(), Some(&b"first"[..])),
        other => panic!("expected the first outcome replayed, got {other:?}"),
    }

    let short = s.key("retried-complete-expired");
    let claim = acquired(begin(s, &short, None, 10).await);
    let done = s
        .store
        .complete(&short, claim.token, Some("x".into()), s.steps(2))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    s.pass(2).await;
    if s.exact_time() {
        assert_eq!(
            complete(s, &short, claim.token, Some("x")).await,
            Fenced::Stale,
            "a record expires the moment its retention ends"
        );
    }
    s.pass(1).await;
    assert_eq!(
        complete(s, &short, claim.token, Some("x")).await,
        Fenced::Stale,
        "an expired record is gone, and its token with it"
    );
    assert_eq!(get(s, &short).await, None);
}

/// `release` deletes the record, so a redelivery acquires again (attempt 1,
/// larger token).
pub async fn release_lets_a_redelivery_run_again<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("release");
    let first = acquired(begin(s, &key, None, 10).await);
    assert_eq!(
        s.store.release(&key, first.token).await.unwrap(),
        Fenced::Ok(())
    );
    assert_eq!(get(s, &key).await, None);
    let again = acquired(begin(s, &key, None, 10).await);
    assert!(again.token > first.token);
    assert_eq!(again.attempt, 1);
}

/// `reopen` deletes a completion by its own token only, live only, once
/// only, so the key runs again with a larger token; it never touches a
/// claim in progress or a later completion of the key.
pub async fn reopen_lets_a_completed_key_run_again<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("reopen");
    let first = acquired(begin(s, &key, None, 10).await);
    assert_eq!(
        s.store.reopen(&key, first.token).await.unwrap(),
        Fenced::Stale,
        "a claim in progress is not a completion"
    );
    assert!(matches!(get(s, &key).await, Some(Record::InProgress(_))));
    assert_eq!(
        complete(s, &key, first.token, Some("dead")).await,
        Fenced::Ok(())
    );
    let forged = FencingToken::new(first.token.get() + 1);
    assert_eq!(s.store.reopen(&key, forged).await.unwrap(), Fenced::Stale);
    assert!(matches!(
        begin(s, &key, None, 10).await,
        Begin::Completed { .. }
    ));
    // Two at once: exactly one reopens.
    let (a, b) = tokio::join!(
        s.store.reopen(&key, first.token),
        s.store.reopen(&key, first.token)
    );
    let reopened = [a.unwrap(), b.unwrap()];
    assert_eq!(
        reopened.iter().filter(|r| **r == Fenced::Ok(())).count(),
        1,
        "{reopened:?}"
    );
    assert_eq!(get(s, &key).await, None);
    let again = acquired(begin(s, &key, None, 10).await);
    assert!(again.token > first.token);
    assert_eq!(again.attempt, 1);
    assert_eq!(
        complete(s, &key, again.token, Some("done")).await,
        Fenced::Ok(())
    );
    assert_eq!(
        s.store.reopen(&key, first.token).await.unwrap(),
        Fenced::Stale,
        "an old token never reopens a later completion"
    );
    match begin(s, &key, None, 10).await {
        Begin::Completed { outcome, .. } => assert_eq!(outcome, Some(Bytes::from("done"))),
        other => panic!("expected the later completion, got {other:?}"),
    }
    // A completion past its retention is gone: nothing to reopen.
    let short = s.key("reopen-expired");
    let claim = acquired(begin(s, &short, None, 10).await);
    let done = s
        .store
        .complete(&short, claim.token, None, s.steps(2))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    s.pass(3).await;
    assert_eq!(
        s.store.reopen(&short, claim.token).await.unwrap(),
        Fenced::Stale
    );
}

/// Fencing tokens of one key strictly increase across release, takeover and
/// retention expiry.
pub async fn tokens_increase_across_release_takeover_and_expiry<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("monotonic");
    let mut tokens = Vec::new();
    let t = acquired(begin(s, &key, None, 10).await).token;
    tokens.push(t);
    assert_eq!(s.store.release(&key, t).await.unwrap(), Fenced::Ok(()));
    tokens.push(acquired(begin(s, &key, None, 2).await).token);
    s.pass(3).await;
    let t = acquired(begin(s, &key, None, 10).await).token;
    tokens.push(t);
    let done = s.store.complete(&key, t, None, s.steps(2)).await.unwrap();
    assert_eq!(done, Fenced::Ok(()));
    s.pass(3).await;
    tokens.push(acquired(begin(s, &key, None, 10).await).token);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

/// `extend` pushes the lease out from now, so a holder that renews is never
/// taken over.
pub async fn extend_pushes_the_lease_out<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("extend");
    let claim = acquired(begin(s, &key, None, 4).await);
    s.pass(2).await;
    let Fenced::Ok(until) = s
        .store
        .extend(&key, claim.token, lease(s, 4))
        .await
        .unwrap()
    else {
        panic!("the holder should be able to extend");
    };
    assert!(until > claim.lease_expires_at);
    if let Some(now) = s.now() {
        assert_eq!(until, now.after(s.steps(4)));
    }
    s.pass(3).await; // 5 steps after begin: past the first lease, not the new one
    assert!(matches!(
        begin(s, &key, None, 4).await,
        Begin::InProgress { .. }
    ));
    assert_eq!(complete(s, &key, claim.token, None).await, Fenced::Ok(()));
}

/// A completed record is kept for its retention, then forgotten.
pub async fn completed_record_expires_after_retention<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("retention");
    let claim = acquired(begin(s, &key, None, 10).await);
    let done = s
        .store
        .complete(&key, claim.token, Some("r".into()), s.steps(4))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    s.pass(2).await;
    assert!(matches!(
        begin(s, &key, None, 10).await,
        Begin::Completed { .. }
    ));
    s.pass(3).await;
    assert_eq!(get(s, &key).await, None);
    let again = acquired(begin(s, &key, None, 10).await);
    assert_eq!(again.attempt, 1);
    assert!(again.token > claim.token);
}

/// `get` shows nothing, then the `in_progress` fields, then the `completed`
/// fields.
pub async fn get_shows_each_state<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("get");
    assert_eq!(get(s, &key).await, None);
    let claim = acquired(begin(s, &key, fp("g"), 10).await);
    let started = s.now();
    assert!(matches!(get(s, &key).await, Some(Record::InProgress(_))));
    s.pass(1).await;
    assert_eq!(
        complete(s, &key, claim.token, Some("out")).await,
        Fenced::Ok(())
    );
    match get(s, &key).await {
        Some(Record::Completed(r)) => {
            assert_eq!(r.token, claim.token);
            assert_eq!(r.fingerprint, fp("g"));
            assert_eq!(r.outcome.as_deref(), Some(&b"out"[..]));
            assert!(r.expires_at > r.completed_at);
            if let Some(t0) = started {
                assert_eq!(r.completed_at, t0.after(s.steps(1)));
                assert_eq!(r.expires_at, r.completed_at.after(s.steps(600)));
            }
        }
        other => panic!("expected completed, got {other:?}"),
    }
}

/// The same key in two namespaces is two records.
pub async fn namespaces_are_isolated<S: Store + Clone>(s: &Subject<S>) {
    let a = s.key("ns");
    let b = Key::in_namespace(
        Namespace::new("conformance-other").unwrap(),
        a.bytes().clone(),
    )
    .unwrap();
    let claim = acquired(begin(s, &a, None, 10).await);
    acquired(begin(s, &b, None, 10).await);
    assert_eq!(
        complete(s, &a, claim.token, Some("a")).await,
        Fenced::Ok(())
    );
    assert!(matches!(get(s, &b).await, Some(Record::InProgress(_))));
}

fn kind(b: &Begin) -> String {
    match b {
        Begin::Acquired(c) => format!("acquired attempt {}", c.attempt),
        Begin::InProgress { .. } => "in_progress".into(),
        Begin::Completed { outcome, .. } => format!("completed {outcome:?}"),
        Begin::Mismatch => "mismatch".into(),
    }
}

/// `begin_many` and `complete_many` answer, in order, what the single forms
/// answer for the same states.
pub async fn batch_forms_agree_with_single_forms<S: Store + Clone>(s: &Subject<S>) {
    let mut answers = Vec::new();
    for (round, batched) in [("single", false), ("batch", true)] {
        let key = |n: &str| s.key(&format!("batch-{round}-{n}"));
        let (absent, busy, done, other) = (key("absent"), key("busy"), key("done"), key("other"));
        acquired(begin(s, &busy, None, 30).await);
        let c = acquired(begin(s, &done, None, 30).await);
        assert_eq!(
            complete(s, &done, c.token, Some("out")).await,
            Fenced::Ok(())
        );
        acquired(begin(s, &other, fp("A"), 30).await);
        let items: Vec<BeginItem> = [
            (&absent, None),
            (&busy, None),
            (&done, None),
            (&other, fp("B")),
        ]
        .into_iter()
        .map(|(k, f)| BeginItem {
            key: k.clone(),
            fingerprint: f,
            lease: lease(s, 30),
        })
        .collect();
        let begun: Vec<Begin> = if batched {
            s.store.begin_many(&items).await.unwrap()
        } else {
            let mut v = Vec::new();
            for i in &items {
                v.push(s.store.begin(&i.key, i.fingerprint, i.lease).await.unwrap());
            }
            v
        };
        let fresh = acquired(begun[0].clone());
        let completes = vec![
            CompleteItem {
                key: absent.clone(),
                token: fresh.token,
                outcome: Some("new".into()),
                retention: s.steps(600),
            },
            CompleteItem {
                key: done.clone(),
                token: c.token,
                outcome: Some("again".into()),
                retention: s.steps(600),
            },
            CompleteItem {
                key: done.clone(),
                token: FencingToken::new(c.token.get() + 1_000_000),
                outcome: Some("forged".into()),
                retention: s.steps(600),
            },
        ];
        let completed: Vec<Fenced> = if batched {
            s.store.complete_many(&completes).await.unwrap()
        } else {
            let mut v = Vec::new();
            for i in &completes {
                v.push(
                    s.store
                        .complete(&i.key, i.token, i.outcome.clone(), i.retention)
                        .await
                        .unwrap(),
                );
            }
            v
        };
        let after = begin(s, &absent, None, 30).await;
        answers.push((
            begun.iter().map(kind).collect::<Vec<_>>(),
            completed,
            kind(&after),
        ));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(
        answers[0].0,
        [
            "acquired attempt 1",
            "in_progress",
            "completed Some(b\"out\")",
            "mismatch"
        ]
    );
    assert_eq!(
        answers[0].1,
        [Fenced::Ok(()), Fenced::Ok(()), Fenced::Stale]
    );
    assert_eq!(answers[0].2, "completed Some(b\"new\")");
    assert!(s.store.begin_many(&[]).await.unwrap().is_empty());
}

/// A batch that names one key twice acquires it once, as two singles would.
pub async fn batch_begin_of_one_key_twice_acquires_once<S: Store + Clone>(s: &Subject<S>) {
    let key = s.key("batch-twice");
    let item = BeginItem {
        key,
        fingerprint: None,
        lease: lease(s, 30),
    };
    let begun = s.store.begin_many(&[item.clone(), item]).await.unwrap();
    assert!(matches!(begun[0], Begin::Acquired(_)), "{begun:?}");
    assert!(matches!(begun[1], Begin::InProgress { .. }), "{begun:?}");
}

/// 64 tasks `begin` one key at once: exactly one acquires.
pub async fn begin_race_has_exactly_one_winner<S: Store + Clone>(s: &Subject<S>) {
    for round in 0..3 {
        let key = Arc::new(s.key(&format!("race-{round}")));
        let start = Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (store, key, start, l) =
                    (s.store.clone(), key.clone(), start.clone(), lease(s, 60));
                tokio::spawn(async move {
                    start.wait().await;
                    store.begin(&key, None, l).await.unwrap()
                })
            })
            .collect();
        let mut winners = 0;
        for t in tasks {
            match t.await.unwrap() {
                Begin::Acquired(_) => winners += 1,
                Begin::InProgress { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(winners, 1, "exactly one task may acquire");
    }
}

/// 16 tasks complete one claim at once, each with its own outcome: every one
/// is answered `Ok` (the first applies, the others are retries by the same
/// token), and exactly one outcome is stored.
pub async fn complete_race_stores_exactly_one_outcome<S: Store + Clone>(s: &Subject<S>) {
    let key = Arc::new(s.key("complete-race"));
    let claim = acquired(begin(s, &key, None, 60).await);
    let start = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16u8)
        .map(|i| {
            let (store, key, start, retention) =
                (s.store.clone(), key.clone(), start.clone(), s.steps(600));
            tokio::spawn(async move {
                start.wait().await;
                let outcome = Bytes::from(vec![b'a' + i]);
                let r = store
                    .complete(&key, claim.token, Some(outcome.clone()), retention)
                    .await
                    .unwrap();
                (r, outcome)
            })
        })
        .collect();
    let mut offered = Vec::new();
    for t in tasks {
        let (r, outcome) = t.await.unwrap();
        assert_eq!(r, Fenced::Ok(()), "every call by the holder is answered Ok");
        offered.push(outcome);
    }
    let stored = match get(s, &key).await {
        Some(Record::Completed(r)) => r.outcome.expect("an outcome was stored"),
        other => panic!("expected completed, got {other:?}"),
    };
    assert!(
        offered.contains(&stored),
        "the stored outcome is one offered"
    );
    match begin(s, &key, None, 10).await {
        Begin::Completed { outcome, .. } => assert_eq!(outcome, Some(stored)),
        other => panic!("expected a replay, got {other:?}"),
    }
}

fn invalid(r: Result<impl std::fmt::Debug, StoreError>) -> InvalidInput {
    match r {
        Err(StoreError::Invalid(e)) => {
            assert!(!e.to_string().is_empty());
            e
        }
        other => panic!("expected an input error, got {other:?}"),
    }
}

/// Oversized keys, zero or absurd leases and retentions, oversized outcomes
/// and batches are refused with distinct errors, and nothing stored changes.
pub async fn bad_input_is_refused_and_changes_nothing<S: Store + Clone>(s: &Subject<S>) {
    let limits = s.store.limits().clone();
    let key = s.key("bad-input");
    let claim = acquired(begin(s, &key, None, 30).await);
    let before = get(s, &key).await;

    let long = Key::new("conformance", vec![b'k'; limits.max_key_bytes + 1]).unwrap();
    assert!(matches!(
        invalid(s.store.begin(&long, None, lease(s, 1)).await),
        InvalidInput::KeyTooLong { .. }
    ));
    let ok_len = Key::new("conformance", vec![b'k'; limits.max_key_bytes]).unwrap();
    assert!(s.store.get(&ok_len).await.is_ok());
    assert_eq!(
        invalid(s.store.begin(&key, None, Lease::from_millis(0)).await),
        InvalidInput::LeaseTooShort
    );
    let too_long = Lease::new(limits.max_lease + Duration::from_secs(1));
    assert!(matches!(
        invalid(s.store.begin(&key, None, too_long).await),
        InvalidInput::LeaseTooLong { .. }
    ));
    assert!(matches!(
        invalid(s.store.extend(&key, claim.token, too_long).await),
        InvalidInput::LeaseTooLong { .. }
    ));
    let big = Bytes::from(vec![0u8; limits.max_outcome_bytes + 1]);
    assert!(matches!(
        invalid(
            s.store
                .complete(&key, claim.token, Some(big), s.steps(10))
                .await
        ),
        InvalidInput::OutcomeTooLarge { .. }
    ));
    assert_eq!(
        invalid(
            s.store
                .complete(&key, claim.token, None, Duration::ZERO)
                .await
        ),
        InvalidInput::RetentionTooShort
    );
    assert!(matches!(
        invalid(
            s.store
                .complete(&key, claim.token, None, limits.max_retention * 2)
                .await
        ),
        InvalidInput::RetentionTooLong { .. }
    ));
    assert_eq!(
        get(s, &key).await,
        before,
        "a refused call changed the record"
    );

    let fresh = s.key("bad-batch-fresh");
    let good = BeginItem {
        key: fresh.clone(),
        fingerprint: None,
        lease: lease(s, 10),
    };
    let bad = BeginItem {
        key: long,
        ..good.clone()
    };
    assert!(matches!(
        invalid(s.store.begin_many(&[good.clone(), bad]).await),
        InvalidInput::InItem { index: 1, .. }
    ));
    let too_many = vec![good; limits.max_batch + 1];
    assert!(matches!(
        invalid(s.store.begin_many(&too_many).await),
        InvalidInput::BatchTooLarge { .. }
    ));
    assert_eq!(get(s, &fresh).await, None, "a refused batch wrote a record");
    assert_eq!(
        complete(s, &key, claim.token, Some("fine")).await,
        Fenced::Ok(())
    );
}

/// `scan` lists a namespace in key order, filters by state and age, and
/// pages with `after`: the operator's view of stuck work.
pub async fn scan_lists_stuck_work<S: Store + Clone>(s: &Subject<S>) {
    let ns = Namespace::new(&format!("scan{}", s.run)).unwrap();
    let key = |k: &str| Key::in_namespace(ns.clone(), k.to_string()).unwrap();
    let (stuck, fresh, done) = (key("a-stuck"), key("b-fresh"), key("c-done"));
    acquired(begin(s, &stuck, None, 60).await);
    s.pass(3).await;
    acquired(begin(s, &fresh, None, 60).await);
    let c = acquired(begin(s, &done, None, 60).await);
    assert_eq!(complete(s, &done, c.token, None).await, Fenced::Ok(()));
    let Some(Record::InProgress(fresh_record)) = get(s, &fresh).await else {
        panic!("fresh should be in progress");
    };

    let keys = |entries: Vec<idem_core::Entry>| -> Vec<Key> {
        entries.into_iter().map(|e| e.key).collect()
    };
    let all = s.store.scan(&ScanQuery::new(ns.clone())).await.unwrap();
    assert_eq!(keys(all), [stuck.clone(), fresh.clone(), done.clone()]);
    let old = ScanQuery::new(ns.clone())
        .state(RecordState::InProgress)
        .older_than(fresh_record.started_at);
    assert_eq!(keys(s.store.scan(&old).await.unwrap()), [stuck]);
    let completed = ScanQuery::new(ns.clone()).state(RecordState::Completed);
    assert_eq!(keys(s.store.scan(&completed).await.unwrap()), [done]);
    let page = ScanQuery::new(ns.clone()).after("a-stuck").limit(1);
    assert_eq!(keys(s.store.scan(&page).await.unwrap()), [fresh]);
}

/// Random operation sequences give the answers of a plain reference model.
pub async fn random_operations_match_the_model<S: Store + Clone>(s: &Subject<S>) {
    crate::model::check(s).await;
}
