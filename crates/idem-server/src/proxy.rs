//! `idem proxy`: the gateway in front of any HTTP service.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::IntoResponse;
use clap::Args;
use futures_util::future::BoxFuture;
use http::uri::{Authority, Scheme, Uri};
use http::{Request, Response, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{Lease, Namespace};
use idem_http::api::Problem;
use idem_http::gateway::{GatewayBody, GatewayConfig, IdempotencyLayer};
use tower::{Layer, Service};

use crate::config::{CommonArgs, bad, read_file, resolve_common};
use crate::{Failure, init_logging, serve_until_signal, store_url};

/// `idem proxy`.
#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Address to listen on [default: 127.0.0.1:7701].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The service to protect, e.g. http://127.0.0.1:8080 (required).
    #[arg(long, env = "IDEM_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,
    /// Refuse POST and PATCH requests without an Idempotency-Key (400).
    #[arg(long, env = "IDEM_REQUIRE_KEY", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub require_key: Option<bool>,
    /// Treat identical keyless requests from one client within this many ms
    /// as one (e.g. 5000); off by default.
    #[arg(long, env = "IDEM_KEYLESS_WINDOW_MS", value_name = "MS")]
    pub keyless_window_ms: Option<u64>,
    #[command(flatten)]
    pub common: CommonArgs,
}

pub async fn run(args: ProxyArgs) -> Result<(), Failure> {
    let file = read_file(args.common.config.as_deref())?;
    let upstream_text = args.upstream.or(file.upstream.clone()).ok_or_else(|| {
        bad(
            "upstream",
            "give the service to protect: --upstream http://HOST:PORT",
        )
    })?;
    let upstream = Upstream::parse(&upstream_text)?;
    let require_key = args.require_key.or(file.require_key).unwrap_or(false);
    let keyless_window = args
        .keyless_window_ms
        .or(file.keyless_window_ms)
        .map(Duration::from_millis);
    let common = resolve_common(args.common, args.listen, "127.0.0.1:7701", &file)?;
    init_logging(&common.log)?;
    let store = store_url::open(&common).await?;
    let config = GatewayConfig {
        namespace: Namespace::new("http").expect("a valid namespace"),
        require_key,
        keyless_window,
        lease: Lease::new(common.default_lease),
        retention: common.default_retention,
        max_request_bytes: common.max_body_bytes,
        ..GatewayConfig::default()
    };
    tracing::info!(upstream = %upstream_text, store = %store.description, "starting idem proxy");
    let gateway = IdempotencyLayer::new(store.store.clone(), config).layer(upstream);
    let app = axum::Router::new().fallback_service(gateway);
    let served = serve_until_signal(app, &common, "proxy").await;
    store.close();
    served
}

/// Forwards requests to the upstream service; a failed connection answers
/// 502.
#[derive(Clone)]
struct Upstream {
    scheme: Scheme,
    authority: Authority,
    base_path: String,
    client: Client<HttpConnector, GatewayBody>,
}

impl Upstream {
    fn parse(text: &str) -> Result<Self, crate::config::ConfigError> {
        let uri: Uri = text
            .parse()
            .map_err(|e| bad("upstream", format!("{text:?} is not a URL: {e}")))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(bad(
                "upstream",
                format!("{text:?}: only http:// upstreams are supported"),
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| bad("upstream", format!("{text:?} has no host")))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Ok(Self {
            scheme: Scheme::HTTP,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }
}

impl Service<Request<GatewayBody>> for Upstream {
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<GatewayBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<GatewayBody>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let target = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build();
        let client = self.client.clone();
        Box::pin(async move {
            let Ok(target) = target else {
                return Ok(Problem::malformed("the request path cannot be forwarded")
                    .into_response()
                    .map(GatewayBody::new));
            };
            parts.uri = target;
            parts.headers.remove(header::HOST);
            for hop in [
                header::CONNECTION,
                header::TE,
                header::TRAILER,
                header::UPGRADE,
            ] {
                parts.headers.remove(hop);
            }
            match client.request(Request::from_parts(parts, body)).await {
                Ok(response) => Ok(response.map(GatewayBody::new)),
                Err(e) => {
                    tracing::warn!(error = %e, "upstream request failed");
                    Ok(Problem::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream-failed",
                        "Upstream failed",
                        format!("the upstream service could not be reached: {e}"),
                    )
                    .into_response()
                    .map(GatewayBody::new))
                }
            }
        })
    }
}
