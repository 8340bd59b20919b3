//! Publishing with a key, the broker's acknowledgement, and the message id
//! it gave.

use std::sync::Arc;

use bytes::Bytes;
use rocketmq_client_rust::{ClientConfig, DefaultMQProducer};
use rocketmq_model::common::message::message_single::Message as RocketMessage;
use tokio::sync::RwLock;

use crate::client::{self, ClientHost, ConnectError};
use crate::config::ConfigError;

/// Publishes messages with their key (RocketMQ `KEYS`, the idempotency
/// key the source reads by default) and user properties, and waits for
/// the broker to store each. Clones share the producer.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_rocketmq::RocketMqPublisher;
///
/// let publisher = RocketMqPublisher::connect("rocketmq://127.0.0.1:9876").await?;
/// let published = publisher
///     .publish("orders", "order-7", &[("content-type", "application/json")], "{}")
///     .await?;
/// println!("stored as {}", published.message_id);
/// publisher.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RocketMqPublisher {
    producer: Arc<RwLock<DefaultMQProducer>>,
    // Keeps the client's runtime alive as long as a clone is.
    host: Arc<ClientHost>,
}

/// What the broker answered to a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The message id the client gave it (`UNIQ_KEY`), which the broker
    /// keeps through retries.
    pub message_id: String,
    /// The queue that stored it.
    pub queue_id: i32,
    /// Its offset in that queue.
    pub queue_offset: u64,
}

/// A publish was not acknowledged by the broker.
#[derive(Debug, thiserror::Error)]
#[error("publishing to `{topic}` failed: {reason}")]
pub struct PublishError {
    topic: String,
    reason: String,
}

impl RocketMqPublisher {
    /// Starts a producer against the name servers of `url`
    /// (`rocketmq://host:port[,host:port]`; a query, as in a consume URL,
    /// is ignored). Topics are created by the broker on first publish when
    /// it allows that (`autoCreateTopicEnable`, its default).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the producer being started.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let base = url.split('?').next().unwrap_or_default();
        let config = crate::RocketMqConfig::from_url(&format!("{base}?topic=t&group=g"))
            .map_err(|e| ConnectError::Config(ConfigError::new(e.to_string())))?;
        let host = ClientHost::new(0)?;
        Box::pin(Self::start(host, config.name_servers(), "idem-publisher")).await
    }

    pub(crate) async fn start(
        host: Arc<ClientHost>,
        name_servers: &str,
        group: &str,
    ) -> Result<Self, ConnectError> {
        client::probe(name_servers).await?;
        let mut client_config = ClientConfig::new();
        client_config.set_instance_name(client::instance_name("producer").into());
        let mut producer = DefaultMQProducer::builder(host.runtime())
            .client_config(client_config)
            .name_server_addr(name_servers.to_owned())
            .producer_group(group.to_owned())
            .send_msg_timeout(5000)
            .build();
        // Boxed, here and at every client call: the client's futures are
        // deep enough to overflow the compiler's layout query in callers.
        Box::pin(producer.start())
            .await
            .map_err(|e| ConnectError::Client {
                what: "producer",
                reason: e.to_string(),
            })?;
        Ok(Self {
            producer: Arc::new(RwLock::new(producer)),
            host,
        })
    }

    /// Publishes `body` to `topic` with key `key` and `properties` (user
    /// properties: RocketMQ refuses the names it uses itself, such as
    /// `KEYS` or `TAGS`), and waits for the broker's acknowledgement.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the message was sent, the broker may
    /// have stored it; publishing again may store a second copy, which the
    /// consumer's guard absorbs by its key.
    pub async fn publish(
        &self,
        topic: &str,
        key: &str,
        properties: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Published, PublishError> {
        let fail = |reason: String| PublishError {
            topic: topic.to_owned(),
            reason,
        };
        let mut builder = RocketMessage::builder().topic(topic).body(body.into());
        if !key.is_empty() {
            builder = builder.key(key);
        }
        for (name, value) in properties {
            builder = builder
                .raw_property(*name, *value)
                .map_err(|e| fail(e.to_string()))?;
        }
        let message = builder.build().map_err(|e| fail(e.to_string()))?;
        self.send(message).await.map_err(fail)
    }

    /// Creates `topic` with `queues` read and write queues on every broker
    /// that serves the default topic `TBW102`, or updates it (what a
    /// first publish does implicitly, with the broker's default queue
    /// count). A consumer that subscribes before its topic exists finds no
    /// queues until its next rebalance, 20 s later.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future mid-way may leave the topic created on some
    /// brokers; creating it again completes it.
    pub async fn create_topic(&self, topic: &str, queues: u32) -> Result<(), PublishError> {
        let queues = i32::try_from(queues.max(1)).unwrap_or(i32::MAX);
        let mut producer = self.producer.write().await;
        Box::pin(producer.create_topic("TBW102", topic, queues, Default::default()))
            .await
            .map_err(|e| PublishError {
                topic: topic.to_owned(),
                reason: format!("creating it: {e}"),
            })
    }

    /// Sends a built message and waits for the broker.
    pub(crate) async fn send(&self, message: RocketMessage) -> Result<Published, String> {
        let producer = self.producer.read().await;
        let result = Box::pin(producer.send(message))
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the broker sent no result".to_owned())?;
        if !matches!(
            result.send_status,
            rocketmq_model::result::SendStatus::SendOk
        ) {
            return Err(format!("the broker answered {:?}", result.send_status));
        }
        Ok(Published {
            message_id: result.msg_id.map(|s| s.to_string()).unwrap_or_default(),
            queue_id: result.message_queue.as_ref().map_or(-1, |q| q.queue_id()),
            queue_offset: result.queue_offset,
        })
    }

    /// Stops the producer and, once no clone needs it, the client's runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future mid-way leaves the producer stopped or not;
    /// dropping the last clone ends the runtime either way.
    pub async fn shutdown(&self) {
        Box::pin(self.producer.write().await.shutdown()).await;
        if Arc::strong_count(&self.host) == 1 {
            self.host.shutdown().await;
        }
    }
}
