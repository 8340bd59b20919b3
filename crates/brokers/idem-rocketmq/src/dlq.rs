//! The `%DLQ%` topic seen from outside the runner (`idem dlq`).
//!
//! A RocketMQ topic keeps its messages whatever any group consumed, so,
//! as with Kafka, each replay is recorded in a companion topic,
//! `idem-replayed-<GROUP>`, as the replayed message's
//! `broker:queue:offset` (an earlier idem wrote `queue:offset`, still read),
//! written after its copy is; listing and replaying leave out what it
//! names. Both topics are read whole with the client's pull consumer, from
//! each queue's minimum to its maximum offset, committing nothing.
//!
//! The classic pull consumer, which the client marks deprecated in favour
//! of the lite pull consumer, is the one that reads a queue between two
//! explicit offsets and nothing else: the lite consumer pulls ahead in the
//! background from a position it keeps, which a read to a known end does
//! not need.
//!
//! A replayed copy goes to the work topic with the dead letter's `KEYS`
//! (the message id the runner keys on), its user properties less
//! `idem-attempts` and `idem-last-error`, and `idem-replayed-from`.

#![allow(deprecated)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_consumer::SourceError;
use idem_consumer::dlq::{Parked, ReplayLog, Settle, Unreplayed};
use rocketmq_client_rust::{DefaultMQPullConsumer, PullStatus};
use rocketmq_model::common::message::STRING_HASH_SET;

use crate::client::{self, ClientHost, ConnectError};
use crate::{RocketMqConfig, RocketMqPublisher};

/// Messages one pull asks for.
const PULL: i32 = 32;

/// A RocketMQ source's dead-letter topic.
pub struct RocketMqDeadLetters {
    consumer: DefaultMQPullConsumer,
    publisher: RocketMqPublisher,
    topic: String,
    dead_letter: String,
    replayed: String,
    /// Whether the replay log was made sure of (a reader's may be missing).
    writes: bool,
    _host: Arc<ClientHost>,
}

/// One message read from a topic.
struct Read {
    id: String,
    keys: String,
    stored_ms: i64,
    properties: Vec<(String, Bytes)>,
    body: Bytes,
}

impl RocketMqDeadLetters {
    /// Connects to the dead-letter topic of the source `config` describes
    /// (`%DLQ%GROUP` unless it names another).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the clients being started.
    pub async fn connect(config: RocketMqConfig) -> Result<Self, ConnectError> {
        Self::open(config, true).await
    }

    /// [`connect`](Self::connect) for reading alone (`idem dlq ls`,
    /// `show`, `idem doctor`): creates no topic, so it needs no right to;
    /// a replay log it cannot read is reported and read as empty.
    pub async fn connect_reading(config: RocketMqConfig) -> Result<Self, ConnectError> {
        Self::open(config, false).await
    }

    async fn open(config: RocketMqConfig, writes: bool) -> Result<Self, ConnectError> {
        client::probe(config.name_servers()).await?;
        let host = ClientHost::new(0)?;
        let consumer = DefaultMQPullConsumer::builder(host.runtime())
            .consumer_group(format!("idem-dlq-reader-{}", std::process::id()))
            .name_server_addr(config.name_servers().to_owned())
            .build()
            .map_err(|e| ConnectError::Client {
                what: "pull consumer",
                reason: e.to_string(),
            })?;
        Box::pin(consumer.start())
            .await
            .map_err(|e| ConnectError::Client {
                what: "pull consumer",
                reason: e.to_string(),
            })?;
        let publisher = Box::pin(RocketMqPublisher::start(
            host.clone(),
            config.name_servers(),
            "idem-dlq-replayer",
        ))
        .await?;
        let replayed = format!("idem-replayed-{}", config.group());
        if writes {
            Box::pin(publisher.create_topic(&replayed, 1))
                .await
                .map_err(|e| ConnectError::Client {
                    what: "topic of replays",
                    reason: e.to_string(),
                })?;
        }
        Ok(Self {
            consumer,
            publisher,
            topic: config.topic().to_owned(),
            dead_letter: config.dead_letter_topic(),
            replayed,
            writes,
            _host: host,
        })
    }

    /// Every message of `topic`, queue by queue, in offset order.
    async fn read(&self, topic: &str) -> Result<Vec<Read>, SourceError> {
        let fail = |what: String, e: &dyn std::fmt::Display| SourceError::new(what, e.to_string());
        let queues = Box::pin(self.consumer.fetch_subscribe_message_queues(topic))
            .await
            .map_err(|e| {
                fail(
                    format!(
                        "finding the queues of topic {topic} (a dead-letter topic exists once \
                         a first message was dead-lettered)"
                    ),
                    &e,
                )
            })?;
        let mut out = Vec::new();
        for q in &queues {
            let mut offset = Box::pin(self.consumer.min_offset(q))
                .await
                .map_err(|e| fail(format!("reading topic {topic}"), &e))?;
            let max = Box::pin(self.consumer.max_offset(q))
                .await
                .map_err(|e| fail(format!("reading topic {topic}"), &e))?;
            while offset < max {
                let pulled = Box::pin(self.consumer.pull(q, "*", offset, PULL))
                    .await
                    .map_err(|e| fail(format!("reading topic {topic} at {offset}"), &e))?;
                let next = i64::try_from(pulled.next_begin_offset()).unwrap_or(i64::MAX);
                if *pulled.pull_status() == PullStatus::Found {
                    for m in pulled.msg_found_list().unwrap_or_default() {
                        let property = |name: &str| {
                            m.properties()
                                .iter()
                                .find(|(k, _)| k.as_str() == name)
                                .map(|(_, v)| v.to_string())
                        };
                        let mut properties: Vec<(String, Bytes)> = m
                            .properties()
                            .iter()
                            .filter(|(k, _)| !STRING_HASH_SET.contains(k.as_str()))
                            .map(|(k, v)| (k.to_string(), Bytes::copy_from_slice(v.as_bytes())))
                            .collect();
                        properties.sort_by(|a, b| a.0.cmp(&b.0));
                        out.push(Read {
                            // Two masters each have a queue 0: the
                            // broker's name makes the id one letter's.
                            id: format!(
                                "{}:{}:{}",
                                q.broker_name(),
                                m.queue_id(),
                                m.queue_offset()
                            ),
                            keys: property("KEYS").unwrap_or_default(),
                            stored_ms: m.store_timestamp(),
                            properties,
                            body: m.body().unwrap_or_default(),
                        });
                    }
                }
                if next <= offset {
                    break;
                }
                offset = next;
            }
        }
        Ok(out)
    }

    /// The dead letters not replayed yet.
    async fn parked(&self) -> Result<Vec<(Parked, String)>, SourceError> {
        let log = match self.read(&self.replayed).await {
            Ok(log) => log,
            // Made by the first replay or drop: before it, there is none.
            Err(e) if !self.writes => {
                tracing::warn!(topic = %self.replayed, error = %e, "the replay log cannot be read (none exists before a first replay); letters replayed earlier may be listed");
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let replayed: HashSet<String> = log
            .into_iter()
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect();
        Ok(self
            .read(&self.dead_letter)
            .await?
            .into_iter()
            .filter(|r| {
                // Settled by an idem that wrote `queue:offset`, without
                // the broker's name: matched on those two.
                let legacy = r.id.split_once(':').map_or("", |(_, rest)| rest);
                !replayed.contains(&r.id) && !replayed.contains(legacy)
            })
            .map(|r| {
                let parked = Parked {
                    id: r.id,
                    parked_at: u64::try_from(r.stored_ms)
                        .ok()
                        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
                    headers: r.properties,
                    body: r.body,
                };
                (parked, r.keys)
            })
            .collect())
    }
}

impl ReplayLog for RocketMqDeadLetters {
    /// The dead letter's `KEYS`.
    type Extra = String;

    fn log_name(&self) -> &str {
        &self.dead_letter
    }

    fn log_work_name(&self) -> &str {
        &self.topic
    }

    fn unreplayed(&self) -> BoxFuture<'_, Unreplayed<String>> {
        self.parked().boxed()
    }

    fn settle_one<'a>(
        &'a self,
        how: Settle,
        p: &'a Parked,
        keys: &'a String,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        async move {
            if how == Settle::Replay {
                let headers = p.replay_headers(&self.dead_letter);
                let properties: Vec<(String, String)> = headers
                    .iter()
                    .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect();
                let properties: Vec<(&str, &str)> = properties
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                let what = format!("replaying {}/{} to {}", self.dead_letter, p.id, self.topic);
                Box::pin(
                    self.publisher
                        .publish(&self.topic, keys, &properties, p.body.clone()),
                )
                .await
                .map_err(|e| SourceError::new(what, e))?;
            }
            let settled = [(SETTLED_PROPERTY, settled_as(how))];
            Box::pin(
                self.publisher
                    .publish(&self.replayed, "", &settled, p.id.clone()),
            )
            .await
            .map_err(|e| SourceError::new(format!("recording how {} was settled", p.id), e))?;
            Ok(())
        }
        .boxed()
    }
}

/// The property of a record in the replay log that says how its dead
/// letter was settled: `replayed` or `dropped`.
const SETTLED_PROPERTY: &str = "idem-settled";

fn settled_as(how: Settle) -> &'static str {
    match how {
        Settle::Replay => "replayed",
        Settle::Drop => "dropped",
    }
}

impl Drop for RocketMqDeadLetters {
    fn drop(&mut self) {
        let consumer = self.consumer.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = Box::pin(consumer.shutdown()).await;
            });
        }
    }
}
