//! The service API of DESIGN.md §5, as an axum [`Router`](axum::Router) over
//! any store.
//!
//! - `router`: the routes and the layers around them;
//! - `extract`: the checked namespace and the JSON body;
//! - `middleware`: authorization and request metrics;
//! - `handlers`: the operations, health and the API document;
//! - `metrics`: what the service counts, and `/metrics`;
//! - `doc`: the OpenAPI document.

mod auth;
mod doc;
mod extract;
mod handlers;
mod metrics;
mod middleware;
mod problem;
mod router;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use idem_core::SharedStore;
use metrics_exporter_prometheus::PrometheusHandle;

pub use self::auth::{Auth, Grant, Namespaces};
pub use self::doc::ApiDoc;
pub use self::problem::Problem;
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
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            default_lease: Duration::from_secs(30),
            default_retention: Duration::from_secs(24 * 3600),
            max_body_bytes: 16 * 1024 * 1024,
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
}

type Shared = State<Arc<ApiState>>;
