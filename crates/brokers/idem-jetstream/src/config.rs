//! What to consume: parsed from a `nats://` URL, adjusted with setters.

use std::time::Duration;

use url::Url;

use crate::subject;

/// The URL form, quoted in every error about one.
pub(crate) const URL_FORM: &str = "nats://[user:password@]host:port (tls:// for TLS)?stream=NAME&consumer=NAME[&subject=SUBJECT][&dead_letter=SUBJECT][&ack_wait=30s]";

/// Where and how to consume: the server, the stream, the durable pull
/// consumer, where dead letters go, and how many messages are held at once.
///
/// ```
/// use idem_jetstream::JetStreamConfig;
/// use std::time::Duration;
///
/// let config = JetStreamConfig::from_url("nats://127.0.0.1:4222?stream=ORDERS&consumer=idem&subject=orders.>")?
///     .concurrency(64)
///     .lease(Duration::from_secs(30));
/// assert_eq!(config.stream(), "ORDERS");
/// assert_eq!(config.dead_letter_subject(), "ORDERS.dead-letter");
/// # Ok::<_, idem_jetstream::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct JetStreamConfig {
    pub(crate) server: Url,
    pub(crate) stream: String,
    pub(crate) consumer: String,
    pub(crate) subject: Option<String>,
    pub(crate) dead_letter: Option<String>,
    pub(crate) concurrency: usize,
    pub(crate) ack_wait: Option<Duration>,
    pub(crate) lease: Option<Duration>,
}

impl JetStreamConfig {
    /// Parses `nats://host:port?stream=ORDERS&consumer=idem&subject=orders.>`.
    ///
    /// - `stream` (required): the stream to consume; created with `subject`
    ///   when absent.
    /// - `consumer` (required): the durable pull consumer's name; created
    ///   when absent.
    /// - `subject` (optional): the consumer's filter subject, and the
    ///   stream's subject when the stream is created.
    /// - `dead_letter` (optional): the dead-letter subject (default
    ///   `<stream>.dead-letter`).
    /// - `ack_wait` (optional): the consumer's AckWait, as `30s`, `1500ms`
    ///   or `2m` (default: the existing consumer's, or 30 s for a new one).
    ///
    /// Unknown, repeated or missing parameters are refused with the URL form.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        let parsed = Url::parse(url).map_err(|e| ConfigError::new(format!("not a URL ({e})")))?;
        if !matches!(parsed.scheme(), "nats" | "tls") {
            return Err(ConfigError::new(format!(
                "the scheme is `{}`, expected `nats` (or `tls`)",
                parsed.scheme()
            )));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(ConfigError::new("the URL has no host".into()));
        }
        let mut stream = None;
        let mut consumer = None;
        let mut subject = None;
        let mut dead_letter = None;
        let mut ack_wait = None;
        for (name, value) in parsed.query_pairs() {
            let slot = match name.as_ref() {
                "stream" => &mut stream,
                "consumer" => &mut consumer,
                "subject" => &mut subject,
                "dead_letter" => &mut dead_letter,
                "ack_wait" => &mut ack_wait,
                other => {
                    return Err(ConfigError::new(format!(
                        "unknown parameter `{other}` (known: stream, consumer, subject, dead_letter, ack_wait)"
                    )));
                }
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(ConfigError::new(format!("parameter `{name}` given twice")));
            }
        }
        let stream = stream.ok_or_else(|| ConfigError::new("missing parameter `stream`".into()))?;
        let consumer =
            consumer.ok_or_else(|| ConfigError::new("missing parameter `consumer`".into()))?;
        let ack_wait = ack_wait
            .map(|v| {
                parse_duration(&v).ok_or_else(|| {
                    ConfigError::new(format!(
                        "`ack_wait={v}` is not a duration such as `30s`, `1500ms` or `2m`"
                    ))
                })
            })
            .transpose()?;
        let mut server = parsed;
        server.set_query(None);
        server.set_fragment(None);
        let mut config = Self {
            server,
            stream,
            consumer,
            subject,
            dead_letter: None,
            concurrency: 16,
            ack_wait,
            lease: None,
        };
        if let Some(d) = dead_letter {
            config = config.dead_letter(d);
        }
        config.validate()?;
        Ok(config)
    }

    /// The dead-letter subject (default `<stream>.dead-letter`). It is
    /// stored by a stream that already captures it, or else by one created
    /// for it, named after the subject with `.` (and any other character a
    /// stream name cannot hold) replaced by `_`: `ORDERS.dead-letter` is
    /// kept in the stream `ORDERS_dead-letter`.
    pub fn dead_letter(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter = Some(subject.into());
        self
    }

    /// How many messages the runner holds at once; each pull asks for no
    /// more than the runner has room for. The consumer's
    /// `max_ack_pending` bounds every process sharing it together, so a
    /// consumer this creates gets the larger of this and 1000 (the server's
    /// default), and an existing one with less than this is raised to it.
    /// Default 16, at least 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// The guard's lease: [`JetStreamSource::connect`](crate::JetStreamSource::connect)
    /// warns when the consumer's AckWait is shorter.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The consumer's AckWait: how long the server waits for an ack before
    /// redelivering (default: the existing consumer's, or 30 s for a new
    /// one). An existing consumer is updated to it.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = Some(ack_wait);
        self
    }

    /// The stream consumed.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The durable consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The filter subject, if one was given.
    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// Where dead letters are published.
    pub fn dead_letter_subject(&self) -> String {
        self.dead_letter
            .clone()
            .unwrap_or_else(|| format!("{}.dead-letter", self.stream))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !subject::is_valid_name(&self.stream) {
            return Err(ConfigError::new(format!(
                "`stream={}` is not a valid stream name (no `.`, `*`, `>` or spaces)",
                self.stream
            )));
        }
        if !subject::is_valid_name(&self.consumer) {
            return Err(ConfigError::new(format!(
                "`consumer={}` is not a valid consumer name (no `.`, `*`, `>` or spaces)",
                self.consumer
            )));
        }
        if let Some(s) = &self.subject
            && !subject::is_valid(s)
        {
            return Err(ConfigError::new(format!(
                "`subject={s}` is not a valid subject (tokens separated by `.`, `*` for one token, `>` last for the rest)"
            )));
        }
        let d = self.dead_letter_subject();
        if !subject::is_valid(&d) || subject::has_wildcard(&d) {
            return Err(ConfigError::new(format!(
                "the dead-letter subject `{d}` is not a valid subject without wildcards"
            )));
        }
        if self
            .ack_wait
            .is_some_and(|w| w < Duration::from_millis(100))
        {
            return Err(ConfigError::new(
                "`ack_wait` is below 100ms; the server redelivers before a handler can start"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// `host:port` of a server URL: never its credentials.
pub(crate) fn address_of(url: &Url) -> String {
    format!(
        "{}:{}",
        url.host_str().unwrap_or_default(),
        url.port().unwrap_or(4222)
    )
}

/// `30s`, `1500ms`, `2m`, or a bare number of seconds.
fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

/// A `nats://` URL or setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{what}; the URL form is {URL_FORM}")]
pub struct ConfigError {
    what: String,
}

impl ConfigError {
    pub(crate) fn new(what: String) -> Self {
        Self { what }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_gives_every_setting() {
        let c = JetStreamConfig::from_url(
            "nats://u:p@127.0.0.1:4222?stream=ORDERS&consumer=idem&subject=orders.%3E&dead_letter=dead.orders&ack_wait=1500ms",
        )
        .unwrap();
        assert_eq!(c.stream(), "ORDERS");
        assert_eq!(c.consumer(), "idem");
        assert_eq!(c.subject(), Some("orders.>"));
        assert_eq!(c.dead_letter_subject(), "dead.orders");
        assert_eq!(c.ack_wait, Some(Duration::from_millis(1500)));
        assert_eq!(address_of(&c.server), "127.0.0.1:4222");
        assert_eq!(c.server.query(), None);
    }

    #[test]
    fn tls_urls_and_defaults() {
        let c = JetStreamConfig::from_url("tls://nats.example:4443?stream=S&consumer=c").unwrap();
        assert_eq!(address_of(&c.server), "nats.example:4443");
        assert_eq!(c.subject(), None);
        assert_eq!(c.ack_wait, None, "the consumer's own AckWait is kept");
        assert_eq!(c.concurrency, 16);
    }

    #[test]
    fn bad_urls_name_the_parameter_and_show_the_form() {
        for (url, says) in [
            ("nats://h:4222?consumer=c", "missing parameter `stream`"),
            ("nats://h:4222?stream=S", "missing parameter `consumer`"),
            (
                "nats://h:4222?stream=S&consumer=c&queue=q",
                "unknown parameter `queue`",
            ),
            (
                "nats://h:4222?stream=S&stream=T&consumer=c",
                "`stream` given twice",
            ),
            (
                "nats://h:4222?stream=A.B&consumer=c",
                "not a valid stream name",
            ),
            (
                "nats://h:4222?stream=S&consumer=c&subject=a..b",
                "not a valid subject",
            ),
            (
                "nats://h:4222?stream=S&consumer=c&dead_letter=d.*",
                "without wildcards",
            ),
            (
                "nats://h:4222?stream=S&consumer=c&ack_wait=soon",
                "`ack_wait=soon`",
            ),
            ("amqp://h:5672?stream=S&consumer=c", "expected `nats`"),
        ] {
            let e = JetStreamConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(e.contains(URL_FORM), "{url}: {e}");
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("1h"), None);
    }
}
