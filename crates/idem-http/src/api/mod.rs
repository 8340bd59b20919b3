//! The service API of docs/contract.md §5, as an axum
//! [`Router`](axum::Router) over any store.
//!
//! - `router`: the routes and the layers around them;
//! - `extract`: the checked namespace and the JSON body;
//! - `batch_json`: `begin-batch` bodies of the usual shape, read fast;
//! - `middleware`: authorization and request metrics;
//! - `handlers`: the operations, health and the API document;
//! - `detached`: store operations that outlive a client who leaves;
//! - `telemetry`: what the service counts, and `/metrics`;
//! - `doc`: the OpenAPI document.

mod auth;
mod batch_json;
mod detached;
mod doc;
mod extract;
mod handlers;
mod middleware;
mod problem;
mod router;
mod telemetry;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use idem_core::{SharedStore, StoreError};
use metrics_exporter_prometheus::PrometheusHandle;

pub use self::auth::{Auth, Grant, Namespaces};
pub use self::detached::Detached;
pub use self::doc::ApiDoc;
pub use self::problem::{Problem, new_request_id};
pub use self::router::router;

/// How the service behaves, beside the store's own limits.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// The lease when a request names none.
    pub default_lease: Duration,
    /// The retention when a request names none.
    pub default_retention: Duration,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How long a client may take to send a body once its headers are in;
    /// a slower one gets 408 and its connection is closed.
    pub body_timeout: Duration,
    /// Serve `/metrics` to anyone even with auth on. Off by default: then
    /// it takes a token that may use every namespace (`*`), since its
    /// labels name every tenant's namespaces.
    pub public_metrics: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            default_lease: Duration::from_secs(30),
            default_retention: Duration::from_secs(24 * 3600),
            max_body_bytes: 16 * 1024 * 1024,
            public_metrics: false,
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The store.
    pub store: SharedStore,
    /// Behaviour.
    pub config: ApiConfig,
    /// Who may call.
    pub auth: Auth,
    /// Renders `/metrics`; `None` answers 404 there.
    pub metrics: Option<PrometheusHandle>,
    /// The store operations under way; wait for them before closing the
    /// store.
    pub detached: Detached,
}

impl ApiState {
    /// Runs `operation` on the store, detached from the request, so that a
    /// client who leaves cannot cut it short.
    async fn on_store<T: Send + 'static, F>(
        &self,
        operation: impl FnOnce(SharedStore) -> F,
    ) -> Result<T, Problem>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.detached.run(operation(self.store.clone())).await
    }
}

type Shared = State<Arc<ApiState>>;
