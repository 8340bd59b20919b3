//! Opening connections and declaring the consumer group, with errors that
//! say what is wrong.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::RedisStreamConfig;

/// Why [`RedisStreamSource::connect`](crate::RedisStreamSource::connect) or
/// [`RedisStreamPublisher::connect`](crate::RedisStreamPublisher::connect)
/// failed. Addresses are shown with any password hidden.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No connection could be made (or Redis refused the credentials).
    #[error("Redis is unreachable at {address}: {source}")]
    Unreachable {
        /// The address, password hidden.
        address: String,
        /// Why.
        #[source]
        source: redis::RedisError,
    },
    /// A key this source needs holds something else.
    #[error(
        "key `{key}` at {address} holds a {found}, not a {wanted}; choose another stream name (or dead-letter stream) or delete the key"
    )]
    WrongType {
        /// The key.
        key: String,
        /// What it holds.
        found: String,
        /// What the source needs there.
        wanted: &'static str,
        /// The address, password hidden.
        address: String,
    },
    /// Redis answered a setup command with an error (permissions, say).
    #[error("Redis at {address} refused {what}: {source}")]
    Refused {
        /// The command.
        what: String,
        /// The address, password hidden.
        address: String,
        /// Redis's answer.
        #[source]
        source: redis::RedisError,
    },
}

/// A reconnecting, multiplexed connection whose calls are answered within
/// `answer_within`.
pub(crate) async fn open(
    config: &RedisStreamConfig,
    answer_within: Duration,
) -> Result<ConnectionManager, ConnectError> {
    let unreachable = |source| ConnectError::Unreachable {
        address: config.address(),
        source,
    };
    let client = config.client().map_err(unreachable)?;
    let settings = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(answer_within))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    ConnectionManager::new_with_config(client, settings)
        .await
        .map_err(unreachable)
}

/// Checks that `key` is absent or of type `wanted`.
pub(crate) async fn expect_type(
    conn: &mut ConnectionManager,
    config: &RedisStreamConfig,
    key: &str,
    wanted: &'static str,
) -> Result<(), ConnectError> {
    let found: String = redis::cmd("TYPE")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(|source| refused(config, format!("TYPE {key}"), source))?;
    if found == "none" || found == wanted {
        return Ok(());
    }
    Err(ConnectError::WrongType {
        key: key.to_owned(),
        found,
        wanted,
        address: config.address(),
    })
}

/// Creates the consumer group (and the stream) unless it exists. A new
/// group starts at the stream's beginning, so entries published before the
/// first consumer started are handled too.
pub(crate) async fn declare_group(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
) -> redis::RedisResult<()> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

pub(crate) fn refused(
    config: &RedisStreamConfig,
    what: String,
    source: redis::RedisError,
) -> ConnectError {
    if source.is_io_error() || source.is_connection_dropped() || source.is_timeout() {
        return ConnectError::Unreachable {
            address: config.address(),
            source,
        };
    }
    ConnectError::Refused {
        what,
        address: config.address(),
        source,
    }
}
