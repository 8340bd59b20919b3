//! The dead-letter queue seen from outside the runner (`idem dlq`).
//!
//! A queue can only be read by taking messages off it, so both verbs read
//! with `basic.get` and manual acks on a channel of their own, and hold
//! what they read unacked: `peek` then closes the channel, and RabbitMQ
//! puts every message back where it was; `replay` publishes each chosen
//! message to the work queue (confirmed), acks it, and closes the channel,
//! which puts back the rest. Either reads at most the messages the queue
//! held when it began, so messages dead-lettered meanwhile wait for the
//! next run.
//!
//! A dead letter's id is a digest of what it holds (its headers, among them
//! its key and when it was parked, and its body): it names the same letter
//! wherever it stands in the queue, however many were replayed before it,
//! so an id copied from an earlier `ls` never selects another letter. Each
//! message a verb reads and puts back counts one delivery on a quorum
//! queue (`x-delivery-count`), so `find` reads no further than its letter;
//! idem declares its dead-letter queues with a delivery limit no queue
//! reaches, since RabbitMQ 4 would otherwise drop a letter after 20.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_consumer::SourceError;
use idem_consumer::dlq::{
    Before, Choose, DeadLetterQueue, Parked, REPLAYED_FROM_HEADER, Settle, Settled,
};
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};

use crate::link::Link;
use crate::properties::headers_of;
use crate::{AmqpConfig, ConnectError};

/// A RabbitMQ source's dead-letter queue.
pub struct AmqpDeadLetters {
    link: Link,
    queue: String,
    dead_letter: String,
}

/// One message read off the queue, held unacked.
struct Held {
    parked: Parked,
    properties: BasicProperties,
    tag: u64,
}

impl AmqpDeadLetters {
    /// Connects to the dead-letter queue of the source `config` describes
    /// (`<queue>.dead-letter` unless it names another).
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves nothing behind.
    pub async fn connect(config: AmqpConfig) -> Result<Self, ConnectError> {
        let link = Link::open(&config, "dead-letters").await?;
        Ok(Self {
            queue: config.queue().to_owned(),
            dead_letter: config.dead_letter_queue(),
            link,
        })
    }

    /// A channel to read on, and how many messages the queue holds.
    async fn reader(&self) -> Result<(Channel, u32), SourceError> {
        let fail = |what: &str, e: lapin::Error| {
            SourceError::new(format!("{what} `{}`", self.dead_letter), e)
        };
        let channel = self
            .link
            .connection
            .create_channel()
            .await
            .map_err(|e| fail("opening a channel to read", e))?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let q = channel
            .queue_declare(
                self.dead_letter.as_str().into(),
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(|e| fail("finding queue", e))?;
        Ok((channel, q.message_count()))
    }

    /// The next message, held unacked; `None` when the queue is empty.
    async fn next(&self, channel: &Channel) -> Result<Option<Held>, SourceError> {
        let got = channel
            .basic_get(
                self.dead_letter.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .map_err(|e| SourceError::new(format!("reading `{}`", self.dead_letter), e))?;
        Ok(got.map(|m| {
            let properties = m.delivery.properties.clone();
            let headers = headers_of(&properties);
            let parked_at = parked_at(&properties, &headers);
            Held {
                parked: Parked {
                    id: content_id(&headers, &m.delivery.data),
                    parked_at,
                    headers,
                    body: Bytes::from(m.delivery.data.clone()),
                },
                properties,
                tag: m.delivery.delivery_tag,
            }
        }))
    }
}

/// A dead letter's id: the first 12 hex digits of SHA-256 over its
/// headers (in the order the message has them) and its body. Headers the
/// broker sets (`x-delivery-count`, which each read and put-back of a
/// quorum queue raises, `x-death`, …) are left out: they change while the
/// letter does not.
fn content_id(headers: &[(String, Bytes)], body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let mut digest = Sha256::new();
    let own = headers.iter().filter(|(name, _)| {
        !name
            .get(..2)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case("x-"))
    });
    for (name, value) in own {
        for part in [name.as_bytes(), value] {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
    }
    digest.update(body);
    digest.finalize()[..6]
        .iter()
        .fold(String::with_capacity(12), |mut id, b| {
            let _ = write!(id, "{b:02x}");
            id
        })
}

/// When a dead letter was parked: its `idem-dead-lettered-at` header, else
/// its AMQP timestamp (when it was first published).
fn parked_at(properties: &BasicProperties, headers: &[(String, Bytes)]) -> Option<SystemTime> {
    let from_header = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(idem_consumer::dlq::PARKED_AT_HEADER))
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
    from_header.or_else(|| {
        properties
            .timestamp()
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
    })
}

/// The properties of a replayed copy: the original's, its headers less
/// `idem-attempts`, `idem-last-error`, `idem-dead-lettered-at` and an
/// earlier `idem-replayed-from`
/// (values keep their AMQP types), plus `idem-replayed-from`.
fn replayed(properties: &BasicProperties, from: &str) -> BasicProperties {
    let dropped = [
        idem_consumer::dlq::ATTEMPTS_HEADER,
        idem_consumer::dlq::LAST_ERROR_HEADER,
        idem_consumer::dlq::PARKED_AT_HEADER,
        REPLAYED_FROM_HEADER,
    ];
    let mut headers = FieldTable::default();
    if let Some(original) = properties.headers() {
        for (name, value) in original.inner() {
            if !dropped
                .iter()
                .any(|d| name.as_str().eq_ignore_ascii_case(d))
            {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    let from = idem_consumer::copy::header_text(from).into_owned();
    headers.insert(
        ShortString::from(REPLAYED_FROM_HEADER),
        AMQPValue::LongString(LongString::from(from)),
    );
    properties.clone().with_headers(headers)
}

impl DeadLetterQueue for AmqpDeadLetters {
    fn name(&self) -> &str {
        &self.dead_letter
    }

    fn work_name(&self) -> &str {
        &self.queue
    }

    fn find<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Parked>, SourceError>> {
        async move {
            let (channel, count) = self.reader().await?;
            let mut found = None;
            let mut read = 0;
            // Stops at the letter asked for: each message read and put back
            // counts a delivery on a quorum queue.
            while found.is_none() && read < count {
                read += 1;
                match self.next(&channel).await {
                    Ok(Some(held)) if held.parked.id == id => found = Some(held.parked),
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        let _ = channel.close(200, "OK".into()).await;
                        return Err(e);
                    }
                }
            }
            let _ = channel.close(200, "OK".into()).await;
            Ok(found)
        }
        .boxed()
    }

    fn peek(&self, limit: usize) -> BoxFuture<'_, Result<Vec<Parked>, SourceError>> {
        async move {
            let (channel, count) = self.reader().await?;
            let mut out = Vec::new();
            let mut position = 0;
            while out.len() < limit && position < count {
                position += 1;
                match self.next(&channel).await {
                    Ok(Some(held)) => out.push(held.parked),
                    Ok(None) => break,
                    Err(e) => {
                        let _ = channel.close(200, "OK".into()).await;
                        return Err(e);
                    }
                }
            }
            // Puts back everything read, in its place.
            let _ = channel.close(200, "OK".into()).await;
            Ok(out)
        }
        .boxed()
    }

    fn settle<'a>(
        &'a self,
        how: Settle,
        choose: Choose<'a>,
        limit: usize,
        before: Before<'a>,
        settled: Settled<'a>,
    ) -> BoxFuture<'a, Result<usize, SourceError>> {
        async move {
            let (channel, count) = self.reader().await?;
            let result = async {
                let mut done = 0;
                let mut position = 0;
                while done < limit && position < count {
                    position += 1;
                    let Some(held) = self.next(&channel).await? else {
                        break;
                    };
                    if !choose(&held.parked) {
                        continue;
                    }
                    if !before(&held.parked).await? {
                        continue;
                    }
                    let from = format!("{}/{}", self.dead_letter, held.parked.id);
                    if how == Settle::Replay {
                        let props = replayed(&held.properties, &from);
                        self.link
                            .publish(&self.queue, &held.parked.body, props)
                            .await
                            .map_err(|e| {
                                SourceError::new(format!("replaying {from} to `{}`", self.queue), e)
                            })?;
                    }
                    channel
                        .basic_ack(held.tag, BasicAckOptions::default())
                        .await
                        .map_err(|e| SourceError::new(format!("removing {from}"), e))?;
                    settled(&held.parked);
                    done += 1;
                }
                Ok(done)
            }
            .await;
            // Puts back what was read and not settled.
            let _ = channel.close(200, "OK".into()).await;
            result
        }
        .boxed()
    }
}
