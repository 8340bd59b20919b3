//! [`KafkaSource`]: a consumer group member as the runner's [`Source`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_consumer::{DeadLetter, Delivery, RetryReason, Source, SourceError};
use parking_lot::Mutex;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use crate::config::{KafkaConfig, OffsetReset, RetryMode};
use crate::consumer::{self, Context, Shared, now_ms};
use crate::error::ConnectError;
use crate::record::{self, ATTEMPTS, DUE, Receipt};

/// How long connecting waits for the brokers' metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a copy to a retry or dead-letter topic may wait in the
/// producer's queue.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// After a copy could not be written, how long before the message is
/// handed out again.
const PUT_BACK_AFTER: Duration = Duration::from_secs(1);

/// A member of a Kafka consumer group, for [`Runner`](idem_consumer::Runner).
///
/// - **Offsets** are committed only for messages whose effect is recorded
///   (acked, copied to a retry topic, or dead-lettered), and only up to the
///   first message still in work in each partition: a slow message holds
///   its partition's commit back. Commits go out every
///   [`commit_interval`](KafkaConfig::commit_interval), at each rebalance
///   and at [`close`](KafkaSource::close). Auto-commit is off.
/// - **Rebalances**: the partitions taken away have their buffered messages
///   taken back, the work in flight on them finished (up to
///   [`revoke_grace`](KafkaConfig::revoke_grace)) and their offsets
///   committed before they go; partitions assigned start from their
///   committed offset.
/// - **Retries** go to a retry topic (or wait in place, see
///   [`RetryMode`]); **dead letters** to `<topic>-dlt`, with the headers
///   `idem-key`, `idem-attempts`, `idem-last-error` and `idem-origin`.
/// - **Lag**: the gauge `idem_kafka_consumer_lag{group,topic,partition}`,
///   from librdkafka's statistics (every 5 s unless
///   `statistics.interval.ms` is set), and [`lag`](KafkaSource::lag).
///
/// Cloning gives another handle to the same member.
#[derive(Clone)]
pub struct KafkaSource {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    producer: FutureProducer,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The thread commits what finished and leaves the group.
        self.shared.stop.store(true, Ordering::Release);
    }
}

impl KafkaSource {
    /// Creates the topic (when missing), its retry topics and its
    /// dead-letter topic, then joins the consumer group.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it finishes leaves the topics it created;
    /// it joins no group until the end.
    pub async fn connect(config: KafkaConfig) -> Result<Self, ConnectError> {
        let base = client_config(&config);
        let topics_config = config.clone();
        let admin_base = base.clone();
        tokio::task::spawn_blocking(move || ensure_topics(&admin_base, &topics_config))
            .await
            .map_err(|e| ConnectError::Kafka(format!("creating the topics panicked: {e}")))??;
        let producer: FutureProducer = base
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(|e| ConnectError::Kafka(format!("creating the producer: {e}")))?;
        if let Some(lease) = config.lease {
            tracing::debug!(
                ?lease,
                "Kafka redelivers only after a rebalance; the lease guards handlers across members"
            );
        }
        let shared = Arc::new(Shared::new(config.clone()));
        let consumer_config = consumer_config(base, &config);
        let consumer: BaseConsumer<Context> = consumer_config
            .create_with_context(Context {
                shared: shared.clone(),
            })
            .map_err(|e| ConnectError::Kafka(format!("creating the consumer: {e}")))?;
        let topics = config.subscribed();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(|e| ConnectError::Kafka(format!("subscribing to {names:?}: {e}")))?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("idem-kafka-consumer".into())
            .spawn(move || consumer::run(consumer, thread_shared))
            .map_err(|e| ConnectError::Kafka(format!("starting the consumer thread: {e}")))?;
        tracing::info!(topics = ?topics, group = %config.group, "consuming from Kafka");
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                producer,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Commits the offsets of what finished and leaves the group; messages
    /// buffered and not handed out are left to the group. Call it after the
    /// runner has stopped.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the close to finish in the background.
    pub async fn close(&self) {
        self.inner.shared.stop.store(true, Ordering::Release);
        let thread = self.inner.thread.lock().take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    /// The partitions this member holds now.
    pub fn assignment(&self) -> Vec<(String, i32)> {
        let state = self.inner.shared.state.lock();
        let mut tps: Vec<(String, i32)> = state
            .partitions
            .keys()
            .map(|(t, p)| (t.to_string(), *p))
            .collect();
        tps.sort();
        tps
    }

    /// The consumer lag of each partition held, as last reported by
    /// librdkafka's statistics: messages after the committed offset.
    pub fn lag(&self) -> Vec<(String, i32, i64)> {
        let state = self.inner.shared.state.lock();
        let mut lag: Vec<(String, i32, i64)> = state
            .lag
            .iter()
            .map(|((t, p), l)| (t.to_string(), *p, *l))
            .collect();
        lag.sort();
        lag
    }

    /// Writes a copy of `delivery` to `topic` with `headers` (on top of
    /// its own and its origin), then finishes it; when the copy cannot be
    /// written, the message is handed out again a moment later.
    async fn copy_then_finish(
        &self,
        delivery: Delivery<Receipt>,
        topic: &str,
        headers: &[(&str, String)],
    ) -> Result<(), SourceError> {
        let Delivery { message, receipt } = &delivery;
        let copy_headers = record::copy_headers(message, &receipt.origin(), headers);
        let mut record = FutureRecord::to(topic)
            .payload(message.body.as_ref())
            .headers(copy_headers);
        if let Some(key) = &receipt.record_key {
            record = record.key(key.as_ref());
        }
        match self.inner.producer.send(record, SEND_TIMEOUT).await {
            Ok(_) => {
                self.inner.shared.finish(receipt);
                Ok(())
            }
            Err((e, _)) => {
                self.put_back_later(delivery, PUT_BACK_AFTER);
                Err(SourceError::new(format!("writing a copy to {topic}"), e))
            }
        }
    }

    fn put_back_later(&self, delivery: Delivery<Receipt>, after: Duration) {
        let shared = self.inner.shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            shared.put_back(delivery);
        });
    }
}

impl Source for KafkaSource {
    type Receipt = Receipt;

    fn name(&self) -> &str {
        &self.inner.shared.config.topic
    }

    /// # Cancel safety
    ///
    /// Messages stay in the buffer until taken: dropping the future loses
    /// none.
    async fn fetch(&self, max: usize) -> Result<Vec<Delivery<Receipt>>, SourceError> {
        let shared = &self.inner.shared;
        for _ in 0..2 {
            let notified = shared.ready.notified();
            {
                let mut state = shared.state.lock();
                if !state.buffer.is_empty() {
                    let n = max.min(state.buffer.len());
                    let taken = state.buffer.drain(..n).collect();
                    drop(state);
                    shared.drained.notify_one();
                    return Ok(taken);
                }
                if state.closed {
                    return Err(SourceError::new(
                        "fetching from Kafka",
                        "the consumer is closed",
                    ));
                }
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        Ok(Vec::new())
    }

    async fn ack(&self, delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        self.inner.shared.finish(&delivery.receipt);
        Ok(())
    }

    /// With retry topics: a copy goes to the first retry topic whose delay
    /// is at least `delay` (else the last), due after that topic's delay,
    /// and the message is finished. Blocking: the message is handed out
    /// again after `delay`, its offset held (the runner normally waits in
    /// place itself, see [`RetryMode::Blocking`]).
    ///
    /// # Cancel safety
    ///
    /// The runner awaits it to the end. Dropped while the copy is being
    /// written, the message is neither finished nor handed out again: its
    /// partition's commit stays before it, so it comes again after a
    /// restart or a rebalance (the copy, if written, is a duplicate the
    /// guard absorbs).
    async fn retry(
        &self,
        mut delivery: Delivery<Receipt>,
        delay: Duration,
        reason: RetryReason,
    ) -> Result<(), SourceError> {
        let made =
            delivery.message.attempt.saturating_sub(1) + u32::from(reason.counts_as_attempt());
        let config = &self.inner.shared.config;
        match config.retry_level(delay) {
            Some((level, wait)) => {
                let topic = config.retry_topic(level).expect("a level has a topic");
                let due = now_ms() + wait.as_millis() as i64;
                self.copy_then_finish(
                    delivery,
                    &topic,
                    &[(ATTEMPTS, made.to_string()), (DUE, due.to_string())],
                )
                .await
            }
            None => {
                debug_assert_eq!(config.retry, RetryMode::Blocking);
                delivery.message.attempt = made + 1;
                self.put_back_later(delivery, delay);
                Ok(())
            }
        }
    }

    /// # Cancel safety
    ///
    /// As for [`retry`](Source::retry): a dropped call leaves the offset
    /// uncommitted, never committed past a message whose copy was lost.
    async fn dead_letter(
        &self,
        delivery: Delivery<Receipt>,
        why: DeadLetter,
    ) -> Result<(), SourceError> {
        let topic = self.inner.shared.config.dead_letter_topic();
        let headers = why.headers();
        let headers: Vec<(&str, String)> = headers.iter().map(|(n, v)| (*n, v.clone())).collect();
        self.copy_then_finish(delivery, &topic, &headers).await
    }

    /// Leaves the offset uncommitted: the message comes again to whoever
    /// holds the partition after this member closes.
    async fn requeue(&self, delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        drop(delivery);
        Ok(())
    }
}

/// The consumer's settings: the group, offsets committed by the source
/// only, the offset reset and the isolation level, statistics for the lag,
/// then the user's properties.
fn consumer_config(mut c: ClientConfig, config: &KafkaConfig) -> ClientConfig {
    c.set("group.id", &config.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set(
            "auto.offset.reset",
            match config.offset_reset {
                OffsetReset::Earliest => "earliest",
                OffsetReset::Latest => "latest",
            },
        )
        .set(
            "isolation.level",
            if config.read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .set("statistics.interval.ms", "5000");
    for (name, value) in &config.properties {
        c.set(name, value);
    }
    c
}

/// The settings every client shares: the brokers and the user's
/// properties that apply to all.
fn client_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.brokers);
    for (name, value) in &config.properties {
        // Consumer-only properties would make the producer warn.
        if !name.starts_with("session.")
            && !name.starts_with("heartbeat.")
            && !name.starts_with("max.poll.")
            && !name.starts_with("statistics.")
            && !name.starts_with("fetch.")
            && !name.starts_with("partition.assignment")
            && !name.starts_with("group.")
        {
            c.set(name, value);
        }
    }
    c
}

/// Creates the topic when missing (with `partitions`, default 1), and its
/// retry and dead-letter topics with as many partitions as it has.
fn ensure_topics(base: &ClientConfig, config: &KafkaConfig) -> Result<(), ConnectError> {
    let admin: AdminClient<DefaultClientContext> = base
        .create()
        .map_err(|e| ConnectError::Kafka(format!("creating the admin client: {e}")))?;
    let metadata = admin
        .inner()
        .fetch_metadata(Some(&config.topic), METADATA_TIMEOUT)
        .map_err(|e| ConnectError::Unreachable {
            brokers: config.brokers.clone(),
            reason: e.to_string(),
        })?;
    let existing = metadata
        .topics()
        .iter()
        .find(|t| t.name() == config.topic && t.error().is_none())
        .map(|t| t.partitions().len() as i32)
        .filter(|&n| n > 0);
    let partitions = existing.or(config.partitions).unwrap_or(1);
    let mut wanted = Vec::new();
    if existing.is_none() {
        wanted.push(config.topic.clone());
    }
    wanted.extend((0..).map_while(|level| config.retry_topic(level)));
    wanted.push(config.dead_letter_topic());
    let new: Vec<NewTopic<'_>> = wanted
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ConnectError::Kafka(e.to_string()))?;
    let created = runtime
        .block_on(admin.create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT)),
        ))
        .map_err(|e| ConnectError::Kafka(format!("creating topics {wanted:?}: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consumer_reads_committed_and_never_commits_by_itself() {
        let config = KafkaConfig::from_url("kafka://h:1?topic=t&group=g").unwrap();
        let c = consumer_config(client_config(&config), &config);
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(c.get("enable.auto.commit"), Some("false"));
        assert_eq!(c.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(c.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(c.get("group.id"), Some("g"));
    }

    #[test]
    fn properties_in_the_url_win() {
        let config = KafkaConfig::from_url(
            "kafka://h:1?topic=t&group=g&isolation=read_uncommitted&statistics.interval.ms=100&session.timeout.ms=6000",
        )
        .unwrap();
        let c = consumer_config(client_config(&config), &config);
        assert_eq!(c.get("isolation.level"), Some("read_uncommitted"));
        assert_eq!(c.get("statistics.interval.ms"), Some("100"));
        assert_eq!(c.get("session.timeout.ms"), Some("6000"));
        let shared = client_config(&config);
        assert_eq!(
            shared.get("session.timeout.ms"),
            None,
            "consumer-only properties stay off the producer"
        );
    }
}
