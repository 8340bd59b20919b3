//! Model-based checking: random operation sequences run against the store
//! and against a plain reference model; every answer must agree.
//!
//! The model is written apart from the stores' shared decision code on
//! purpose, so that a mistake there cannot hide in both.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Begin, Fenced, FencingToken, Fingerprint, Lease, Record, Store, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::Subject;

const KEYS: u8 = 3;

/// One step of a random sequence. Durations are in the subject's steps;
/// `token` picks one of the tokens issued for the key so far, or (past the
/// end) one never issued.
#[derive(Clone, Debug)]
pub enum Op {
    /// `begin`.
    Begin {
        /// Key index.
        key: u8,
        /// Fingerprint tag.
        fp: Option<u8>,
        /// Lease in steps.
        lease: u8,
    },
    /// `complete`.
    Complete {
        /// Key index.
        key: u8,
        /// Token pick.
        token: u8,
        /// Outcome tag.
        outcome: Option<u8>,
        /// Retention in steps.
        retention: u8,
    },
    /// `release`.
    Release {
        /// Key index.
        key: u8,
        /// Token pick.
        token: u8,
    },
    /// `reopen`.
    Reopen {
        /// Key index.
        key: u8,
        /// Token pick.
        token: u8,
    },
    /// `extend`.
    Extend {
        /// Key index.
        key: u8,
        /// Token pick.
        token: u8,
        /// Lease in steps.
        lease: u8,
    },
    /// `get`.
    Get {
        /// Key index.
        key: u8,
    },
    /// Let time pass (manual clocks only).
    Pass(u8),
}

fn op_strategy(time_moves: bool) -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let fp = proptest::option::of(0..2u8);
    let ops = prop_oneof![
        3 => (key.clone(), fp, 1..6u8).prop_map(|(key, fp, lease)| Op::Begin { key, fp, lease }),
        2 => (key.clone(), any::<u8>(), proptest::option::of(0..3u8), 1..8u8)
            .prop_map(|(key, token, outcome, retention)| Op::Complete { key, token, outcome, retention }),
        1 => (key.clone(), any::<u8>()).prop_map(|(key, token)| Op::Release { key, token }),
        1 => (key.clone(), any::<u8>()).prop_map(|(key, token)| Op::Reopen { key, token }),
        1 => (key.clone(), any::<u8>(), 1..6u8).prop_map(|(key, token, lease)| Op::Extend { key, token, lease }),
        1 => key.prop_map(|key| Op::Get { key }),
    ];
    if time_moves {
        prop_oneof![6 => ops, 2 => (1..5u8).prop_map(Op::Pass)].boxed()
    } else {
        ops.boxed()
    }
}

#[derive(Clone, Debug, PartialEq)]
enum ModelRecord {
    InProgress {
        token: usize,
        fp: Option<u8>,
        lease_expires_at: u64,
        attempts: u32,
        started_at: u64,
    },
    Completed {
        token: usize,
        fp: Option<u8>,
        outcome: Option<u8>,
        completed_at: u64,
        expires_at: u64,
    },
}

/// The reference: per key, the record; times in ms on the subject's clock.
struct Model {
    now: u64,
    records: HashMap<u8, ModelRecord>,
}

#[derive(Debug, PartialEq)]
enum Answer {
    Acquired {
        attempt: u32,
        lease_expires_at: u64,
    },
    InProgress {
        retry_after: u64,
    },
    Completed {
        outcome: Option<u8>,
        completed_at: u64,
    },
    Mismatch,
    Fenced(Option<u64>),
    Stale,
    Record(Option<ModelRecord>),
}

impl Model {
    fn live(&self, key: u8) -> Option<&ModelRecord> {
        self.records.get(&key).filter(|r| match r {
            ModelRecord::Completed { expires_at, .. } => *expires_at > self.now,
            ModelRecord::InProgress { .. } => true,
        })
    }

    fn owned(&self, key: u8, token: usize) -> bool {
        matches!(self.live(key), Some(ModelRecord::InProgress { token: t, lease_expires_at, .. })
            if *t == token && *lease_expires_at > self.now)
    }

    /// Applies `op`; `issued` is the index the next token would get.
    fn apply(&mut self, op: &Op, step: u64, token: usize, issued: usize) -> Answer {
        let now = self.now;
        match *op {
            Op::Begin { key, fp, lease } => {
                let lease_expires_at = now + lease as u64 * step;
                let mismatch =
                    |stored: Option<u8>| matches!((stored, fp), (Some(a), Some(b)) if a != b);
                let attempt = match self.live(key) {
                    None => 1,
                    Some(ModelRecord::InProgress {
                        lease_expires_at: l,
                        attempts,
                        ..
                    }) if *l <= now => attempts + 1,
                    Some(
                        ModelRecord::InProgress { fp: f, .. }
                        | ModelRecord::Completed { fp: f, .. },
                    ) if mismatch(*f) => {
                        return Answer::Mismatch;
                    }
                    Some(ModelRecord::InProgress {
                        lease_expires_at: l,
                        ..
                    }) => {
                        return Answer::InProgress {
                            retry_after: l - now,
                        };
                    }
                    Some(ModelRecord::Completed {
                        outcome,
                        completed_at,
                        ..
                    }) => {
                        return Answer::Completed {
                            outcome: *outcome,
                            completed_at: *completed_at,
                        };
                    }
                };
                self.records.insert(
                    key,
                    ModelRecord::InProgress {
                        token: issued,
                        fp,
                        lease_expires_at,
                        attempts: attempt,
                        started_at: now,
                    },
                );
                Answer::Acquired {
                    attempt,
                    lease_expires_at,
                }
            }
            Op::Complete {
                key,
                outcome,
                retention,
                ..
            } => {
                if matches!(self.live(key), Some(ModelRecord::Completed { token: t, .. }) if *t == token)
                {
                    // A retried complete by the completing token: Ok, no change.
                    return Answer::Fenced(None);
                }
                if !self.owned(key, token) {
                    return Answer::Stale;
                }
                let Some(ModelRecord::InProgress { fp, .. }) = self.records.get(&key).cloned()
                else {
                    unreachable!()
                };
                self.records.insert(
                    key,
                    ModelRecord::Completed {
                        token,
                        fp,
                        outcome,
                        completed_at: now,
                        expires_at: now + retention as u64 * step,
                    },
                );
                Answer::Fenced(None)
            }
            Op::Release { key, .. } => {
                if !self.owned(key, token) {
                    return Answer::Stale;
                }
                self.records.remove(&key);
                Answer::Fenced(None)
            }
            Op::Reopen { key, .. } => {
                if !matches!(self.live(key), Some(ModelRecord::Completed { token: t, .. }) if *t == token)
                {
                    return Answer::Stale;
                }
                self.records.remove(&key);
                Answer::Fenced(None)
            }
            Op::Extend { key, lease, .. } => {
                if !self.owned(key, token) {
                    return Answer::Stale;
                }
                let until = now + lease as u64 * step;
                if let Some(ModelRecord::InProgress {
                    lease_expires_at, ..
                }) = self.records.get_mut(&key)
                {
                    *lease_expires_at = until;
                }
                Answer::Fenced(Some(until))
            }
            Op::Get { key } => Answer::Record(self.live(key).cloned()),
            Op::Pass(n) => {
                self.now += n as u64 * step;
                Answer::Fenced(None)
            }
        }
    }
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs 48 random sequences of up to 40 operations against the subject.
pub async fn check<S: Store + Clone>(s: &Subject<S>) {
    let time_moves = s.exact_time();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(op_strategy(time_moves), 1..40);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&strategy, |ops| {
        tokio::task::block_in_place(|| handle.block_on(run_case(s, &ops)))
    });
    if let Err(e) = result {
        panic!("the store disagreed with the model: {e}");
    }
}

async fn run_case<S: Store + Clone>(s: &Subject<S>, ops: &[Op]) -> Result<(), TestCaseError> {
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let key = |k: u8| s.key(&format!("model-{case}-{k}"));
    // Without a manual clock time is frozen for the model: leases and
    // retention are long, and no operation lets time pass.
    let step = if s.exact_time() {
        s.steps(1)
    } else {
        s.steps(1) * 600
    };
    let step_ms = step.as_millis() as u64;
    let start = s.now().map_or(0, Timestamp::as_millis);
    let mut model = Model {
        now: start,
        records: HashMap::new(),
    };
    let mut tokens: HashMap<u8, Vec<FencingToken>> = HashMap::new();
    let never_issued = FencingToken::new(u64::MAX / 2);
    for (i, op) in ops.iter().enumerate() {
        let pick = |k: u8, t: u8| -> (usize, FencingToken) {
            let list = tokens.get(&k).map_or(&[][..], Vec::as_slice);
            let idx = t as usize % (list.len() + 1);
            (idx, list.get(idx).copied().unwrap_or(never_issued))
        };
        let fingerprint = |f: Option<u8>| f.map(|f| Fingerprint::xxh3(&[f]));
        let (token_idx, token) = match *op {
            Op::Complete { key, token, .. }
            | Op::Release { key, token }
            | Op::Reopen { key, token }
            | Op::Extend { key, token, .. } => pick(key, token),
            _ => (usize::MAX, never_issued),
        };
        let issued_next = match *op {
            Op::Begin { key, .. } => tokens.get(&key).map_or(0, Vec::len),
            _ => 0,
        };
        let expected = model.apply(op, step_ms, token_idx, issued_next);
        let actual = match *op {
            Op::Begin { key: k, fp, lease } => {
                let got = s
                    .store
                    .begin(&key(k), fingerprint(fp), Lease::new(step * lease as u32))
                    .await;
                match got.map_err(|e| TestCaseError::fail(e.to_string()))? {
                    Begin::Acquired(c) => {
                        let list = tokens.entry(k).or_default();
                        if let Some(last) = list.last() {
                            prop_assert!(c.token > *last, "token {:?} after {:?}", c.token, last);
                        }
                        list.push(c.token);
                        Answer::Acquired {
                            attempt: c.attempt,
                            lease_expires_at: c.lease_expires_at.as_millis(),
                        }
                    }
                    Begin::InProgress { retry_after } => Answer::InProgress {
                        retry_after: millis(retry_after),
                    },
                    Begin::Completed {
                        outcome,
                        completed_at,
                    } => Answer::Completed {
                        outcome: outcome.map(|o| o[0]),
                        completed_at: completed_at.as_millis(),
                    },
                    Begin::Mismatch => Answer::Mismatch,
                }
            }
            Op::Complete {
                key: k,
                outcome,
                retention,
                ..
            } => {
                let got = s
                    .store
                    .complete(
                        &key(k),
                        token,
                        outcome.map(|o| Bytes::from(vec![o])),
                        step * retention as u32,
                    )
                    .await;
                fenced(
                    got.map_err(|e| TestCaseError::fail(e.to_string()))?
                        .map(|()| None),
                )
            }
            Op::Release { key: k, .. } => {
                let got = s.store.release(&key(k), token).await;
                fenced(
                    got.map_err(|e| TestCaseError::fail(e.to_string()))?
                        .map(|()| None),
                )
            }
            Op::Reopen { key: k, .. } => {
                let got = s.store.reopen(&key(k), token).await;
                fenced(
                    got.map_err(|e| TestCaseError::fail(e.to_string()))?
                        .map(|()| None),
                )
            }
            Op::Extend { key: k, lease, .. } => {
                let got = s
                    .store
                    .extend(&key(k), token, Lease::new(step * lease as u32))
                    .await;
                fenced(
                    got.map_err(|e| TestCaseError::fail(e.to_string()))?
                        .map(|t| Some(t.as_millis())),
                )
            }
            Op::Get { key: k } => {
                let got = s
                    .store
                    .get(&key(k))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let list = tokens.get(&k).cloned().unwrap_or_default();
                Answer::Record(got.map(|r| as_model(r, &list)))
            }
            Op::Pass(n) => {
                s.pass(n as u32).await;
                Answer::Fenced(None)
            }
        };
        let (expected, actual) = if s.exact_time() {
            (expected, actual)
        } else {
            (without_times(expected), without_times(actual))
        };
        prop_assert_eq!(expected, actual, "operation {} ({:?}) of {:?}", i, op, ops);
    }
    Ok(())
}

fn fenced(f: Fenced<Option<u64>>) -> Answer {
    match f {
        Fenced::Ok(t) => Answer::Fenced(t),
        Fenced::Stale => Answer::Stale,
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn as_model(r: Record, tokens: &[FencingToken]) -> ModelRecord {
    let idx = |t: FencingToken| tokens.iter().position(|x| *x == t).unwrap_or(usize::MAX);
    let tag = |f: Option<Fingerprint>| {
        f.map(|f| {
            (0..2u8)
                .find(|i| Fingerprint::xxh3(&[*i]) == f)
                .unwrap_or(u8::MAX)
        })
    };
    match r {
        Record::InProgress(r) => ModelRecord::InProgress {
            token: idx(r.token),
            fp: tag(r.fingerprint),
            lease_expires_at: r.lease_expires_at.as_millis(),
            attempts: r.attempts,
            started_at: r.started_at.as_millis(),
        },
        Record::Completed(r) => ModelRecord::Completed {
            token: idx(r.token),
            fp: tag(r.fingerprint),
            outcome: r.outcome.map(|o| o[0]),
            completed_at: r.completed_at.as_millis(),
            expires_at: r.expires_at.as_millis(),
        },
    }
}

/// Drops the times a real clock makes unpredictable.
fn without_times(a: Answer) -> Answer {
    match a {
        Answer::Acquired { attempt, .. } => Answer::Acquired {
            attempt,
            lease_expires_at: 0,
        },
        Answer::InProgress { .. } => Answer::InProgress { retry_after: 0 },
        Answer::Completed { outcome, .. } => Answer::Completed {
            outcome,
            completed_at: 0,
        },
        Answer::Fenced(t) => Answer::Fenced(t.map(|_| 0)),
        Answer::Record(r) => Answer::Record(r.map(|r| match r {
            ModelRecord::InProgress {
                token,
                fp,
                attempts,
                ..
            } => ModelRecord::InProgress {
                token,
                fp,
                attempts,
                lease_expires_at: 0,
                started_at: 0,
            },
            ModelRecord::Completed {
                token, fp, outcome, ..
            } => ModelRecord::Completed {
                token,
                fp,
                outcome,
                completed_at: 0,
                expires_at: 0,
            },
        })),
        other => other,
    }
}
