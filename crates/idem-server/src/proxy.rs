//! `idem proxy`: the gateway in front of any HTTP service.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::IntoResponse;
use clap::Args;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http::uri::{Authority, Scheme, Uri};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{Lease, Namespace};
use idem_http::api::Problem;
use idem_http::gateway::{
    GatewayBody, GatewayConfig, HeaderScope, IdempotencyLayer, ReleasePolicy, UpstreamDeadline,
};
use tower::{Layer, Service};

use crate::config::{CommonArgs, FileSettings, bad, parse_duration, read_file, resolve_common};
use crate::run::{Failure, init_logging, serve_until_signal};
use crate::store;

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
    /// How long connecting to the upstream (TCP) may take, e.g. 500ms or
    /// 10s (a bare number is milliseconds) [default: 10s]. Past it the client gets 504 `upstream-timeout`
    /// and the key is released (nothing reached the upstream).
    #[arg(long, env = "IDEM_UPSTREAM_CONNECT_TIMEOUT", value_name = "DURATION")]
    pub upstream_connect_timeout: Option<String>,
    /// How long the upstream may take to answer, from forwarding the
    /// request to the end of the response body stored for replay, e.g. 30s
    /// or 2m [default: 60s]. Past it the call is dropped, the client gets
    /// 504 `upstream-timeout` and the key is released: the upstream may
    /// have acted, and a retry with the same key runs the request again, as
    /// after a 5xx. Make it longer than the upstream's slowest answer.
    #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT", value_name = "DURATION")]
    pub upstream_timeout: Option<String>,
    /// Which headers tell the upstream who the client is: `x-forwarded`
    /// (X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Proto), `forwarded`
    /// (RFC 7239) or `none` [default: x-forwarded]. With either of the
    /// first two, the client's own X-Forwarded-* and Forwarded headers are
    /// dropped (a client can forge them); with `none` they pass unchanged.
    #[arg(long, env = "IDEM_FORWARDED_HEADERS", value_name = "KIND")]
    pub forwarded_headers: Option<String>,
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
    let connect_timeout = match args
        .upstream_connect_timeout
        .or(file.upstream_connect_timeout.clone())
    {
        Some(text) => parse_duration("upstream_connect_timeout", &text)?,
        None => DEFAULT_CONNECT_TIMEOUT,
    };
    let upstream_timeout = match args.upstream_timeout.or(file.upstream_timeout.clone()) {
        Some(text) => parse_duration("upstream_timeout", &text)?,
        None => DEFAULT_UPSTREAM_TIMEOUT,
    };
    let forwarded = match args.forwarded_headers.or(file.forwarded_headers.clone()) {
        Some(text) => text.parse::<ForwardedHeaders>()?,
        None => ForwardedHeaders::XForwarded,
    };
    let upstream = Upstream::parse(
        &upstream_text,
        ca.as_deref(),
        args.upstream_http2 || file.upstream_http2.unwrap_or(false),
        connect_timeout,
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
    let upstream = upstream.forwarding(forwarded, common.tls.is_some());
    init_logging(&common.log)?;
    let (metrics, _) = crate::run::prometheus()?;
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
        upstream_timeout: Some(upstream_timeout),
        ..GatewayConfig::default()
    };
    tracing::info!(upstream = %upstream_text, store = %store.description, "starting idem proxy");
    let layer = IdempotencyLayer::new(store.store.clone(), config);
    let gateway = layer.layer(upstream);
    // The gateway is always ready (it awaits the upstream per request).
    let app = axum::Router::new().fallback_service(tower::service_fn(
        move |req: Request<axum::body::Body>| {
            // Refused before the gateway: no key is claimed for it.
            let climbs = has_dot_segment(req.uri().path());
            let answer = match climbs {
                true => futures_util::future::ready(Ok::<_, UpstreamError>(dot_segment_refused()))
                    .left_future(),
                false => gateway.clone().call(req).right_future(),
            };
            answer.map(|answer| {
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
/// `--upstream-connect-timeout`'s default.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `--upstream-timeout`'s default.
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);

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
    crate::run::listen_beside(addr, app, tokio_util::sync::CancellationToken::new()).await
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

/// Forwards requests to the upstream service. A connection that fails is
/// an [`UpstreamError`] (it releases the key), answered 502, or 504 when it
/// timed out. Each call is counted by status and timed:
/// `idem_proxy_upstream_requests_total{status}` (`status` is the
/// upstream's, `unreachable` or `timeout`) and
/// `idem_proxy_upstream_seconds`.
#[derive(Clone)]
struct Upstream {
    scheme: Scheme,
    authority: Authority,
    base_path: String,
    client: Client<HttpsConnector<HttpConnector>, GatewayBody>,
    forwarded: ForwardedHeaders,
    /// Whether the proxy itself serves HTTPS: X-Forwarded-Proto.
    served_over_tls: bool,
}

/// `--forwarded-headers`: how the upstream learns who the client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ForwardedHeaders {
    /// X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto.
    XForwarded,
    /// `Forwarded` (RFC 7239).
    Forwarded,
    /// Neither: the client's own pass unchanged.
    None,
}

impl std::str::FromStr for ForwardedHeaders {
    type Err = crate::config::ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "x-forwarded" => Ok(Self::XForwarded),
            "forwarded" => Ok(Self::Forwarded),
            "none" => Ok(Self::None),
            _ => Err(bad(
                "forwarded_headers",
                format!("{text:?} is not one of x-forwarded, forwarded or none"),
            )),
        }
    }
}

impl Upstream {
    fn parse(
        text: &str,
        ca: Option<&std::path::Path>,
        http2: bool,
        connect_timeout: Duration,
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
        http.set_connect_timeout(Some(connect_timeout));
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
            forwarded: ForwardedHeaders::XForwarded,
            served_over_tls: false,
        })
    }

    /// With `forwarded` headers, for a proxy that serves HTTPS when
    /// `served_over_tls`.
    fn forwarding(self, forwarded: ForwardedHeaders, served_over_tls: bool) -> Self {
        Self {
            forwarded,
            served_over_tls,
            ..self
        }
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

/// The upstream could not be reached, or did not answer in time.
struct UpstreamError {
    timed_out: Option<Duration>,
    /// The name its cause is logged under.
    request_id: String,
}

impl UpstreamError {
    fn into_response(self) -> Response<GatewayBody> {
        let id = self.request_id;
        let problem = match self.timed_out {
            Some(limit) => Problem::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timeout",
                format!(
                    "the upstream service did not answer within {} ms; the key was released, so a retry with \
                     the same Idempotency-Key runs the request again (request id {id})",
                    limit.as_millis()
                ),
            ),
            None => Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream failed",
                format!(
                    "the upstream service could not be reached; the key was released (request id {id}: the \
                     proxy's log has the cause)"
                ),
            ),
        };
        problem.request_id(id).into_response().map(GatewayBody::new)
    }
}

/// Whether `e` or one of its causes is a timed-out connect.
fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Whether `path` has a `.` or `..` segment, also percent-encoded or
/// behind an encoded or backward slash: joined to the upstream's base
/// path, it could reach outside it.
fn has_dot_segment(path: &str) -> bool {
    let path = path.to_ascii_lowercase();
    let path = path
        .replace("%2e", ".")
        .replace("%2f", "/")
        .replace("%5c", "/")
        .replace('\\', "/");
    path.split('/')
        .any(|segment| segment == "." || segment == "..")
}

/// 400 for a path with a dot segment.
fn dot_segment_refused() -> Response<GatewayBody> {
    Problem::malformed(
        "the request path has a `.` or `..` segment (perhaps percent-encoded); send the path it \
         stands for, without dot segments",
    )
    .into_response()
    .map(GatewayBody::new)
}

/// The hop-by-hop headers of RFC 9110 §7.6.1, which a proxy does not pass
/// on: those `Connection` names, and these.
/// The handles of `idem_proxy_upstream_seconds` and
/// `idem_proxy_upstream_requests_total{status}`, each made on first use: a
/// lookup by name and labels on every request costs more than the rest of
/// the proxy's own work on it.
struct UpstreamMeters {
    seconds: metrics::Histogram,
    /// By the upstream's status less 100 (statuses run from 100 to 999).
    answered: Box<[OnceLock<metrics::Counter>]>,
    timeout: OnceLock<metrics::Counter>,
    unreachable: OnceLock<metrics::Counter>,
}

impl UpstreamMeters {
    fn answered(&self, status: StatusCode) -> &metrics::Counter {
        self.answered[usize::from(status.as_u16()) - 100].get_or_init(|| {
            metrics::counter!(
                "idem_proxy_upstream_requests_total",
                "status" => status.as_str().to_owned()
            )
        })
    }

    /// `status` is `timeout` or `unreachable`.
    fn failed(&self, status: &'static str) -> &metrics::Counter {
        let slot = if status == "timeout" {
            &self.timeout
        } else {
            &self.unreachable
        };
        slot.get_or_init(
            || metrics::counter!("idem_proxy_upstream_requests_total", "status" => status),
        )
    }
}

fn upstream_meters() -> &'static UpstreamMeters {
    static METERS: OnceLock<UpstreamMeters> = OnceLock::new();
    METERS.get_or_init(|| UpstreamMeters {
        seconds: metrics::histogram!("idem_proxy_upstream_seconds"),
        answered: (100..1000).map(|_| OnceLock::new()).collect(),
        timeout: OnceLock::new(),
        unreachable: OnceLock::new(),
    })
}

const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers from `headers` (`Trailer` stays: HTTP/1
/// sends only the trailers it names).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The headers that tell the upstream who the client is (see
/// [`ForwardedHeaders`]).
fn set_forwarded(
    headers: &mut HeaderMap,
    how: ForwardedHeaders,
    client: Option<std::net::SocketAddr>,
    host: Option<HeaderValue>,
    proto: &'static str,
) {
    if how == ForwardedHeaders::None {
        return;
    }
    for name in [
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
    ] {
        headers.remove(name);
    }
    let ip = client.map(|a| a.ip());
    match how {
        ForwardedHeaders::XForwarded => {
            if let Some(v) = ip.and_then(|ip| HeaderValue::from_str(&ip.to_string()).ok()) {
                headers.insert("x-forwarded-for", v);
            }
            if let Some(host) = host {
                headers.insert("x-forwarded-host", host);
            }
            headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
        }
        ForwardedHeaders::Forwarded => {
            let mut value = match ip {
                Some(std::net::IpAddr::V6(v6)) => format!("for=\"[{v6}]\""),
                Some(v4) => format!("for={v4}"),
                None => "for=unknown".to_owned(),
            };
            if let Some(host) = host.as_ref().and_then(|h| h.to_str().ok()) {
                let quoted = host.replace('\\', "\\\\").replace('"', "\\\"");
                value.push_str(&format!(";host=\"{quoted}\""));
            }
            value.push_str(";proto=");
            value.push_str(proto);
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert("forwarded", v);
            }
        }
        ForwardedHeaders::None => {}
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
        let forwarded = self.forwarded;
        let proto = if self.served_over_tls {
            "https"
        } else {
            "http"
        };
        Box::pin(async move {
            let Ok(target) = target else {
                return Ok(Problem::malformed("the request path cannot be forwarded")
                    .into_response()
                    .map(GatewayBody::new));
            };
            let host = parts.headers.get(header::HOST).cloned().or_else(|| {
                parts
                    .uri
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            });
            // The gateway's deadline: stopping at the same moment, the
            // timeout is answered and counted here.
            let deadline = parts.extensions.get::<UpstreamDeadline>().copied();
            let client_addr = parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0);
            parts.uri = target;
            parts.headers.remove(header::HOST);
            // `TE: trailers` is the one TE passed on: without it an HTTP/1
            // upstream sends no trailers (gRPC's grpc-status).
            let wants_trailers = parts
                .headers
                .get_all(header::TE)
                .iter()
                .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(header::TRAILER);
            parts.headers.remove(header::PROXY_AUTHORIZATION);
            if wants_trailers {
                parts
                    .headers
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
            set_forwarded(&mut parts.headers, forwarded, client_addr, host, proto);
            let started = std::time::Instant::now();
            let request = client.request(Request::from_parts(parts, body));
            let answer = match deadline {
                Some(d) => tokio::time::timeout_at(d.at, request)
                    .await
                    .map_err(|_| d.limit),
                None => Ok(request.await),
            };
            let meters = upstream_meters();
            meters.seconds.record(started.elapsed());
            let failed = |status: &'static str, timed_out: Option<Duration>, why: String| {
                meters.failed(status).increment(1);
                let request_id = idem_http::api::new_request_id();
                tracing::warn!(request_id = %request_id, error = %why, "upstream request failed");
                UpstreamError {
                    timed_out,
                    request_id,
                }
            };
            match answer {
                Ok(Ok(mut response)) => {
                    meters.answered(response.status()).increment(1);
                    strip_hop_by_hop(response.headers_mut());
                    Ok(response.map(GatewayBody::new))
                }
                Ok(Err(e)) if is_timeout(&e) => Err(failed(
                    "timeout",
                    Some(started.elapsed()),
                    crate::run::error_chain(&e),
                )),
                Ok(Err(e)) => Err(failed("unreachable", None, crate::run::error_chain(&e))),
                Err(limit) => Err(failed(
                    "timeout",
                    Some(limit),
                    format!("no answer within {} ms", limit.as_millis()),
                )),
            }
        })
    }
}
