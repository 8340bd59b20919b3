//! `idem consume`: the sidecar that feeds any HTTP handler effectively once.

mod batch;
mod http;
pub(crate) mod sources;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ::http::{StatusCode, Uri};
use clap::Args;
use idem_consumer::{Backoff, BoxSource, KeyFrom, Readiness, Report, Runner, Source};
use idem_core::text::redacted_url;
use idem_core::{Guard, Lease, Namespace, SharedStore};
use idem_http::gateway::ReleasePolicy;
use tokio_util::sync::CancellationToken;

use self::batch::{MAX_BATCH, MAX_BATCH_LINGER};
use self::http::{
    BatchSettings, DEFAULT_DEAD_LETTER_STATUS, DEFAULT_PAUSE_STATUS, Endpoint, HttpHandler,
    Statuses,
};
use crate::config::{FileSettings, StoreArgs, StoreSettings, bad, read_file, resolve_store};
use crate::run::{Failure, init_logging, shutdown_signal};
use crate::status::{self, Access, Consumer, Status, StatusPage, StoreWatch};
use crate::store;

/// `idem consume`.
#[derive(Args, Debug)]
#[command(after_long_help = AFTER_HELP)]
pub struct ConsumeArgs {
    /// Where messages come from (required):
    /// amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME,
    /// nats://HOST:PORT?stream=STREAM&consumer=NAME&subject=SUBJECT,
    /// redis://HOST:PORT?stream=NAME&group=GROUP, or
    /// kafka://HOST:PORT?topic=TOPIC&group=GROUP, or
    /// rocketmq://NAMESRV_HOST:PORT?topic=TOPIC&group=GROUP.
    #[arg(long, env = "IDEM_FROM", value_name = "SOURCE_URL")]
    pub from: Option<String>,
    /// The HTTP endpoint that handles each message, e.g.
    /// http://127.0.0.1:8080/handle (required).
    #[arg(long, env = "IDEM_TO", value_name = "URL")]
    pub to: Option<String>,
    /// Namespace of the keys [default: the queue or stream name].
    #[arg(long, env = "IDEM_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,
    /// Where each message's idempotency key comes from: `message-id` (AMQP
    /// message_id, NATS Nats-Msg-Id, the `message-id` field of a Redis
    /// Streams entry, the `message-id` header of a Kafka record, else its
    /// topic/partition/offset, RocketMQ KEYS), `header:NAME`, or
    /// `json:/pointer` into the JSON body [default: message-id].
    #[arg(long, env = "IDEM_KEY", value_name = "SPEC")]
    pub key: Option<String>,
    /// Most messages handled at once (and the broker's prefetch) [default:
    /// 16; with --batch, twice the batch].
    #[arg(long, env = "IDEM_CONCURRENCY", value_name = "N")]
    pub concurrency: Option<usize>,
    /// POST up to N messages in one request, as a JSON array, and settle
    /// each by its own result in the answer (see below) [default: off,
    /// one message per request; 1 to 1000].
    #[arg(long, env = "IDEM_BATCH", value_name = "N")]
    pub batch: Option<usize>,
    /// With --batch, how long the first message of a batch waits for the
    /// others, in ms (a fetched batch arrives at once) [default: 1; 0 to
    /// 1000].
    #[arg(long, env = "IDEM_BATCH_LINGER_MS", value_name = "MS")]
    pub batch_linger_ms: Option<u64>,
    /// Handler attempts before a message is dead-lettered, counted across
    /// redeliveries and restarts [default: 16].
    #[arg(long, env = "IDEM_MAX_ATTEMPTS", value_name = "N")]
    pub max_attempts: Option<u32>,
    /// The dead-letter queue, subject, stream or topic, in the same broker
    /// [default: the source name plus `.dead-letter`; Kafka: TOPIC-dlt;
    /// RocketMQ: `%DLQ%GROUP`].
    #[arg(long, env = "IDEM_DEAD_LETTER", value_name = "NAME")]
    pub dead_letter: Option<String>,
    /// Serve the status page (GET /), Prometheus metrics (GET /metrics),
    /// GET /health and GET /ready on this address, e.g. 127.0.0.1:9464
    /// [default: off].
    #[arg(long, env = "IDEM_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// The status page lists claims in progress for longer than this as
    /// stuck: `90s`, `10m`, `2h`.
    #[arg(long, value_name = "AGE", value_parser = crate::ops::parse_age, default_value = "1m")]
    pub stuck_after: Duration,
    /// What the status page on --metrics-listen shows: `on` (no message
    /// keys; the handler's and the store's URLs without their credentials),
    /// `public` (the keys of stuck messages too) or `off` (no page)
    /// [default: on].
    #[arg(long, value_enum, env = "IDEM_STATUS_PAGE", value_name = "MODE")]
    pub status_page: Option<StatusPage>,
    /// How long the handler may take to answer, in ms; no answer counts as
    /// a transient failure [default: 30000].
    #[arg(long, env = "IDEM_TIMEOUT_MS", value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// At shutdown, how long handlers in flight may take to finish, in ms
    /// [default: 30000].
    #[arg(long, env = "IDEM_SHUTDOWN_GRACE_MS", value_name = "MS")]
    pub shutdown_grace_ms: Option<u64>,
    /// How long a message whose handler answered 2xx waits for the rest of
    /// its fetched batch, in ms, so that the batch's outcomes are stored
    /// with one store call before their messages are acked; 0 stores each
    /// outcome on its own [default: 1].
    #[arg(long, env = "IDEM_COMPLETION_LINGER_MS", value_name = "MS")]
    pub completion_linger_ms: Option<u64>,
    /// Delay before the first retry of a failed message, in ms; doubled per
    /// attempt, with jitter [default: 1000].
    #[arg(long, env = "IDEM_RETRY_INITIAL_MS", value_name = "MS")]
    pub retry_initial_ms: Option<u64>,
    /// Longest delay between retries, in ms [default: 300000].
    #[arg(long, env = "IDEM_RETRY_MAX_MS", value_name = "MS")]
    pub retry_max_ms: Option<u64>,
    /// How a failed message waits for its retry: `redeliver` hands it back
    /// to the broker, which delivers it again after the delay (Kafka: a
    /// retry topic), while later messages go on; `blocking` waits here and
    /// holds the messages behind it in its lane (Kafka partition, ordering
    /// key), keeping their order [default: redeliver].
    #[arg(long, env = "IDEM_RETRY", value_name = "MODE")]
    pub retry: Option<String>,
    /// Handler statuses that mean it is misconfigured (a wrong URL, a
    /// refused credential): consumption pauses with backoff, the message
    /// waits without counting an attempt, GET /ready answers 503 until a
    /// call succeeds; `none` for no such status [default: 401,403-405,407].
    #[arg(long, env = "IDEM_PAUSE_STATUS", value_name = "LIST")]
    pub pause_status: Option<String>,
    /// Handler statuses that dead-letter the message at once; any other
    /// non-2xx status is retried with backoff [default:
    /// 400,402,406,410-422,424,426-428,430-499].
    #[arg(long, env = "IDEM_DEAD_LETTER_STATUS", value_name = "LIST")]
    pub dead_letter_status: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

const AFTER_HELP: &str = "\
Each message becomes POST --to with the message body unchanged and its content type, plus the \
headers Idempotency-Key: KEY, Idem-Fencing-Token: TOKEN and Idem-Attempt: N; broker headers \
travel as Idem-Header-NAME.

The answer decides: 2xx completes the key (status and body are the stored outcome) and acks the \
message; the effect counts as done once a 2xx head arrives (the body gets its own --timeout-ms, \
and a body that never arrives is stored as omitted). 401, 403, 404, 405 and 407 \
(--pause-status) say the handler is misconfigured: consumption pauses with backoff, the message \
waits without using an attempt, and GET /ready on --metrics-listen answers 503 until a call \
succeeds. Other 4xx (--dead-letter-status) dead-letter the message at once. 408, 409, 423, 425, \
429, 5xx, no answer head within --timeout-ms, or a refused connection release the key and retry \
the message later with backoff (no sooner than Retry-After, in seconds or as an HTTP date, at \
most --retry-max-ms). A duplicate of a completed message is acked without calling the handler. A \
dead-lettered message keeps its body and headers and gets idem-key, idem-attempts and \
idem-last-error.

With --batch N, up to N claimed messages go in one POST with Idem-Batch: COUNT and a JSON array \
body, one object per message: {\"key\", \"token\" (the fencing token), \"attempt\", \"content_type\", \
\"headers\": {NAME: VALUE}, \"body\"} (the body as JSON when the content type says JSON, else as \
text, or \"body_base64\" when it is not UTF-8). The handler answers 2xx with \
{\"results\": [{\"key\", \"status\", \"outcome\", \"retry_after_ms\", \"error\"}]}: each message is \
settled by its own status, as a single message would be, and its outcome stored. A message the \
answer leaves out, names twice or gives no valid status is retried, never taken as done; an \
answer that is not such an object, or a non-2xx status for the whole request, applies to every \
message of the batch. Each message's lease is renewed while its batch is out.

SIGTERM or Ctrl-C: stop fetching, let handlers in flight finish (--shutdown-grace-ms), ack what \
finished, release and hand back the rest, exit 0. After a kill -9 nothing is lost; a message \
whose handler answered 2xx just before the kill may reach it once more: that is why it gets the \
key and the fencing token.

The lease each claim takes is --default-lease-ms; it is renewed while the handler works.";

/// The longest `--completion-linger-ms`: past a second, a finished message
/// would wait for its batch longer than most handlers take.
const MAX_COMPLETION_LINGER: Duration = Duration::from_secs(1);

/// `consume` settings, resolved.
struct Settings {
    from: String,
    to: Uri,
    namespace: Option<Namespace>,
    key: KeyFrom,
    concurrency: usize,
    batch: Option<BatchSettings>,
    max_attempts: u32,
    dead_letter: Option<String>,
    metrics_listen: Option<SocketAddr>,
    stuck_after: Duration,
    status_page: StatusPage,
    timeout: Duration,
    grace: Duration,
    completion_linger: Duration,
    backoff: Backoff,
    blocking: bool,
    statuses: Statuses,
    store: StoreSettings,
}

fn resolve(args: ConsumeArgs, file: &FileSettings) -> Result<Settings, crate::config::ConfigError> {
    let from = args
        .from
        .or(file.from.clone())
        .ok_or_else(|| bad("from", "required: where messages come from, e.g. --from 'amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders'"))?;
    sources::check(&from)?;
    let to_text = args
        .to
        .or(file.to.clone())
        .ok_or_else(|| bad("to", "required: the HTTP endpoint that handles each message, e.g. --to http://127.0.0.1:8080/handle"))?;
    let to: Uri = to_text
        .parse()
        .ok()
        .filter(|u: &Uri| u.scheme_str() == Some("http") && u.host().is_some())
        .ok_or_else(|| {
            bad(
                "to",
                format!(
                    "{:?} is not an http:// URL with a host, e.g. http://127.0.0.1:8080/handle",
                    redacted_url(&to_text)
                ),
            )
        })?;
    let namespace = args
        .namespace
        .or(file.namespace.clone())
        .map(|n| Namespace::new(&n).map_err(|e| bad("namespace", e.to_string())))
        .transpose()?;
    let key = match args.key.or(file.key.clone()) {
        Some(spec) => spec.parse().map_err(|e: String| bad("key", e))?,
        None => KeyFrom::MessageId,
    };
    let batch = match args.batch.or(file.batch) {
        None => None,
        Some(size) if size == 0 || size > MAX_BATCH => {
            return Err(bad(
                "batch",
                format!("{size} is out of range: give 1 to {MAX_BATCH} messages per request"),
            ));
        }
        Some(size) => {
            let linger =
                Duration::from_millis(args.batch_linger_ms.or(file.batch_linger_ms).unwrap_or(1));
            if linger > MAX_BATCH_LINGER {
                return Err(bad(
                    "batch_linger_ms",
                    format!(
                        "{} ms is longer than the limit of {} ms: the first message of a \
                         batch waits this long for the others; give 0 to 1000",
                        linger.as_millis(),
                        MAX_BATCH_LINGER.as_millis()
                    ),
                ));
            }
            Some(BatchSettings { size, linger })
        }
    };
    if batch.is_none() && (args.batch_linger_ms.or(file.batch_linger_ms)).is_some() {
        return Err(bad(
            "batch_linger_ms",
            "applies to batches only: give --batch N too",
        ));
    }
    let concurrency = args
        .concurrency
        .or(file.concurrency)
        .unwrap_or_else(|| batch.map_or(16, |b| (b.size * 2).max(16)));
    if concurrency == 0 || concurrency > 10_000 {
        return Err(bad("concurrency", "must be from 1 to 10000"));
    }
    if let Some(b) = batch
        && concurrency < b.size
    {
        return Err(bad(
            "concurrency",
            format!(
                "{concurrency} is less than --batch {}: a batch holds at most the messages \
                 handled at once; raise --concurrency or lower --batch",
                b.size
            ),
        ));
    }
    let max_attempts = args.max_attempts.or(file.max_attempts).unwrap_or(16);
    if max_attempts == 0 {
        return Err(bad("max_attempts", "must be at least 1"));
    }
    let metrics_listen = args
        .metrics_listen
        .or(file.metrics_listen.clone())
        .map(|a| {
            a.parse().map_err(|_| {
                bad(
                    "metrics_listen",
                    format!("{a:?} is not an address; give host:port, e.g. 127.0.0.1:9464"),
                )
            })
        })
        .transpose()?;
    let ms = |flag: Option<u64>, file: Option<u64>, default: u64, field: &'static str| {
        let v = flag.or(file).unwrap_or(default);
        if v == 0 {
            Err(bad(field, "must be at least 1"))
        } else {
            Ok(Duration::from_millis(v))
        }
    };
    let timeout = ms(args.timeout_ms, file.timeout_ms, 30_000, "timeout_ms")?;
    let grace = ms(
        args.shutdown_grace_ms,
        file.shutdown_grace_ms,
        30_000,
        "shutdown_grace_ms",
    )?;
    let completion_linger = Duration::from_millis(
        args.completion_linger_ms
            .or(file.completion_linger_ms)
            .unwrap_or(1),
    );
    if completion_linger > MAX_COMPLETION_LINGER {
        return Err(bad(
            "completion_linger_ms",
            format!(
                "{} ms is longer than the limit of {} ms: a finished message waits \
                 this long for its batch before its ack; give 0 to 1000",
                completion_linger.as_millis(),
                MAX_COMPLETION_LINGER.as_millis()
            ),
        ));
    }
    let initial = ms(
        args.retry_initial_ms,
        file.retry_initial_ms,
        1_000,
        "retry_initial_ms",
    )?;
    let max = ms(
        args.retry_max_ms,
        file.retry_max_ms,
        300_000,
        "retry_max_ms",
    )?;
    if max < initial {
        return Err(bad("retry_max_ms", "must be at least retry_initial_ms"));
    }
    let blocking = match args.retry.or(file.retry.clone()).as_deref() {
        None | Some("redeliver") => false,
        Some("blocking") => true,
        Some(other) => {
            return Err(bad(
                "retry",
                format!("{other:?} is not a retry mode; give redeliver or blocking"),
            ));
        }
    };
    let status_list = |flag: Option<String>, file: Option<String>, default: &str, field| {
        flag.or(file)
            .as_deref()
            .unwrap_or(default)
            .parse::<ReleasePolicy>()
            .map_err(|e| bad(field, e.to_string()))
    };
    let statuses = Statuses {
        pause: status_list(
            args.pause_status,
            file.pause_status.clone(),
            DEFAULT_PAUSE_STATUS,
            "pause_status",
        )?,
        dead_letter: status_list(
            args.dead_letter_status,
            file.dead_letter_status.clone(),
            DEFAULT_DEAD_LETTER_STATUS,
            "dead_letter_status",
        )?,
    };
    Ok(Settings {
        from,
        to,
        namespace,
        key,
        concurrency,
        batch,
        max_attempts,
        dead_letter: args.dead_letter.or(file.dead_letter.clone()),
        metrics_listen,
        stuck_after: args.stuck_after,
        status_page: args.status_page.unwrap_or(StatusPage::On),
        timeout,
        grace,
        completion_linger,
        backoff: Backoff {
            initial,
            max,
            jitter: 0.5,
        },
        blocking,
        statuses,
        store: resolve_store(args.store, file)?,
    })
}

/// Runs the sidecar until SIGINT or SIGTERM, then shuts down gracefully
/// and returns.
///
/// # Cancel safety
///
/// Not meant to be cancelled: it returns on a signal, after settling every
/// message it holds.
pub async fn run(args: ConsumeArgs) -> Result<(), Failure> {
    let file = read_file(args.store.config.as_deref())?;
    let settings = resolve(args, &file)?;
    init_logging(&settings.store.log)?;
    let (metrics, watched) = crate::run::prometheus()?;
    let store = store::open(&settings.store).await?;
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down: finishing the messages in flight");
            shutdown.cancel();
        });
    }
    let readiness = Arc::new(OnceLock::new());
    let source_name = Arc::new(OnceLock::new());
    if let Some(addr) = settings.metrics_listen {
        let watch = StoreWatch::new(
            store.store.clone(),
            store.admin.clone(),
            store.description.clone(),
            settings.status_page == StatusPage::Public,
            settings.stuck_after,
        );
        let consumer = Consumer {
            to: redacted_url(&settings.to.to_string()),
            source: source_name.clone(),
            readiness: readiness.clone(),
        };
        let page = (settings.status_page != StatusPage::Off)
            .then(|| Status::start("idem consume", Access::Open, watched, watch, Some(consumer)));
        serve_metrics(addr, metrics, readiness.clone(), page, shutdown.clone()).await?;
    }
    let job = Job {
        guard: Guard::new(store.store.clone())
            .lease(Lease::new(settings.store.default_lease))
            .retention(settings.store.default_retention),
        handler: HttpHandler::new(
            Endpoint::new(
                settings.to.clone(),
                settings.timeout,
                settings.store.limits.max_outcome_bytes.saturating_sub(64),
                settings.statuses,
                settings.backoff.max,
            ),
            settings.batch,
        ),
        readiness,
        source_name,
        to: redacted_url(&settings.to.to_string()),
        namespace: settings.namespace,
        key: settings.key,
        concurrency: settings.concurrency,
        max_attempts: settings.max_attempts,
        backoff: settings.backoff,
        grace: settings.grace,
        completion_linger: settings.completion_linger,
        dead_letter: settings.dead_letter,
        blocking: settings.blocking,
        lease: settings.store.default_lease,
        shutdown,
        store: store.description.clone(),
    };
    let report = sources::run(&settings.from, job).await;
    store.close().await;
    let report = report?;
    tracing::info!(?report, "stopped");
    Ok(())
}

/// Everything but the source: what each source's arm hands its source to.
pub struct Job {
    guard: Guard<SharedStore>,
    handler: HttpHandler,
    /// The handler's URL, its credentials hidden.
    to: String,
    store: String,
    namespace: Option<Namespace>,
    key: KeyFrom,
    /// Most messages held at once: the broker's prefetch too.
    pub concurrency: usize,
    max_attempts: u32,
    backoff: Backoff,
    grace: Duration,
    completion_linger: Duration,
    /// `--dead-letter`, when given.
    pub dead_letter: Option<String>,
    /// `--retry blocking`: retries wait in place and hold their lane.
    pub blocking: bool,
    /// The lease each claim takes (a broker with its own redelivery timer
    /// compares it).
    pub lease: Duration,
    shutdown: CancellationToken,
    /// The runner's readiness, for GET /ready, once it runs.
    readiness: Arc<OnceLock<Readiness>>,
    /// The source's name, for the status page, once it runs.
    source_name: Arc<OnceLock<String>>,
}

impl Job {
    /// Runs the runner on `source` until shutdown. The runner is compiled
    /// once, for a boxed source, rather than once per broker.
    pub async fn run(self, source: BoxSource) -> Result<Report, Failure> {
        let name = source.name().to_owned();
        let mut runner = Runner::new(self.guard, source, self.handler)
            .key(self.key)
            .concurrency(self.concurrency)
            .max_attempts(self.max_attempts)
            .backoff(self.backoff)
            .retry_in_place(self.blocking)
            .ordered(self.blocking)
            .shutdown_grace(self.grace)
            .completion_linger(self.completion_linger);
        if let Some(ns) = self.namespace {
            runner = runner.namespace(ns);
        }
        let _ = self.readiness.set(runner.readiness());
        let _ = self.source_name.set(name.clone());
        tracing::info!(source = %name, to = %self.to, store = %self.store, "starting idem consume");
        // Tests and scripts wait for this line.
        println!("idem consume ready: {name} -> {}", self.to);
        runner
            .run(self.shutdown)
            .await
            .map_err(|e| Failure::Config(bad("namespace", e.to_string())))
    }
}

async fn serve_metrics(
    addr: SocketAddr,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    readiness: Arc<OnceLock<Readiness>>,
    page: Option<Arc<Status>>,
    shutdown: CancellationToken,
) -> Result<(), Failure> {
    let app = page
        .map(status::router)
        .unwrap_or_default()
        .route(
            "/metrics",
            axum::routing::get(move || std::future::ready(metrics.render())),
        )
        .route("/health", axum::routing::get(|| std::future::ready("ok")))
        .route(
            "/ready",
            axum::routing::get(move || {
                let answer = match readiness.get() {
                    None => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
                    Some(r) if r.is_ready() => (StatusCode::OK, "ready"),
                    Some(_) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "paused: the handler refuses messages (see the log)",
                    ),
                };
                std::future::ready(answer)
            }),
        );
    crate::run::listen_beside(addr, app, shutdown).await
}
