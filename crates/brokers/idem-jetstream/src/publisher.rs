//! Publishing with a message id and the stream's acknowledgement.

use std::str::FromStr;

use async_nats::jetstream::context;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use url::Url;

use crate::config::ConfigError;
use crate::connect::{self, ConnectError};

/// Publishes messages with a `Nats-Msg-Id` (the id the stream drops
/// duplicates on, within its duplicate window, 2 minutes by default) and
/// waits for the stream's acknowledgement. Clones share the connection.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_jetstream::JetStreamPublisher;
///
/// let publisher = JetStreamPublisher::connect("nats://127.0.0.1:4222").await?;
/// let published = publisher.publish("orders.paid", "order-7", &[], "{}").await?;
/// assert!(!published.duplicate);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: context::Context,
}

/// What the stream answered to a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The stream that stored the message.
    pub stream: String,
    /// Its sequence number there (the first copy's, for a duplicate).
    pub sequence: u64,
    /// The stream already had a message with this id within its duplicate
    /// window and dropped this one.
    pub duplicate: bool,
}

/// A publish was not acknowledged by a stream.
#[derive(Debug, thiserror::Error)]
#[error("publishing to `{subject}` failed: {reason}")]
pub struct PublishError {
    subject: String,
    reason: String,
}

impl JetStreamPublisher {
    /// Connects to the server at `url` (`nats://host:port`; a query, as in
    /// a consume URL, is ignored).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the connection being made.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let mut server = Url::parse(url).map_err(|e| ConnectError::Incompatible {
            what: "the server URL".into(),
            reason: ConfigError::new(format!("not a URL ({e})")).to_string(),
        })?;
        server.set_query(None);
        Ok(Self::from_context(connect::jetstream(&server).await?))
    }

    pub(crate) fn from_context(context: context::Context) -> Self {
        Self { context }
    }

    /// Publishes `body` to `subject` with message id `id` and `headers`,
    /// and waits for the stream's acknowledgement. A header NATS cannot
    /// carry (CR or LF in a value or the id, `:` or a control character in
    /// a name) is an error, and nothing is sent.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the message was sent, the stream may
    /// have stored it; publish again with the same id to be sure: the
    /// stream drops the copy within its duplicate window.
    pub async fn publish(
        &self,
        subject: &str,
        id: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Published, PublishError> {
        // The fallible constructors: `HeaderMap::append` panics on a name
        // or value NATS cannot carry (CR, LF, `:` in a name).
        let mut map = HeaderMap::new();
        let header = |name: &str, value: &str| -> Result<(HeaderName, HeaderValue), String> {
            let name = HeaderName::from_str(name).map_err(|e| format!("header `{name}`: {e}"))?;
            let value =
                HeaderValue::from_str(value).map_err(|e| format!("header `{name}`: {e}"))?;
            Ok((name, value))
        };
        let invalid = |reason: String| PublishError {
            subject: subject.to_owned(),
            reason,
        };
        for (name, value) in headers {
            let (name, value) = header(name, value).map_err(invalid)?;
            map.append(name, value);
        }
        let (name, value) = header("Nats-Msg-Id", id).map_err(invalid)?;
        map.insert(name, value);
        publish_acked(&self.context, subject.to_owned(), map, body.into()).await
    }
}

/// Publishes and waits for the stream's acknowledgement.
pub(crate) async fn publish_acked(
    context: &context::Context,
    subject: String,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Published, PublishError> {
    let fail = |reason: String| PublishError {
        subject: subject.clone(),
        reason,
    };
    let ack = context
        .publish_with_headers(subject.clone(), headers, body)
        .await
        .map_err(|e| fail(e.to_string()))?
        .await
        .map_err(|e| fail(e.to_string()))?;
    Ok(Published {
        stream: ack.stream,
        sequence: ack.sequence,
        duplicate: ack.duplicate,
    })
}
