//! One connection to RabbitMQ: its publishing channel (confirms on) and the
//! queues declared on it.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use parking_lot::Mutex;

use crate::delay::RetryRoute;
use crate::{AmqpConfig, ConnectError};

/// How often a wait for the broker's answer checks that the connection is
/// still open.
const OPEN_CHECK: Duration = Duration::from_millis(100);

/// A connection and its publishing channel. Deliveries keep the link they
/// came from: once it is closed, settling them fails and the broker
/// redelivers them.
pub(crate) struct Link {
    pub(crate) connection: Connection,
    pub(crate) publish: Channel,
    pub(crate) config: AmqpConfig,
    /// The dead-letter and retry queues declared on this connection; a
    /// queue is forgotten when a publish to it fails, so the next use
    /// declares it again (someone may have deleted it).
    declared: Mutex<HashSet<String>>,
}

/// A quorum queue's delivery limit argument.
const DELIVERY_LIMIT: &str = "x-delivery-limit";

/// The dead-letter queue's delivery limit: two billion deliveries, none in
/// practice.
pub(crate) const UNLIMITED_DELIVERIES: i64 = i32::MAX as i64;

impl Link {
    /// Connects and opens the publishing channel, within the answer
    /// timeout; `role` names the connection in RabbitMQ's connection list.
    pub(crate) async fn open(config: &AmqpConfig, role: &str) -> Result<Self, ConnectError> {
        within_answer_timeout(config, Self::open_now(config, role)).await
    }

    async fn open_now(config: &AmqpConfig, role: &str) -> Result<Self, ConnectError> {
        let props = ConnectionProperties::default()
            .with_connection_name(format!("idem-amqp {role} {}", config.queue()).into());
        let connection = Connection::connect_uri(config.uri.clone(), props)
            .await
            .map_err(|e| ConnectError::from_lapin(config, "connecting", None, &e))?;
        let publish = connection
            .create_channel()
            .await
            .map_err(|e| ConnectError::from_lapin(config, "opening a channel", None, &e))?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| {
                ConnectError::from_lapin(config, "enabling publisher confirms", None, &e)
            })?;
        Ok(Self {
            connection,
            publish,
            config: config.clone(),
            declared: Mutex::default(),
        })
    }

    /// Whether the connection and its publishing channel are still open.
    pub(crate) fn is_open(&self) -> bool {
        self.connection.status().connected() && self.publish.status().connected()
    }

    /// Waits for the broker's answer to `what` while the connection is
    /// open, and at most the configured answer timeout. lapin can leave an
    /// answer pending forever (a publisher confirm, a reply) when the
    /// connection breaks just as the request goes out, and a broker or link
    /// that stalls without closing answers nothing until the heartbeat
    /// notices; either would hold the message, and its permit, for good.
    pub(crate) async fn answer<T>(
        &self,
        what: &str,
        answer: impl Future<Output = T>,
    ) -> Result<T, String> {
        let limit = self.config.answer_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        tokio::pin!(answer);
        loop {
            tokio::select! {
                biased;
                r = &mut answer => return Ok(r),
                () = tokio::time::sleep(OPEN_CHECK) => {
                    if !self.is_open() {
                        return Err(format!(
                            "the connection closed before the broker answered {what}"
                        ));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(format!(
                            "the broker did not answer {what} within {} ms (answer_timeout_ms)",
                            limit.as_millis()
                        ));
                    }
                }
            }
        }
    }

    /// Makes sure the work queue exists: one that exists is used as it is
    /// (whatever its arguments: classic, quorum, with a length limit);
    /// a missing one is declared durable.
    pub(crate) async fn declare_work_queue(&self) -> Result<(), ConnectError> {
        let queue = self.config.queue();
        if !self.exists(queue).await? {
            self.declare(queue, FieldTable::default()).await?;
        }
        Ok(())
    }

    /// Whether `queue` exists (a passive declare).
    async fn exists(&self, queue: &str) -> Result<bool, ConnectError> {
        let check = self.channel(queue).await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        // A failed passive declare closes its channel, so it gets one of its own.
        let exists = self
            .answer(
                &format!("checking queue `{queue}`"),
                check.queue_declare(queue.into(), passive, FieldTable::default()),
            )
            .await
            .map_err(|reason| {
                self.config
                    .broker_error(&format!("checking queue `{queue}`"), reason)
            })?
            .is_ok();
        let _ = self
            .answer("closing a channel", check.close(200, "OK".into()))
            .await;
        Ok(exists)
    }

    /// The dead-letter queue, declared unless this connection did already:
    /// a quorum queue, replicated where the broker is a cluster, with no
    /// delivery limit. RabbitMQ 4 gives a quorum queue a limit of 20
    /// deliveries unless it sets `x-delivery-limit`, and then drops the
    /// message (a dead-letter queue has no dead-letter exchange to catch
    /// it); every dead letter `idem dlq` reads and puts back counts one.
    /// So it is declared with the largest limit there is,
    /// [`UNLIMITED_DELIVERIES`]: RabbitMQ 4 reads -1 as "no limit", but 3.x
    /// takes -1 as a limit already reached and drops each message at its
    /// first return. A broker that refuses the argument gets the queue
    /// without it, as does one an earlier idem declared without it (which
    /// on RabbitMQ 4 needs a policy: README, "RabbitMQ").
    pub(crate) async fn dead_letter_queue(&self) -> Result<String, ConnectError> {
        let name = self.config.dead_letter_queue();
        if self.declared.lock().contains(&name) {
            return Ok(name);
        }
        let quorum = || {
            let mut args = FieldTable::default();
            args.insert("x-queue-type".into(), text("quorum"));
            args
        };
        let mut unlimited = quorum();
        unlimited.insert(
            DELIVERY_LIMIT.into(),
            AMQPValue::LongLongInt(UNLIMITED_DELIVERIES),
        );
        match self.declare(&name, unlimited).await {
            Ok(()) => {}
            // Declared earlier without the limit, or a broker that takes
            // none: the queue as it is, if it is a quorum queue.
            Err(ConnectError::QueueArguments { reason, .. }) => {
                self.declare(&name, quorum()).await?;
                tracing::warn!(queue = %name, %reason, "the dead-letter queue has no delivery limit of idem's: on RabbitMQ 4 give it a policy (README, \"RabbitMQ\"), or it drops a letter read 20 times");
            }
            Err(e) => return Err(e),
        }
        self.declared.lock().insert(name.clone());
        Ok(name)
    }

    /// The retry queue for `route`, declared on first use: a quorum queue
    /// whose expired messages go back to the work queue. RabbitMQ moves
    /// them with at-least-once dead-lettering (confirmed by the work queue
    /// before they leave; a classic queue's dead-lettering may drop them),
    /// which needs `x-overflow=reject-publish`; no length limit is set, so
    /// nothing is refused for it.
    pub(crate) async fn retry_queue(&self, route: &RetryRoute) -> Result<String, ConnectError> {
        let queue = self.config.queue();
        let name = route.queue(queue);
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), text("quorum"));
        args.insert("x-dead-letter-exchange".into(), text(""));
        args.insert("x-dead-letter-routing-key".into(), text(queue));
        args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        args.insert("x-overflow".into(), text("reject-publish"));
        if route.queue_ttl {
            let ttl = i64::try_from(route.ttl_ms).unwrap_or(i64::MAX);
            args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
        }
        self.ensure(&name, args).await?;
        Ok(name)
    }

    async fn ensure(&self, queue: &str, args: FieldTable) -> Result<(), ConnectError> {
        if self.declared.lock().contains(queue) {
            return Ok(());
        }
        self.declare(queue, args).await?;
        self.declared.lock().insert(queue.to_owned());
        Ok(())
    }

    /// Declares `queue` durable with `args`, on a channel of its own (a
    /// refused declare closes the channel).
    async fn declare(&self, queue: &str, args: FieldTable) -> Result<(), ConnectError> {
        let what = format!("declaring queue `{queue}`");
        let channel = self.channel(queue).await?;
        let declared = self
            .answer(
                &what,
                channel.queue_declare(queue.into(), QueueDeclareOptions::durable(), args),
            )
            .await;
        let _ = self
            .answer("closing a channel", channel.close(200, "OK".into()))
            .await;
        match declared {
            Ok(r) => r
                .map(drop)
                .map_err(|e| ConnectError::from_lapin(&self.config, &what, Some(queue), &e)),
            Err(reason) => Err(self.config.broker_error(&what, reason)),
        }
    }

    async fn channel(&self, queue: &str) -> Result<Channel, ConnectError> {
        let what = format!("opening a channel to declare `{queue}`");
        match self.answer(&what, self.connection.create_channel()).await {
            Ok(r) => r.map_err(|e| ConnectError::from_lapin(&self.config, &what, None, &e)),
            Err(reason) => Err(self.config.broker_error(&what, reason)),
        }
    }

    /// Publishes to `queue` through the default exchange and waits for the
    /// broker's confirmation; a message that no queue took is an error.
    pub(crate) async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), String> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let what = format!("a publish to `{queue}`");
        let confirm = self
            .answer(
                &what,
                self.publish.basic_publish(
                    ShortString::from(""),
                    queue.into(),
                    options,
                    body,
                    props,
                ),
            )
            .await?
            .map_err(|e| e.to_string())?;
        let confirmation = self
            .answer(&what, confirm)
            .await?
            .map_err(|e| e.to_string())?;
        let refused = if confirmation.is_nack() {
            Some("the broker refused the message (nack)".to_owned())
        } else {
            confirmation.take_message().map(|returned| {
                format!(
                    "no queue took the message ({}); does `{queue}` exist?",
                    returned.reply_text
                )
            })
        };
        match refused {
            Some(why) => {
                self.declared.lock().remove(queue);
                Err(why)
            }
            None => Ok(()),
        }
    }
}

/// `setup`, or an unreachable broker if it takes longer than the answer
/// timeout (lapin's connect can wait for good on a broker that stops
/// answering mid-handshake).
pub(crate) async fn within_answer_timeout<T>(
    config: &AmqpConfig,
    setup: impl Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match tokio::time::timeout(config.answer_timeout, setup).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Unreachable {
            address: config.address(),
            reason: format!(
                "no answer within {} ms (answer_timeout_ms)",
                config.answer_timeout.as_millis()
            ),
        }),
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}
