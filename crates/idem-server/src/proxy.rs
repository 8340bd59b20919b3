//! `idem proxy`: the gateway in front of any HTTP service.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::IntoResponse;
use clap::Args;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::uri::{Authority, Scheme, Uri};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{Lease, Namespace};
use idem_http::api::Problem;
use idem_http::gateway::{
    GatewayBody, GatewayConfig, HeaderScope, IdempotencyLayer, ReleasePolicy,
};
use tower::{Layer, Service};

use crate::config::{CommonArgs, FileSettings, bad, read_file, resolve_common};
use crate::{Failure, init_logging, serve_until_signal, store};

/// `idem proxy`.
#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Address to listen on [default: 127.0.0.1:7701].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The service to protect, e.g. http://127.0.0.1:8080 or
    /// https://api.internal (required). HTTPS upstreams are checked against
    /// the system's roots, or --upstream-ca-cert, and speak HTTP/2 when
    /// they offer it.
    #[arg(long, env = "IDEM_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,
    /// A PEM file of the certificate authorities an https:// upstream's
    /// certificate must chain to, instead of the system's roots (a private
    /// CA).
    #[arg(long, env = "IDEM_UPSTREAM_CA_CERT", value_name = "FILE")]
    pub upstream_ca_cert: Option<std::path::PathBuf>,
    /// Speak HTTP/2 to an http:// upstream (prior knowledge, h2c); an
    /// https:// upstream gets HTTP/2 whenever it offers it.
    #[arg(long, env = "IDEM_UPSTREAM_HTTP2")]
    pub upstream_http2: bool,
    /// Serve the proxy's Prometheus metrics (GET /metrics) on this address,
    /// e.g. 127.0.0.1:9465 [default: off]; every path of --listen goes to
    /// the upstream.
    #[arg(long, env = "IDEM_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Refuse POST and PATCH requests without an Idempotency-Key (400).
    #[arg(long, env = "IDEM_REQUIRE_KEY", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub require_key: Option<bool>,
    /// Treat identical keyless requests from one client within this many ms
    /// as one (e.g. 5000); off by default. Needs --scope-header or
    /// --scope-cookie, to tell clients apart.
    #[arg(long, env = "IDEM_KEYLESS_WINDOW_MS", value_name = "MS")]
    pub keyless_window_ms: Option<u64>,
    /// A header that identifies the client, e.g. X-API-Key: keys are scoped
    /// by it, so two clients never see each other's responses. Repeat for
    /// more; in IDEM_SCOPE_HEADERS separate them with `,` [default:
    /// Authorization, unless --scope-cookie is given].
    #[arg(
        long = "scope-header",
        env = "IDEM_SCOPE_HEADERS",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub scope_headers: Vec<String>,
    /// A cookie that identifies the client (a session cookie), like
    /// --scope-header. Repeatable; `,`-separated in IDEM_SCOPE_COOKIES.
    #[arg(
        long = "scope-cookie",
        env = "IDEM_SCOPE_COOKIES",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub scope_cookies: Vec<String>,
    /// Upstream statuses that release the key (the client may retry and
    /// the retry reaches the upstream) instead of being stored and replayed;
    /// `none` stores all. An unreachable upstream always releases [default:
    /// 408,425,429,500-599].
    #[arg(long, env = "IDEM_RELEASE_STATUS", value_name = "LIST")]
    pub release_status: Option<String>,
    /// Largest response body stored for replay, in bytes; a larger one
    /// streams through to the client and a repeat of its key gets 409
    /// `response-not-replayable`. At most --max-outcome-bytes [default:
    /// 1048576].
    #[arg(long, env = "IDEM_MAX_RESPONSE_BYTES", value_name = "BYTES")]
    pub max_response_bytes: Option<usize>,
    #[command(flatten)]
    pub common: CommonArgs,
}

pub async fn run(args: ProxyArgs) -> Result<(), Failure> {
    let file = read_file(args.common.store.config.as_deref())?;
    let upstream_text = args.upstream.or(file.upstream.clone()).ok_or_else(|| {
        bad(
            "upstream",
            "give the service to protect: --upstream http://HOST:PORT",
        )
    })?;
    let ca = args.upstream_ca_cert.or(file.upstream_ca_cert.clone());
    let upstream = Upstream::parse(
        &upstream_text,
        ca.as_deref(),
        args.upstream_http2 || file.upstream_http2.unwrap_or(false),
    )?;
    let metrics_listen = args
        .metrics_listen
        .or(file.metrics_listen.clone())
        .map(|a| {
            a.parse::<std::net::SocketAddr>()
                .map_err(|e| bad("metrics_listen", format!("{a:?} is not an address: {e}")))
        })
        .transpose()?;
    let require_key = args.require_key.or(file.require_key).unwrap_or(false);
    let keyless_window = args
        .keyless_window_ms
        .or(file.keyless_window_ms)
        .map(Duration::from_millis);
    let scope = resolve_scope(args.scope_headers, args.scope_cookies, &file)?;
    if keyless_window.is_some() && scope.is_none() {
        return Err(bad(
            "keyless_window_ms",
            "the keyless window merges identical requests of one client, so it must know who the \
             client is: add --scope-header NAME (e.g. Authorization or X-API-Key) or \
             --scope-cookie NAME, naming what your clients authenticate with",
        )
        .into());
    }
    let release = match args.release_status.or(file.release_status.clone()) {
        Some(text) => text
            .parse::<ReleasePolicy>()
            .map_err(|e| bad("release_status", e.to_string()))?,
        None => ReleasePolicy::default(),
    };
    let max_response_bytes = args.max_response_bytes.or(file.max_response_bytes);
    let common = resolve_common(args.common, args.listen, "127.0.0.1:7701", &file)?;
    let max_response_bytes = max_response_bytes.unwrap_or(common.limits.max_outcome_bytes);
    if max_response_bytes == 0 || max_response_bytes > common.limits.max_outcome_bytes {
        return Err(bad(
            "max_response_bytes",
            format!(
                "must be from 1 to max_outcome_bytes ({}): a stored response cannot be larger \
                 than the store's outcome limit (raise --max-outcome-bytes, or lower \
                 --max-response-bytes)",
                common.limits.max_outcome_bytes
            ),
        )
        .into());
    }
    init_logging(&common.log)?;
    let (metrics, _) = crate::prometheus()?;
    let store = store::open(&common).await?;
    if let Some(addr) = metrics_listen {
        serve_metrics(addr, metrics).await?;
    }
    let config = GatewayConfig {
        namespace: Namespace::new("http").expect("a valid namespace"),
        client_scope: Arc::new(scope.unwrap_or_default()),
        require_key,
        keyless_window,
        lease: Lease::new(common.default_lease),
        retention: common.default_retention,
        max_request_bytes: common.max_body_bytes,
        max_response_bytes,
        release,
        ..GatewayConfig::default()
    };
    tracing::info!(upstream = %upstream_text, store = %store.description, "starting idem proxy");
    let layer = IdempotencyLayer::new(store.store.clone(), config);
    let gateway = layer.layer(upstream);
    // The gateway is always ready (it awaits the upstream per request).
    let app = axum::Router::new().fallback_service(tower::service_fn(
        move |req: Request<axum::body::Body>| {
            gateway.clone().call(req).map(|answer| {
                Ok::<_, Infallible>(answer.unwrap_or_else(UpstreamError::into_response))
            })
        },
    ));
    let served = serve_until_signal(app, &common, "proxy").await;
    // Calls whose clients left are still running: let them store their
    // answers before the store closes.
    if tokio::time::timeout(SHUTDOWN_GRACE, layer.wait_detached())
        .await
        .is_err()
    {
        tracing::warn!("upstream calls still running after 30 s; their claims will expire");
    }
    store.close().await;
    served
}

const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves `GET /metrics` and `GET /health` on `addr`, for as long as the
/// process runs.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> Result<(), Failure> {
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || std::future::ready(metrics.render())),
        )
        .route("/health", axum::routing::get(|| std::future::ready("ok")));
    crate::listen_beside(addr, app, tokio_util::sync::CancellationToken::new()).await
}

/// `--scope-header` and `--scope-cookie` (flags and environment, else the
/// file); `None` when neither is given.
fn resolve_scope(
    headers: Vec<String>,
    cookies: Vec<String>,
    file: &FileSettings,
) -> Result<Option<HeaderScope>, crate::config::ConfigError> {
    let from_flags = !headers.is_empty() || !cookies.is_empty();
    let (headers, cookies) = match from_flags {
        true => (headers, cookies),
        false => (file.scope_headers.clone(), file.scope_cookies.clone()),
    };
    let headers: Vec<String> = headers
        .into_iter()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    let cookies: Vec<String> = cookies
        .into_iter()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect();
    if headers.is_empty() && cookies.is_empty() {
        return Ok(None);
    }
    for h in &headers {
        if HeaderScope::try_new([h]).is_err() {
            return Err(bad(
                "scope_headers",
                format!("{h:?} is not a header name; give e.g. X-API-Key"),
            ));
        }
    }
    if let Some(c) = cookies.iter().find(|c| {
        !c.bytes()
            .all(|b| b.is_ascii_graphic() && !b"=;,".contains(&b))
    }) {
        return Err(bad(
            "scope_cookies",
            format!("{c:?} is not a cookie name; give e.g. session"),
        ));
    }
    let scope = HeaderScope::try_new(&headers).expect("names checked above");
    Ok(Some(cookies.into_iter().fold(scope, HeaderScope::cookie)))
}

/// Forwards requests to the upstream service; a failed connection is an
/// [`UpstreamError`] (it releases the key), answered 502. Each call is
/// counted by status and timed: `idem_proxy_upstream_requests_total{status}`
/// (`status` is the upstream's, or `unreachable`) and
/// `idem_proxy_upstream_seconds`.
#[derive(Clone)]
struct Upstream {
    scheme: Scheme,
    authority: Authority,
    base_path: String,
    client: Client<HttpsConnector<HttpConnector>, GatewayBody>,
}

impl Upstream {
    fn parse(
        text: &str,
        ca: Option<&std::path::Path>,
        http2: bool,
    ) -> Result<Self, crate::config::ConfigError> {
        let uri: Uri = text
            .parse()
            .map_err(|e| bad("upstream", format!("{text:?} is not a URL: {e}")))?;
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => s.clone(),
            _ => {
                return Err(bad(
                    "upstream",
                    format!("{text:?}: give an http:// or https:// URL"),
                ));
            }
        };
        if ca.is_some() && scheme != Scheme::HTTPS {
            return Err(bad(
                "upstream_ca_cert",
                "is for an https:// upstream: give --upstream https://HOST:PORT",
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| bad("upstream", format!("{text:?} has no host")))?;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let tls = tls_config(ca)?;
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_all_versions();
        let connector = builder.wrap_connector(http);
        let mut client = Client::builder(TokioExecutor::new());
        if http2 && scheme == Scheme::HTTP {
            client.http2_only(true);
        }
        Ok(Self {
            scheme,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            client: client.build(connector),
        })
    }
}

/// The TLS settings for an https:// upstream: the CAs of `ca`, else the
/// system's roots.
fn tls_config(
    ca: Option<&std::path::Path>,
) -> Result<rustls::ClientConfig, crate::config::ConfigError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;

    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect())
                .map_err(|e| {
                    bad(
                        "upstream_ca_cert",
                        format!("cannot read certificates from {}: {e}", path.display()),
                    )
                })?;
            if certs.is_empty() {
                return Err(bad(
                    "upstream_ca_cert",
                    format!("{} holds no PEM certificate", path.display()),
                ));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    bad(
                        "upstream_ca_cert",
                        format!(
                            "a certificate in {} is not a CA idem can use: {e}",
                            path.display()
                        ),
                    )
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading the system's root certificates");
            }
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    "no system root certificate was found: https:// upstreams will be refused unless --upstream-ca-cert is given"
                );
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("upstream", format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // ALPN (h2, then http/1.1) is set by the connector.
    Ok(config)
}

/// The upstream could not be reached.
struct UpstreamError(String);

impl UpstreamError {
    fn into_response(self) -> Response<GatewayBody> {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "upstream-failed",
            "Upstream failed",
            format!("the upstream service could not be reached: {}", self.0),
        )
        .into_response()
        .map(GatewayBody::new)
    }
}

impl Service<Request<GatewayBody>> for Upstream {
    type Response = Response<GatewayBody>;
    type Error = UpstreamError;
    type Future = BoxFuture<'static, Result<Response<GatewayBody>, UpstreamError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), UpstreamError>> {
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
            // `TE: trailers` is the one TE passed on: without it an HTTP/1
            // upstream sends no trailers (gRPC's grpc-status).
            let wants_trailers = parts
                .headers
                .get_all(header::TE)
                .iter()
                .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
            for hop in [
                header::CONNECTION,
                header::TE,
                header::TRAILER,
                header::UPGRADE,
            ] {
                parts.headers.remove(hop);
            }
            if wants_trailers {
                parts
                    .headers
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
            let started = std::time::Instant::now();
            let answer = client.request(Request::from_parts(parts, body)).await;
            metrics::histogram!("idem_proxy_upstream_seconds").record(started.elapsed());
            match answer {
                Ok(response) => {
                    metrics::counter!(
                        "idem_proxy_upstream_requests_total",
                        "status" => response.status().as_str().to_owned()
                    )
                    .increment(1);
                    Ok(response.map(GatewayBody::new))
                }
                Err(e) => {
                    metrics::counter!("idem_proxy_upstream_requests_total", "status" => "unreachable")
                        .increment(1);
                    let why = crate::error_chain(&e);
                    tracing::warn!(error = %why, "upstream request failed");
                    Err(UpstreamError(why))
                }
            }
        })
    }
}
