//! Publishing with the idempotent producer.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::error::ConnectError;
use crate::record::MESSAGE_ID;

/// How long a record may wait in the producer's queue for the brokers.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Publishes records with librdkafka's idempotent producer
/// (`enable.idempotence=true`, `acks=all`): a record the producer retries
/// after a lost answer is written once per partition. Each record gets a
/// key and a `message-id` header, which [`KafkaSource`](crate::KafkaSource)
/// gives the runner as the message id. Clones share the producer.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
}

/// Where a published record landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The partition.
    pub partition: i32,
    /// The record's offset in it.
    pub offset: i64,
}

/// The brokers did not take the record.
#[derive(Debug, thiserror::Error)]
#[error("publishing to topic `{topic}` failed: {source}")]
pub struct PublishError {
    topic: String,
    #[source]
    source: rdkafka::error::KafkaError,
}

impl KafkaPublisher {
    /// A producer for `brokers` (`host:port,host:port`).
    pub fn new(brokers: &str) -> Result<Self, ConnectError> {
        Self::with_properties(brokers, &[])
    }

    /// A producer with librdkafka properties of its own on top
    /// (`linger.ms`, `compression.type`, security settings). Idempotence
    /// and `acks=all` cannot be turned off here.
    pub fn with_properties(
        brokers: &str,
        properties: &[(&str, &str)],
    ) -> Result<Self, ConnectError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        for (name, value) in properties {
            config.set(*name, *value);
        }
        config.set("enable.idempotence", "true").set("acks", "all");
        let producer = config
            .create()
            .map_err(|e| ConnectError::Kafka(format!("creating the producer: {e}")))?;
        Ok(Self { producer })
    }

    /// Publishes `body` to `topic` with record key `key` (which picks the
    /// partition, unless `partition` is given), the header `message-id:
    /// id` and `headers`; answers once every in-sync replica has it.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have published the record;
    /// publishing again with the same id is safe for a consumer keyed on
    /// it.
    pub async fn publish(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        id: &str,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<Published, PublishError> {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len() + 1).insert(Header {
            key: MESSAGE_ID,
            value: Some(id),
        });
        for (name, value) in headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(*value),
            });
        }
        let mut record = FutureRecord::to(topic).payload(body).headers(owned);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        match self.producer.send(record, SEND_TIMEOUT).await {
            Ok(d) => Ok(Published {
                partition: d.partition,
                offset: d.offset,
            }),
            Err((source, _)) => Err(PublishError {
                topic: topic.to_owned(),
                source,
            }),
        }
    }

    /// Waits until every record handed to the producer is written, or
    /// `timeout` passes.
    pub fn flush(&self, timeout: Duration) -> Result<(), PublishError> {
        self.producer.flush(timeout).map_err(|source| PublishError {
            topic: String::new(),
            source,
        })
    }
}
