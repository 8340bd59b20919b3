//! Single operations issued at the same time travel together, for stores
//! that answer over a network (Redis, SQL).
//!
//! A `begin` or `complete` that finds the store idle goes straight out, so a
//! lone caller pays no extra hop. While calls are in flight, the operations
//! that arrive wait in a queue; a driver task sends whatever has gathered as
//! one many-item call as soon as fewer than `CALLS_IN_FLIGHT` (8) of its calls
//! are out, after yielding once so that tasks about to queue join this batch
//! rather than the next. Under load the server then runs one script or
//! statement for a dozen items instead of one each, and the client encodes
//! and parses one command.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::{Begin, BeginItem, CompleteItem, Fenced, FencingToken, Key, StoreError};

/// Most batched calls the driver keeps out at once; the operations that
/// arrive meanwhile form the next batch. Measured at 64 tasks on two cores:
/// 2 to 32 all within noise once the driver yields before gathering; 8
/// keeps Redis busy without cutting batches short.
const CALLS_IN_FLIGHT: usize = 8;

type Reply<O> = oneshot::Sender<Result<O, StoreError>>;

/// Performs a batch, answering each item in order, each on its own: an
/// item whose part of the batch failed gets the error, the others their
/// answers.
type Run<I, O> =
    Arc<dyn Fn(Arc<Vec<I>>) -> BoxFuture<'static, Vec<Result<O, StoreError>>> + Send + Sync>;

/// Takes care of an answer that came back for a caller who had stopped
/// waiting after its item was sent.
type Unheard<I, O> = Arc<dyn Fn(&I, O) + Send + Sync>;

/// Sends single operations of one kind (`I` in, `O` out): straight out, or
/// gathered into batches.
pub struct Coalescer<I, O> {
    run: Run<I, O>,
    /// `None` when batching is off.
    queue: Option<mpsc::UnboundedSender<(I, Reply<O>)>>,
    /// Calls in flight, direct or batched.
    busy: Arc<AtomicUsize>,
}

/// Counts a call in flight for as long as it lives, even when its future is
/// dropped half-way.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<I: Send + Sync + 'static, O: Send + 'static> Coalescer<I, O> {
    /// `run` performs a batch and answers each item in order; `unheard`
    /// takes an answer whose caller stopped waiting after its item was sent
    /// in a batch. With `batching`, starts the driver on the current Tokio
    /// runtime, which gathers at most `items_per_call` items a batch;
    /// without, every operation goes straight out.
    pub fn start<F, Fut>(
        run: F,
        unheard: impl Fn(&I, O) + Send + Sync + 'static,
        batching: bool,
        items_per_call: usize,
    ) -> Self
    where
        F: Fn(Arc<Vec<I>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<O, StoreError>>> + Send + 'static,
    {
        let run: Run<I, O> = Arc::new(move |items| Box::pin(run(items)));
        let busy = Arc::new(AtomicUsize::new(0));
        let queue = batching.then(|| {
            let (queue, rx) = mpsc::unbounded_channel();
            let limit = items_per_call.max(1);
            tokio::spawn(drive(
                rx,
                run.clone(),
                Arc::new(unheard),
                busy.clone(),
                limit,
            ));
            queue
        });
        Coalescer { run, queue, busy }
    }

    /// Performs `item` as a batch of one.
    async fn direct(&self, item: I) -> Result<O, StoreError> {
        let _busy = Busy::enter(&self.busy);
        let mut answers = (self.run)(Arc::new(vec![item])).await;
        answers.pop().expect("one answer per item")
    }

    /// Performs `item`: straight out when nothing is in flight (or
    /// batching is off), else in the next batch.
    pub async fn call(&self, item: I) -> Result<O, StoreError> {
        let Some(queue) = self
            .queue
            .as_ref()
            .filter(|_| self.busy.load(Ordering::Relaxed) > 0)
        else {
            return self.direct(item).await;
        };
        let (tx, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError((item, _))) = queue.send((item, tx)) {
            // The driver is gone (its runtime shut down): go direct.
            return self.direct(item).await;
        }
        match rx.await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::unavailable(
                "the store's batching task stopped before answering",
            )),
        }
    }
}

/// The driver: sends what has gathered whenever a call slot is free. Each
/// call runs as a task of its own, so replies are read and answered on
/// whichever worker thread is free.
async fn drive<I: Send + Sync + 'static, O: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<(I, Reply<O>)>,
    run: Run<I, O>,
    unheard: Unheard<I, O>,
    busy: Arc<AtomicUsize>,
    items_per_call: usize,
) {
    let slots = Arc::new(Semaphore::new(CALLS_IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let Some(first) = rx.recv().await else { break };
        // Let the tasks that are ready to run go first: they are the ones
        // about to queue, and join this batch instead of the next.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while batch.len() < items_per_call {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // A caller that stopped waiting (its future was dropped) does not
        // want its operation done: a claim nobody holds would only block
        // the key until its lease ran out.
        batch.retain(|(_, reply)| !reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
        let items = Arc::new(items);
        let busy = Busy::enter(&busy);
        let call = run(items.clone());
        let unheard = unheard.clone();
        tokio::spawn(async move {
            let answers = call.await;
            drop((busy, slot));
            answer(replies, &items, answers, &*unheard);
        });
    }
}

/// Hands each waiting caller its own item's answer; one that stopped
/// waiting leaves its answer to `unheard`.
fn answer<I, O>(
    replies: Vec<Reply<O>>,
    items: &[I],
    answers: Vec<Result<O, StoreError>>,
    unheard: &(dyn Fn(&I, O) + Send + Sync),
) {
    for ((reply, item), a) in replies.into_iter().zip(items).zip(answers) {
        if let Err(Ok(o)) = reply.send(a) {
            unheard(item, o);
        }
    }
}

/// What a store that answers over a network does with gathered calls: its
/// many-item `begin` and `complete`, each item answered on its own, and the
/// release of one claim.
pub trait Batched: Send + Sync + 'static {
    /// `begin` for each item.
    fn begin_items(
        &self,
        items: &[BeginItem],
    ) -> impl Future<Output = Vec<Result<Begin, StoreError>>> + Send;
    /// `complete` for each item.
    fn complete_items(
        &self,
        items: &[CompleteItem],
    ) -> impl Future<Output = Vec<Result<Fenced, StoreError>>> + Send;
    /// `release` of one claim.
    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;
}

/// A store's single `begin`s and `complete`s, gathered into batches.
///
/// A claim made in a batch for a caller who stopped waiting would only
/// block its key for a lease, so it is released; a completion stands
/// whether or not its caller heard.
pub struct StoreBatches {
    begin: Coalescer<BeginItem, Begin>,
    complete: Coalescer<CompleteItem, Fenced>,
}

impl StoreBatches {
    /// Gathers calls for `store` (with `batching`; otherwise each goes
    /// straight out), at most `items_per_call` a batch.
    pub fn start<S: Batched>(store: Arc<S>, batching: bool, items_per_call: usize) -> Self {
        let (b, c, r) = (store.clone(), store.clone(), store);
        StoreBatches {
            begin: Coalescer::start(
                move |items: Arc<Vec<BeginItem>>| {
                    let store = b.clone();
                    async move { store.begin_items(&items).await }
                },
                move |item: &BeginItem, answer: Begin| {
                    if let Begin::Acquired(claim) = answer {
                        let (store, key) = (r.clone(), item.key.clone());
                        tokio::spawn(async move {
                            if let Err(e) = store.release(&key, claim.token).await {
                                tracing::warn!(error = %e, "a claim whose caller left stays until its lease ends");
                            }
                        });
                    }
                },
                batching,
                items_per_call,
            ),
            complete: Coalescer::start(
                move |items: Arc<Vec<CompleteItem>>| {
                    let store = c.clone();
                    async move { store.complete_items(&items).await }
                },
                |_: &CompleteItem, _: Fenced| {},
                batching,
                items_per_call,
            ),
        }
    }

    /// Performs one `begin`.
    pub async fn begin(&self, item: BeginItem) -> Result<Begin, StoreError> {
        self.begin.call(item).await
    }

    /// Performs one `complete`.
    pub async fn complete(&self, item: CompleteItem) -> Result<Fenced, StoreError> {
        self.complete.call(item).await
    }
}
