//! Why connecting or publishing failed, in words an operator can act on.

use lapin::ErrorKind;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

use crate::AmqpConfig;

/// Connecting to RabbitMQ or declaring the queues failed. Messages name the
/// address, vhost, user and queue, never the password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No broker answered at the address.
    #[error("RabbitMQ is unreachable at {address}: {reason}")]
    Unreachable {
        /// `HOST:PORT`.
        address: String,
        /// What the network said.
        reason: String,
    },
    /// The broker refused the user or the vhost.
    #[error(
        "RabbitMQ at {address} refused user `{user}` on vhost `{vhost}`: {reason} \
         (check the user name, password and the user's permissions on the vhost)"
    )]
    AccessRefused {
        /// `HOST:PORT`.
        address: String,
        /// The user.
        user: String,
        /// The vhost.
        vhost: String,
        /// What the broker said.
        reason: String,
    },
    /// A queue exists with arguments other than the ones idem declares.
    #[error(
        "queue `{queue}` exists with other arguments than idem declares ({reason}); \
         idem declares its dead-letter and retry queues as quorum queues (RabbitMQ 3.10 \
         or later), so a classic one made by an older idem cannot be used: move its \
         messages elsewhere (a shovel) and delete it (`rabbitmqctl delete_queue {queue}`), \
         or choose other names (the `queue` and `dead_letter` URL parameters)"
    )]
    QueueArguments {
        /// The queue.
        queue: String,
        /// What the broker said about the difference.
        reason: String,
    },
    /// Any other broker error while setting up.
    #[error("{what} failed on RabbitMQ at {address}: {reason}")]
    Broker {
        /// What was being done.
        what: String,
        /// `HOST:PORT`.
        address: String,
        /// What the broker or client said.
        reason: String,
    },
}

impl ConnectError {
    /// Classifies a lapin error met while connecting (`queue` is `None`) or
    /// while declaring `queue`.
    pub(crate) fn from_lapin(
        config: &AmqpConfig,
        what: &str,
        queue: Option<&str>,
        e: &lapin::Error,
    ) -> Self {
        let address = config.address();
        match e.kind() {
            ErrorKind::IOError(io) => Self::Unreachable {
                address,
                reason: io.to_string(),
            },
            ErrorKind::ProtocolError(amqp) => {
                let reason = amqp.get_message().to_string();
                match (amqp.kind(), queue) {
                    (AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED), None) => {
                        Self::AccessRefused {
                            address,
                            user: config.user().into(),
                            vhost: config.vhost().into(),
                            reason,
                        }
                    }
                    (AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED), Some(q)) => {
                        Self::QueueArguments {
                            queue: q.into(),
                            reason,
                        }
                    }
                    _ => Self::Broker {
                        what: what.into(),
                        address,
                        reason,
                    },
                }
            }
            _ => Self::Broker {
                what: what.into(),
                address,
                reason: e.to_string(),
            },
        }
    }
}

/// A publish the broker did not confirm.
#[derive(Debug, thiserror::Error)]
#[error("publishing to `{queue}` failed: {reason}")]
pub struct PublishError {
    pub(crate) queue: String,
    pub(crate) reason: String,
}
