//! [`AmqpPublisher`]: confirmed publishing, for producers and tests.

use idem_consumer::Message;
use lapin::BasicProperties;

use crate::link::Link;
use crate::properties::{PERSISTENT, table};
use crate::{AmqpConfig, ConnectError, PublishError};

/// Publishes messages to the configured queue through the default exchange,
/// with publisher confirms: [`publish`](AmqpPublisher::publish) returns only
/// once the broker has the message (persistent, `message_id` set from
/// [`Message::id`]).
///
/// ```no_run
/// use idem_amqp::{AmqpConfig, AmqpPublisher};
/// use idem_consumer::Message;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let config = AmqpConfig::from_url("amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders")?;
/// let publisher = AmqpPublisher::connect(&config).await?;
/// let mut message = Message::new(r#"{"order":42}"#);
/// message.id = Some("order-42".into());
/// message.content_type = Some("application/json".into());
/// publisher.publish(&message).await?;
/// # Ok(()) }
/// ```
pub struct AmqpPublisher {
    link: Link,
}

impl AmqpPublisher {
    /// Connects and makes sure the queue exists (declared durable when
    /// missing).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-made connection.
    pub async fn connect(config: &AmqpConfig) -> Result<Self, ConnectError> {
        let link = Link::open(config, "publisher").await?;
        link.declare_work_queue().await?;
        Ok(Self { link })
    }

    /// Publishes `message` (its id as `message_id`, its content type and
    /// headers, persistent) and waits for the broker's confirmation.
    ///
    /// # Cancel safety
    ///
    /// When dropped after the message was sent, the broker may have it
    /// although no confirmation was seen: publish it again (the consumer's
    /// guard absorbs the duplicate).
    pub async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let mut props = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_headers(table(&message.headers));
        if let Some(id) = &message.id {
            props = props.with_message_id(id.as_str().into());
        }
        if let Some(ct) = &message.content_type {
            props = props.with_content_type(ct.as_str().into());
        }
        let queue = self.link.config.queue();
        self.link
            .publish(queue, &message.body, props)
            .await
            .map_err(|reason| PublishError {
                queue: queue.to_owned(),
                reason,
            })
    }

    /// Closes the connection.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the connection to close when the
    /// publisher is dropped.
    pub async fn close(self) {
        let _ = self.link.connection.close(200, "closing".into()).await;
    }
}
