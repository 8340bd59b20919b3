//! Connections: a standalone Redis or a cluster, plain TCP or TLS, and what
//! the server can do.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::builder::RedisStoreBuilder;

/// Why [`RedisStore::connect`](crate::RedisStore::connect) failed. Shows the address with any password
/// hidden.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to Redis at {url}: {source}")]
pub struct ConnectError {
    pub(crate) url: String,
    #[source]
    pub(crate) source: redis::RedisError,
}

/// `url` with its credentials hidden, for messages and logs:
/// `redis://user:secret@host:6379/0` reads `redis://user:***@host:6379/0`.
/// Everything before the last `@` counts as credentials, so a password
/// with a stray `@` or `/` in it stays hidden too. Tabs and line breaks are
/// dropped first, as URL parsers (the Redis client's among them) drop them:
/// `redis:/⏎/user:secret@host` connects with the password, so it is hidden
/// too.
pub fn redacted(url: &str) -> String {
    idem_core::text::redacted_url(url)
}

/// A standalone Redis (reconnecting, multiplexed) or a Redis Cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisStoreBuilder {
    /// A connection to the standalone Redis (`seed`) or to the cluster,
    /// each call answered within `answer_within`.
    pub(crate) async fn open(
        &self,
        seed: redis::RedisResult<redis::Client>,
        answer_within: Duration,
    ) -> redis::RedisResult<Conn> {
        if self.cluster {
            #[cfg(feature = "tls")]
            install_crypto_provider();
            let builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone())
                .connection_timeout(self.timeout)
                .response_timeout(answer_within);
            #[cfg(feature = "tls")]
            let builder = match &self.tls {
                Some(certs) => builder.certs(certs.clone()),
                None => builder,
            };
            return Ok(Conn::Cluster(
                builder.build()?.get_async_connection().await?,
            ));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(answer_within))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        Ok(Conn::Single(
            ConnectionManager::new_with_config(seed?, config).await?,
        ))
    }

    /// A client for `url`, with the configured certificates.
    pub(crate) fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        install_crypto_provider();
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.tls {
            return redis::Client::build_with_tls(url, certs.clone());
        }
        redis::Client::open(url)
    }
}

/// Makes ring rustls's process-wide crypto provider, unless one is set
/// already. rustls chooses one by itself only when the build links exactly
/// one; a program that also links aws-lc-rs through another dependency
/// would otherwise fail at its first TLS connection. Called before every
/// TLS client this crate makes; other TLS users in the same program can
/// call it too.
#[cfg(feature = "tls")]
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(feature = "tls")]
pub(crate) fn no_certificates() -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: None,
    }
}

/// Whether the Redis behind `conn` takes `SET key value NX GET` (Redis and
/// Valkey 7.0 and later); when it cannot tell, the store uses `GET` and
/// `SET`, which every version takes.
pub(crate) async fn supports_nx_get(conn: &Conn) -> bool {
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let reply: Result<Value, _> = match conn {
        Conn::Single(c) => info.query_async(&mut c.clone()).await,
        Conn::Cluster(c) => {
            c.clone()
                .route_command(info, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                .await
        }
    };
    let Some(text) = reply
        .ok()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())
    else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn credentials_are_hidden_in_shown_addresses() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
            ("rediss://app:secret@h:6380", "rediss://app:***@h:6380"),
            ("redis://secret@h", "redis://***@h"),
            ("redis://app:se@c/r@et@h:1", "redis://app:***@h:1"),
            ("not a url", "not a url"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }

    #[test]
    fn a_password_in_a_url_broken_by_tabs_or_line_breaks_is_hidden_too() {
        // URL parsers drop tabs and line breaks: each of these connects
        // with the password `secret`.
        for url in [
            "redis:/\n/app:secret@h:6379",
            "redis://app:se\tcret@h",
            "redis:\r\n//:secret@h",
        ] {
            let shown = redacted(url);
            assert!(
                !shown.contains("secret") && !shown.contains("se\tcret"),
                "{url:?} shown as {shown:?}"
            );
            assert!(shown.contains("***@h"), "{shown:?}");
        }
    }
}
