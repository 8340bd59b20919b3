//! `idem-chaos worker`: a consumer process built on the library instead of
//! `idem consume`: idem-consumer's `Runner` with a Rust handler, over the
//! same source and store, calling the same sink. A run with `--runner
//! library` (or `mixed`) starts these in place of (or beside) the sidecar;
//! `--runner inbox` starts them with the transactional sink
//! ([`crate::inbox`]).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_consumer::{Backoff, HandlerError, KeyFrom, Message, Runner, Source};
use idem_core::{ClaimHandle, Guard, Lease, MemoryStore, Store};
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::inbox::Tables;

/// What a worker runs: the same settings the sidecar gets.
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    /// The broker kind of `--from`.
    #[arg(long, value_enum)]
    pub broker: Broker,
    /// The source URL, as `idem consume --from` takes it.
    #[arg(long)]
    pub from: String,
    /// `memory://`, a `redis://`, `postgres://` or `mysql://` URL.
    #[arg(long)]
    pub store: String,
    /// Writes each effect in a transaction of the SQL store's database
    /// that records the key in this inbox table (and the effect in
    /// `{TABLE}_fx`), calling the sink inside it.
    #[arg(long, value_name = "TABLE")]
    pub inbox: Option<String>,
    /// The lease each claim takes, in ms.
    #[arg(long)]
    pub lease_ms: u64,
    /// The handler: every message is POSTed here.
    #[arg(long)]
    pub to: String,
}

/// Runs until SIGTERM, then shuts down as the sidecar does.
pub async fn run(args: WorkerArgs) -> Result<(), String> {
    if args.store.starts_with("memory:") {
        return with_store(MemoryStore::new(), args).await;
    }
    if args.store.starts_with("postgres") || args.store.starts_with("mysql") {
        let store = idem_sql::SqlStore::connect(&args.store)
            .await
            .map_err(|e| format!("the store: {e}"))?;
        return with_store(store, args).await;
    }
    let store = idem_redis::RedisStore::connect(&args.store)
        .await
        .map_err(|e| format!("the store: {e}"))?;
    with_store(store, args).await
}

async fn with_store<S: Store + Clone>(store: S, args: WorkerArgs) -> Result<(), String> {
    let guard = Guard::new(store).lease(Lease::new(Duration::from_millis(args.lease_ms)));
    match args.broker {
        Broker::RedisStreams => {
            let config = idem_redis_streams::RedisStreamConfig::from_url(&args.from)
                .map_err(|e| e.to_string())?;
            let source = idem_redis_streams::RedisStreamSource::connect(config)
                .await
                .map_err(|e| e.to_string())?;
            consume(guard, source, args).await
        }
        Broker::Amqp => {
            let config = idem_amqp::AmqpConfig::from_url(&args.from).map_err(|e| e.to_string())?;
            let source = idem_amqp::AmqpSource::connect(config)
                .await
                .map_err(|e| e.to_string())?;
            consume(guard, source, args).await
        }
        Broker::Nats => {
            let config =
                idem_jetstream::JetStreamConfig::from_url(&args.from).map_err(|e| e.to_string())?;
            let source = idem_jetstream::JetStreamSource::connect(config)
                .await
                .map_err(|e| e.to_string())?;
            consume(guard, source, args).await
        }
        other => Err(format!(
            "the library worker reads Redis Streams, RabbitMQ and NATS, not {other}"
        )),
    }
}

async fn consume<S: Store + Clone, Src: Source>(
    guard: Guard<S>,
    source: Src,
    args: WorkerArgs,
) -> Result<(), String> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let to: http::Uri = args.to.parse().map_err(|e| format!("--to: {e}"))?;
    let inbox = match &args.inbox {
        // A stopped holder's open transaction ends after a lease.
        Some(table) => Some(
            Tables::open(
                &args.store,
                table,
                Some(Duration::from_millis(args.lease_ms)),
            )
            .await?,
        ),
        None => None,
    };
    let process = std::process::id();
    let handler = move |message: Message, claim: ClaimHandle| {
        let (client, to, inbox) = (client.clone(), to.clone(), inbox.clone());
        async move {
            let Some(inbox) = inbox else {
                return call(&client, to, message, claim).await;
            };
            let key =
                String::from_utf8_lossy(message.key.as_deref().unwrap_or_default()).into_owned();
            let token = claim.token().map_or(0, |t| t.get());
            inbox
                .handle(&key, token, process, call(&client, to, message, claim))
                .await
        }
    };
    // The sidecar's settings in the runs (scenario::consumer_args).
    let runner = Runner::new(guard, source, handler)
        .key(KeyFrom::Json("/key".into()))
        .concurrency(crate::spec::CONCURRENCY)
        .max_attempts(crate::spec::MAX_ATTEMPTS)
        .backoff(Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_millis(1000),
            ..Backoff::default()
        })
        .shutdown_grace(Duration::from_secs(5));
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
        }
        on_signal.cancel();
    });
    // The fleet waits for this line.
    println!("idem-chaos worker ready: {}", args.to);
    runner.run(stop).await.map(drop).map_err(|e| e.to_string())
}

/// One handler call: the message POSTed with its key, token and attempt,
/// as `idem consume` sends it; a 2xx is done, anything else is retried.
async fn call(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    to: http::Uri,
    message: Message,
    claim: ClaimHandle,
) -> Result<Bytes, HandlerError> {
    let mut request = http::Request::post(to).header("content-type", "application/json");
    if let Some(key) = &message.key {
        request = request.header("idempotency-key", key.as_ref());
    }
    if let Some(token) = claim.token() {
        request = request.header("idem-fencing-token", token.get());
    }
    let request = request
        .header("idem-attempt", message.attempt.max(1))
        .body(Full::new(message.body.clone()))
        .map_err(HandlerError::permanent)?;
    let response = tokio::time::timeout(Duration::from_secs(60), client.request(request))
        .await
        .map_err(|_| HandlerError::transient("the sink did not answer within 60 s"))?
        .map_err(HandlerError::transient)?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(HandlerError::transient)?
        .to_bytes();
    // As `idem consume` takes them by default: a 4xx other than those that
    // mean "not now" refuses the message for good.
    let refused = status.is_client_error()
        && !matches!(
            status.as_u16(),
            401 | 403 | 404 | 405 | 407 | 408 | 409 | 423 | 425 | 429
        );
    if status.is_success() {
        Ok(body)
    } else if refused {
        Err(HandlerError::permanent(format!(
            "the sink answered {status}"
        )))
    } else {
        Err(HandlerError::transient(format!(
            "the sink answered {status}"
        )))
    }
}
