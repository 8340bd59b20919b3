//! Cancellation: a store operation whose future is dropped (the client left,
//! a timeout fired) has taken full effect or none, and its key stays usable
//! (docs/contract.md §2). Each case drops an operation mid-way, then checks
//! the key the way a client that retries would.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Begin, BeginItem, CompleteItem, Fenced, Key, Lease, Record, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::Subject;
use crate::cases::acquired;

/// Where an operation's future is dropped.
#[derive(Clone, Copy, Debug)]
pub enum DropPoint {
    /// After this many polls, yielding to the runtime between them.
    AfterPolls(u8),
    /// After this much real time (a client's timeout).
    After(Duration),
}

impl DropPoint {
    /// Runs `op` until the drop point, then drops it.
    pub async fn run<F: Future>(self, op: F) {
        match self {
            DropPoint::AfterPolls(n) => {
                let mut op = pin!(op);
                let mut cx = Context::from_waker(Waker::noop());
                for _ in 0..n {
                    if op.as_mut().poll(&mut cx).is_ready() {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
            DropPoint::After(d) => {
                let _ = tokio::time::timeout(d, op).await;
            }
        }
    }
}

/// The operations a case drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `begin` of a fresh key.
    Begin,
    /// `complete` by the holder.
    Complete,
    /// `release` by the holder.
    Release,
    /// `extend` by the holder.
    Extend,
    /// `reopen` of a completion, by its token.
    Reopen,
    /// `begin_many` of fresh keys.
    BeginMany,
    /// `complete_many` by the holders.
    CompleteMany,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 7] = [
        Operation::Begin,
        Operation::Complete,
        Operation::Release,
        Operation::Extend,
        Operation::Reopen,
        Operation::BeginMany,
        Operation::CompleteMany,
    ];
}

const KEYS_PER_BATCH: usize = 3;

/// Drops `op` at `point` on keys of its own (named after `case`), then checks
/// that it took full effect or none and that every key is usable.
pub async fn drop_and_check<S: Store + Clone>(
    s: &Subject<S>,
    case: &str,
    op: Operation,
    point: DropPoint,
) {
    let keys: Vec<Key> = (0..KEYS_PER_BATCH)
        .map(|i| s.key(&format!("{case}-{i}")))
        .collect();
    let lease = Lease::new(s.steps(30));
    let retention = s.steps(600);
    let outcome = |k: &Key| Bytes::from(format!("done {k}"));
    let store = &s.store;
    let begin_all = || async {
        let mut claims = Vec::new();
        for k in &keys {
            claims.push(acquired(store.begin(k, None, lease).await.unwrap()));
        }
        claims
    };
    let completes = |claims: &[idem_core::Claim]| -> Vec<CompleteItem> {
        keys.iter()
            .zip(claims)
            .map(|(k, c)| CompleteItem {
                key: k.clone(),
                token: c.token,
                outcome: Some(outcome(k)),
                retention,
            })
            .collect()
    };
    let when = format!("{op:?} dropped at {point:?}");
    match op {
        Operation::Begin | Operation::BeginMany => {
            if op == Operation::Begin {
                point.run(store.begin(&keys[0], None, lease)).await;
            } else {
                let items: Vec<BeginItem> = keys
                    .iter()
                    .map(|k| BeginItem {
                        key: k.clone(),
                        fingerprint: None,
                        lease,
                    })
                    .collect();
                point.run(store.begin_many(&items)).await;
            }
            // Each key is acquired now, or was by the dropped call (which may
            // still be landing): then `get` shows the claim's token, and its
            // holder, had it heard back, could complete it.
            for k in &keys {
                let token = match store.begin(k, None, lease).await.unwrap() {
                    Begin::Acquired(claim) => claim.token,
                    Begin::InProgress { .. } => match store.get(k).await.unwrap() {
                        Some(Record::InProgress(r)) => r.token,
                        other => panic!("{when}: expected a claim, got {other:?}"),
                    },
                    other => panic!("{when}: unexpected {other:?}"),
                };
                let done = store
                    .complete(k, token, Some(outcome(k)), retention)
                    .await
                    .unwrap();
                assert_eq!(done, Fenced::Ok(()), "{when}: the claim can be completed");
            }
        }
        Operation::Complete | Operation::CompleteMany => {
            let claims = begin_all().await;
            let items = completes(&claims);
            if op == Operation::Complete {
                let i = &items[0];
                point
                    .run(store.complete(&i.key, i.token, i.outcome.clone(), i.retention))
                    .await;
            } else {
                point.run(store.complete_many(&items)).await;
            }
            // The holder retries: whatever the dropped call did, the retry is
            // answered Ok and the outcome is stored.
            let retried = store.complete_many(&items).await.unwrap();
            assert!(
                retried.iter().all(|r| *r == Fenced::Ok(())),
                "{when}: a retry by the holder is Ok, got {retried:?}"
            );
        }
        Operation::Release => {
            let claims = begin_all().await;
            point.run(store.release(&keys[0], claims[0].token)).await;
            // Released, or still held: the retry settles it.
            let again = store.release(&keys[0], claims[0].token).await.unwrap();
            assert!(
                again == Fenced::Ok(()) || store.get(&keys[0]).await.unwrap().is_none(),
                "{when}: a retried release finds the claim or nothing, got {again:?}"
            );
            assert_eq!(store.get(&keys[0]).await.unwrap(), None, "{when}");
            let redelivery = acquired(store.begin(&keys[0], None, lease).await.unwrap());
            let rest = [redelivery]
                .into_iter()
                .chain(claims[1..].iter().cloned())
                .collect::<Vec<_>>();
            let done = store.complete_many(&completes(&rest)).await.unwrap();
            assert!(
                done.iter().all(|r| *r == Fenced::Ok(())),
                "{when}: {done:?}"
            );
        }
        Operation::Reopen => {
            let claims = begin_all().await;
            let first = completes(&claims);
            let done = store.complete_many(&first).await.unwrap();
            assert!(done.iter().all(|r| *r == Fenced::Ok(())), "{when}");
            point.run(store.reopen(&keys[0], claims[0].token)).await;
            // Reopened, or still completed: the retry settles it.
            let again = store.reopen(&keys[0], claims[0].token).await.unwrap();
            assert!(
                again == Fenced::Ok(()) || store.get(&keys[0]).await.unwrap().is_none(),
                "{when}: a retried reopen finds the completion or nothing, got {again:?}"
            );
            assert_eq!(store.get(&keys[0]).await.unwrap(), None, "{when}");
            let rerun = acquired(store.begin(&keys[0], None, lease).await.unwrap());
            assert!(
                rerun.token > claims[0].token,
                "{when}: tokens go on growing"
            );
            let done = store.complete_many(&completes(&[rerun])).await.unwrap();
            assert_eq!(done, vec![Fenced::Ok(())], "{when}");
        }
        Operation::Extend => {
            let claims = begin_all().await;
            let longer = Lease::new(s.steps(60));
            point
                .run(store.extend(&keys[0], claims[0].token, longer))
                .await;
            // Extended or not, the holder still owns the key.
            assert!(
                !store
                    .extend(&keys[0], claims[0].token, longer)
                    .await
                    .unwrap()
                    .is_stale(),
                "{when}: the holder still owns its claim"
            );
            let done = store.complete_many(&completes(&claims)).await.unwrap();
            assert!(
                done.iter().all(|r| *r == Fenced::Ok(())),
                "{when}: {done:?}"
            );
        }
    }
    // Every key now replays its outcome.
    for k in &keys {
        match store.begin(k, None, lease).await.unwrap() {
            Begin::Completed { outcome: got, .. } => {
                assert_eq!(got, Some(outcome(k)), "{when}: the stored outcome")
            }
            other => panic!("{when}: expected a replay, got {other:?}"),
        }
    }
}

/// Every operation dropped after its first poll took full effect or none,
/// and leaves its keys usable.
pub async fn operations_dropped_after_one_poll_leave_keys_usable<S: Store + Clone>(s: &Subject<S>) {
    for op in Operation::ALL {
        drop_and_check(s, &format!("drop-{op:?}"), op, DropPoint::AfterPolls(1)).await;
    }
}

/// Operations dropped at random points (after a few polls, or after a
/// random time up to 2 ms) leave their keys usable.
pub async fn operations_dropped_at_random_points_leave_keys_usable<S: Store + Clone>(
    s: &Subject<S>,
) {
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let op = proptest::sample::select(Operation::ALL.to_vec());
    let point = prop_oneof![
        (0..6u8).prop_map(DropPoint::AfterPolls),
        (0..2000u64).prop_map(|us| DropPoint::After(Duration::from_micros(us))),
    ];
    let runtime = tokio::runtime::Handle::current();
    let case = std::sync::atomic::AtomicU32::new(0);
    let result = tokio::task::block_in_place(|| {
        runner.run(&(op, point), |(op, point)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            runtime.block_on(drop_and_check(s, &format!("drop-random-{n}"), op, point));
            Ok::<(), TestCaseError>(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
