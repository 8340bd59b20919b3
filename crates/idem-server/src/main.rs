//! `idem`: the idem service and gateway.
//!
//! - `idem serve`: the HTTP API (begin, complete, release, extend, batches,
//!   record lookup, health, metrics, OpenAPI) over a store chosen by URL.
//! - `idem proxy --upstream URL`: the Idempotency-Key gateway in front of any
//!   HTTP service.
//! - `idem consume --from SOURCE_URL --to URL`: the sidecar that feeds any
//!   HTTP handler from a broker, effectively once.
//! - `idem inspect NS KEY`, `idem ls NS`, `idem release NS KEY --force`,
//!   `idem stats [NS]`, `idem purge NS --expired | --all --yes`: looking
//!   inside a store, and the operator's overrides.
//! - `idem dlq ls|show|replay --from BROKER_URL`: dead letters listed, read
//!   and replayed after a fix.
//! - `idem doctor --store URL [--from BROKER_URL]`: whether idem can work
//!   here, each problem with its fix.
//! - `idem migrate --store URL`, `idem sweep --store URL`: upkeep of an SQL
//!   store's tables.
//! - `idem health`, `idem completions SHELL`, `idem man`: the container's
//!   health check, shell completions and manual pages.

mod config;
mod consume;
mod dlq;
mod doctor;
mod health;
mod manual;
mod ops;
mod proxy;
mod serve;
mod status;
mod store;
#[cfg(feature = "sql")]
mod upkeep;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "idem",
    version,
    about = "Make at-least-once delivery safe: however often a request or message arrives, its effect happens once.",
    long_about = None,
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the HTTP API for clients in any language.
    Serve(serve::ServeArgs),
    /// Put the Idempotency-Key gateway in front of an HTTP service.
    Proxy(proxy::ProxyArgs),
    /// Feed messages from a broker to an HTTP handler, effectively once.
    Consume(consume::ConsumeArgs),
    /// Show one record: state, token, attempts, lease left, outcome.
    Inspect(ops::InspectArgs),
    /// List a namespace's records, e.g. stuck ones: `--state in-progress
    /// --older-than 10m`.
    Ls(ops::LsArgs),
    /// Take a live claim from a holder known to be gone (`--force`): the
    /// next delivery runs the work again.
    Release(ops::ReleaseArgs),
    /// Count a namespace's records (or every namespace's) by state, with
    /// the oldest claim in progress and the store's size.
    Stats(ops::counts::StatsArgs),
    /// Remove a namespace's expired records (`--expired`), or all of them
    /// (`--all --yes`).
    Purge(ops::counts::PurgeArgs),
    /// List, show and replay the dead letters of a broker source.
    Dlq(dlq::DlqArgs),
    /// Check that idem can work here: the store (reach, round trip, a
    /// claim, clock skew, schema, settings) and the broker, each problem
    /// with its fix.
    Doctor(doctor::DoctorArgs),
    /// Bring an SQL store's tables up to the schema this idem needs.
    #[cfg(feature = "sql")]
    Migrate(upkeep::MigrateArgs),
    /// Delete an SQL store's expired records now, in small batches.
    #[cfg(feature = "sql")]
    Sweep(upkeep::SweepArgs),
    /// Ask a running idem whether it is ready (exit 0) or not (1): the
    /// container image's health check.
    Health(health::HealthArgs),
    /// Print the completion script for a shell.
    Completions(manual::CompletionsArgs),
    /// Print the manual page, or write every page into a directory.
    Man(manual::ManArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Proxy(args) => proxy::run(args).await,
            Command::Consume(args) => consume::run(args).await,
            Command::Inspect(args) => ops::inspect(args).await,
            Command::Ls(args) => ops::ls(args).await,
            Command::Release(args) => ops::release(args).await,
            Command::Stats(args) => ops::counts::stats(args).await,
            Command::Purge(args) => ops::counts::purge(args).await,
            Command::Dlq(args) => dlq::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
            #[cfg(feature = "sql")]
            Command::Migrate(args) => upkeep::migrate(args).await,
            #[cfg(feature = "sql")]
            Command::Sweep(args) => upkeep::sweep(args).await,
            Command::Health(args) => health::run(args).await,
            Command::Completions(args) => manual::completions(args),
            Command::Man(args) => manual::man(args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(e)) => {
            eprintln!("idem: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            eprintln!("idem: {e}");
            ExitCode::FAILURE
        }
    }
}

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
    let metric = |e| Failure::Run(format!("metrics: {e}"));
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("idem_http_request_duration_seconds".into()),
            FAST,
        )
        .map_err(metric)?
        .set_buckets_for_metric(Matcher::Full("idem_store_call_seconds".into()), FAST)
        .map_err(metric)?
        .set_buckets_for_metric(Matcher::Full("idem_proxy_upstream_seconds".into()), FAST)
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
    let make = app.into_make_service();
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
