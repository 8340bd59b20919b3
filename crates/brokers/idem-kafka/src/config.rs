//! Where to consume from: parsed from a `kafka://` URL, the rest by setters.

use std::time::Duration;

/// The URL form, shown in every configuration error.
pub(crate) const URL_FORM: &str = "kafka://HOST:PORT[,HOST:PORT…]?topic=NAME&group=NAME\
     [&retry=topics|blocking][&retry-delays-ms=1000,10000,…][&commit-interval-ms=N]\
     [&isolation=read_committed|read_uncommitted][&offset-reset=earliest|latest]\
     [&partitions=N][&replication=N][&lanes=partition|key][&librdkafka.property=value…]";

/// The delays of the retry topics `<topic>-retry-0`, `-1`, … when none are
/// set: a failing message waits longer at each level.
const DEFAULT_RETRY_DELAYS: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::from_secs(600),
];

/// How a message that must be tried again waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryMode {
    /// Copied to a retry topic (`<topic>-retry-N`, each with a fixed
    /// delay), its offset then committed: the partition goes on, and the
    /// copy comes back after the delay, behind later messages of its key.
    Topics(Vec<Duration>),
    /// Held in place: the runner waits and runs it again
    /// ([`Runner::retry_in_place`](idem_consumer::Runner::retry_in_place)),
    /// and the messages behind it in its partition wait too. Order is kept;
    /// one failing message stalls its partition until it succeeds or is
    /// dead-lettered.
    Blocking,
}

/// Which offsets a group with none committed starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetReset {
    /// The oldest message still in the partition (the default: nothing
    /// published before the group existed is skipped).
    Earliest,
    /// Only messages published from now on.
    Latest,
}

/// What a message's [lane](idem_consumer::Message::lane) is: the unit the
/// runner keeps in order when it is [`ordered`](idem_consumer::Runner::ordered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// The partition (the default): one message of a partition in work at
    /// a time.
    Partition,
    /// The record key: one message per key in work at a time, several keys
    /// of a partition at once. Records without a key have no lane.
    Key,
}

/// Which topic and consumer group to consume, and how.
///
/// ```
/// use idem_kafka::KafkaConfig;
/// let config = KafkaConfig::from_url("kafka://127.0.0.1:9092?topic=orders&group=billing")?
///     .concurrency(64);
/// assert_eq!(config.topic(), "orders");
/// assert_eq!(config.retry_topic(0).as_deref(), Some("orders-retry-0"));
/// assert_eq!(config.dead_letter_topic(), "orders-dlt");
/// # Ok::<_, idem_kafka::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct KafkaConfig {
    pub(crate) brokers: String,
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) retry: RetryMode,
    pub(crate) dead_letter: Option<String>,
    pub(crate) concurrency: usize,
    pub(crate) commit_interval: Duration,
    pub(crate) read_committed: bool,
    pub(crate) offset_reset: OffsetReset,
    pub(crate) partitions: Option<i32>,
    /// Replicas of each partition of the topics this source creates; `None`
    /// for the brokers' default (`default.replication.factor`).
    pub(crate) replication: Option<i16>,
    pub(crate) lanes: Lanes,
    pub(crate) revoke_grace: Duration,
    pub(crate) lease: Option<Duration>,
    /// librdkafka properties given as they are (URL parameters with a dot).
    pub(crate) properties: Vec<(String, String)>,
}

/// Every setting, with the values of secret properties
/// (`sasl.password`, `ssl.key.password`, …) shown as `***`.
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: Vec<(&str, &str)> = self
            .properties
            .iter()
            .map(|(name, value)| {
                let shown = match idem_core::text::is_secret_param(name) {
                    true => "***",
                    false => value.as_str(),
                };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("group", &self.group)
            .field("retry", &self.retry)
            .field("dead_letter", &self.dead_letter)
            .field("concurrency", &self.concurrency)
            .field("commit_interval", &self.commit_interval)
            .field("read_committed", &self.read_committed)
            .field("offset_reset", &self.offset_reset)
            .field("partitions", &self.partitions)
            .field("replication", &self.replication)
            .field("lanes", &self.lanes)
            .field("revoke_grace", &self.revoke_grace)
            .field("lease", &self.lease)
            .field("properties", &properties)
            .finish()
    }
}

impl KafkaConfig {
    /// Parses `kafka://127.0.0.1:9092?topic=orders&group=billing`, with the
    /// optional parameters of the URL form:
    ///
    /// - `retry=topics` (default) or `blocking`, see [`RetryMode`];
    /// - `retry-delays-ms=1000,10000,60000,600000`: one retry topic per
    ///   delay (the default);
    /// - `commit-interval-ms=1000`: how often finished offsets are
    ///   committed (default 1 s; also at every rebalance and at close);
    /// - `isolation=read_committed` (default) or `read_uncommitted`;
    /// - `offset-reset=earliest` (default) or `latest`;
    /// - `partitions=N`: partitions of the topics this source creates when
    ///   they are missing (default: as many as the topic has, else 1);
    /// - `replication=N`: replicas of each partition of the topics this
    ///   source creates (default: the brokers' `default.replication.factor`;
    ///   a retry or dead-letter copy is only as safe as its topic, since the
    ///   original's offset is committed once the copy is written);
    /// - `lanes=partition` (default) or `key`, see [`Lanes`];
    /// - any parameter with a dot in its name is a librdkafka property,
    ///   passed on as it is (`session.timeout.ms=10000`,
    ///   `security.protocol=ssl`). `group.instance.id=NAME`, one name per
    ///   consumer process that it keeps across restarts, turns on static
    ///   membership: a restarted consumer takes its partitions back without
    ///   a rebalance (brokers that never give a dead member's partitions to
    ///   another member, such as tansu 0.6, need it to resume at all).
    ///
    /// An unknown, repeated or missing parameter is an error naming it and
    /// showing the URL form.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        let Some(rest) = url.strip_prefix("kafka://") else {
            let scheme = url.split_once("://").map_or("none", |(s, _)| s);
            return Err(ConfigError::Url {
                url: idem_core::text::redacted_url(url),
                reason: format!("the scheme is `{scheme}`, not kafka"),
            });
        };
        let (brokers, query) = rest.split_once('?').unwrap_or((rest, ""));
        let brokers = brokers.trim_end_matches('/');
        if brokers.is_empty()
            || brokers.split(',').any(|b| {
                b.rsplit_once(':')
                    .is_none_or(|(_, port)| port.parse::<u16>().is_err())
            })
        {
            return Err(ConfigError::Url {
                url: idem_core::text::redacted_url(url),
                reason: "give the brokers as HOST:PORT, separated by commas".into(),
            });
        }
        let mut config = Self {
            brokers: brokers.to_owned(),
            topic: String::new(),
            group: String::new(),
            retry: RetryMode::Topics(DEFAULT_RETRY_DELAYS.to_vec()),
            dead_letter: None,
            concurrency: 16,
            commit_interval: Duration::from_secs(1),
            read_committed: true,
            offset_reset: OffsetReset::Earliest,
            partitions: None,
            replication: None,
            lanes: Lanes::Partition,
            revoke_grace: Duration::from_secs(30),
            lease: None,
            properties: Vec::new(),
        };
        let mut seen = Vec::new();
        let (mut retry, mut delays) = (None, None);
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let name = name.into_owned();
            let value = value.into_owned();
            if seen.contains(&name) {
                return Err(ConfigError::Repeated { name });
            }
            seen.push(name.clone());
            if value.is_empty() {
                return Err(ConfigError::Invalid {
                    name,
                    value,
                    expected: "a non-empty value",
                });
            }
            let invalid = |expected: &'static str| ConfigError::Invalid {
                name: name.clone(),
                value: value.clone(),
                expected,
            };
            match name.as_str() {
                "topic" => config.topic = checked_topic(&name, value)?,
                "group" => config.group = value,
                "retry" => retry = Some(value),
                "retry-delays-ms" => {
                    let parsed: Option<Vec<Duration>> = value
                        .split(',')
                        .map(|ms| ms.trim().parse::<u64>().ok().filter(|&ms| ms > 0))
                        .map(|ms| ms.map(Duration::from_millis))
                        .collect();
                    delays = Some(
                        parsed
                            .filter(|d| !d.is_empty() && d.len() <= 32)
                            .ok_or_else(|| {
                                invalid("1 to 32 whole numbers of milliseconds above 0, separated by commas")
                            })?,
                    );
                }
                "commit-interval-ms" => {
                    config.commit_interval = value
                        .parse::<u64>()
                        .ok()
                        .filter(|&ms| ms > 0)
                        .map(Duration::from_millis)
                        .ok_or_else(|| invalid("a whole number of milliseconds above 0"))?;
                }
                "isolation" => {
                    config.read_committed = match value.as_str() {
                        "read_committed" => true,
                        "read_uncommitted" => false,
                        _ => return Err(invalid("read_committed or read_uncommitted")),
                    }
                }
                "offset-reset" => {
                    config.offset_reset = match value.as_str() {
                        "earliest" => OffsetReset::Earliest,
                        "latest" => OffsetReset::Latest,
                        _ => return Err(invalid("earliest or latest")),
                    }
                }
                "lanes" => {
                    config.lanes = match value.as_str() {
                        "partition" => Lanes::Partition,
                        "key" => Lanes::Key,
                        _ => return Err(invalid("partition or key")),
                    }
                }
                "partitions" => {
                    config.partitions = Some(
                        value
                            .parse::<i32>()
                            .ok()
                            .filter(|&n| (1..=10_000).contains(&n))
                            .ok_or_else(|| invalid("a whole number from 1 to 10000"))?,
                    );
                }
                "replication" => {
                    config.replication = Some(
                        value
                            .parse::<i16>()
                            .ok()
                            .filter(|&n| n >= 1)
                            .ok_or_else(|| invalid("a number of replicas from 1 to 32767"))?,
                    );
                }
                property if property.contains('.') => config.properties.push((name, value)),
                _ => {
                    return Err(ConfigError::UnknownParameter {
                        name,
                        url: idem_core::text::redacted_url(url),
                    });
                }
            }
        }
        for (name, value) in [("topic", &config.topic), ("group", &config.group)] {
            if value.is_empty() {
                return Err(ConfigError::MissingParameter {
                    name,
                    url: idem_core::text::redacted_url(url),
                });
            }
        }
        config.retry = match (retry.as_deref(), delays) {
            (None | Some("topics"), delays) => {
                RetryMode::Topics(delays.unwrap_or_else(|| DEFAULT_RETRY_DELAYS.to_vec()))
            }
            (Some("blocking"), None) => RetryMode::Blocking,
            (Some("blocking"), Some(_)) => {
                return Err(ConfigError::Invalid {
                    name: "retry-delays-ms".into(),
                    value: "(set)".into(),
                    expected: "no retry topics with retry=blocking (remove one of the two)",
                });
            }
            (Some(other), _) => {
                return Err(ConfigError::Invalid {
                    name: "retry".into(),
                    value: other.to_owned(),
                    expected: "topics or blocking",
                });
            }
        };
        Ok(config)
    }

    /// How retries wait (default: retry topics with delays 1 s, 10 s, 1 min
    /// and 10 min).
    pub fn retry(mut self, mode: RetryMode) -> Self {
        self.retry = mode;
        self
    }

    /// The dead-letter topic (default `<topic>-dlt`).
    pub fn dead_letter(mut self, name: impl Into<String>) -> Self {
        self.dead_letter = Some(name.into());
        self
    }

    /// How many messages the source holds ready beyond those in work is
    /// sized from this: give the runner the same concurrency (default 16,
    /// at least 1). From `max(4 × concurrency, 256)` messages buffered
    /// the source polls slowly; at a quarter more it pauses its partitions
    /// at the broker until the runner has taken the buffer back down, so
    /// memory stays bounded when the runner stops fetching (librdkafka's
    /// own prefetch is bounded by `queued.max.messages.kbytes`).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Replicas of each partition of the topics this source creates: the
    /// topic when missing, its retry topics and its dead-letter topic
    /// (default: the brokers' `default.replication.factor`; at least 1).
    pub fn replication(mut self, replicas: i16) -> Self {
        self.replication = Some(replicas.max(1));
        self
    }

    /// What the runner keeps in order (default: the partition).
    pub fn lanes(mut self, lanes: Lanes) -> Self {
        self.lanes = lanes;
        self
    }

    /// How often finished offsets are committed (default 1 s).
    pub fn commit_interval(mut self, every: Duration) -> Self {
        self.commit_interval = every.max(Duration::from_millis(1));
        self
    }

    /// How long a rebalance waits for work in flight on the partitions
    /// taken away before committing and letting them go (default 30 s).
    /// Work still running after it is finished anyway, but its offset is
    /// not committed here: the partition's new owner gets the message
    /// again, and the guard makes that a duplicate.
    pub fn revoke_grace(mut self, grace: Duration) -> Self {
        self.revoke_grace = grace;
        self
    }

    /// The guard's lease, for the log line that says how the source is set
    /// up (Kafka has no redelivery timer to match it against).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Sets a librdkafka property on the consumer, the producer of retries
    /// and dead letters, and the admin client.
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((name.into(), value.into()));
        self
    }

    /// The topic consumed.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// How retries wait.
    pub fn retry_mode(&self) -> &RetryMode {
        &self.retry
    }

    /// The retry topic of `level` (0 is the first and shortest), if there
    /// is one.
    pub fn retry_topic(&self, level: usize) -> Option<String> {
        match &self.retry {
            RetryMode::Topics(delays) if level < delays.len() => {
                Some(format!("{}-retry-{level}", self.topic))
            }
            _ => None,
        }
    }

    /// The dead-letter topic.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter
            .clone()
            .unwrap_or_else(|| format!("{}-dlt", self.topic))
    }

    /// The topics the consumer subscribes to: the topic and its retry
    /// topics.
    pub(crate) fn subscribed(&self) -> Vec<String> {
        let mut topics = vec![self.topic.clone()];
        topics.extend((0..).map_while(|level| self.retry_topic(level)));
        topics
    }

    /// The retry level for a wait of `delay`: the first whose delay is at
    /// least as long, else the last.
    pub(crate) fn retry_level(&self, delay: Duration) -> Option<(usize, Duration)> {
        let RetryMode::Topics(delays) = &self.retry else {
            return None;
        };
        let level = delays
            .iter()
            .position(|&d| d >= delay)
            .unwrap_or(delays.len() - 1);
        Some((level, delays[level]))
    }
}

/// Kafka topic names: 1 to 249 of `[a-zA-Z0-9._-]`.
fn checked_topic(name: &str, value: String) -> Result<String, ConfigError> {
    // Room for the "-retry-NN" suffix.
    let ok = !value.is_empty()
        && value.len() <= 240
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            name: name.to_owned(),
            value,
            expected: "1 to 240 letters, digits, `.`, `_` or `-` (a Kafka topic name)",
        })
    }
}

/// A `kafka://` URL or setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not a `kafka://` URL.
    #[error("{url:?} is not a Kafka source URL ({reason}); the form is {URL_FORM}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A required parameter is missing.
    #[error("{url:?} has no `{name}` parameter; the form is {URL_FORM}")]
    MissingParameter {
        /// The parameter.
        name: &'static str,
        /// The URL given.
        url: String,
    },
    /// A parameter this source does not know.
    #[error(
        "{url:?} has an unknown parameter `{name}` (librdkafka properties have a dot in their name); the form is {URL_FORM}"
    )]
    UnknownParameter {
        /// The parameter.
        name: String,
        /// The URL given.
        url: String,
    },
    /// A parameter given twice.
    #[error("the parameter `{name}` is given twice; give it once")]
    Repeated {
        /// The parameter.
        name: String,
    },
    /// A parameter with a value that cannot be used.
    #[error("`{name}={value}` is not valid: expected {expected}")]
    Invalid {
        /// The parameter.
        name: String,
        /// The value given.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_retry_topics_read_committed_and_earliest() {
        let c = KafkaConfig::from_url("kafka://127.0.0.1:9092?topic=t&group=g").unwrap();
        assert_eq!(c.brokers, "127.0.0.1:9092");
        assert!(c.read_committed);
        assert_eq!(c.offset_reset, OffsetReset::Earliest);
        assert_eq!(
            c.subscribed(),
            ["t", "t-retry-0", "t-retry-1", "t-retry-2", "t-retry-3"]
        );
        assert_eq!(c.dead_letter_topic(), "t-dlt");
        assert_eq!(
            c.retry_level(Duration::from_millis(150)),
            Some((0, Duration::from_secs(1)))
        );
        assert_eq!(
            c.retry_level(Duration::from_secs(2)),
            Some((1, Duration::from_secs(10)))
        );
        assert_eq!(c.retry_level(Duration::from_secs(7200)).unwrap().0, 3);
    }

    #[test]
    fn every_parameter_is_read() {
        let c = KafkaConfig::from_url(
            "kafka://a:1,b:2?topic=t&group=g&retry-delays-ms=50,500&commit-interval-ms=20\
             &isolation=read_uncommitted&offset-reset=latest&partitions=4&lanes=key&session.timeout.ms=6000",
        )
        .unwrap();
        assert_eq!(c.brokers, "a:1,b:2");
        assert_eq!(
            c.retry,
            RetryMode::Topics(vec![Duration::from_millis(50), Duration::from_millis(500)])
        );
        assert_eq!(c.commit_interval, Duration::from_millis(20));
        assert!(!c.read_committed);
        assert_eq!(c.offset_reset, OffsetReset::Latest);
        assert_eq!(c.partitions, Some(4));
        assert_eq!(c.lanes, Lanes::Key);
        assert_eq!(
            c.properties,
            [("session.timeout.ms".to_owned(), "6000".to_owned())]
        );
        let blocking = KafkaConfig::from_url("kafka://a:1?topic=t&group=g&retry=blocking").unwrap();
        assert_eq!(blocking.retry, RetryMode::Blocking);
        assert_eq!(blocking.subscribed(), ["t"]);
    }

    #[test]
    fn a_sasl_password_is_never_shown() {
        let url = "kafka://h:1?topic=t&group=g&sasl.username=app&sasl.password=hunter2";
        for bad in [
            format!("{url}&colour=red"),
            url.replace("topic=t&", ""),
            url.replace("h:1", "h"),
        ] {
            let e = KafkaConfig::from_url(&bad).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("sasl.password=***"), "{e}");
        }
        let config = KafkaConfig::from_url(url).unwrap();
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("sasl.username"),
            "{shown}"
        );
    }

    #[test]
    fn bad_urls_say_what_to_fix() {
        let err = |url: &str| KafkaConfig::from_url(url).unwrap_err().to_string();
        assert!(err("kafka://h:1?group=g").contains("no `topic`"));
        assert!(err("kafka://h:1?topic=t").contains("no `group`"));
        assert!(err("redis://h:1?topic=t&group=g").contains("not kafka"));
        assert!(
            err("kafka://h:1?topic=t&group=g&colour=red").contains("unknown parameter `colour`")
        );
        assert!(err("kafka://h:1?topic=t&group=g&retry=sometimes").contains("topics or blocking"));
        assert!(
            err("kafka://h:1?topic=t&group=g&retry=blocking&retry-delays-ms=5")
                .contains("remove one")
        );
        assert!(err("kafka://h:1?topic=t&group=g&retry-delays-ms=5,x").contains("milliseconds"));
        assert!(err("kafka://h:1?topic=a/b&group=g").contains("Kafka topic name"));
        assert!(err("kafka://h:1?topic=t&topic=u&group=g").contains("twice"));
        assert!(err("kafka://h?topic=t&group=g").contains("HOST:PORT"));
        assert!(err("kafka://h:1?topic=t&group=g&replication=0").contains("replicas"));
        assert!(err("kafka://h:1?topic=t&group=g&replication=three").contains("replicas"));
        assert!(err("kafka://h:1?topic=t&group=g&replication=40000").contains("replicas"));
    }

    #[test]
    fn replication_is_the_brokers_default_unless_given() {
        let c = KafkaConfig::from_url("kafka://h:1?topic=t&group=g").unwrap();
        assert_eq!(c.replication, None);
        let c = KafkaConfig::from_url("kafka://h:1?topic=t&group=g&replication=3").unwrap();
        assert_eq!(c.replication, Some(3));
        assert_eq!(c.replication(0).replication, Some(1));
    }
}
