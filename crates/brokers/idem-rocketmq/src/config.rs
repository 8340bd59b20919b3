//! What to consume: parsed from a `rocketmq://` URL, adjusted with setters.

use std::time::Duration;

use url::form_urlencoded;

/// The URL form, quoted in every error about one.
pub(crate) const URL_FORM: &str = "rocketmq://NAMESRV_HOST:PORT[,HOST:PORT...]?topic=TOPIC&group=GROUP[&dead_letter=TOPIC][&max_reconsume_times=16]";

/// Where and how to consume: the name servers, the topic, the consumer
/// group, where dead letters go, how many messages are held at once, and
/// how often the broker redelivers a message before it gives up.
///
/// ```
/// use idem_rocketmq::RocketMqConfig;
/// use std::time::Duration;
///
/// let config = RocketMqConfig::from_url("rocketmq://127.0.0.1:9876?topic=orders&group=billing")?
///     .concurrency(32)
///     .lease(Duration::from_secs(30));
/// assert_eq!(config.topic(), "orders");
/// assert_eq!(config.group(), "billing");
/// assert_eq!(config.dead_letter_topic(), "%DLQ%billing");
/// assert_eq!(config.max_reconsume_times_value(), 16);
/// # Ok::<_, idem_rocketmq::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RocketMqConfig {
    pub(crate) name_servers: String,
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) dead_letter: Option<String>,
    pub(crate) concurrency: usize,
    pub(crate) lease: Option<Duration>,
    pub(crate) max_reconsume_times: u32,
}

impl RocketMqConfig {
    /// Parses `rocketmq://127.0.0.1:9876?topic=orders&group=billing`.
    ///
    /// - the authority: the name server, or several separated by `,`
    ///   (port 9876 when none is given).
    /// - `topic` (required): the topic to consume.
    /// - `group` (required): the consumer group; its offsets, its retry
    ///   topic `%RETRY%GROUP` and its dead-letter topic `%DLQ%GROUP` are the
    ///   broker's.
    /// - `dead_letter` (optional): the topic dead letters are published to
    ///   (default `%DLQ%GROUP`, where the broker itself parks messages).
    /// - `max_reconsume_times` (optional): redeliveries before the broker
    ///   moves a message to `%DLQ%GROUP` (default 16).
    ///
    /// Unknown, repeated or missing parameters are refused with the URL form.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(ConfigError::new("not a URL (no `://`)".into()));
        };
        if scheme != "rocketmq" {
            return Err(ConfigError::new(format!(
                "the scheme is `{scheme}`, expected `rocketmq`"
            )));
        }
        let rest = rest.split('#').next().unwrap_or_default();
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = before_query.split('/').next().unwrap_or_default();
        if authority.contains('@') {
            return Err(ConfigError::new(
                "credentials in the URL are not supported (the name server takes none)".into(),
            ));
        }
        let name_servers = name_servers(authority)?;
        let mut topic = None;
        let mut group = None;
        let mut dead_letter = None;
        let mut max_reconsume_times = None;
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match name.as_ref() {
                "topic" => &mut topic,
                "group" => &mut group,
                "dead_letter" => &mut dead_letter,
                "max_reconsume_times" => &mut max_reconsume_times,
                other => {
                    return Err(ConfigError::new(format!(
                        "unknown parameter `{other}` (known: topic, group, dead_letter, max_reconsume_times)"
                    )));
                }
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(ConfigError::new(format!("parameter `{name}` given twice")));
            }
        }
        let topic = topic.ok_or_else(|| ConfigError::new("missing parameter `topic`".into()))?;
        let group = group.ok_or_else(|| ConfigError::new("missing parameter `group`".into()))?;
        let mut config = Self {
            name_servers,
            topic,
            group,
            dead_letter,
            concurrency: 16,
            lease: None,
            max_reconsume_times: 16,
        };
        if let Some(v) = max_reconsume_times {
            let n = v.parse::<u32>().map_err(|_| {
                ConfigError::new(format!(
                    "`max_reconsume_times={v}` is not a whole number (give 1 to {MAX_RECONSUME_TIMES})"
                ))
            })?;
            config.max_reconsume_times = n;
        }
        config.validate()?;
        Ok(config)
    }

    /// The topic dead letters are published to (default `%DLQ%GROUP`, the
    /// topic the broker moves a message to after `max_reconsume_times`
    /// redeliveries: both kinds end in one place).
    pub fn dead_letter(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter = Some(topic.into());
        self
    }

    /// How many messages the runner holds at once: the client's consume
    /// threads. Default 16, at least 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.clamp(1, MAX_CONCURRENCY);
        self
    }

    /// The guard's lease: a handler the client has waited on for longer
    /// than its consume timeout (15 minutes) is redelivered by the client
    /// itself, so leases beyond it are pointless; `connect` warns.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Redeliveries (`ReconsumeLater`) before the broker moves a message
    /// to `%DLQ%GROUP` (default 16, the broker's own default). Give the
    /// runner's [`max_attempts`](idem_consumer::Runner::max_attempts) at
    /// most this plus one, so the runner dead-letters first, with idem's
    /// headers.
    pub fn max_reconsume_times(mut self, n: u32) -> Self {
        self.max_reconsume_times = n;
        self
    }

    /// The name servers, `host:port` separated by `;` as the client takes
    /// them.
    pub fn name_servers(&self) -> &str {
        &self.name_servers
    }

    /// The topic consumed.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The redeliveries the broker makes before it parks a message.
    pub fn max_reconsume_times_value(&self) -> u32 {
        self.max_reconsume_times
    }

    /// Where dead letters are published.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter
            .clone()
            .unwrap_or_else(|| format!("%DLQ%{}", self.group))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !is_valid_name(&self.topic) {
            return Err(ConfigError::new(format!(
                "`topic={}` is not a valid topic (letters, digits, `%`, `|`, `-` and `_`, at most 127 characters)",
                self.topic
            )));
        }
        if !is_valid_name(&self.group) || self.group.contains(['%', '|']) {
            return Err(ConfigError::new(format!(
                "`group={}` is not a valid group (letters, digits, `-` and `_`, at most 127 characters)",
                self.group
            )));
        }
        let d = self.dead_letter_topic();
        if !is_valid_name(&d) {
            return Err(ConfigError::new(format!(
                "the dead-letter topic `{d}` is not a valid topic (letters, digits, `%`, `|`, `-` and `_`)"
            )));
        }
        if !(1..=MAX_RECONSUME_TIMES).contains(&self.max_reconsume_times) {
            return Err(ConfigError::new(format!(
                "`max_reconsume_times={}` is out of range (give 1 to {MAX_RECONSUME_TIMES})",
                self.max_reconsume_times
            )));
        }
        Ok(())
    }
}

/// The client's limit on consume threads.
const MAX_CONCURRENCY: usize = 256;

/// The broker stores reconsume counts as small numbers; Java's client caps
/// them at a few thousand as well.
const MAX_RECONSUME_TIMES: u32 = 1000;

/// RocketMQ's topic and group rule.
fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 127
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '-' | '_'))
}

/// A URL's authority (`host:port,host:port`) as the client's
/// `;`-separated name server list.
fn name_servers(authority: &str) -> Result<String, ConfigError> {
    if authority.is_empty() {
        return Err(ConfigError::new(
            "the URL has no name server address".into(),
        ));
    }
    let mut out = Vec::new();
    for server in authority.split(',') {
        let (host, port) = match server.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>().map_err(|_| {
                    ConfigError::new(format!(
                        "`{server}` has no valid port (e.g. 127.0.0.1:9876)"
                    ))
                })?,
            ),
            None => (server, 9876),
        };
        if host.is_empty() {
            return Err(ConfigError::new(format!(
                "`{server}` has no host (e.g. 127.0.0.1:9876)"
            )));
        }
        out.push(format!("{host}:{port}"));
    }
    Ok(out.join(";"))
}

/// A `rocketmq://` URL or setting that cannot be used.
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
        let c = RocketMqConfig::from_url(
            "rocketmq://10.0.0.1:9876,10.0.0.2?topic=orders&group=billing&dead_letter=parked&max_reconsume_times=3",
        )
        .unwrap();
        assert_eq!(c.name_servers(), "10.0.0.1:9876;10.0.0.2:9876");
        assert_eq!(c.topic(), "orders");
        assert_eq!(c.group(), "billing");
        assert_eq!(c.dead_letter_topic(), "parked");
        assert_eq!(c.max_reconsume_times_value(), 3);
    }

    #[test]
    fn defaults() {
        let c = RocketMqConfig::from_url("rocketmq://127.0.0.1:9876?topic=T&group=G").unwrap();
        assert_eq!(c.name_servers(), "127.0.0.1:9876");
        assert_eq!(c.dead_letter_topic(), "%DLQ%G");
        assert_eq!(c.max_reconsume_times_value(), 16);
        assert_eq!(c.concurrency, 16);
        assert_eq!(c.clone().concurrency(0).concurrency, 1);
    }

    #[test]
    fn bad_urls_name_the_parameter_and_show_the_form() {
        for (url, says) in [
            ("rocketmq://h:9876?group=g", "missing parameter `topic`"),
            ("rocketmq://h:9876?topic=t", "missing parameter `group`"),
            (
                "rocketmq://h:9876?topic=t&group=g&queue=q",
                "unknown parameter `queue`",
            ),
            (
                "rocketmq://h:9876?topic=t&topic=u&group=g",
                "`topic` given twice",
            ),
            ("rocketmq://h:9876?topic=a.b&group=g", "not a valid topic"),
            ("rocketmq://h:9876?topic=t&group=%25g", "not a valid group"),
            (
                "rocketmq://h:9876?topic=t&group=g&max_reconsume_times=many",
                "`max_reconsume_times=many`",
            ),
            (
                "rocketmq://h:9876?topic=t&group=g&max_reconsume_times=0",
                "out of range",
            ),
            ("rocketmq://h:port?topic=t&group=g", "no valid port"),
            ("rocketmq://?topic=t&group=g", "no name server"),
            ("amqp://h:5672?topic=t&group=g", "expected `rocketmq`"),
            ("rocketmq://u:p@h:9876?topic=t&group=g", "credentials"),
        ] {
            let e = RocketMqConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(e.contains(URL_FORM), "{url}: {e}");
        }
    }
}
