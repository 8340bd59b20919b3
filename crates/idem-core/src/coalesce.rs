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

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::{Begin, BeginItem, CompleteItem, Fenced, FencingToken, Fingerprint, Key, StoreError};

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
///
/// A key that comes several times in one batch (a hot key) goes to the
/// store once: its later copies are answered from the first one's answer,
/// as the single form would answer them right after it (a `begin` after an
/// acquisition is `InProgress` for the holder's lease, a `complete` after
/// a completion is a retried one). Only a copy that answer does not settle
/// (another fingerprint after `InProgress`, `Completed` or `Mismatch`;
/// another token after `Stale`) waits for another round.
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
                    async move { once_per_key(&*store, &items).await }
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
                    async move { once_per_key(&*store, &items).await }
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

/// An operation whose copies for one key in a batch can be answered from
/// the answer of the copy before.
trait PerKey: Clone + Sync {
    type Answer: Send;

    fn key(&self) -> &Key;

    /// What the single form answers `self` right after `earlier` was
    /// answered `answer` (the record is the one that answer saw or left),
    /// or `None` when that answer does not settle it.
    fn follows(
        &self,
        earlier: &Self,
        answer: &Result<Self::Answer, StoreError>,
    ) -> Option<Result<Self::Answer, StoreError>>;

    fn run<S: Batched>(
        store: &S,
        items: &[Self],
    ) -> impl Future<Output = Vec<Result<Self::Answer, StoreError>>> + Send;
}

impl PerKey for BeginItem {
    type Answer = Begin;

    fn key(&self) -> &Key {
        &self.key
    }

    fn follows(
        &self,
        earlier: &Self,
        answer: &Result<Begin, StoreError>,
    ) -> Option<Result<Begin, StoreError>> {
        let differs = |a: Option<Fingerprint>, b: Option<Fingerprint>| matches!((a, b), (Some(a), Some(b)) if a != b);
        Some(match answer {
            // A store that failed on the key fails its copies alike: an
            // outage would fail them one by one, each after the last.
            Err(e) => Err(e.copied()),
            // The earlier copy holds a lease that has just begun.
            Ok(Begin::Acquired(_)) if differs(earlier.fingerprint, self.fingerprint) => {
                Ok(Begin::Mismatch)
            }
            Ok(Begin::Acquired(_)) => Ok(Begin::InProgress {
                retry_after: earlier.lease.duration(),
            }),
            // The same content meets the same record.
            Ok(same) if self.fingerprint == earlier.fingerprint => Ok(same.clone()),
            // The record's fingerprint is not in the answer.
            Ok(_) => return None,
        })
    }

    fn run<S: Batched>(
        store: &S,
        items: &[Self],
    ) -> impl Future<Output = Vec<Result<Begin, StoreError>>> + Send {
        store.begin_items(items)
    }
}

impl PerKey for CompleteItem {
    type Answer = Fenced;

    fn key(&self) -> &Key {
        &self.key
    }

    fn follows(
        &self,
        earlier: &Self,
        answer: &Result<Fenced, StoreError>,
    ) -> Option<Result<Fenced, StoreError>> {
        let same_token = self.token == earlier.token;
        Some(match answer {
            Err(e) => Err(e.copied()),
            // Completed by the earlier token: a retry by it is `Ok` again,
            // any other token is stale.
            Ok(Fenced::Ok(())) if same_token => Ok(Fenced::Ok(())),
            Ok(Fenced::Ok(())) => Ok(Fenced::Stale),
            // Nothing changed, and the same token is as stale as before.
            Ok(Fenced::Stale) if same_token => Ok(Fenced::Stale),
            Ok(Fenced::Stale) => return None,
        })
    }

    fn run<S: Batched>(
        store: &S,
        items: &[Self],
    ) -> impl Future<Output = Vec<Result<Fenced, StoreError>>> + Send {
        store.complete_items(items)
    }
}

/// Performs `items` sending each key at most once a round: the first
/// waiting copy of each key goes out, and the copies after it are answered
/// from its answer where that settles them; the first one it does not
/// settle (and every copy after that one) waits for the next round. A
/// batch without copies is one call with the items as they are.
async fn once_per_key<S: Batched, I: PerKey>(
    store: &S,
    items: &[I],
) -> Vec<Result<I::Answer, StoreError>> {
    let mut answers: Vec<Option<Result<I::Answer, StoreError>>> =
        std::iter::repeat_with(|| None).take(items.len()).collect();
    let mut waiting: Vec<usize> = (0..items.len()).collect();
    while !waiting.is_empty() {
        let mut sent_for: HashMap<&Key, usize> = HashMap::with_capacity(waiting.len());
        let mut sent = Vec::with_capacity(waiting.len());
        let mut copies = Vec::new();
        for &i in &waiting {
            match sent_for.entry(items[i].key()) {
                Entry::Vacant(e) => {
                    e.insert(i);
                    sent.push(i);
                }
                Entry::Occupied(_) => copies.push(i),
            }
        }
        let got = if copies.is_empty() && sent.len() == items.len() {
            I::run(store, items).await
        } else {
            let round: Vec<I> = sent.iter().map(|&i| items[i].clone()).collect();
            I::run(store, &round).await
        };
        for (&i, answer) in sent.iter().zip(got) {
            answers[i] = Some(answer);
        }
        let mut held: HashSet<&Key> = HashSet::new();
        waiting = Vec::new();
        for i in copies {
            let key = items[i].key();
            if !held.contains(key) {
                let earlier = sent_for[key];
                let answer = answers[earlier].as_ref().expect("answered this round");
                if let Some(a) = items[i].follows(&items[earlier], answer) {
                    answers[i] = Some(a);
                    continue;
                }
                held.insert(key);
            }
            waiting.push(i);
        }
    }
    answers
        .into_iter()
        .map(|a| a.expect("every item answered"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::future::join_all;
    use parking_lot::Mutex;

    use super::*;
    use crate::{Lease, ManualClock, MemoryStore, Store};

    /// Answers a batch with the single form, item after item, on a memory
    /// store: the reference every batch answer must equal. Counts its calls.
    struct Sequential {
        memory: MemoryStore,
        /// The number of items of each call, in order.
        calls: Mutex<Vec<usize>>,
        down: AtomicBool,
        /// Holds the first call until sent a value.
        gate: Mutex<Option<oneshot::Receiver<()>>>,
    }

    impl Sequential {
        fn new(clock: &ManualClock) -> Self {
            Sequential {
                memory: MemoryStore::builder().clock(clock.clone()).build(),
                calls: Mutex::default(),
                down: AtomicBool::new(false),
                gate: Mutex::default(),
            }
        }

        async fn enter(&self, items: usize) -> Result<(), StoreError> {
            self.calls.lock().push(items);
            let gate = self.gate.lock().take();
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            match self.down.load(Ordering::SeqCst) {
                true => Err(StoreError::unavailable("down")),
                false => Ok(()),
            }
        }

        fn calls(&self) -> Vec<usize> {
            self.calls.lock().clone()
        }
    }

    impl Batched for Sequential {
        async fn begin_items(&self, items: &[BeginItem]) -> Vec<Result<Begin, StoreError>> {
            let up = self.enter(items.len()).await;
            let mut out = Vec::new();
            for i in items {
                out.push(match &up {
                    Ok(()) => self.memory.begin(&i.key, i.fingerprint, i.lease).await,
                    Err(e) => Err(e.copied()),
                });
            }
            out
        }

        async fn complete_items(&self, items: &[CompleteItem]) -> Vec<Result<Fenced, StoreError>> {
            let up = self.enter(items.len()).await;
            let mut out = Vec::new();
            for i in items {
                out.push(match &up {
                    Ok(()) => {
                        self.memory
                            .complete(&i.key, i.token, i.outcome.clone(), i.retention)
                            .await
                    }
                    Err(e) => Err(e.copied()),
                });
            }
            out
        }

        async fn release(&self, key: &Key, token: FencingToken) -> Result<Fenced, StoreError> {
            self.memory.release(key, token).await
        }
    }

    fn key(k: &str) -> Key {
        Key::new("coalesce", k.to_owned()).unwrap()
    }

    fn begin(k: &str, fingerprint: Option<&str>, lease_ms: u64) -> BeginItem {
        BeginItem {
            key: key(k),
            fingerprint: fingerprint.map(|f| Fingerprint::sha256(f.as_bytes())),
            lease: Lease::from_millis(lease_ms),
        }
    }

    fn complete(k: &str, token: FencingToken, outcome: &'static str) -> CompleteItem {
        CompleteItem {
            key: key(k),
            token,
            outcome: Some(Bytes::from_static(outcome.as_bytes())),
            retention: Duration::from_secs(60),
        }
    }

    /// Two stores in the same state on one frozen clock: `batched` answers
    /// through `once_per_key`, `reference` one item after another.
    struct Pair {
        batched: Sequential,
        reference: Sequential,
    }

    impl Pair {
        fn new() -> Self {
            let clock = ManualClock::new();
            Pair {
                batched: Sequential::new(&clock),
                reference: Sequential::new(&clock),
            }
        }

        /// Claims `k` in both stores; the (equal) token.
        async fn claim(&self, k: &str, fingerprint: Option<&str>) -> FencingToken {
            let item = begin(k, fingerprint, 30_000);
            let mut tokens = Vec::new();
            for s in [&self.batched, &self.reference] {
                let Ok(Begin::Acquired(claim)) = s
                    .memory
                    .begin(&item.key, item.fingerprint, item.lease)
                    .await
                else {
                    panic!("{k} is free");
                };
                tokens.push(claim.token);
            }
            assert_eq!(tokens[0], tokens[1]);
            tokens[0]
        }

        async fn begins(&self, items: &[BeginItem]) -> Vec<Result<Begin, StoreError>> {
            let batched = once_per_key(&self.batched, items).await;
            let mut reference = Vec::new();
            for item in items {
                reference.extend(self.reference.begin_items(std::slice::from_ref(item)).await);
            }
            assert_eq!(answers(&batched), answers(&reference));
            batched
        }

        async fn completes(&self, items: &[CompleteItem]) -> Vec<Result<Fenced, StoreError>> {
            let batched = once_per_key(&self.batched, items).await;
            let mut reference = Vec::new();
            for item in items {
                reference.extend(
                    self.reference
                        .complete_items(std::slice::from_ref(item))
                        .await,
                );
            }
            assert_eq!(answers(&batched), answers(&reference));
            batched
        }
    }

    fn answers<O: fmt::Debug>(a: &[Result<O, StoreError>]) -> Vec<String> {
        a.iter().map(|a| format!("{a:?}")).collect()
    }

    /// A batch of one hot key's copies among other keys goes to the store
    /// in one call, with each key once; the copies after the acquisition
    /// are `InProgress` for the holder's lease, or `Mismatch` for other
    /// content, exactly as the single form answers them one after another.
    #[tokio::test]
    async fn a_hot_key_in_a_begin_batch_takes_one_round() {
        let pair = Pair::new();
        let mut items = Vec::new();
        for n in 0..50 {
            items.push(begin("hot", Some("a"), 9_000));
            if n % 5 == 0 {
                items.push(begin(&format!("cold-{n}"), None, 1_000));
            }
        }
        items.push(begin("hot", Some("b"), 9_000));
        items.push(begin("hot", None, 9_000));
        let answers = pair.begins(&items).await;
        assert_eq!(pair.batched.calls(), vec![11], "one call, each key once");
        assert!(matches!(answers[0], Ok(Begin::Acquired(_))));
        assert_eq!(
            answers
                .iter()
                .filter(|a| matches!(a, Ok(Begin::Acquired(_))))
                .count(),
            11
        );
        let n = answers.len();
        assert_eq!(
            answers[2].as_ref().unwrap(),
            &Begin::InProgress {
                retry_after: Duration::from_secs(9)
            }
        );
        assert_eq!(answers[n - 2].as_ref().unwrap(), &Begin::Mismatch);
        assert!(matches!(answers[n - 1], Ok(Begin::InProgress { .. })));
    }

    /// Copies of a completed key with the same content replay its outcome
    /// without another round; a copy with other content waits for the
    /// next round (the record's fingerprint is not in the answer), and so
    /// does every copy after it.
    #[tokio::test]
    async fn copies_the_first_answer_does_not_settle_go_in_later_rounds() {
        let pair = Pair::new();
        let token = pair.claim("done", Some("a")).await;
        pair.completes(&[complete("done", token, "receipt")]).await;
        let before = pair.batched.calls().len();
        let answers = pair
            .begins(&[
                begin("done", Some("a"), 1_000),
                begin("done", Some("a"), 1_000),
                begin("other", None, 1_000),
                begin("done", Some("b"), 1_000),
                begin("done", Some("a"), 1_000),
            ])
            .await;
        assert_eq!(&pair.batched.calls()[before..], &[2, 1, 1]);
        assert!(matches!(answers[1], Ok(Begin::Completed { .. })));
        assert_eq!(answers[3].as_ref().unwrap(), &Begin::Mismatch);
        assert!(matches!(answers[4], Ok(Begin::Completed { .. })));
    }

    /// Copies of one `complete` in a batch go to the store once: the same
    /// token again is a retried complete (`Ok`), another token `Stale`.
    #[tokio::test]
    async fn a_hot_key_in_a_complete_batch_takes_one_round() {
        let pair = Pair::new();
        let token = pair.claim("hot", None).await;
        let cold = pair.claim("cold", None).await;
        let other = FencingToken::new(token.get() + 100);
        let mut items = vec![complete("hot", token, "first")];
        items.extend((0..20).map(|_| complete("hot", token, "again")));
        items.push(complete("cold", cold, "cold"));
        items.extend((0..5).map(|_| complete("hot", other, "other")));
        let answers = pair.completes(&items).await;
        assert_eq!(pair.batched.calls(), vec![2]);
        assert!(
            answers[..21]
                .iter()
                .all(|a| matches!(a, Ok(Fenced::Ok(()))))
        );
        assert!(answers[22..].iter().all(|a| matches!(a, Ok(Fenced::Stale))));
        let Some(crate::Record::Completed(done)) =
            pair.batched.memory.get(&key("hot")).await.unwrap()
        else {
            panic!("completed");
        };
        assert_eq!(
            done.outcome.as_deref(),
            Some(&b"first"[..]),
            "the first outcome stands"
        );
    }

    /// A stale `complete` settles its copies with the same token, but not
    /// one with another token: that one goes to the next round.
    #[tokio::test]
    async fn a_stale_complete_leaves_other_tokens_to_the_next_round() {
        let pair = Pair::new();
        let token = pair.claim("k", None).await;
        let wrong = FencingToken::new(token.get() + 1);
        let answers = pair
            .completes(&[
                complete("k", wrong, "x"),
                complete("k", wrong, "x"),
                complete("k", token, "y"),
                complete("k", wrong, "x"),
            ])
            .await;
        assert_eq!(pair.batched.calls(), vec![1, 1]);
        assert!(matches!(answers[2], Ok(Fenced::Ok(()))));
        assert!(matches!(answers[3], Ok(Fenced::Stale)));
    }

    /// A store that fails on a key fails its copies with the same error in
    /// the same round, instead of once per copy, one after another.
    #[tokio::test]
    async fn copies_of_a_failed_item_get_its_error_without_another_round() {
        let pair = Pair::new();
        pair.batched.down.store(true, Ordering::SeqCst);
        let items: Vec<_> = (0..10).map(|_| begin("k", None, 1_000)).collect();
        let answers = once_per_key(&pair.batched, &items).await;
        assert_eq!(pair.batched.calls(), vec![1]);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(StoreError::Unavailable(e)) if e.to_string() == "down"))
        );
    }

    /// Through `StoreBatches`: single `begin`s of one key that arrive
    /// while a call is in flight travel in one batch, which reaches the
    /// store as one call with the key once; one caller acquires, the
    /// others hear `InProgress`.
    #[tokio::test]
    async fn concurrent_begins_of_a_hot_key_reach_the_store_once() {
        let clock = ManualClock::new();
        let store = Arc::new(Sequential::new(&clock));
        let (open, gate) = oneshot::channel();
        *store.gate.lock() = Some(gate);
        let batches = Arc::new(StoreBatches::start(store.clone(), true, 256));
        let in_flight = tokio::spawn({
            let batches = batches.clone();
            async move { batches.begin(begin("first", None, 1_000)).await }
        });
        while store.calls().is_empty() {
            tokio::task::yield_now().await;
        }
        let mut items: Vec<_> = (0..40).map(|_| begin("hot", None, 5_000)).collect();
        items.push(begin("cold", None, 5_000));
        let answers = join_all(items.into_iter().map(|i| batches.begin(i))).await;
        assert_eq!(store.calls(), vec![1, 2], "the direct call, then one batch");
        assert!(matches!(answers[0], Ok(Begin::Acquired(_))));
        assert!(answers[1..40].iter().all(|a| matches!(
            a,
            Ok(Begin::InProgress { retry_after }) if *retry_after == Duration::from_secs(5)
        )));
        assert!(matches!(answers[40], Ok(Begin::Acquired(_))));
        open.send(()).unwrap();
        assert!(matches!(in_flight.await.unwrap(), Ok(Begin::Acquired(_))));
    }
}
