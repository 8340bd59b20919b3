//! Configuring and connecting a store.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Limits;

#[cfg(feature = "tls")]
use crate::conn::no_certificates;
use crate::conn::{ConnectError, redacted, supports_nx_get};
use crate::layout::millis;
use crate::lock;
use crate::script::{ITEMS_PER_CALL, Scripts};
use crate::store::{Inner, Records, RedisStore};
use idem_core::coalesce::StoreBatches;
use idem_core::layer::Checked;

/// Configures a [`RedisStore`].
#[derive(Debug)]
pub struct RedisStoreBuilder {
    /// One URL for a standalone Redis; the seed nodes for a cluster.
    pub(crate) nodes: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) limits: Limits,
    pub(crate) abandoned_retention: Duration,
    pub(crate) tombstone_ttl: Duration,
    pub(crate) timeout: Duration,
    pub(crate) replicas: Option<(u32, Duration)>,
    pub(crate) coalesce: bool,
    /// Use `GET` then `SET` even where `SET … NX GET` is known.
    pub(crate) plain_commands: bool,
    /// Certificates for `rediss://` beyond the system's trust store.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<redis::TlsCertificates>,
}

impl RedisStoreBuilder {
    /// The limits to enforce.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How long an in-progress record whose lease ran out is kept so a
    /// takeover counts its attempts (default 1 hour).
    pub fn abandoned_retention(mut self, d: Duration) -> Self {
        self.abandoned_retention = d;
        self
    }

    /// How long a released key remembers its last token (default 1 hour).
    pub fn tombstone_ttl(mut self, d: Duration) -> Self {
        self.tombstone_ttl = d;
        self
    }

    /// After each `complete`, wait until `replicas` replicas have the write
    /// (`WAIT`), for at most `timeout`. This narrows, and cannot close, the
    /// window in which a failover loses an acknowledged completion: Redis
    /// replication stays asynchronous, a replica that acknowledged can still
    /// lose the write, and when fewer replicas answer in time the
    /// completion stands anyway (it is logged). Completions then travel on
    /// a connection of their own (`WAIT` holds the connection it is sent
    /// on), answered within the call timeout plus `timeout`, so a slow or
    /// missing replica holds up completions only. Off by default.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// For `rediss://` URLs: trust the certificate authorities in `pem`
    /// (one or more PEM certificates) instead of the system's trust store,
    /// as for a Redis whose certificate a private CA signed. Without it,
    /// `rediss://` checks the server against the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(no_certificates).root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate chain and
    /// private key (PEM), for a Redis that asks for them
    /// (`tls-auth-clients yes`, Redis's default once TLS is on).
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.get_or_insert_with(no_certificates).client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// Whether single `begin`s and `complete`s issued at the same time are
    /// sent together as one many-item script call (default on). A call that
    /// finds nothing in flight always goes straight out, so this costs a
    /// lone caller nothing; under concurrency it saves Redis most of its
    /// per-call work.
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// Claims fresh keys with `GET` then `SET`, as on a Redis before 7.0,
    /// even where `SET … NX GET` is known: lets the tests run that path on
    /// a current Redis.
    #[doc(hidden)]
    pub fn plain_commands(mut self) -> Self {
        self.plain_commands = true;
        self
    }

    /// The limit on connecting and on each call (default 2 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Connects.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves nothing behind but the
    /// connections it opened, which close.
    pub async fn connect(self) -> Result<RedisStore, ConnectError> {
        let fail = |source| ConnectError {
            url: self
                .nodes
                .iter()
                .map(|n| redacted(n))
                .collect::<Vec<_>>()
                .join(","),
            source,
        };
        // The first node's client: the standalone Redis, or the seed whose
        // settings serve for a lock waiter's connection to any master.
        let seed = self.client(&self.nodes[0]);
        let client_for_waiters = seed.as_ref().ok().cloned();
        let conn = self.open(seed, self.timeout).await.map_err(fail)?;
        // `WAIT` holds the connection it is sent on until the replicas
        // answer: completions that wait get a connection of their own, so
        // everything else goes on meanwhile.
        let waiting = match self.replicas {
            Some((_, wait)) => {
                let seed = self.client(&self.nodes[0]);
                Some(self.open(seed, self.timeout + wait).await.map_err(fail)?)
            }
            None => None,
        };
        let nx_get = !self.plain_commands && supports_nx_get(&conn).await;
        let inner = Arc::new(Inner {
            conn,
            waiting,
            client: client_for_waiters,
            scripts: Scripts::new(),
            lock_scripts: lock::Scripts::new(),
            limits: self.limits,
            abandoned_ms: millis(self.abandoned_retention),
            tombstone_ms: millis(self.tombstone_ttl).max(1),
            replicas: self.replicas,
            nx_get,
            timeout: self.timeout,
        });
        let batches = Arc::new(StoreBatches::start(
            inner.clone(),
            self.coalesce,
            ITEMS_PER_CALL,
        ));
        Ok(RedisStore {
            store: Checked::new(Records { inner, batches }),
        })
    }
}
