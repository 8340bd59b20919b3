//! The dead-letter topic seen from outside the runner (`idem dlq`).
//!
//! A Kafka topic is a log: a record cannot be taken out of it. So each
//! replay (or drop) is recorded in a companion topic, `<dead-letter
//! topic>.replayed` (one partition, kept forever, created by the first
//! replay or drop), as the settled record's `partition:offset@timestamp`,
//! written after its copy is; listing and replaying leave out what it
//! names. The timestamp keeps a dead-letter topic created again (its
//! offsets start over) from inheriting the old topic's replays. Both verbs read the topics whole, from their
//! low to their high watermark, with librdkafka's consumer assigned to
//! every partition (no group, nothing committed).
//!
//! A replayed copy goes to the work topic with the dead letter's record
//! key (so the same partition as its original, and the same `message-id`
//! header), its headers less `idem-attempts` and `idem-last-error`, and
//! `idem-replayed-from`. A replay stopped between the copy and its record
//! in `.replayed` replays that one again next time: the guard absorbs the
//! duplicate.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use idem_consumer::SourceError;
use idem_consumer::dlq::{Parked, ReplayLog, Settle, Unreplayed};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::KafkaConfig;
use crate::error::ConnectError;

/// How long a metadata or watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long reading a topic to its end may take.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a produced record may wait for the brokers.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// A Kafka source's dead-letter topic.
pub struct KafkaDeadLetters {
    client: ClientConfig,
    producer: FutureProducer,
    topic: String,
    dead_letter: String,
    replayed: String,
}

/// One record read from a topic.
struct Read {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    timestamp_ms: Option<i64>,
    headers: Vec<(String, Bytes)>,
    payload: Bytes,
}

impl KafkaDeadLetters {
    /// Connects to the dead-letter topic of the source `config` describes
    /// (`<topic>-dlt` unless it names another), and creates its
    /// `.replayed` companion when missing.
    ///
    /// # Cancel safety
    ///
    /// Dropping it may leave the companion topic created, and nothing else.
    pub async fn connect(config: KafkaConfig) -> Result<Self, ConnectError> {
        let letters = Self::connect_reading(config.clone())?;
        letters.create_log(&config).await?;
        Ok(letters)
    }

    /// [`connect`](Self::connect) for reading alone (`idem dlq ls`,
    /// `show`, `idem doctor`): creates nothing, so it needs no right to
    /// write; a missing `.replayed` companion reads as empty.
    pub fn connect_reading(config: KafkaConfig) -> Result<Self, ConnectError> {
        let client = crate::source::client_config(&config);
        let producer: FutureProducer = client
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(|e| ConnectError::Kafka(format!("creating the producer: {e}")))?;
        let dead_letter = config.dead_letter_topic();
        let replayed = format!("{dead_letter}.replayed");
        Ok(Self {
            client,
            producer,
            topic: config.topic.clone(),
            dead_letter,
            replayed,
        })
    }

    /// Creates the `.replayed` companion when missing: one partition, kept
    /// forever (`retention.ms=-1`: a record a replay, so it outlives any
    /// retention of the dead-letter topic; were it shorter, replayed
    /// letters would come back as not replayed).
    async fn create_log(&self, config: &KafkaConfig) -> Result<(), ConnectError> {
        let admin: AdminClient<DefaultClientContext> = self
            .client
            .create()
            .map_err(|e| ConnectError::Kafka(format!("creating the admin client: {e}")))?;
        let replication = config.replication.map_or(-1, i32::from);
        let created = admin
            .create_topics(
                &[
                    NewTopic::new(&self.replayed, 1, TopicReplication::Fixed(replication))
                        .set("retention.ms", "-1"),
                ],
                &AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT)),
            )
            .await
            .map_err(|e| ConnectError::Unreachable {
                brokers: config.brokers.clone(),
                reason: e.to_string(),
            })?;
        for result in created {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(ConnectError::Kafka(format!(
                        "creating topic {name}: {code}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every record of `topic`, in partition and offset order.
    async fn read(&self, topic: &str) -> Result<Vec<Read>, SourceError> {
        let client = self.client.clone();
        let name = topic.to_owned();
        tokio::task::spawn_blocking(move || read_topic(&client, &name))
            .await
            .map_err(|e| SourceError::new(format!("reading topic {topic}"), e))?
            .map_err(|e| SourceError::new(format!("reading topic {topic}"), e))
    }

    /// The dead letters not replayed (nor dropped) yet, oldest offset
    /// first in each partition.
    async fn parked(&self) -> Result<Vec<(Parked, Read)>, SourceError> {
        let settled: HashSet<String> = self
            .read(&self.replayed)
            .await?
            .into_iter()
            .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
            .collect();
        Ok(self
            .read(&self.dead_letter)
            .await?
            .into_iter()
            .filter_map(|r| {
                let id = format!("{}:{}", r.partition, r.offset);
                if was_settled(&settled, &id, r.timestamp_ms) {
                    return None;
                }
                let parked = Parked {
                    id,
                    parked_at: r
                        .timestamp_ms
                        .and_then(|ms| u64::try_from(ms).ok())
                        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
                    headers: r.headers.clone(),
                    body: r.payload.clone(),
                };
                Some((parked, r))
            })
            .collect())
    }

    async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        headers: &[(String, Bytes)],
        payload: &[u8],
    ) -> Result<(), SourceError> {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (name, value) in headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(value.as_ref()),
            });
        }
        let mut record = FutureRecord::to(topic).payload(payload).headers(owned);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.producer
            .send(record, SEND_TIMEOUT)
            .await
            .map(drop)
            .map_err(|(e, _)| SourceError::new(format!("publishing to topic {topic}"), e))
    }
}

/// Reads `topic` from each partition's low to its high watermark.
fn read_topic(client: &ClientConfig, topic: &str) -> Result<Vec<Read>, String> {
    let consumer: BaseConsumer = client
        .clone()
        .set("group.id", "idem-dlq-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_uncommitted")
        .create()
        .map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let Some(t) = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
    else {
        return Ok(Vec::new());
    };
    let mut assignment = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for p in t.partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), REQUEST_TIMEOUT)
            .map_err(|e| e.to_string())?;
        if high > low {
            assignment
                .add_partition_offset(topic, p.id(), Offset::Offset(low))
                .map_err(|e| e.to_string())?;
            ends.insert(p.id(), high);
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + READ_TIMEOUT;
    while !ends.is_empty() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if ends
                    .get(&m.partition())
                    .is_some_and(|&end| m.offset() + 1 >= end)
                {
                    ends.remove(&m.partition());
                }
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    Bytes::copy_from_slice(h.value.unwrap_or_default()),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Read {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    timestamp_ms: m.timestamp().to_millis(),
                    headers,
                    payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                });
            }
            Some(Err(e)) => return Err(e.to_string()),
            None => {
                // Past the last record (control records of transactions
                // are never delivered): the position tells.
                let position = consumer.position().map_err(|e| e.to_string())?;
                ends.retain(|&partition, &mut end| {
                    !matches!(
                        position.find_partition(topic, partition).map(|p| p.offset()),
                        Some(Offset::Offset(at)) if at >= end
                    )
                });
                if Instant::now() > deadline {
                    return Err(format!(
                        "the brokers did not send the topic to its end within {} s",
                        READ_TIMEOUT.as_secs()
                    ));
                }
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

impl ReplayLog for KafkaDeadLetters {
    type Extra = Option<Vec<u8>>;

    fn log_name(&self) -> &str {
        &self.dead_letter
    }

    fn log_work_name(&self) -> &str {
        &self.topic
    }

    fn unreplayed(&self) -> BoxFuture<'_, Unreplayed<Self::Extra>> {
        async move {
            Ok(self
                .parked()
                .await?
                .into_iter()
                .map(|(p, read)| (p, read.key))
                .collect())
        }
        .boxed()
    }

    fn settle_one<'a>(
        &'a self,
        how: Settle,
        p: &'a Parked,
        key: &'a Self::Extra,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        async move {
            if how == Settle::Replay {
                let headers = p.replay_headers(&self.dead_letter);
                self.send(&self.topic, key.as_deref(), &headers, &p.body)
                    .await?;
            }
            let settled = match how {
                Settle::Replay => "replayed",
                Settle::Drop => "dropped",
            };
            let header = [(
                "idem-settled".to_owned(),
                Bytes::from_static(settled.as_bytes()),
            )];
            let at = p.parked_at.and_then(|t| {
                let ms = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis();
                i64::try_from(ms).ok()
            });
            self.send(
                &self.replayed,
                None,
                &header,
                log_entry(&p.id, at).as_bytes(),
            )
            .await
        }
        .boxed()
    }
}

/// A dead letter's record in the replay log: `partition:offset@timestamp`.
/// The timestamp tells apart the record at the same place of a dead-letter
/// topic deleted and created again, whose offsets start over: its replays
/// are not taken for the new letters'.
fn log_entry(id: &str, timestamp_ms: Option<i64>) -> String {
    match timestamp_ms {
        Some(ms) => format!("{id}@{ms}"),
        None => id.to_owned(),
    }
}

/// Whether the replay log `settled` names the record `id` written at
/// `timestamp_ms`: by both, or by `id` alone where an earlier idem recorded
/// `partition:offset` only.
fn was_settled(settled: &HashSet<String>, id: &str, timestamp_ms: Option<i64>) -> bool {
    settled.contains(&log_entry(id, timestamp_ms)) || settled.contains(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_made_again_does_not_inherit_the_old_one_s_replays() {
        let settled: HashSet<String> = [log_entry("0:5", Some(1_000)), "1:7".to_owned()].into();
        assert!(was_settled(&settled, "0:5", Some(1_000)));
        // The same place in a topic deleted and created again.
        assert!(!was_settled(&settled, "0:5", Some(9_000)));
        assert!(!was_settled(&settled, "0:6", Some(1_000)));
        // Recorded by an earlier idem, without the time.
        assert!(was_settled(&settled, "1:7", Some(5_000)));
    }
}
