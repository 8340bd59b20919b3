//! A source whose broker is chosen at run time: [`BoxSource`].

use std::any::Any;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;

use crate::{Capabilities, DeadLetter, Delivery, RetryReason, Source, SourceError};

/// A [`BoxSource`]'s receipt: the boxed receipt of the source inside.
pub type AnyReceipt = Box<dyn Any + Send + Sync>;

/// Any [`Source`] behind one type, so that a program reading from a broker
/// it picks at run time (`idem consume --from`) compiles the runner once
/// rather than once per broker. Each call costs a boxed future, and each
/// delivery a boxed receipt: nothing next to a broker's round trip.
///
/// # Cancel safety
///
/// As the source inside: each verb forwards to it.
pub struct BoxSource(Box<dyn Erased>);

impl BoxSource {
    /// `source`, boxed.
    pub fn new<S: Source>(source: S) -> Self {
        Self(Box::new(source))
    }
}

impl std::fmt::Debug for BoxSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BoxSource").field(&self.0.name()).finish()
    }
}

/// [`Source`] in a form that can live behind `dyn`.
trait Erased: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Delivery<AnyReceipt>>, SourceError>>;
    fn ack(&self, delivery: Delivery<AnyReceipt>) -> BoxFuture<'_, Result<(), SourceError>>;
    fn retry(
        &self,
        delivery: Delivery<AnyReceipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> BoxFuture<'_, Result<(), SourceError>>;
    fn dead_letter(
        &self,
        delivery: Delivery<AnyReceipt>,
        why: DeadLetter,
    ) -> BoxFuture<'_, Result<(), SourceError>>;
    fn requeue(&self, delivery: Delivery<AnyReceipt>) -> BoxFuture<'_, Result<(), SourceError>>;
    fn keep_alive_every(&self) -> Option<Duration>;
    fn keep_alive<'a>(&'a self, receipt: &'a AnyReceipt) -> BoxFuture<'a, Result<(), SourceError>>;
    fn capabilities(&self) -> Capabilities;
    fn lag(&self) -> BoxFuture<'_, Result<Option<u64>, SourceError>>;
    fn pause_lane(&self, lane: &Bytes);
    fn resume_lane(&self, lane: &Bytes);
}

/// The error for a receipt another source made: a caller's mistake, never
/// a panic.
fn foreign(name: &str) -> SourceError {
    SourceError::new(
        format!("settling a delivery on `{name}`"),
        "the delivery's receipt was made by another source",
    )
}

/// `delivery` with the receipt `S` made, or `None` for another source's.
fn unboxed<S: Source>(delivery: Delivery<AnyReceipt>) -> Option<Delivery<S::Receipt>> {
    let Delivery { message, receipt } = delivery;
    let receipt = receipt.downcast::<S::Receipt>().ok()?;
    Some(Delivery {
        message,
        receipt: *receipt,
    })
}

impl<S: Source> Erased for S {
    fn name(&self) -> &str {
        Source::name(self)
    }

    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Delivery<AnyReceipt>>, SourceError>> {
        Source::fetch(self, max)
            .map(|fetched| {
                fetched.map(|all| {
                    all.into_iter()
                        .map(|d| Delivery {
                            message: d.message,
                            receipt: Box::new(d.receipt) as AnyReceipt,
                        })
                        .collect()
                })
            })
            .boxed()
    }

    fn ack(&self, delivery: Delivery<AnyReceipt>) -> BoxFuture<'_, Result<(), SourceError>> {
        match unboxed::<S>(delivery) {
            Some(d) => Source::ack(self, d).boxed(),
            None => std::future::ready(Err(foreign(Source::name(self)))).boxed(),
        }
    }

    fn retry(
        &self,
        delivery: Delivery<AnyReceipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> BoxFuture<'_, Result<(), SourceError>> {
        match unboxed::<S>(delivery) {
            Some(d) => Source::retry(self, d, delay, reason).boxed(),
            None => std::future::ready(Err(foreign(Source::name(self)))).boxed(),
        }
    }

    fn dead_letter(
        &self,
        delivery: Delivery<AnyReceipt>,
        why: DeadLetter,
    ) -> BoxFuture<'_, Result<(), SourceError>> {
        match unboxed::<S>(delivery) {
            Some(d) => Source::dead_letter(self, d, why).boxed(),
            None => std::future::ready(Err(foreign(Source::name(self)))).boxed(),
        }
    }

    fn requeue(&self, delivery: Delivery<AnyReceipt>) -> BoxFuture<'_, Result<(), SourceError>> {
        match unboxed::<S>(delivery) {
            Some(d) => Source::requeue(self, d).boxed(),
            None => std::future::ready(Err(foreign(Source::name(self)))).boxed(),
        }
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Source::keep_alive_every(self)
    }

    fn keep_alive<'a>(&'a self, receipt: &'a AnyReceipt) -> BoxFuture<'a, Result<(), SourceError>> {
        match receipt.downcast_ref::<S::Receipt>() {
            Some(r) => Source::keep_alive(self, r).boxed(),
            None => std::future::ready(Err(foreign(Source::name(self)))).boxed(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Source::capabilities(self)
    }

    fn lag(&self) -> BoxFuture<'_, Result<Option<u64>, SourceError>> {
        Source::lag(self).boxed()
    }

    fn pause_lane(&self, lane: &Bytes) {
        Source::pause_lane(self, lane);
    }

    fn resume_lane(&self, lane: &Bytes) {
        Source::resume_lane(self, lane);
    }
}

impl Source for BoxSource {
    type Receipt = AnyReceipt;

    fn name(&self) -> &str {
        self.0.name()
    }

    fn fetch(
        &self,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivery<AnyReceipt>>, SourceError>> + Send {
        self.0.fetch(max)
    }

    fn ack(
        &self,
        delivery: Delivery<AnyReceipt>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        self.0.ack(delivery)
    }

    fn retry(
        &self,
        delivery: Delivery<AnyReceipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        self.0.retry(delivery, delay, reason)
    }

    fn dead_letter(
        &self,
        delivery: Delivery<AnyReceipt>,
        why: DeadLetter,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        self.0.dead_letter(delivery, why)
    }

    fn requeue(
        &self,
        delivery: Delivery<AnyReceipt>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        self.0.requeue(delivery)
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        self.0.keep_alive_every()
    }

    // Its own future over both borrows: one boxed future cannot outlive
    // two lifetimes at once.
    async fn keep_alive(&self, receipt: &AnyReceipt) -> Result<(), SourceError> {
        self.0.keep_alive(receipt).await
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn lag(&self) -> impl Future<Output = Result<Option<u64>, SourceError>> + Send {
        self.0.lag()
    }

    fn pause_lane(&self, lane: &Bytes) {
        self.0.pause_lane(lane);
    }

    fn resume_lane(&self, lane: &Bytes) {
        self.0.resume_lane(lane);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemorySource, Message};

    /// A boxed source hands out and settles its own deliveries, and refuses
    /// a receipt another source made, without a panic.
    #[tokio::test]
    async fn settles_its_own_deliveries_and_refuses_others() {
        let inner = MemorySource::new("boxed");
        inner.push(Message::new("a"));
        inner.push(Message::new("b"));
        let boxed = BoxSource::new(inner.clone());
        assert_eq!(Source::name(&boxed), "boxed");
        let mut got = Source::fetch(&boxed, 10).await.unwrap();
        assert_eq!(got.len(), 2);
        let b = got.pop().unwrap();
        let a = got.pop().unwrap();
        Source::ack(&boxed, a).await.unwrap();
        let stranger = Delivery {
            message: b.message.clone(),
            receipt: Box::new("not a receipt") as AnyReceipt,
        };
        let e = Source::ack(&boxed, stranger).await.unwrap_err();
        assert!(e.to_string().contains("another source"), "{e}");
        Source::ack(&boxed, b).await.unwrap();
        assert_eq!(inner.acked().len(), 2);
    }
}
