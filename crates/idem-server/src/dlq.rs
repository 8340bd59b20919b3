//! `idem dlq ls|show|replay --from BROKER_URL`: the dead letters an
//! `idem consume` (or a library runner) parked, listed with their `idem-*`
//! headers, read one at a time, and replayed to the work queue after a fix.
//!
//! A replayed message has a whole attempt budget again (its
//! `idem-attempts` is dropped). With `--store`, each one's key is checked
//! first: a key whose work completed since stays parked (replaying it
//! would only ack a duplicate), and one held by a live claim is replayed
//! (the runner waits for the holder). A key the runner recorded as
//! dead-lettered when it parked the message is replayed: the copy, marked
//! `idem-replayed-from`, reopens it and runs. Everything printed that came from
//! the broker is escaped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use futures_util::FutureExt as _;
use idem_consumer::SourceError;
use idem_consumer::dlq::{DeadLetterQueue, Parked, Selection, is_dead_lettered};
use idem_core::{Clock as _, Key, Record, Store as _, SystemClock};
use serde_json::{Value, json};

use crate::Failure;
use crate::config::{StoreArgs, bad};
use crate::ops::{age, columns, outcome_json, parse_age, shown};

/// Dead letters listed unless `--limit` says otherwise.
const DEFAULT_LS_LIMIT: usize = 100;

/// Bytes of a body shown unless `--full`.
const SHOWN_BODY_BYTES: usize = 200;

/// Characters of a last error shown in a listing.
const SHOWN_ERROR_CHARS: usize = 60;

/// `idem dlq`.
#[derive(Args, Debug)]
pub struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Subcommand, Debug)]
enum DlqCommand {
    /// List dead letters, oldest first, with their key, attempts, age and
    /// last error.
    Ls(LsArgs),
    /// Show one dead letter: every header and the body.
    Show(ShowArgs),
    /// Move dead letters back to the work queue, with a new attempt
    /// budget: by key, by id, by age, or all.
    Replay(Box<ReplayArgs>),
}

/// Where the dead letters are.
#[derive(Args, Debug)]
struct Queue {
    /// The source, as `idem consume --from` takes it:
    /// amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME,
    /// nats://HOST:PORT?stream=STREAM&consumer=NAME&subject=SUBJECT,
    /// redis://HOST:PORT?stream=NAME&group=GROUP,
    /// kafka://HOST:PORT?topic=TOPIC&group=GROUP,
    /// rocketmq://NAMESRV_HOST:PORT?topic=TOPIC&group=GROUP.
    #[arg(
        long,
        env = "IDEM_FROM",
        value_name = "BROKER_URL",
        hide_env_values = true
    )]
    from: String,
    /// The dead-letter queue, subject, stream or topic, when `idem consume`
    /// was given one [default: the source name plus `.dead-letter`; Kafka:
    /// TOPIC-dlt; RocketMQ: %DLQ%GROUP].
    #[arg(long, env = "IDEM_DEAD_LETTER", value_name = "NAME")]
    dead_letter: Option<String>,
    /// Print JSON (one dead letter a line) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct LsArgs {
    #[command(flatten)]
    queue: Queue,
    /// List at most this many.
    #[arg(long, default_value_t = DEFAULT_LS_LIMIT)]
    limit: usize,
}

#[derive(Args, Debug)]
struct ShowArgs {
    /// The dead letter's id, as `idem dlq ls` shows it.
    id: String,
    #[command(flatten)]
    queue: Queue,
    /// Print the whole body [default: its first 200 bytes].
    #[arg(long)]
    full: bool,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    #[command(flatten)]
    queue: Queue,
    /// Only dead letters with this key (repeatable).
    #[arg(long = "key", value_name = "KEY")]
    keys: Vec<String>,
    /// Only the dead letter with this id (repeatable).
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    /// Only those parked longer ago than this: `90s`, `10m`, `2h`, `1d`.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    older_than: Option<Duration>,
    /// Only those parked more recently than this.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    newer_than: Option<Duration>,
    /// Every dead letter (needed when no other selection is given).
    #[arg(long)]
    all: bool,
    /// Replay at most this many.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// The namespace of the keys [default: the source's name, as for
    /// `idem consume`].
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// The store `idem consume` uses: each dead letter's key is checked
    /// there before it is replayed (see above). Without it, nothing is
    /// checked.
    #[command(flatten)]
    store: StoreArgs,
}

/// Runs `idem dlq`.
pub async fn run(args: DlqArgs) -> Result<(), Failure> {
    crate::init_logging("warn")?;
    match args.command {
        DlqCommand::Ls(a) => ls(a).await,
        DlqCommand::Show(a) => show(a).await,
        DlqCommand::Replay(a) => replay(*a).await,
    }
}

/// The dead-letter queue `queue` names.
async fn connect(queue: &Queue) -> Result<Box<dyn DeadLetterQueue>, Failure> {
    connect_url(&queue.from, queue.dead_letter.clone()).await
}

/// The dead-letter queue of the source `from`, or `dead` on its broker.
pub async fn connect_url(
    from: &str,
    dead: Option<String>,
) -> Result<Box<dyn DeadLetterQueue>, Failure> {
    crate::consume::sources::check(from)?;
    let scheme = from.split_once("://").map_or(from, |(s, _)| s);
    let failed = |e: &dyn std::fmt::Display| Failure::Run(e.to_string());
    match scheme {
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => {
            let mut config =
                idem_amqp::AmqpConfig::from_url(from).map_err(|e| bad("from", e.to_string()))?;
            if let Some(d) = dead {
                config = config.dead_letter(d);
            }
            let q = idem_amqp::AmqpDeadLetters::connect(config)
                .await
                .map_err(|e| failed(&e))?;
            Ok(Box::new(q))
        }
        #[cfg(feature = "jetstream")]
        "nats" | "tls" => {
            let mut config = idem_jetstream::JetStreamConfig::from_url(from)
                .map_err(|e| bad("from", e.to_string()))?;
            if let Some(d) = dead {
                config = config.dead_letter(d);
            }
            let q = idem_jetstream::JetStreamDeadLetters::connect(config)
                .await
                .map_err(|e| failed(&e))?;
            Ok(Box::new(q))
        }
        #[cfg(feature = "redis-streams")]
        "redis" | "rediss" => {
            let mut config = idem_redis_streams::RedisStreamConfig::from_url(from)
                .map_err(|e| bad("from", e.to_string()))?;
            if let Some(d) = dead {
                config = config.dead_letter(d);
            }
            let q = idem_redis_streams::RedisStreamDeadLetters::connect(config)
                .await
                .map_err(|e| failed(&e))?;
            Ok(Box::new(q))
        }
        #[cfg(feature = "kafka")]
        "kafka" => {
            let mut config = idem_kafka::KafkaConfig::from_url(from)
                .map_err(|e| bad("from", e.to_string()))?;
            if let Some(d) = dead {
                config = config.dead_letter(d);
            }
            let q = idem_kafka::KafkaDeadLetters::connect(config)
                .await
                .map_err(|e| failed(&e))?;
            Ok(Box::new(q))
        }
        #[cfg(feature = "rocketmq")]
        "rocketmq" => {
            let mut config = idem_rocketmq::RocketMqConfig::from_url(from)
                .map_err(|e| bad("from", e.to_string()))?;
            if let Some(d) = dead {
                config = config.dead_letter(d);
            }
            let q = idem_rocketmq::RocketMqDeadLetters::connect(config)
                .await
                .map_err(|e| failed(&e))?;
            Ok(Box::new(q))
        }
        other => Err(bad(
            "from",
            format!("idem dlq does not read {other}:// dead letters yet; it reads amqp://, nats://, redis://, kafka:// and rocketmq:// ones"),
        )
        .into()),
    }
}

fn broker_failed(q: &dyn DeadLetterQueue, e: SourceError) -> Failure {
    Failure::Run(format!(
        "on dead-letter queue {}: {e}",
        shown(q.name().as_bytes())
    ))
}

fn parked_json(p: &Parked, now: SystemTime, full: bool) -> Value {
    let headers: serde_json::Map<String, Value> = p
        .headers
        .iter()
        .map(|(n, v)| (shown(n.as_bytes()), Value::String(shown(v))))
        .collect();
    json!({
        "id": p.id,
        "key": p.key().map(|k| shown(k.as_bytes())),
        "attempts": p.attempts(),
        "last_error": p.last_error().map(|e| shown(e.as_bytes())),
        "parked_at_ms": p.parked_at.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64),
        "parked_ms_ago": p.parked_at.map(|t| now.duration_since(t).unwrap_or_default().as_millis() as u64),
        "headers": headers,
        "body_bytes": p.body.len(),
        "body": outcome_json(&p.body, full),
    })
}

async fn ls(args: LsArgs) -> Result<(), Failure> {
    if args.limit == 0 {
        return Err(bad("limit", "must be at least 1").into());
    }
    let q = connect(&args.queue).await?;
    let parked = q
        .peek(args.limit)
        .await
        .map_err(|e| broker_failed(&*q, e))?;
    let now = SystemTime::now();
    if args.queue.json {
        for p in &parked {
            println!("{}", parked_json(p, now, false));
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = parked
        .iter()
        .map(|p| {
            let error = p
                .last_error()
                .map(|e| shown(e.as_bytes()))
                .unwrap_or_default();
            let error = if error.chars().count() > SHOWN_ERROR_CHARS {
                let cut: String = error.chars().take(SHOWN_ERROR_CHARS).collect();
                format!("{cut}…")
            } else {
                error
            };
            vec![
                shown(p.id.as_bytes()),
                p.key().map(|k| shown(k.as_bytes())).unwrap_or_default(),
                p.attempts().map(|a| a.to_string()).unwrap_or_default(),
                p.parked_at
                    .map(|t| age(now.duration_since(t).unwrap_or_default()))
                    .unwrap_or_default(),
                p.body.len().to_string(),
                error,
            ]
        })
        .collect();
    print!(
        "{}",
        columns(
            &["ID", "KEY", "ATTEMPTS", "PARKED", "BYTES", "LAST ERROR"],
            &rows
        )
    );
    if parked.is_empty() {
        println!("(no dead letters in {})", shown(q.name().as_bytes()));
    } else if parked.len() == args.limit {
        println!("(first {} dead letters; --limit lists more)", args.limit);
    }
    Ok(())
}

async fn show(args: ShowArgs) -> Result<(), Failure> {
    let q = connect(&args.queue).await?;
    // Read up to the one asked for: queues are read in order.
    let parked = q
        .peek(usize::MAX)
        .await
        .map_err(|e| broker_failed(&*q, e))?;
    let Some(p) = parked.into_iter().find(|p| p.id == args.id) else {
        return Err(Failure::Run(format!(
            "no dead letter {} in {}: idem dlq ls lists their ids",
            shown(args.id.as_bytes()),
            shown(q.name().as_bytes())
        )));
    };
    let now = SystemTime::now();
    if args.queue.json {
        println!("{}", parked_json(&p, now, args.full));
        return Ok(());
    }
    println!("id           {}", shown(p.id.as_bytes()));
    println!("queue        {}", shown(q.name().as_bytes()));
    if let Some(t) = p.parked_at {
        println!(
            "parked       {} ago",
            age(now.duration_since(t).unwrap_or_default())
        );
    }
    println!("headers");
    for (n, v) in &p.headers {
        println!("  {}: {}", shown(n.as_bytes()), shown(v));
    }
    let body = if args.full || p.body.len() <= SHOWN_BODY_BYTES {
        shown(&p.body)
    } else {
        format!(
            "{}… ({} bytes; --full shows all)",
            shown(&p.body[..SHOWN_BODY_BYTES]),
            p.body.len()
        )
    };
    println!("body         {body}");
    Ok(())
}

async fn replay(args: ReplayArgs) -> Result<(), Failure> {
    let selection = Selection {
        keys: args.keys,
        ids: args.ids,
        older_than: args.older_than,
        newer_than: args.newer_than,
    };
    let selects = !selection.keys.is_empty()
        || !selection.ids.is_empty()
        || selection.older_than.is_some()
        || selection.newer_than.is_some();
    if !selects && !args.all {
        return Err(bad(
            "all",
            "say which dead letters to replay: --key KEY, --id ID, --older-than AGE, \
             --newer-than AGE, or --all for every one",
        )
        .into());
    }
    if args.limit == Some(0) {
        return Err(bad("limit", "must be at least 1").into());
    }
    let uses_store = args.store.store.is_some() || args.store.config.is_some();
    let store = if uses_store {
        Some(crate::ops::open(args.store).await?)
    } else {
        None
    };
    let q = connect(&args.queue).await?;
    let namespace = args
        .namespace
        .unwrap_or_else(|| default_namespace(&args.queue.from));
    let now = SystemTime::now();
    let choose = move |p: &Parked| selection.admits(p, now);
    let skipped: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let records = store
        .as_ref()
        .map(|s| (s.store.clone(), s.description.clone()));
    let bar = crate::ops::spinner(format!("replaying from {}:", shown(q.name().as_bytes())));
    let check = |p: &Parked| {
        bar.inc(1);
        let p = p.clone();
        let store = records.clone();
        let namespace = namespace.clone();
        let skipped = skipped.clone();
        async move {
            let (Some(store), Some(k)) = (store, p.key()) else {
                return Ok(true);
            };
            let Ok(key) = Key::new(&namespace, k.into_bytes()) else {
                return Ok(true);
            };
            let (records, description) = store;
            match records.get(&key).await {
                // Recorded as dead-lettered when it was parked: the replayed
                // copy reopens the key and runs.
                Ok(Some(Record::Completed(c))) if is_dead_lettered(c.outcome.as_deref()) => {
                    Ok(true)
                }
                Ok(Some(Record::Completed(c))) => {
                    let ago = age(SystemClock.now().since(c.completed_at));
                    skipped.lock().expect("not poisoned").push((
                        p.id.clone(),
                        format!(
                            "its key {} completed {ago} ago: replaying it would only ack a duplicate",
                            shown(key.bytes())
                        ),
                    ));
                    Ok(false)
                }
                Ok(_) => Ok(true),
                Err(e) => Err(SourceError::new(
                    format!("checking key {} in the {description}", shown(key.bytes())),
                    e,
                )),
            }
        }
        .boxed()
    };
    let result = q
        .replay(&choose, args.limit.unwrap_or(usize::MAX), &check)
        .await;
    bar.finish_and_clear();
    if let Some(store) = store {
        store.close().await;
    }
    let moved = result.map_err(|e| broker_failed(&*q, e))?;
    for p in &moved {
        tracing::warn!(
            id = %shown(p.id.as_bytes()),
            key = %p.key().map(|k| shown(k.as_bytes())).unwrap_or_default(),
            from = %shown(q.name().as_bytes()),
            to = %shown(q.work_name().as_bytes()),
            "replayed by an operator"
        );
    }
    let skipped = std::mem::take(&mut *skipped.lock().expect("not poisoned"));
    if args.queue.json {
        for p in &moved {
            println!(
                "{}",
                json!({"id": p.id, "key": p.key().map(|k| shown(k.as_bytes())), "status": "replayed"})
            );
        }
        for (id, why) in &skipped {
            println!("{}", json!({"id": id, "status": "kept", "why": why}));
        }
    } else {
        println!(
            "replayed {} from {} to {}",
            count(moved.len(), "dead letter"),
            shown(q.name().as_bytes()),
            shown(q.work_name().as_bytes())
        );
        for (id, why) in &skipped {
            println!("kept {}: {why}", shown(id.as_bytes()));
        }
    }
    Ok(())
}

/// The namespace `idem consume --from from` uses by default: the queue or
/// stream name.
fn default_namespace(from: &str) -> String {
    let query = from.split_once('?').map_or("", |(_, q)| q);
    ["queue", "stream", "topic"]
        .iter()
        .find_map(|name| {
            query.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k == *name).then(|| v.to_owned())
            })
        })
        .unwrap_or_default()
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
