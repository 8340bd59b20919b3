//! A source in memory, for tests and examples.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{DeadLetter, Delivery, Message, RetryReason, Source, SourceError};

/// A queue in memory that behaves like a broker with delayed retries and a
/// dead-letter list: what the runner's own tests run against, and a way to
/// try a handler without a broker. Clones share the queue.
///
/// Retries count an attempt only for [`RetryReason::Failed`], as a broker
/// adapter that carries the count in a header does.
#[derive(Clone)]
pub struct MemorySource {
    name: Arc<str>,
    inner: Arc<Mutex<Queue>>,
    arrived: Arc<Notify>,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<Message>,
    delayed: Vec<(Instant, Message)>,
    in_flight: HashMap<u64, Message>,
    next_receipt: u64,
    acked: Vec<Message>,
    dead: Vec<(Message, DeadLetter)>,
    retries: Vec<(Duration, RetryReason)>,
}

impl MemorySource {
    /// An empty queue named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            inner: Arc::default(),
            arrived: Arc::default(),
        }
    }

    /// Adds a message at the back of the queue.
    pub fn push(&self, message: Message) {
        self.inner.lock().ready.push_back(message);
        self.arrived.notify_one();
    }

    /// Puts every fetched but unsettled message back, as a broker does when
    /// a consumer's connection drops.
    pub fn redeliver_unsettled(&self) {
        let mut q = self.inner.lock();
        let mut back: Vec<_> = q.in_flight.drain().collect();
        back.sort_by_key(|(receipt, _)| *receipt);
        q.ready.extend(back.into_iter().map(|(_, m)| m));
        drop(q);
        self.arrived.notify_one();
    }

    /// Messages acked so far, in order.
    pub fn acked(&self) -> Vec<Message> {
        self.inner.lock().acked.clone()
    }

    /// How many messages were acked so far.
    pub fn acked_count(&self) -> usize {
        self.inner.lock().acked.len()
    }

    /// Messages dead-lettered so far, with why.
    pub fn dead_letters(&self) -> Vec<(Message, DeadLetter)> {
        self.inner.lock().dead.clone()
    }

    /// Every retry asked for so far: its delay and reason.
    pub fn retries(&self) -> Vec<(Duration, RetryReason)> {
        self.inner.lock().retries.clone()
    }

    /// Messages not yet acked or dead-lettered: waiting, delayed or in
    /// flight.
    pub fn unsettled(&self) -> usize {
        let q = self.inner.lock();
        q.ready.len() + q.delayed.len() + q.in_flight.len()
    }

    fn take(&self, max: usize) -> (Vec<Delivery<u64>>, Option<Instant>) {
        let mut q = self.inner.lock();
        let now = Instant::now();
        let mut i = 0;
        while i < q.delayed.len() {
            if q.delayed[i].0 <= now {
                let (_, m) = q.delayed.swap_remove(i);
                q.ready.push_back(m);
            } else {
                i += 1;
            }
        }
        let mut out = Vec::new();
        while out.len() < max {
            let Some(message) = q.ready.pop_front() else {
                break;
            };
            q.next_receipt += 1;
            let receipt = q.next_receipt;
            q.in_flight.insert(receipt, message.clone());
            out.push(Delivery { message, receipt });
        }
        let next_due = q.delayed.iter().map(|(at, _)| *at).min();
        (out, next_due)
    }

    fn settle(&self, receipt: u64) -> Result<Message, SourceError> {
        self.inner.lock().in_flight.remove(&receipt).ok_or_else(|| {
            SourceError::new(
                "settling a message",
                format!("receipt {receipt} is not in flight (redelivered since?)"),
            )
        })
    }
}

impl Source for MemorySource {
    type Receipt = u64;

    fn name(&self) -> &str {
        &self.name
    }

    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<u64>>, SourceError> {
        let deadline = Instant::now() + Duration::from_millis(100);
        loop {
            let arrived = self.arrived.notified();
            let (out, next_due) = self.take(max);
            if !out.is_empty() {
                return Ok(out);
            }
            let wake = next_due.map_or(deadline, |due| due.min(deadline));
            tokio::select! {
                () = arrived => {}
                () = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= deadline {
                        return Ok(Vec::new());
                    }
                }
            }
        }
    }

    async fn ack(&self, delivery: Delivery<u64>) -> Result<(), SourceError> {
        let m = self.settle(delivery.receipt)?;
        self.inner.lock().acked.push(m);
        Ok(())
    }

    async fn retry(
        &self,
        delivery: Delivery<u64>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        let mut m = self.settle(delivery.receipt)?;
        if reason.counts_as_attempt() {
            m.attempt += 1;
        }
        let mut q = self.inner.lock();
        q.retries.push((delay, reason));
        q.delayed.push((Instant::now() + delay, m));
        drop(q);
        self.arrived.notify_one();
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: Delivery<u64>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        let m = self.settle(delivery.receipt)?;
        self.inner.lock().dead.push((m, why));
        Ok(())
    }

    async fn requeue(&self, delivery: Delivery<u64>) -> Result<(), SourceError> {
        let m = self.settle(delivery.receipt)?;
        self.inner.lock().ready.push_front(m);
        self.arrived.notify_one();
        Ok(())
    }
}
