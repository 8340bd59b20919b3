//! The RocketMQ client's own runtime, which every producer and consumer of
//! this crate runs on, and what can go wrong starting one.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig};
use rocketmq_observability::TelemetryHandle;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

/// The source or publisher could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No name server answered.
    #[error(
        "no RocketMQ name server answers at {address} ({reason}); start one (e.g. `rocketmq-namesrv-rust --listenPort 9876`) or fix the URL"
    )]
    Unreachable {
        /// The name servers, `;`-separated.
        address: String,
        /// Why.
        reason: String,
    },
    /// The configuration cannot be used.
    #[error("{0}")]
    Config(#[from] crate::ConfigError),
    /// The client refused to start.
    #[error("the RocketMQ {what} did not start: {reason}")]
    Client {
        /// The producer, the consumer or the client's runtime.
        what: &'static str,
        /// What the client said.
        reason: String,
    },
}

/// The runtime the RocketMQ client runs on.
///
/// The client takes a runtime of its own (it never uses the caller's): its
/// connections, rebalancing and offset upkeep run there, and the consume
/// listener runs on its blocking threads. Dropping the host ends it at once.
/// Public for a caller that uses the client's own producers, consumers or
/// admin beside idem's (a check that reads the broker without idem's code).
pub struct ClientHost {
    owner: Mutex<Option<RuntimeOwner>>,
    runtime: Arc<ClientRuntime>,
}

impl ClientHost {
    /// A runtime whose blocking lane admits `waiting` listener calls at
    /// once without a timeout: each waits for the runner's verdict, as long
    /// as the handler takes. A client with no listener passes 0.
    pub fn new(waiting: usize) -> Result<Arc<Self>, ConnectError> {
        let fail = |reason: String| ConnectError::Client {
            what: "client runtime",
            reason,
        };
        let threads = (waiting + 16).clamp(8, 512);
        let mut config = RuntimeConfig::for_parallelism("idem-rocketmq", 2)
            .with_max_blocking_threads(threads)
            .map_err(|e| fail(e.to_string()))?;
        let lane = &mut config.blocking_lane_policies.metadata_io;
        lane.max_concurrency = threads;
        lane.max_queue_depth = threads * 4;
        // A listener waits for the handler; the client's own consume
        // timeout (15 minutes) is what bounds it.
        lane.queue_timeout = Duration::from_secs(3600);
        lane.task_timeout = Duration::from_secs(24 * 3600);
        lane.warn_after = Duration::from_secs(3600);
        let owner = RuntimeOwner::plan(config)
            .map_err(|e| fail(e.to_string()))?
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let runtime = ClientRuntime::try_new(
            owner.root_context().component("client"),
            ClientRuntimeConfig::default(),
            TelemetryHandle::noop(),
        )
        .map_err(|e| fail(e.to_string()))?;
        Ok(Arc::new(Self {
            owner: Mutex::new(Some(owner)),
            runtime,
        }))
    }

    /// The handle the client's builders and `start` take.
    pub fn runtime(&self) -> Arc<ClientRuntime> {
        Arc::clone(&self.runtime)
    }

    /// Stops the client's runtime: its tasks end, its connections close.
    /// Blocked listener threads are left to return on their own.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the runtime to stop when the host is
    /// dropped.
    pub async fn shutdown(&self) {
        let _ = Box::pin(self.runtime.shutdown()).await;
        self.stop_now();
    }

    fn stop_now(&self) {
        let owner = self.owner.lock().map(|mut o| o.take()).unwrap_or(None);
        if let Some(owner) = owner {
            // Never blocks, so it is safe on any thread, async or not.
            let _ = owner.shutdown_background();
        }
    }
}

impl Drop for ClientHost {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// A client instance name no other producer or consumer of this process
/// uses: the broker tells consumers apart by `ip@instance`.
pub(crate) fn instance_name(role: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "idem-{role}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fails with [`ConnectError::Unreachable`] unless one of the name
/// servers accepts a TCP connection within two seconds: the client itself
/// only logs and keeps trying.
pub(crate) async fn probe(name_servers: &str) -> Result<(), ConnectError> {
    let mut last = String::new();
    for server in name_servers.split(';') {
        match tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(server),
        )
        .await
        {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out after 2s".into(),
        }
    }
    Err(ConnectError::Unreachable {
        address: name_servers.to_owned(),
        reason: last,
    })
}
