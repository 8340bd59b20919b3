use std::sync::Arc;

use idem_core::Store;
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
}

impl<S: Store + Clone> IdempotencyLayer<S> {
    /// A layer storing responses in `store`.
    pub fn new(store: S, config: GatewayConfig) -> Self {
        Self {
            store,
            config: Arc::new(config),
        }
    }
}

impl<S: Store + Clone, I> Layer<I> for IdempotencyLayer<S> {
    type Service = Idempotency<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        Idempotency::new(self.store.clone(), self.config.clone(), inner)
    }
}
