//! The status page at `/` of `idem serve` and of `idem consume
//! --metrics-listen`: begin answers (or settled messages) per second by
//! namespace over the last five minutes, the claims stuck in progress, the
//! store's health and what it finds in its own settings, and a consumer's
//! lag and dead letters.
//!
//! The page is three files built into the binary (no CDN, nothing fetched
//! from elsewhere) that poll `GET /status.json`. Who may read it is
//! [`Access`]: with `idem serve --auth-token`, `/status.json` takes a bearer
//! token and shows only what that token may see (the page asks for it once
//! and keeps it for the browser tab).

mod history;
mod recorder;
mod store;

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::header;
use idem_consumer::Readiness;
use idem_http::api::{Namespaces, Problem};
use serde::Deserialize;
use serde_json::{Value, json};

pub use history::{History, TICK};
pub use recorder::{Family, Watched};
pub use store::StoreWatch;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/status.js");
const STYLE: &str = include_str!("page/status.css");

/// The page runs its own script and style and talks to this server alone;
/// it shows untrusted text (keys, store errors), always as text.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Who may read `/status.json`, and what they see (`--status-page`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusPage {
    /// `idem serve` with auth on: a bearer token is required, and each
    /// token sees only its own namespaces (the store's address and settings
    /// only with a token for every namespace), never a key. Without auth,
    /// open; keys show where the API would show them anyway (`idem serve`
    /// without auth), never on `idem consume`'s page.
    On,
    /// Open to anyone, everything, keys included: every tenant's
    /// namespaces, the store's address and settings.
    Public,
    /// No page, no `/status.json`.
    Off,
}

/// Who reads the page of one process.
#[derive(Clone)]
pub enum Access {
    /// Anyone.
    Open,
    /// A bearer token of these grants, seeing what it may use.
    Token(idem_http::api::Auth),
}

/// What the page of one process shows.
pub struct Status {
    access: Access,
    /// "idem serve" or "idem consume".
    service: &'static str,
    started_at_ms: u64,
    watched: Watched,
    history: Arc<History>,
    store: Arc<StoreWatch>,
    consumer: Option<Consumer>,
}

/// What `idem consume` adds to its page.
pub struct Consumer {
    /// The handler's URL.
    pub to: String,
    /// The source's name, once the runner runs.
    pub source: Arc<OnceLock<String>>,
    /// The runner's readiness, once it runs.
    pub readiness: Arc<OnceLock<Readiness>>,
}

impl Status {
    /// The page of `service`, reading `watched` every [`TICK`] on a task
    /// that lives as long as the runtime.
    pub fn start(
        service: &'static str,
        access: Access,
        watched: Watched,
        store: StoreWatch,
        consumer: Option<Consumer>,
    ) -> Arc<Self> {
        let history = Arc::new(History::default());
        {
            let (history, watched) = (history.clone(), watched.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(TICK);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    history.tick(unix_ms(), watched.counters());
                }
            });
        }
        Arc::new(Self {
            access,
            service,
            started_at_ms: unix_ms(),
            watched,
            history,
            store: Arc::new(store),
            consumer,
        })
    }
}

/// `/`, `/status.json` and the page's script and style.
pub fn router(status: Arc<Status>) -> axum::Router {
    let file = |content_type: &'static str, body: &'static str| {
        get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, content_type),
                    (header::CACHE_CONTROL, "no-cache"),
                    (header::CONTENT_SECURITY_POLICY, CSP),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                body,
            )
        })
    };
    axum::Router::new()
        .route("/", file("text/html; charset=utf-8", INDEX))
        .route("/status.js", file("text/javascript; charset=utf-8", SCRIPT))
        .route("/status.css", file("text/css; charset=utf-8", STYLE))
        .route("/status.json", get(status_json))
        .with_state(status)
}

#[derive(Deserialize)]
struct StatusQuery {
    /// Chart this namespace alone.
    namespace: Option<String>,
}

/// Everything the page shows, as JSON (README, "The status page").
async fn status_json(
    State(status): State<Arc<Status>>,
    Query(query): Query<StatusQuery>,
    headers: http::HeaderMap,
) -> Response {
    let may_see = match &status.access {
        Access::Open => Namespaces::All,
        Access::Token(auth) => match auth.namespaces_for(headers.get(header::AUTHORIZATION)) {
            Ok(namespaces) => namespaces,
            Err(p) => return p.into_response(),
        },
    };
    if let Some(ns) = &query.namespace
        && !may_see.allows(ns)
    {
        return Problem::forbidden(format!("this token may not see namespace {ns:?}"))
            .into_response();
    }
    let activity = status
        .history
        .view(query.namespace.as_deref(), |ns| may_see.allows(ns));
    let busiest: Vec<String> = activity
        .families
        .iter()
        .flat_map(|f| f.namespaces.iter().map(|n| n.namespace.clone()))
        .collect();
    let store = status.store.view(busiest).await;
    let store = match &may_see {
        Namespaces::All => (*store).clone(),
        Namespaces::Only(_) => store_seen_by(&store, &may_see),
    };
    let mut body = json!({
        "service": status.service,
        "version": env!("CARGO_PKG_VERSION"),
        "started_at_ms": status.started_at_ms,
        "now_ms": unix_ms(),
        "activity": activity,
        "store": store,
    });
    if let Some(consumer) = &status.consumer {
        body["consumer"] = consumer_json(consumer, &status.watched);
    }
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

/// What a token confined to some namespaces sees of the store: those
/// namespaces' counts and stuck claims, its health, nothing of its address,
/// settings or size, nor of the other namespaces.
fn store_seen_by(store: &Value, may_see: &Namespaces) -> Value {
    let namespaces: Vec<Value> = store["namespaces"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|n| n["namespace"].as_str().is_some_and(|ns| may_see.allows(ns)))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let mut seen = json!({
        "description": "(shown to a token for every namespace)",
        "namespaces": namespaces,
    });
    for kept in [
        "looking",
        "healthy",
        "checked_at_ms",
        "answered_ms",
        "refresh_seconds",
        "stuck_after_seconds",
        "keys_shown",
    ] {
        if let Some(v) = store.get(kept) {
            seen[kept] = v.clone();
        }
    }
    if store["error"].is_string() {
        // Its text may name the store's address.
        seen["error"] =
            "the store does not answer (why is shown to a token for every namespace)".into();
    }
    seen
}

fn consumer_json(consumer: &Consumer, watched: &Watched) -> Value {
    let mut dead_lettered = 0;
    let mut settled = 0;
    for (series, n) in watched.counters() {
        if series.family == Family::Messages {
            settled += n;
            if series.outcome == "dead_lettered" {
                dead_lettered += n;
            }
        }
    }
    json!({
        "source": consumer.source.get(),
        "to": consumer.to,
        "running": consumer.source.get().is_some(),
        "ready": consumer.readiness.get().is_some_and(Readiness::is_ready),
        "lag": watched
            .lags()
            .into_iter()
            .map(|(namespace, lag)| json!({"namespace": namespace, "lag": lag}))
            .collect::<Vec<_>>(),
        "settled_total": settled,
        "dead_lettered_total": dead_lettered,
    })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
