//! The runner's verbs on a JetStream pull consumer.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::{self, AckKind, context};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::copy::{CopyValue, HeaderRules, copy_headers};
use idem_consumer::{
    Capabilities, DeadLetter, Delivery, Message, RetryReason, Source, SourceError,
};
use idem_core::BoxError;

use crate::connect::{self, ConnectError};
use crate::publisher::publish_acked;
use crate::{JetStreamConfig, JetStreamPublisher};

/// How long a fetch waits for a first message before answering with none.
const FETCH_WAIT: Duration = Duration::from_secs(1);

/// How long a pull request may go without a word from the server. A
/// request sent as the server goes down is lost with it, and the client
/// waits for no answer that will come (a request that does not wait has no
/// timer of its own): past this, the pull ends with what it has.
const PULL_SILENCE: Duration = Duration::from_secs(6);

/// A JetStream stream read through a durable pull consumer, as the runner's
/// [`Source`]. Clones share the connection.
///
/// | runner verb | JetStream |
/// |---|---|
/// | `fetch` | a pull request for what the server has now (up to the runner's room), else a wait for one message |
/// | `ack` | `+ACK`, waiting for the server's confirmation (AckAck) |
/// | `retry` | `-NAK` with the delay: the server redelivers then |
/// | `requeue` | `-NAK` without delay |
/// | `dead_letter` | publish to the dead-letter subject (waiting for the stream's ack), then `+TERM` |
/// | `keep_alive` | `+WPI` (in progress) every AckWait / 3 |
///
/// **Attempts.** [`Message::attempt`] is the server's delivery count for the
/// message. NATS cannot carry a count of its own on a nak, so every
/// delivery counts (a hand-back at shutdown may too, unless the server
/// rolls back the delivery of the last message it sent). A busy retry
/// (another consumer holds the key) and a retry while the store is
/// unreachable therefore do not go to the server: the source says so
/// ([`Capabilities::busy_retry_uses_attempt`]), and the runner holds the
/// message, kept alive with `+WPI`, until the key is free or the store
/// answers, instead of naking it; only handler failures use up attempts. A delivery that died with its consumer counts, so a message
/// that kills the process is dead-lettered eventually.
///
/// **Dead letters** keep the body and headers, add `idem-key`,
/// `idem-attempts`, `idem-last-error` (escaped to one line),
/// `idem-dead-lettered-at` and `idem-subject` (the original subject), and carry
/// `Nats-Msg-Id` `<stream>:<sequence>` (the producer's id moves to
/// `idem-message-id`), so the dead-letter stream drops a dead letter
/// published twice but never two messages that shared a producer id. The
/// original's other `Nats-*` headers, which the server acts on
/// (`Nats-Expected-Last-Sequence`, `Nats-Rollup`, `Nats-TTL`, …), are kept
/// as `idem-original-<name>`: the dead-letter stream must not refuse or
/// roll up a dead letter because of what its original asked of its own
/// stream. They are settled with `+TERM` after the copy is stored: it
/// stops redelivery as an ack does and, unlike an ack, tells the server's
/// advisories (`$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED`) the message
/// was given up on, which monitoring can count.
#[derive(Clone)]
pub struct JetStreamSource {
    inner: Arc<Inner>,
}

struct Inner {
    stream: String,
    context: context::Context,
    consumer: PullConsumer,
    dead_letter: String,
    ack_wait: Duration,
}

impl JetStreamSource {
    /// Connects, and declares idempotently what it needs: the stream
    /// (created with the URL's subject when absent, else checked to capture
    /// it), the durable pull consumer (explicit acks, unlimited MaxDeliver,
    /// `max_ack_pending` at least the concurrency, filtered on the subject),
    /// and a stream storing the dead-letter subject (see
    /// [`JetStreamConfig::dead_letter`]). Warns when the consumer's AckWait
    /// is shorter than the [lease](JetStreamConfig::lease).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future mid-way leaves whatever was declared so far;
    /// connecting again finds and uses it.
    pub async fn connect(config: JetStreamConfig) -> Result<Self, ConnectError> {
        config.validate().map_err(|e| ConnectError::Incompatible {
            what: "the configuration".into(),
            reason: e.to_string(),
        })?;
        let context = connect::jetstream(&config.server).await?;
        let declared = connect::declare(&context, &config).await?;
        if let Some(lease) = config.lease
            && declared.ack_wait < lease
        {
            tracing::warn!(
                consumer = %config.consumer,
                ack_wait = ?declared.ack_wait,
                ?lease,
                "the consumer's AckWait is shorter than the guard's lease: a message whose consumer died comes back while its claim is still held and waits in the runner until the lease ends; set ack_wait (URL `ack_wait=`) to at least the lease"
            );
        }
        Ok(Self {
            inner: Arc::new(Inner {
                stream: config.stream.clone(),
                context,
                consumer: declared.consumer,
                dead_letter: config.dead_letter_subject(),
                ack_wait: declared.ack_wait,
            }),
        })
    }

    /// A publisher on this source's connection.
    pub fn publisher(&self) -> JetStreamPublisher {
        JetStreamPublisher::from_context(self.inner.context.clone())
    }

    /// The consumer's AckWait, as the server has it.
    pub fn ack_wait(&self) -> Duration {
        self.inner.ack_wait
    }

    /// Where dead letters are published.
    pub fn dead_letter_subject(&self) -> &str {
        &self.inner.dead_letter
    }

    /// The consumer's state as the server reports it (pending and
    /// unacknowledged counts).
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it loses nothing.
    pub async fn consumer_info(&self) -> Result<jetstream::consumer::Info, SourceError> {
        self.inner
            .consumer
            .get_info()
            .await
            .map_err(|e| SourceError::new("reading the consumer's info", e))
    }

    /// Asks the server for what it has now, up to `max`; when it has
    /// nothing, waits up to [`FETCH_WAIT`] for one message. Every message
    /// pulled is handed to the runner: none waits in a client buffer with
    /// its AckWait running.
    async fn pull(&self, max: usize) -> Result<Vec<Delivery<Receipt>>, SourceError> {
        let now = self.inner.consumer.fetch().max_messages(max).messages();
        let ready = take(now.await).await?;
        if !ready.is_empty() {
            return Ok(ready);
        }
        let first = self
            .inner
            .consumer
            .batch()
            .max_messages(1)
            .expires(FETCH_WAIT)
            .messages();
        take(first.await).await
    }
}

/// Every message of one pull request, until the server ends it.
async fn take(
    batch: Result<pull::Batch, pull::BatchError>,
) -> Result<Vec<Delivery<Receipt>>, SourceError> {
    let mut batch = batch.map_err(|e| SourceError::new("pulling messages", e))?;
    let mut out = Vec::new();
    loop {
        let Ok(next) = tokio::time::timeout(PULL_SILENCE, batch.next()).await else {
            if out.is_empty() {
                return Err(SourceError::new(
                    "pulling messages",
                    format!(
                        "the server did not answer a pull request within {} s \
                         (restarted or unreachable?)",
                        PULL_SILENCE.as_secs()
                    ),
                ));
            }
            break;
        };
        let Some(m) = next else { break };
        match m {
            Ok(m) => out.push(delivery(m)?),
            // What came before the error is returned; the rest of the
            // request comes back after AckWait.
            Err(e) if !out.is_empty() => {
                tracing::debug!(error = %e, "pulling messages");
                break;
            }
            Err(e) => return Err(SourceError::new("pulling messages", e)),
        }
    }
    Ok(out)
}

/// What settles one JetStream delivery.
pub struct Receipt {
    acker: Acker,
    stream_sequence: u64,
    subject: String,
    headers: Option<HeaderMap>,
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("stream_sequence", &self.stream_sequence)
            .finish_non_exhaustive()
    }
}

impl Receipt {
    /// The message's sequence number in the stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }
}

fn delivery(m: jetstream::Message) -> Result<Delivery<Receipt>, SourceError> {
    let info = m
        .info()
        .map_err(|e| SourceError::new("reading a message's delivery info", e))?;
    let attempt = u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX);
    let stream_sequence = info.stream_sequence;
    let (m, acker) = m.split();
    let message = message_of(m.headers.as_ref(), m.payload, attempt);
    Ok(Delivery {
        message,
        receipt: Receipt {
            acker,
            stream_sequence,
            subject: m.subject.to_string(),
            headers: m.headers,
        },
    })
}

/// The runner's message for a stream message with `headers` and `payload`,
/// delivered for the `attempt`th time.
pub fn message_of(headers: Option<&HeaderMap>, payload: Bytes, attempt: u32) -> Message {
    let mut all: Vec<(String, Bytes)> = headers
        .iter()
        .flat_map(|h| h.iter())
        .flat_map(|(name, values)| {
            values.iter().map(move |v| {
                (
                    name.to_string(),
                    Bytes::copy_from_slice(v.as_str().as_bytes()),
                )
            })
        })
        .collect();
    // The header map does not keep order; a stable one reads better.
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let get = |name: &str| {
        headers
            .and_then(|h| h.get_last(name))
            .map(|v| v.as_str().to_owned())
    };
    Message {
        // A replayed dead letter carries its producer's id here (see
        // `JetStreamDeadLetters`), and a replay id as `Nats-Msg-Id`.
        id: get("idem-message-id").or_else(|| get("Nats-Msg-Id")),
        content_type: get("Content-Type"),
        headers: all,
        body: payload,
        attempt,
        // A stream gives one order, not one per lane; the runner sets the
        // key.
        ..Message::default()
    }
}

/// A header whose name starts with `Nats-` is one the server acts on when
/// it stores a message (`Nats-Expected-Last-Sequence`, `Nats-Rollup`,
/// `Nats-TTL`, …): on a dead letter it would be checked against the
/// dead-letter stream and could refuse every publish.
const NATS_HEADERS: HeaderRules = HeaderRules {
    is_control: |name| name.len() >= 5 && name.as_bytes()[..5].eq_ignore_ascii_case(b"nats-"),
};

/// The headers of the dead letter of stream message `stream_sequence`
/// carrying `headers`: its own
/// (with NATS control headers kept as `idem-original-<name>`), idem's, and
/// the subject it was published to (`idem-subject`, where a replay sends
/// it back), and a `Nats-Msg-Id` naming the stream message.
///
/// The dead letter's id names this stream message, so a dead letter
/// published again (its ack was lost) is dropped by the dead-letter
/// stream's duplicate window, while another message that reused the
/// producer's id (a replay of a dead letter, say) is not. The producer's id
/// moves to `idem-message-id`.
///
/// Built with the fallible constructors: `HeaderMap::insert` panics on a
/// value with CR or LF, and a panic here would leave the message to come
/// back forever. idem's values are escaped by `copy_headers`; the
/// original's came from the server and parse again.
pub fn dead_letter_headers(
    stream: &str,
    stream_sequence: u64,
    subject: &str,
    headers: Option<&HeaderMap>,
    why: &DeadLetter,
) -> Result<HeaderMap, BoxError> {
    let original = headers
        .iter()
        .flat_map(|h| h.iter())
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (AsRef::<str>::as_ref(name), v.as_str()))
        });
    let producer_id = headers
        .and_then(|h| h.get_last("Nats-Msg-Id"))
        .map(|v| v.as_str());
    let dead_letter_id = format!("{stream}:{stream_sequence}");
    let why = why.headers();
    let mut idem: Vec<(&str, &str)> = why.iter().map(|(n, v)| (*n, v.as_str())).collect();
    if let Some(id) = producer_id {
        idem.push(("idem-message-id", id));
    }
    idem.push(("idem-subject", subject));
    idem.push(("Nats-Msg-Id", &dead_letter_id));
    let mut headers = HeaderMap::new();
    for (name, value) in copy_headers(original, NATS_HEADERS, &idem) {
        let value = match value {
            CopyValue::Original(v) => v.to_owned(),
            CopyValue::Idem(v) => v,
        };
        headers.append(HeaderName::from_str(&name)?, HeaderValue::from_str(&value)?);
    }
    Ok(headers)
}

async fn settle(receipt: &Receipt, kind: AckKind, what: &str) -> Result<(), SourceError> {
    receipt.acker.double_ack_with(kind).await.map_err(|e| {
        SourceError::new(
            format!("{what} stream message {}", receipt.stream_sequence),
            e,
        )
    })
}

impl Source for JetStreamSource {
    type Receipt = Receipt;

    fn name(&self) -> &str {
        &self.inner.stream
    }

    /// The durable consumer's pending messages (`num_pending`: stored,
    /// not yet delivered to it).
    async fn lag(&self) -> Result<Option<u64>, SourceError> {
        let info = self
            .inner
            .consumer
            .clone()
            .info()
            .await
            .map_err(|e| SourceError::new("reading the consumer's pending count", e))?
            .clone();
        Ok(Some(info.num_pending))
    }

    /// Dropping the future mid-pull leaves the messages of that request
    /// unacknowledged: the server redelivers them after AckWait.
    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<Receipt>>, SourceError> {
        self.pull(max).await
    }

    async fn ack(&self, delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        settle(&delivery.receipt, AckKind::Ack, "acking").await
    }

    async fn retry(
        &self,
        delivery: Delivery<Receipt>,
        delay: Duration,
        _reason: RetryReason,
    ) -> Result<(), SourceError> {
        let delay = (!delay.is_zero()).then_some(delay);
        settle(&delivery.receipt, AckKind::Nak(delay), "retrying").await
    }

    async fn dead_letter(
        &self,
        delivery: Delivery<Receipt>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        let receipt = &delivery.receipt;
        let headers = dead_letter_headers(
            &self.inner.stream,
            receipt.stream_sequence,
            &receipt.subject,
            receipt.headers.as_ref(),
            &why,
        )
        .map_err(|e| {
            SourceError::new(
                format!(
                    "dead-lettering stream message {}: building its headers",
                    receipt.stream_sequence
                ),
                e,
            )
        })?;
        publish_acked(
            &self.inner.context,
            self.inner.dead_letter.clone(),
            headers,
            delivery.message.body.clone(),
        )
        .await
        .map_err(|e| {
            SourceError::new(
                format!(
                    "dead-lettering stream message {} to `{}`",
                    receipt.stream_sequence, self.inner.dead_letter
                ),
                e,
            )
        })?;
        settle(receipt, AckKind::Term, "terminating").await
    }

    async fn requeue(&self, delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        settle(&delivery.receipt, AckKind::Nak(None), "handing back").await
    }

    /// Every nak is a delivery the server counts, so busy retries wait in
    /// the runner; progress acks hold a message as long as they are sent.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().busy_retry_uses_attempt(true)
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Some(self.inner.ack_wait / 3)
    }

    async fn keep_alive(&self, receipt: &Receipt) -> Result<(), SourceError> {
        receipt
            .acker
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| {
                SourceError::new(
                    format!(
                        "marking stream message {} in progress",
                        receipt.stream_sequence
                    ),
                    e,
                )
            })
    }
}
