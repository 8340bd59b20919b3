use std::sync::Arc;

use idem_core::Store;
use tokio_util::task::TaskTracker;
use tower::Layer;

use super::{GatewayConfig, Idempotency};

/// Puts an [`Idempotency`] gateway in front of a service.
///
/// ```
/// use idem_core::MemoryStore;
/// use idem_http::gateway::{GatewayConfig, IdempotencyLayer};
/// let app: axum::Router = axum::Router::new()
///     .route("/orders", axum::routing::post(|| async { "created" }))
///     .layer(IdempotencyLayer::new(MemoryStore::new(), GatewayConfig::default()));
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyLayer<S> {
    store: S,
    config: Arc<GatewayConfig>,
    tasks: TaskTracker,
}

impl<S: Store + Clone> IdempotencyLayer<S> {
    /// A layer storing responses in `store`.
    pub fn new(store: S, config: GatewayConfig) -> Self {
        Self {
            store,
            config: Arc::new(config),
            tasks: TaskTracker::new(),
        }
    }

    /// Waits until every detached upstream call of the services this layer
    /// made has finished and stored its answer: call it at shutdown, after
    /// the server stopped taking requests, so that answers to clients that
    /// already left are not lost.
    ///
    /// # Cancel safety
    ///
    /// Only waits: dropping it changes nothing.
    pub async fn wait_detached(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }
}

impl<S: Store + Clone, I> Layer<I> for IdempotencyLayer<S> {
    type Service = Idempotency<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        Idempotency::with_tasks(
            self.store.clone(),
            self.config.clone(),
            self.tasks.clone(),
            inner,
        )
    }
}
