//! [`KafkaSource`]: a consumer group member as the runner's [`Source`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::copy::header_text;
use idem_consumer::{DeadLetter, Delivery, RetryReason, Source, SourceError};
use parking_lot::Mutex;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use crate::config::{KafkaConfig, OffsetReset, RetryMode};
use crate::consumer::{self, Context, Shared, now_ms};
use crate::error::ConnectError;
use crate::record::{self, ATTEMPTS, DUE, ORIGIN, Receipt};

/// How long connecting waits for the brokers' metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a retry or dead letter waits for its copy to be written before
/// the source keeps the copy and the settle returns.
const SETTLE_WAIT: Duration = Duration::from_secs(5);
/// After a copy could not be written, the first wait before writing it
/// again; each next wait is twice as long, up to [`REWRITE_MAX`].
const REWRITE_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two writes of a copy.
const REWRITE_MAX: Duration = Duration::from_secs(60);

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
///   `idem-key`, `idem-attempts`, `idem-last-error` and `idem-origin`
///   (values made safe by [`idem_consumer::copy`]). A settle returns within
///   5 s: a copy not written by then is kept and written again with a
///   growing delay (1 s doubling up to 1 min), its message's offset held
///   and the handler not run again; failures are counted in
///   `idem_kafka_copy_failures_total{topic,kind}`.
/// - **Shutdown**: messages handed back ([`requeue`](Source::requeue))
///   stay uncommitted but are not waited for: [`close`](KafkaSource::close)
///   waits only for messages still in a handler.
/// - **Lag**: the gauge `idem_kafka_consumer_lag{group,topic,partition}`,
///   the messages of each assigned partition not yet finished (past the
///   offset stored for the last finished one), from librdkafka's
///   statistics (every 5 s unless `statistics.interval.ms` is set; 0 once
///   the partition is revoked), and their sum as
///   [`lag`](Source::lag).
/// - **Memory**: the buffer of polled messages is bounded (see
///   [`KafkaConfig::concurrency`]); with partition lanes,
///   [`pause_lane`](Source::pause_lane) pauses the partition at the broker.
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
        self.shared.stop();
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
        self.inner.shared.stop();
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

    /// Messages polled from the broker and not yet fetched by the runner.
    /// At most `5 × max(4 × concurrency, 256) / 4` (see
    /// [`KafkaConfig::concurrency`]), whatever the runner does.
    pub fn buffered(&self) -> usize {
        let state = self.inner.shared.state.lock();
        state.buffer.len()
            + state
                .lanes_paused
                .values()
                .map(VecDeque::len)
                .sum::<usize>()
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
    /// its own and its origin), then finishes it. A copy not written
    /// within [`SETTLE_WAIT`] is kept by the source, which writes it again
    /// with a growing delay while the message's offset stays uncommitted:
    /// the handler is not run again for it.
    async fn copy_then_finish(
        &self,
        delivery: Delivery<Receipt>,
        topic: String,
        headers: &[(&str, String)],
    ) -> Result<(), SourceError> {
        let Delivery { message, receipt } = &delivery;
        let origin = receipt.origin();
        let idem: Vec<(&str, &str)> = std::iter::once((ORIGIN, origin.as_str()))
            .chain(headers.iter().map(|(name, value)| (*name, value.as_str())))
            .collect();
        let headers = record::copy_headers(message, &idem);
        let copy = OutgoingCopy {
            topic,
            headers,
            delivery,
        };
        let shared = &self.inner.shared;
        let first = match copy.enqueue(&self.inner.producer) {
            Err(e) => Err(e),
            Ok(mut pending) => match tokio::time::timeout(SETTLE_WAIT, &mut pending).await {
                Ok(written) => written_or_error(written),
                Err(_) => {
                    let what = format!("writing a copy to {}", copy.topic);
                    shared.abandon(&copy.delivery.receipt);
                    self.keep_writing(copy, Some(pending));
                    return Err(SourceError::new(
                        what,
                        format!(
                            "not written within {SETTLE_WAIT:?}; the source waits for it, holding the message's offset"
                        ),
                    ));
                }
            },
        };
        match first {
            Ok(()) => {
                shared.finish(&copy.delivery.receipt);
                Ok(())
            }
            Err(e) => {
                let kind = failed(&copy.topic, &e);
                let what = format!("writing a copy to {}", copy.topic);
                shared.abandon(&copy.delivery.receipt);
                self.keep_writing(copy, None);
                Err(SourceError::new(
                    what,
                    format!(
                        "{} ({kind}); the source writes it again later, holding the message's offset",
                        header_text(&e.to_string())
                    ),
                ))
            }
        }
    }

    /// Writes `copy` in the background until it is written, waiting
    /// [`REWRITE_FIRST`] after a failure, twice as long after each next
    /// one, up to [`REWRITE_MAX`]; then finishes its message. Gives up
    /// when the source closes or the partition is taken away: the message
    /// was never committed past, so it comes again.
    fn keep_writing(&self, copy: OutgoingCopy, mut pending: Option<DeliveryFuture>) {
        let shared = self.inner.shared.clone();
        let producer = self.inner.producer.clone();
        tokio::spawn(async move {
            let mut wait = REWRITE_FIRST;
            loop {
                let written = match pending.take() {
                    Some(pending) => written_or_error(pending.await),
                    None => {
                        if !shared.sleep_unless_stopped(wait).await
                            || !shared.holds(&copy.delivery.receipt)
                        {
                            return;
                        }
                        wait = (wait * 2).min(REWRITE_MAX);
                        match copy.enqueue(&producer) {
                            Ok(pending) => written_or_error(pending.await),
                            Err(e) => Err(e),
                        }
                    }
                };
                match written {
                    Ok(()) => {
                        tracing::info!(topic = %copy.topic, "a copy held back is written");
                        shared.finish(&copy.delivery.receipt);
                        return;
                    }
                    Err(e) => {
                        failed(&copy.topic, &e);
                    }
                }
            }
        });
    }

    /// Puts the delivery back in the buffer after `after`; until then no
    /// revoke or close waits for it.
    fn put_back_later(&self, delivery: Delivery<Receipt>, after: Duration) {
        let shared = self.inner.shared.clone();
        shared.abandon(&delivery.receipt);
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

    /// The sum of the assigned partitions' lag, from librdkafka's last
    /// statistics (`statistics.interval.ms`): the gauge
    /// `idem_kafka_consumer_lag` has it per partition.
    async fn lag(&self) -> Result<Option<u64>, SourceError> {
        let state = self.inner.shared.state.lock();
        Ok(Some(
            state
                .lag
                .values()
                .map(|&n| u64::try_from(n).unwrap_or(0))
                .sum(),
        ))
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
        let made = reason.attempts_used_after(delivery.message.attempt.saturating_sub(1));
        let config = &self.inner.shared.config;
        match config.retry_level(delay) {
            Some((level, wait)) => {
                let topic = config.retry_topic(level).expect("a level has a topic");
                let due = now_ms() + wait.as_millis() as i64;
                self.copy_then_finish(
                    delivery,
                    topic,
                    &[(ATTEMPTS, made.to_string()), (DUE, due.to_string())],
                )
                .await
            }
            None => {
                debug_assert_eq!(config.retry, RetryMode::Blocking);
                delivery.message.attempt = made.saturating_add(1);
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
        self.copy_then_finish(delivery, topic, &headers).await
    }

    /// With partition lanes: the partition's messages already polled are
    /// kept out of [`fetch`](Source::fetch), in order, and the partition is
    /// paused at the broker (librdkafka's pause, by the consumer thread),
    /// so that the messages behind one waiting in place take no room in
    /// the runner. With key lanes it does nothing.
    fn pause_lane(&self, lane: &Bytes) {
        self.inner.shared.pause_lane(lane);
    }

    /// Hands the lane's kept messages out first, in order, and resumes the
    /// partition at the broker.
    fn resume_lane(&self, lane: &Bytes) {
        self.inner.shared.resume_lane(lane);
    }

    /// Leaves the offset uncommitted: the message comes again to whoever
    /// holds the partition after this member closes. Nothing waits for it
    /// any more: a revoke or [`close`](KafkaSource::close) goes ahead
    /// without it.
    async fn requeue(&self, delivery: Delivery<Receipt>) -> Result<(), SourceError> {
        self.inner.shared.abandon(&delivery.receipt);
        Ok(())
    }
}

/// A copy of a delivery for a retry or dead-letter topic, kept until it is
/// written.
struct OutgoingCopy {
    topic: String,
    headers: OwnedHeaders,
    delivery: Delivery<Receipt>,
}

impl OutgoingCopy {
    /// Hands the copy to the producer; the future answers once the brokers
    /// have it, or why not. A copy the producer refuses at once (too large)
    /// is an error here.
    fn enqueue(&self, producer: &FutureProducer) -> Result<DeliveryFuture, KafkaError> {
        let mut record = FutureRecord::to(&self.topic)
            .payload(self.delivery.message.body.as_ref())
            .headers(self.headers.clone());
        if let Some(key) = &self.delivery.receipt.record_key {
            record = record.key(key.as_ref());
        }
        producer.send_result(record).map_err(|(e, _)| e)
    }
}

/// The outcome of a delivery future; a producer gone is `Canceled`.
fn written_or_error<E>(delivery: Result<OwnedDeliveryResult, E>) -> Result<(), KafkaError> {
    match delivery {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e),
        Err(_) => Err(KafkaError::Canceled),
    }
}

/// Whether writing a copy failed for good: the same copy is refused again
/// however long the source waits (too large, not allowed, no such topic
/// name), until someone changes the topic's or the client's settings.
fn permanent(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::MessageBatchTooLarge
                | C::InvalidTopic
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::TransactionalIdAuthorizationFailed
                | C::InvalidRecord
                | C::InvalidRequiredAcks
                | C::UnsupportedForMessageFormat
                | C::PolicyViolation
                | C::InvalidArgument
                | C::Fatal
        )
    )
}

/// Logs a failed write of a copy to `topic` and counts it in
/// `idem_kafka_copy_failures_total{topic,kind}`; the kind.
fn failed(topic: &str, e: &KafkaError) -> &'static str {
    let kind = if permanent(e) {
        "permanent"
    } else {
        "transient"
    };
    metrics::counter!(
        "idem_kafka_copy_failures_total",
        "topic" => topic.to_owned(),
        "kind" => kind,
    )
    .increment(1);
    let error = header_text(&e.to_string()).into_owned();
    if kind == "permanent" {
        tracing::error!(
            topic,
            %error,
            "a copy cannot be written and will not be until the topic's or the client's settings change; the source keeps trying with a growing delay, holding the message's offset"
        );
    } else {
        tracing::warn!(
            topic,
            %error,
            "writing a copy failed; the source tries again with a growing delay, holding the message's offset"
        );
    }
    kind
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
pub(crate) fn client_config(config: &KafkaConfig) -> ClientConfig {
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
/// retry and dead-letter topics with as many partitions as it has, each
/// with the configured replication (default: the brokers').
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
    // -1: the brokers' `default.replication.factor`. A copy's original is
    // committed once the copy is written, so the copy's topic must be as
    // durable as the brokers make topics.
    let replication = config.replication.map_or(-1, i32::from);
    let mut wanted = Vec::new();
    if existing.is_none() {
        wanted.push(config.topic.clone());
    }
    wanted.extend((0..).map_while(|level| config.retry_topic(level)));
    wanted.push(config.dead_letter_topic());
    let new: Vec<NewTopic<'_>> = wanted
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(replication)))
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
            Err((name, RDKafkaErrorCode::InvalidReplicationFactor)) => {
                return Err(ConnectError::Kafka(format!(
                    "creating topic {name}: the brokers refuse {} replicas (set `replication=` in the URL to at most the number of brokers)",
                    config
                        .replication
                        .map_or("their default number of".to_owned(), |n| n.to_string())
                )));
            }
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
