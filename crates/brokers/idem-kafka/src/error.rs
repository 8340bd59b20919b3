//! Why a source or publisher could not start.

/// Connecting to Kafka failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No broker answered.
    #[error(
        "no Kafka broker at {brokers} answered ({reason}); check the address and that a broker runs there"
    )]
    Unreachable {
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's error.
        reason: String,
    },
    /// The client could not be set up, or the brokers refused a request.
    #[error("Kafka: {0}")]
    Kafka(String),
}
