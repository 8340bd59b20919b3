//! [`AmqpSource`]: a RabbitMQ queue as the runner's [`Source`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use idem_consumer::{Capabilities, DeadLetter, Delivery, RetryReason, Source, SourceError};
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Acker, BasicProperties, Channel, Consumer};
use tokio::sync::Mutex;

use crate::delay::RetryRoute;
use crate::link::{Link, within_answer_timeout};
use crate::properties::{ATTEMPTS, attempts_made, message_of, republished};
use crate::{AmqpConfig, ConnectError};

/// How long a fetch waits for a first message before answering with none.
const FETCH_WAIT: Duration = Duration::from_millis(500);

/// The pause before a message whose republish failed goes back to the
/// broker.
const HAND_BACK_PAUSE: Duration = Duration::from_secs(1);

/// A RabbitMQ queue as a [`Source`] for [`Runner`](idem_consumer::Runner):
/// manual acks, prefetch = concurrency, delayed retries through retry
/// queues, a dead-letter queue, and reconnection (see the crate docs).
/// Clones share the connection.
#[derive(Clone)]
pub struct AmqpSource {
    inner: Arc<Inner>,
}

struct Inner {
    config: AmqpConfig,
    /// The consuming side; `None` after the connection was lost, until the
    /// next fetch reconnects.
    live: Mutex<Option<Live>>,
}

struct Live {
    link: Arc<Link>,
    channel: Channel,
    consumer: Consumer,
}

impl Live {
    /// Connects and starts consuming, within the answer timeout.
    async fn open(config: &AmqpConfig) -> Result<Self, ConnectError> {
        within_answer_timeout(config, Self::open_now(config)).await
    }

    async fn open_now(config: &AmqpConfig) -> Result<Self, ConnectError> {
        let link = Link::open(config, "consumer").await?;
        link.declare_work_queue().await?;
        link.dead_letter_queue().await?;
        let failed = |what: &str, e: &lapin::Error| ConnectError::from_lapin(config, what, None, e);
        let channel = link
            .connection
            .create_channel()
            .await
            .map_err(|e| failed("opening the consuming channel", &e))?;
        let prefetch = u16::try_from(config.concurrency_limit()).unwrap_or(u16::MAX);
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| failed("setting the prefetch (basic.qos)", &e))?;
        let consumer = channel
            .basic_consume(
                config.queue().into(),
                "".into(),
                Default::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                ConnectError::from_lapin(
                    config,
                    &format!("consuming queue `{}`", config.queue()),
                    Some(config.queue()),
                    &e,
                )
            })?;
        Ok(Self {
            link: Arc::new(link),
            channel,
            consumer,
        })
    }

    fn is_open(&self) -> bool {
        self.link.is_open() && self.channel.status().connected()
    }
}

/// The broker's handle for one delivery: what settling it needs.
pub struct AmqpReceipt {
    acker: Acker,
    link: Arc<Link>,
    properties: BasicProperties,
    attempts_made: u32,
}

impl fmt::Debug for AmqpReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpReceipt")
            .field("acker", &self.acker)
            .field("attempts_made", &self.attempts_made)
            .finish_non_exhaustive()
    }
}

impl AmqpSource {
    /// Connects, declares the work queue (when missing) and the dead-letter
    /// queue, sets the prefetch and starts consuming. Retry queues are
    /// declared on first use.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-made connection; the broker
    /// redelivers anything it had sent on it.
    pub async fn connect(config: AmqpConfig) -> Result<Self, ConnectError> {
        let live = Live::open(&config).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                live: Mutex::new(Some(live)),
            }),
        })
    }

    /// The configuration the source runs with.
    pub fn config(&self) -> &AmqpConfig {
        &self.inner.config
    }

    /// Stops consuming, hands back the messages the broker sent ahead
    /// (prefetched but never fetched) without counting an attempt, and
    /// closes the connection. Call it after the runner returned; a later
    /// fetch connects again.
    ///
    /// # Cancel safety
    ///
    /// When dropped mid-way, the connection closes when the source is
    /// dropped, and the broker redelivers what was not handed back (counted
    /// as one attempt, see the crate docs).
    pub async fn close(&self) {
        let Some(mut live) = self.inner.live.lock().await.take() else {
            return;
        };
        let _ = live
            .channel
            .basic_cancel(live.consumer.tag(), BasicCancelOptions::default())
            .await;
        while let Some(Some(Ok(d))) = live.consumer.next().now_or_never() {
            let receipt = self.receipt(&live.link, &d);
            let body = Bytes::from(d.data);
            if d.redelivered {
                // Its count goes up all the same.
                count_redelivery(receipt, body).await;
            } else if let Err(e) = requeue(&receipt, &body).await {
                tracing::warn!(error = %e, "handing back a prefetched message failed; the broker redelivers it");
            }
        }
        let _ = live.link.connection.close(200, "closing".into()).await;
    }

    fn receipt(&self, link: &Arc<Link>, d: &lapin::message::Delivery) -> AmqpReceipt {
        AmqpReceipt {
            acker: d.acker.clone(),
            link: link.clone(),
            properties: d.properties.clone(),
            attempts_made: attempts_made(&d.properties),
        }
    }

    /// Turns a broker delivery into the runner's, or, for a redelivery,
    /// counts the attempt it stands for (see the crate docs).
    fn take(
        &self,
        link: &Arc<Link>,
        d: lapin::message::Delivery,
        out: &mut Vec<Delivery<AmqpReceipt>>,
    ) {
        let receipt = self.receipt(link, &d);
        let body = Bytes::from(d.data);
        if d.redelivered {
            // Spawned, so that a dropped fetch cannot leave the message
            // unsettled on an open channel.
            tokio::spawn(count_redelivery(receipt, body));
            return;
        }
        let message = message_of(&receipt.properties, body);
        out.push(Delivery { message, receipt });
    }
}

/// Republishes a redelivered message to the back of the work queue with one
/// more attempt counted, then acks it: the classic queue's `redelivered`
/// flag becomes a count that survives further crashes.
async fn count_redelivery(receipt: AmqpReceipt, body: Bytes) {
    let made = receipt.attempts_made.saturating_add(1);
    let made = made.to_string();
    let props = republished(&receipt.properties, &[(ATTEMPTS, &made)], None);
    let queue = receipt.link.config.queue().to_owned();
    let r = match receipt.link.publish(&queue, &body, props).await {
        Ok(()) => ack(&receipt).await,
        Err(e) => {
            hand_back_later(&receipt).await;
            Err(SourceError::new("counting a redelivery", e))
        }
    };
    if let Err(e) = r {
        tracing::warn!(error = %e, "counting a redelivered message's attempt failed; the broker redelivers it");
    }
}

async fn ack(receipt: &AmqpReceipt) -> Result<(), SourceError> {
    let acked = receipt
        .link
        .answer("an ack", receipt.acker.ack(BasicAckOptions::default()))
        .await
        .map_err(|e| SourceError::new("acking a message", e))?;
    match acked {
        Ok(true) => Ok(()),
        Ok(false) => Err(SourceError::new(
            "acking a message",
            "the channel that delivered it is closed; the broker redelivers it",
        )),
        Err(e) => Err(SourceError::new("acking a message", e)),
    }
}

/// Publishes a copy of the message to `queue` (confirmed), then acks the
/// original: a crash in between leaves a duplicate, never a loss.
async fn move_to(
    receipt: &AmqpReceipt,
    what: &str,
    queue: &str,
    body: &[u8],
    props: BasicProperties,
) -> Result<(), SourceError> {
    if !receipt.acker.usable() {
        // Its channel is gone and the broker redelivers it: a copy now would
        // be a needless duplicate.
        return Err(SourceError::new(
            what.to_owned(),
            "the channel that delivered the message is closed; the broker redelivers it",
        ));
    }
    if let Err(e) = receipt.link.publish(queue, body, props).await {
        hand_back_later(receipt).await;
        return Err(SourceError::new(
            format!("{what}: publishing to `{queue}`"),
            e,
        ));
    }
    ack(receipt).await
}

/// After a failed republish: gives the message back to the broker (which
/// counts it as redelivered) rather than leaving it unacked for as long as
/// the channel lives, after a pause so that a failure that persists does not
/// make a hot loop.
async fn hand_back_later(receipt: &AmqpReceipt) {
    if !receipt.acker.usable() {
        return;
    }
    tokio::time::sleep(HAND_BACK_PAUSE).await;
    let requeue = BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    };
    match receipt
        .link
        .answer("a nack", receipt.acker.nack(requeue))
        .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "handing back after a failed republish failed"),
        Err(e) => tracing::debug!(error = %e, "handing back after a failed republish failed"),
    }
}

async fn requeue(receipt: &AmqpReceipt, body: &[u8]) -> Result<(), SourceError> {
    if !receipt.acker.usable() {
        return Err(SourceError::new(
            "handing a message back",
            "the channel that delivered it is closed; the broker redelivers it",
        ));
    }
    let made = receipt.attempts_made.to_string();
    let props = republished(&receipt.properties, &[(ATTEMPTS, &made)], None);
    let queue = receipt.link.config.queue();
    match receipt.link.publish(queue, body, props).await {
        Ok(()) => ack(receipt).await,
        // The broker marks it redelivered, which counts an attempt; better
        // than holding it, and no pause: this is a shutdown.
        Err(e) => {
            tracing::debug!(error = %e, "republishing failed; handing back with nack");
            let requeue = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            match receipt
                .link
                .answer("a nack", receipt.acker.nack(requeue))
                .await
            {
                Ok(Ok(true)) => Ok(()),
                _ => Err(SourceError::new("handing a message back", e)),
            }
        }
    }
}

impl Source for AmqpSource {
    type Receipt = AmqpReceipt;

    fn name(&self) -> &str {
        self.inner.config.queue()
    }

    /// RabbitMQ closes a channel whose delivery stays unacked past its
    /// `consumer_timeout`: deliveries are held at most
    /// [`AmqpConfig::max_hold`] (25 minutes by default). Busy retries are
    /// counted by idem's header only.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().max_hold(self.inner.config.max_hold_limit())
    }

    /// The work queue's ready messages (`queue.declare` passive, on a
    /// channel of its own).
    async fn lag(&self) -> Result<Option<u64>, SourceError> {
        let link = match self.inner.live.lock().await.as_ref() {
            Some(live) => live.link.clone(),
            None => {
                return Err(SourceError::new(
                    "reading the work queue's depth",
                    "not connected now; the next fetch reconnects",
                ));
            }
        };
        let queue = self.inner.config.queue();
        let fail = |e: lapin::Error| SourceError::new(format!("reading the depth of `{queue}`"), e);
        let what = format!("reading the depth of `{queue}`");
        let unanswered = |reason: String| SourceError::new(what.clone(), reason);
        let channel = link
            .answer(&what, link.connection.create_channel())
            .await
            .map_err(unanswered)?
            .map_err(fail)?;
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = link
            .answer(
                &what,
                channel.queue_declare(queue.into(), passive, lapin::types::FieldTable::default()),
            )
            .await;
        let _ = link
            .answer("closing a channel", channel.close(200, "OK".into()))
            .await;
        Ok(Some(u64::from(
            declared.map_err(unanswered)?.map_err(fail)?.message_count(),
        )))
    }

    /// Waits up to half a second for a first message, then takes what else
    /// is buffered, up to `max`. After the connection or channel was lost,
    /// connects again first (the runner calls again with backoff while that
    /// fails).
    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<AmqpReceipt>>, SourceError> {
        let mut guard = self.inner.live.lock().await;
        if !guard.as_ref().is_some_and(Live::is_open) {
            *guard = None;
            let live = Live::open(&self.inner.config)
                .await
                .map_err(|e| SourceError::new("connecting to RabbitMQ", e))?;
            tracing::info!(queue = self.name(), "connected to RabbitMQ; consuming");
            *guard = Some(live);
        }
        let live = guard.as_mut().expect("connected above");
        // Everything after the first message arrives is synchronous, so a
        // dropped fetch loses nothing.
        let first = match tokio::time::timeout(FETCH_WAIT, live.consumer.next()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(Some(Ok(d))) => d,
            Ok(Some(Err(e))) => {
                *guard = None;
                return Err(SourceError::new("consuming from RabbitMQ", e));
            }
            Ok(None) => {
                *guard = None;
                return Err(SourceError::new(
                    format!("consuming queue `{}`", self.name()),
                    "the broker ended the consumer (connection lost, or the queue was deleted)",
                ));
            }
        };
        let link = live.link.clone();
        let mut out = Vec::with_capacity(max);
        self.take(&link, first, &mut out);
        while out.len() < max {
            match live.consumer.next().now_or_never() {
                Some(Some(Ok(d))) => self.take(&link, d, &mut out),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn ack(&self, delivery: Delivery<AmqpReceipt>) -> Result<(), SourceError> {
        ack(&delivery.receipt).await
    }

    /// Publishes a copy (body, properties, headers, `idem-attempts`) to the
    /// retry queue of `delay`'s bucket, confirmed, then acks the original.
    async fn retry(
        &self,
        delivery: Delivery<AmqpReceipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        let r = &delivery.receipt;
        let made = reason.attempts_used_after(r.attempts_made);
        let route = RetryRoute::for_delay(delay);
        let queue = r
            .link
            .retry_queue(&route)
            .await
            .map_err(|e| SourceError::new("retrying a message", e))?;
        // A bucket's queue expires the copy; the `long` queue's copies
        // carry their own TTL.
        let expiration = (!route.queue_ttl).then(|| route.ttl_ms.to_string());
        let made = made.to_string();
        let props = republished(&r.properties, &[(ATTEMPTS, &made)], expiration);
        move_to(
            r,
            "retrying a message",
            &queue,
            &delivery.message.body,
            props,
        )
        .await
    }

    /// Publishes a copy with the dead-letter headers to the dead-letter
    /// queue, confirmed, then acks the original.
    async fn dead_letter(
        &self,
        delivery: Delivery<AmqpReceipt>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        let set = why.headers();
        let set: Vec<(&str, &str)> = set.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let props = republished(&delivery.receipt.properties, &set, None);
        let queue = delivery
            .receipt
            .link
            .dead_letter_queue()
            .await
            .map_err(|e| SourceError::new("dead-lettering a message", e))?;
        move_to(
            &delivery.receipt,
            "dead-lettering a message",
            &queue,
            &delivery.message.body,
            props,
        )
        .await
    }

    /// Republishes the message to the work queue with its attempt count
    /// unchanged and acks it (a `nack` with requeue would mark it
    /// redelivered, which counts an attempt); falls back to that `nack`
    /// when republishing fails.
    async fn requeue(&self, delivery: Delivery<AmqpReceipt>) -> Result<(), SourceError> {
        requeue(&delivery.receipt, &delivery.message.body).await
    }
}
