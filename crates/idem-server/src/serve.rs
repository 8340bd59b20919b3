//! `idem serve`.

use clap::Args;
use idem_http::api::{ApiConfig, ApiState, Detached, router};

use crate::config::{CommonArgs, read_file, resolve_common};
use crate::status::{self, Status, StoreWatch};
use crate::{Failure, init_logging, serve_until_signal, store};

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
    /// Serve no status page at `/` (nor `/status.json`).
    #[arg(long)]
    pub no_status_page: bool,
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
    let (metrics, watched) = crate::prometheus()?;
    let store = store::open(&common).await?;
    tracing::info!(store = %store.description, auth = common.auth.is_on(), "starting idem serve");
    let detached = Detached::default();
    let status_page = !args.no_status_page;
    let mut app = router(ApiState {
        store: store.store.clone(),
        config: ApiConfig {
            default_lease: common.default_lease,
            default_retention: common.default_retention,
            max_body_bytes: common.max_body_bytes,
            body_timeout: common.read_timeout,
        },
        auth: common.auth.clone(),
        metrics: Some(metrics),
        detached: detached.clone(),
    });
    if status_page {
        let watch = StoreWatch::new(
            store.store.clone(),
            store.admin.clone(),
            store.description.clone(),
            !common.auth.is_on(),
            args.stuck_after,
        );
        app = app.merge(status::router(Status::start(
            "idem serve",
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
