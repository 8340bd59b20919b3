//! A lock waiter's connection of its own, to block on without holding up
//! anyone else.

use crate::cluster::{cluster_nodes, master_of, slot};
use crate::conn::Conn;
use crate::store::Inner;

impl Inner {
    /// A connection of its own, without a response limit (for `BLPOP`), to
    /// the node that holds `key`: the standalone Redis, or the cluster
    /// master serving its slot. `None` when that node is not known.
    pub(crate) async fn blocking_connection(
        &self,
        key: &[u8],
    ) -> Option<redis::aio::MultiplexedConnection> {
        let seed = self.client.as_ref()?;
        let client = match &self.conn {
            Conn::Single(_) => seed.clone(),
            Conn::Cluster(c) => {
                let nodes = cluster_nodes(c).await.ok()?;
                let (host, port) = master_of(&nodes, slot(key), self.seed_host())?;
                let info = seed.get_connection_info().clone();
                // The master's address, reached as the seed is (plain TCP or
                // TLS with the same certificates).
                let addr = match info.addr() {
                    redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host, port),
                    redis::ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => redis::ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => return None,
                };
                redis::Client::open(info.set_addr(addr)).ok()?
            }
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()
    }
}
