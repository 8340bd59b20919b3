//! What to connect to and how: parsed from an `amqp://` URL.

use std::fmt;
use std::time::Duration;

use lapin::uri::AMQPUri;

use crate::ConnectError;

/// The URL form, quoted in every configuration error.
const URL_FORM: &str = "amqp://USER:PASSWORD@HOST:5672/VHOST?queue=NAME \
     (optional: dead_letter=NAME, max_hold_ms=MS, answer_timeout_ms=MS, heartbeat=SECONDS, connection_timeout=MS, \
     frame_max=BYTES, channel_max=N, auth_mechanism=NAME; the default vhost `/` is `%2f`)";

/// Where the source consumes, and how.
///
/// ```
/// use idem_amqp::AmqpConfig;
///
/// let config = AmqpConfig::from_url("amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders")?
///     .concurrency(64);
/// assert_eq!(config.queue(), "orders");
/// assert_eq!(config.dead_letter_queue(), "orders.dead-letter");
/// # Ok::<_, idem_amqp::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AmqpConfig {
    pub(crate) uri: AMQPUri,
    pub(crate) queue: String,
    pub(crate) dead_letter: Option<String>,
    pub(crate) concurrency: usize,
    pub(crate) lease: Duration,
    pub(crate) max_hold: Duration,
    pub(crate) answer_timeout: Duration,
}

/// How long a delivery is held unsettled at most by default: a margin under
/// RabbitMQ's default `consumer_timeout` of 30 minutes.
const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(25 * 60);

/// How long the source waits for the broker's answer by default.
const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

impl AmqpConfig {
    /// Parses `amqp[s]://USER:PASSWORD@HOST:PORT/VHOST?queue=NAME`.
    ///
    /// Query parameters: `queue` (required), `dead_letter` (default
    /// `<queue>.dead-letter`), `max_hold_ms` (see
    /// [`max_hold`](AmqpConfig::max_hold)), `answer_timeout_ms` (see
    /// [`answer_timeout`](AmqpConfig::answer_timeout)), and the connection's own `heartbeat`,
    /// `connection_timeout`, `frame_max`, `channel_max` and
    /// `auth_mechanism`. Anything else is refused with the parameter's name.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        let parsed = url::Url::parse(url).map_err(|e| ConfigError::new(format!("{e}")))?;
        if !matches!(parsed.scheme(), "amqp" | "amqps") {
            return Err(ConfigError::new(format!(
                "the scheme is `{}`, not amqp or amqps",
                parsed.scheme()
            )));
        }
        let mut queue = None;
        let mut dead_letter = None;
        let mut max_hold = DEFAULT_MAX_HOLD;
        let mut answer_timeout = DEFAULT_ANSWER_TIMEOUT;
        let mut passed = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "queue" => queue = Some(value.into_owned()),
                "dead_letter" => dead_letter = Some(value.into_owned()),
                "max_hold_ms" => match value.parse::<u64>() {
                    Ok(ms) if ms > 0 => max_hold = Duration::from_millis(ms),
                    _ => {
                        return Err(ConfigError::new(format!(
                            "`max_hold_ms={value}` is not a positive number of milliseconds"
                        )));
                    }
                },
                "answer_timeout_ms" => match value.parse::<u64>() {
                    Ok(ms) if ms > 0 => answer_timeout = Duration::from_millis(ms),
                    _ => {
                        return Err(ConfigError::new(format!(
                            "`answer_timeout_ms={value}` is not a positive number of milliseconds"
                        )));
                    }
                },
                "heartbeat" | "connection_timeout" | "frame_max" | "channel_max"
                | "auth_mechanism" => {
                    passed.append_pair(&name, &value);
                }
                other => {
                    return Err(ConfigError::new(format!(
                        "unknown query parameter `{other}`"
                    )));
                }
            }
        }
        let queue = match queue {
            Some(q) if !q.is_empty() => q,
            _ => return Err(ConfigError::new("the query parameter `queue` is missing")),
        };
        for name in std::iter::once(&queue).chain(dead_letter.as_ref()) {
            check_queue_name(name)?;
        }
        // The URI parser takes hosts by domain name only (an IP address
        // would become `localhost`), so the host is set from the URL here.
        let mut base = parsed.clone();
        let passed = passed.finish();
        base.set_query((!passed.is_empty()).then_some(passed.as_str()));
        let mut uri: AMQPUri = base
            .as_str()
            .parse()
            .map_err(|e: String| ConfigError::new(e.replace(base.as_str(), "the URL")))?;
        if let Some(host) = parsed.host_str() {
            uri.authority.host = host.trim_start_matches('[').trim_end_matches(']').into();
        }
        Ok(Self {
            uri,
            queue,
            dead_letter,
            concurrency: 16,
            lease: Duration::from_secs(30),
            max_hold,
            answer_timeout,
        })
    }

    /// The dead-letter queue, in the same vhost (default
    /// `<queue>.dead-letter`).
    pub fn dead_letter(mut self, name: impl Into<String>) -> Self {
        self.dead_letter = Some(name.into());
        self
    }

    /// Messages held at once: the channel's prefetch (`basic.qos`); default
    /// 16, between 1 and 65 535.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.clamp(1, usize::from(u16::MAX));
        self
    }

    /// The guard's lease. RabbitMQ redelivers an unacked message only when
    /// its channel closes, so the lease does not change what the source
    /// does.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest the runner may hold one delivery unsettled (a retry
    /// waiting in place, a slow handler's wait): default 25 minutes, under
    /// RabbitMQ's `consumer_timeout` (30 minutes by default), past which
    /// the broker closes the channel and redelivers everything unacked on
    /// it. The runner hands longer waits to a retry queue instead. Set it
    /// under the broker's `consumer_timeout` when that is shorter
    /// (`rabbitmqctl environment | grep consumer_timeout`).
    pub fn max_hold(mut self, hold: Duration) -> Self {
        self.max_hold = hold;
        self
    }

    /// How long the source waits for the broker's answer to a connect, a
    /// declare or a publish (its confirm) before counting it as failed:
    /// default 30 s. A failed republish hands its message back; a failed
    /// connect is tried again. A link that stalls without closing would
    /// otherwise hold its messages until the heartbeat notices, and lapin
    /// can leave an answer pending for good when the connection breaks as
    /// the request goes out.
    pub fn answer_timeout(mut self, limit: Duration) -> Self {
        self.answer_timeout = limit.max(Duration::from_millis(1));
        self
    }

    /// `what` failed at the broker for `reason`.
    pub(crate) fn broker_error(&self, what: &str, reason: String) -> ConnectError {
        ConnectError::Broker {
            what: what.to_owned(),
            address: self.address(),
            reason,
        }
    }

    /// The longest a delivery is held unsettled.
    pub fn max_hold_limit(&self) -> Duration {
        self.max_hold
    }

    /// The work queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> String {
        self.dead_letter
            .clone()
            .unwrap_or_else(|| format!("{}.dead-letter", self.queue))
    }

    /// Every queue the source may declare: the work queue, the dead-letter
    /// queue and the retry queues (to list or remove them).
    pub fn queues(&self) -> Vec<String> {
        let mut all = vec![self.queue.clone(), self.dead_letter_queue()];
        all.extend(crate::delay::retry_queues(&self.queue));
        all
    }

    /// Messages held at once.
    pub fn concurrency_limit(&self) -> usize {
        self.concurrency
    }

    /// `HOST:PORT`, for messages (never the password).
    pub fn address(&self) -> String {
        let host = &self.uri.authority.host;
        let port = self.uri.authority.port;
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }

    /// The virtual host.
    pub fn vhost(&self) -> &str {
        &self.uri.vhost
    }

    /// The user name the connection logs in with.
    pub fn user(&self) -> &str {
        &self.uri.authority.userinfo.username
    }
}

impl fmt::Debug for AmqpConfig {
    // The URI holds the password: show everything but it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("address", &self.address())
            .field("vhost", &self.vhost())
            .field("user", &self.user())
            .field("queue", &self.queue)
            .field("dead_letter", &self.dead_letter_queue())
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("max_hold", &self.max_hold)
            .finish()
    }
}

fn check_queue_name(name: &str) -> Result<(), ConfigError> {
    // Retry queues add up to 14 bytes (`.retry-v2.long`) to the name; AMQP
    // names are at most 255 bytes.
    const LIMIT: usize = 255 - crate::delay::RETRY_INFIX.len() - crate::delay::LONGEST_SUFFIX.len();
    if name.is_empty() || name.len() > LIMIT {
        return Err(ConfigError::new(format!(
            "the queue name `{name}` is {} bytes; it must be 1 to {LIMIT}",
            name.len()
        )));
    }
    if name.starts_with("amq.") {
        return Err(ConfigError::new(format!(
            "the queue name `{name}` starts with `amq.`, which RabbitMQ reserves"
        )));
    }
    Ok(())
}

/// An `amqp://` URL that cannot be used. The message says what is wrong and
/// shows the URL form.
#[derive(Debug, thiserror::Error)]
#[error("invalid AMQP source URL: {what}; expected {URL_FORM}")]
pub struct ConfigError {
    what: String,
}

impl ConfigError {
    fn new(what: impl Into<String>) -> Self {
        Self { what: what.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_a_queue_parses_with_its_address_vhost_and_defaults() {
        let c = AmqpConfig::from_url(
            "amqp://guest:secret@127.0.0.1:5673/%2f?queue=orders&heartbeat=10",
        )
        .unwrap();
        assert_eq!(c.address(), "127.0.0.1:5673");
        assert_eq!(c.vhost(), "/");
        assert_eq!(c.user(), "guest");
        assert_eq!(c.queue(), "orders");
        assert_eq!(c.dead_letter_queue(), "orders.dead-letter");
        let queues = c.queues();
        assert_eq!(queues.len(), 2 + 17);
        assert!(queues.contains(&"orders.retry-v2.100ms".to_owned()));
        assert!(queues.contains(&"orders.retry-v2.long".to_owned()));
        assert_eq!(c.uri.query.heartbeat, Some(10));
        assert!(!format!("{c:?}").contains("secret"));
        let c = c.dead_letter("parked").concurrency(0);
        assert_eq!(c.dead_letter_queue(), "parked");
        assert_eq!(c.concurrency_limit(), 1);
        assert_eq!(c.max_hold_limit(), Duration::from_secs(25 * 60));
    }

    #[test]
    fn the_hold_limit_is_set_in_the_url_or_the_builder() {
        let c = AmqpConfig::from_url("amqp://127.0.0.1/%2f?queue=a&max_hold_ms=60000").unwrap();
        assert_eq!(c.max_hold_limit(), Duration::from_secs(60));
        let c = c.max_hold(Duration::from_secs(5));
        assert_eq!(c.max_hold_limit(), Duration::from_secs(5));
        let e = AmqpConfig::from_url("amqp://127.0.0.1/%2f?queue=a&max_hold_ms=soon")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`max_hold_ms=soon`") && e.contains("max_hold_ms=MS"),
            "{e}"
        );
    }

    #[test]
    fn the_answer_timeout_is_set_in_the_url_or_the_builder() {
        let c = AmqpConfig::from_url("amqp://127.0.0.1/%2f?queue=a").unwrap();
        assert_eq!(c.answer_timeout, Duration::from_secs(30));
        let c =
            AmqpConfig::from_url("amqp://127.0.0.1/%2f?queue=a&answer_timeout_ms=2500").unwrap();
        assert_eq!(c.answer_timeout, Duration::from_millis(2500));
        assert_eq!(
            c.answer_timeout(Duration::ZERO).answer_timeout,
            Duration::from_millis(1)
        );
        for bad in ["0", "soon"] {
            let e = AmqpConfig::from_url(&format!(
                "amqp://127.0.0.1/%2f?queue=a&answer_timeout_ms={bad}"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(&format!("`answer_timeout_ms={bad}`"))
                    && e.contains("answer_timeout_ms=MS"),
                "{e}"
            );
        }
    }

    #[test]
    fn missing_or_unknown_parameters_are_named_with_the_url_form() {
        let e = AmqpConfig::from_url("amqp://127.0.0.1/%2f")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`queue` is missing") && e.contains("?queue=NAME"),
            "{e}"
        );
        let e = AmqpConfig::from_url("amqp://127.0.0.1/%2f?queue=a&prefetch=3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown query parameter `prefetch`"), "{e}");
        let e = AmqpConfig::from_url("nats://127.0.0.1?queue=a")
            .unwrap_err()
            .to_string();
        assert!(e.contains("scheme is `nats`"), "{e}");
        let e = AmqpConfig::from_url("amqp://127.0.0.1/%2f?queue=amq.x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("reserves"), "{e}");
    }
}
