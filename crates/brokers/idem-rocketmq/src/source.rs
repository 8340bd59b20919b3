//! The RocketMQ source: a push consumer whose listener hands each message
//! to the runner and waits for its verdict.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::copy::{CopyValue, HeaderRules, copy_headers};
use idem_consumer::{
    Capabilities, DeadLetter, Delivery, Message, RetryReason, Source, SourceError,
};
use rocketmq_client_rust::{
    ClientConfig, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, DefaultMQPushConsumer,
    MQPushConsumer, MessageListenerConcurrently,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::STRING_HASH_SET;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message as RocketMessage;
use tokio::sync::{mpsc, oneshot};

use crate::client::{self, ClientHost, ConnectError};
use crate::{RocketMqConfig, RocketMqPublisher};

/// How long `fetch` waits for a first message before answering with none.
const FETCH_WAIT: Duration = Duration::from_secs(1);

/// The user property read as [`Message::content_type`].
const CONTENT_TYPE: &str = "content-type";

/// A RocketMQ topic read by a clustering push consumer, as the runner's
/// [`Source`]. Clones share the consumer.
///
/// The client pushes: its listener is called on a client thread with a
/// message and must answer `ConsumeSuccess` or `ReconsumeLater`. Here the
/// listener hands the message to [`fetch`](Source::fetch) through a
/// channel and waits for the runner's verdict, so the runner decides as it
/// does for every broker:
///
/// | runner verb | RocketMQ |
/// |---|---|
/// | `fetch` | messages the listener handed over (one per listener call), up to the runner's room |
/// | `ack` | the listener answers `ConsumeSuccess`; the client commits the offset (every 5 s, and at shutdown) |
/// | `retry` | the listener answers `ReconsumeLater`: the client sends the message back, the broker stores a copy in `%RETRY%GROUP` with its reconsume count raised, and delivers it after the next delay level |
/// | `dead_letter` | publish a copy with idem's headers to the dead-letter topic (default `%DLQ%GROUP`), waiting for the broker, then `ConsumeSuccess` |
/// | `requeue` | the listener is not answered until [`shutdown`](Self::shutdown), which stops the consumer first: the offset stays before the message, and the next consumer of the queue gets it without a reconsume counted |
///
/// **Attempts.** [`Message::attempt`] is the broker's reconsume count plus
/// one. The listener cannot pick a delay level (the client hands it the
/// context read-only), so every retry waits the broker's next level
/// (`messageDelayLevel` level 3 + reconsume count: 10 s, 30 s, 1 min, 2 min
/// … by default) whatever delay the runner asks for, and every retry at the
/// broker counts, an unreachable store too: give the runner's
/// [`max_attempts`](idem_consumer::Runner::max_attempts) room for them.
/// A busy retry (another consumer holds the key, as after a crash, until
/// its lease ends) does not go to the broker: the source says it would
/// count ([`Capabilities::busy_retry_uses_attempt`]), and the runner holds
/// the message, its listener waiting, until the key is free, for at most
/// [`MAX_HOLD`](Self::MAX_HOLD) (then it goes to the broker).
/// A consumer that dies holding a message does not raise the count: the
/// next consumer starts again from the committed offset.
///
/// **Dead letters.** The runner dead-letters at its `max_attempts` with the
/// headers `idem-key`, `idem-attempts` and `idem-last-error` beside the
/// message's own properties, its `KEYS` and `TAGS`; idem's values are
/// escaped to one line, so a handler's error text can carry neither a line
/// break nor the `\u{1}`/`\u{2}` separators of the property encoding
/// (which would add properties of its own). The broker moves a
/// message to `%DLQ%GROUP` itself after
/// [`max_reconsume_times`](RocketMqConfig::max_reconsume_times) redeliveries
/// (without idem's headers): keep that above the runner's limit.
#[derive(Clone)]
pub struct RocketMqSource {
    inner: Arc<Inner>,
}

struct Inner {
    topic: String,
    group: String,
    dead_letter: String,
    deliveries: tokio::sync::Mutex<Option<mpsc::Receiver<Handoff>>>,
    consumer: tokio::sync::Mutex<Option<DefaultMQPushConsumer>>,
    publisher: RocketMqPublisher,
    /// Verdicts held back by `requeue` until shutdown.
    held: Mutex<Vec<oneshot::Sender<Verdict>>>,
    host: Arc<ClientHost>,
    /// The name servers, for the lag's admin client.
    name_servers: String,
    /// The admin client that reads the group's lag, started on first use.
    monitor: tokio::sync::OnceCell<crate::RocketMqMonitor>,
}

/// A message from the listener, and where its verdict goes.
struct Handoff {
    message: MessageExt,
    verdict: oneshot::Sender<Verdict>,
}

/// What the listener answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Consumed,
    Later,
}

/// The consume listener: runs on the client's blocking threads.
struct Bridge {
    handoff: mpsc::Sender<Handoff>,
}

impl MessageListenerConcurrently for Bridge {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        // The batch size is 1; were it more, the batch succeeds only when
        // every message of it does.
        let mut verdicts = Vec::with_capacity(msgs.len());
        for m in msgs {
            let (tx, rx) = oneshot::channel();
            let handoff = Handoff {
                message: (*m).clone(),
                verdict: tx,
            };
            if self.handoff.blocking_send(handoff).is_err() {
                return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
            }
            verdicts.push(rx);
        }
        let mut consumed = true;
        for rx in verdicts {
            // A verdict never given (the runner dropped the delivery) is a
            // failure: the broker delivers the message again.
            consumed &= rx.blocking_recv() == Ok(Verdict::Consumed);
        }
        Ok(if consumed {
            ConsumeConcurrentlyStatus::ConsumeSuccess
        } else {
            ConsumeConcurrentlyStatus::ReconsumeLater
        })
    }
}

impl RocketMqSource {
    /// The longest the runner holds a message waiting to retry in place
    /// (a busy key): 10 min. The client's consume timeout is 15 min: a
    /// message its listener has waited on longer is sent back to the broker
    /// by the client itself (it looks every 15 min), a redelivery with its
    /// reconsume count raised while idem still holds the message. The
    /// third left over covers the time a message waits in the hand-off
    /// channel before the runner fetches it, and its last handler run. Any
    /// lease of minutes fits.
    pub const MAX_HOLD: Duration = Duration::from_secs(10 * 60);

    /// Starts a clustering push consumer of the topic in the group (which
    /// also consumes the group's retry topic `%RETRY%GROUP`), starting at
    /// the group's committed offsets, or at the first stored message for a
    /// group the broker has not seen; and a producer for dead letters.
    /// Warns when the [lease](RocketMqConfig::lease) is longer than the
    /// client's consume timeout.
    ///
    /// The topic must exist (a first publish creates it when the broker
    /// allows that); until it does, the consumer finds no queues and
    /// retries its rebalance every 20 s.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future mid-way stops whatever was started.
    pub async fn connect(config: RocketMqConfig) -> Result<Self, ConnectError> {
        config.validate()?;
        client::probe(&config.name_servers).await?;
        if let Some(lease) = config.lease
            && lease > CONSUME_TIMEOUT
        {
            tracing::warn!(
                ?lease,
                "the guard's lease is longer than the RocketMQ client's consume timeout (15 min): a handler running past it is redelivered while its claim is held"
            );
        }
        let host = ClientHost::new(config.concurrency)?;
        let publisher = Box::pin(RocketMqPublisher::start(
            Arc::clone(&host),
            &config.name_servers,
            &format!("{}-idem-dead-letters", config.group),
        ))
        .await?;
        let (handoff, deliveries) = mpsc::channel(config.concurrency);
        let mut client_config = ClientConfig::new();
        client_config.set_instance_name(client::instance_name("consumer").into());
        let threads = u32::try_from(config.concurrency).unwrap_or(u32::MAX);
        let mut consumer = DefaultMQPushConsumer::builder(host.runtime())
            .client_config(client_config)
            .name_server_addr(config.name_servers.clone())
            .consumer_group(config.group.clone())
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .consume_thread_min(threads)
            .consume_thread_max(threads)
            .consume_message_batch_max_size(1)
            .max_reconsume_times(i32::try_from(config.max_reconsume_times).unwrap_or(i32::MAX))
            .await_termination_millis_when_shutdown(1000)
            .build();
        let fail = |what: &'static str| {
            move |e: rocketmq_client_rust::ClientError| ConnectError::Client {
                what,
                reason: e.to_string(),
            }
        };
        Box::pin(consumer.subscribe(config.topic.clone(), "*"))
            .await
            .map_err(fail("consumer"))?;
        consumer.register_message_listener_concurrently(Bridge { handoff });
        Box::pin(consumer.start()).await.map_err(fail("consumer"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                topic: config.topic.clone(),
                group: config.group.clone(),
                dead_letter: config.dead_letter_topic(),
                deliveries: tokio::sync::Mutex::new(Some(deliveries)),
                consumer: tokio::sync::Mutex::new(Some(consumer)),
                publisher,
                held: Mutex::new(Vec::new()),
                host,
                name_servers: config.name_servers.clone(),
                monitor: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// Where dead letters are published.
    pub fn dead_letter_topic(&self) -> &str {
        &self.inner.dead_letter
    }

    /// Stops consuming without losing a message: the consumer leaves the
    /// group (its queues go to the other consumers) and commits its
    /// offsets, which stay before every message not yet acked — those the
    /// listener handed over but the runner never fetched, and those handed
    /// back with `requeue` — so the next consumer gets them, without a
    /// reconsume counted. Then the client's runtime stops. Call it after
    /// the runner has returned; fetching after it finds nothing.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future mid-way leaves the consumer stopped or not; the
    /// messages still unanswered are redelivered either way (dropping the
    /// source answers them `ReconsumeLater`).
    pub async fn shutdown(&self) {
        if let Some(mut consumer) = self.inner.consumer.lock().await.take() {
            Box::pin(consumer.shutdown()).await;
        }
        self.inner.publisher.shutdown().await;
        self.inner.host.shutdown().await;
        // Only now do the waiting listeners return: their answers reach no
        // one, so no copy is sent back.
        self.inner.deliveries.lock().await.take();
        self.inner.held.lock().map(|mut h| h.clear()).ok();
    }
}

/// The client's system properties (`KEYS`, `TAGS`, `DELAY`, `UNIQ_KEY`, …)
/// are what the broker acts on; the client also refuses to set them as user
/// properties. A copy keeps one as `idem-original-<name>`. idem's values
/// are escaped by `copy_headers`, so none carries the `\u{1}`/`\u{2}`
/// separators of the property encoding; the original's came from the
/// broker, decoded from that encoding, so cannot either.
const ROCKETMQ_PROPERTIES: HeaderRules = HeaderRules {
    is_control: |name| STRING_HASH_SET.contains(name),
};

/// The client's default consume timeout.
const CONSUME_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// What settles one RocketMQ delivery: the listener waiting for its answer.
pub struct Receipt {
    verdict: Option<oneshot::Sender<Verdict>>,
    message_id: String,
    queue_id: i32,
    queue_offset: i64,
    keys: Option<String>,
    tags: Option<String>,
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("message_id", &self.message_id)
            .field("queue_id", &self.queue_id)
            .field("queue_offset", &self.queue_offset)
            .finish_non_exhaustive()
    }
}

impl Receipt {
    /// The broker's message id (`UNIQ_KEY`, kept through retries).
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The queue and offset this copy was read from (of `%RETRY%GROUP`
    /// for a redelivery).
    pub fn position(&self) -> (i32, i64) {
        (self.queue_id, self.queue_offset)
    }

    fn answer(mut self, verdict: Verdict, what: &str) -> Result<(), SourceError> {
        let sent = self
            .verdict
            .take()
            .is_some_and(|tx| tx.send(verdict).is_ok());
        if sent {
            Ok(())
        } else {
            Err(SourceError::new(
                format!("{what} message {}", self.message_id),
                "the client no longer waits for it (it stopped, or its consume timeout passed); the broker delivers it again",
            ))
        }
    }
}

fn delivery(handoff: Handoff) -> Delivery<Receipt> {
    let m = handoff.message;
    let properties: Vec<(&str, &str)> = m
        .properties()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let decoded = message_of(
        &properties,
        m.body(),
        m.reconsume_times(),
        m.msg_id().as_str(),
    );
    Delivery {
        message: decoded.message,
        receipt: Receipt {
            verdict: Some(handoff.verdict),
            message_id: decoded.message_id,
            queue_id: m.queue_id(),
            queue_offset: m.queue_offset(),
            keys: decoded.keys,
            tags: decoded.tags,
        },
    }
}

/// What a delivered message decodes to: the runner's message, and what its
/// receipt keeps.
#[derive(Debug)]
pub struct Decoded {
    /// The runner's message: the user properties as headers, `KEYS` as its
    /// id, the reconsume count plus one as its attempt.
    pub message: Message,
    /// The broker's message id: `UNIQ_KEY`, or the stored message's id.
    pub message_id: String,
    /// `KEYS`, kept on a dead letter.
    pub keys: Option<String>,
    /// `TAGS`, kept on a dead letter.
    pub tags: Option<String>,
}

/// Decodes a delivered message from its properties (as the client read
/// them from the `name\u{1}value\u{2}` encoding), body, reconsume count and
/// stored message id.
pub fn message_of(
    properties: &[(&str, &str)],
    body: Option<Bytes>,
    reconsume_times: i32,
    msg_id: &str,
) -> Decoded {
    let property = |name: &str| {
        properties
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    };
    let mut headers: Vec<(String, Bytes)> = properties
        .iter()
        .filter(|(k, _)| !STRING_HASH_SET.contains(*k))
        .map(|(k, v)| ((*k).to_owned(), Bytes::copy_from_slice(v.as_bytes())))
        .collect();
    // The property map keeps no order; a stable one reads better.
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    let keys = property("KEYS").filter(|k| !k.is_empty());
    let message = Message {
        id: keys.clone(),
        content_type: property(CONTENT_TYPE),
        headers,
        body: body.unwrap_or_default(),
        attempt: u32::try_from(reconsume_times.max(0))
            .unwrap_or(0)
            .saturating_add(1),
        // Concurrent consumption gives no order; the runner sets the key.
        ..Message::default()
    };
    Decoded {
        message,
        message_id: property("UNIQ_KEY").unwrap_or_else(|| msg_id.to_owned()),
        keys,
        tags: property("TAGS"),
    }
}

/// The user properties of `message`'s dead letter, in order: its own
/// (those the broker acts on kept as `idem-original-<name>`), then idem's
/// from `why`, made safe.
pub fn dead_letter_properties(message: &Message, why: &DeadLetter) -> Vec<(String, String)> {
    let why = why.headers();
    let idem: Vec<(&str, &str)> = why.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let original = message.headers.iter().map(|(n, v)| (n, v));
    copy_headers(original, ROCKETMQ_PROPERTIES, &idem)
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                CopyValue::Original(v) => String::from_utf8_lossy(v).into_owned(),
                CopyValue::Idem(v) => v,
            };
            (name, value)
        })
        .collect()
}

impl Source for RocketMqSource {
    type Receipt = Receipt;

    fn name(&self) -> &str {
        &self.inner.topic
    }

    /// The group's backlog as the brokers count it (see
    /// [`RocketMqMonitor::backlog`](crate::RocketMqMonitor::backlog)), read
    /// by an admin client started on first use.
    async fn lag(&self) -> Result<Option<u64>, SourceError> {
        let i = &self.inner;
        let monitor = i
            .monitor
            .get_or_try_init(|| {
                let url = format!("rocketmq://{}", i.name_servers);
                Box::pin(async move { crate::RocketMqMonitor::connect(&url).await })
            })
            .await
            .map_err(|e| SourceError::new("starting the admin client that reads the lag", e))?;
        Box::pin(monitor.backlog(&i.group)).await.map(Some)
    }

    /// Dropping the future loses nothing: a message stays in the channel
    /// until a later fetch, its listener waiting.
    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<Receipt>>, SourceError> {
        let mut guard = self.inner.deliveries.lock().await;
        let Some(rx) = guard.as_mut() else {
            return Err(SourceError::new(
                "fetching messages",
                "the source was shut down",
            ));
        };
        let first = match tokio::time::timeout(FETCH_WAIT, rx.recv()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(None) => {
                return Err(SourceError::new(
                    "fetching messages",
                    "the RocketMQ consumer stopped",
                ));
            }
            Ok(Some(h)) => h,
        };
        let mut out = vec![delivery(first)];
        while out.len() < max.max(1) {
            match rx.try_recv() {
                Ok(h) => out.push(delivery(h)),
                Err(_) => break,
            }
        }
        Ok(out)
    }

    async fn ack(&self, delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        delivery.receipt.answer(Verdict::Consumed, "acking")
    }

    async fn retry(
        &self,
        delivery: Delivery<Receipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        // The broker's delay level decides when it comes back.
        tracing::debug!(
            message_id = %delivery.receipt.message_id,
            asked = ?delay,
            reason = reason.as_str(),
            "retrying at the broker's next delay level"
        );
        delivery.receipt.answer(Verdict::Later, "retrying")
    }

    async fn dead_letter(
        &self,
        delivery: Delivery<Receipt>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        let Delivery { message, receipt } = delivery;
        let topic = &self.inner.dead_letter;
        let fail = |e: String| {
            SourceError::new(
                format!("dead-lettering message {} to `{topic}`", receipt.message_id),
                e,
            )
        };
        let mut builder = RocketMessage::builder()
            .topic(topic.as_str())
            .body(message.body.clone());
        if let Some(keys) = &receipt.keys {
            builder = builder.key(keys.as_str());
        }
        if let Some(tags) = &receipt.tags {
            builder = builder.tags(tags.as_str());
        }
        for (name, value) in dead_letter_properties(&message, &why) {
            builder = builder
                .raw_property(name, value)
                .map_err(|e| fail(e.to_string()))?;
        }
        let copy = builder.build().map_err(|e| fail(e.to_string()))?;
        Box::pin(self.inner.publisher.send(copy))
            .await
            .map_err(fail)?;
        receipt.answer(Verdict::Consumed, "acking the dead-lettered")
    }

    /// Every `ReconsumeLater` raises the reconsume count, so busy retries
    /// wait in the runner, within the client's consume timeout.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .busy_retry_uses_attempt(true)
            .max_hold(Self::MAX_HOLD)
    }

    async fn requeue(&self, mut delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        if let Some(tx) = delivery.receipt.verdict.take()
            && let Ok(mut held) = self.inner.held.lock()
        {
            held.push(tx);
        }
        Ok(())
    }
}
