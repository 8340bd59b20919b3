//! What a broker delivered.

use bytes::Bytes;

/// A message as the runner and the handler see it, whatever the broker.
#[derive(Clone, Debug, Default)]
pub struct Message {
    /// The producer's id for the message, when the broker carries one: AMQP
    /// `message_id`, NATS `Nats-Msg-Id`, a Redis Streams entry's
    /// `message-id` field.
    pub id: Option<String>,
    /// The broker's headers, in the order they came.
    pub headers: Vec<(String, Bytes)>,
    /// The payload, unchanged.
    pub body: Bytes,
    /// The payload's media type, when the broker carries one.
    pub content_type: Option<String>,
    /// Which handler attempt this delivery is, 1 for the first, as the
    /// source counts them across redeliveries and restarts.
    pub attempt: u32,
    /// The ordering lane (a partition, an ordering key), when the broker
    /// gives order within one: messages of a lane are handled one after
    /// another when the runner is [`ordered`](crate::Runner::ordered).
    pub lane: Option<Bytes>,
    /// The idempotency key: set by the runner before it calls the handler
    /// (sources leave it empty).
    pub key: Option<Bytes>,
}

impl Message {
    /// A message with this body, attempt 1, and nothing else.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            attempt: 1,
            ..Self::default()
        }
    }

    /// The first header named `name`, compared without regard to case.
    pub fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }
}

/// A message with the broker's handle for acknowledging it.
#[derive(Debug)]
pub struct Delivery<R> {
    /// The message.
    pub message: Message,
    /// What the source needs to ack, retry or dead-letter it.
    pub receipt: R,
}
