//! Publishing entries in the layout the source reads.

use std::sync::Arc;

use idem_consumer::Message;
use redis::aio::ConnectionManager;

use crate::RedisStreamConfig;
use crate::connect::{self, ConnectError};
use crate::entry::fields_of;

/// Adds messages to a stream in the layout [`RedisStreamSource`](crate::RedisStreamSource)
/// reads: `message-id`, `content-type`, one field per header, `body`. For
/// producers and tests. Clones share the connection.
#[derive(Clone)]
pub struct RedisStreamPublisher {
    conn: ConnectionManager,
    stream: Arc<str>,
}

/// Why [`RedisStreamPublisher::publish`] failed: Redis did not confirm the
/// entry.
#[derive(Debug, thiserror::Error)]
#[error("adding an entry to stream `{stream}` failed: {source}")]
pub struct PublishError {
    stream: String,
    #[source]
    source: redis::RedisError,
}

impl RedisStreamPublisher {
    /// Connects to the configured Redis, publishing to the configured
    /// stream (the group is not used).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing behind.
    pub async fn connect(config: &RedisStreamConfig) -> Result<Self, ConnectError> {
        let mut conn = connect::open(config, std::time::Duration::from_secs(5)).await?;
        connect::expect_type(&mut conn, config, &config.stream, "stream").await?;
        Ok(Self::on(conn, &config.stream))
    }

    pub(crate) fn on(conn: ConnectionManager, stream: &str) -> Self {
        Self {
            conn,
            stream: stream.into(),
        }
    }

    /// Adds `message` at the stream's end (`XADD stream * …`) and answers
    /// the entry's id once Redis has it. The message's `attempt` and `lane`
    /// are not carried.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have added the entry; publishing again
    /// with the same `message-id` is safe for a consumer keyed on it.
    pub async fn publish(&self, message: &Message) -> Result<String, PublishError> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&*self.stream).arg("*");
        for (name, value) in fields_of(message) {
            cmd.arg(name.as_ref()).arg(value.as_ref());
        }
        cmd.query_async(&mut self.conn.clone())
            .await
            .map_err(|source| PublishError {
                stream: self.stream.to_string(),
                source,
            })
    }
}
