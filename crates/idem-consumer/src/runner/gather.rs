//! The completions of one fetched batch, stored with one `complete_many`.
//!
//! The runner claims a fetched batch with one `begin_many`; this module
//! sends the same batch's completions back as one call. Each message's
//! first step runs as a member of its batch. A handler that succeeds
//! queues its completion and waits; the batch's queue is stored as one
//! `complete_many` as soon as every member has either queued its completion
//! or left without one (a duplicate, a failure, a retry), or once the first
//! queued completion has waited the runner's completion linger, so a slow
//! handler holds the others' acks no longer than that. A message is acked
//! only after its completion is stored: the write is behind by at most the
//! linger, well within the lease, and always before the ack or offset
//! commit that depends on it.
//!
//! # Cancel safety
//!
//! A queued completion is stored by a task of its own, whether or not its
//! caller is still waiting: like [`Store::complete`], dropping the call
//! after it was queued may still let it land, and a member that leaves (its
//! task ends or panics) never keeps the others waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{BoxFuture, join_all};
use idem_core::layer::StoreWrapper;
use idem_core::{CompleteItem, Fenced, FencingToken, Key, Store, StoreError};
use parking_lot::Mutex;
use tokio::sync::oneshot;

tokio::task_local! {
    /// The fetched batch the running message belongs to, if it still does.
    static MEMBER: Option<Member>;
}

/// Stores a batch's completions, answering each item in order.
pub(super) type Flush = Arc<
    dyn Fn(Vec<CompleteItem>) -> BoxFuture<'static, Vec<Result<Fenced, StoreError>>> + Send + Sync,
>;

/// Stores batches in `store`: one `complete_many`, or each item on its own
/// when the batch fails or is refused as a whole, so that one item's
/// trouble (an outcome over a limit, say) is its own.
pub(super) fn flush_into<S: Store + Clone>(store: S) -> Flush {
    Arc::new(move |items: Vec<CompleteItem>| {
        let store = store.clone();
        Box::pin(async move {
            match store.complete_many(&items).await {
                Ok(answers) if answers.len() == items.len() => {
                    answers.into_iter().map(Ok).collect()
                }
                _ => {
                    join_all(items.iter().map(|item| {
                        store.complete(&item.key, item.token, item.outcome.clone(), item.retention)
                    }))
                    .await
                }
            }
        })
    })
}

type Reply = oneshot::Sender<Result<Fenced, StoreError>>;

/// One fetched batch's completions.
pub(super) struct Batch {
    flush: Flush,
    linger: Duration,
    state: Mutex<State>,
}

struct State {
    /// Members that have neither queued a completion nor left.
    open: usize,
    queued: Vec<(CompleteItem, Reply)>,
}

impl Batch {
    /// A batch of `members` messages.
    pub(super) fn new(flush: Flush, linger: Duration, members: usize) -> Arc<Self> {
        Arc::new(Self {
            flush,
            linger,
            state: Mutex::new(State {
                open: members,
                queued: Vec::with_capacity(members),
            }),
        })
    }

    /// Queues a member's completion; stores the queue if it was the last
    /// member the batch waited for.
    fn queue(&self, item: CompleteItem) -> oneshot::Receiver<Result<Fenced, StoreError>> {
        let (reply, answer) = oneshot::channel();
        self.depart(Some((item, reply)));
        answer
    }

    /// A member leaves without a completion; stores the queue if it was the
    /// last member the batch waited for.
    fn leave(&self) {
        self.depart(None);
    }

    /// A member gives up its place, with its completion or without.
    fn depart(&self, completion: Option<(CompleteItem, Reply)>) {
        let ready = {
            let mut state = self.state.lock();
            state.queued.extend(completion);
            state.open -= 1;
            (state.open == 0).then(|| std::mem::take(&mut state.queued))
        };
        if let Some(queued) = ready {
            self.store(queued);
        }
    }

    /// Stores whatever is queued now, without waiting for the others.
    fn store_now(&self) {
        let queued = std::mem::take(&mut self.state.lock().queued);
        self.store(queued);
    }

    /// Stores `queued` on a task of its own, so that it finishes whoever
    /// stops waiting.
    fn store(&self, queued: Vec<(CompleteItem, Reply)>) {
        if queued.is_empty() {
            return;
        }
        // Outside a runtime (a member dropped while it shuts down) the
        // replies are dropped, and each caller hears that its completion
        // was not stored.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let flush = self.flush.clone();
        runtime.spawn(async move {
            let (items, replies): (Vec<_>, Vec<_>) = queued.into_iter().unzip();
            let answers = flush(items).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        });
    }
}

/// A message's place in its batch, given up once: when it queues its
/// completion, or leaves without one, or is dropped.
#[derive(Clone)]
pub(super) struct Member(Arc<Place>);

struct Place {
    batch: Arc<Batch>,
    left: AtomicBool,
}

impl Member {
    pub(super) fn of(batch: &Arc<Batch>) -> Self {
        Member(Arc::new(Place {
            batch: batch.clone(),
            left: AtomicBool::new(false),
        }))
    }

    /// Gives the place up; true if it was still held.
    fn give_up(&self) -> bool {
        !self.0.left.swap(true, Ordering::AcqRel)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !*self.left.get_mut() {
            self.batch.leave();
        }
    }
}

/// Runs `step` as a member of `batch` (with `None`, as nobody's).
pub(super) async fn within<T>(member: Option<Member>, step: impl Future<Output = T>) -> T {
    MEMBER.scope(member, step).await
}

/// The running message leaves its batch without a completion (or has
/// already queued it): the batch no longer waits for it.
pub(super) fn leave() {
    let _ = MEMBER.try_with(|member| {
        if let Some(member) = member
            && member.give_up()
        {
            member.0.batch.leave();
        }
    });
}

/// The runner's store: completions of a message running as a member of a
/// batch go into the batch's one call; everything else goes straight
/// through.
#[derive(Clone)]
pub(super) struct Gathered<S> {
    inner: S,
}

impl<S> Gathered<S> {
    pub(super) fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: Store + Clone> StoreWrapper for Gathered<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        outcome: Option<Bytes>,
        retention: Duration,
    ) -> Result<Fenced, StoreError> {
        let member = MEMBER
            .try_with(|member| member.clone())
            .ok()
            .flatten()
            .filter(Member::give_up);
        let Some(member) = member else {
            return self.inner.complete(key, token, outcome, retention).await;
        };
        let batch = &member.0.batch;
        let answer = batch.queue(CompleteItem {
            key: key.clone(),
            token,
            outcome,
            retention,
        });
        tokio::pin!(answer);
        let answer = tokio::select! {
            biased;
            answer = &mut answer => answer,
            () = tokio::time::sleep(batch.linger) => {
                batch.store_now();
                answer.await
            }
        };
        answer.unwrap_or_else(|_| {
            Err(StoreError::unavailable(
                "the batch storing this completion stopped before answering",
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{Begin, Lease, MemoryStore, RecordState};

    use super::*;

    async fn claimed(store: &MemoryStore, name: &str) -> (Key, FencingToken) {
        let key = Key::new("t", name.to_owned()).unwrap();
        match Store::begin(store, &key, None, Lease::from_secs(30)).await {
            Ok(Begin::Acquired(claim)) => (key, claim.token),
            other => panic!("{other:?}"),
        }
    }

    async fn state(store: &MemoryStore, key: &Key) -> RecordState {
        Store::get(store, key).await.unwrap().unwrap().state()
    }

    #[tokio::test]
    async fn a_completion_whose_caller_left_still_lands_when_the_batch_is_stored() {
        let store = MemoryStore::new();
        let (a, token) = claimed(&store, "a").await;
        let batch = Batch::new(flush_into(store.clone()), Duration::from_secs(60), 2);
        let (first, second) = (Member::of(&batch), Member::of(&batch));
        let gathered = Gathered::new(store.clone());
        let call = within(
            Some(first),
            Store::complete(
                &gathered,
                &a,
                token,
                Some(Bytes::from_static(b"x")),
                Duration::from_secs(60),
            ),
        );
        // Queued, waiting for the second member; then its caller goes.
        tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .expect_err("the batch waits for its other member");
        assert_eq!(state(&store, &a).await, RecordState::InProgress);

        // The other member leaves without a completion: the batch is stored.
        drop(second);
        for _ in 0..100 {
            if state(&store, &a).await == RecordState::Completed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(state(&store, &a).await, RecordState::Completed);
        // The key answers as any completed key does.
        let again = Store::begin(&store, &a, None, Lease::from_secs(30)).await;
        assert!(matches!(again, Ok(Begin::Completed { .. })), "{again:?}");
    }

    #[tokio::test]
    async fn a_completion_outside_any_batch_goes_straight_to_the_store() {
        let store = MemoryStore::new();
        let (a, token) = claimed(&store, "a").await;
        let gathered = Gathered::new(store.clone());
        let done = within(
            None,
            Store::complete(&gathered, &a, token, None, Duration::from_secs(60)),
        )
        .await
        .unwrap();
        assert_eq!(done, Fenced::Ok(()));
        assert_eq!(state(&store, &a).await, RecordState::Completed);
    }
}
