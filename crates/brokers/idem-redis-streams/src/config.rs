//! Where to consume from: parsed from a `redis://` URL, the rest by setters.

use std::time::Duration;

use idem_redis::redacted;

/// The URL form, shown in every configuration error.
pub(crate) const URL_FORM: &str = "redis://[USER:PASSWORD@]HOST:PORT[/DB]?stream=NAME&group=NAME\
     [&consumer=NAME][&claim-idle-ms=N] (or rediss:// for TLS)";

/// How long an entry another consumer left pending stays with it before
/// this one claims it, unless set (see [`RedisStreamConfig::claim_idle`]).
const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);
/// The shortest claim idle time: entries in work are refreshed every third
/// of it, which must not become a busy loop.
const MIN_CLAIM_IDLE: Duration = Duration::from_millis(100);

/// Which stream and consumer group to consume, and how.
///
/// ```
/// use idem_redis_streams::RedisStreamConfig;
/// let config = RedisStreamConfig::from_url("redis://127.0.0.1:6379?stream=orders&group=idem")?
///     .concurrency(64);
/// assert_eq!(config.stream(), "orders");
/// assert_eq!(config.dead_letter_stream(), "orders.dead-letter");
/// # Ok::<_, idem_redis_streams::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RedisStreamConfig {
    /// The URL without its query: what the Redis client opens.
    pub(crate) server: String,
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) consumer: Option<String>,
    pub(crate) dead_letter: Option<String>,
    pub(crate) concurrency: usize,
    pub(crate) claim_idle: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<redis::TlsCertificates>,
}

impl RedisStreamConfig {
    /// Parses `redis://127.0.0.1:6379?stream=orders&group=idem` (also
    /// `rediss://`, and the optional `consumer=NAME`, `claim-idle-ms=N`).
    ///
    /// An unknown or missing parameter is an error naming it and showing
    /// the URL form; a password in the URL never shows in an error.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        let shown = redacted(url);
        let mut parsed = url::Url::parse(url).map_err(|e| ConfigError::Url {
            url: shown.clone(),
            reason: e.to_string(),
        })?;
        if !matches!(parsed.scheme(), "redis" | "rediss") {
            return Err(ConfigError::Url {
                url: shown,
                reason: format!("the scheme is `{}`, not redis or rediss", parsed.scheme()),
            });
        }
        let (mut stream, mut group, mut consumer, mut claim_idle) = (None, None, None, None);
        for (name, value) in parsed.query_pairs() {
            let slot = match name.as_ref() {
                "stream" => &mut stream,
                "group" => &mut group,
                "consumer" => &mut consumer,
                "claim-idle-ms" => &mut claim_idle,
                other => {
                    return Err(ConfigError::UnknownParameter {
                        name: other.to_owned(),
                        url: shown,
                    });
                }
            };
            if value.is_empty() {
                return Err(ConfigError::Invalid {
                    name: name.into_owned(),
                    value: String::new(),
                    expected: "a non-empty value",
                });
            }
            *slot = Some(value.into_owned());
        }
        let required = |value: Option<String>, name: &'static str| {
            value.ok_or_else(|| ConfigError::MissingParameter {
                name,
                url: shown.clone(),
            })
        };
        let stream = required(stream, "stream")?;
        let group = required(group, "group")?;
        let claim_idle = claim_idle
            .map(|ms| {
                ms.parse::<u64>()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .map(Duration::from_millis)
                    .ok_or(ConfigError::Invalid {
                        name: "claim-idle-ms".into(),
                        value: ms,
                        expected: "a whole number of milliseconds above 0",
                    })
            })
            .transpose()?;
        parsed.set_query(None);
        Ok(Self {
            server: parsed.into(),
            stream,
            group,
            consumer,
            dead_letter: None,
            concurrency: 16,
            claim_idle,
            lease: None,
            #[cfg(feature = "tls")]
            tls: None,
        })
    }

    /// The dead-letter stream, in the same Redis (default
    /// `<stream>.dead-letter`).
    pub fn dead_letter(mut self, name: impl Into<String>) -> Self {
        self.dead_letter = Some(name.into());
        self
    }

    /// How many entries one fetch reads at most (`XREADGROUP … COUNT`);
    /// give the runner the same concurrency (default 16, at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// The guard's lease: the default [`claim_idle`](Self::claim_idle),
    /// since an entry claimed from a dead consumer before its lease ran out
    /// would only find the key still held.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long an entry another consumer fetched and left unacknowledged
    /// stays with it before this one claims it (`XAUTOCLAIM`) as a
    /// redelivery (default: the lease, or 30 s). Consumers keep their
    /// entries fresh while the handler works, so only a dead or stuck
    /// consumer's entries are claimed.
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = Some(idle);
        self
    }

    /// This consumer's name in the group (default: `idem-<pid>-<random>`,
    /// new each start; a dead consumer's entries are claimed by the others
    /// after [`claim_idle`](Self::claim_idle)).
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// For `rediss://` URLs: trust the certificate authorities in `pem`
    /// instead of the system's roots (a Redis whose certificate a private
    /// CA signed).
    #[cfg(feature = "tls")]
    pub fn tls_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_settings().root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate chain and
    /// private key (PEM), for a Redis that asks for them (its default once
    /// TLS is on).
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_settings().client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    #[cfg(feature = "tls")]
    fn tls_settings(&mut self) -> &mut redis::TlsCertificates {
        self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        })
    }

    /// A client for the server, with the configured certificates.
    pub(crate) fn client(&self) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        idem_redis::install_crypto_provider();
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.tls {
            return redis::Client::build_with_tls(self.server.as_str(), certs.clone());
        }
        redis::Client::open(self.server.as_str())
    }

    /// The stream consumed: the runner's default namespace.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Where dead letters go.
    pub fn dead_letter_stream(&self) -> String {
        self.dead_letter
            .clone()
            .unwrap_or_else(|| format!("{}.dead-letter", self.stream))
    }

    /// The sorted set beside the stream holding delayed retries.
    pub fn retry_set(&self) -> String {
        format!("{}.retry", self.stream)
    }

    /// The idle time after which a pending entry is claimed, at least
    /// 100 ms (entries in work are refreshed every third of it).
    pub fn claim_idle_time(&self) -> Duration {
        self.claim_idle
            .or(self.lease)
            .unwrap_or(DEFAULT_CLAIM_IDLE)
            .max(MIN_CLAIM_IDLE)
    }

    /// The server's address with any password hidden.
    pub fn address(&self) -> String {
        redacted(&self.server)
    }
}

/// A `redis://` consumer URL that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not a URL, or not a Redis one.
    #[error("`{url}` is not a Redis Streams URL ({reason}); expected {URL_FORM}")]
    Url {
        /// The URL, password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A required query parameter is missing.
    #[error("`{url}` has no `{name}=` parameter; expected {URL_FORM}")]
    MissingParameter {
        /// The parameter.
        name: &'static str,
        /// The URL, password hidden.
        url: String,
    },
    /// A query parameter this source does not know.
    #[error("`{url}` has an unknown parameter `{name}`; expected {URL_FORM}")]
    UnknownParameter {
        /// The parameter.
        name: String,
        /// The URL, password hidden.
        url: String,
    },
    /// A parameter's value cannot be used.
    #[error("`{name}={value}` is not valid: expected {expected}")]
    Invalid {
        /// The parameter.
        name: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_sets_every_parameter_and_keeps_the_server_part() {
        let c = RedisStreamConfig::from_url(
            "redis://app:secret@10.0.0.1:6380/2?stream=orders&group=billing&consumer=c1&claim-idle-ms=1500",
        )
        .unwrap();
        assert_eq!(c.stream(), "orders");
        assert_eq!(c.group(), "billing");
        assert_eq!(c.consumer.as_deref(), Some("c1"));
        assert_eq!(c.claim_idle_time(), Duration::from_millis(1500));
        assert_eq!(c.server, "redis://app:secret@10.0.0.1:6380/2");
        assert_eq!(c.address(), "redis://app:***@10.0.0.1:6380/2");
        assert_eq!(c.dead_letter_stream(), "orders.dead-letter");
        assert_eq!(c.retry_set(), "orders.retry");
    }

    #[test]
    fn claim_idle_defaults_to_the_lease_then_thirty_seconds() {
        let c = RedisStreamConfig::from_url("rediss://h?stream=s&group=g").unwrap();
        assert_eq!(c.claim_idle_time(), DEFAULT_CLAIM_IDLE);
        let c = c.lease(Duration::from_secs(5));
        assert_eq!(c.claim_idle_time(), Duration::from_secs(5));
        let c = c.claim_idle(Duration::from_secs(2));
        assert_eq!(c.claim_idle_time(), Duration::from_secs(2));
        let c = c.claim_idle(Duration::ZERO);
        assert_eq!(c.claim_idle_time(), MIN_CLAIM_IDLE);
    }

    #[test]
    fn bad_urls_name_the_parameter_and_hide_the_password() {
        let cases = [
            ("redis://:pw@h?group=g", "no `stream=` parameter"),
            ("redis://:pw@h?stream=s", "no `group=` parameter"),
            (
                "redis://:pw@h?stream=s&group=g&queue=q",
                "unknown parameter `queue`",
            ),
            (
                "redis://:pw@h?stream=s&group=g&claim-idle-ms=soon",
                "`claim-idle-ms=soon`",
            ),
            ("redis://:pw@h?stream=&group=g", "`stream=` is not valid"),
            ("amqp://:pw@h?stream=s&group=g", "scheme is `amqp`"),
        ];
        for (url, expected) in cases {
            let e = RedisStreamConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("pw"), "{url} leaks its password: {e}");
        }
        let e = RedisStreamConfig::from_url("redis://h?group=g").unwrap_err();
        assert!(e.to_string().contains("stream=NAME&group=NAME"), "{e}");
    }
}
