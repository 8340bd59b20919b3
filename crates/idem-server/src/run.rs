//! What the commands share to run: how they fail, log, serve HTTP until a
//! signal, and install the metrics recorder. `main.rs` only dispatches.

use crate::{config, status};

/// The Prometheus recorder every command serving metrics installs, with
/// latency buckets fit for sub-millisecond calls, and beside it the few
/// metrics the status page charts.
pub fn prometheus() -> Result<
    (
        metrics_exporter_prometheus::PrometheusHandle,
        status::Watched,
    ),
    Failure,
> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use metrics_util::layers::FanoutBuilder;
    const FAST: &[f64] = &[
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    ];
    // An upstream answers in up to `idem proxy --upstream-timeout` (60 s by
    // default).
    const UPSTREAM: &[f64] = &[
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        120.0, 300.0,
    ];
    let metric = |e| Failure::Run(format!("metrics: {e}"));
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("idem_http_request_duration_seconds".into()),
            FAST,
        )
        .map_err(metric)?
        .set_buckets_for_metric(Matcher::Full("idem_store_call_seconds".into()), FAST)
        .map_err(metric)?
        .set_buckets_for_metric(
            Matcher::Full("idem_proxy_upstream_seconds".into()),
            UPSTREAM,
        )
        .map_err(metric)?
        .build_recorder();
    let handle = prometheus.handle();
    let watched = status::Watched::default();
    let both = FanoutBuilder::default()
        .add_recorder(prometheus)
        .add_recorder(watched.clone())
        .build();
    metrics::set_global_recorder(both).map_err(|e| Failure::Run(format!("metrics: {e}")))?;
    Ok((handle, watched))
}

/// An error and its causes, one line: a TLS failure's reason is in its
/// source ("certificate unknown"), not in the client's "connect error".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Serves `app` on `addr` (metrics, health) beside a command's main work,
/// until `shutdown`.
pub async fn listen_beside(
    addr: std::net::SocketAddr,
    app: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Run(format!("cannot serve metrics on {addr}: {e}")))?;
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}

/// Why a command stopped.
pub enum Failure {
    /// Bad settings: nothing was started.
    Config(config::ConfigError),
    /// Something failed while running.
    Run(String),
    /// The command ran, with an outcome its exit code tells (`idem dlq`:
    /// 3 nothing matched, 4 some kept); the text says what.
    Exit(u8, String),
}

impl From<config::ConfigError> for Failure {
    fn from(e: config::ConfigError) -> Self {
        Failure::Config(e)
    }
}

/// Logs to stderr with `filter`.
pub fn init_logging(filter: &str) -> Result<(), config::ConfigError> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| config::bad("log", format!("{filter:?} is not a log filter: {e}")))?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    Ok(())
}

/// Serves `app` on `common.listen` (HTTPS when TLS is configured) until
/// SIGINT or SIGTERM; then stops accepting, lets in-flight requests finish
/// (up to 30 s) and returns.
pub async fn serve_until_signal(
    app: axum::Router,
    common: &config::Common,
    what: &str,
) -> Result<(), Failure> {
    let handle = axum_server::Handle::new();
    let signal = handle.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        signal.graceful_shutdown(Some(std::time::Duration::from_secs(30)));
    });
    let announce = handle.clone();
    let scheme = if common.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let what = what.to_owned();
    tokio::spawn(async move {
        if let Some(addr) = announce.listening().await {
            // Tests and scripts read this line for the bound port.
            println!("idem {what} listening on {scheme}://{addr}");
        }
    });
    // The client's address, for the proxy's X-Forwarded-For.
    let make = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    // A client that trickles its headers would hold its connection (and
    // its buffer) for as long as it likes; the body has its own deadline
    // in the router.
    let read_timeout = common.read_timeout;
    let served = match &common.tls {
        Some((cert, key)) => {
            let tls = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                .await
                .map_err(|e| {
                    config::bad(
                        "tls_cert",
                        format!("cannot load {} / {}: {e}", cert.display(), key.display()),
                    )
                })?;
            let mut server = axum_server::bind_rustls(common.listen, tls);
            server
                .http_builder()
                .http1()
                .header_read_timeout(read_timeout);
            server.handle(handle).serve(make).await
        }
        None => {
            let mut server = axum_server::bind(common.listen);
            server
                .http_builder()
                .http1()
                .header_read_timeout(read_timeout);
            server.handle(handle).serve(make).await
        }
    };
    served.map_err(|e| Failure::Run(format!("cannot serve on {}: {e}", common.listen)))
}

pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
