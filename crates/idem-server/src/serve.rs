//! `idem serve`.

use clap::Args;
use idem_http::api::{ApiConfig, ApiState, Detached, router};

use crate::config::{CommonArgs, read_file, resolve_common};
use crate::run::{Failure, init_logging, serve_until_signal};
use crate::status::{self, Access, Status, StatusPage, StoreWatch};
use crate::store;

/// `idem serve`.
#[derive(Args, Debug)]
#[command(
    after_long_help = "Request bodies are JSON: send `Content-Type: application/json` (curl: --json); \
        anything else is answered 415. Outcomes are returned exactly as sent. A client that \
        disconnects never cuts a store operation short. The whole API: GET /openapi.json."
)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7700].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Who may read the status page at `/` and `/status.json`: `on` (with
    /// --auth-token, a bearer token that sees only its own namespaces, and
    /// the store's address and settings with a `*` token; without auth,
    /// anyone), `public` (anyone, everything: every tenant's namespaces and
    /// stuck keys) or `off` [default: on].
    #[arg(long, value_enum, env = "IDEM_STATUS_PAGE", value_name = "MODE")]
    pub status_page: Option<StatusPage>,
    /// The same as --status-page off.
    #[arg(long, conflicts_with = "status_page")]
    pub no_status_page: bool,
    /// Serve `/metrics` to anyone even with --auth-token (its labels name
    /// every tenant's namespaces); by default it then takes a token for
    /// every namespace (`*`), as Prometheus sends with `authorization:
    /// {credentials: …}`.
    #[arg(long, env = "IDEM_PUBLIC_METRICS")]
    pub public_metrics: bool,
    /// The status page lists claims in progress for longer than this as
    /// stuck: `90s`, `10m`, `2h`.
    #[arg(long, value_name = "AGE", value_parser = crate::ops::parse_age, default_value = "1m")]
    pub stuck_after: std::time::Duration,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Serves the API until SIGINT or SIGTERM, then lets in-flight requests and
/// every store operation under way finish (also those whose client left)
/// before it closes the store.
///
/// # Cancel safety
///
/// Not meant to be cancelled: it returns on a signal. Dropped early, store
/// operations under way still finish on their own tasks while the runtime
/// lives, but the store is not flushed and closed.
pub async fn run(args: ServeArgs) -> Result<(), Failure> {
    let file = read_file(args.common.store.config.as_deref())?;
    let common = resolve_common(args.common, args.listen, "127.0.0.1:7700", &file)?;
    init_logging(&common.log)?;
    // Installed first: the store's metric handles are made as it opens.
    let (metrics, watched) = crate::run::prometheus()?;
    let store = store::open(&common).await?;
    tracing::info!(store = %store.description, auth = common.auth.is_on(), "starting idem serve");
    let detached = Detached::default();
    let status_page = match args.no_status_page {
        true => StatusPage::Off,
        false => args.status_page.unwrap_or(StatusPage::On),
    };
    let mut app = router(ApiState {
        store: store.store.clone(),
        config: ApiConfig {
            default_lease: common.default_lease,
            default_retention: common.default_retention,
            max_body_bytes: common.max_body_bytes,
            body_timeout: common.read_timeout,
            public_metrics: args.public_metrics,
        },
        auth: common.auth.clone(),
        metrics: Some(metrics),
        detached: detached.clone(),
    });
    if status_page != StatusPage::Off {
        let (access, show_keys) = match (status_page, common.auth.is_on()) {
            (StatusPage::Public, _) => (Access::Open, true),
            (_, true) => (Access::Token(common.auth.clone()), false),
            (_, false) => (Access::Open, true),
        };
        let watch = StoreWatch::new(
            store.store.clone(),
            store.admin.clone(),
            store.description.clone(),
            show_keys,
            args.stuck_after,
        );
        app = app.merge(status::router(Status::start(
            "idem serve",
            access,
            watched,
            watch,
            None,
        )));
    }
    let served = serve_until_signal(app, &common, "serve").await;
    detached.wait().await;
    store.close().await;
    tracing::info!("stopped");
    served
}
