//! `idem dlq ls|show|replay|drop --from BROKER_URL`: the dead letters an
//! `idem consume` (or a library runner) parked, listed with their `idem-*`
//! headers, read one at a time, replayed to the work queue after a fix, or
//! dropped for good.
//!
//! A replayed message has a whole attempt budget again (its
//! `idem-attempts` is dropped). Each one's key is checked in the
//! consumer's store first (the store `--store` or the settings file
//! `--config` names, as `idem consume` takes them; `--no-store-check`
//! replays without): a key whose work completed since stays parked
//! (replaying it would run it again once its record expires), as does a
//! letter parked longer ago than the record retention (the store may have
//! forgotten the key: `--force` replays it anyway); one held by a live
//! claim is replayed (the runner waits for the holder). A key the runner
//! recorded as dead-lettered when it parked the message is replayed: the
//! copy, marked `idem-replayed-from`, reopens it and runs. `drop
//! --completed` removes the letters whose key completed since.
//!
//! Each letter is logged as it is settled, so a run that fails part way
//! says what it did. Everything printed that came from the broker is
//! escaped. Exit codes: 0 done, 1 failed, 2 bad settings, 3 nothing
//! matched (or an `--id` was not found), 4 some letters were kept.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use futures_util::FutureExt as _;
use idem_consumer::SourceError;
use idem_consumer::dlq::{DeadLetterQueue, Parked, Selection, Settle, is_dead_lettered};
use idem_core::{Clock as _, Key, Record, Store as _, SystemClock};
use serde_json::{Value, json};

use crate::config::{FileSettings, StoreArgs, bad, read_file};
use crate::ops::{age, columns, outcome_json, parse_age, shown};
use crate::run::Failure;

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
    /// List dead letters, oldest first (by when they were parked), with
    /// their key, attempts, age and last error.
    Ls(LsArgs),
    /// Show one dead letter: every header and the body.
    Show(ShowArgs),
    /// Move dead letters back to the work queue, with a new attempt
    /// budget: by key, by id, by age, or all (each key checked in the
    /// consumer's store first).
    #[command(after_long_help = EXIT_CODES)]
    Replay(Box<SettleArgs>),
    /// Remove dead letters for good: by key, by id, by age, those whose key
    /// completed since (--completed), or all.
    #[command(after_long_help = EXIT_CODES)]
    Drop(Box<SettleArgs>),
}

const EXIT_CODES: &str = "Exit codes: 0 done; 1 failed (what was settled before the failure is \
    printed); 2 bad settings; 3 nothing matched, or an --id was not found; 4 some letters were kept \
    (each is printed with why).";

/// Where the dead letters are.
#[derive(Args, Debug)]
struct Queue {
    /// The source, as `idem consume --from` takes it [default: `from` of
    /// the settings file, for replay and drop]:
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
    from: Option<String>,
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
    /// Only dead letters with this key (repeatable).
    #[arg(long = "key", value_name = "KEY")]
    keys: Vec<String>,
    /// Only those whose last error contains this text (case ignored).
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Only those parked longer ago than this: `90s`, `10m`, `2h`, `1d`.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    older_than: Option<Duration>,
    /// Only those parked more recently than this.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    newer_than: Option<Duration>,
    /// The newest first [default: the oldest first].
    #[arg(long)]
    newest_first: bool,
    /// The next page: those listed after this id (the last one a page
    /// showed).
    #[arg(long, value_name = "ID")]
    after: Option<String>,
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
struct SettleArgs {
    #[command(flatten)]
    queue: Queue,
    /// Only dead letters with this key (repeatable).
    #[arg(long = "key", value_name = "KEY")]
    keys: Vec<String>,
    /// Only the dead letter with this id, as `idem dlq ls` shows it
    /// (repeatable); an id not found is reported (exit 3).
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    /// Only those parked longer ago than this: `90s`, `10m`, `2h`, `1d`.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    older_than: Option<Duration>,
    /// Only those parked more recently than this.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    newer_than: Option<Duration>,
    /// drop only: the dead letters whose key completed since they were
    /// parked (checked in the consumer's store).
    #[arg(long)]
    completed: bool,
    /// Every dead letter (needed when no other selection is given, with
    /// --yes).
    #[arg(long)]
    all: bool,
    /// Confirms --all.
    #[arg(long)]
    yes: bool,
    /// Settle at most this many.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// At most this many a second, e.g. `50/s` or `50` [default: no
    /// limit].
    #[arg(long, value_name = "N/s", value_parser = parse_rate)]
    rate: Option<u32>,
    /// Print what would be settled, and what kept and why, and change
    /// nothing.
    #[arg(long)]
    dry_run: bool,
    /// replay only: also letters parked longer ago than the record
    /// retention, whose key the store may have forgotten.
    #[arg(long)]
    force: bool,
    /// replay only: replay without looking keys up in the store (a letter
    /// whose key completed meanwhile runs again).
    #[arg(long)]
    no_store_check: bool,
    /// The namespace of the keys [default: `namespace` of the settings
    /// file, else the source's name, as for `idem consume`].
    #[arg(long, env = "IDEM_NAMESPACE", value_name = "NS")]
    namespace: Option<String>,
    /// The store `idem consume` uses, where each dead letter's key is
    /// checked (see above).
    #[command(flatten)]
    store: StoreArgs,
}

/// `50/s` or `50`: dead letters a second, at least 1.
fn parse_rate(text: &str) -> Result<u32, String> {
    let number = text.trim().strip_suffix("/s").unwrap_or(text.trim());
    match number.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{text:?} is not a rate: give dead letters a second, e.g. 50/s"
        )),
    }
}

/// Runs `idem dlq`.
pub async fn run(args: DlqArgs) -> Result<(), Failure> {
    crate::run::init_logging("warn")?;
    match args.command {
        DlqCommand::Ls(a) => ls(a).await,
        DlqCommand::Show(a) => show(a).await,
        DlqCommand::Replay(a) => settle(*a, Settle::Replay).await,
        DlqCommand::Drop(a) => settle(*a, Settle::Drop).await,
    }
}

/// The dead-letter queue `queue` names (with the settings file's `from`
/// and `dead_letter` where the flags give none).
async fn connect(
    queue: &Queue,
    file: &FileSettings,
    writes: bool,
) -> Result<Box<dyn DeadLetterQueue>, Failure> {
    let from = from_of(queue, file)?;
    let dead = queue.dead_letter.clone().or(file.dead_letter.clone());
    connect_url(&from, dead, writes).await
}

fn from_of(queue: &Queue, file: &FileSettings) -> Result<String, Failure> {
    queue.from.clone().or(file.from.clone()).ok_or_else(|| {
        bad(
            "from",
            "give the source the dead letters came from: --from BROKER_URL (or IDEM_FROM, or \
             `from` in the settings file --config names)",
        )
        .into()
    })
}

/// The dead-letter queue of the source `from`, or `dead` on its broker;
/// for reading alone unless `writes` (then nothing is created on Kafka or
/// RocketMQ: listing needs no right to write).
pub async fn connect_url(
    from: &str,
    dead: Option<String>,
    writes: bool,
) -> Result<Box<dyn DeadLetterQueue>, Failure> {
    crate::consume::sources::check(from)?;
    // Only Kafka and RocketMQ create anything on a first write.
    #[cfg(not(any(feature = "kafka", feature = "rocketmq")))]
    let _ = writes;
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
            let q = match writes {
                true => idem_kafka::KafkaDeadLetters::connect(config).await,
                false => idem_kafka::KafkaDeadLetters::connect_reading(config),
            }
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
            let q = match writes {
                true => idem_rocketmq::RocketMqDeadLetters::connect(config).await,
                false => idem_rocketmq::RocketMqDeadLetters::connect_reading(config).await,
            }
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
    Failure::Run(broker_failed_text(q, e))
}

fn broker_failed_text(q: &dyn DeadLetterQueue, e: SourceError) -> String {
    format!("on dead-letter queue {}: {e}", shown(q.name().as_bytes()))
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
    let q = connect(&args.queue, &FileSettings::default(), false).await?;
    // Every letter is read and sorted by when it was parked, so pages
    // follow one another whatever order the queue reads in (a RabbitMQ
    // queue's changes as letters are read and put back).
    let mut parked = q
        .peek(usize::MAX)
        .await
        .map_err(|e| broker_failed(&*q, e))?;
    parked.sort_by(|a, b| {
        let at = |p: &Parked| p.parked_at.unwrap_or(SystemTime::UNIX_EPOCH);
        at(a).cmp(&at(b)).then_with(|| a.id.cmp(&b.id))
    });
    let now = SystemTime::now();
    let selection = Selection {
        keys: args.keys.clone(),
        ids: Vec::new(),
        older_than: args.older_than,
        newer_than: args.newer_than,
    };
    let error = args.error.as_deref().map(str::to_lowercase);
    parked.retain(|p| {
        selection.admits(p, now)
            && error.as_ref().is_none_or(|e| {
                p.last_error()
                    .is_some_and(|last| last.to_lowercase().contains(e))
            })
    });
    if args.newest_first {
        parked.reverse();
    }
    if let Some(after) = &args.after {
        match parked.iter().position(|p| &p.id == after) {
            Some(at) => drop(parked.drain(..=at)),
            None => {
                return Err(Failure::Exit(
                    3,
                    format!(
                        "no dead letter {} among those listed: give --after the last id a page showed",
                        shown(after.as_bytes())
                    ),
                ));
            }
        }
    }
    let more = parked.len() > args.limit;
    parked.truncate(args.limit);
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
    } else if more {
        let last = parked
            .last()
            .map(|p| shown(p.id.as_bytes()))
            .unwrap_or_default();
        println!(
            "(first {} dead letters; --after {last} lists the next page, --limit more at once)",
            args.limit
        );
    }
    Ok(())
}

async fn show(args: ShowArgs) -> Result<(), Failure> {
    let q = connect(&args.queue, &FileSettings::default(), false).await?;
    let found = q.find(&args.id).await.map_err(|e| broker_failed(&*q, e))?;
    let Some(p) = found else {
        return Err(Failure::Exit(
            3,
            format!(
                "no dead letter {} in {}: idem dlq ls lists their ids",
                shown(args.id.as_bytes()),
                shown(q.name().as_bytes())
            ),
        ));
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

/// What became of the letters one `replay` or `drop` looked at.
#[derive(Default)]
struct Tally {
    /// Settled (replayed or dropped), in order.
    settled: Vec<Parked>,
    /// Chosen, but left parked: id and why.
    kept: Vec<(String, String)>,
    /// Every id chosen, settled or kept.
    seen: std::collections::HashSet<String>,
}

async fn settle(args: SettleArgs, how: Settle) -> Result<(), Failure> {
    let verb = match how {
        Settle::Replay => "replay",
        Settle::Drop => "drop",
    };
    let selection = Selection {
        keys: args.keys.clone(),
        ids: args.ids.clone(),
        older_than: args.older_than,
        newer_than: args.newer_than,
    };
    let selects = !selection.keys.is_empty()
        || !selection.ids.is_empty()
        || selection.older_than.is_some()
        || selection.newer_than.is_some()
        || args.completed;
    if !selects && !args.all {
        return Err(bad(
            "all",
            format!(
                "say which dead letters to {verb}: --key KEY, --id ID, --older-than AGE, \
                 --newer-than AGE{}, or --all --yes for every one",
                if how == Settle::Drop {
                    ", --completed"
                } else {
                    ""
                }
            ),
        )
        .into());
    }
    if args.all && !args.yes && !args.dry_run {
        return Err(bad(
            "yes",
            format!(
                "--all would {verb} every dead letter: add --yes (or look first with --dry-run)"
            ),
        )
        .into());
    }
    if args.limit == Some(0) {
        return Err(bad("limit", "must be at least 1").into());
    }
    if how == Settle::Replay && args.completed {
        return Err(bad(
            "completed",
            "is for drop: a letter whose key completed is never replayed",
        )
        .into());
    }
    if how == Settle::Drop && (args.force || args.no_store_check) {
        return Err(bad("force", "--force and --no-store-check are for replay").into());
    }
    let file = read_file(args.store.config.as_deref())?;
    let configured = args.store.store.is_some() || file.store.is_some();
    let needs_store = match how {
        Settle::Replay => !args.no_store_check,
        Settle::Drop => args.completed,
    };
    if needs_store && !configured {
        return Err(bad(
            "store",
            match how {
                Settle::Replay => {
                    "idem dlq replay first looks each dead letter's key up in the consumer's store \
                     (a letter whose key completed since must not run again): give --store URL, or \
                     --config FILE with the settings idem consume runs with; --no-store-check \
                     replays without looking"
                }
                Settle::Drop => {
                    "--completed looks each dead letter's key up in the consumer's store: give \
                     --store URL, or --config FILE with the settings idem consume runs with"
                }
            },
        )
        .into());
    }
    let namespace = match args.namespace.clone().or(file.namespace.clone()) {
        Some(ns) => ns,
        None => default_namespace(&from_of(&args.queue, &file)?),
    };
    let store = match needs_store {
        true => Some(crate::ops::open_with(args.store, &file).await?),
        false => None,
    };
    let q = connect(&args.queue, &file, !args.dry_run).await?;
    let now = SystemTime::now();
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let choose = {
        let tally = tally.clone();
        move |p: &Parked| {
            let chosen = selection.admits(p, now);
            if chosen {
                tally
                    .lock()
                    .expect("not poisoned")
                    .seen
                    .insert(p.id.clone());
            }
            chosen
        }
    };
    let records = store
        .as_ref()
        .map(|(s, retention)| (s.store.clone(), s.description.clone(), *retention));
    let pace = args
        .rate
        .map(|n| Duration::from_secs_f64(1.0 / f64::from(n)));
    let next_slot = Arc::new(Mutex::new(tokio::time::Instant::now()));
    let (completed_only, force, dry_run) = (args.completed, args.force, args.dry_run);
    let check = |p: &Parked| {
        let p = p.clone();
        let records = records.clone();
        let namespace = namespace.clone();
        let tally = tally.clone();
        let next_slot = next_slot.clone();
        async move {
            let keep = |why: String| {
                tally.lock().expect("not poisoned").kept.push((p.id.clone(), why));
                Ok(false)
            };
            if let Some((records, description, retention)) = records {
                let Some(k) = p.key() else {
                    return match how {
                        Settle::Replay => keep("it has no idem-key header to look up".into()),
                        Settle::Drop => Ok(false),
                    };
                };
                let key = match Key::new(&namespace, k.into_bytes()) {
                    Ok(key) => key,
                    Err(e) => return keep(format!("its key is not valid for the store: {e}")),
                };
                if how == Settle::Replay && !force {
                    match p.parked_at {
                        Some(at) if now.duration_since(at).unwrap_or_default() > retention => {
                            return keep(format!(
                                "parked {} ago, longer than the record retention ({}): the store may \
                                 have forgotten that its key completed; --force replays it anyway",
                                age(now.duration_since(at).unwrap_or_default()),
                                age(retention)
                            ));
                        }
                        None => {
                            return keep(
                                "its broker does not say when it was parked, so the store may have \
                                 forgotten its key; --force replays it anyway"
                                    .into(),
                            );
                        }
                        Some(_) => {}
                    }
                }
                let completed = match records.get(&key).await {
                    Ok(Some(Record::Completed(c))) if !is_dead_lettered(c.outcome.as_deref()) => {
                        Some(c.completed_at)
                    }
                    Ok(_) => None,
                    Err(e) => {
                        return Err(SourceError::new(
                            format!("checking key {} in the {description}", shown(key.bytes())),
                            e,
                        ));
                    }
                };
                match (how, completed) {
                    (Settle::Replay, Some(at)) => {
                        let ago = age(SystemClock.now().since(at));
                        return keep(format!(
                            "its key {} completed {ago} ago: replaying it would run it again once \
                             the record expires (idem dlq drop --completed removes such letters)",
                            shown(key.bytes())
                        ));
                    }
                    (Settle::Drop, None) if completed_only => return Ok(false),
                    _ => {}
                }
            }
            if let Some(pace) = pace {
                let slot = {
                    let mut next = next_slot.lock().expect("not poisoned");
                    let slot = (*next).max(tokio::time::Instant::now());
                    *next = slot + pace;
                    slot
                };
                tokio::time::sleep_until(slot).await;
            }
            if dry_run {
                tally.lock().expect("not poisoned").settled.push(p.clone());
                return Ok(false);
            }
            Ok(true)
        }
        .boxed()
    };
    let (from, to) = (shown(q.name().as_bytes()), shown(q.work_name().as_bytes()));
    let operator = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let on_settled = |p: &Parked| {
        let key = p.key().map(|k| shown(k.as_bytes())).unwrap_or_default();
        let id = shown(p.id.as_bytes());
        match how {
            Settle::Replay => {
                tracing::warn!(%id, %key, %from, %to, operator = %shown(operator.as_bytes()), "dead letter replayed")
            }
            Settle::Drop => {
                tracing::warn!(%id, %key, %from, operator = %shown(operator.as_bytes()), "dead letter dropped")
            }
        }
        tally.lock().expect("not poisoned").settled.push(p.clone());
    };
    let bar = crate::ops::spinner(format!("{verb}ing from {from}:"));
    let result = q
        .settle(
            how,
            &choose,
            args.limit.unwrap_or(usize::MAX),
            &check,
            &on_settled,
        )
        .await;
    bar.finish_and_clear();
    if let Some((store, _)) = store {
        store.close().await;
    }
    let tally = std::mem::take(&mut *tally.lock().expect("not poisoned"));
    let done = match (how, dry_run) {
        (_, true) => format!("would {verb}"),
        (Settle::Replay, false) => "replayed".into(),
        (Settle::Drop, false) => "dropped".into(),
    };
    if args.queue.json {
        for p in &tally.settled {
            println!(
                "{}",
                json!({"id": p.id, "key": p.key().map(|k| shown(k.as_bytes())), "status": done})
            );
        }
        for (id, why) in &tally.kept {
            println!("{}", json!({"id": id, "status": "kept", "why": why}));
        }
    } else {
        let whither = match how {
            Settle::Replay => format!(" to {to}"),
            Settle::Drop => String::new(),
        };
        println!(
            "{done} {} from {from}{whither}",
            count(tally.settled.len(), "dead letter")
        );
        for p in &tally.settled {
            println!(
                "  {} {}",
                shown(p.id.as_bytes()),
                p.key().map(|k| shown(k.as_bytes())).unwrap_or_default()
            );
        }
        for (id, why) in &tally.kept {
            println!("kept {}: {why}", shown(id.as_bytes()));
        }
    }
    if let Err(e) = result {
        return Err(Failure::Run(format!(
            "{}; the {} above were settled before it",
            broker_failed_text(&*q, e),
            count(tally.settled.len(), "dead letter")
        )));
    }
    let missing: Vec<String> = args
        .ids
        .iter()
        .filter(|id| !tally.seen.contains(*id))
        .map(|id| shown(id.as_bytes()))
        .collect();
    if !missing.is_empty() {
        return Err(Failure::Exit(
            3,
            format!(
                "no dead letter {} in {from} (idem dlq ls lists their ids); nothing else was touched for it",
                missing.join(", ")
            ),
        ));
    }
    if tally.settled.is_empty() && tally.kept.is_empty() {
        return Err(Failure::Exit(
            3,
            format!("no dead letter in {from} matched"),
        ));
    }
    if !tally.kept.is_empty() {
        return Err(Failure::Exit(
            4,
            format!(
                "{} kept (see above)",
                count(tally.kept.len(), "dead letter")
            ),
        ));
    }
    Ok(())
}

/// The namespace `idem consume --from from` uses by default: the queue,
/// stream or topic name, percent-decoded as the broker's URL parser reads
/// it.
fn default_namespace(from: &str) -> String {
    let query = from.split_once('?').map_or("", |(_, q)| q);
    ["queue", "stream", "topic"]
        .iter()
        .find_map(|name| {
            query.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k == *name).then(|| idem_core::text::percent_decoded(v))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_namespace_is_the_source_name_as_the_broker_reads_it() {
        assert_eq!(
            default_namespace("amqp://guest:guest@h:5672/%2f?queue=orders%2Dv2"),
            "orders-v2"
        );
        assert_eq!(default_namespace("kafka://h:9092?topic=t&group=g"), "t");
        assert_eq!(
            default_namespace("redis://h:6379?group=g&stream=s%2E1"),
            "s.1"
        );
    }

    #[test]
    fn rates_are_per_second_and_positive() {
        assert_eq!(parse_rate("50/s"), Ok(50));
        assert_eq!(parse_rate("7"), Ok(7));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").unwrap_err().contains("e.g. 50/s"));
    }
}
