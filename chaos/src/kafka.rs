//! Kafka's end state read with a plain librdkafka consumer rather than
//! idem's source: the dead-letter topic from its beginning, and the
//! consumers' group's committed offsets against the end of every partition
//! it consumes. Blocking calls: run them on a blocking thread.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

/// How long one request to the broker may take.
const ANSWER: Duration = Duration::from_secs(10);

/// A consumer of `group` that never joins it (no subscription): it reads
/// assigned partitions and the group's committed offsets only.
fn consumer(brokers: &str, group: &str) -> Result<BaseConsumer, String> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(|e| format!("a Kafka consumer of {brokers}: {e}"))
}

/// The partitions of `topic`; none when the topic does not exist.
fn partitions(c: &BaseConsumer, topic: &str) -> Result<Vec<i32>, String> {
    let metadata = c
        .fetch_metadata(Some(topic), ANSWER)
        .map_err(|e| format!("the metadata of topic {topic}: {e}"))?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

fn watermarks(c: &BaseConsumer, topic: &str, partition: i32) -> Result<(i64, i64), String> {
    c.fetch_watermarks(topic, partition, ANSWER)
        .map_err(|e| format!("the offsets of {topic} partition {partition}: {e}"))
}

/// Every record of `topic`, from the beginning to the end each partition
/// had when the read began, through `key` (the run's key in a body).
pub fn read_all(
    brokers: &str,
    topic: &str,
    key: fn(&[u8]) -> String,
) -> Result<Vec<String>, String> {
    let c = consumer(brokers, "idem-chaos-reader")?;
    let mut ends = HashMap::new();
    let mut assigned = TopicPartitionList::new();
    for p in partitions(&c, topic)? {
        let (low, high) = watermarks(&c, topic, p)?;
        if high > low {
            ends.insert(p, high);
            assigned
                .add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(|e| e.to_string())?;
        }
    }
    if ends.is_empty() {
        return Ok(Vec::new());
    }
    c.assign(&assigned)
        .map_err(|e| format!("reading topic {topic}: {e}"))?;
    let deadline = Instant::now() + ANSWER * 3;
    let mut keys = Vec::new();
    while !ends.is_empty() {
        if Instant::now() >= deadline {
            return Err(format!(
                "topic {topic}: partitions {:?} not read to their end within {:?}",
                ends.keys().collect::<Vec<_>>(),
                ANSWER * 3
            ));
        }
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ends.remove(&p);
            }
            Some(Err(e)) => return Err(format!("reading topic {topic}: {e}")),
            Some(Ok(m)) => {
                keys.push(key(m.payload().unwrap_or_default()));
                if ends
                    .get(&m.partition())
                    .is_some_and(|&end| m.offset() + 1 >= end)
                {
                    ends.remove(&m.partition());
                }
            }
        }
    }
    Ok(keys)
}

/// Each partition of `topics` whose committed offset in `group` is short
/// of the partition's end: records the consumers never settled.
pub fn group_lag(brokers: &str, group: &str, topics: &[String]) -> Result<Vec<String>, String> {
    let c = consumer(brokers, group)?;
    let mut asked = TopicPartitionList::new();
    for topic in topics {
        for p in partitions(&c, topic)? {
            asked.add_partition(topic, p);
        }
    }
    let committed = c
        .committed_offsets(asked, ANSWER)
        .map_err(|e| format!("the committed offsets of group {group}: {e}"))?;
    let mut problems = Vec::new();
    for e in committed.elements() {
        let (low, high) = watermarks(&c, e.topic(), e.partition())?;
        // Nothing committed: the group is at the partition's start.
        let at = match e.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        if at < high {
            problems.push(format!(
                "Kafka topic {} partition {}: group {group} committed offset {at} of {high} ({} records not settled) at the end",
                e.topic(),
                e.partition(),
                high - at
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the test broker: records no group has committed show as
    /// lag, and the reader gets every record from the beginning.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unsettled_records_show_as_lag_and_every_record_is_read() {
        let brokers = idem_testkit::services::url("IDEM_TEST_KAFKA_URL", "127.0.0.1:9092");
        let topic = format!("chaos_kafka_reader_{:x}", fastrand::u64(..));
        let url = format!("kafka://{brokers}?topic={topic}&group={topic}_group&partitions=2");
        let config = idem_kafka::KafkaConfig::from_url(&url).unwrap();
        // Connecting makes the topic.
        let source = match idem_kafka::KafkaSource::connect(config).await {
            Ok(s) => s,
            Err(e) => {
                idem_testkit::services::absent::<()>("Kafka", &brokers, e);
                return;
            }
        };
        source.close().await;
        let publisher = idem_kafka::KafkaPublisher::new(&brokers).unwrap();
        for key in ["a", "b", "c"] {
            let body = format!(r#"{{"key":"{key}"}}"#);
            publisher
                .publish(
                    &topic,
                    None,
                    Some(key.as_bytes()),
                    key,
                    &[],
                    body.as_bytes(),
                )
                .await
                .unwrap();
        }
        let (b, t) = (brokers.clone(), topic.clone());
        let lag = tokio::task::spawn_blocking(move || {
            group_lag(&b, &format!("{t}_group"), std::slice::from_ref(&t))
        })
        .await
        .unwrap()
        .unwrap();
        let unsettled: i64 = lag
            .iter()
            .map(|p| {
                let n = p.split('(').nth(1).unwrap().split(' ').next().unwrap();
                n.parse::<i64>().unwrap()
            })
            .sum();
        assert_eq!(unsettled, 3, "{lag:?}");
        let (b, t) = (brokers.clone(), topic.clone());
        let mut keys = tokio::task::spawn_blocking(move || {
            read_all(&b, &t, |body| {
                serde_json::from_slice::<serde_json::Value>(body).unwrap()["key"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
        })
        .await
        .unwrap()
        .unwrap();
        keys.sort();
        assert_eq!(keys, ["a", "b", "c"]);
        let none = tokio::task::spawn_blocking(move || {
            read_all(&brokers, &format!("{topic}-dlt"), |_| String::new())
        })
        .await
        .unwrap()
        .unwrap();
        assert!(none.is_empty(), "a topic that does not exist holds nothing");
    }
}
